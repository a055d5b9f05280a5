//! `gpu_health`: the NVIDIA GPUs are fit to start a job: persistence mode,
//! no uncorrectable ECC errors or pending row remaps, no reset the driver
//! asks for, clocks not held down by the hardware, no Xid faults in the
//! kernel log, no memory held by other processes, and free memory balanced
//! across the local GPUs (SGLang refuses to start otherwise: "The memory
//! capacity is unbalanced. Some GPUs may be occupied by other processes.").

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    KindInfo, ParamDoc, Params, Probe, ProbeFuture, VendorParam, parse_params,
    problems_and_unchecked,
};
use preflight_facts::gpu_status::{self, GpuStatus};
use preflight_facts::visible::{self, Entry};
use preflight_facts::{Facts, GpuReport, Vendor, amdgpu, kmsg, nvidia, nvml, xid};
use preflight_ground::values::{Bytes, Span, format_bytes};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "gpu_health",
    scope: crate::Scope::Node,
    area: "accelerators",
    summary: "NVIDIA and AMD GPUs: persistence mode, uncorrectable ECC errors, pending row remaps, a reset the driver requires, clocks held down by the hardware, Xid errors in the kernel log (by the action each needs), memory used by other processes, free memory balanced across GPUs.",
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
            name: "reset_required",
            ty: "bool",
            default: Some("false"),
            doc: "No GPU may be marked by the driver as needing a reset, or its node a drain and reset (nvidia-smi's gpu_reset_status, NVML's reset status fields; R550 and later).",
        },
        ParamDoc {
            name: "throttle",
            ty: "bool",
            default: Some("false"),
            doc: "No GPU's clocks may be held down for a reason in throttle_reasons in most of the samples taken (a single sample misleads).",
        },
        ParamDoc {
            name: "throttle_reasons",
            ty: "list of strings",
            default: Some("[hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown]"),
            doc: "The clock event reasons that fail, by nvidia-smi's short names. gpu_idle, sw_power_cap and the clock settings are normal and left out.",
        },
        ParamDoc {
            name: "samples",
            ty: "integer",
            default: Some("3"),
            doc: "Clock event samples taken for `throttle`, sample_interval apart (a recorded nvidia_smi_xml holds its own: one document per sample, as `nvidia-smi -q -x -l 1` writes them).",
        },
        ParamDoc {
            name: "sample_interval",
            ty: "duration",
            default: Some("500ms"),
            doc: "Time between two clock event samples.",
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
            name: "nvlink_xids",
            ty: "list of integers",
            default: Some("[74, 144, 145, 146, 147, 148, 149, 150]"),
            doc: "Xids read as NVLink faults: each is reported with nvlink_action instead of its catalog action (on systems where an NVLink fault means something else to the site, or where the nvlink check owns them).",
        },
        ParamDoc {
            name: "nvlink_action",
            ty: "ignore|restart_app|reset_gpu|reboot|check_hardware|contact_support",
            default: Some("reset_gpu"),
            doc: "The action an NVLink Xid asks for (NVIDIA's catalog: reset the GPU, and contact support if it recurs).",
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
    hint_vars: &["gpus", "action"],
    parse: parse_params::<GpuHealth>,
};

fn default_ignored() -> Vec<u32> {
    vec![13, 31, 43, 45]
}

fn default_nvlink_xids() -> Vec<u32> {
    xid::NVLINK_XIDS.to_vec()
}

fn default_throttle_reasons() -> Vec<String> {
    [
        "hw_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    ]
    .map(String::from)
    .to_vec()
}

fn default_samples() -> u32 {
    3
}

fn default_sample_interval() -> Span {
    Span(Duration::from_millis(500))
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
    reset_required: bool,
    #[serde(default)]
    throttle: bool,
    #[serde(default = "default_throttle_reasons")]
    throttle_reasons: Vec<String>,
    #[serde(default = "default_samples")]
    samples: u32,
    #[serde(default = "default_sample_interval")]
    sample_interval: Span,
    #[serde(default)]
    xid: bool,
    #[serde(default = "default_ignored")]
    ignore_xids: Vec<u32>,
    #[serde(default = "default_nvlink_xids")]
    nvlink_xids: Vec<u32>,
    #[serde(default)]
    nvlink_action: Option<xid::Action>,
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
        if !(1..=20).contains(&self.samples) {
            return Err(format!("`samples` must be 1 to 20, found {}", self.samples));
        }
        if self.sample_interval.0 > Duration::from_secs(10) {
            return Err("`sample_interval` must be at most 10s".into());
        }
        for reason in &self.throttle_reasons {
            if !CLOCK_EVENT_REASONS.contains(&reason.as_str()) {
                return Err(format!(
                    "`throttle_reasons` names `{reason}`, which is none of {}",
                    CLOCK_EVENT_REASONS.join(", ")
                ));
            }
        }
        if !self.persistence
            && self.max_uncorrectable_ecc.is_none()
            && !self.remapped_rows
            && !self.reset_required
            && !self.throttle
            && !self.xid
            && self.max_used.is_none()
            && self.min_free_ratio.is_none()
        {
            return Err("gpu_health needs something to check: persistence, max_uncorrectable_ecc, remapped_rows, reset_required, throttle, xid, max_used or min_free_ratio".into());
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
        Some(v) => Err(format!("no {} {} present", v.name(), v.device())),
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

/// The clock event reasons NVIDIA reports, by nvidia-smi's short names.
const CLOCK_EVENT_REASONS: &[&str] = &[
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "display_clocks_setting",
];

/// Clock event reasons of every GPU, one entry per sample: (the GPU's
/// name, active reasons).
type ClockSamples = Vec<Vec<(String, Vec<String>)>>;

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
            || self.reset_required
            || self.max_used.is_some()
            || self.min_free_ratio.is_some()
    }

    /// The clock event samples: a recording's documents, else NVML (else
    /// nvidia-smi) read `samples` times. `None`: nothing to read under
    /// --root.
    async fn clock_samples(&self, facts: &Facts) -> Option<Result<ClockSamples, String>> {
        let of = |r: &GpuReport| -> Vec<(String, Vec<String>)> {
            r.gpus
                .iter()
                .filter_map(|g| Some((g.name(), g.clock_events.clone()?)))
                .collect()
        };
        if let Some(path) = &self.nvidia_smi_xml {
            let path = path.clone();
            let read = tokio::task::spawn_blocking(move || {
                let shown = path.display().to_string();
                std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read {shown}: {e}"))
                    .and_then(|text| gpu_status::parse_xml_samples(&shown, &text))
            })
            .await
            .unwrap_or_else(|e| Err(format!("reading the recording crashed: {e}")));
            return Some(read.map(|reports| reports.iter().map(of).collect()));
        }
        if !facts.is_live() {
            return None;
        }
        let mut samples = Vec::new();
        for n in 0..self.samples {
            if n > 0 {
                tokio::time::sleep(self.sample_interval.0).await;
            }
            let now = match tokio::task::spawn_blocking(nvml::clock_events_now).await {
                Ok(Ok(sample)) => sample
                    .into_iter()
                    .map(|(index, bus, reasons)| (format!("GPU {index} ({bus})"), reasons))
                    .collect(),
                // No NVML: nvidia-smi reads the same counters (the whole
                // document: R580 refuses `-d` with `-x`).
                _ => match gpu_status::run_nvidia_smi(&["-q", "-x"]).await {
                    Ok(r) => of(&r),
                    Err(e) => return Some(Err(e)),
                },
            };
            samples.push(now);
        }
        Some(Ok(samples))
    }

    /// GPUs whose clocks were held down for a watched reason in most
    /// samples. A reason seen in fewer is noted, not failed.
    fn throttle_checks(
        &self,
        samples: &ClockSamples,
        problems: &mut Vec<String>,
        notes: &mut Vec<String>,
    ) {
        // Counted by bus id, not by name: a GPU missing from one document
        // shifts the others' indices. A reason fails when active in most
        // of the samples that report the GPU.
        let bus_of = |name: &str| -> String {
            match name.rsplit_once('(') {
                Some((_, rest)) => rest.trim_end_matches(')').to_string(),
                None => name.to_string(),
            }
        };
        let mut names: std::collections::BTreeMap<String, &str> = Default::default();
        let mut present: std::collections::BTreeMap<String, usize> = Default::default();
        let mut counts: std::collections::BTreeMap<(String, &str), usize> = Default::default();
        for sample in samples {
            for (name, reasons) in sample {
                let bus = bus_of(name);
                names.entry(bus.clone()).or_insert(name.as_str());
                *present.entry(bus.clone()).or_default() += 1;
                for r in reasons.iter().filter(|r| self.throttle_reasons.contains(r)) {
                    *counts.entry((bus.clone(), r.as_str())).or_default() += 1;
                }
            }
        }
        let mut passing = Vec::new();
        for ((bus, reason), seen) in counts {
            let n = present[&bus];
            let gpu = names[&bus];
            let text = format!(
                "{gpu}: {reason} in {seen} of {n} sample{}",
                if n == 1 { "" } else { "s" }
            );
            if seen * 2 > n {
                problems.push(format!("{text}: clocks held down by the hardware"));
            } else {
                passing.push(text);
            }
        }
        if !passing.is_empty() {
            notes.push(format!("once, not repeated: {}", passing.join(", ")));
        }
        let n = samples.len();
        let gpus = present.len();
        notes.push(format!(
            "clock event reasons of {gpus} GPUs in {n} sample{}",
            if n == 1 { "" } else { "s" }
        ));
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
            if self.reset_required {
                let who = g.name();
                let recovery = g
                    .recovery_action
                    .as_deref()
                    .filter(|a| !matches!(*a, "None" | "N/A"));
                if let Some(action) = recovery {
                    problems.push(format!("{who}: the driver's recovery action is {action}"));
                } else if g.reset_required == Some(true) {
                    problems.push(format!(
                        "{who}: the driver requires a GPU reset before further use"
                    ));
                } else if g.drain_and_reset == Some(true) {
                    problems.push(format!(
                        "{who}: the driver recommends draining its work and resetting the GPU"
                    ));
                }
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
        clocks: Option<Result<ClockSamples, String>>,
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
        let mut actions: Vec<xid::Action> = Vec::new();
        let mut reset_unreported = false;
        if self.needs_report() {
            match report {
                Some(Ok(r)) => {
                    self.report_checks(facts, vendor, &r, &mut problems);
                    notes.push(format!("{} GPUs from {}", r.gpus.len(), r.source));
                    reset_unreported = self.reset_required
                        && r.gpus.iter().all(|g| {
                            g.reset_required.is_none()
                                && g.drain_and_reset.is_none()
                                && g.recovery_action.is_none()
                        });
                    if reset_unreported {
                        notes.push(format!(
                            "{} reports no reset status or recovery action (drivers from R550 do)",
                            r.source
                        ));
                    }
                    if self.reset_required {
                        actions.extend(r.gpus.iter().filter_map(recovery_needed));
                    }
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
        if self.throttle && vendor == Vendor::Nvidia {
            match clocks {
                // No GPU said why its clocks are where they are (an old
                // driver, a GPU without the query): nothing was checked.
                Some(Ok(samples)) if samples.iter().all(Vec::is_empty) => {
                    let why = "no GPU reports its clock event reasons";
                    if !self.xid && !self.needs_report() {
                        return Finding::skip(why);
                    }
                    notes.push(why.into());
                }
                Some(Ok(samples)) => self.throttle_checks(&samples, &mut problems, &mut notes),
                Some(Err(e)) => unreadable.push(e),
                None if !self.xid && !self.needs_report() => {
                    return Finding::skip(
                        "no GPU data under --root: set nvidia_smi_xml to a recorded `nvidia-smi -q -x` (one document per sample)",
                    );
                }
                None => notes.push("no clock data under --root".into()),
            }
        }
        if self.xid && vendor == Vendor::Nvidia {
            match self.kernel_log(facts) {
                Ok(Some(text)) => {
                    let xids: Vec<kmsg::Xid> = kmsg::parse(&text)
                        .into_iter()
                        .filter(|x| !self.ignore_xids.contains(&x.code))
                        .collect();
                    let groups = xid::group(&xids, &self.nvlink_xids, Some(self.nvlink_action()));
                    let driver = nvidia::driver_gpus(&facts.host_path("/proc/driver/nvidia/gpus"));
                    for g in groups.iter().filter(|g| g.action > xid::Action::Ignore) {
                        problems.push(xid_problem(g, &driver));
                        actions.push(g.action);
                    }
                    let ignored = groups
                        .iter()
                        .filter(|g| g.action == xid::Action::Ignore)
                        .count();
                    if groups.len() == ignored {
                        notes.push(if ignored == 0 {
                            "no Xid errors".to_string()
                        } else {
                            format!(
                                "{ignored} informational Xid{} only",
                                if ignored == 1 { "" } else { "s" }
                            )
                        });
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
        if problems.is_empty()
            && unreadable.is_empty()
            && reset_unreported
            && !self.throttle
            && !self.xid
            && !self.persistence
            && !self.remapped_rows
            && self.max_uncorrectable_ecc.is_none()
            && self.max_used.is_none()
            && self.min_free_ratio.is_none()
        {
            return Finding::skip(notes.join("; "));
        }
        let action = actions.iter().max().map_or("", |a| a.words());
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
            .var("action", action)
    }

    fn nvlink_action(&self) -> xid::Action {
        self.nvlink_action.unwrap_or(xid::Action::ResetGpu)
    }
}

/// "GPU 3 (0000:5d:00.0) Xid 79 (fallen off the bus): reboot; 2 times,
/// 812.3 s to 900.0 s after boot; first: <the driver's words>". The GPU's
/// index is its place in bus order among the driver's GPUs (nvidia-smi's
/// order); a GPU the driver lost is named by its bus id.
fn xid_problem(g: &xid::Group, driver: &[nvidia::DriverGpu]) -> String {
    let bus = format!("{}.0", g.bus);
    let who = match driver.iter().position(|d| d.bus_id == bus) {
        Some(i) => format!("GPU {i} ({bus})"),
        None => bus,
    };
    let mut text = format!("{who} Xid {} ({}): {}", g.code, g.name, g.action.words());
    let when = |s: f64| format!("{s:.1} s");
    match (g.count, g.first, g.last) {
        (1, Some(at), _) => text.push_str(&format!(", at {} after boot", when(at))),
        (1, None, _) => {}
        (n, Some(first), Some(last)) => text.push_str(&format!(
            "; {n} times, {} to {} after boot",
            when(first),
            when(last)
        )),
        (n, _, _) => text.push_str(&format!("; {n} times")),
    }
    text.push_str(&format!(": {}", g.detail));
    text
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
            let clocks = match vendor {
                Ok(Vendor::Nvidia) if self.throttle => self.clock_samples(&facts).await,
                _ => None,
            };
            tokio::task::spawn_blocking(move || self.check(&facts, vendor, report, clocks))
                .await
                .unwrap_or_else(|e| Finding::error(format!("probe crashed: {e}")))
        })
    }
}

/// What the driver's reset status or recovery action asks of a GPU.
fn recovery_needed(g: &GpuStatus) -> Option<xid::Action> {
    match g.recovery_action.as_deref() {
        Some(a) if a.to_ascii_lowercase().contains("reboot") => Some(xid::Action::Reboot),
        Some("None" | "N/A") | None => (g.reset_required == Some(true)
            || g.drain_and_reset == Some(true))
        .then_some(xid::Action::ResetGpu),
        Some(_) => Some(xid::Action::ResetGpu),
    }
}
