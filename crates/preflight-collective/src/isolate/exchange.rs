//! The first pass's table shared with every rank, and this rank's pairs
//! of the plan. Each rank adds the time it has left and what it takes for
//! each rank's node: ranks that disagree on the nodes would plan
//! different pairs and wait for partners that never come, so then no rank
//! runs the pass, and every rank says why.

use std::time::Duration;

use tokio::time::Instant;

use super::{Part, first_ranks, plan, touches};
use crate::Backend;
use crate::config::Config;
use crate::straggler::{self, MAX_ROUNDS};
use preflight_result::collective::PairRate;

/// Kept back before the run's deadline for publishing and the report.
const RESERVE: Duration = Duration::from_secs(1);
/// One rank's block of the shared table: the time it has left (ms), its
/// nodes' fingerprint, how many pairs it reports, and each pair (ranks,
/// GB/s); a rank reports at most one pair per round of the first pass.
const BLOCK: usize = 8 + 8 + 4 + MAX_ROUNDS * 16;

/// FNV-1a of each rank's node (its node's first rank): the same on every
/// rank that sees the same nodes.
fn fingerprint(hosts: &[String], world: u32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (r, f) in first_ranks(hosts, world) {
        for byte in r.to_le_bytes().into_iter().chain(f.to_le_bytes()) {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn encode(ms_left: u64, nodes: u64, pairs: &[PairRate]) -> Vec<u8> {
    let mut b = Vec::with_capacity(BLOCK);
    b.extend_from_slice(&ms_left.to_le_bytes());
    b.extend_from_slice(&nodes.to_le_bytes());
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

/// A block as its rank sent it (time left, fingerprint, pairs); a count
/// past the block, a rank outside the world or a rate that is not a
/// positive number is left out.
fn decode(block: &[u8], world: u32) -> (u64, u64, Vec<PairRate>) {
    let u32_at = |i: usize| u32::from_le_bytes(block[i..i + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |i: usize| u64::from_le_bytes(block[i..i + 8].try_into().unwrap_or([0; 8]));
    let n = (u32_at(16) as usize).min(MAX_ROUNDS);
    let pairs = (0..n)
        .map(|k| 20 + k * 16)
        .map(|at| PairRate {
            a: u32_at(at),
            b: u32_at(at + 4),
            gbps: f64::from_le_bytes(block[at + 8..at + 16].try_into().unwrap_or([0; 8])),
        })
        .filter(|p| p.a < world && p.b < world && p.a != p.b && p.gbps.is_finite() && p.gbps > 0.0)
        .collect();
    (u64_at(0), u64_at(8), pairs)
}

/// The shared table as a peer may send it (`fuzz/`): any bytes, cut into
/// blocks, decoded and planned from, for a world of up to 256 ranks
/// named by the first byte, on hosts of two ranks each.
#[cfg(feature = "fuzzing")]
pub fn plan_for_fuzzing(data: &[u8]) {
    let Some((&w, rest)) = data.split_first() else {
        return;
    };
    let world = u32::from(w).max(1);
    let hosts: Vec<String> = (0..world).map(|r| format!("h{}", r / 2)).collect();
    let mut all = Vec::new();
    let mut budget = Duration::from_secs(30);
    for block in rest.chunks(BLOCK).filter(|b| b.len() == BLOCK) {
        let (ms, _, pairs) = decode(block, world);
        budget = budget.min(Duration::from_millis(ms));
        all.extend(pairs);
    }
    let p = plan(world, &hosts, &all, 1 << 20, budget);
    let rounds: Vec<&(u32, u32)> = p.rounds.iter().flatten().collect();
    for r in &p.rounds {
        let mut seen = std::collections::BTreeSet::new();
        for &(a, b) in r {
            assert!(a < world && b < world && a != b, "{p:?}");
            assert!(
                seen.insert(a) && seen.insert(b),
                "a round's pairs share a rank: {p:?}"
            );
        }
    }
    assert!(p.controls.iter().all(|c| rounds.contains(&c)), "{p:?}");
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
    // Nothing of the pass waits past a second before the run's deadline.
    let last = cfg.until.map(|u| u.checked_sub(RESERVE).unwrap_or(u));
    let by = |d: Instant| last.map_or(d, |l| d.min(l));
    let left = last
        .map_or(cfg.step_timeout, |l| {
            l.saturating_duration_since(Instant::now())
        })
        .min(cfg.step_timeout);
    let nodes = fingerprint(hosts, world);
    let mut table = vec![0u8; BLOCK * world as usize];
    let shared = b
        .allgather(
            &encode(left.as_millis() as u64, nodes, own),
            &mut table,
            by(cfg.deadline(cfg.step_timeout)),
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
    let mut agree = true;
    for block in table.chunks_exact(BLOCK) {
        let (ms, theirs, pairs) = decode(block, world);
        budget = budget.min(Duration::from_millis(ms));
        agree &= theirs == nodes;
        all.extend(pairs);
    }
    let mut plan = plan(world, hosts, &all, bytes, budget);
    if !agree {
        plan.reason = "not run: the ranks do not agree on which rank runs on which node (a rank without rank 0's list of hosts)".into();
        plan.nodes.clear();
        plan.links.clear();
        plan.rounds.clear();
        plan.controls.clear();
    }
    let start = Instant::now();
    let end = by(start + budget);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn p(a: u32, b: u32, gbps: f64) -> PairRate {
        PairRate { a, b, gbps }
    }

    #[test]
    fn a_block_round_trips_and_a_hostile_one_is_bounded() {
        let pairs = vec![p(1, 3, 0.5), p(1, 4, 2.0)];
        let b = encode(1234, 77, &pairs);
        assert_eq!(b.len(), BLOCK);
        assert_eq!(decode(&b, 8), (1234, 77, pairs));
        let mut bad = encode(5, 1, &[p(1, 99, 1.0), p(1, 2, f64::NAN), p(2, 2, 1.0)]);
        bad[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&bad, 8), (5, 1, vec![]));
    }

    /// A rank that knows no hosts sees every rank as its own node: its
    /// fingerprint differs, and the pass runs nowhere.
    #[test]
    fn ranks_that_see_other_nodes_have_other_fingerprints() {
        let named: Vec<String> = (0..4).map(|r| format!("h{}", r / 2)).collect();
        let blind = vec![String::new(); 4];
        assert_eq!(fingerprint(&named, 4), fingerprint(&named.clone(), 4));
        assert_ne!(fingerprint(&named, 4), fingerprint(&blind, 4));
    }
}
