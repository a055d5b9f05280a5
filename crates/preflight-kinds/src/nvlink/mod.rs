//! `nvlink`: every NVIDIA GPU's NVLinks, link by link: as many active as
//! the GPU should have, none slower than its peers, error counters under
//! their thresholds, and each link reaching what the node's other links
//! reach (NVSwitches on an HGX board, the peer GPU on a bridged pair).
//! "Should have" is the check's `links`, else what most GPUs of the same
//! product on the node have: a VM size with 12 of 18 links by design
//! passes, a GPU with two links down among eight with all does not. A GPU
//! without NVLink (NVML: not supported; a PCIe card without a bridge) is
//! no failure; an SXM module with every link down is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::command::{RunError, excerpt, run_program};
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params, problems_and_unchecked};
pub mod parse;
use parse::GpuLinks;
use preflight_facts::{Facts, Vendor};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "nvlink",
    scope: crate::Scope::Node,
    area: "accelerators",
    summary: "NVIDIA NVLink per link (NVML, else `nvidia-smi nvlink`): active links per GPU against `links` or the node's other GPUs of the same product, link speed, error counters (replay, recovery, CRC), and the remote end of each link. No NVLink (a PCIe card) is not a failure; an SXM module with its links down is.",
    params: &[
        ParamDoc {
            name: "links",
            ty: "integer",
            default: Some(
                "(the node's profile, else what most GPUs of the same product on the node have)",
            ),
            doc: "Active links every GPU must have (18 on H100/H200/B200 SXM, 12 on A100 SXM; fewer on some cloud VM sizes by design).",
        },
        ParamDoc {
            name: "max_errors",
            ty: "mapping of counter to integer",
            default: Some("unset"),
            doc: "The most errors a link may have counted since the driver loaded, per counter: replay, recovery, crc (nvidia-smi's other labels by their lower-case names, e.g. crc_flit).",
        },
        ParamDoc {
            name: "min_speed_ratio",
            ty: "number",
            default: Some("0.9"),
            doc: "A link slower than this fraction of the node's usual link speed fails (nvidia-smi's text states speeds; NVML does not).",
        },
        ParamDoc {
            name: "remote",
            ty: "switch|gpu",
            default: Some("(what most links on the node reach)"),
            doc: "What every link must reach: an NVSwitch (HGX boards) or another GPU (bridged cards, direct-connect boards).",
        },
        ParamDoc {
            name: "nvidia_smi_nvlink",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `nvidia-smi nvlink -s` to read instead of asking the GPUs (relative to the working directory).",
        },
        ParamDoc {
            name: "nvidia_smi_nvlink_errors",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `nvidia-smi nvlink -e` (error counters), read with nvidia_smi_nvlink.",
        },
        ParamDoc {
            name: "nvidia_smi_nvlink_remote",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `nvidia-smi nvlink -R` (remote ends), read with nvidia_smi_nvlink.",
        },
    ],
    hint_vars: &["gpus"],
    parse: parse_params::<NvLink>,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum Remote {
    Switch,
    Gpu,
}

impl Remote {
    fn words(self) -> &'static str {
        match self {
            Remote::Switch => "an NVSwitch",
            Remote::Gpu => "a GPU",
        }
    }
}

fn default_speed_ratio() -> f64 {
    0.9
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NvLink {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    links: Option<u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    max_errors: BTreeMap<String, u64>,
    #[serde(default = "default_speed_ratio")]
    min_speed_ratio: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    remote: Option<Remote>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nvidia_smi_nvlink: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nvidia_smi_nvlink_errors: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nvidia_smi_nvlink_remote: Option<PathBuf>,
}

impl Params for NvLink {
    fn validate(&self) -> Result<(), String> {
        if !(self.min_speed_ratio > 0.0 && self.min_speed_ratio <= 1.0) {
            return Err(format!(
                "`min_speed_ratio` must be in (0, 1], found {}",
                self.min_speed_ratio
            ));
        }
        if self.nvidia_smi_nvlink.is_none()
            && (self.nvidia_smi_nvlink_errors.is_some() || self.nvidia_smi_nvlink_remote.is_some())
        {
            return Err("`nvidia_smi_nvlink_errors` and `nvidia_smi_nvlink_remote` are read with a recorded `nvidia_smi_nvlink`: set it too".into());
        }
        Ok(())
    }
}

/// The links as read, and where from.
struct Read {
    gpus: Vec<GpuLinks>,
    source: String,
}

fn read_file(path: &Path) -> Result<String, String> {
    preflight_facts::read_bounded(path, 16 * 1024 * 1024)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn plural(n: usize, one: &str) -> String {
    format!("{n} {one}{}", if n == 1 { "" } else { "s" })
}

impl NvLink {
    async fn read(&self, facts: &Facts) -> Option<Result<Read, String>> {
        if let Some(status) = &self.nvidia_smi_nvlink {
            let (status, errors, remote) = (
                status.clone(),
                self.nvidia_smi_nvlink_errors.clone(),
                self.nvidia_smi_nvlink_remote.clone(),
            );
            let read = tokio::task::spawn_blocking(move || -> Result<Read, String> {
                let shown = status.display().to_string();
                let mut gpus = parse::parse_status(&shown, &read_file(&status)?)?;
                if let Some(e) = errors {
                    parse::parse_errors(&e.display().to_string(), &read_file(&e)?, &mut gpus)?;
                }
                if let Some(r) = remote {
                    parse::parse_remotes(&r.display().to_string(), &read_file(&r)?, &mut gpus)?;
                }
                Ok(Read {
                    gpus,
                    source: shown,
                })
            })
            .await
            .unwrap_or_else(|e| Err(format!("reading the recording crashed: {e}")));
            return Some(read);
        }
        if !facts.is_live() {
            return None;
        }
        let nvml = tokio::task::spawn_blocking(parse::from_nvml)
            .await
            .unwrap_or_else(|e| Err(format!("NVML crashed: {e}")));
        if let Ok(gpus) = nvml {
            return Some(Ok(Read {
                gpus,
                source: "NVML".into(),
            }));
        }
        Some(self.run_nvidia_smi().await)
    }

    /// `nvidia-smi nvlink -s`, `-e` and `-R`, where NVML cannot be loaded.
    async fn run_nvidia_smi(&self) -> Result<Read, String> {
        let run = |flag: &str| {
            let argv: Vec<String> = ["nvidia-smi", "nvlink", flag].map(String::from).to_vec();
            async move {
                match run_program(&argv, 1024 * 1024).await {
                    Ok(ran) if ran.status.success() => Ok(ran.stdout),
                    Ok(ran) => Err(format!(
                        "`{}` failed ({}): {}",
                        argv.join(" "),
                        ran.status,
                        excerpt(if ran.stderr.trim().is_empty() {
                            &ran.stdout
                        } else {
                            &ran.stderr
                        })
                    )),
                    Err(RunError::NotFound) => {
                        Err("neither NVML nor nvidia-smi is installed".into())
                    }
                    Err(RunError::Failed(e)) => Err(e),
                }
            }
        };
        let mut gpus = parse::parse_status("nvidia-smi nvlink -s", &run("-s").await?)?;
        parse::parse_errors("nvidia-smi nvlink -e", &run("-e").await?, &mut gpus)?;
        parse::parse_remotes("nvidia-smi nvlink -R", &run("-R").await?, &mut gpus)?;
        Ok(Read {
            gpus,
            source: "nvidia-smi nvlink".into(),
        })
    }

    fn check(&self, facts: &Facts, read: Read) -> Finding {
        // nvidia-smi numbers GPUs in bus order: the node's NVIDIA GPUs
        // sorted by bus id give each index its bus.
        let mut buses: Vec<String> = facts
            .accelerators()
            .iter()
            .filter(|a| a.vendor == Vendor::Nvidia && a.in_driver)
            .map(|a| a.pci.address.clone())
            .collect();
        buses.sort();
        // NVML says each GPU's bus itself (a container may see fewer GPUs
        // than sysfs lists): that wins over the place in bus order.
        let bus_of = |g: &GpuLinks| {
            g.bus
                .clone()
                .or_else(|| buses.get(g.index as usize).cloned())
        };
        let name = |g: &GpuLinks| match bus_of(g) {
            Some(bus) => format!("GPU {} ({bus})", g.index),
            None => g.name(),
        };
        let gpu_buses: Vec<String> = buses
            .iter()
            .cloned()
            .chain(read.gpus.iter().filter_map(|g| g.bus.clone()))
            .collect();
        let gpus: Vec<&GpuLinks> = read.gpus.iter().filter(|g| !g.unsupported).collect();
        if read.gpus.is_empty() {
            // R580 in a VM without NVLink prints nothing at all.
            return Finding::skip(format!(
                "no NVLink on this node ({} lists no GPU)",
                read.source
            ));
        }
        if gpus.is_empty() {
            return Finding::skip(format!(
                "no NVLink on this node ({}: not supported)",
                read.source
            ));
        }
        let mut problems = Vec::new();
        let mut notes = Vec::new();
        // A GPU of the node that the text does not list at all is not
        // judged by omission.
        if read.gpus.iter().all(|g| g.bus.is_none()) && read.gpus.len() < buses.len() {
            let listed: Vec<u32> = read.gpus.iter().map(|g| g.index).collect();
            for (i, bus) in buses.iter().enumerate() {
                if !listed.contains(&(i as u32)) {
                    problems.push(format!(
                        "GPU {i} ({bus}) is not in {}: its links were not read",
                        read.source
                    ));
                }
            }
        }
        // Active links, product by product.
        let mut products: BTreeMap<&str, Vec<&GpuLinks>> = BTreeMap::new();
        for g in &gpus {
            products
                .entry(g.product.as_deref().unwrap_or("unknown product"))
                .or_default()
                .push(g);
        }
        // The node's profile says what its GPUs must have where the check
        // does not.
        let profile = facts
            .profile()
            .and_then(|p| Some((p.named(), p.expect.nvlink?.links)));
        for (product, group) in &products {
            let usual = super::most_common(group.iter().map(|g| g.active()));
            let (expected, why) = match (self.links, &profile, usual) {
                (Some(n), _, _) => (n as usize, "as the check sets".to_string()),
                (None, Some((named, n)), _) => (*n, format!("as {named} sets")),
                (None, None, Some(n)) => (
                    n,
                    if group.len() > 1 {
                        format!("as most {product} GPUs here")
                    } else {
                        "as read".to_string()
                    },
                ),
                (None, None, None) => continue,
            };
            // Every GPU of the product without a link is one fault, the
            // fabric's, whatever the count expected.
            let none_active = group.iter().all(|g| g.active() == 0);
            if expected == 0 || (none_active && parse::is_module(product)) {
                if parse::is_module(product) {
                    problems.push(format!(
                        "every link of every {product} is inactive: NVLink is down on an SXM module (Fabric Manager, the NVSwitches or the baseboard)"
                    ));
                } else {
                    notes.push(format!(
                        "{product}: no NVLink active (a PCIe card without a bridge)"
                    ));
                }
                continue;
            }
            for g in group {
                let active = g.active();
                if active >= expected {
                    continue;
                }
                let down: Vec<String> = g
                    .links
                    .iter()
                    .filter(|l| !l.active)
                    .map(|l| l.link.to_string())
                    .collect();
                let which = if g.all_inactive || active == 0 {
                    "every link inactive".to_string()
                } else if down.is_empty() {
                    plural(active, "link") + " active"
                } else {
                    format!(
                        "{active} of {} links active, link{} {} inactive",
                        g.links.len(),
                        if down.len() == 1 { "" } else { "s" },
                        down.join(", ")
                    )
                };
                problems.push(format!("{}: {which}; expected {expected} {why}", name(g)));
            }
        }
        // Speeds, against the node's usual speed (milli-GB/s steps).
        let milli = |s: f64| (s * 1000.0).round() as u64;
        let speeds = gpus
            .iter()
            .flat_map(|g| g.links.iter().filter_map(|l| l.speed.map(milli)));
        if let Some(usual) = super::most_common(speeds) {
            for g in &gpus {
                for l in g.links.iter().filter(|l| l.active) {
                    if let Some(s) = l.speed
                        && (milli(s) as f64) < usual as f64 * self.min_speed_ratio
                    {
                        problems.push(format!(
                            "{} link {}: {s} GB/s where links here run at {} GB/s",
                            name(g),
                            l.link,
                            usual as f64 / 1000.0
                        ));
                    }
                }
            }
        }
        // Error counters.
        for g in &gpus {
            for (link, counters) in &g.errors {
                for (counter, value) in counters {
                    if let Some(max) = self.max_errors.get(counter)
                        && value > max
                    {
                        problems.push(format!(
                            "{} link {link}: {value} {counter} errors (at most {max})",
                            name(g)
                        ));
                    }
                }
            }
        }
        // Remote ends: a GPU of this node, or not (an NVSwitch).
        let kind_of = |bus: &str| {
            if gpu_buses.iter().any(|b| b == bus) {
                Remote::Gpu
            } else {
                Remote::Switch
            }
        };
        let all: Vec<Remote> = gpus
            .iter()
            .flat_map(|g| g.remotes.iter().map(|(_, b)| kind_of(b)))
            .collect();
        let expected_remote = self.remote.or_else(|| {
            let gpus_seen = all.iter().filter(|r| **r == Remote::Gpu).count();
            (!all.is_empty()).then(|| {
                if gpus_seen * 2 > all.len() {
                    Remote::Gpu
                } else {
                    Remote::Switch
                }
            })
        });
        if let Some(expected) = expected_remote {
            for g in &gpus {
                for (link, bus) in &g.remotes {
                    let kind = kind_of(bus);
                    if kind != expected {
                        problems.push(format!(
                            "{} link {link} reaches {bus} ({}) where {} links here reach {}",
                            name(g),
                            kind.words(),
                            if self.remote.is_some() {
                                "the check says"
                            } else {
                                "most"
                            },
                            expected.words()
                        ));
                    }
                }
            }
        }
        let links: usize = gpus.iter().map(|g| g.active()).sum();
        let measured = format!(
            "{} on {}",
            plural(links, "active link"),
            plural(gpus.len(), "GPU")
        );
        let finding = if problems.is_empty() {
            let mut text = format!("{measured} from {}", read.source);
            for n in notes {
                text.push_str("; ");
                text.push_str(&n);
            }
            Finding::pass(text)
        } else {
            problems_and_unchecked(&problems, &[])
        };
        finding.measured(measured).var(
            "gpus",
            gpus.iter().map(|g| name(g)).collect::<Vec<_>>().join(", "),
        )
    }
}

impl Probe for NvLink {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            if self.nvidia_smi_nvlink.is_none() && !super::nvidia_present(&facts).await {
                return Finding::skip("no NVIDIA GPU present");
            }
            match self.read(&facts).await {
                None => Finding::skip(
                    "no NVLink data under --root: set nvidia_smi_nvlink to a recorded `nvidia-smi nvlink -s`",
                ),
                Some(Err(e)) => Finding::error(e),
                Some(Ok(read)) => tokio::task::spawn_blocking(move || self.check(&facts, read))
                    .await
                    .unwrap_or_else(|e| Finding::error(format!("probe crashed: {e}"))),
            }
        })
    }
}
