//! `gpu_health`: the NVIDIA GPUs are fit to start a job: persistence mode,
//! no uncorrectable ECC errors or pending row remaps, no Xid faults in the
//! kernel log, no memory held by other processes, and free memory balanced
//! across the local GPUs (SGLang refuses to start otherwise: "The memory
//! capacity is unbalanced. Some GPUs may be occupied by other processes.").

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    KindInfo, ParamDoc, Params, Probe, ProbeFuture, VendorParam, parse_params,
    problems_and_unchecked,
};
use crate::facts::gpu_status::GpuStatus;
use crate::facts::visible::{self, Entry};
use crate::facts::{Facts, GpuReport, Vendor, amdgpu, kmsg};
use crate::result::Finding;
use crate::values::{Bytes, format_bytes};

pub const KIND: KindInfo = KindInfo {
    name: "gpu_health",
    area: "accelerators",
    summary: "NVIDIA and AMD GPUs: persistence mode, uncorrectable ECC errors, pending row remaps, Xid errors in the kernel log, memory used by other processes, free memory balanced across GPUs.",
    params: &[
        ParamDoc {
            name: "vendor",
            ty: "nvidia|amd",
            default: Some("(NVIDIA if present, else AMD)"),
            doc: "Whose GPUs to read: NVIDIA through NVML or nvidia-smi, AMD through amdgpu's sysfs files (memory, RAS counts; no persistence, remaps or Xids).",
        },
        ParamDoc {
            name: "persistence",
            ty: "bool",
            default: Some("false"),
            doc: "Every GPU must have persistence mode enabled.",
        },
        ParamDoc {
            name: "max_uncorrectable_ecc",
            ty: "integer",
            default: Some("unset"),
            doc: "The most volatile uncorrectable ECC errors a GPU may have (0: none).",
        },
        ParamDoc {
            name: "remapped_rows",
            ty: "bool",
            default: Some("false"),
            doc: "No GPU may have a row remap (or page retirement) pending a reset, or a failed remap.",
        },
        ParamDoc {
            name: "xid",
            ty: "bool",
            default: Some("false"),
            doc: "No Xid error in the kernel log, except those in ignore_xids.",
        },
        ParamDoc {
            name: "ignore_xids",
            ty: "list of integers",
            default: Some("[13, 31, 43, 45]"),
            doc: "Xids that an application causes (exceptions, MMU faults, stopped or killed work) rather than the hardware.",
        },
        ParamDoc {
            name: "max_used",
            ty: "size",
            default: Some("unset"),
            doc: "The most memory a GPU may already have in use (by other processes) before the job starts, e.g. 1GiB.",
        },
        ParamDoc {
            name: "min_free_ratio",
            ty: "number",
            default: Some("unset"),
            doc: "Free memory balance: the visible GPU with the least free memory must have at least this fraction of the most (SGLang uses 0.9).",
        },
        ParamDoc {
            name: "nvidia_smi_xml",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `nvidia-smi -q -x` to read (relative to the working directory). Unset: NVML, else `nvidia-smi -q -x`, on the real machine only.",
        },
        ParamDoc {
            name: "kernel_log",
            ty: "path",
            default: Some("/dev/kmsg"),
            doc: "A saved kernel log (dmesg or /dev/kmsg records) to search for Xid errors, relative to the working directory.",
        },
    ],
    hint_vars: &["gpus"],
    parse: parse_params::<GpuHealth>,
};

fn default_ignored() -> Vec<u32> {
    vec![13, 31, 43, 45]
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GpuHealth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vendor: Option<VendorParam>,
    #[serde(default)]
    persistence: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_uncorrectable_ecc: Option<u64>,
    #[serde(default)]
    remapped_rows: bool,
    #[serde(default)]
    xid: bool,
    #[serde(default = "default_ignored")]
    ignore_xids: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_used: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_free_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nvidia_smi_xml: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kernel_log: Option<PathBuf>,
}

impl Params for GpuHealth {
    fn validate(&self) -> Result<(), String> {
        if matches!(self.vendor, Some(VendorParam::Intel | VendorParam::Habana)) {
            return Err(
                "gpu_health reads NVIDIA and AMD GPUs: vendor must be nvidia or amd".into(),
            );
        }
        if let Some(r) = self.min_free_ratio
            && !(r > 0.0 && r <= 1.0)
        {
            return Err(format!("`min_free_ratio` must be in (0, 1], found {r}"));
        }
        if !self.persistence
            && self.max_uncorrectable_ecc.is_none()
            && !self.remapped_rows
            && !self.xid
            && self.max_used.is_none()
            && self.min_free_ratio.is_none()
        {
            return Err("gpu_health needs something to check: persistence, max_uncorrectable_ecc, remapped_rows, xid, max_used or min_free_ratio".into());
        }
        Ok(())
    }
}

/// The GPUs a job on this node will use: the vendor's masks applied in
/// its runtime's order to the driver's GPUs in bus order (nvidia-smi's and
/// CUDA's order on every homogeneous node). Entries that do not resolve
/// are the `devices` check's business; here they leave the list as it was.
fn visible_gpus<'a>(facts: &Facts, vendor: Vendor, gpus: &'a [GpuStatus]) -> Vec<&'a GpuStatus> {
    let mut current: Vec<&GpuStatus> = gpus.iter().collect();
    let mut hip_seen = false;
    for &var in visible::variables(vendor) {
        if var == "CUDA_VISIBLE_DEVICES" && hip_seen {
            continue;
        }
        let Some(mask) = facts.env(var).and_then(|v| visible::parse(var, v)) else {
            continue;
        };
        hip_seen |= var == "HIP_VISIBLE_DEVICES";
        let mut chosen = Vec::new();
        for entry in &mask.entries {
            let found = match entry {
                Entry::Index(i) => current.get(*i).copied(),
                Entry::Uuid(u) => current.iter().copied().find(|g| {
                    g.uuid
                        .as_deref()
                        .is_some_and(|id| id.starts_with(u.as_str()))
                }),
                Entry::Opaque(_) => None,
            };
            match found {
                Some(g) => chosen.push(g),
                None => {
                    chosen.clone_from(&current);
                    break;
                }
            }
        }
        current = chosen;
    }
    current
}

/// The GPUs whose health this kind reads: NVIDIA (NVML, nvidia-smi) or
/// AMD (amdgpu's sysfs files).
fn health_vendor(facts: &Facts, wanted: Option<VendorParam>) -> Result<Vendor, String> {
    let present = |v: Vendor| facts.accelerators().iter().any(|a| a.vendor == v);
    match wanted.map(VendorParam::vendor) {
        Some(v @ (Vendor::Nvidia | Vendor::Amd)) if present(v) => Ok(v),
        Some(v) => Err(format!("no {} GPU present", v.name())),
        None if present(Vendor::Nvidia) => Ok(Vendor::Nvidia),
        None if present(Vendor::Amd) => Ok(Vendor::Amd),
        None => Err("no NVIDIA or AMD GPU present".into()),
    }
}

fn amd_report(facts: &Facts) -> Result<GpuReport, String> {
    let gpus: Vec<(String, std::path::PathBuf)> = facts
        .accelerators()
        .iter()
        .filter(|a| a.vendor == Vendor::Amd && a.in_driver)
        .map(|a| {
            (
                a.pci.address.clone(),
                facts.host_path(format!("/sys/bus/pci/devices/{}", a.pci.address)),
            )
        })
        .collect();
    amdgpu::report(&gpus)
}

impl GpuHealth {
    /// Only NVIDIA concepts asked for: nothing applies to AMD.
    fn nvidia_only(&self) -> bool {
        self.max_uncorrectable_ecc.is_none()
            && self.max_used.is_none()
            && self.min_free_ratio.is_none()
    }

    fn needs_report(&self) -> bool {
        self.persistence
            || self.max_uncorrectable_ecc.is_some()
            || self.remapped_rows
            || self.max_used.is_some()
            || self.min_free_ratio.is_some()
    }

    fn report_checks(
        &self,
        facts: &Facts,
        vendor: Vendor,
        report: &GpuReport,
        problems: &mut Vec<String>,
    ) {
        for g in &report.gpus {
            let bus = &g.bus_id;
            if self.persistence && g.persistence == Some(false) {
                problems.push(format!("{bus}: persistence mode is off"));
            }
            if let (Some(max), Some(n)) = (self.max_uncorrectable_ecc, g.ecc_uncorrectable)
                && n > max
            {
                problems.push(format!(
                    "{bus}: {n} uncorrectable ECC error{} (at most {max})",
                    if n == 1 { "" } else { "s" }
                ));
            }
            if self.remapped_rows {
                if g.remap_failure == Some(true) {
                    problems.push(format!("{bus}: a row remap failed: the GPU needs service"));
                }
                if g.remap_pending == Some(true) {
                    problems.push(format!("{bus}: a row remap is pending: reset the GPU"));
                }
                if g.retirement_pending == Some(true) {
                    problems.push(format!("{bus}: page retirement is pending: reset the GPU"));
                }
            }
            if let (Some(max), Some(used)) = (self.max_used, g.used_bytes)
                && used > max.0
            {
                let who = g
                    .processes
                    .iter()
                    .map(|p| {
                        let name = if p.name.is_empty() { "?" } else { &p.name };
                        match p.used_bytes {
                            Some(b) => format!("pid {} {name} {}", p.pid, format_bytes(b)),
                            None => format!("pid {} {name}", p.pid),
                        }
                    })
                    .collect::<Vec<_>>();
                let who = if who.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", who.join(", "))
                };
                problems.push(format!(
                    "{bus}: {} already in use{who}, more than {}",
                    format_bytes(used),
                    max
                ));
            }
        }
        if let Some(ratio) = self.min_free_ratio {
            let visible = visible_gpus(facts, vendor, &report.gpus);
            let with_free: Vec<(&GpuStatus, u64)> = visible
                .iter()
                .filter_map(|g| g.free_bytes.map(|f| (*g, f)))
                .collect();
            let most = with_free.iter().max_by_key(|(_, f)| *f);
            if let Some(&(top, max_free)) = most {
                let threshold = max_free as f64 * ratio;
                let low: Vec<String> = with_free
                    .iter()
                    .filter(|(_, f)| (*f as f64) < threshold)
                    .map(|(g, f)| format!("{} has {} free", g.bus_id, format_bytes(*f)))
                    .collect();
                if !low.is_empty() {
                    problems.push(format!(
                        "free memory is unbalanced: {} against {} on {} (below {:.0}% of it); SGLang refuses to start (\"The memory capacity is unbalanced. Some GPUs may be occupied by other processes.\")",
                        low.join(", "),
                        format_bytes(max_free),
                        top.bus_id,
                        ratio * 100.0
                    ));
                }
            }
        }
    }

    /// The kernel log's text, or why there is none. `Ok(None)`: no log to
    /// read under a fixture root, which is not a failure of the node.
    /// `Err(LogError::Denied)`: this user may not read the kernel log
    /// (kernel.dmesg_restrict), which says nothing about the GPUs.
    fn kernel_log(&self, facts: &Facts) -> Result<Option<String>, LogError> {
        if let Some(path) = &self.kernel_log {
            return std::fs::read_to_string(path).map(Some).map_err(|e| {
                let what = format!("reading {}", path.display());
                if super::is_denied(&e) {
                    LogError::Denied(what)
                } else {
                    LogError::Failed(format!("cannot read {}: {e}", path.display()))
                }
            });
        }
        let kmsg = facts.host_path("/dev/kmsg");
        if !facts.is_live() && !kmsg.exists() {
            return Ok(None);
        }
        kmsg::read_kmsg(&kmsg).map(Some).map_err(|e| {
            if super::is_denied(&e) {
                LogError::Denied("reading the kernel log (/dev/kmsg) for Xid errors".into())
            } else {
                LogError::Failed(format!("cannot read /dev/kmsg: {e} (or set kernel_log)"))
            }
        })
    }

    fn check(
        &self,
        facts: &Facts,
        vendor: Result<Vendor, String>,
        report: Option<Result<GpuReport, String>>,
    ) -> Finding {
        let vendor = match vendor {
            Ok(v) => v,
            Err(reason) => return Finding::skip(reason),
        };
        let gpus: Vec<&str> = facts
            .accelerators()
            .iter()
            .filter(|a| a.vendor == vendor)
            .map(|a| a.pci.address.as_str())
            .collect();
        if vendor == Vendor::Amd && self.nvidia_only() {
            return Finding::skip(
                "persistence mode, row remaps and Xid errors are NVIDIA's; nothing to check on AMD GPUs",
            );
        }
        let mut problems = Vec::new();
        let mut notes = Vec::new();
        // What could not be read: named beside the problems found in the
        // rest, never in place of them.
        let mut unreadable: Vec<String> = Vec::new();
        let mut source = None;
        let mut denied: Option<String> = None;
        if self.needs_report() {
            match report {
                Some(Ok(r)) => {
                    self.report_checks(facts, vendor, &r, &mut problems);
                    notes.push(format!("{} GPUs from {}", r.gpus.len(), r.source));
                    source = Some(r.source);
                }
                Some(Err(e)) => unreadable.push(e),
                None if !self.xid => {
                    return Finding::skip(
                        "no GPU data under --root: set nvidia_smi_xml to a recorded `nvidia-smi -q -x`",
                    );
                }
                None => notes.push("no GPU data under --root".into()),
            }
        }
        if self.xid && vendor == Vendor::Nvidia {
            match self.kernel_log(facts) {
                Ok(Some(text)) => {
                    let xids: Vec<kmsg::Xid> = kmsg::parse(&text)
                        .into_iter()
                        .filter(|x| !self.ignore_xids.contains(&x.code))
                        .collect();
                    for x in &xids {
                        problems.push(format!("{}.0: Xid {}: {}", x.bus, x.code, x.detail));
                    }
                    if xids.is_empty() {
                        notes.push("no Xid errors".into());
                    }
                }
                Ok(None) if source.is_none() && unreadable.is_empty() => {
                    return Finding::skip(
                        "no kernel log under --root: set kernel_log to a saved dmesg or /dev/kmsg",
                    );
                }
                Ok(None) => notes.push("no kernel log under --root".into()),
                Err(LogError::Failed(e)) => unreadable.push(e),
                Err(LogError::Denied(what)) => denied = Some(what),
            }
        }
        let count = problems.len();
        let finding = if !problems.is_empty() {
            let unreadable: Vec<&str> = unreadable.iter().map(String::as_str).collect();
            problems_and_unchecked(&problems, &unreadable).measured(format!(
                "{count} problem{}",
                if count == 1 { "" } else { "s" }
            ))
        } else if !unreadable.is_empty() {
            Finding::error(unreadable.join("; "))
        } else if let Some(what) = denied {
            // What could be read is kept; what could not is this user's
            // limit, not the node's fault.
            let skipped = super::needs_privilege(&what, KMSG_PRIVILEGE);
            if notes.is_empty() {
                skipped
            } else {
                Finding::pass(format!("{}; {}", notes.join("; "), skipped.message))
                    .measured("healthy")
            }
        } else {
            Finding::pass(notes.join("; ")).measured("healthy")
        };
        finding
            .var("gpus", gpus.join(", "))
            .var("source", source.unwrap_or_default())
    }
}

/// Why the kernel log could not be read.
enum LogError {
    /// This user lacks the privilege: what was being read.
    Denied(String),
    Failed(String),
}

/// Reading the kernel log where kernel.dmesg_restrict is set (the default
/// on most distributions).
const KMSG_PRIVILEGE: &str = "root or CAP_SYSLOG";

impl Probe for GpuHealth {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            let (f, wanted) = (Arc::clone(&facts), self.vendor);
            let vendor = tokio::task::spawn_blocking(move || health_vendor(&f, wanted))
                .await
                .unwrap_or_else(|e| Err(format!("probe crashed: {e}")));
            let report = match vendor {
                Ok(Vendor::Nvidia) if self.needs_report() => {
                    facts.gpu_report(self.nvidia_smi_xml.as_deref()).await
                }
                Ok(Vendor::Amd) if self.needs_report() => {
                    let f = Arc::clone(&facts);
                    Some(
                        tokio::task::spawn_blocking(move || amd_report(&f))
                            .await
                            .unwrap_or_else(|e| Err(format!("probe crashed: {e}"))),
                    )
                }
                _ => None,
            };
            tokio::task::spawn_blocking(move || self.check(&facts, vendor, report))
                .await
                .unwrap_or_else(|e| Finding::error(format!("probe crashed: {e}")))
        })
    }
}
