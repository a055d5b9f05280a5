//! `devices`: the node's accelerators as the PCI bus, the vendor's driver
//! and the device nodes see them, and as the job's visibility masks and
//! LOCAL_RANK will address them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    KindInfo, ParamDoc, Params, Probe, ProbeFuture, VendorParam, blocking, parse_params,
    problems_finding, vendors_to_check,
};
use preflight_facts::visible::{self, Entry};
use preflight_facts::{Accelerator, Facts, Vendor};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "devices",
    scope: crate::Scope::Rank,
    area: "accelerators",
    summary: "Every accelerator on the PCI bus is bound to its driver and has its device node; the visibility masks and LOCAL_RANK name devices that exist.",
    params: &[
        ParamDoc {
            name: "vendor",
            ty: "nvidia|amd|intel|habana",
            default: Some("(every vendor present)"),
            doc: "Which accelerators to check. Naming a vendor makes its absence a failure.",
        },
        ParamDoc {
            name: "expect",
            ty: "integer",
            default: Some("unset"),
            doc: "The number of accelerators the node must have on the PCI bus. Unset: at least LOCAL_WORLD_SIZE usable ones, when the launcher sets it.",
        },
    ],
    hint_vars: &["missing", "vendor", "visible", "usable"],
    parse: parse_params::<Devices>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Devices {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vendor: Option<VendorParam>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expect: Option<u32>,
}

impl Params for Devices {}

/// The nodes every device of a vendor shares, without which none works.
fn shared_nodes(vendor: Vendor) -> &'static [&'static str] {
    match vendor {
        Vendor::Nvidia => &["/dev/nvidiactl"],
        Vendor::Amd => &["/dev/kfd"],
        Vendor::Intel | Vendor::Habana => &[],
    }
}

fn node_glob(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Nvidia => "/dev/nvidia*",
        Vendor::Amd | Vendor::Intel => "/dev/dri/renderD*",
        Vendor::Habana => "/dev/accel/*",
    }
}

struct VendorView {
    pci: usize,
    usable: usize,
    visible: usize,
    missing: Vec<String>,
}

/// A device as a runtime counts it: an accelerator, or one tile of it.
#[derive(Clone, Copy)]
struct Unit<'a> {
    acc: &'a Accelerator,
    tile: Option<usize>,
}

impl Unit<'_> {
    fn same(&self, other: &Unit) -> bool {
        self.acc.pci.address == other.acc.pci.address && self.tile == other.tile
    }

    fn describe(&self) -> String {
        match self.tile {
            Some(t) => format!("{} tile {t}", self.acc.pci.address),
            None => self.acc.pci.address.clone(),
        }
    }
}

/// The devices a runtime enumerates, in its order: PCI bus order; for
/// Level Zero in FLAT hierarchy (its default) each tile is a device.
fn units<'a>(facts: &Facts, vendor: Vendor, usable: &[&'a Accelerator]) -> Vec<Unit<'a>> {
    let flat = vendor == Vendor::Intel
        && !facts
            .env("ZE_FLAT_DEVICE_HIERARCHY")
            .is_some_and(|v| v.eq_ignore_ascii_case("COMPOSITE"));
    let mut out = Vec::new();
    for acc in usable {
        if flat && acc.tiles > 1 {
            out.extend((0..acc.tiles).map(|t| Unit { acc, tile: Some(t) }));
        } else {
            out.push(Unit { acc, tile: None });
        }
    }
    out
}

/// Applies the vendor's masks in the order its runtime does; each indexes
/// into what the previous one left. Problems name the entry and why.
fn apply_masks(
    facts: &Facts,
    vendor: Vendor,
    usable: &[&Accelerator],
    problems: &mut Vec<String>,
    variables: &mut Vec<&'static str>,
) -> (usize, Vec<String>) {
    let mut current = units(facts, vendor, usable);
    let mut applied = Vec::new();
    let mut hip_seen = false;
    for &var in visible::variables(vendor) {
        // HIP reads CUDA_VISIBLE_DEVICES only when HIP_VISIBLE_DEVICES is unset.
        if var == "CUDA_VISIBLE_DEVICES" && hip_seen {
            continue;
        }
        let Some(value) = facts.env(var) else {
            continue;
        };
        hip_seen |= var == "HIP_VISIBLE_DEVICES";
        let Some(mask) = visible::parse(var, value) else {
            continue;
        };
        applied.push(format!("{var}={value}"));
        let mut next: Vec<Unit> = Vec::new();
        for entry in &mask.entries {
            let found = match entry {
                Entry::Index(i) => current.get(*i).copied().ok_or_else(|| {
                    let n = current.len();
                    format!(
                        "{var}={value} names device {i}, but only {n} {} device{} {} usable here{}",
                        vendor.name(),
                        if n == 1 { "" } else { "s" },
                        if n == 1 { "is" } else { "are" },
                        match n {
                            0 => String::new(),
                            1 => " (0)".to_string(),
                            _ => format!(" (0-{})", n - 1),
                        }
                    )
                }),
                Entry::Uuid(u) => current
                    .iter()
                    .copied()
                    .find(|d| {
                        d.acc
                            .uuid
                            .as_deref()
                            .is_some_and(|id| id.starts_with(u.as_str()))
                    })
                    .ok_or_else(|| {
                        format!("{var}={value} names {u}, which is not a usable GPU on this node")
                    }),
                // MIG instances and the like cannot be resolved from files:
                // trust them rather than guess.
                Entry::Opaque(_) => {
                    next.clone_from(&current);
                    break;
                }
            };
            match found {
                Ok(d) if next.iter().any(|n| n.same(&d)) => {
                    problems.push(format!("{var}={value} names {} twice", d.describe()));
                    variables.push(var);
                }
                Ok(d) => next.push(d),
                Err(p) => {
                    problems.push(p);
                    variables.push(var);
                    // CUDA stops at the first invalid entry.
                    break;
                }
            }
        }
        current = next;
    }
    (current.len(), applied)
}

impl Devices {
    fn check_vendor(
        &self,
        facts: &Facts,
        vendor: Vendor,
        problems: &mut Vec<String>,
        variables: &mut Vec<&'static str>,
    ) -> Option<VendorView> {
        let accs: Vec<&Accelerator> = facts
            .accelerators()
            .iter()
            .filter(|a| a.vendor == vendor)
            .collect();
        if accs.is_empty() {
            if self.vendor.is_some() || self.expect.is_some() {
                problems.push(format!("no {} accelerator on the PCI bus", vendor.name()));
            }
            return None;
        }
        if let Some(want) = self.expect
            && accs.len() != want as usize
        {
            problems.push(format!(
                "{} {} devices on the PCI bus, expected {want}",
                accs.len(),
                vendor.name()
            ));
        }
        let first_problem = problems.len();
        let mut missing = Vec::new();
        for a in &accs {
            if let Some(why) = a.driver_problem() {
                problems.push(format!("{} is on the PCI bus but {why}", a.pci.address));
                missing.push(a.pci.address.clone());
                continue;
            }
            if a.nodes.is_empty() && vendor != Vendor::Nvidia {
                problems.push(format!(
                    "{} has no device node ({} in sysfs)",
                    a.pci.address,
                    node_glob(vendor)
                ));
                missing.push(a.pci.address.clone());
            }
            for n in a.nodes.iter().filter(|n| !n.present) {
                problems.push(format!("{} has no {}", a.pci.address, n.path));
                missing.push(a.pci.address.clone());
            }
        }
        for shared in shared_nodes(vendor) {
            if !facts.host_path(shared).exists() {
                problems.push(format!("{shared} does not exist"));
            }
        }
        let in_driver = accs.iter().filter(|a| a.in_driver).count();
        if !missing.is_empty() {
            let with_nodes = accs
                .iter()
                .filter(|a| a.in_driver && !missing.contains(&a.pci.address))
                .count();
            problems.insert(
                first_problem,
                format!(
                    "{}: {} on PCI, {in_driver} in the driver, {with_nodes} with device nodes",
                    vendor.name(),
                    accs.len()
                ),
            );
        }
        let usable: Vec<&Accelerator> = accs
            .iter()
            .copied()
            .filter(|a| !missing.contains(&a.pci.address))
            .collect();
        let (visible, masks) = apply_masks(facts, vendor, &usable, problems, variables);
        let launch = facts.launch();
        if self.expect.is_none()
            && let Some(local) = launch.local_world_size
        {
            let count = units(facts, vendor, &usable).len();
            if local > count as u64 {
                variables.push("LOCAL_WORLD_SIZE");
                problems.push(format!(
                    "LOCAL_WORLD_SIZE={local} ranks on this node, but only {} usable {} {}",
                    count,
                    vendor.name(),
                    if count == 1 { "device" } else { "devices" }
                ));
            }
        }
        if let Some(rank) = launch.local_rank
            && rank >= visible as u64
        {
            let through = if masks.is_empty() {
                String::new()
            } else {
                format!(" through {}", masks.join(", "))
            };
            variables.push("LOCAL_RANK");
            variables.extend(
                visible::variables(vendor)
                    .iter()
                    .filter(|v| facts.env(v).is_some()),
            );
            problems.push(format!(
                "LOCAL_RANK={rank} but only {visible} {} device{} {} visible{through}",
                vendor.name(),
                if visible == 1 { "" } else { "s" },
                if visible == 1 { "is" } else { "are" },
            ));
        }
        Some(VendorView {
            pci: accs.len(),
            usable: usable.len(),
            visible,
            missing,
        })
    }

    fn check(&self, facts: &Facts) -> Finding {
        let vendors = match vendors_to_check(facts, self.vendor) {
            Ok(v) => v,
            Err(skip) => {
                if let Some(want) = self.expect {
                    return Finding::fail(format!(
                        "no accelerator on the PCI bus, expected {want}"
                    ))
                    .measured("0")
                    .expected(want.to_string());
                }
                return skip;
            }
        };
        let mut problems = Vec::new();
        let mut variables = Vec::new();
        let mut views = Vec::new();
        for vendor in &vendors {
            if let Some(view) = self.check_vendor(facts, *vendor, &mut problems, &mut variables) {
                views.push((*vendor, view));
            }
        }
        let summary: Vec<String> = views
            .iter()
            .map(|(v, view)| {
                format!(
                    "{}: {} on PCI, {} usable (driver and device nodes), {} visible",
                    v.name(),
                    view.pci,
                    view.usable,
                    view.visible
                )
            })
            .collect();
        let measured = views
            .iter()
            .map(|(_, view)| format!("{}/{} usable", view.usable, view.pci))
            .collect::<Vec<_>>()
            .join(", ");
        let missing: Vec<String> = views
            .iter()
            .flat_map(|(_, view)| view.missing.iter().cloned())
            .collect();
        let finding = if problems.is_empty() {
            Finding::pass(summary.join("; "))
        } else {
            problems_finding(&problems).about_variables(variables)
        };
        let finding = finding
            .measured(if measured.is_empty() {
                "none".into()
            } else {
                measured
            })
            .var(
                "missing",
                if missing.is_empty() {
                    "none".into()
                } else {
                    missing.join(", ")
                },
            )
            .var(
                "vendor",
                vendors
                    .iter()
                    .map(|v| v.name())
                    .collect::<Vec<_>>()
                    .join(", "),
            )
            .var(
                "visible",
                views
                    .iter()
                    .map(|(_, v)| v.visible.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            )
            .var(
                "usable",
                views
                    .iter()
                    .map(|(_, v)| v.usable.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        match self.expect {
            Some(want) => finding.expected(want.to_string()),
            None => finding,
        }
    }
}

impl Probe for Devices {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}
