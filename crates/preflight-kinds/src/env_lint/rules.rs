//! The per-variable rules: name known, value syntax, and value against
//! this node (interfaces, HCAs and their GID tables, accelerators).

use super::catalog::{Catalog, check_value};
use super::{Issue, Level};
use crate::ifname_spec;
use preflight_facts::infiniband::HcaFilter;
use preflight_facts::visible::{self, Entry};
use preflight_facts::{Facts, Hca, Vendor};
use preflight_ground::suggest::did_you_mean;

fn push(issues: &mut Vec<Issue>, level: Level, variable: &str, message: String) {
    issues.push(Issue {
        level,
        variable: variable.to_string(),
        message,
        suggestion: None,
        uncatalogued: false,
    });
}

fn suggest(issues: &mut Vec<Issue>, level: Level, variable: &str, message: String, fix: String) {
    issues.push(Issue {
        level,
        variable: variable.to_string(),
        message,
        suggestion: Some(fix),
        uncatalogued: false,
    });
}

fn is_true(value: &str) -> bool {
    matches!(value.trim(), "1" | "true" | "TRUE" | "True" | "yes" | "on")
}

pub fn lint_one(
    name: &str,
    value: &str,
    facts: &Facts,
    catalog: &Catalog,
    allow_debug: bool,
    issues: &mut Vec<Issue>,
) {
    if let Some(new) = catalog.deprecated.get(name) {
        let mut message = format!("{name} is deprecated: PyTorch reads {new} now");
        match facts.env(new) {
            Some(v) if v != value => {
                message.push_str(&format!(" (also set, to `{v}`, which wins)"));
            }
            Some(_) => message.push_str(" (also set, to the same value: drop the old name)"),
            None => message.push_str(&format!(": rename it to {new}")),
        }
        suggest(issues, Level::Warn, name, message, new.clone());
        return;
    }
    if catalog.source_of(name).is_none() {
        let known = catalog
            .names()
            .chain(catalog.deprecated.keys().map(String::as_str));
        match did_you_mean(name, known) {
            Some(s) => {
                let doc = catalog
                    .source_of(s)
                    .map(|src| format!(" ({}: {})", src.id, src.doc))
                    .unwrap_or_default();
                suggest(
                    issues,
                    Level::Fail,
                    name,
                    format!(
                        "{name} is not a variable any library reads (ignored); did you mean {s}?{doc}"
                    ),
                    s.to_string(),
                )
            }
            None => issues.push(Issue {
                level: Level::Warn,
                variable: name.to_string(),
                message: format!(
                    "{name} is not in the catalog (unknown to preflight; check its spelling)"
                ),
                suggestion: None,
                uncatalogued: true,
            }),
        }
        return;
    }

    if let Some(rule) = catalog.values.get(name) {
        if name == "CCL_LOG_LEVEL" && value.trim().eq_ignore_ascii_case("fatal") {
            suggest(
                issues,
                Level::Fail,
                name,
                "CCL_LOG_LEVEL=fatal is not a valid level: oneCCL hangs at initialisation instead of reporting it; use error".into(),
                "error".into(),
            );
            return;
        }
        if let Err(e) = check_value(name, value, rule) {
            push(issues, Level::Fail, name, e);
            return;
        }
    }
    if catalog.integers.iter().any(|n| n == name) && value.trim().parse::<i64>().is_err() {
        push(
            issues,
            Level::Fail,
            name,
            format!("{name}=`{value}` is not an integer"),
        );
        return;
    }

    if ifname_spec::Syntax::of(name).is_some() {
        let route = facts
            .env("MASTER_ADDR")
            .filter(|a| !a.trim().is_empty())
            .and_then(|a| crate::interface::route_interface(facts, a.trim()));
        if let Err(e) = ifname_spec::check(name, value, facts.interfaces(), route.as_deref()) {
            match route {
                Some(r) if e.contains("the route to MASTER_ADDR") => {
                    suggest(issues, Level::Fail, name, e, format!("{name}={r}"))
                }
                _ => push(issues, Level::Fail, name, e),
            }
        }
        return;
    }

    match name {
        "NCCL_IB_HCA" => ib_hca(value, facts.hcas(), facts, issues),
        "NCCL_IB_GID_INDEX" => gid_index(value, facts, issues),
        "NCCL_IB_DISABLE" if is_true(value) => {
            let active: Vec<String> = facts
                .hcas()
                .iter()
                .flat_map(|h| {
                    h.ports
                        .iter()
                        .filter(|p| p.is_active())
                        .map(move |p| format!("{}:{}", h.name, p.number))
                })
                .collect();
            if !active.is_empty() {
                push(
                    issues,
                    Level::Warn,
                    name,
                    format!(
                        "NCCL_IB_DISABLE=1 while RDMA ports are active ({}): NCCL falls back to TCP sockets, many times slower. A stray variable from a debugging session?",
                        active.join(", ")
                    ),
                );
            }
        }
        "NCCL_P2P_DISABLE" if is_true(value) => push(
            issues,
            Level::Warn,
            name,
            "NCCL_P2P_DISABLE=1 turns off NVLink/PCIe peer-to-peer: intra-node traffic goes through host memory, much slower".into(),
        ),
        "NCCL_SHM_DISABLE" if is_true(value) => push(
            issues,
            Level::Warn,
            name,
            "NCCL_SHM_DISABLE=1 turns off shared-memory transport between processes on this node".into(),
        ),
        "NCCL_DEBUG" if !allow_debug => {
            let v = value.trim().to_ascii_uppercase();
            if v == "INFO" || v == "TRACE" {
                suggest(
                    issues,
                    Level::Warn,
                    name,
                    format!("NCCL_DEBUG={value} logs every connection and slows start-up; use WARN in production"),
                    "NCCL_DEBUG=WARN".into(),
                );
            }
        }
        "TORCH_DISTRIBUTED_BACKEND" => backend_device(value, facts, issues),
        "CCL_PROCESS_LAUNCHER" if value.trim() == "none" => {
            let missing: Vec<&str> = ["CCL_LOCAL_RANK", "CCL_LOCAL_SIZE"]
                .into_iter()
                .filter(|v| facts.env(v).is_none())
                .collect();
            if !missing.is_empty() {
                push(
                    issues,
                    Level::Fail,
                    name,
                    format!(
                        "CCL_PROCESS_LAUNCHER=none: with no launcher oneCCL learns each rank's place on its node only from CCL_LOCAL_RANK and CCL_LOCAL_SIZE, and {} unset",
                        if missing.len() == 2 {
                            "both are".to_string()
                        } else {
                            format!("{} is", missing[0])
                        }
                    ),
                );
            }
        }
        "CCL_TOPO_FABRIC_VERTEX_CONNECTION_CHECK" if value.trim() == "0" => push(
            issues,
            Level::Warn,
            name,
            "CCL_TOPO_FABRIC_VERTEX_CONNECTION_CHECK=0 makes oneCCL assume Xe Links between every pair of devices: a link that is down is no longer seen, and traffic meant for it stalls or crawls over PCIe".into(),
        ),
        n if NVIDIA_FABRIC_VARS.contains(&n) => rccl_has_no_nvlink(n, value, facts, issues),
        "ZE_AFFINITY_MASK" => ze_affinity_mask(value, facts, issues),
        "CCL_ATL_TRANSPORT" => ccl_transport(value, facts, issues),
        "CUDA_VISIBLE_DEVICES" | "HIP_VISIBLE_DEVICES" | "ROCR_VISIBLE_DEVICES" => {
            visible_devices(name, value, issues)
        }
        _ => {}
    }
}

/// NCCL's variables for what only NVIDIA's fabric has: NVLink SHARP
/// (NVSwitch multicast) and multi-node NVLink. RCCL reads the NCCL names,
/// and AMD GPUs have neither.
const NVIDIA_FABRIC_VARS: &[&str] = &[
    "NCCL_NVLS_ENABLE",
    "NCCL_NVLS_CHUNKSIZE",
    "NCCL_NVLS_NCHANNELS",
    "NCCL_MNNVL_ENABLE",
];

/// On an AMD node (RCCL), a variable for NVIDIA's fabric is a leftover of
/// a job script written for NVIDIA: it changes nothing, and what it was
/// meant to do is not done.
fn rccl_has_no_nvlink(name: &str, value: &str, facts: &Facts, issues: &mut Vec<Issue>) {
    let vendors = facts.accelerator_vendors();
    if !vendors.contains(&Vendor::Amd) || vendors.contains(&Vendor::Nvidia) {
        return;
    }
    push(
        issues,
        Level::Warn,
        name,
        format!(
            "{name}={value} tunes NVLink SHARP or multi-node NVLink, which this node's AMD GPUs do not have: it changes nothing under RCCL (a job script written for NVIDIA? RCCL's own settings are RCCL_*)"
        ),
    );
}

/// NCCL_IB_HCA: `[^][=]name[:port],...`, names as prefixes unless `=`,
/// parsed as the infiniband check parses it.
fn ib_hca(value: &str, hcas: &[Hca], facts: &Facts, issues: &mut Vec<Issue>) {
    let name = "NCCL_IB_HCA";
    let filter = HcaFilter::parse(value);
    let ib_off = facts.env("NCCL_IB_DISABLE").is_some_and(is_true);
    if hcas.is_empty() {
        if !filter.exclude && !ib_off {
            push(
                issues,
                Level::Fail,
                name,
                format!(
                    "NCCL_IB_HCA=`{value}` but this node has no RDMA devices (/sys/class/infiniband is empty or missing)"
                ),
            );
        }
        return;
    }
    let have = hcas
        .iter()
        .map(|h| h.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    for spec in &filter.specs {
        let device = &spec.name;
        let matching: Vec<&Hca> = hcas
            .iter()
            .filter(|h| filter.names(spec, &h.name))
            .collect();
        if matching.is_empty() {
            let mut message = format!(
                "NCCL_IB_HCA=`{value}`: no HCA {} `{device}` (have: {have})",
                if filter.exact { "named" } else { "matching" }
            );
            if let Some(s) = did_you_mean(device, hcas.iter().map(|h| h.name.as_str())) {
                message.push_str(&format!("; did you mean `{s}`?"));
            }
            let level = if filter.exclude {
                Level::Warn
            } else {
                Level::Fail
            };
            push(issues, level, name, message);
            continue;
        }
        let Some(port) = &spec.port_text else {
            continue;
        };
        let Some(number) = spec.port else {
            push(
                issues,
                Level::Fail,
                name,
                format!("NCCL_IB_HCA=`{value}`: port `{port}` of {device} is not a number"),
            );
            continue;
        };
        for hca in matching {
            match hca.ports.iter().find(|p| p.number == number) {
                None => push(
                    issues,
                    Level::Fail,
                    name,
                    format!(
                        "NCCL_IB_HCA=`{value}`: {} has no port {number} (ports: {})",
                        hca.name,
                        hca.ports
                            .iter()
                            .map(|p| p.number.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
                Some(p) if !filter.exclude && !p.is_active() => push(
                    issues,
                    Level::Fail,
                    name,
                    format!(
                        "NCCL_IB_HCA=`{value}`: {}:{number} is {}, not ACTIVE",
                        hca.name, p.state
                    ),
                ),
                Some(_) => {}
            }
        }
    }
}

/// NCCL_IB_GID_INDEX must name a populated entry of each active port's GID
/// table; an empty entry makes RoCE connections fail at setup.
fn gid_index(value: &str, facts: &Facts, issues: &mut Vec<Issue>) {
    let name = "NCCL_IB_GID_INDEX";
    let Ok(index) = value.trim().parse::<usize>() else {
        push(
            issues,
            Level::Fail,
            name,
            format!("{name}=`{value}` is not a non-negative integer"),
        );
        return;
    };
    let mut bad = Vec::new();
    for hca in facts.hcas() {
        for port in hca.ports.iter().filter(|p| p.is_active()) {
            match port.gids.get(index) {
                Some(Some(_)) => {}
                Some(None) => bad.push(format!(
                    "{}:{} ({}, entry {index} is empty)",
                    hca.name,
                    port.number,
                    port.kind()
                )),
                None => bad.push(format!(
                    "{}:{} ({}, table has {} entries)",
                    hca.name,
                    port.number,
                    port.kind(),
                    port.gids.len()
                )),
            }
        }
    }
    if !bad.is_empty() {
        push(
            issues,
            Level::Fail,
            name,
            format!(
                "{name}={index} is not a valid GID on {}: see `show_gids` for the RoCE v2 index",
                bad.join(", ")
            ),
        );
    }
}

fn backend_device(value: &str, facts: &Facts, issues: &mut Vec<Issue>) {
    let backend = value.trim().to_ascii_lowercase();
    let needs: &[Vendor] = match backend.as_str() {
        "nccl" => &[Vendor::Nvidia, Vendor::Amd],
        "xccl" | "ccl" => &[Vendor::Intel],
        "hccl" => &[Vendor::Habana],
        _ => return,
    };
    let present = facts.accelerator_vendors();
    if !needs.iter().any(|v| present.contains(v)) {
        push(
            issues,
            Level::Warn,
            "TORCH_DISTRIBUTED_BACKEND",
            format!(
                "TORCH_DISTRIBUTED_BACKEND={value} needs a {} device, and this node has none",
                needs
                    .iter()
                    .map(|v| v.name())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        );
    }
}

/// Visibility masks, read as the device checks read them (facts::visible):
/// only the syntax is judged here; whether the devices exist is the
/// `devices` kind's question.
fn visible_devices(name: &str, value: &str, issues: &mut Vec<Issue>) {
    if value.trim().is_empty() {
        push(
            issues,
            Level::Warn,
            name,
            format!("{name} is set but empty: the job sees no GPU"),
        );
        return;
    }
    let Some(variable) = [
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
    ]
    .into_iter()
    .find(|v| *v == name) else {
        return;
    };
    let Some(mask) = visible::parse(variable, value) else {
        return;
    };
    for entry in &mask.entries {
        if let Entry::Opaque(text) = entry
            && !text.starts_with("MIG-")
            && text != "NoDevFiles"
        {
            push(
                issues,
                Level::Fail,
                name,
                format!("{name}=`{value}`: `{text}` is not a device index or GPU-/MIG- UUID"),
            );
            return;
        }
    }
    let written = value.split(',').filter(|e| !e.trim().is_empty()).count();
    if mask.entries.len() < written && !mask.entries.is_empty() {
        push(
            issues,
            Level::Warn,
            name,
            format!(
                "{name}=`{value}`: the runtime stops at the negative index, so only the first {} entr{} count",
                mask.entries.len(),
                if mask.entries.len() == 1 { "y" } else { "ies" }
            ),
        );
    }
}

/// The variables oneCCL reads to decide it was started by an MPI launcher
/// (env_parser.cpp, is_run_with_mpi; PMIX_RANK in recent releases). With
/// none of them and CCL_ATL_TRANSPORT unset it switches from its default,
/// mpi, to ofi, and says so only in a log line.
pub const ONECCL_MPI_VARS: &[&str] = &[
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
];

/// Open MPI's own rank variables, which oneCCL does not read.
const OPEN_MPI_VARS: &[&str] = &["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"];

fn first_set<'a>(facts: &Facts, names: &[&'a str]) -> Option<&'a str> {
    names.iter().copied().find(|n| facts.env(n).is_some())
}

/// CCL_ATL_TRANSPORT=mpi needs the process started by an MPI launcher;
/// under torchrun or a plain srun MPI makes each rank a world of its own.
fn ccl_transport(value: &str, facts: &Facts, issues: &mut Vec<Issue>) {
    let name = "CCL_ATL_TRANSPORT";
    if !value.trim().eq_ignore_ascii_case("mpi") {
        return;
    }
    let launched = first_set(facts, ONECCL_MPI_VARS).or(first_set(facts, OPEN_MPI_VARS));
    if launched.is_none() {
        suggest(
            issues,
            Level::Warn,
            name,
            format!(
                "CCL_ATL_TRANSPORT=mpi, but no MPI launcher started this process (none of {} or Open MPI's OMPI_COMM_WORLD_RANK is set): under torchrun or a plain srun, MPI makes each rank a world of its own. Launch with mpiexec/mpirun (or srun --mpi=pmi2/pmix), or set CCL_ATL_TRANSPORT=ofi",
                ONECCL_MPI_VARS.join(", ")
            ),
            "ofi".into(),
        );
    }
}

/// Checks that apply to a variable a check lists in `variables:` while it
/// is unset: leaving it to the library can itself be the problem.
pub fn lint_unset(name: &str, facts: &Facts, issues: &mut Vec<Issue>) {
    if name != "CCL_ATL_TRANSPORT" {
        return;
    }
    let intel_gpu = facts.accelerator_vendors().contains(&Vendor::Intel);
    let ccl_configured = facts
        .env_names()
        .any(|n| n.starts_with("CCL_") || n.starts_with("I_MPI_"));
    if !intel_gpu && !ccl_configured {
        push(
            issues,
            Level::Note,
            name,
            "CCL_ATL_TRANSPORT is unset; oneCCL does not seem to be in use here (no Intel GPU, no CCL_ or I_MPI_ variable)".into(),
        );
        return;
    }
    if let Some(var) = first_set(facts, ONECCL_MPI_VARS) {
        push(
            issues,
            Level::Note,
            name,
            format!(
                "CCL_ATL_TRANSPORT is unset: oneCCL keeps its default, mpi ({var} is set by the MPI launcher)"
            ),
        );
        return;
    }
    let message = match first_set(facts, OPEN_MPI_VARS) {
        Some(var) => format!(
            "CCL_ATL_TRANSPORT is unset and this process was started by Open MPI ({var}), whose variables oneCCL does not look for ({}): it switches from mpi to ofi, saying so only in a log line (\"did not find MPI-launcher specific variables, switch to ATL/OFI\"). Set CCL_ATL_TRANSPORT explicitly",
            ONECCL_MPI_VARS.join(", ")
        ),
        None => format!(
            "CCL_ATL_TRANSPORT is unset and no MPI launcher variable oneCCL looks for ({}) is set: oneCCL switches from its default, mpi, to ofi, saying so only in a log line (\"did not find MPI-launcher specific variables, switch to ATL/OFI\"), so ranks started differently use different transports. Set CCL_ATL_TRANSPORT=ofi (or mpi under mpiexec) explicitly",
            ONECCL_MPI_VARS.join(", ")
        ),
    };
    let fix = if first_set(facts, OPEN_MPI_VARS).is_some() {
        "mpi"
    } else {
        "ofi"
    };
    suggest(issues, Level::Warn, name, message, fix.into());
}

/// ZE_AFFINITY_MASK: a comma-separated list of devices (`N`) or
/// sub-devices (`N.M`); when the node's Intel GPUs are known, each must
/// exist in the hierarchy Level Zero presents (FLAT, its default: every
/// tile a device; COMPOSITE: cards, with tiles as sub-devices).
fn ze_affinity_mask(value: &str, facts: &Facts, issues: &mut Vec<Issue>) {
    let name = "ZE_AFFINITY_MASK";
    let mut entries: Vec<(usize, Option<usize>, &str)> = Vec::new();
    for raw in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let numbers: Option<Vec<usize>> = raw.split('.').map(|p| p.parse().ok()).collect();
        match numbers.as_deref() {
            Some(&[device]) => entries.push((device, None, raw)),
            Some(&[device, sub]) => entries.push((device, Some(sub), raw)),
            _ => {
                let why = if raw.contains('-') || raw.contains(':') {
                    "ranges are not part of the syntax: list every device (0,1,2,3)"
                } else {
                    "expected a device index N or a sub-device N.M"
                };
                push(
                    issues,
                    Level::Fail,
                    name,
                    format!(
                        "ZE_AFFINITY_MASK=`{value}`: `{raw}` is not an entry Level Zero reads ({why})"
                    ),
                );
                return;
            }
        }
        if entries[..entries.len() - 1].iter().any(|e| e.2 == raw) {
            push(
                issues,
                Level::Warn,
                name,
                format!("ZE_AFFINITY_MASK=`{value}` names `{raw}` twice"),
            );
        }
    }
    let cards: Vec<usize> = facts
        .accelerators()
        .iter()
        .filter(|a| a.vendor == Vendor::Intel && a.in_driver)
        .map(|a| a.tiles.max(1))
        .collect();
    if cards.is_empty() {
        // No Intel GPU seen (a container without sysfs, another vendor):
        // only the syntax can be judged.
        return;
    }
    let composite = facts
        .env("ZE_FLAT_DEVICE_HIERARCHY")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("COMPOSITE"));
    let (count, hierarchy) = if composite {
        (cards.len(), "COMPOSITE hierarchy (one device per card)")
    } else {
        (
            cards.iter().sum(),
            "FLAT hierarchy, Level Zero's default (one device per tile)",
        )
    };
    let range = if count == 1 {
        "0".to_string()
    } else {
        format!("0-{}", count - 1)
    };
    for (device, sub, raw) in entries {
        if device >= count {
            push(
                issues,
                Level::Fail,
                name,
                format!(
                    "ZE_AFFINITY_MASK=`{value}` names device {device}{}, but this node has {count} Intel GPU device{} ({range}) in the {hierarchy}",
                    if sub.is_some() {
                        format!(" (in `{raw}`)")
                    } else {
                        String::new()
                    },
                    if count == 1 { "" } else { "s" }
                ),
            );
            return;
        }
        let combined = facts
            .env("ZE_FLAT_DEVICE_HIERARCHY")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("COMBINED"));
        if let (false, false, Some(_)) = (composite, combined, sub) {
            push(
                issues,
                Level::Fail,
                name,
                format!(
                    "ZE_AFFINITY_MASK=`{value}` names the sub-device `{raw}`, which the {hierarchy} does not have (the Level Zero specification: `0.0` is not valid with FLAT): name tiles as devices (0-{}), or set ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE",
                    count - 1
                ),
            );
            return;
        }
        if let (true, Some(sub)) = (composite, sub) {
            let tiles = cards[device];
            if sub >= tiles {
                push(
                    issues,
                    Level::Fail,
                    name,
                    format!(
                        "ZE_AFFINITY_MASK=`{value}` names sub-device {sub} of card {device}, which has {tiles} tile{}",
                        if tiles == 1 { "" } else { "s" }
                    ),
                );
                return;
            }
        }
    }
}
