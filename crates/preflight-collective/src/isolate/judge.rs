//! Rank 0: what the second pass found. Its figures are judged against
//! the control pairs measured alongside them (two good nodes, one flow
//! each, as the suspects' pairs), which the suspect is not part of; where
//! no control could run (three nodes: a suspect's partners cannot outvote
//! it), the network evidence names nobody. A suspect is named only on
//! what was measured: slow with every partner measured (a node), or slow
//! again against both its nodes' own rates (a link); a suspect measured
//! at full rate is cleared; one not measured again is not confirmed, and
//! says why. A node starved of CPU (`starved`) is named by its own wait,
//! not here, and a pair with one of its ranks is evidence against nobody
//! else.

use super::{Part, Plan, first_ranks, median, node, ordered, touches};
use crate::ending::rank_list;
use crate::straggler::SLOW;
use preflight_result::collective::{PairRate, SecondPass};

/// The pass's report, and the nodes it decided (found slow or cleared),
/// whose first-pass stragglers give way to it.
pub struct Judged {
    pub pass: SecondPass,
    pub decided: Vec<String>,
}

/// Rank 0: what the pass found, from its plan and every rank's part.
pub fn judge(parts: &[&Part], hosts: &[String], world: u32, starved: &[u32]) -> Option<Judged> {
    let plan = parts.iter().find_map(|p| p.plan.as_ref())?;
    if !plan.runs() {
        return Some(Judged {
            pass: SecondPass {
                ran: false,
                reason: plan.reason.clone(),
                reference_gbps: plan.reference,
                ..SecondPass::default()
            },
            decided: Vec::new(),
        });
    }
    let measured: Vec<PairRate> = parts.iter().flat_map(|p| p.pairs.clone()).collect();
    let errors: Vec<&str> = parts.iter().filter_map(|p| p.error.as_deref()).collect();
    // What a starved rank was in says nothing of its partner.
    let evidence: Vec<PairRate> = measured
        .iter()
        .filter(|p| !starved.contains(&p.a) && !starved.contains(&p.b))
        .cloned()
        .collect();
    let verdict = Verdict {
        plan,
        hosts,
        measured: &evidence,
        errors: &errors,
        against: against(plan, &evidence),
    };
    let mut out = SecondPass {
        ran: true,
        reason: plan.reason.clone(),
        pairs: measured.clone(),
        reference_gbps: plan.reference,
        ms: parts.iter().map(|p| p.ms).max().unwrap_or(0),
        ..SecondPass::default()
    };
    let mut decided = Vec::new();
    let firsts = first_ranks(hosts, world);
    for &x in &plan.nodes {
        let ranks: Vec<u32> = firsts
            .iter()
            .filter(|(_, f)| **f == x)
            .map(|(r, _)| *r)
            .collect();
        if ranks.iter().any(|r| starved.contains(r)) {
            // Named by its own wait for a CPU.
            decided.push(node(hosts, x));
            continue;
        }
        match verdict.node(x, &ranks) {
            Said::Slow(m) => {
                out.slow_nodes.push(m);
                out.slow_node_ranks.extend(ranks);
                decided.push(node(hosts, x));
            }
            Said::Cleared(m) => {
                out.cleared.push(m);
                decided.push(node(hosts, x));
            }
            Said::Unconfirmed(m) => out.unconfirmed.push(m),
        }
    }
    for &(x, y) in &plan.links {
        if starved.contains(&x) || starved.contains(&y) {
            continue;
        }
        match verdict.link(x, y) {
            Said::Slow(m) => out.slow_links.push(m),
            Said::Cleared(m) => out.cleared.push(m),
            Said::Unconfirmed(m) => out.unconfirmed.push(m),
        }
    }
    let mut notes: Vec<String> = Vec::new();
    if !plan.skipped.is_empty() {
        let s: Vec<String> = plan
            .skipped
            .iter()
            .map(|&(a, b)| format!("{}–{}", node(hosts, a), node(hosts, b)))
            .collect();
        notes.push(format!(
            "{} not measured again: {} could not hold {}: {}",
            preflight_ground::values::count(s.len(), "pair"),
            budget(plan),
            if s.len() == 1 { "it" } else { "them" },
            s.join(", ")
        ));
    }
    notes.extend(errors.iter().map(|e| e.to_string()));
    out.skipped = (!notes.is_empty()).then(|| notes.join("; "));
    out.slow_node_ranks.sort_unstable();
    Some(Judged { pass: out, decided })
}

/// What the second pass's figures are judged against, and how to say it:
/// the control pairs measured alongside, two good nodes that are not the
/// suspect. None ran: nothing to judge against (the first pass's figures
/// are of the same suspect's partners, which cannot outvote it).
fn against(plan: &Plan, measured: &[PairRate]) -> Option<(f64, String)> {
    let controls: Vec<f64> = measured
        .iter()
        .filter(|p| plan.controls.contains(&(p.a, p.b)))
        .map(|p| p.gbps)
        .collect();
    let m = median(controls.clone())?;
    Some((
        m,
        format!(
            "control pairs of good nodes measured alongside reach {m:.3} GB/s ({})",
            preflight_ground::values::count(controls.len(), "pair")
        ),
    ))
}

fn budget(plan: &Plan) -> String {
    format!(
        "the pass's {:.1} s (the time left before the run's deadline, at most --step-timeout)",
        plan.budget_ms as f64 / 1000.0
    )
}

enum Said {
    Slow(String),
    Cleared(String),
    Unconfirmed(String),
}

struct Verdict<'a> {
    plan: &'a Plan,
    hosts: &'a [String],
    measured: &'a [PairRate],
    errors: &'a [&'a str],
    against: Option<(f64, String)>,
}

impl Verdict<'_> {
    fn name(&self, r: u32) -> String {
        node(self.hosts, r)
    }

    fn again(&self, a: u32, b: u32) -> Option<f64> {
        let want = ordered(a, b);
        self.measured
            .iter()
            .find(|p| (p.a, p.b) == want)
            .map(|p| p.gbps)
    }

    /// Why a pair of the plan has no figure.
    fn why_not(&self, a: u32, b: u32) -> String {
        if self.plan.skipped.contains(&ordered(a, b)) {
            format!("{} could not hold it", budget(self.plan))
        } else if let Some(e) = self.errors.first() {
            e.to_string()
        } else {
            "no rank reported it".into()
        }
    }

    fn first_of(&self, x: u32) -> impl Iterator<Item = &PairRate> {
        self.plan
            .first
            .iter()
            .filter(move |p| touches(&(p.a, p.b), x))
    }

    fn node(&self, x: u32, ranks: &[u32]) -> Said {
        let name = self.name(x);
        let who = format!("node {name} ({})", rank_list(ranks));
        let was = median(self.first_of(x).map(|p| p.gbps).collect()).unwrap_or(0.0);
        let partners: Vec<u32> = self
            .plan
            .rounds
            .iter()
            .flatten()
            .chain(&self.plan.skipped)
            .filter(|p| touches(p, x) && !self.plan.controls.contains(p))
            .map(|&(a, b)| if a == x { b } else { a })
            .collect();
        let tested: Vec<(u32, f64)> = partners
            .iter()
            .filter_map(|&p| Some((p, self.again(x, p)?)))
            .collect();
        let unconfirmed = |why: String| {
            Said::Unconfirmed(format!(
                "{who}: its pairs ran at {was:.3} GB/s (median) in the first pass, not confirmed: {why}"
            ))
        };
        if tested.is_empty() {
            let why = partners
                .first()
                .map_or("no good partner".into(), |&p| self.why_not(x, p));
            return unconfirmed(format!("not measured again ({why})"));
        }
        let Some((reference, said)) = &self.against else {
            return unconfirmed(format!(
                "no control pair of two other good nodes ran beside it (of {} nodes, its partners alone cannot outvote it): the network evidence alone names no node",
                self.plan
                    .first
                    .iter()
                    .flat_map(|p| [p.a, p.b])
                    .collect::<std::collections::BTreeSet<u32>>()
                    .len()
            ));
        };
        if let Some(&(p, g)) = tested.iter().find(|(_, g)| *g >= reference * SLOW) {
            return Said::Cleared(format!(
                "{name}: its pairs ran at {was:.3} GB/s (median) in the first pass, but {g:.3} GB/s with {} when measured again, where {said}: not named (a passing load, not the node)",
                self.name(p)
            ));
        }
        let with: Vec<String> = tested.iter().map(|&(p, _)| self.name(p)).collect();
        let most = tested.iter().map(|(_, g)| *g).fold(0.0, f64::max);
        let of = if tested.len() == partners.len() {
            format!("every good partner ({})", tested.len())
        } else {
            format!(
                "every good partner measured ({} of {}; the others left out)",
                tested.len(),
                partners.len()
            )
        };
        Said::Slow(format!(
            "{who} is slow with {of}: at most {most:.3} GB/s with {}, where {said}: drain {name}",
            with.join(", ")
        ))
    }

    fn link(&self, x: u32, y: u32) -> Said {
        let link = format!("{}–{}", self.name(x), self.name(y));
        let was = self
            .plan
            .first
            .iter()
            .find(|p| (p.a, p.b) == (x, y))
            .map_or(0.0, |p| p.gbps);
        let Some((reference, said)) = &self.against else {
            return Said::Unconfirmed(format!(
                "the link {link}: {was:.3} GB/s in the first pass, not confirmed: no control pair of two other good nodes ran beside it"
            ));
        };
        let Some(g) = self.again(x, y) else {
            return Said::Unconfirmed(format!(
                "the link {link}: {was:.3} GB/s in the first pass, not confirmed: not measured again ({})",
                self.why_not(x, y)
            ));
        };
        // What each end reaches with its other partners (their median,
        // both passes): a link is slow only against both ends' own rates
        // as well, so one end's burst of load elsewhere names no link.
        let others = |n: u32, other: u32| {
            self.plan
                .first
                .iter()
                .chain(self.measured)
                .filter(move |p| touches(&(p.a, p.b), n) && !touches(&(p.a, p.b), other))
        };
        let local = [x, y]
            .into_iter()
            .zip([y, x])
            .filter_map(|(n, o)| median(others(n, o).map(|p| p.gbps).collect()))
            .fold(f64::INFINITY, f64::min);
        if g < reference * SLOW && g < local * SLOW {
            let best = |n: u32, o: u32| {
                others(n, o)
                    .max_by(|a, b| a.gbps.total_cmp(&b.gbps))
                    .map(|p| {
                        let peer = if p.a == n { p.b } else { p.a };
                        format!("{}–{} {:.3} GB/s", self.name(n), self.name(peer), p.gbps)
                    })
            };
            let ends: Vec<String> = [best(x, y), best(y, x)].into_iter().flatten().collect();
            return Said::Slow(format!(
                "the link {link} is slow: {was:.3} GB/s in the first pass and {g:.3} GB/s when measured again, where {said}, while {} and {} each reach full rate with other nodes ({}): drain neither; check the path between them",
                self.name(x),
                self.name(y),
                ends.join(", ")
            ));
        }
        Said::Cleared(format!(
            "{link} was slow in the first pass ({was:.3} GB/s) but reached {g:.3} GB/s when measured again: not named"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan;
    use super::super::plan::tests::{hosts, mesh, p};
    use super::*;
    use std::time::Duration;

    const MIB: usize = 1 << 20;

    fn judged(n: u32, h: &[String], first: Vec<PairRate>, again: Vec<PairRate>) -> Judged {
        let plan = plan(n, h, &first, MIB, Duration::from_secs(30));
        let parts = [&Part {
            plan: Some(plan),
            pairs: again,
            ..Part::default()
        }];
        judge(&parts, h, n, &[]).unwrap()
    }

    #[test]
    fn the_verdict_tells_the_node_from_the_link() {
        let n = 4;
        let h = hosts(n);
        let bad2 = || mesh(n, |a, b| a == 2 || b == 2);
        // A slow node, slow again with every partner, the controls fast.
        let controls = || vec![p(1, 3, 1.1), p(0, 3, 1.0), p(0, 1, 0.9)];
        let mut again = vec![p(0, 2, 0.012), p(1, 2, 0.011), p(2, 3, 0.01)];
        again.extend(controls());
        let j = judged(n, &h, bad2(), again);
        let sp = &j.pass;
        assert_eq!(sp.slow_node_ranks, vec![2]);
        assert_eq!(j.decided, vec!["h2".to_string()]);
        assert!(
            sp.slow_nodes[0].starts_with("node h2 (rank 2) is slow with every good partner (3): at most 0.012 GB/s with h0, h1, h3, where control pairs of good nodes measured alongside reach 1.000 GB/s (3 pairs): drain h2"),
            "{:?}",
            sp.slow_nodes
        );
        assert!(sp.slow_links.is_empty() && sp.cleared.is_empty() && sp.unconfirmed.is_empty());
        // At full rate with one partner: cleared.
        let mut again = vec![p(0, 2, 0.9), p(1, 2, 0.011)];
        again.extend(controls());
        let j = judged(n, &h, bad2(), again);
        assert!(j.pass.slow_nodes.is_empty(), "{:?}", j.pass);
        assert!(
            j.pass.cleared[0].contains("0.900 GB/s with h0 when measured again"),
            "{:?}",
            j.pass
        );
        // Two of three partners measured: said so.
        let mut again = vec![p(0, 2, 0.012), p(1, 2, 0.011)];
        again.extend(controls());
        let j = judged(n, &h, bad2(), again);
        assert!(
            j.pass.slow_nodes[0].contains("every good partner measured (2 of 3"),
            "{:?}",
            j.pass
        );
        // Not measured again: not confirmed, not marked, not decided.
        let j = judged(n, &h, bad2(), vec![]);
        assert!(
            j.pass.slow_node_ranks.is_empty() && j.decided.is_empty(),
            "{:?}",
            j.pass
        );
        assert!(
            j.pass.unconfirmed[0].contains("not confirmed: not measured again"),
            "{:?}",
            j.pass
        );
        // A slow link, slow again: named, no node.
        let j = judged(
            n,
            &h,
            mesh(n, |a, b| (a, b) == (0, 1)),
            vec![p(0, 1, 0.01), p(2, 3, 1.0)],
        );
        let sp = &j.pass;
        assert!(
            sp.slow_nodes.is_empty() && sp.slow_node_ranks.is_empty(),
            "{sp:?}"
        );
        assert!(
            sp.slow_links[0].starts_with("the link h0–h1 is slow"),
            "{sp:?}"
        );
        assert!(sp.slow_links[0].contains("drain neither"), "{sp:?}");
        // No suspect: the pass did not run, and says so.
        let j = judged(n, &h, mesh(n, |_, _| false), vec![]);
        assert!(
            !j.pass.ran && j.pass.reason.starts_with("not run"),
            "{:?}",
            j.pass
        );
    }

    /// Several ranks per node: the first pass's figures are of several
    /// flows at once. A node whose one flow is fast against them but slow
    /// against the control pair measured beside it is still found slow;
    /// without a control it is not confirmed, never cleared.
    #[test]
    fn one_flow_is_judged_against_one_flow() {
        let h: Vec<String> = (0..8).map(|r| format!("h{}", r / 2)).collect();
        let mut first = Vec::new();
        for a in 0..8u32 {
            for b in a + 1..8 {
                if a / 2 != b / 2 {
                    let slow = a / 2 == 3 || b / 2 == 3;
                    first.push(p(a, b, if slow { 0.1 } else { 1.0 }));
                }
            }
        }
        // Alone, the slow node's one flow reaches 0.8 (above a third of the
        // first pass's 1.0), while a good pair's reaches 8.
        let plan = plan(8, &h, &first, MIB, Duration::from_secs(30));
        assert_eq!(plan.nodes, vec![6]);
        let mut again: Vec<PairRate> = plan
            .rounds
            .iter()
            .flatten()
            .map(|&(a, b)| {
                p(
                    a,
                    b,
                    if plan.controls.contains(&(a, b)) {
                        8.0
                    } else {
                        0.8
                    },
                )
            })
            .collect();
        let j = judged(8, &h, first.clone(), again.clone());
        assert_eq!(j.pass.slow_node_ranks, vec![6, 7], "{:?}", j.pass);
        again.retain(|q| !plan.controls.contains(&(q.a, q.b)));
        let j = judged(8, &h, first, again);
        assert!(
            j.pass.slow_nodes.is_empty() && j.pass.cleared.is_empty(),
            "{:?}",
            j.pass
        );
        assert!(
            j.pass.unconfirmed[0].contains("no control pair"),
            "{:?}",
            j.pass
        );
    }

    #[test]
    fn what_the_budget_could_not_hold_is_said() {
        let n = 12;
        let h = hosts(n);
        let first = mesh(n, |a, b| a == 5 || b == 5);
        let plan = plan(n, &h, &first, MIB, Duration::from_millis(1500));
        let parts = [&Part {
            plan: Some(plan),
            ..Part::default()
        }];
        let skipped = judge(&parts, &h, n, &[]).unwrap().pass.skipped.unwrap();
        assert!(
            skipped.starts_with("2 pairs not measured again: the pass's 1.5 s (the time left before the run's deadline, at most --step-timeout) could not hold them: h"),
            "{skipped}"
        );
    }
}
