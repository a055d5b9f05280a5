//! The cluster stage's result: what rank 0 assembles and sends to every
//! rank, and what the JSON report's `cluster` section holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CheckResult, Status, Verdict};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterReport {
    pub verdict: Verdict,
    pub exit_code: i32,
    pub world_size: u32,
    /// host:port of the rendezvous.
    pub master: String,
    /// Where the job token came from (never its value) and a fingerprint
    /// that is equal on every rank of one job.
    pub token: String,
    pub duration_ms: u64,
    /// On rank 0, every node; in the verdict another rank receives, only
    /// that rank's own node (see `for_rank`).
    pub nodes: Vec<NodeView>,
    /// How many nodes checked in: `nodes.len()` on rank 0, and the count
    /// the other ranks print although they receive only their own node.
    #[serde(default)]
    pub node_count: usize,
    /// Set in a verdict cut down for one rank: where the whole report is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_report: Option<String>,
    pub barrier: Barrier,
    /// The cluster-scope checks, and the barrier's own result.
    pub checks: Vec<CheckResult>,
    pub reachability: Matrix,
    /// The nodes this verdict holds responsible, each with why: what an
    /// orchestrator (an Ansible play, a Slurm prolog) acts on, so that only
    /// those nodes are failed or drained. Empty when the cluster is ready,
    /// and when it is not but no node can be singled out (a rank that
    /// never arrived may be a dead node or a firewall on the master's).
    #[serde(default)]
    pub culprits: Vec<Culprit>,
    pub warnings: Vec<String>,
    /// Rank 0 was interrupted by a signal before it could give a verdict:
    /// it says so to every rank it can still reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<super::report::Interrupted>,
    /// The collective stage, run after the verdict; the report moves it to
    /// its own top-level `collective` section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<super::collective::CollectiveReport>,
    /// Where rank 0's time went (its own report only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<Phases>,
}

/// Rank 0's phases, each from the end of the one before, in ms: waiting
/// for the check-ins (from rank 0's start), the reachability probes, the
/// comparisons and the report, sending every rank its verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Phases {
    pub checkin_ms: u64,
    pub probes_ms: u64,
    pub assemble_ms: u64,
    pub verdicts_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Culprit {
    /// The node's name, as in `nodes`.
    pub node: String,
    pub ranks: Vec<u32>,
    /// `check id: message`, one per check that names this node.
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeView {
    /// Where rank 0 saw this node's first rank connect from, when that is
    /// not the address it claims (`addr`): NAT, or a peer that lies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_from: Option<String>,
    /// How the report names the node: its hostname, or its address where
    /// several nodes share one hostname.
    pub name: String,
    pub hostname: String,
    pub addr: String,
    pub ranks: Vec<u32>,
    pub tool_version: String,
    pub checklist_hash: String,
    pub versions: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub devices: Devices,
    pub clock: Option<Clock>,
    pub interface: Option<String>,
    /// Where its peers probed it; absent where it opened no listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_addr: Option<String>,
    pub hostname_addrs: Vec<String>,
    pub local_verdict: String,
    pub failed: Vec<FailedCheck>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Barrier {
    pub complete: bool,
    pub waited_ms: u64,
    /// The first missing ranks with their expected hosts (at most
    /// `MISSING_LISTED`, so the verdict frame stays small at any scale).
    pub missing: Vec<Missing>,
    /// How many ranks are missing, and all of them as ranges ("3,8-1023").
    pub missing_count: usize,
    pub missing_ranks: String,
    pub duplicates: Vec<Duplicate>,
    pub world_size_mismatch: Vec<Mismatch>,
    pub out_of_range: Vec<Mismatch>,
    /// Ranks that checked in and then went away before the verdict.
    pub lost: Vec<Lost>,
    /// The connections the ranks checked in on: one per node where node
    /// leaders checked their nodes in, one per rank otherwise.
    #[serde(default)]
    pub connections: usize,
    /// Source addresses of clients of another job (another token) that
    /// knocked on our port, with how often when more than once; at most 32.
    pub other_job_clients: Vec<String>,
    /// How many such connections there were in all.
    #[serde(default)]
    pub other_job_total: usize,
    /// Connections dropped before authenticating: garbage, oversized
    /// frames, silence.
    pub dropped: Vec<String>,
    /// How many were dropped in all; `dropped` lists the first few.
    pub dropped_total: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Missing {
    pub rank: u32,
    /// Where a nodelist or node mode says it should have run.
    pub expected_on: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Duplicate {
    pub rank: u32,
    /// "host pid N" of every process that claimed the rank.
    pub claimants: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mismatch {
    pub rank: u32,
    pub node: String,
    pub world_size: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lost {
    pub rank: u32,
    pub node: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Matrix {
    /// "all pairs" or "ring + hypercube".
    pub mode: String,
    pub nodes: Vec<String>,
    pub probes: Vec<Probe>,
    pub findings: Vec<String>,
}

/// How many entries of a list a cut-down verdict keeps: the lists whose
/// length grows with the world (missing ranks, culprits, probes) would
/// otherwise make rank 0 send O(N) bytes to each of N ranks.
pub const PER_RANK_LIST: usize = 32;

/// The longest culprit reason a cut-down verdict carries, in bytes.
const REASON: usize = 256;

impl ClusterReport {
    /// The verdict as rank 0 sends it to `rank`: the verdict and exit code,
    /// the checks, the culprits and the barrier's findings (lists cut to
    /// `PER_RANK_LIST` entries, with their totals kept), this rank's own
    /// node and the probes from and to it; the rest stays on rank 0, which
    /// `full_report` names. Its size does not grow with the world, so the
    /// verdicts rank 0 sends grow linearly in all.
    /// `own` is the index in `nodes` of the node `rank` checked in from
    /// (see `node_of_rank`), `None` for a rank the barrier did not place.
    pub fn for_rank(&self, own: Option<usize>) -> ClusterReport {
        let own = own.filter(|i| *i < self.nodes.len());
        // The probes this node made and received; their node numbers stay
        // rank 0's, whose list of names (O(N) again) stays there.
        let probes = match own {
            Some(i) => self
                .reachability
                .probes
                .iter()
                .filter(|p| p.from == i || p.to == i)
                .take(PER_RANK_LIST)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        self.cut_for(own, probes)
    }

    /// Every node's `for_rank`, for rank 0 to send: each node's probes
    /// found in one pass over them, not one pass per node (which at
    /// 16,384 nodes and three probes each was 800 million comparisons).
    pub fn rank_views(&self) -> RankViews<'_> {
        let mut probes_of: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for (k, p) in self.reachability.probes.iter().enumerate() {
            for node in [p.from, p.to] {
                if let Some(list) = probes_of.get_mut(node)
                    && list.len() < PER_RANK_LIST
                    && list.last() != Some(&k)
                {
                    list.push(k);
                }
            }
        }
        RankViews {
            report: self,
            probes_of,
        }
    }

    fn cut_for(&self, own: Option<usize>, probes: Vec<Probe>) -> ClusterReport {
        fn cut<T: Clone>(v: &[T]) -> Vec<T> {
            v.iter().take(PER_RANK_LIST).cloned().collect()
        }
        let mut warnings = cut(&self.warnings);
        if self.culprits.len() > PER_RANK_LIST {
            warnings.push(format!(
                "{} more culprit node(s) in rank 0's report",
                self.culprits.len() - PER_RANK_LIST
            ));
        }
        let mut culprits = cut(&self.culprits);
        // A rank's own node, when named, is what it acts on (a Slurm
        // prolog drains itself by it): never cut away.
        if let Some(name) = own.map(|i| &self.nodes[i].name)
            && !culprits.iter().any(|c| &c.node == name)
            && let Some(c) = self.culprits.iter().find(|c| &c.node == name)
        {
            culprits.push(c.clone());
        }
        for c in &mut culprits {
            c.ranks.truncate(PER_RANK_LIST * 8);
            c.reasons.truncate(PER_RANK_LIST);
            // A reason is a check's whole message, which names up to 8
            // nodes: the culprit's own line is what a rank acts on.
            for r in &mut c.reasons {
                if r.len() > REASON {
                    let mut end = REASON;
                    while !r.is_char_boundary(end) {
                        end -= 1;
                    }
                    r.truncate(end);
                    r.push_str("...");
                }
            }
        }
        let b = &self.barrier;
        let barrier = Barrier {
            complete: b.complete,
            waited_ms: b.waited_ms,
            missing: cut(&b.missing),
            missing_count: b.missing_count,
            missing_ranks: b.missing_ranks.clone(),
            duplicates: cut(&b.duplicates),
            world_size_mismatch: cut(&b.world_size_mismatch),
            out_of_range: cut(&b.out_of_range),
            lost: cut(&b.lost),
            connections: b.connections,
            other_job_clients: cut(&b.other_job_clients),
            other_job_total: b.other_job_total,
            dropped: cut(&b.dropped),
            dropped_total: b.dropped_total,
        };
        ClusterReport {
            verdict: self.verdict,
            exit_code: self.exit_code,
            world_size: self.world_size,
            master: self.master.clone(),
            token: self.token.clone(),
            duration_ms: self.duration_ms,
            nodes: own.map(|i| vec![self.nodes[i].clone()]).unwrap_or_default(),
            node_count: self.node_count.max(self.nodes.len()),
            full_report: Some(format!("rank 0's report (the master, {})", self.master)),
            barrier,
            checks: self
                .checks
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    c.about = c
                        .about
                        .for_node(own.map(|i| self.nodes[i].hostname.as_str()));
                    c
                })
                .collect(),
            reachability: Matrix {
                mode: self.reachability.mode.clone(),
                nodes: Vec::new(),
                probes,
                findings: cut(&self.reachability.findings),
            },
            culprits,
            warnings,
            interrupted: self.interrupted.clone(),
            collective: None,
            phases: None,
        }
    }

    /// Each rank's index in `nodes`.
    pub fn node_of_rank(&self) -> std::collections::HashMap<u32, usize> {
        self.nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.ranks.iter().map(move |r| (*r, i)))
            .collect()
    }

    /// Each rank's host (its node's name), indexed by rank; empty for a
    /// rank no node holds.
    pub fn hosts_by_rank(&self) -> Vec<String> {
        let node_of = self.node_of_rank();
        (0..self.world_size)
            .map(|r| {
                node_of
                    .get(&r)
                    .map(|i| self.nodes[*i].name.clone())
                    .unwrap_or_default()
            })
            .collect()
    }

    pub fn problems(&self) -> Vec<&CheckResult> {
        self.checks
            .iter()
            .filter(|c| matches!(c.status, Status::Fail | Status::Warn | Status::Error))
            .collect()
    }
}

/// Each node's cut of one report (`ClusterReport::rank_views`).
pub struct RankViews<'a> {
    report: &'a ClusterReport,
    /// Per node, the indices of the probes it made or received, the first
    /// `PER_RANK_LIST`.
    probes_of: Vec<Vec<usize>>,
}

impl RankViews<'_> {
    /// What `ClusterReport::for_rank(own)` gives.
    pub fn view(&self, own: Option<usize>) -> ClusterReport {
        let r = self.report;
        let own = own.filter(|i| *i < r.nodes.len());
        let probes = own
            .map(|i| {
                self.probes_of[i]
                    .iter()
                    .map(|k| r.reachability.probes[*k].clone())
                    .collect()
            })
            .unwrap_or_default();
        r.cut_for(own, probes)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FailedCheck {
    pub id: String,
    pub status: Status,
    pub message: String,
    pub hint: Option<String>,
    /// The check's area: `environment` and `launch` are the job's own
    /// settings, not the node's state.
    #[serde(default)]
    pub area: String,
    /// The check's kind: what rank 0 weighs as evidence against the node
    /// (its own `firewall` check found a blocking rule), by field, not by
    /// the words of a message.
    #[serde(default)]
    pub kind: String,
    /// What it is about, for the cause rules of a report merged from
    /// rank 0's alone.
    #[serde(default, skip_serializing_if = "super::About::is_empty")]
    pub about: super::About,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Devices {
    pub count: usize,
    /// "NVIDIA H100 80GB HBM3" x8, ...: model names in PCI order.
    pub models: Vec<String>,
}

/// The best of several NTP-style samples: the one with the smallest
/// round trip bounds the offset most tightly.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Clock {
    /// This node's clock minus the master's, in milliseconds.
    pub offset_ms: f64,
    pub rtt_ms: f64,
}

impl Clock {
    /// One sample from the four timestamps (µs): t0 client send, t1 server
    /// receive, t2 server send, t3 client receive.
    pub fn sample(t0: i64, t1: i64, t2: i64, t3: i64) -> Clock {
        // In i128: the server's timestamps are a peer's input and must not
        // overflow the arithmetic, however wrong they are.
        let (t0, t1, t2, t3) = (t0 as i128, t1 as i128, t2 as i128, t3 as i128);
        let server_minus_client = ((t1 - t0) + (t2 - t3)) as f64 / 2.0;
        let rtt = ((t3 - t0) - (t2 - t1)).max(0) as f64;
        Clock {
            offset_ms: -server_minus_client / 1000.0,
            rtt_ms: rtt / 1000.0,
        }
    }
}

/// A probe's status when the connection was accepted (by the node's
/// kernel) and no echo came: the rank is stopped or starved, not behind a
/// firewall.
pub const NO_ANSWER: &str = "no_answer";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Probe {
    pub from: usize,
    pub to: usize,
    /// ok, refused, timed_out, unreachable, error
    pub status: String,
    pub rtt_ms: Option<f64>,
    pub detail: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank 0's report of `nodes` nodes of 8 ranks, every node failing a
    /// check and named a culprit, every second node missing a rank: the
    /// lists that grow with the world, all long.
    pub(super) fn report(nodes: usize) -> ClusterReport {
        let world = (nodes * 8) as u32;
        let views: Vec<serde_json::Value> = (0..nodes)
            .map(|i| {
                serde_json::json!({
                    "name": format!("gpu{i:05}"), "hostname": format!("gpu{i:05}"),
                    "addr": format!("10.0.{}.{}", i / 250, i % 250),
                    "ranks": ((i * 8) as u32..(i * 8 + 8) as u32).collect::<Vec<_>>(),
                    "tool_version": "0.1.0", "checklist_hash": "abc",
                    "versions": {"driver": "550.54"}, "env": {"NCCL_DEBUG": "WARN"},
                    "devices": {"count": 8, "models": ["H100"]},
                    "clock": {"offset_ms": 0.25, "rtt_ms": 0.1}, "interface": "eth0",
                    "hostname_addrs": [], "local_verdict": "not_ready",
                    "failed": [{"id": "gpu.memory_free", "status": "fail",
                        "message": "GPU 3 is half full", "hint": null}]
                })
            })
            .collect();
        let missing: Vec<serde_json::Value> = (0..nodes)
            .step_by(2)
            .map(|i| serde_json::json!({"rank": i * 8 + 7, "expected_on": format!("gpu{i:05}")}))
            .collect();
        let probes: Vec<serde_json::Value> = (0..nodes)
            .flat_map(|i| {
                [(i + 1) % nodes, (i + 2) % nodes].map(|j| {
                    serde_json::json!({"from": i, "to": j, "status": "ok",
                        "rtt_ms": 0.2, "detail": null})
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "verdict": "not_ready", "exit_code": 1, "world_size": world,
            "master": "10.0.0.1:29500", "token": "PREFLIGHT_TOKEN (3c0c65e3)",
            "duration_ms": 1000, "nodes": views, "node_count": nodes,
            "barrier": {"complete": false, "waited_ms": 10, "missing": missing,
                "missing_count": nodes / 2, "missing_ranks": "7,23", "duplicates": [],
                "world_size_mismatch": [], "out_of_range": [], "lost": [],
                "other_job_clients": [], "dropped": [], "dropped_total": 0},
            "checks": [],
            "reachability": {"mode": "ring + hypercube",
                "nodes": (0..nodes).map(|i| format!("gpu{i:05}")).collect::<Vec<_>>(),
                "probes": probes, "findings": []},
            "culprits": (0..nodes).map(|i| serde_json::json!({"node": format!("gpu{i:05}"),
                "ranks": [i * 8], "reasons": ["gpu.memory_free: GPU 3 is half full"]}))
                .collect::<Vec<_>>(),
            "warnings": []
        }))
        .unwrap()
    }

    pub(super) fn bytes(r: &ClusterReport) -> usize {
        serde_json::to_vec(r).unwrap().len()
    }

    /// What one rank receives does not grow with the world: the same
    /// bytes at 64 nodes as at 4,096, so rank 0 sends O(N) in all.
    #[test]
    fn a_ranks_verdict_does_not_grow_with_the_world() {
        let small = report(64);
        let large = report(4096);
        let own = |r: &ClusterReport, rank: u32| r.for_rank(r.node_of_rank().get(&rank).copied());
        let (a, b) = (own(&small, 9), own(&large, 9));
        // The node names' width and the rank numbers differ by a few
        // bytes; the lists do not.
        assert!(
            bytes(&b) < bytes(&a) + 256,
            "{} vs {}",
            bytes(&a),
            bytes(&b)
        );
        assert!(
            bytes(&large) > 100 * bytes(&b),
            "the whole report stays on rank 0"
        );
        // What it keeps: the verdict, the counts, its own node, its
        // probes, a pointer to the rest.
        assert_eq!(b.verdict, Verdict::NotReady);
        assert_eq!(b.exit_code, 1);
        assert_eq!(b.node_count, 4096);
        assert_eq!(b.nodes.len(), 1);
        assert_eq!(b.nodes[0].name, "gpu00001");
        assert_eq!(b.barrier.missing_count, 2048);
        assert_eq!(b.barrier.missing.len(), PER_RANK_LIST);
        assert_eq!(b.culprits.len(), PER_RANK_LIST);
        assert!(
            b.warnings
                .iter()
                .any(|w| w == "4064 more culprit node(s) in rank 0's report"),
            "{:?}",
            b.warnings
        );
        assert!(
            b.reachability
                .probes
                .iter()
                .all(|p| p.from == 1 || p.to == 1)
        );
        assert_eq!(b.reachability.probes.len(), 4);
        assert!(b.full_report.as_deref().unwrap().contains("10.0.0.1:29500"));
        // A rank on a culprit node far down the list still sees itself
        // named: it is what that rank acts on.
        let last = large.culprits.last().unwrap().clone();
        let cut = large.for_rank(large.nodes.iter().position(|n| n.name == last.node));
        assert_eq!(cut.culprits.len(), PER_RANK_LIST + 1);
        assert_eq!(cut.culprits.last().unwrap().node, last.node);
        // A rank the barrier did not place gets the verdict without a node.
        let unplaced = large.for_rank(None);
        assert!(unplaced.nodes.is_empty() && unplaced.reachability.probes.is_empty());
        assert_eq!(unplaced.verdict, Verdict::NotReady);
    }

    /// What a check across nodes is about travels cut in every rank's
    /// verdict: a cluster of loopback hostnames names its own node and one
    /// other, not 4,096; a restatement too long to tell is said as none.
    #[test]
    fn what_a_check_is_about_is_cut_to_the_node() {
        let mut r = report(4096);
        let mut c = crate::CheckResult::built_in(
            "cluster.addresses",
            "cluster_addresses",
            "cluster",
            Status::Fail,
            "every hostname resolves to loopback".into(),
            None,
        );
        c.about.loopback_hostnames = r.nodes.iter().map(|n| n.hostname.clone()).collect();
        c.about.restates = (0..20).map(|i| format!("check.{i}")).collect();
        c.about.variables = vec!["GLOO_SOCKET_IFNAME".into()];
        r.checks.push(c);
        let own = r.rank_views().view(Some(9));
        let about = &own.checks.last().unwrap().about;
        assert_eq!(
            about.loopback_hostnames,
            [r.nodes[9].hostname.clone(), r.nodes[0].hostname.clone()]
        );
        assert!(about.restates.is_empty());
        assert_eq!(about.variables, ["GLOO_SOCKET_IFNAME"]);
        assert!(bytes(&own) < 10_000, "{}", bytes(&own));
    }

    /// Rank 0's way of cutting every node's view gives each node what
    /// `for_rank` gives it, byte for byte.
    #[test]
    fn every_nodes_view_at_once_is_each_nodes_own() {
        let mut r = report(300);
        // A node in many probes, beyond what one rank is sent.
        for to in 2..(PER_RANK_LIST + 9) {
            r.reachability.probes.push(Probe {
                from: 7,
                to,
                status: "ok".into(),
                rtt_ms: Some(0.1),
                detail: None,
            });
        }
        let views = r.rank_views();
        for own in [
            None,
            Some(0),
            Some(1),
            Some(7),
            Some(8),
            Some(299),
            Some(300),
        ] {
            let (a, b) = (views.view(own), r.for_rank(own));
            assert_eq!(
                serde_json::to_string(&a).unwrap(),
                serde_json::to_string(&b).unwrap(),
                "{own:?}"
            );
        }
        assert_eq!(views.view(Some(7)).reachability.probes.len(), PER_RANK_LIST);
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Whatever the world and whichever rank: a rank's verdict says
        /// what rank 0's says (verdict, exit code, checks, counts), and
        /// its size stays under a bound that does not grow with the world.
        #[test]
        fn every_rank_gets_rank_0s_verdict_in_bounded_bytes(
            nodes in 1usize..3000,
            pick in 0usize..100_000,
        ) {
            let full = tests::report(nodes);
            let rank = (pick % (nodes * 8)) as u32;
            let own = full.node_of_rank().get(&rank).copied();
            let cut = full.for_rank(own);
            prop_assert_eq!(cut.verdict, full.verdict);
            prop_assert_eq!(cut.exit_code, full.exit_code);
            prop_assert_eq!(cut.world_size, full.world_size);
            prop_assert_eq!(cut.node_count, nodes);
            prop_assert_eq!(cut.barrier.missing_count, full.barrier.missing_count);
            prop_assert_eq!(
                serde_json::to_string(&cut.checks).unwrap(),
                serde_json::to_string(&full.checks).unwrap()
            );
            prop_assert!(cut.nodes.len() == 1 && cut.nodes[0].ranks.contains(&rank));
            prop_assert!(tests::bytes(&cut) < 24 << 10, "{} bytes", tests::bytes(&cut));
        }
    }
}
