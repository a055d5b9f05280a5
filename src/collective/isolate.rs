//! The pairwise round's second pass: when the first pass finds a slow
//! node pair, each suspect is measured again with nodes that ran at full
//! rate, so the verdict separates a node slow with every good partner
//! (drain it) from one slow link between two nodes that each run at full
//! rate elsewhere (name the link, drain nobody).
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
//! network.
//!
//! Every rank learns the first pass's whole table (one allgather of each
//! rank's pairs, with the time it has left), so every rank computes the
//! same plan within the same budget, with no further word from rank 0.
//! The budget is the least time any rank has left before the run's
//! deadline (less a second for the report), and at most a step's
//! deadline; the plan keeps the rounds whose estimated time (from the
//! first pass's rates, doubled) fits, and says which pairs it left out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::Backend;
use super::config::Config;
use super::straggler::{self, EXCHANGES, MAX_ROUNDS, SLOW};
use crate::result::collective::{PairRate, SecondPass};

/// Good partners each node suspect is measured with.
const PARTNERS: usize = 3;
/// Kept back before the run's deadline for publishing and the report.
const RESERVE: Duration = Duration::from_secs(1);
/// A round's estimate is its slowest pair's bytes over the first pass's
/// rate, plus this for the handshakes.
const ROUND_OVERHEAD: Duration = Duration::from_millis(20);
/// The plan must fit its budget this many times over.
const MARGIN: f64 = 2.0;
/// One rank's block of the shared table: the time it has left (ms), how
/// many pairs it reports, and each pair (ranks, GB/s); a rank reports at
/// most one pair per round of the first pass.
const BLOCK: usize = 8 + 4 + MAX_ROUNDS * 16;

/// What every rank runs, computed alike on each from the shared table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Why the pass runs, or why it does not.
    pub reason: String,
    /// The first pass's node pairs (each node's first rank), best rate.
    pub first: Vec<PairRate>,
    /// Of those, the slow ones.
    pub slow: Vec<PairRate>,
    /// The median of the others: what a good pair reaches, GB/s.
    pub reference: f64,
    /// Nodes slow in every pair of the first pass (their first rank).
    pub nodes: Vec<u32>,
    /// Slow pairs whose two ends are not such nodes.
    pub links: Vec<(u32, u32)>,
    /// The pairs to measure, in rounds of disjoint pairs.
    pub rounds: Vec<Vec<(u32, u32)>>,
    /// Pairs the budget could not hold.
    pub skipped: Vec<(u32, u32)>,
    /// The time the pass may take: the least any rank had left, ms.
    pub budget_ms: u64,
}

impl Plan {
    fn not_run(reason: String, first: Vec<PairRate>) -> Plan {
        Plan {
            reason,
            first,
            ..Plan::default()
        }
    }

    fn runs(&self) -> bool {
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
fn node_pairs(pairs: &[PairRate], hosts: &[String], world: u32) -> Vec<PairRate> {
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

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// Whether a node pair is slow: below `SLOW` of the median of the pairs
/// that share neither of its nodes (a slow node drags down only its own
/// pairs), or of every other pair where none is disjoint (three nodes).
fn is_slow(p: &PairRate, all: &[PairRate]) -> bool {
    let others = |disjoint: bool| {
        all.iter()
            .filter(|q| (q.a, q.b) != (p.a, p.b))
            .filter(|q| !disjoint || (q.a != p.a && q.a != p.b && q.b != p.a && q.b != p.b))
            .map(|q| q.gbps)
            .collect::<Vec<f64>>()
    };
    let base = match others(true) {
        d if d.is_empty() => others(false),
        d => d,
    };
    median(base).is_some_and(|m| p.gbps < m * SLOW)
}

fn touches(p: &(u32, u32), n: u32) -> bool {
    p.0 == n || p.1 == n
}

/// The plan, from every rank's first-pass pairs and the budget.
pub fn plan(
    world: u32,
    hosts: &[String],
    first_pass: &[PairRate],
    bytes: usize,
    budget: Duration,
) -> Plan {
    let first = node_pairs(first_pass, hosts, world);
    let name = |r: u32| node(hosts, r);
    if first.is_empty() {
        return Plan::not_run(
            "not run: no pair of the first pass crossed two nodes (one node, or no pair measured)"
                .into(),
            first,
        );
    }
    if first.len() == 1 {
        return Plan::not_run(
            "not run: two nodes give one pair, with nothing to compare it with".into(),
            first,
        );
    }
    let slow: Vec<PairRate> = first
        .iter()
        .filter(|p| is_slow(p, &first))
        .cloned()
        .collect();
    let good_rates: Vec<f64> = first
        .iter()
        .filter(|p| !slow.contains(p))
        .map(|p| p.gbps)
        .collect();
    let reference = median(good_rates).unwrap_or(0.0);
    if slow.is_empty() {
        return Plan {
            reference,
            ..Plan::not_run(
                format!(
                    "not run: no slow node pair in the first pass ({} node pairs, median {reference:.3} GB/s)",
                    first.len()
                ),
                first,
            )
        };
    }
    let nodes_of: BTreeSet<u32> = first.iter().flat_map(|p| [p.a, p.b]).collect();
    let pairs_of = |n: u32| first.iter().filter(move |p| p.a == n || p.b == n);
    let slow_in = |n: u32| slow.iter().filter(|p| p.a == n || p.b == n).count();
    let suspects: Vec<u32> = nodes_of
        .iter()
        .copied()
        .filter(|&n| pairs_of(n).all(|p| slow.contains(p)))
        .collect();
    let links: Vec<(u32, u32)> = slow
        .iter()
        .filter(|p| !suspects.contains(&p.a) && !suspects.contains(&p.b))
        .map(|p| (p.a, p.b))
        .collect();
    // Partners: nodes that ran at full rate with someone, those in no
    // slow pair first.
    let mut good: Vec<u32> = nodes_of
        .iter()
        .copied()
        .filter(|&n| !suspects.contains(&n) && pairs_of(n).any(|p| !slow.contains(p)))
        .collect();
    good.sort_by_key(|&n| (slow_in(n), n));
    let said = |v: &[u32]| v.iter().map(|&n| name(n)).collect::<Vec<_>>().join(", ");
    let slow_said = slow
        .iter()
        .map(|p| format!("{}–{} {:.3}", name(p.a), name(p.b), p.gbps))
        .collect::<Vec<_>>()
        .join(", ");
    let mut plan = Plan {
        first: first.clone(),
        slow: slow.clone(),
        reference,
        nodes: suspects.clone(),
        links: links.clone(),
        budget_ms: budget.as_millis() as u64,
        ..Plan::default()
    };
    if !suspects.is_empty() && good.is_empty() {
        plan.reason = format!(
            "not run: every node is slow in every pair ({slow_said} GB/s): no node ran at full rate to measure the others against"
        );
        plan.nodes.clear();
        plan.links.clear();
        return plan;
    }
    // Each suspect with up to PARTNERS good nodes, a different first
    // partner for each suspect where there are enough, those it has not
    // met yet first (new evidence); then each suspect link again.
    let met = |a: u32, b: u32| {
        first
            .iter()
            .any(|p| touches(&(p.a, p.b), a) && touches(&(p.a, p.b), b))
    };
    let mut wanted: Vec<(u32, u32)> = Vec::new();
    for (i, &x) in suspects.iter().enumerate() {
        let mut partners = good.clone();
        let turn = i % partners.len();
        partners.rotate_left(turn);
        partners.sort_by_key(|&p| met(x, p));
        wanted.extend(
            partners
                .into_iter()
                .take(PARTNERS)
                .map(|p| (x.min(p), x.max(p))),
        );
    }
    for &l in &links {
        if !wanted.contains(&l) {
            wanted.push(l);
        }
    }
    // Disjoint rounds, filled in order.
    let mut rounds: Vec<Vec<(u32, u32)>> = Vec::new();
    for &(a, b) in &wanted {
        let free = |r: &Vec<(u32, u32)>| !r.iter().any(|p| touches(p, a) || touches(p, b));
        match rounds.iter_mut().find(|r| free(r)) {
            Some(r) => r.push((a, b)),
            None => rounds.push(vec![(a, b)]),
        }
    }
    // Each round's time at the first pass's rates; the rounds that fit.
    let best_of = |n: u32| pairs_of(n).map(|p| p.gbps).fold(0.0, f64::max);
    let estimate = |&(a, b): &(u32, u32)| {
        let rate = first
            .iter()
            .find(|p| (p.a, p.b) == (a, b))
            .map_or_else(|| best_of(a).min(best_of(b)), |p| p.gbps)
            .max(1e-6);
        Duration::from_secs_f64((EXCHANGES + 1) as f64 * bytes as f64 / (rate * 1e9))
    };
    let mut total = Duration::ZERO;
    for r in rounds {
        let t = r.iter().map(estimate).max().unwrap_or_default() + ROUND_OVERHEAD;
        if plan.skipped.is_empty() && (total + t).mul_f64(MARGIN) <= budget {
            total += t;
            plan.rounds.push(r);
        } else {
            plan.skipped.extend(r);
        }
    }
    let mut reason = format!(
        "ran: the first pass found slow node pairs ({slow_said} GB/s, where the other pairs reach {reference:.3} GB/s, their median)"
    );
    if !suspects.is_empty() {
        reason.push_str(&format!(
            "; slow in every pair: {}, each measured again with up to {PARTNERS} nodes that ran at full rate",
            said(&suspects)
        ));
    }
    if !links.is_empty() {
        let l: Vec<String> = links
            .iter()
            .map(|&(a, b)| format!("{}–{}", name(a), name(b)))
            .collect();
        reason.push_str(&format!(
            "; slow between nodes that run at full rate elsewhere: {}, measured again",
            l.join(", ")
        ));
    }
    plan.reason = reason;
    plan
}

/// The first pass's table shared with every rank: each rank's pairs and
/// the time it has left (ms) in one fixed block.
fn encode(ms_left: u64, pairs: &[PairRate]) -> Vec<u8> {
    let mut b = Vec::with_capacity(BLOCK);
    b.extend_from_slice(&ms_left.to_le_bytes());
    let n = pairs.len().min(MAX_ROUNDS);
    b.extend_from_slice(&(n as u32).to_le_bytes());
    for p in &pairs[..n] {
        b.extend_from_slice(&p.a.to_le_bytes());
        b.extend_from_slice(&p.b.to_le_bytes());
        b.extend_from_slice(&p.gbps.to_le_bytes());
    }
    b.resize(BLOCK, 0);
    b
}

/// A block as its rank sent it; a count past the block, a rank outside
/// the world or a rate that is not a positive number is left out.
fn decode(block: &[u8], world: u32) -> (u64, Vec<PairRate>) {
    let u32_at = |i: usize| u32::from_le_bytes(block[i..i + 4].try_into().unwrap_or([0; 4]));
    let ms = u64::from_le_bytes(block[..8].try_into().unwrap_or([0; 8]));
    let n = (u32_at(8) as usize).min(MAX_ROUNDS);
    let pairs = (0..n)
        .map(|k| 12 + k * 16)
        .map(|at| PairRate {
            a: u32_at(at),
            b: u32_at(at + 4),
            gbps: f64::from_le_bytes(block[at + 8..at + 16].try_into().unwrap_or([0; 8])),
        })
        .filter(|p| p.a < world && p.b < world && p.a != p.b && p.gbps.is_finite() && p.gbps > 0.0)
        .collect();
    (ms, pairs)
}

/// This rank's part: share the first pass's table, compute the plan,
/// measure this node's pairs of it (as its first rank) within the budget.
pub async fn run<B: Backend>(
    b: &mut B,
    cfg: &Config,
    hosts: &[String],
    own: &[PairRate],
    bytes: usize,
) -> Part {
    let me = b.rank();
    let world = b.world();
    let left = match cfg.until {
        Some(u) => u
            .saturating_duration_since(Instant::now())
            .saturating_sub(RESERVE),
        None => cfg.step_timeout,
    }
    .min(cfg.step_timeout);
    let mut table = vec![0u8; BLOCK * world as usize];
    let shared = b
        .allgather(
            &encode(left.as_millis() as u64, own),
            &mut table,
            cfg.deadline(cfg.step_timeout),
        )
        .await;
    if let Err(e) = shared {
        return Part {
            error: Some(format!(
                "the first pass's table could not be shared: {}",
                cfg.judge(e)
            )),
            ..Part::default()
        };
    }
    let mut all = Vec::new();
    let mut budget = left;
    for block in table.chunks_exact(BLOCK) {
        let (ms, pairs) = decode(block, world);
        budget = budget.min(Duration::from_millis(ms));
        all.extend(pairs);
    }
    let plan = plan(world, hosts, &all, bytes, budget);
    let start = Instant::now();
    let end = start + budget;
    let mut part = Part::default();
    let first = first_ranks(hosts, world);
    if plan.runs() && first.get(&me) == Some(&me) {
        let send = vec![0x5au8; bytes];
        let mut recv = vec![0xffu8; bytes];
        for round in &plan.rounds {
            let Some(&(x, y)) = round.iter().find(|p| touches(p, me)) else {
                continue;
            };
            let peer = if x == me { y } else { x };
            let deadline = end.min(cfg.deadline(cfg.step_timeout));
            match straggler::measure(b, peer, &send, &mut recv, deadline).await {
                Ok(secs) if me == x => part.pairs.push(PairRate {
                    a: x,
                    b: y,
                    gbps: bytes as f64 / secs / 1e9,
                }),
                Ok(_) => {}
                Err(e) => {
                    part.error = Some(format!(
                        "rank {me} stopped at its pair with rank {peer}: {}",
                        cfg.judge(e)
                    ));
                    break;
                }
            }
        }
    }
    part.ms = start.elapsed().as_millis() as u64;
    if me == 0 {
        part.plan = Some(plan);
    }
    part
}

/// Rank 0: what the pass found, from its plan and every rank's part.
pub fn judge(parts: &[&Part], hosts: &[String], world: u32) -> Option<SecondPass> {
    let plan = parts.iter().find_map(|p| p.plan.as_ref())?;
    let name = |r: u32| node(hosts, r);
    if !plan.runs() {
        return Some(SecondPass {
            ran: false,
            reason: plan.reason.clone(),
            reference_gbps: plan.reference,
            ..SecondPass::default()
        });
    }
    let measured: Vec<PairRate> = parts.iter().flat_map(|p| p.pairs.clone()).collect();
    let errors: Vec<&str> = parts.iter().filter_map(|p| p.error.as_deref()).collect();
    let slow = |g: f64| g < plan.reference * SLOW;
    let again = |a: u32, b: u32| {
        measured
            .iter()
            .find(|p| (p.a, p.b) == (a.min(b), a.max(b)))
            .map(|p| p.gbps)
    };
    let why_not = |a: u32, b: u32| {
        if plan.skipped.contains(&(a.min(b), a.max(b))) {
            format!(
                "the pass's {:.1} s (the time left before the run's deadline, at most --step-timeout) could not hold it",
                plan.budget_ms as f64 / 1000.0
            )
        } else if let Some(e) = errors.first() {
            e.to_string()
        } else {
            "no rank reported it".into()
        }
    };
    let mut out = SecondPass {
        ran: true,
        reason: plan.reason.clone(),
        pairs: measured.clone(),
        reference_gbps: plan.reference,
        ms: parts.iter().map(|p| p.ms).max().unwrap_or(0),
        ..SecondPass::default()
    };
    let first_ranks = first_ranks(hosts, world);
    let wanted: Vec<(u32, u32)> = plan
        .rounds
        .iter()
        .flatten()
        .chain(&plan.skipped)
        .copied()
        .collect();
    for &x in &plan.nodes {
        let partners: Vec<u32> = wanted
            .iter()
            .filter(|p| touches(p, x))
            .map(|&(a, b)| if a == x { b } else { a })
            .collect();
        let tested: Vec<(u32, f64)> = partners
            .iter()
            .filter_map(|&p| Some((p, again(x, p)?)))
            .collect();
        let first_best = plan
            .first
            .iter()
            .filter(|p| touches(&(p.a, p.b), x))
            .map(|p| p.gbps)
            .fold(0.0, f64::max);
        let ranks: Vec<u32> = first_ranks
            .iter()
            .filter(|(_, f)| **f == x)
            .map(|(r, _)| *r)
            .collect();
        let ranks_said = super::ending::rank_list(&ranks);
        if tested.is_empty() {
            let why = partners
                .first()
                .map_or("no partner".into(), |&p| why_not(x, p));
            out.slow_nodes.push(format!(
                "node {} ({ranks_said}) was slow in every pair of the first pass (at most {first_best:.3} GB/s) and was not measured again ({why}): not confirmed",
                name(x)
            ));
            out.slow_node_ranks.extend(ranks);
        } else if let Some(&(p, g)) = tested.iter().find(|(_, g)| !slow(*g)) {
            out.cleared.push(format!(
                "{} was slow in every pair of the first pass (at most {first_best:.3} GB/s) but reached {g:.3} GB/s with {} when measured again: not named (a passing load, not the node)",
                name(x),
                name(p)
            ));
        } else {
            let with: Vec<String> = tested.iter().map(|&(p, _)| name(p)).collect();
            let most = tested.iter().map(|(_, g)| *g).fold(0.0, f64::max);
            out.slow_nodes.push(format!(
                "node {} ({ranks_said}) is slow with every good partner: at most {most:.3} GB/s with {} (measured again), where healthy node pairs reach {:.3} GB/s: drain {}",
                name(x),
                with.join(", "),
                plan.reference,
                name(x)
            ));
            out.slow_node_ranks.extend(ranks);
        }
    }
    for &(x, y) in &plan.links {
        let was = plan
            .slow
            .iter()
            .find(|p| (p.a, p.b) == (x, y))
            .map_or(0.0, |p| p.gbps);
        let link = format!("{}–{}", name(x), name(y));
        // What each end reaches with others, best first.
        let elsewhere = |n: u32, other: u32| {
            plan.first
                .iter()
                .chain(&measured)
                .filter(|p| touches(&(p.a, p.b), n) && !touches(&(p.a, p.b), other))
                .filter(|p| !slow(p.gbps))
                .max_by(|a, b| a.gbps.total_cmp(&b.gbps))
                .map(|p| {
                    let peer = if p.a == n { p.b } else { p.a };
                    format!("{}–{} {:.3} GB/s", name(n), name(peer), p.gbps)
                })
        };
        // What each end reaches with its other partners (their median,
        // both passes): a link is slow only against both ends' own rates,
        // so one end's burst of load elsewhere names no link.
        let median_of = |n: u32, other: u32| {
            median(
                plan.first
                    .iter()
                    .chain(&measured)
                    .filter(|p| touches(&(p.a, p.b), n) && !touches(&(p.a, p.b), other))
                    .map(|p| p.gbps)
                    .collect(),
            )
        };
        let local = [median_of(x, y), median_of(y, x)]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        let slow_link = |g: f64| slow(g) && g < local * SLOW;
        match again(x, y) {
            None => out.slow_links.push(format!(
                "the link {link} was slow in the first pass ({was:.3} GB/s) and was not measured again ({}): not confirmed",
                why_not(x, y)
            )),
            Some(g) if slow_link(g) => {
                let ends: Vec<String> = [elsewhere(x, y), elsewhere(y, x)].into_iter().flatten().collect();
                out.slow_links.push(format!(
                    "the link {link} is slow: {was:.3} GB/s in the first pass and {g:.3} GB/s when measured again, while {} and {} each reach full rate with other nodes ({}): drain neither; check the path between them",
                    name(x),
                    name(y),
                    ends.join(", ")
                ));
            }
            Some(g) => out.cleared.push(format!(
                "{link} was slow in the first pass ({was:.3} GB/s) but reached {g:.3} GB/s when measured again: not named"
            )),
        }
    }
    let mut notes: Vec<String> = Vec::new();
    if !plan.skipped.is_empty() {
        let s: Vec<String> = plan
            .skipped
            .iter()
            .map(|&(a, b)| format!("{}–{}", name(a), name(b)))
            .collect();
        notes.push(format!(
            "{} not measured again: the pass's {:.1} s (the time left before the run's deadline, at most --step-timeout) could not hold {}: {}",
            crate::values::count(s.len(), "pair"),
            plan.budget_ms as f64 / 1000.0,
            if s.len() == 1 { "it" } else { "them" },
            s.join(", ")
        ));
    }
    notes.extend(errors.iter().map(|e| e.to_string()));
    out.skipped = (!notes.is_empty()).then(|| notes.join("; "));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: u32, b: u32, gbps: f64) -> PairRate {
        PairRate { a, b, gbps }
    }

    fn hosts(n: u32) -> Vec<String> {
        (0..n).map(|h| format!("h{h}")).collect()
    }

    /// Every pair of `n` one-rank nodes at 1 GB/s, but those `slow` says.
    fn mesh(n: u32, slow: impl Fn(u32, u32) -> bool) -> Vec<PairRate> {
        let mut v = Vec::new();
        for a in 0..n {
            for b in a + 1..n {
                v.push(p(a, b, if slow(a, b) { 0.01 } else { 1.0 }));
            }
        }
        v
    }

    const MIB: usize = 1 << 20;
    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn a_slow_node_is_measured_again_with_good_partners_only() {
        for n in [3, 4, 6] {
            let plan = plan(n, &hosts(n), &mesh(n, |a, b| a == 2 || b == 2), MIB, LONG);
            assert_eq!(plan.nodes, vec![2], "{n}: {plan:?}");
            assert!(plan.links.is_empty(), "{plan:?}");
            let pairs: Vec<(u32, u32)> = plan.rounds.iter().flatten().copied().collect();
            assert_eq!(pairs.len(), PARTNERS.min(n as usize - 1), "{plan:?}");
            assert!(pairs.iter().all(|p| touches(p, 2)), "{plan:?}");
            assert!(plan.reason.starts_with("ran: "), "{}", plan.reason);
            assert!(
                plan.reason.contains("slow in every pair: h2"),
                "{}",
                plan.reason
            );
        }
    }

    #[test]
    fn a_slow_link_is_measured_again_by_itself() {
        let plan = plan(4, &hosts(4), &mesh(4, |a, b| (a, b) == (0, 1)), MIB, LONG);
        assert!(plan.nodes.is_empty(), "{plan:?}");
        assert_eq!(plan.links, vec![(0, 1)]);
        assert_eq!(plan.rounds, vec![vec![(0, 1)]]);
    }

    #[test]
    fn no_slow_pair_no_pass() {
        let plan = plan(4, &hosts(4), &mesh(4, |_, _| false), MIB, LONG);
        assert!(!plan.runs() && plan.rounds.is_empty());
        assert!(
            plan.reason.starts_with("not run: no slow node pair"),
            "{}",
            plan.reason
        );
        // Ranks on one node: no pair crosses the network.
        let one = vec!["h".to_string(); 4];
        let plan = plan_of(4, &one, &mesh(4, |a, _| a == 0));
        assert!(plan.reason.contains("crossed two nodes"), "{}", plan.reason);
        let two = plan_of(2, &hosts(2), &[p(0, 1, 0.001)]);
        assert!(two.reason.contains("two nodes"), "{}", two.reason);
    }

    fn plan_of(n: u32, h: &[String], first: &[PairRate]) -> Plan {
        plan(n, h, first, MIB, LONG)
    }

    /// Two ranks per node: the pairs become node pairs, played by each
    /// node's first rank; a pair on one node counts for nothing.
    #[test]
    fn ranks_are_played_by_their_nodes_first_rank() {
        let h: Vec<String> = (0..8).map(|r| format!("h{}", r / 2)).collect();
        let mut first = vec![p(0, 1, 0.001), p(6, 7, 0.001)];
        for a in 0..8u32 {
            for b in a + 1..8 {
                if a / 2 != b / 2 {
                    let slow = a / 2 == 3 || b / 2 == 3;
                    first.push(p(a, b, if slow { 0.01 } else { 1.0 }));
                }
            }
        }
        let plan = plan_of(8, &h, &first);
        assert_eq!(plan.first.len(), 6, "{plan:?}");
        assert_eq!(plan.nodes, vec![6], "{plan:?}");
        assert!(
            plan.rounds
                .iter()
                .flatten()
                .all(|&(a, b)| a % 2 == 0 && b % 2 == 0)
        );
    }

    #[test]
    fn a_budget_too_short_skips_and_says_so() {
        // 12 node suspects' worth of rounds at 0.01 GB/s: 0.5 s each.
        let n = 12;
        let first = mesh(n, |a, b| {
            a == 5 || b == 5 || (a, b) == (0, 1) || (a, b) == (2, 3)
        });
        let plan = plan(n, &hosts(n), &first, MIB, Duration::from_millis(1500));
        assert!(
            !plan.skipped.is_empty() && !plan.rounds.is_empty(),
            "{plan:?}"
        );
        let parts = [&Part {
            plan: Some(plan.clone()),
            ..Part::default()
        }];
        let sp = judge(&parts, &hosts(n), n).unwrap();
        let skipped = sp.skipped.unwrap();
        assert!(skipped.contains("could not hold"), "{skipped}");
        assert!(skipped.contains("1.5 s"), "{skipped}");
    }

    #[test]
    fn the_verdict_tells_the_node_from_the_link() {
        let n = 4;
        let h = hosts(n);
        let judged = |first: Vec<PairRate>, again: Vec<PairRate>| {
            let plan = plan(n, &h, &first, MIB, LONG);
            let parts = [&Part {
                plan: Some(plan),
                pairs: again,
                ..Part::default()
            }];
            judge(&parts, &h, n).unwrap()
        };
        // A slow node, slow again with every partner.
        let sp = judged(
            mesh(n, |a, b| a == 2 || b == 2),
            vec![p(0, 2, 0.012), p(1, 2, 0.011), p(2, 3, 0.01)],
        );
        assert_eq!(sp.slow_node_ranks, vec![2]);
        assert!(
            sp.slow_nodes[0].starts_with("node h2 (rank 2) is slow with every good partner"),
            "{:?}",
            sp.slow_nodes
        );
        assert!(
            sp.slow_nodes[0].ends_with("drain h2"),
            "{:?}",
            sp.slow_nodes
        );
        assert!(sp.slow_links.is_empty() && sp.cleared.is_empty());
        // The same suspect at full rate with one partner: cleared.
        let sp = judged(
            mesh(n, |a, b| a == 2 || b == 2),
            vec![p(0, 2, 0.9), p(1, 2, 0.011)],
        );
        assert!(sp.slow_nodes.is_empty(), "{sp:?}");
        assert!(
            sp.cleared[0].contains("reached 0.900 GB/s with h0"),
            "{sp:?}"
        );
        // A slow link, slow again: named, no node.
        let sp = judged(mesh(n, |a, b| (a, b) == (0, 1)), vec![p(0, 1, 0.01)]);
        assert!(
            sp.slow_nodes.is_empty() && sp.slow_node_ranks.is_empty(),
            "{sp:?}"
        );
        assert!(
            sp.slow_links[0].starts_with("the link h0–h1 is slow"),
            "{sp:?}"
        );
        assert!(sp.slow_links[0].contains("drain neither"), "{sp:?}");
        assert!(sp.slow_links[0].contains("h0–h3 1.000 GB/s"), "{sp:?}");
        // No part measured: not confirmed, and why.
        let sp = judged(mesh(n, |a, b| (a, b) == (0, 1)), vec![]);
        assert!(sp.slow_links[0].contains("not confirmed"), "{sp:?}");
        // No suspect: the pass did not run, and says so.
        let sp = judged(mesh(n, |_, _| false), vec![]);
        assert!(!sp.ran && sp.reason.starts_with("not run"), "{sp:?}");
    }

    #[test]
    fn a_block_round_trips_and_a_hostile_one_is_bounded() {
        let pairs = vec![p(1, 3, 0.5), p(1, 4, 2.0)];
        let b = encode(1234, &pairs);
        assert_eq!(b.len(), BLOCK);
        assert_eq!(decode(&b, 8), (1234, pairs));
        let mut bad = encode(5, &[p(1, 99, 1.0), p(1, 2, f64::NAN), p(2, 2, 1.0)]);
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&bad, 8), (5, vec![]));
    }
}
