//! Check kinds: the built-in probes a checklist's `kind:` names. Each kind
//! declares its parameters (deserialized from the check's remaining keys),
//! its documentation for `preflight explain`, and how it evaluates.

pub mod amd_smi;
pub mod cluster;
pub mod collective_backend;
pub mod collective_busbw;
mod command;
mod cpu;
pub mod dcgm_diag;
mod devices;
mod disk_free;
mod driver;
mod env;
mod env_lint;
mod file;
pub mod firewall;
mod gpu_bandwidth;
mod gpu_health;
mod gpu_memory_test;
pub mod hl_smi;
pub mod http;
pub mod ifname_spec;
mod infiniband;
mod interface;
mod kernel_param;
mod launch_env;
mod memory;
pub mod nvlink;
mod pcie_link;
pub mod ping;
mod port;
pub mod port_holder;
pub mod ports;
mod profile;
pub mod resolve;
pub mod tcp_connect;
mod time_sync;
mod tool_output;
mod torch_distributed;
mod user_processes;
pub mod xpu_smi;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use preflight_facts::Facts;
use preflight_ground::yaml::{self, Node, Segment, YamlError};
use preflight_result::Finding;

pub type ProbeFuture = Pin<Box<dyn Future<Output = Finding> + Send>>;

/// A configured check kind, ready to evaluate on this node.
pub trait Probe: Send + Sync + ParamsJson {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture;

    /// Kinds with `scope: cluster` are evaluated by rank 0 over every
    /// node's check-in instead of on the node.
    fn cluster(&self) -> Option<&dyn cluster::ClusterProbe> {
        None
    }

    /// Kinds evaluated over the collective stage's report (thresholds on
    /// its bandwidth), after the stage, by every rank alike.
    fn collective(&self) -> Option<&dyn collective_busbw::CollectiveProbe> {
        None
    }

    /// The check's timeout where the check sets none: for kinds whose
    /// run time their parameters decide (a DCGM diagnostic level).
    fn default_timeout(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether this check, of a node kind, must run on every rank as
    /// configured (torch's rendezvous over the job's own world, which
    /// needs every rank at once): its scope is then rank.
    fn every_rank(&self) -> bool {
        false
    }
}

/// The parameters as configured, for `explain` and `list --format json`:
/// every kind's parameters serialize, so no kind writes this itself.
pub trait ParamsJson {
    fn params(&self) -> serde_json::Value;
}

impl<T: Serialize> ParamsJson for T {
    fn params(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// One parameter, as `explain` documents it.
pub struct ParamDoc {
    pub name: &'static str,
    pub ty: &'static str,
    /// `None` when the parameter is required; `Some("unset")` when it is
    /// optional and has no default.
    pub default: Option<&'static str>,
    pub doc: &'static str,
}

/// Builds a kind's probe from a check's mapping and its kind-specific keys.
pub type ParseFn = fn(&Node, Vec<(&Node, &Node)>) -> Result<Arc<dyn Probe>, YamlError>;

/// Whose state a check examines, and so where and how often a job
/// evaluates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The node's: its hardware, drivers, firewall, ports, services. In a
    /// job whose node layout is known, its leader (local rank 0) evaluates
    /// it once and shares the finding with the node's other ranks.
    #[default]
    Node,
    /// Each rank's own: its environment and launch variables, its visible
    /// devices, masks and CPU bindings. Every rank evaluates it.
    Rank,
    /// Across the nodes: rank 0 compares every node's check-in.
    Cluster,
}

pub struct KindInfo {
    pub name: &'static str,
    /// Whose state it examines (`Scope`): every kind says.
    pub scope: Scope,
    /// Where results are grouped in the human report, unless a check says.
    pub area: &'static str,
    pub summary: &'static str,
    pub params: &'static [ParamDoc],
    /// Placeholders, besides the common ones, that this kind's hints may use.
    pub hint_vars: &'static [&'static str],
    pub parse: ParseFn,
}

pub const KINDS: &[&KindInfo] = &[
    &amd_smi::KIND,
    &command::KIND,
    &cpu::KIND,
    &dcgm_diag::KIND,
    &devices::KIND,
    &disk_free::KIND,
    &driver::KIND,
    &env::KIND,
    &env_lint::KIND,
    &file::KIND,
    &firewall::KIND,
    &gpu_bandwidth::KIND,
    &gpu_health::KIND,
    &gpu_memory_test::KIND,
    &hl_smi::KIND,
    &http::KIND,
    &infiniband::KIND,
    &interface::KIND,
    &kernel_param::KIND,
    &launch_env::KIND,
    &memory::KIND,
    &nvlink::KIND,
    &pcie_link::KIND,
    &ping::KIND,
    &port::KIND,
    &profile::KIND,
    &tcp_connect::KIND,
    &time_sync::KIND,
    &torch_distributed::KIND,
    &user_processes::KIND,
    &xpu_smi::KIND,
    &cluster::ADDRESSES,
    &cluster::CLOCK,
    &cluster::DEVICES,
    &cluster::ENV,
    &cluster::NODE_CHECKS,
    &cluster::REACHABILITY,
    &cluster::VERSIONS,
    &collective_busbw::KIND,
    &collective_backend::KIND,
];

pub fn lookup(name: &str) -> Option<&'static KindInfo> {
    KINDS.iter().copied().find(|k| k.name == name)
}

pub fn names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name).collect()
}

/// Parameters a kind checks beyond their types, once deserialized.
pub trait Params: DeserializeOwned + Serialize + Probe + 'static {
    /// What is wrong with the parameters together. A message that starts
    /// with a key in backticks ("`port` must be 1-65535") is reported at
    /// that key's value, with its path; any other at the check.
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The shared `parse` of every kind: deserialize, then validate.
pub fn parse_params<P: Params>(
    check: &Node,
    entries: Vec<(&Node, &Node)>,
) -> Result<Arc<dyn Probe>, YamlError> {
    let params: P = yaml::from_entries(check, entries.clone())?;
    params
        .validate()
        .map_err(|message| locate_validation(message, check, &entries))?;
    Ok(Arc::new(params))
}

fn locate_validation(message: String, check: &Node, entries: &[(&Node, &Node)]) -> YamlError {
    let key = message
        .strip_prefix('`')
        .and_then(|rest| rest.split_once('`'))
        .map(|(key, _)| key);
    let found = key.and_then(|key| {
        entries
            .iter()
            .find(|(k, _)| yaml::scalar_text(k).as_deref() == Some(key))
            .map(|(_, value)| (key.to_string(), *value))
    });
    match found {
        Some((key, value)) => YamlError::at(message, value).under(Segment::Key(key)),
        None => YamlError::at(message, check),
    }
}

/// Runs a probe that does blocking I/O off the async workers, so its
/// timeout still fires when a read hangs (a dead NFS mount, a stuck sysfs
/// attribute).
pub fn blocking(f: impl FnOnce() -> Finding + Send + 'static) -> ProbeFuture {
    Box::pin(async move {
        tokio::task::spawn_blocking(f)
            .await
            .unwrap_or_else(|e| Finding::error(format!("probe crashed: {e}")))
    })
}

/// What to report when the thing a check reads does not exist at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IfMissing {
    /// Could not evaluate: the verdict becomes incomplete.
    #[default]
    Error,
    Fail,
    Skip,
}

impl IfMissing {
    pub fn finding(self, what: String) -> Finding {
        match self {
            IfMissing::Error => Finding::error(what),
            IfMissing::Fail => Finding::fail(what),
            IfMissing::Skip => Finding::skip(what),
        }
    }
}

/// Whether an I/O error is an ordinary user's lack of a privilege (EACCES,
/// EPERM) rather than a fault of the node. As root the same error is the
/// node's (an NFS mount that maps root to nobody, a container without the
/// capability): the root health check must not pass over it.
pub fn is_denied(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied && !nix::unistd::geteuid().is_root()
}

/// A copy check's finding where the CUDA driver is not there to use:
/// nothing to copy on skips, a driver that fails is an error.
/// The bus ids of the GPUs a job's processes hold (NVML, or nvidia-smi):
/// a copy or memory check there would measure the job's leftovers and
/// take what is the job's.
pub fn busy_gpus(report: &preflight_facts::gpu_status::GpuReport) -> Vec<String> {
    report
        .gpus
        .iter()
        .filter(|g| !g.processes.is_empty())
        .map(|g| g.bus_id.clone())
        .collect()
}

pub fn no_driver(no: preflight_facts::cuda::NoDriver) -> Finding {
    match no {
        preflight_facts::cuda::NoDriver::Nothing(why) => Finding::skip(why),
        preflight_facts::cuda::NoDriver::Unusable(why) => Finding::error(why),
    }
}

/// What a probe reports when the user it runs as lacks a privilege it
/// needs: a skip naming the privilege, never an error. `preflight run`
/// and `srun ... preflight run` run as the job's user, and a healthy node
/// must not look incomplete to them; the node's health check runs as root
/// and reads what this user cannot.
pub fn needs_privilege(what: &str, privilege: &str) -> Finding {
    Finding::skip(format!(
        "{what} needs {privilege}; the node's root health check covers it"
    ))
}

/// Keeps secrets out of reports: values of variables that look like
/// credentials are shown by length only.
pub fn redact(name: &str, value: &str) -> String {
    let upper = name.to_ascii_uppercase();
    let secret = [
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "API_KEY",
        "PRIVATE_KEY",
    ]
    .iter()
    .any(|s| upper.contains(s));
    if secret {
        format!("<redacted, {} characters>", value.chars().count())
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind's scope decides how often a job evaluates it: the kinds
    /// that read a rank's own state are named here, so that a kind moves
    /// between node and rank only on purpose.
    #[test]
    fn every_kind_is_held_to_its_scope() {
        let of = |scope: Scope| -> Vec<&str> {
            let mut v: Vec<&str> = KINDS
                .iter()
                .filter(|k| k.scope == scope)
                .map(|k| k.name)
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            of(Scope::Rank),
            ["cpu", "devices", "env", "env_lint", "launch_env"]
        );
        // Rank 0 evaluates these over every node's check-in, or over the
        // collective stage's report that every rank shares.
        for kind in KINDS {
            assert_eq!(
                kind.name.starts_with("cluster_") || kind.name.starts_with("collective_"),
                kind.scope == Scope::Cluster,
                "{}",
                kind.name
            );
        }
    }

    #[test]
    fn kind_names_are_unique_and_documented() {
        let mut names = names();
        names.sort();
        let count = names.len();
        names.dedup();
        assert_eq!(names.len(), count);
        for kind in KINDS {
            assert!(!kind.summary.is_empty(), "{}", kind.name);
        }
    }

    #[test]
    fn secrets_are_redacted() {
        assert_eq!(redact("PREFLIGHT_TOKEN", "abc"), "<redacted, 3 characters>");
        assert_eq!(redact("NCCL_DEBUG", "INFO"), "INFO");
    }
}

/// A `vendor:` parameter: which accelerators a hardware check looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VendorParam {
    Nvidia,
    Amd,
    Intel,
    Habana,
}

impl VendorParam {
    pub fn vendor(self) -> preflight_facts::Vendor {
        use preflight_facts::Vendor;
        match self {
            VendorParam::Nvidia => Vendor::Nvidia,
            VendorParam::Amd => Vendor::Amd,
            VendorParam::Intel => Vendor::Intel,
            VendorParam::Habana => Vendor::Habana,
        }
    }
}

/// The vendors a hardware check covers: the one it names, else every
/// vendor present. `Err` is the skip reason when there is nothing to check.
pub fn vendors_to_check(
    facts: &Facts,
    wanted: Option<VendorParam>,
) -> Result<Vec<preflight_facts::Vendor>, Finding> {
    match wanted {
        Some(v) => Ok(vec![v.vendor()]),
        None => {
            let present = facts.accelerator_vendors();
            if present.is_empty() {
                Err(Finding::skip("no accelerator present"))
            } else {
                Ok(present)
            }
        }
    }
}

/// Whether an NVIDIA GPU is on the PCI bus, scanned off the async workers
/// (the first scan reads sysfs).
pub async fn nvidia_present(facts: &Arc<Facts>) -> bool {
    vendor_present(facts, preflight_facts::Vendor::Nvidia).await
}

/// Whether the node has an accelerator of this vendor on its PCI bus (read
/// off the runtime's threads: the first read walks sysfs).
pub async fn vendor_present(facts: &Arc<Facts>, vendor: preflight_facts::Vendor) -> bool {
    let facts = Arc::clone(facts);
    tokio::task::spawn_blocking(move || facts.accelerators().iter().any(|a| a.vendor == vendor))
        .await
        .unwrap_or(false)
}

/// Reports several problems as one finding: each names its device.
pub fn problems_finding(problems: &[String]) -> Finding {
    Finding::fail(problems.join("; "))
}

/// What a vendor tool's check found: problems fail; readings the tool
/// could not give (`N/A`, `Unknown`, a device it left out) beside a clean
/// result make a warning that names them, never a pass.
pub fn judged(
    problems: &[String],
    unjudged: &[String],
    measured: String,
    passed: impl FnOnce(&str) -> String,
) -> Finding {
    let finding = if !problems.is_empty() {
        let unchecked: Vec<&str> = unjudged.iter().map(String::as_str).collect();
        problems_and_unchecked(problems, &unchecked)
    } else if !unjudged.is_empty() {
        Finding::warn(format!(
            "{}; not judged: {}",
            passed(&measured),
            unjudged.join("; ")
        ))
    } else {
        Finding::pass(passed(&measured))
    };
    finding.measured(measured)
}

/// The most common value (the larger on a tie): what most devices of a
/// node have, where nothing says what they should.
pub fn most_common<T: Ord + Copy>(values: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: std::collections::BTreeMap<T, usize> = std::collections::BTreeMap::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(v, _)| v)
}

/// A parameter set with a subject it does not apply to: the located
/// configuration error (`validate`).
pub fn only_for(set: bool, name: &str, subjects: &str) -> Result<(), String> {
    if set {
        Err(format!("`{name}` applies to `subject: {subjects}` only"))
    } else {
        Ok(())
    }
}

/// As `problems_finding`, with the parts of the check that could not be
/// read named beside the problems, never in their place.
pub fn problems_and_unchecked(problems: &[String], unchecked: &[&str]) -> Finding {
    let mut message = problems.join("; ");
    if !unchecked.is_empty() {
        message = format!("{message}; not checked: {}", unchecked.join("; "));
    }
    Finding::fail(message)
}
