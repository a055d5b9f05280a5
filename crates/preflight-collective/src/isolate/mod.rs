//! The pairwise round's second pass: when the first pass finds a slow
//! node or a slow node pair, each suspect is measured again with nodes
//! that ran at full rate, so the verdict separates a node slow with every
//! good partner (drain it) from one slow link between two nodes that each
//! run at full rate elsewhere (name the link, drain nobody).
//!
//! Why suspects are paired with good nodes (as Azure's CHS does) rather
//! than bisected or grown into groups one node at a time: a pair measures
//! one path and its two ends, and with a partner already seen at full
//! rate a slow result can only be the suspect's or that path's. A group's
//! rate mixes every member's links, and bisection needs log2(N) rounds for
//! even one suspect; here one round per partner suffices, and the
//! suspects' pairs share rounds (disjoint pairs run at once).
//!
//! Node level: each node is played by its first rank and only pairs of
//! different nodes count (a pair on one node measures no network). The
//! pairs run over the TCP backend's connections between the nodes, so no
//! library's same-node path (NCCL's P2P or SHM) can stand in for the
//! network. In the first pass a node with several ranks carries several
//! flows at once; in the second, one: so each round also runs a control
//! pair of two good nodes, and the second pass's figures are judged
//! against the control pairs measured alongside them, never against the
//! first pass's.
//!
//! `plan` (what to measure, from the first pass's table), `exchange` (the
//! table shared with every rank, and this rank's pairs of the plan),
//! `judge` (rank 0: what the pass found).

mod exchange;
mod judge;
mod plan;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use preflight_ground::values::median;
use preflight_result::collective::PairRate;

#[cfg(feature = "fuzzing")]
pub use exchange::plan_for_fuzzing;
pub use exchange::run;
pub use judge::judge;
pub use plan::plan;

/// Good partners each node suspect is measured with.
const PARTNERS: usize = 3;

/// What every rank runs, computed alike on each from the shared table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Why the pass runs, or why it does not.
    pub reason: String,
    /// The first pass's node pairs (each node's first rank), best rate.
    pub first: Vec<PairRate>,
    /// What a good node pair reached in the first pass (the median of the
    /// pairs between nodes that are not suspects), GB/s.
    pub reference: f64,
    /// Nodes whose median pair ran below a third of the nodes' median
    /// (their first rank).
    pub nodes: Vec<u32>,
    /// Pairs below a third of what both their nodes reach with others,
    /// neither node a suspect.
    pub links: Vec<(u32, u32)>,
    /// The pairs to measure, in rounds of disjoint pairs.
    pub rounds: Vec<Vec<(u32, u32)>>,
    /// Of those, the control pairs (two good nodes).
    pub controls: Vec<(u32, u32)>,
    /// Pairs the budget could not hold.
    pub skipped: Vec<(u32, u32)>,
    /// The time the pass may take: the least any rank had left, ms.
    pub budget_ms: u64,
    /// Some node runs several ranks: the first pass's figures are of
    /// several flows at once, no measure for a single one.
    pub several_ranks: bool,
}

impl Plan {
    fn not_run(reason: String, first: Vec<PairRate>) -> Plan {
        Plan {
            reason,
            first,
            ..Plan::default()
        }
    }

    pub fn runs(&self) -> bool {
        !self.nodes.is_empty() || !self.links.is_empty()
    }
}

/// One rank's part of the pass, sent to rank 0 with its result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Part {
    /// Rank 0's plan (every rank has the same; one copy travels).
    #[serde(default)]
    pub plan: Option<Plan>,
    /// The pairs this rank measured as the lower rank.
    #[serde(default)]
    pub pairs: Vec<PairRate>,
    /// Why this rank's part stopped early.
    #[serde(default)]
    pub error: Option<String>,
    /// From the shared table to this rank's last pair, ms.
    #[serde(default)]
    pub ms: u64,
}

/// Each rank's node, by name; a rank whose node is unknown is a node of
/// its own.
pub fn node(hosts: &[String], r: u32) -> String {
    match hosts.get(r as usize) {
        Some(h) if !h.is_empty() => h.clone(),
        _ => format!("rank {r}"),
    }
}

/// Each node's first rank, by rank.
fn first_ranks(hosts: &[String], world: u32) -> BTreeMap<u32, u32> {
    let mut first: BTreeMap<String, u32> = BTreeMap::new();
    for r in 0..world {
        first.entry(node(hosts, r)).or_insert(r);
    }
    (0..world).map(|r| (r, first[&node(hosts, r)])).collect()
}

/// The first pass's rank pairs as node pairs (each node's first rank),
/// the best rate of each; pairs on one node are left out.
pub fn node_pairs(pairs: &[PairRate], hosts: &[String], world: u32) -> Vec<PairRate> {
    let first = first_ranks(hosts, world);
    let mut best: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    for p in pairs {
        let (Some(&a), Some(&b)) = (first.get(&p.a), first.get(&p.b)) else {
            continue;
        };
        if a == b || !p.gbps.is_finite() || p.gbps <= 0.0 {
            continue;
        }
        let rate = best.entry((a.min(b), a.max(b))).or_insert(0.0);
        *rate = rate.max(p.gbps);
    }
    best.into_iter()
        .map(|((a, b), gbps)| PairRate { a, b, gbps })
        .collect()
}

fn touches(p: &(u32, u32), n: u32) -> bool {
    p.0 == n || p.1 == n
}

fn ordered(a: u32, b: u32) -> (u32, u32) {
    (a.min(b), a.max(b))
}
