//! `driver`: the accelerators' kernel drivers are loaded, bound to every
//! device, recent enough and consistent with their user-space libraries;
//! GPUDirect RDMA and Fabric Manager where the checklist asks.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    KindInfo, ParamDoc, Params, Probe, ProbeFuture, VendorParam, parse_params, problems_finding,
    vendors_to_check,
};
use preflight_facts::nvidia::{self, compare_versions, valid_version};
use preflight_facts::shared_library::Places;
use preflight_facts::{Facts, GpuReport, Vendor};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "driver",
    scope: crate::Scope::Node,
    area: "accelerators",
    summary: "The accelerator drivers are loaded and bound to every device, at least a minimum version, one version from kernel to user space; GPUDirect RDMA and Fabric Manager when asked.",
    params: &[
        ParamDoc {
            name: "vendor",
            ty: "nvidia|amd|intel|habana",
            default: Some("(every vendor present)"),
            doc: "Which accelerators' driver to check.",
        },
        ParamDoc {
            name: "bound",
            ty: "bool",
            default: Some("true"),
            doc: "Every accelerator must be bound to its vendor's driver, one driver per vendor. Turn off in a check about one other thing (GPUDirect RDMA).",
        },
        ParamDoc {
            name: "min_version",
            ty: "string",
            default: Some("unset"),
            doc: "NVIDIA: the lowest acceptable driver version, e.g. \"535.104.05\".",
        },
        ParamDoc {
            name: "peermem",
            ty: "bool",
            default: Some("false"),
            doc: "NVIDIA: GPUDirect RDMA must be available (nvidia_peermem or nv_peer_mem loaded).",
        },
        ParamDoc {
            name: "fabric_manager",
            ty: "bool",
            default: Some("true"),
            doc: "NVIDIA with NVSwitches on the bus: nv-fabricmanager must run and every GPU's fabric registration be complete.",
        },
        ParamDoc {
            name: "level_zero",
            ty: "bool",
            default: Some("true"),
            doc: "Intel: the Level Zero loader (libze_loader.so.1) must be findable.",
        },
        ParamDoc {
            name: "nvidia_smi_xml",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `nvidia-smi -q -x` to read instead of NVML (relative to the working directory).",
        },
    ],
    hint_vars: &["version", "vendor"],
    parse: parse_params::<Driver>,
};

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Driver {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vendor: Option<VendorParam>,
    #[serde(default = "yes")]
    bound: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_version: Option<String>,
    #[serde(default)]
    peermem: bool,
    #[serde(default = "yes")]
    fabric_manager: bool,
    #[serde(default = "yes")]
    level_zero: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nvidia_smi_xml: Option<PathBuf>,
}

impl Params for Driver {
    fn validate(&self) -> Result<(), String> {
        if let Some(v) = &self.min_version
            && !valid_version(v)
        {
            return Err(format!(
                "`min_version` `{v}` is not a dotted version such as \"535.104.05\""
            ));
        }
        Ok(())
    }
}

/// Directories the Level Zero loader is installed in by Intel's packages
/// and oneAPI, besides LD_LIBRARY_PATH.
const ONEAPI_DIRS: &[&str] = &[
    "/usr/local/lib",
    "/opt/intel/oneapi/redist/lib",
    "/opt/intel/oneapi/compiler/latest/lib",
];

struct Outcome {
    problems: Vec<String>,
    notes: Vec<String>,
    version: Option<String>,
}

impl Driver {
    fn bound_everywhere(&self, facts: &Facts, vendor: Vendor, out: &mut Outcome) {
        let mut drivers: Vec<(String, Vec<String>)> = Vec::new();
        for a in facts.accelerators().iter().filter(|a| a.vendor == vendor) {
            match a.pci.driver.as_deref() {
                Some(d) if vendor.drivers().contains(&d) => {
                    match drivers.iter_mut().find(|(name, _)| name == d) {
                        Some((_, buses)) => buses.push(a.pci.address.clone()),
                        None => drivers.push((d.to_string(), vec![a.pci.address.clone()])),
                    }
                }
                Some(d) => out.problems.push(format!(
                    "{} is bound to {d}, not {}",
                    a.pci.address,
                    vendor.drivers().join(" or ")
                )),
                None => out.problems.push(format!(
                    "{} is not bound to any driver (expected {})",
                    a.pci.address,
                    vendor.drivers().join(" or ")
                )),
            }
        }
        if drivers.len() > 1 {
            out.problems.push(format!(
                "{} GPUs are split between drivers: {}",
                vendor.name(),
                drivers
                    .iter()
                    .map(|(d, b)| format!("{d} ({})", b.join(", ")))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ));
        }
        if let Some((d, _)) = drivers.first() {
            out.notes.push(format!("{} bound", d));
        }
    }

    fn nvidia(&self, facts: &Facts, report: Option<&Result<GpuReport, String>>, out: &mut Outcome) {
        let proc_path = nvidia::PROC_VERSION;
        let proc_version = match std::fs::read_to_string(facts.host_path(proc_path)) {
            Ok(text) => match nvidia::proc_version(&text) {
                Some(v) => Some(v),
                None => {
                    out.problems
                        .push(format!("{proc_path} has no version in its NVRM line"));
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                out.problems.push(format!(
                    "the NVIDIA driver is not loaded ({proc_path} does not exist)"
                ));
                None
            }
            Err(e) => {
                out.problems.push(format!("cannot read {proc_path}: {e}"));
                None
            }
        };
        let module_path = nvidia::MODULE_VERSION;
        let module_version = std::fs::read_to_string(facts.host_path(module_path))
            .ok()
            .map(|t| t.trim().to_string());
        if let (Some(p), Some(m)) = (&proc_version, &module_version)
            && p != m
        {
            out.problems.push(format!(
                    "{proc_path} says {p} but {module_path} says {m}: a module was replaced without a reboot"
                ));
        }
        let kernel = nvidia::kernel_version(proc_version, module_version);
        match (report, &kernel) {
            (Some(Ok(r)), Some(k)) => match &r.driver_version {
                Some(user) if user != k => out.problems.push(format!(
                    "driver/library version mismatch: the kernel module is {k} but {} reports {user}",
                    r.source
                )),
                Some(_) => out.notes.push(format!("{} agrees", r.source)),
                None => {}
            },
            (Some(Err(e)), _) => out.notes.push(format!("user-space version not compared: {e}")),
            _ => {}
        }
        if let (Some(min), Some(k)) = (&self.min_version, &kernel)
            && compare_versions(k, min).is_lt()
        {
            out.problems
                .push(format!("NVIDIA driver {k} is older than the minimum {min}"));
        }
        if let Some(k) = &kernel {
            out.version = Some(k.clone());
        }
        if self.peermem {
            let loaded = ["nvidia_peermem", "nv_peer_mem"]
                .iter()
                .find(|m| facts.module_loaded(m));
            match loaded {
                Some(m) => out.notes.push(format!("{m} loaded")),
                None => out.problems.push(
                    "GPUDirect RDMA is unavailable: neither nvidia_peermem nor nv_peer_mem is loaded"
                        .into(),
                ),
            }
        }
        let nvswitches: Vec<&str> = facts
            .pci_devices()
            .iter()
            .filter(|d| d.is_nvswitch())
            .map(|d| d.address.as_str())
            .collect();
        if self.fabric_manager && !nvswitches.is_empty() {
            // /proc/PID/comm keeps 15 characters: "nv-fabricmanage".
            if !facts
                .processes()
                .iter()
                .any(|p| "nv-fabricmanager".starts_with(p.as_str()) && p.len() >= 15)
            {
                out.problems.push(format!(
                    "{} NVSwitches on the bus but nv-fabricmanager is not running: CUDA fails with \"system not yet initialized\"",
                    nvswitches.len()
                ));
            }
            if let Some(Ok(r)) = report {
                for g in &r.gpus {
                    let state = g.fabric_state.as_deref();
                    let status = g.fabric_status.as_deref();
                    let done = state.is_none_or(|s| s == "Completed")
                        && status.is_none_or(|s| s == "Success");
                    if !done {
                        out.problems.push(format!(
                            "{}: fabric registration {} ({})",
                            g.bus_id,
                            state.unwrap_or("unknown"),
                            status.unwrap_or("no status")
                        ));
                    }
                }
            }
        }
    }

    fn level_zero_found(&self, facts: &Facts) -> Option<String> {
        let mut places =
            Places::on_node(&facts.root, facts.env("LD_LIBRARY_PATH").map(String::from));
        // Where oneAPI installs it, when its setvars.sh was not sourced.
        places
            .system_dirs
            .extend(ONEAPI_DIRS.iter().map(PathBuf::from));
        places
            .find("libze_loader.so.1")
            .map(|(path, _)| path.display().to_string())
    }

    fn check(&self, facts: &Facts, report: Option<Result<GpuReport, String>>) -> Finding {
        let vendors = match vendors_to_check(facts, self.vendor) {
            Ok(v) => v,
            Err(skip) => return skip,
        };
        let mut out = Outcome {
            problems: Vec::new(),
            notes: Vec::new(),
            version: None,
        };
        for &vendor in &vendors {
            if !facts.accelerators().iter().any(|a| a.vendor == vendor) {
                out.problems
                    .push(format!("no {} accelerator on the PCI bus", vendor.name()));
                continue;
            }
            if self.bound {
                self.bound_everywhere(facts, vendor, &mut out);
            }
            match vendor {
                Vendor::Nvidia => self.nvidia(facts, report.as_ref(), &mut out),
                Vendor::Amd => {
                    if !facts.host_path("/dev/kfd").exists() {
                        out.problems.push(
                            "/dev/kfd does not exist: amdgpu loaded without KFD, ROCm sees no GPU"
                                .into(),
                        );
                    }
                }
                Vendor::Intel => {
                    if self.level_zero {
                        match self.level_zero_found(facts) {
                            Some(at) => out.notes.push(format!("Level Zero loader in {at}")),
                            None => out.problems.push(
                                "the Level Zero loader libze_loader.so.1 is not installed (not in LD_LIBRARY_PATH, the library directories or ld.so.cache)"
                                    .into(),
                            ),
                        }
                    }
                }
                Vendor::Habana => {}
            }
            if vendor != Vendor::Nvidia {
                for module in vendor.drivers() {
                    let path = format!("/sys/module/{module}/version");
                    if let Ok(v) = std::fs::read_to_string(facts.host_path(&path)) {
                        out.version.get_or_insert_with(|| v.trim().to_string());
                    }
                }
            }
        }
        let version = out.version.clone().unwrap_or_else(|| "unknown".into());
        let vendor_names = vendors
            .iter()
            .map(|v| v.name())
            .collect::<Vec<_>>()
            .join(", ");
        let finding = if out.problems.is_empty() {
            let mut message = match &out.version {
                Some(v) => format!("{vendor_names} driver {v}"),
                None => format!("{vendor_names} driver (no version published)"),
            };
            if !out.notes.is_empty() {
                message.push_str(&format!(": {}", out.notes.join(", ")));
            }
            Finding::pass(message)
        } else {
            problems_finding(&out.problems)
        };
        let finding = finding
            .measured(version.clone())
            .var("version", version)
            .var("vendor", vendor_names);
        match &self.min_version {
            Some(min) => finding.expected(format!(">= {min}")),
            None => finding,
        }
    }
}

impl Probe for Driver {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            let report = if super::nvidia_present(&facts).await {
                facts.gpu_report(self.nvidia_smi_xml.as_deref()).await
            } else {
                None
            };
            tokio::task::spawn_blocking(move || self.check(&facts, report))
                .await
                .unwrap_or_else(|e| Finding::error(format!("probe crashed: {e}")))
        })
    }
}
