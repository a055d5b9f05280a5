//! What the second pass measures, from the first pass's table: the
//! suspects, their good partners, a control pair per round, and the
//! rounds the budget holds. Every rank computes it from the same table
//! and budget, so every rank runs the same pairs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{PARTNERS, Plan, first_ranks, median, node, node_pairs, ordered, touches};
use crate::straggler::{EXCHANGES, SLOW};
use preflight_result::collective::PairRate;

/// A round's estimate is its slowest pair's bytes over the first pass's
/// rate, plus this for the handshakes.
const ROUND_OVERHEAD: Duration = Duration::from_millis(20);
/// The plan must fit its budget this many times over.
const MARGIN: f64 = 2.0;

/// The plan, from every rank's first-pass pairs and the budget.
///
/// A node is a suspect when its median pair runs below a third of the
/// nodes' median (a slow node drags down its own pairs only, however many
/// slow nodes there are, as long as they are fewer than half); a pair is
/// a suspect link when it runs below a third of what both of its nodes
/// reach (their median pair), neither node a suspect.
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
    let mut rates_of: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for p in &first {
        rates_of.entry(p.a).or_default().push(p.gbps);
        rates_of.entry(p.b).or_default().push(p.gbps);
    }
    let node_median: BTreeMap<u32, f64> = rates_of
        .iter()
        .filter_map(|(n, v)| Some((*n, median(v.clone())?)))
        .collect();
    let overall = median(node_median.values().copied().collect()).unwrap_or(0.0);
    let suspects: Vec<u32> = node_median
        .iter()
        .filter(|(_, m)| **m < overall * SLOW)
        .map(|(n, _)| *n)
        .collect();
    let is_suspect = |n: u32| suspects.binary_search(&n).is_ok();
    let links: Vec<(u32, u32)> = first
        .iter()
        .filter(|p| !is_suspect(p.a) && !is_suspect(p.b))
        .filter(|p| p.gbps < node_median[&p.a].min(node_median[&p.b]) * SLOW)
        .map(|p| (p.a, p.b))
        .collect();
    let link_set: BTreeSet<(u32, u32)> = links.iter().copied().collect();
    let reference = median(
        first
            .iter()
            .filter(|p| !is_suspect(p.a) && !is_suspect(p.b) && !link_set.contains(&(p.a, p.b)))
            .map(|p| p.gbps)
            .collect(),
    )
    .unwrap_or(overall);
    let several_ranks = {
        let firsts = first_ranks(hosts, world);
        firsts.iter().any(|(r, f)| r != f)
    };
    let mut plan = Plan {
        first: first.clone(),
        reference,
        nodes: suspects.clone(),
        links: links.clone(),
        budget_ms: budget.as_millis() as u64,
        several_ranks,
        ..Plan::default()
    };
    if suspects.is_empty() && links.is_empty() {
        plan.reason = format!(
            "not run: no slow node or node pair in the first pass ({} node pairs, median {reference:.3} GB/s)",
            first.len()
        );
        return plan;
    }
    // Partners: nodes that are not suspects, those in no suspect link
    // first.
    let in_links = |n: u32| links.iter().filter(|l| touches(l, n)).count();
    let mut good: Vec<u32> = node_median
        .keys()
        .copied()
        .filter(|&n| !is_suspect(n))
        .collect();
    good.sort_by_key(|&n| (in_links(n), n));
    let said = |v: &[u32]| v.iter().map(|&n| name(n)).collect::<Vec<_>>().join(", ");
    if good.is_empty() {
        plan.reason = format!(
            "not run: every node is slow ({}): no node ran at full rate to measure the others against",
            said(&suspects)
        );
        plan.nodes.clear();
        plan.links.clear();
        return plan;
    }
    let met: BTreeSet<(u32, u32)> = first.iter().map(|p| (p.a, p.b)).collect();
    // Each suspect with up to PARTNERS good nodes, a different first
    // partner for each suspect where there are enough, those it has not
    // met yet first (new evidence); then each suspect link again.
    let mut wanted: Vec<(u32, u32)> = Vec::new();
    for (i, &x) in suspects.iter().enumerate() {
        let mut partners = good.clone();
        let turn = i % partners.len();
        partners.rotate_left(turn);
        partners.sort_by_key(|&p| met.contains(&ordered(x, p)));
        wanted.extend(partners.into_iter().take(PARTNERS).map(|p| ordered(x, p)));
    }
    for &l in &links {
        if !wanted.contains(&l) {
            wanted.push(l);
        }
    }
    // Disjoint rounds, filled in order; then in each, a control pair of
    // two good nodes left free, not a suspect link.
    let mut rounds: Vec<Vec<(u32, u32)>> = Vec::new();
    for &(a, b) in &wanted {
        let free = |r: &Vec<(u32, u32)>| !r.iter().any(|p| touches(p, a) || touches(p, b));
        match rounds.iter_mut().find(|r| free(r)) {
            Some(r) => r.push((a, b)),
            None => rounds.push(vec![(a, b)]),
        }
    }
    for r in &mut rounds {
        let free: Vec<u32> = good
            .iter()
            .copied()
            .filter(|&n| !r.iter().any(|p| touches(p, n)))
            .collect();
        let control = free.iter().enumerate().find_map(|(i, &a)| {
            free[i + 1..]
                .iter()
                .map(|&b| ordered(a, b))
                .find(|p| !link_set.contains(p))
        });
        if let Some(c) = control {
            r.push(c);
            plan.controls.push(c);
        }
    }
    // Each round's time at the first pass's rates; the rounds that fit.
    let rate_of: BTreeMap<(u32, u32), f64> = first.iter().map(|p| ((p.a, p.b), p.gbps)).collect();
    let best_of = |n: u32| {
        rates_of
            .get(&n)
            .map_or(0.0, |v| v.iter().copied().fold(0.0, f64::max))
    };
    let estimate = |p: &(u32, u32)| {
        let rate = rate_of
            .get(p)
            .copied()
            .unwrap_or_else(|| best_of(p.0).min(best_of(p.1)))
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
            plan.skipped
                .extend(r.into_iter().filter(|p| !plan.controls.contains(p)));
        }
    }
    plan.controls
        .retain(|c| plan.rounds.iter().flatten().any(|p| p == c));
    let mut reason = format!(
        "ran: the first pass's node pairs reach {reference:.3} GB/s (the median of those between good nodes)"
    );
    if !suspects.is_empty() {
        let m: Vec<String> = suspects
            .iter()
            .map(|&n| format!("{} {:.3}", name(n), node_median[&n]))
            .collect();
        reason.push_str(&format!(
            "; slow nodes (their median pair, GB/s): {}, each measured again with up to {PARTNERS} good nodes",
            m.join(", ")
        ));
    }
    if !links.is_empty() {
        let l: Vec<String> = links
            .iter()
            .map(|&(a, b)| format!("{}–{} {:.3}", name(a), name(b), rate_of[&(a, b)]))
            .collect();
        reason.push_str(&format!(
            "; slow pairs between nodes that run at full rate elsewhere (GB/s): {}, measured again",
            l.join(", ")
        ));
    }
    plan.reason = reason;
    plan
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::isolate) fn p(a: u32, b: u32, gbps: f64) -> PairRate {
        PairRate { a, b, gbps }
    }

    pub(in crate::isolate) fn hosts(n: u32) -> Vec<String> {
        (0..n).map(|h| format!("h{h}")).collect()
    }

    /// Every pair of `n` one-rank nodes at 1 GB/s, but those `slow` says.
    pub(in crate::isolate) fn mesh(n: u32, slow: impl Fn(u32, u32) -> bool) -> Vec<PairRate> {
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

    fn measured(plan: &Plan) -> Vec<(u32, u32)> {
        plan.rounds
            .iter()
            .flatten()
            .filter(|p| !plan.controls.contains(p))
            .copied()
            .collect()
    }

    #[test]
    fn a_slow_node_is_measured_again_with_good_partners_and_a_control() {
        for n in [3, 4, 6] {
            let plan = plan(n, &hosts(n), &mesh(n, |a, b| a == 2 || b == 2), MIB, LONG);
            assert_eq!(plan.nodes, vec![2], "{n}: {plan:?}");
            assert!(plan.links.is_empty(), "{plan:?}");
            let pairs = measured(&plan);
            assert_eq!(pairs.len(), PARTNERS.min(n as usize - 1), "{plan:?}");
            assert!(pairs.iter().all(|p| touches(p, 2)), "{plan:?}");
            // A control pair of two good nodes in every round where two
            // are free (none with three nodes).
            let want = if n == 3 { 0 } else { plan.rounds.len() };
            assert_eq!(plan.controls.len(), want, "{n}: {plan:?}");
            assert!(plan.controls.iter().all(|c| !touches(c, 2)));
            assert!(plan.reason.starts_with("ran: "), "{}", plan.reason);
            assert!(
                plan.reason
                    .contains("slow nodes (their median pair, GB/s): h2 0.010"),
                "{}",
                plan.reason
            );
        }
    }

    /// Two slow nodes of five: each is a suspect (a pair between them
    /// looks like any other pair of theirs, so pairs alone would miss
    /// them).
    #[test]
    fn two_slow_nodes_of_five_are_both_suspects() {
        let plan = plan(5, &hosts(5), &mesh(5, |a, b| a >= 3 || b >= 3), MIB, LONG);
        assert_eq!(plan.nodes, vec![3, 4], "{plan:?}");
        assert!(plan.links.is_empty(), "{plan:?}");
        assert!((plan.reference - 1.0).abs() < 1e-9, "{plan:?}");
    }

    #[test]
    fn a_slow_link_is_measured_again_by_itself() {
        for n in [3, 4] {
            let plan = plan(n, &hosts(n), &mesh(n, |a, b| (a, b) == (0, 1)), MIB, LONG);
            assert!(plan.nodes.is_empty(), "{plan:?}");
            assert_eq!(plan.links, vec![(0, 1)]);
            assert_eq!(measured(&plan), vec![(0, 1)]);
        }
    }

    #[test]
    fn no_slow_pair_no_pass() {
        let plan = plan(4, &hosts(4), &mesh(4, |_, _| false), MIB, LONG);
        assert!(!plan.runs() && plan.rounds.is_empty());
        assert!(
            plan.reason
                .starts_with("not run: no slow node or node pair"),
            "{}",
            plan.reason
        );
        // Ranks on one node: no pair crosses the network.
        let one = vec!["h".to_string(); 4];
        let plan = super::plan(4, &one, &mesh(4, |a, _| a == 0), MIB, LONG);
        assert!(plan.reason.contains("crossed two nodes"), "{}", plan.reason);
        let two = super::plan(2, &hosts(2), &[p(0, 1, 0.001)], MIB, LONG);
        assert!(two.reason.contains("two nodes"), "{}", two.reason);
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
        let plan = plan(8, &h, &first, MIB, LONG);
        assert_eq!(plan.first.len(), 6, "{plan:?}");
        assert_eq!(plan.nodes, vec![6], "{plan:?}");
        assert!(plan.several_ranks);
        assert!(
            plan.rounds
                .iter()
                .flatten()
                .all(|&(a, b)| a % 2 == 0 && b % 2 == 0)
        );
    }

    #[test]
    fn a_budget_too_short_skips_the_rounds_it_cannot_hold() {
        // One slow node among 12 at 0.01 GB/s: 0.5 s a round.
        let n = 12;
        let first = mesh(n, |a, b| a == 5 || b == 5);
        let plan = plan(n, &hosts(n), &first, MIB, Duration::from_millis(1500));
        assert_eq!(plan.rounds.len(), 1, "{plan:?}");
        assert_eq!(plan.skipped.len(), 2, "{plan:?}");
        assert!(plan.skipped.iter().all(|p| touches(p, 5)), "{plan:?}");
    }
}
