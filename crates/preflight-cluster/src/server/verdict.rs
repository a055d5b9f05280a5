//! Rank 0's verdict: every node's view from the check-ins, the cluster
//! checks over it, the reachability matrix, and the one report every rank
//! leaves with.

use std::collections::HashMap;
use std::time::Duration;

use super::ServerConfig;
use crate::barrier::{self, BarrierState};
use crate::checkin::CheckIn;
use crate::reachability;
use preflight_ground::values::format_duration;
use preflight_kinds::cluster::View;
use preflight_result::cluster::{ClusterReport, Culprit, FailedCheck, Matrix, NodeView, Probe};
use preflight_result::report::Interrupted;
use preflight_result::{CheckResult, Status, Verdict};

/// The nodes whose representative opened no probe listener, with why.
pub(super) fn deaf_nodes(state: &BarrierState, nodes: &[(NodeView, u32)]) -> Vec<(usize, String)> {
    nodes
        .iter()
        .enumerate()
        .filter_map(|(j, (_, rep))| {
            let c = &state.arrivals.get(rep)?.1;
            if c.probe_addr.is_some() {
                return None;
            }
            Some((
                j,
                c.probe_error
                    .clone()
                    .unwrap_or_else(|| "no probe listener".into()),
            ))
        })
        .collect()
}

/// Nodes in order of their lowest rank, with the rank that probes for the
/// node: the lowest one that has a probe listener (local ranks share a
/// probe port range, so the lowest may have found it taken by another).
pub(super) fn build_nodes(state: &BarrierState) -> Vec<(NodeView, u32)> {
    let mut order: Vec<(String, String)> = Vec::new();
    let mut members: HashMap<(String, String), Vec<&CheckIn>> = HashMap::new();
    for (_, c) in state.arrivals.values() {
        let key = (c.hostname.clone(), c.addr.clone());
        if !members.contains_key(&key) {
            order.push(key.clone());
        }
        members.entry(key).or_default().push(c);
    }
    let unique_hostnames = {
        let mut h: Vec<&String> = order.iter().map(|k| &k.0).collect();
        h.sort();
        h.dedup();
        h.len() == order.len()
    };
    order
        .into_iter()
        .map(|key| {
            let list = &members[&key];
            let first = list[0];
            let mut failed = Vec::new();
            for c in list {
                for f in &c.failed {
                    if !failed.iter().any(|x: &FailedCheck| x.id == f.id) {
                        failed.push(f.clone());
                    }
                }
            }
            let worst = |v: &str| match v {
                "not_ready" => 2,
                "incomplete" => 1,
                _ => 0,
            };
            let local_verdict = list
                .iter()
                .map(|c| c.local_verdict.as_str())
                .max_by_key(|v| worst(v))
                .unwrap_or("ready")
                .to_string();
            let prober = list
                .iter()
                .find(|c| c.probe_addr.is_some())
                .unwrap_or(&first);
            let view = NodeView {
                seen_from: first.seen_from.clone().filter(|seen| *seen != key.1),
                name: if unique_hostnames {
                    key.0.clone()
                } else {
                    key.1.clone()
                },
                hostname: key.0.clone(),
                addr: key.1.clone(),
                ranks: list.iter().map(|c| c.identity.rank).collect(),
                tool_version: first.tool_version.clone(),
                checklist_hash: first.checklist_hash.clone(),
                versions: first.versions.clone(),
                env: first.env.clone(),
                devices: first.devices.clone(),
                clock: first.clock,
                interface: first.interface.clone(),
                probe_addr: prober.probe_addr.clone(),
                hostname_addrs: first.hostname_addrs.clone(),
                local_verdict,
                failed,
            };
            (view, prober.identity.rank)
        })
        .collect()
}

/// What the reachability round brought: the probe results, the nodes that
/// could not be probed (with why), and how many nodes were asked to probe.
pub(super) struct Round<'a> {
    pub probes: Vec<Probe>,
    pub deaf: &'a [(usize, String)],
    pub asked_to_probe: usize,
}

pub(super) fn assemble(
    cfg: &ServerConfig,
    state: &BarrierState,
    nodes: Vec<(NodeView, u32)>,
    round: Round<'_>,
    waited: Duration,
    interrupted: Option<Interrupted>,
) -> ClusterReport {
    let Round {
        probes,
        deaf,
        asked_to_probe,
    } = round;
    // A node that probes from outside its range says why (a stranger
    // holding the range), as a warning: the probes still ran.
    let moved: Vec<String> = nodes
        .iter()
        .filter_map(|(v, rep)| {
            let c = &state.arrivals.get(rep)?.1;
            c.probe_addr.as_ref()?;
            Some(format!("{}: {}", v.name, c.probe_error.as_ref()?))
        })
        .collect();
    let nodes: Vec<NodeView> = nodes.into_iter().map(|(v, _)| v).collect();
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    // Probe results are a peer's input: indices outside the plan are
    // dropped, and a pair reported twice counts once.
    let n = nodes.len();
    let mut probes = probes;
    probes.retain(|p| p.from < n && p.to < n && p.from != p.to);
    probes.sort_by_key(|p| (p.from, p.to));
    probes.dedup_by_key(|p| (p.from, p.to));
    let mut singled: Vec<(Option<usize>, String)> = deaf
        .iter()
        .map(|(j, why)| (Some(*j), format!("{}: {why}", names[*j])))
        .collect();
    let heard: Vec<Probe> = probes
        .iter()
        .filter(|p| !deaf.iter().any(|(j, _)| *j == p.to))
        .cloned()
        .collect();
    if heard.iter().any(|p| p.status != "ok") {
        // A node's own firewall check that found a blocking rule is
        // evidence against it; by kind, not by message.
        let own_fault: Vec<bool> = nodes
            .iter()
            .map(|n| {
                n.failed
                    .iter()
                    .any(|f| f.kind == "firewall" && f.status == Status::Fail)
            })
            .collect();
        singled.extend(reachability::culprits(
            nodes.len(),
            &heard,
            &names,
            &own_fault,
        ));
    }
    let findings: Vec<String> = singled.iter().map(|(_, f)| f.clone()).collect();
    let mut unreachable: Vec<String> = Vec::new();
    for j in singled.iter().filter_map(|(j, _)| *j) {
        if !unreachable.contains(&names[j]) {
            unreachable.push(names[j].clone());
        }
    }
    let barrier = state.summary(waited.as_millis() as u64);
    let window = match &interrupted {
        Some(i) => format!(
            "before {} was interrupted by {}, {} after it started",
            i.rank
                .map_or("the rendezvous server".into(), |r| format!("rank {r}")),
            i.signal,
            format_duration(waited)
        ),
        None => format!("within {}", format_duration(cfg.timeout)),
    };
    let mut barrier_result = barrier::result(&barrier, cfg.world_size, &window);
    if interrupted.is_some() && barrier_result.status == Status::Fail {
        // The barrier did not run its course: nothing says these ranks
        // would not have come.
        barrier_result.status = Status::Error;
    }
    if let Some((name, bound)) = &cfg.bound
        && bound.ip().is_loopback()
        && !barrier.missing.is_empty()
        && cfg.placement.local_world_size < cfg.world_size
    {
        barrier_result.message.push_str(&format!(
            "; rank 0 serves on {bound}, a loopback address, because `{name}` resolves to it there: ranks on other nodes cannot reach it"
        ));
    }
    let mut checks = vec![barrier_result];
    let view = View {
        nodes: &nodes,
        probes: &probes,
        findings: &findings,
        unreachable: &unreachable,
        asked_to_probe,
    };
    let evaluated = preflight_checklist::evaluate_cluster(&cfg.checks, &view, &cfg.facts);
    let mut culprits = culprits(&nodes, &evaluated, cfg.strict);
    blame_lost(&mut culprits, &barrier.lost);
    checks.extend(evaluated.into_iter().map(|(c, _)| c));
    let mut warnings: Vec<String> = all_interfaces_warning(cfg.bound.as_ref())
        .into_iter()
        .chain(cfg.notes.iter().cloned())
        .chain(moved)
        .collect();
    // On loopback every user of the host reaches the rendezvous, so a
    // one-node job needs a secret as much as one across nodes (node mode
    // makes its own; a launcher's ranks need one given).
    let master_ip = cfg.master.rsplit_once(':').and_then(|(host, _)| {
        host.trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .ok()
    });
    let loopback_only = match &cfg.bound {
        Some((_, addr)) => addr.ip().is_loopback(),
        None => master_ip.is_some_and(|ip| ip.is_loopback()),
    } && nodes.len() <= 1;
    let who = if loopback_only {
        "any user of this host (the rendezvous is on loopback)"
    } else {
        "any preflight that reaches this port"
    };
    if cfg.token.is_none() {
        warnings.push(format!(
            "no job token (PREFLIGHT_TOKEN, SLURM_JOB_ID and TORCHELASTIC_RUN_ID are unset): {who} can check in as one of this job's ranks; set PREFLIGHT_TOKEN or PREFLIGHT_TOKEN_FILE to a secret (`preflight token` prints one; node mode makes its own for a one-node job)"
        ));
    } else if !cfg.token.is_secret() {
        warnings.push(format!(
            "the job token is derived from {}, which any user of the cluster can read (squeue, ps): it keeps apart jobs that share a port by accident, not a stranger on purpose, and {who} can check in as one of this job's ranks; set PREFLIGHT_TOKEN or PREFLIGHT_TOKEN_FILE to a secret (`preflight token` prints one), and --require-secret refuses a job without one",
            cfg.token.source
        ));
    }

    if !barrier.other_job_clients.is_empty() {
        let (what, verb) = match barrier.other_job_total {
            1 => ("a preflight".to_string(), "was rejected: it is"),
            n => (
                format!("{n} connections of preflights"),
                "were rejected: they are",
            ),
        };
        let more = if barrier.other_job_clients.len() >= barrier::LISTED_SOURCES {
            ", ..."
        } else {
            ""
        };
        warnings.push(format!(
            "{what} of another job (another token) connected from {}{more} and {verb} using this job's master port {}",
            barrier.other_job_clients.join(", "),
            cfg.master
        ));
    }
    for n in nodes.iter() {
        if let Some(seen) = &n.seen_from {
            warnings.push(format!(
                "{} says its address is {} but its connection came from {seen}: a NAT between it and rank 0, or a peer that is not what it says (the reachability probes go to the address it claims)",
                n.name, n.addr
            ));
        }
    }
    if !barrier.dropped.is_empty() {
        warnings.push(format!(
            "dropped {} that were not this job's preflight: {}{}",
            preflight_ground::values::count(barrier.dropped_total, "connection"),
            barrier.dropped.join("; "),
            if barrier.dropped_total > barrier.dropped.len() {
                "; ..."
            } else {
                ""
            }
        ));
    }
    warnings.extend(open_files_warning(
        state.accept_failures,
        state.accept_error.as_deref(),
        cfg.world_size,
        preflight_facts::limits::open_files(),
    ));
    // Every node's own verdict counts whether or not `cluster.node_checks`
    // was selected: a node whose checklist failed is not ready, and the
    // cluster with it.
    let mut verdict = nodes
        .iter()
        .map(|n| Verdict::from_name(&n.local_verdict))
        .fold(Verdict::of(&checks, cfg.strict), Verdict::worst);
    if interrupted.is_some() {
        // A run that was stopped says nothing either way, and blames
        // nobody.
        verdict = Verdict::Incomplete;
        culprits.clear();
    }
    let mode = if nodes.len() > reachability::ALL_PAIRS_MAX {
        "ring + hypercube"
    } else {
        "all pairs"
    };
    ClusterReport {
        verdict,
        exit_code: verdict.exit_code().code(),
        world_size: cfg.world_size,
        master: cfg.master.clone(),
        token: cfg.token.describe(),
        duration_ms: cfg.started.elapsed().as_millis() as u64,
        reachability: Matrix {
            mode: mode.into(),
            nodes: names,
            probes,
            findings,
        },
        culprits,
        node_count: nodes.len(),
        full_report: None,
        nodes,
        barrier,
        checks,
        warnings,
        interrupted,
        collective: None,
        phases: None,
    }
}

/// Rank 0 serving on every interface because the master's address is not
/// one of this host's: said, since any network that reaches the host then
/// reaches the rendezvous.
fn all_interfaces_warning(bound: Option<&(String, std::net::SocketAddr)>) -> Option<String> {
    let (name, at) = bound?;
    at.ip().is_unspecified().then(|| {
        format!(
            "rank 0 listens on every interface ({at}): `{name}` is not an address of this host (a NAT or a virtual IP in front of it?), so any network that reaches this host reaches the rendezvous; set MASTER_ADDR to one of its own addresses to listen there only"
        )
    })
}

/// The nodes that the failed cluster checks blame, in node order, each
/// with every check that names it; a node whose own checklist failed is
/// one of them even where `cluster.node_checks` was not selected.
fn culprits(
    nodes: &[NodeView],
    evaluated: &[(CheckResult, Vec<String>)],
    strict: bool,
) -> Vec<Culprit> {
    let counts = |c: &CheckResult| c.status == Status::Fail || (strict && c.status == Status::Warn);
    nodes
        .iter()
        .filter_map(|n| {
            let mut reasons: Vec<String> = evaluated
                .iter()
                // The node's own failures are listed below, one by one.
                .filter(|(c, _)| c.kind != "cluster_node_checks")
                .filter(|(c, blames)| counts(c) && blames.contains(&n.name))
                .map(|(c, _)| format!("{}: {}", c.id, c.message))
                .collect();
            if n.local_verdict == "not_ready" {
                // The job's own settings are the job's to fix: they never
                // make a node the one to drain.
                reasons.extend(
                    n.failed
                        .iter()
                        .filter(|f| f.status == Status::Fail || strict)
                        .filter(|f| !preflight_result::cause::is_job_setting(&f.area))
                        .map(|f| format!("{}: {}", f.id, f.message)),
                );
            }
            (!reasons.is_empty()).then(|| Culprit {
                node: n.name.clone(),
                ranks: n.ranks.clone(),
                reasons,
            })
        })
        .collect()
}

/// Ranks that checked in and went away before the verdict (a node that
/// died, a leader killed): their node is at fault, named by the host
/// they checked in from, though it is no longer among the nodes.
fn blame_lost(culprits: &mut Vec<Culprit>, lost: &[preflight_result::cluster::Lost]) {
    for l in lost {
        let reason = format!(
            "cluster.barrier: rank {} went away after checking in ({})",
            l.rank, l.reason
        );
        match culprits.iter_mut().find(|c| c.node == l.node) {
            Some(c) => {
                c.ranks.push(l.rank);
                // One reason per cause, not per rank of a dead node.
                if !c.reasons.iter().any(|r| r.starts_with("cluster.barrier: ")) {
                    c.reasons.push(reason);
                }
            }
            None => culprits.push(Culprit {
                node: l.node.clone(),
                ranks: vec![l.rank],
                reasons: vec![reason],
            }),
        }
    }
}

/// Descriptors rank 0 needs beyond one connection per rank: listeners,
/// the probe listener, files, the runtime's own.
pub(super) const SPARE_FILES: u64 = 64;

/// What rank 0 says about its open-files limit: connections it could not
/// accept, or a hard limit below what the world needs (the soft limit was
/// raised to the hard one at start).
pub(super) fn open_files_warning(
    failures: usize,
    error: Option<&str>,
    world: u32,
    limit: Option<(u64, u64)>,
) -> Option<String> {
    let need = u64::from(world) + SPARE_FILES;
    let fix = "raise the hard limit where preflight starts (`ulimit -Hn` in the job script, `LimitNOFILE=` for a systemd unit, `nofile` in /etc/security/limits.conf)";
    let limits = limit.map_or(String::new(), |(soft, hard)| {
        format!("; its open-files limit is {soft} (hard {hard})")
    });
    if failures > 0 {
        return Some(format!(
            "rank 0 could not accept {failures} connection attempt{} ({}){limits}, and {world} ranks need about {need}: {fix}",
            if failures == 1 { "" } else { "s" },
            error.unwrap_or("no reason given"),
        ));
    }
    match limit {
        Some((_, hard)) if hard < need => Some(format!(
            "rank 0's open-files hard limit ({hard}) is below the about {need} that {world} ranks need: {fix}"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_on_every_interface_is_said() {
        let any: std::net::SocketAddr = "0.0.0.0:29500".parse().unwrap();
        let w = all_interfaces_warning(Some(&("10.9.9.9".to_string(), any))).unwrap();
        assert!(w.starts_with("rank 0 listens on every interface (0.0.0.0:29500): `10.9.9.9` is not an address of this host"), "{w}");
        let own: std::net::SocketAddr = "10.0.0.1:29500".parse().unwrap();
        assert_eq!(
            all_interfaces_warning(Some(&("node0".to_string(), own))),
            None
        );
        assert_eq!(all_interfaces_warning(None), None);
    }

    #[test]
    fn an_open_files_limit_below_the_world_is_named_with_its_fix() {
        assert_eq!(
            open_files_warning(0, None, 4096, Some((20000, 20000))),
            None
        );
        let low = open_files_warning(0, None, 4096, Some((1024, 1024))).unwrap();
        assert!(
            low.starts_with("rank 0's open-files hard limit (1024) is below the about 4160 that 4096 ranks need: raise the hard limit"),
            "{low}"
        );
        let failed = open_files_warning(
            3,
            Some("Too many open files (os error 24)"),
            48,
            Some((32, 32)),
        )
        .unwrap();
        assert!(
            failed.starts_with("rank 0 could not accept 3 connection attempts (Too many open files (os error 24)); its open-files limit is 32 (hard 32), and 48 ranks need about 112"),
            "{failed}"
        );
    }
}
