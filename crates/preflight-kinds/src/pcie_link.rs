//! `pcie_link`: every GPU and NIC trained its PCIe link at the width and
//! speed it is capable of. A GPU at x8, or at 16 GT/s in a 32 GT/s slot,
//! halves host transfers and GPUDirect RDMA with no error anywhere. Also
//! reports each device's NUMA node, for GPU-NIC affinity.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params, problems_finding,
};
use preflight_facts::Facts;
use preflight_facts::pci::{PciDevice, format_speed};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "pcie_link",
    scope: crate::Scope::Node,
    area: "accelerators",
    summary: "Every GPU's and NIC's PCIe link runs at its maximum width and speed (sysfs current_link_* against max_link_*), and the accelerators' at least at the node profile's generation and width; reports each one's NUMA node.",
    params: &[
        ParamDoc {
            name: "gpus",
            ty: "bool",
            default: Some("true"),
            doc: "Check the accelerators' links.",
        },
        ParamDoc {
            name: "nics",
            ty: "bool",
            default: Some("true"),
            doc: "Check the network controllers' links (physical functions only).",
        },
        ParamDoc {
            name: "speed",
            ty: "bool",
            default: Some("true"),
            doc: "Compare speeds as well as widths. Turn off for GPUs that lower their link speed when idle (consumer boards).",
        },
    ],
    hint_vars: &["degraded", "numa"],
    parse: parse_params::<PcieLink>,
};

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PcieLink {
    #[serde(default = "yes")]
    gpus: bool,
    #[serde(default = "yes")]
    nics: bool,
    #[serde(default = "yes")]
    speed: bool,
}

impl Params for PcieLink {
    fn validate(&self) -> Result<(), String> {
        if !self.gpus && !self.nics {
            return Err("pcie_link with gpus: false and nics: false checks nothing".into());
        }
        Ok(())
    }
}

fn describe(width: Option<u32>, speed: Option<f64>) -> String {
    let w = width.map_or("x?".to_string(), |w| format!("x{w}"));
    let s = speed.map_or("unknown speed".to_string(), format_speed);
    format!("{w} at {s}")
}

impl PcieLink {
    fn devices<'a>(&self, facts: &'a Facts) -> Vec<(&'static str, &'a PciDevice)> {
        facts
            .pci_devices()
            .iter()
            .filter(|d| {
                d.link.max_width.is_some()
                    || d.link.max_speed.is_some()
                    || !d.link.malformed.is_empty()
            })
            .filter_map(|d| {
                if d.accelerator_vendor().is_some() {
                    self.gpus.then_some(("GPU", d))
                } else if d.is_nic() && !d.virtual_function {
                    self.nics.then_some(("NIC", d))
                } else {
                    None
                }
            })
            .collect()
    }

    fn check(&self, facts: &Facts) -> Finding {
        let devices = self.devices(facts);
        if devices.is_empty() {
            return Finding::skip("no GPU or NIC with PCIe link attributes in sysfs");
        }
        let malformed: Vec<String> = devices
            .iter()
            .flat_map(|(_, d)| {
                d.link
                    .malformed
                    .iter()
                    .map(move |m| format!("/sys/bus/pci/devices/{}/{m}", d.address))
            })
            .collect();
        if !malformed.is_empty() {
            return Finding::error(format!(
                "unreadable link attributes: {}",
                malformed.join("; ")
            ));
        }
        let mut problems = Vec::new();
        let mut degraded = Vec::new();
        let mut numa = Vec::new();
        // The node's profile says what its accelerators' links must be:
        // a slot or riser capable of less than the board's design shows
        // at its own maximum, and only the profile can tell.
        let profile = facts.profile().and_then(|p| {
            let pcie = p.expect.pcie?;
            Some((p.named(), pcie, p.matcher.vendor, &p.matcher.device_ids))
        });
        for (what, d) in &devices {
            let l = &d.link;
            let node = d
                .numa_node
                .map_or("numa -".to_string(), |n| format!("numa {n}"));
            numa.push(format!("{what} {} {node}", d.address));
            let narrow = matches!((l.current_width, l.max_width), (Some(c), Some(m)) if c < m);
            let slow =
                self.speed && matches!((l.current_speed, l.max_speed), (Some(c), Some(m)) if c < m);
            let down =
                l.current_width == Some(0) || (l.max_speed.is_some() && l.current_speed.is_none());
            if narrow || slow || down {
                problems.push(format!(
                    "{} ({what}, {node}): link {}, capable of {}",
                    d.address,
                    describe(l.current_width, l.current_speed),
                    describe(l.max_width, l.max_speed)
                ));
                degraded.push(d.address.clone());
            } else if let Some((named, want, vendor, ids)) = &profile
                && d.accelerator_vendor() == Some(*vendor)
                && ids.contains(&d.device)
                && (l.current_width.is_some_and(|w| w < want.width)
                    || (self.speed && l.current_speed.is_some_and(|s| s + 0.01 < want.gts())))
            {
                problems.push(format!(
                    "{} ({what}, {node}): link {}, where {named} has Gen{} x{}",
                    d.address,
                    describe(l.current_width, l.current_speed),
                    want.generation,
                    want.width
                ));
                degraded.push(d.address.clone());
            }
        }
        let finding = if problems.is_empty() {
            Finding::pass(format!(
                "{} links at full width{}; {}",
                devices.len(),
                if self.speed { " and speed" } else { "" },
                numa.join(", ")
            ))
        } else {
            problems_finding(&problems)
        };
        finding
            .measured(format!("{} of {} degraded", degraded.len(), devices.len()))
            .expected("0 degraded")
            .var(
                "degraded",
                if degraded.is_empty() {
                    "none".into()
                } else {
                    degraded.join(", ")
                },
            )
            .var("numa", numa.join(", "))
    }
}

impl Probe for PcieLink {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}
