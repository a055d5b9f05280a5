//! Rank 0's verdict on who is slow, from the pairwise round: nodes
//! starved of CPU, named by their own wait (`starved`); then the first
//! pass's stragglers (`straggler`) and the second pass's slow nodes
//! (`isolate`), judged from pairs without a starved rank, since a starved
//! rank's pairs are its own.

use super::straggler::{reference, stragglers};
use super::{isolate, starved};
use preflight_result::collective::{CpuWait, PairRate, SecondPass};

/// Who is slow, in words: nodes starved of CPU (by their own wait), then
/// the first pass's stragglers and the second pass's slow nodes, from
/// pairs without a starved rank (a starved rank's pairs are its own).
pub struct Verdict {
    pub stragglers: Vec<String>,
    pub ranks: Vec<u32>,
    pub second_pass: Option<SecondPass>,
    /// What the evidence could not settle, in words.
    pub unsettled: Vec<String>,
}

/// Rank 0's verdict on slowness, from the pairs (those worth judging),
/// the second pass's parts and every rank's wait for a CPU.
pub fn verdict(
    world: u32,
    judged: &[PairRate],
    hosts: &[String],
    host: &dyn Fn(u32) -> String,
    parts: &[&isolate::Part],
    waits: &[CpuWait],
) -> Verdict {
    let starved = starved::starved(waits, hosts);
    let starved_ranks: Vec<u32> = starved.iter().flat_map(|s| s.ranks.clone()).collect();
    let clean: Vec<PairRate> = judged
        .iter()
        .filter(|p| !starved_ranks.contains(&p.a) && !starved_ranks.contains(&p.b))
        .cloned()
        .collect();
    let (mut ranks, outvoted_not) = stragglers(world, &clean);
    let judged_again = isolate::judge(parts, hosts, world, &starved_ranks);
    // Where the second pass decided a node (found it slow, or cleared
    // it), its word stands for that node: a first-pass straggler there
    // gives way, and every rank of a node it found slow is marked. A node
    // it could not confirm keeps the first pass's word.
    let decided: &[String] = judged_again.as_ref().map_or(&[], |j| &j.decided);
    ranks.retain(|&r| !decided.contains(&isolate::node(hosts, r)));
    let slowest_of = |r: u32, rates: &[PairRate]| {
        rates
            .iter()
            .filter(|p| p.a == r || p.b == r)
            .map(|p| p.gbps)
            .fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))))
    };
    let mut out: Vec<String> = starved
        .iter()
        .map(|s| {
            let best = s
                .ranks
                .iter()
                .filter_map(|&r| slowest_of(r, judged))
                .fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))));
            s.describe(best)
        })
        .collect();
    out.extend(ranks.iter().map(|&r| {
        let reference = reference(r, &clean).unwrap_or(0.0);
        format!(
            "rank {r}{} is slow in every pair it is in: at most {:.3} GB/s, while the pairs without it reach {reference:.3} GB/s (their median)",
            host(r),
            slowest_of(r, &clean).unwrap_or(0.0)
        )
    }));
    let unsettled: Vec<String> = outvoted_not
        .iter()
        .filter(|r| !decided.contains(&isolate::node(hosts, **r)))
        .map(|&r| {
            format!(
                "rank {r}{} ran slow in every pair it is in (at most {:.3} GB/s), but with {world} ranks the pairs without it are too few to outvote its partners: the network evidence alone names no rank",
                host(r),
                slowest_of(r, &clean).unwrap_or(0.0)
            )
        })
        .collect();
    let second_pass = judged_again.map(|j| j.pass);
    ranks.extend(&starved_ranks);
    if let Some(sp) = &second_pass {
        out.extend(sp.slow_nodes.iter().cloned());
        ranks.extend(&sp.slow_node_ranks);
    }
    ranks.sort_unstable();
    ranks.dedup();
    Verdict {
        stragglers: out,
        ranks,
        second_pass,
        unsettled,
    }
}
