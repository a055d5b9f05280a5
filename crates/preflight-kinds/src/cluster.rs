//! Cross-node comparison, as checklist kinds with `scope: cluster`: rank 0
//! evaluates them over every node's check-in, so operators tune their
//! thresholds and severities in YAML like any other check.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ifname_spec::picks;
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use preflight_facts::Facts;
use preflight_ground::values::{Span, count, listed};
use preflight_result::cluster::{NodeView, Probe as ReachProbe};
use preflight_result::{Finding, Status};

/// What cluster kinds look at.
pub struct View<'a> {
    pub nodes: &'a [NodeView],
    pub probes: &'a [ReachProbe],
    pub findings: &'a [String],
    /// The nodes the reachability findings single out.
    pub unreachable: &'a [String],
    /// The nodes asked to probe: those whose results are not in
    /// `probes` answered after the probe window closed.
    pub asked_to_probe: usize,
}

pub trait ClusterProbe: Send + Sync {
    fn evaluate_cluster(&self, view: &View<'_>) -> Finding;
}

/// The skip reason a cluster check gets where it is not evaluated.
pub const NOT_HERE: &str = "scope: cluster: compared across nodes by rank 0 during `preflight run`";

fn local_skip() -> ProbeFuture {
    Box::pin(async { Finding::skip(NOT_HERE) })
}

/// Groups nodes by a value: value -> node names, largest group first.
fn groups(nodes: &[NodeView], value: impl Fn(&NodeView) -> String) -> Vec<(String, Vec<String>)> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in nodes {
        map.entry(value(n)).or_default().push(n.name.clone());
    }
    let mut list: Vec<(String, Vec<String>)> = map.into_iter().collect();
    list.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    list
}

/// The nodes outside the largest group, when that group is larger than
/// every other: with a tie nobody can say which side is wrong.
fn odd_ones(groups: &[(String, Vec<String>)]) -> Vec<String> {
    match groups {
        [first, rest @ ..] if rest.iter().all(|g| g.1.len() < first.1.len()) => {
            rest.iter().flat_map(|g| g.1.clone()).collect()
        }
        _ => Vec::new(),
    }
}

/// Nodes named one by one in a message; the rest are counted. The blame
/// list (`Finding::blame`) still names every node at fault.
const LISTED: usize = 8;

fn describe(what: &str, groups: &[(String, Vec<String>)]) -> String {
    let parts: Vec<String> = groups
        .iter()
        .map(|(v, nodes)| format!("{v} on {}", listed(nodes, ", ", LISTED)))
        .collect();
    let odd: Vec<String> = groups[1..].iter().flat_map(|g| g.1.clone()).collect();
    format!(
        "{what}: {} (odd: {})",
        listed(&parts, "; ", LISTED),
        listed(&odd, ", ", LISTED)
    )
}

macro_rules! cluster_kind {
    ($ty:ty) => {
        impl Probe for $ty {
            fn evaluate(self: Arc<Self>, _facts: Arc<Facts>) -> ProbeFuture {
                local_skip()
            }
            fn cluster(&self) -> Option<&dyn ClusterProbe> {
                Some(self)
            }
        }
    };
}

// ---- cluster_versions ------------------------------------------------------

pub const VERSIONS: KindInfo = KindInfo {
    name: "cluster_versions",
    scope: crate::Scope::Cluster,
    area: "cluster",
    summary: "Every node runs the same versions: tool, checklist, kernel, driver, CUDA, NCCL, oneCCL, libc. Groups nodes by value and names the odd ones.",
    params: &[ParamDoc {
        name: "fields",
        ty: "list of strings",
        default: Some("[tool, checklist, kernel, driver, cuda, nccl, oneccl, libc]"),
        doc: "Which versions must agree.",
    }],
    hint_vars: &[],
    parse: parse_params::<Versions>,
};

const VERSION_FIELDS: &[&str] = &[
    "tool",
    "checklist",
    "kernel",
    "driver",
    "cuda",
    "nccl",
    "oneccl",
    "libc",
];

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Versions {
    #[serde(default = "default_fields")]
    fields: Vec<String>,
}

fn default_fields() -> Vec<String> {
    VERSION_FIELDS.iter().map(|s| s.to_string()).collect()
}

impl Params for Versions {
    fn validate(&self) -> Result<(), String> {
        for f in &self.fields {
            if !VERSION_FIELDS.contains(&f.as_str()) {
                return Err(format!(
                    "unknown version field `{f}`; valid: {}",
                    VERSION_FIELDS.join(", ")
                ));
            }
        }
        Ok(())
    }
}
cluster_kind!(Versions);

impl ClusterProbe for Versions {
    fn evaluate_cluster(&self, view: &View<'_>) -> Finding {
        let mut differences = Vec::new();
        let mut odd = Vec::new();
        for field in &self.fields {
            let g = groups(view.nodes, |n| match field.as_str() {
                "tool" => n.tool_version.clone(),
                "checklist" => n.checklist_hash.clone(),
                other => n
                    .versions
                    .get(other)
                    .cloned()
                    .unwrap_or_else(|| "not found".into()),
            });
            if g.len() > 1 {
                differences.push(describe(field, &g));
                odd.extend(odd_ones(&g));
            }
        }
        if differences.is_empty() {
            Finding::pass(format!(
                "{} agree on {}",
                count(self.fields.len(), "version"),
                count(view.nodes.len(), "node")
            ))
        } else {
            Finding::fail(listed(&differences, "; ", LISTED)).blame(distinct(odd))
        }
    }
}

// ---- cluster_env -----------------------------------------------------------

pub const ENV: KindInfo = KindInfo {
    name: "cluster_env",
    scope: crate::Scope::Cluster,
    area: "cluster",
    summary: "Every node's launch variables (NCCL_*, GLOO_*, CCL_*, MASTER_*, ...) have the same values; names the differing variables and nodes.",
    params: &[
        ParamDoc {
            name: "prefixes",
            ty: "list of strings",
            default: Some(
                "[NCCL_, GLOO_, CCL_, MASTER_, TORCH_, FI_, UCX_, I_MPI_, OMPI_MCA_, PYTORCH_, RCCL_, HCCL_]",
            ),
            doc: "Variables with these prefixes are compared.",
        },
        ParamDoc {
            name: "ignore",
            ty: "list of strings",
            default: Some("[]"),
            doc: "Variables that may differ (e.g. NCCL_DEBUG_FILE).",
        },
    ],
    hint_vars: &[],
    parse: parse_params::<EnvSame>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSame {
    #[serde(default = "default_prefixes")]
    prefixes: Vec<String>,
    #[serde(default)]
    ignore: Vec<String>,
}

fn default_prefixes() -> Vec<String> {
    LAUNCH_PREFIXES.iter().map(|s| s.to_string()).collect()
}

impl Params for EnvSame {}
cluster_kind!(EnvSame);

impl ClusterProbe for EnvSame {
    fn evaluate_cluster(&self, view: &View<'_>) -> Finding {
        let mut names: Vec<&String> = view
            .nodes
            .iter()
            .flat_map(|n| n.env.keys())
            .filter(|k| self.prefixes.iter().any(|p| k.starts_with(p.as_str())))
            .filter(|k| !self.ignore.contains(k))
            .collect();
        names.sort();
        names.dedup();
        let mut differences = Vec::new();
        let mut differing: Vec<&str> = Vec::new();
        let mut odd = Vec::new();
        for name in &names {
            let g = groups(view.nodes, |n| {
                n.env
                    .get(*name)
                    .map(|v| format!("{name}={v}"))
                    .unwrap_or_else(|| format!("{name} unset"))
            });
            if g.len() > 1 {
                differing.push(name.as_str());
                differences.push(describe(name, &g));
                odd.extend(odd_ones(&g));
            }
        }
        if differences.is_empty() {
            Finding::pass(format!(
                "{} agree on {}",
                count(names.len(), "launch variable"),
                count(view.nodes.len(), "node")
            ))
        } else {
            Finding::fail(listed(&differences, "; ", LISTED))
                .measured(format!("{} variables differ", differences.len()))
                .blame(distinct(odd))
                .about_variables(differing)
        }
    }
}

// ---- cluster_devices -------------------------------------------------------

pub const DEVICES: KindInfo = KindInfo {
    name: "cluster_devices",
    scope: crate::Scope::Cluster,
    area: "cluster",
    summary: "Every node has the same number of accelerators.",
    params: &[],
    hint_vars: &[],
    parse: parse_params::<DevicesSame>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesSame {}

impl Params for DevicesSame {}
cluster_kind!(DevicesSame);

impl ClusterProbe for DevicesSame {
    fn evaluate_cluster(&self, view: &View<'_>) -> Finding {
        let g = groups(view.nodes, |n| {
            preflight_ground::values::count(n.devices.count, "device")
        });
        if g.len() > 1 {
            Finding::fail(describe("device count", &g)).blame(odd_ones(&g))
        } else {
            Finding::pass(format!(
                "{} on each of {}",
                g.first().map(|x| x.0.as_str()).unwrap_or("0 devices"),
                count(view.nodes.len(), "node")
            ))
        }
    }
}

// ---- cluster_clock ---------------------------------------------------------

pub const CLOCK: KindInfo = KindInfo {
    name: "cluster_clock",
    scope: crate::Scope::Cluster,
    area: "cluster",
    summary: "Every node's clock is within a threshold of rank 0's, measured NTP-style over the rendezvous connection (offset ± RTT/2).",
    params: &[ParamDoc {
        name: "max_offset",
        ty: "duration",
        default: Some("100ms"),
        doc: "Fail when a node's offset is certainly larger: |offset| - RTT/2 > max_offset.",
    }],
    hint_vars: &[],
    parse: parse_params::<ClockSame>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClockSame {
    #[serde(default = "default_offset")]
    max_offset: Span,
}

fn default_offset() -> Span {
    Span(Duration::from_millis(100))
}

impl Params for ClockSame {}
cluster_kind!(ClockSame);

impl ClusterProbe for ClockSame {
    fn evaluate_cluster(&self, view: &View<'_>) -> Finding {
        let limit = self.max_offset.0.as_secs_f64() * 1000.0;
        let mut bad = Vec::new();
        let mut off = Vec::new();
        let mut worst: f64 = 0.0;
        let mut unmeasured = Vec::new();
        for n in view.nodes {
            let Some(c) = n.clock else {
                unmeasured.push(n.name.clone());
                continue;
            };
            worst = worst.max(c.offset_ms.abs());
            if c.offset_ms.abs() - c.rtt_ms / 2.0 > limit {
                off.push(n.name.clone());
                bad.push(format!(
                    "{} is {:+.1} ms ± {:.1} ms from rank 0's clock",
                    n.name,
                    c.offset_ms,
                    c.rtt_ms / 2.0
                ));
            }
        }
        let expected = format!("within {limit:.0} ms");
        if !bad.is_empty() {
            // Offsets are from rank 0's clock: when most nodes are off, it
            // may be rank 0's that is wrong, and nobody is singled out.
            let blamed = if off.len() * 2 < view.nodes.len() {
                off
            } else {
                Vec::new()
            };
            Finding::fail(listed(&bad, "; ", LISTED))
                .measured(format!("{worst:.1} ms"))
                .expected(expected)
                .blame(blamed)
        } else if !unmeasured.is_empty() {
            Finding::error(format!(
                "no clock sample from {}",
                listed(&unmeasured, ", ", LISTED)
            ))
        } else {
            Finding::pass(format!("largest offset {worst:.1} ms"))
                .measured(format!("{worst:.1} ms"))
                .expected(expected)
        }
    }
}

// ---- cluster_node_checks ---------------------------------------------------

pub const NODE_CHECKS: KindInfo = KindInfo {
    name: "cluster_node_checks",
    scope: crate::Scope::Cluster,
    area: "cluster",
    summary: "No node's own checklist failed: any node's failed local checks make the cluster not ready, listed by node.",
    params: &[],
    hint_vars: &["remedy"],
    parse: parse_params::<NodeChecks>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeChecks {}

impl Params for NodeChecks {}
cluster_kind!(NodeChecks);

impl ClusterProbe for NodeChecks {
    fn evaluate_cluster(&self, view: &View<'_>) -> Finding {
        let mut failed = Vec::new();
        let mut incomplete = Vec::new();
        let mut at_fault = Vec::new();
        // Only the job's own settings failed: fix the job, drain nothing.
        let mut job_settings_only = true;
        let mut restated: Vec<String> = Vec::new();
        for n in view.nodes {
            let list: Vec<String> = n
                .failed
                .iter()
                .filter(|f| f.status != Status::Warn)
                .map(|f| format!("{} ({}: {})", f.id, f.status.name(), f.message))
                .collect();
            if matches!(n.local_verdict.as_str(), "not_ready" | "incomplete") {
                restated.extend(
                    n.failed
                        .iter()
                        .filter(|f| f.status != Status::Warn)
                        .map(|f| f.id.clone()),
                );
            }
            match n.local_verdict.as_str() {
                "not_ready" => {
                    job_settings_only &= n
                        .failed
                        .iter()
                        .filter(|f| f.status == Status::Fail)
                        .all(|f| preflight_result::cause::is_job_setting(&f.area));
                    at_fault.push(n.name.clone());
                    failed.push(format!("{}: {}", n.name, list.join(", ")))
                }
                "incomplete" => incomplete.push(format!("{}: {}", n.name, list.join(", "))),
                _ => {}
            }
        }
        if !failed.is_empty() {
            failed.extend(incomplete);
            let finding = Finding::fail(listed(&failed, "; ", LISTED)).restating(restated);
            if job_settings_only {
                finding.var(
                    "remedy",
                    "Fix the job's settings named (the job's, not the nodes': no node needs draining)",
                )
            } else {
                finding
                    .blame(at_fault)
                    .var("remedy", "Fix or drain the named nodes")
            }
        } else if !incomplete.is_empty() {
            Finding::error(listed(&incomplete, "; ", LISTED)).restating(restated)
        } else {
            Finding::pass(format!(
                "every node's checklist passed ({})",
                count(view.nodes.len(), "node")
            ))
        }
    }
}

// ---- cluster_reachability --------------------------------------------------

pub const REACHABILITY: KindInfo = KindInfo {
    name: "cluster_reachability",
    scope: crate::Scope::Cluster,
    area: "cluster",
    summary: "Every node reaches every other node's probe listener (TCP connect and echo); names the node whose firewall drops or rejects.",
    params: &[],
    hint_vars: &[],
    parse: parse_params::<Reach>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Reach {}

impl Params for Reach {}
cluster_kind!(Reach);

impl ClusterProbe for Reach {
    fn evaluate_cluster(&self, view: &View<'_>) -> Finding {
        if view.nodes.len() < 2 {
            return Finding::pass("one node: no peers to probe");
        }
        let bad = view.probes.iter().filter(|p| p.status != "ok").count();
        let worst = view
            .probes
            .iter()
            .filter_map(|p| p.rtt_ms)
            .fold(0.0f64, f64::max);
        // A node whose results came after the window was still probed by
        // its peers: its outgoing paths are the ones left unchecked.
        let mut reported: Vec<usize> = view.probes.iter().map(|p| p.from).collect();
        reported.sort_unstable();
        reported.dedup();
        let late = view.asked_to_probe.saturating_sub(reported.len());
        let coverage = if late > 0 {
            format!(
                "; {late} of {} nodes sent their results after the probe window (their own outgoing paths unchecked, their incoming ones probed by their peers)",
                view.asked_to_probe
            )
        } else {
            String::new()
        };
        if bad == 0 && !view.probes.is_empty() {
            Finding::pass(format!(
                "{} probes ok, slowest {worst:.1} ms{coverage}",
                view.probes.len()
            ))
        } else if view.probes.is_empty() {
            Finding::error("no probe results arrived before the deadline")
        } else if view
            .probes
            .iter()
            .all(|p| p.status == "ok" || p.status == preflight_result::cluster::NO_ANSWER)
        {
            // Every connection was accepted: the network and the firewalls
            // let it through; a rank that does not answer is a process
            // stopped or starved, which the collective stage then meets.
            Finding::warn(listed(view.findings, "; ", LISTED)).measured(format!(
                "{bad} of {} probes connected but got no echo",
                view.probes.len()
            ))
        } else {
            Finding::fail(listed(view.findings, "; ", LISTED))
                .measured(format!("{bad} of {} probes failed", view.probes.len()))
                .blame(view.unreachable.to_vec())
        }
    }
}

// ---- cluster_addresses -----------------------------------------------------

pub const ADDRESSES: KindInfo = KindInfo {
    name: "cluster_addresses",
    scope: crate::Scope::Cluster,
    area: "cluster",
    summary: "Each node's hostname resolves to an address its peers can reach (not loopback), and NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, when set, select the interface the peers are reached on.",
    params: &[],
    hint_vars: &["suggest"],
    parse: parse_params::<Addresses>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Addresses {}

impl Params for Addresses {}
cluster_kind!(Addresses);

impl ClusterProbe for Addresses {
    fn evaluate_cluster(&self, view: &View<'_>) -> Finding {
        let multi = view.nodes.len() > 1;
        let mut problems = Vec::new();
        let mut notes = Vec::new();
        let mut at_fault = Vec::new();
        // The variables that would fix the first node at fault, from the
        // interface its peers reach it on.
        let mut suggest: Option<String> = None;
        let mut loopback_names: Vec<String> = Vec::new();
        let mut variables: Vec<&str> = Vec::new();
        for n in view.nodes {
            let before = problems.len();
            let loopback = !n.hostname_addrs.is_empty()
                && n.hostname_addrs.iter().all(|a| {
                    a.parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
                });
            // Gloo advertises the address the hostname resolves to unless
            // GLOO_SOCKET_IFNAME names an interface; NCCL picks interfaces
            // itself, so only the former matters here.
            if multi && loopback && !n.env.contains_key("GLOO_SOCKET_IFNAME") {
                let fix = n
                    .interface
                    .as_ref()
                    .map(|i| {
                        format!(" (GLOO_SOCKET_IFNAME={i}, the interface its peers reach it on)")
                    })
                    .unwrap_or_default();
                problems.push(format!(
                    "{}: hostname `{}` resolves to {} (loopback) and GLOO_SOCKET_IFNAME is unset{fix}: Gloo advertises that address and peers on other nodes connect to themselves",
                    n.name,
                    n.hostname,
                    n.hostname_addrs.join(", ")
                ));
                loopback_names.push(n.hostname.clone());
            }
            let Some(iface) = &n.interface else {
                if problems.len() > before {
                    at_fault.push(n.name.clone());
                }
                continue;
            };
            let nccl = match n.env.get("NCCL_SOCKET_IFNAME") {
                Some(sel) if picks("NCCL_SOCKET_IFNAME", sel, iface) => {
                    format!("NCCL_SOCKET_IFNAME={sel} picks it")
                }
                Some(sel) => format!("NCCL_SOCKET_IFNAME={sel} does not pick it"),
                None => "NCCL_SOCKET_IFNAME unset".to_string(),
            };
            let gloo = match n.env.get("GLOO_SOCKET_IFNAME") {
                Some(sel) if picks("GLOO_SOCKET_IFNAME", sel, iface) => {
                    format!("GLOO_SOCKET_IFNAME={sel} picks it")
                }
                Some(sel) => format!("GLOO_SOCKET_IFNAME={sel} does not pick it"),
                None => "GLOO_SOCKET_IFNAME unset".to_string(),
            };
            notes.push(format!("{} via {iface} ({nccl}, {gloo})", n.name));
            if let Some(sel) = n.env.get("NCCL_SOCKET_IFNAME")
                && multi
                && !picks("NCCL_SOCKET_IFNAME", sel, iface)
            {
                problems.push(format!(
                    "{}: NCCL_SOCKET_IFNAME={sel} would not pick {iface}, the interface its peers reach it on",
                    n.name
                ));
                variables.push("NCCL_SOCKET_IFNAME");
            }
            if let Some(sel) = n.env.get("GLOO_SOCKET_IFNAME")
                && multi
                && !picks("GLOO_SOCKET_IFNAME", sel, iface)
            {
                problems.push(format!(
                    "{}: GLOO_SOCKET_IFNAME={sel} would not pick {iface}, the interface its peers reach it on",
                    n.name
                ));
                variables.push("GLOO_SOCKET_IFNAME");
            }
            if problems.len() > before {
                at_fault.push(n.name.clone());
                if suggest.is_none() {
                    suggest = Some(format!(
                        "GLOO_SOCKET_IFNAME={iface} and NCCL_SOCKET_IFNAME={iface} on {}",
                        n.name
                    ));
                }
            }
        }
        if problems.is_empty() {
            Finding::pass(if notes.is_empty() {
                "addresses usable".to_string()
            } else {
                listed(&notes, ", ", LISTED)
            })
        } else {
            let mut finding = Finding::fail(listed(&problems, "; ", LISTED))
                .blame(at_fault)
                .var("suggest", suggest.unwrap_or_else(|| "unknown".into()))
                .about_variables(variables);
            for name in loopback_names {
                finding = finding.loopback_hostname(name);
            }
            finding
        }
    }
}

/// Each name once, in first-seen order.
fn distinct(names: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

/// Variables whose values must agree across the job: launcher, rendezvous
/// and collective-library settings.
pub const LAUNCH_PREFIXES: &[&str] = &[
    "NCCL_",
    "GLOO_",
    "CCL_",
    "MASTER_",
    "TORCH_",
    "FI_",
    "UCX_",
    "I_MPI_",
    "OMPI_MCA_",
    "PYTORCH_",
    "RCCL_",
    "HCCL_",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, nccl: &str, tool: &str, offset: f64) -> NodeView {
        NodeView {
            seen_from: None,
            name: name.into(),
            hostname: name.into(),
            addr: "10.0.0.1".into(),
            ranks: vec![0],
            tool_version: tool.into(),
            checklist_hash: "h".into(),
            versions: [("nccl".to_string(), nccl.to_string())].into(),
            env: [("NCCL_IB_HCA".to_string(), nccl.to_string())].into(),
            devices: Default::default(),
            clock: Some(preflight_result::cluster::Clock {
                offset_ms: offset,
                rtt_ms: 0.4,
            }),
            interface: Some("eth0".into()),
            probe_addr: None,
            hostname_addrs: vec!["10.0.0.1".into()],
            local_verdict: "ready".into(),
            failed: Vec::new(),
        }
    }

    fn eval(probe: &dyn ClusterProbe, nodes: &[NodeView]) -> Finding {
        probe.evaluate_cluster(&View {
            nodes,
            probes: &[],
            findings: &[],
            unreachable: &[],
            asked_to_probe: 0,
        })
    }

    /// Nodes whose probe results came after the window are counted, not
    /// passed over: the pass says whose outgoing paths went unchecked.
    #[test]
    fn late_probe_results_are_said() {
        let nodes = [
            node("a", "2.18", "1", 0.0),
            node("b", "2.18", "1", 0.0),
            node("c", "2.18", "1", 0.0),
        ];
        let probes: Vec<ReachProbe> = [(0, 1), (1, 0), (0, 2), (1, 2)]
            .into_iter()
            .map(|(from, to)| ReachProbe {
                from,
                to,
                status: "ok".into(),
                rtt_ms: Some(0.2),
                detail: None,
            })
            .collect();
        let view = |asked_to_probe| View {
            nodes: &nodes,
            probes: &probes,
            findings: &[],
            unreachable: &[],
            asked_to_probe,
        };
        let f = Reach {}.evaluate_cluster(&view(3));
        assert_eq!(f.status, Status::Pass);
        assert!(
            f.message
                .ends_with("; 1 of 3 nodes sent their results after the probe window (their own outgoing paths unchecked, their incoming ones probed by their peers)"),
            "{}",
            f.message
        );
        let f = Reach {}.evaluate_cluster(&view(2));
        assert_eq!(f.message, "4 probes ok, slowest 0.2 ms");
    }

    #[test]
    fn odd_nodes_are_named_by_value() {
        let nodes = [
            node("a", "2.18", "1", 0.0),
            node("b", "2.19", "1", 3.0),
            node("c", "2.18", "2", -250.0),
        ];
        let v = eval(
            &Versions {
                fields: default_fields(),
            },
            &nodes,
        );
        assert_eq!(v.status, Status::Fail);
        assert!(
            v.message.contains("nccl: 2.18 on a, c; 2.19 on b (odd: b)"),
            "{}",
            v.message
        );
        assert!(
            v.message.contains("tool: 1 on a, b; 2 on c (odd: c)"),
            "{}",
            v.message
        );
        // Each odd node once, in field order: the minority of each field.
        assert_eq!(*v.blames, ["c", "b"]);
        let e = eval(
            &EnvSame {
                prefixes: default_prefixes(),
                ignore: Vec::new(),
            },
            &nodes,
        );
        assert!(e.message.contains("NCCL_IB_HCA=2.19 on b"), "{}", e.message);
        assert_eq!(*e.blames, ["b"]);
        let ignored = EnvSame {
            prefixes: default_prefixes(),
            ignore: vec!["NCCL_IB_HCA".into()],
        };
        assert_eq!(eval(&ignored, &nodes).status, Status::Pass);
        let c = eval(
            &ClockSame {
                max_offset: default_offset(),
            },
            &nodes,
        );
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.message.contains("c is -250.0 ms") && !c.message.contains("b is"),
            "{}",
            c.message
        );
        assert_eq!(*c.blames, ["c"]);
    }

    #[test]
    fn a_tie_singles_out_nobody() {
        let nodes = [node("a", "2.18", "1", 0.0), node("b", "2.19", "1", 0.0)];
        let v = eval(
            &Versions {
                fields: default_fields(),
            },
            &nodes,
        );
        assert_eq!(v.status, Status::Fail);
        assert!(v.blames.is_empty(), "{:?}", v.blames);
        // Rank 0's node is the clock reference: with most nodes off, it may
        // be the wrong one.
        let off = [
            node("a", "2.18", "1", 0.0),
            node("b", "2.18", "1", 400.0),
            node("c", "2.18", "1", 410.0),
        ];
        let c = eval(
            &ClockSame {
                max_offset: default_offset(),
            },
            &off,
        );
        assert_eq!(c.status, Status::Fail);
        assert!(c.blames.is_empty(), "{:?}", c.blames);
    }

    #[test]
    fn interface_selectors_that_miss_the_peers_interface_are_named() {
        let mut a = node("a", "2.18", "1", 0.0);
        let mut b = node("b", "2.18", "1", 0.0);
        a.env.insert("NCCL_SOCKET_IFNAME".into(), "ib".into());
        b.env.insert("NCCL_SOCKET_IFNAME".into(), "eth".into());
        b.env.insert("GLOO_SOCKET_IFNAME".into(), "eth1".into());
        let f = eval(&Addresses {}, &[a.clone(), b]);
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.message
                .contains("a: NCCL_SOCKET_IFNAME=ib would not pick eth0"),
            "{}",
            f.message
        );
        assert!(
            f.message
                .contains("b: GLOO_SOCKET_IFNAME=eth1 would not pick eth0"),
            "{}",
            f.message
        );
        assert!(!f.message.contains("b: NCCL"), "{}", f.message);
        assert_eq!(*f.blames, ["a", "b"]);
        // One node: nothing to reach, nothing to fail.
        assert_eq!(eval(&Addresses {}, &[a]).status, Status::Pass);
    }
}
