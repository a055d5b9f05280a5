//! Stragglers: a pairwise round. Ranks are paired by the circle method
//! (round-robin tournament): N−1 rounds of disjoint pairs for even N, N
//! rounds with one rank idle for odd N, so every pair meets once. Above
//! `MAX_ROUNDS` rounds only the first `MAX_ROUNDS` are run: a documented
//! sample in which every rank still meets `MAX_ROUNDS` distinct partners
//! (bounding the round at O(MAX_ROUNDS) exchanges whatever N).
//!
//! In each pair both ranks send `bytes` at once (full duplex) after a
//! one-byte handshake (so a late partner's delay is not counted), an
//! untimed exchange and then `REPEATS` timed ones; the pair's rate is bytes
//! / the slower side's time (a throttled sender only shows on its
//! receiver's side) in its best repetition: a throttled link is slow every
//! time, while a rank that merely lost the CPU for a moment (several ranks
//! on few cores) is not. A rank is named as the straggler when every pair
//! it is in runs below a third of the median of the pairs without it: slow
//! in every pair it is in, so the fault is its own. (Against the fastest
//! pair, one pair that happened to run alone on the cores framed a healthy
//! rank; the median of the others does not move for one pair.)
//!
//! The schedule runs twice, the second time in reverse order, each pair
//! keeping its best. On a loaded machine a burst of other work can fall on
//! the rounds in which one rank's good pairs run and spare the round of a
//! pair without it: in one pass that frames a healthy rank (seen: rank 0
//! "slow in every pair it is in" beside a throttled host, on a machine
//! compiling at the same time; rank 0 does no more than its peers during
//! the round, whose results are published after it). A burst must now fall
//! on the same pairs in two passes, in different places of the order.

use tokio::time::Instant;

use super::{Backend, OpError};
use preflight_result::collective::PairRate;

pub const MAX_ROUNDS: usize = 8;
/// Timed exchanges per pair and pass; the best counts.
const REPEATS: usize = 3;
/// Exchanges of the whole buffer in one `measure`: the untimed one and
/// the timed ones (for estimating how long a pair takes).
pub const EXCHANGES: usize = 1 + REPEATS;
/// Passes over the schedule (the second reversed).
const PASSES: usize = 2;
/// A pair slower than this fraction of what the pairs it is judged
/// against reach (their median) is slow.
pub const SLOW: f64 = 1.0 / 3.0;

/// Rounds of disjoint pairs (a < b).
pub fn schedule(n: u32, max_rounds: usize) -> Vec<Vec<(u32, u32)>> {
    if n < 2 {
        return Vec::new();
    }
    // Odd N: a phantom rank n sits out one real rank per round.
    let m = if n.is_multiple_of(2) { n } else { n + 1 };
    let rounds = (m - 1) as usize;
    let mut out = Vec::new();
    for round in 0..rounds.min(max_rounds) {
        let mut pairs = Vec::new();
        // Rank m-1 is fixed; the others rotate.
        let rot = |i: u32| (i + round as u32) % (m - 1);
        let mut add = |a: u32, b: u32| {
            if a < n && b < n {
                pairs.push((a.min(b), a.max(b)));
            }
        };
        add(m - 1, rot(0));
        for k in 1..m / 2 {
            add(rot(k), rot(m - 1 - k));
        }
        out.push(pairs);
    }
    out
}

/// This rank's part of the round; the lower rank of each pair reports it,
/// with the slower side's time.
pub async fn round<B: Backend>(
    b: &mut B,
    bytes: usize,
    deadline: impl Fn() -> Instant,
) -> Result<Vec<PairRate>, OpError> {
    let me = b.rank();
    // Each pair this rank reports (it is the lower rank), in the order
    // first met, with its best time.
    let mut best: Vec<((u32, u32), f64)> = Vec::new();
    // Written before any timing, so no page is faulted in while timed.
    let send = vec![0x5au8; bytes];
    let mut recv = vec![0xffu8; bytes];
    let rounds = schedule(b.world(), MAX_ROUNDS);
    let order = (0..PASSES).flat_map(|pass| {
        let mut r: Vec<&Vec<(u32, u32)>> = rounds.iter().collect();
        if pass % 2 == 1 {
            r.reverse();
        }
        r
    });
    for pairs in order {
        let Some(&(x, y)) = pairs.iter().find(|(x, y)| *x == me || *y == me) else {
            continue;
        };
        let peer = if x == me { y } else { x };
        let secs = measure(b, peer, &send, &mut recv, deadline()).await?;
        if me == x {
            match best.iter_mut().find(|(p, _)| *p == (x, y)) {
                Some((_, t)) => *t = t.min(secs),
                None => best.push(((x, y), secs)),
            }
        }
    }
    Ok(best
        .into_iter()
        .map(|((a, b), secs)| PairRate {
            a,
            b,
            gbps: bytes as f64 / secs / 1e9,
        })
        .collect())
}

/// One pair's time for `send.len()` bytes each way, both ranks calling it
/// with the other as `peer`: a one-byte handshake (so a late partner's
/// delay is not counted), an untimed exchange, then `REPEATS` timed ones.
/// A sender's part ends when the kernel has taken its bytes, which a grown
/// socket buffer does at once however slow the link: only the receiver
/// sees a throttled sender. A repetition's time is the longer of the two
/// sides'; the pair's, the best repetition's (seconds, never zero).
pub async fn measure<B: Backend>(
    b: &mut B,
    peer: u32,
    send: &[u8],
    recv: &mut [u8],
    deadline: Instant,
) -> Result<f64, OpError> {
    let mut one = [0u8; 1];
    b.sendrecv(&[1], peer, &mut one, peer, deadline).await?;
    b.sendrecv(send, peer, recv, peer, deadline).await?;
    let mut mine = [0u8; 8 * REPEATS];
    for t in mine.chunks_exact_mut(8) {
        let start = Instant::now();
        b.sendrecv(send, peer, recv, peer, deadline).await?;
        t.copy_from_slice(&start.elapsed().as_secs_f64().to_le_bytes());
    }
    let mut theirs = [0u8; 8 * REPEATS];
    b.sendrecv(&mine, peer, &mut theirs, peer, deadline).await?;
    let secs = |b: &[u8]| f64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    Ok(mine
        .chunks_exact(8)
        .zip(theirs.chunks_exact(8))
        .map(|(m, t)| secs(m).max(secs(t)))
        .fold(f64::INFINITY, f64::min)
        .max(1e-9))
}

/// What the pairs without rank `r` reach: their median rate. The median,
/// not the best: one pair that happened to run fast (alone on the cores
/// for a moment) must not make every other rank look slow beside it.
pub fn reference(r: u32, rates: &[PairRate]) -> Option<f64> {
    preflight_ground::values::median(
        rates
            .iter()
            .filter(|p| p.a != r && p.b != r)
            .map(|p| p.gbps)
            .collect(),
    )
}

/// Ranks slow in every pair they are in: each below a third of what the
/// pairs without them reach. The second list: ranks that are, but whose
/// pairs without them involve fewer than three other ranks (three ranks
/// in all: one pair without it), too few to outvote its partners, so the
/// network evidence alone names them not.
pub fn stragglers(n: u32, rates: &[PairRate]) -> (Vec<u32>, Vec<u32>) {
    let slow: Vec<u32> = (0..n)
        .filter(|&r| {
            let Some(reference) = reference(r, rates).filter(|x| *x > 0.0) else {
                return false;
            };
            let mine: Vec<&PairRate> = rates.iter().filter(|p| p.a == r || p.b == r).collect();
            !mine.is_empty() && mine.iter().all(|p| p.gbps < reference * SLOW)
        })
        .collect();
    let voters = |r: u32| {
        let mut others: Vec<u32> = rates
            .iter()
            .filter(|p| p.a != r && p.b != r)
            .flat_map(|p| [p.a, p.b])
            .collect();
        others.sort_unstable();
        others.dedup();
        others.len()
    };
    slow.into_iter().partition(|&r| voters(r) >= 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pair_meets_once_and_pairs_are_disjoint() {
        for n in 2..12u32 {
            let rounds = schedule(n, usize::MAX);
            let mut seen = std::collections::HashSet::new();
            for pairs in &rounds {
                let mut used = std::collections::HashSet::new();
                for &(a, b) in pairs {
                    assert!(a < b && b < n);
                    assert!(used.insert(a) && used.insert(b), "n={n}: not disjoint");
                    assert!(seen.insert((a, b)), "n={n}: pair twice");
                }
            }
            assert_eq!(seen.len() as u32, n * (n - 1) / 2, "n={n}");
        }
        assert_eq!(schedule(100, MAX_ROUNDS).len(), MAX_ROUNDS);
    }

    #[test]
    fn the_node_slow_in_every_pair_is_named() {
        let p = |a, b, gbps| PairRate { a, b, gbps };
        let rates = [
            p(0, 1, 3.0),
            p(0, 2, 0.01),
            p(1, 2, 0.012),
            p(0, 3, 2.5),
            p(1, 3, 2.8),
            p(2, 3, 0.01),
        ];
        assert_eq!(stragglers(4, &rates), (vec![2], vec![]));
        // Two ranks: no pair without either, nobody can be blamed.
        assert_eq!(stragglers(2, &[p(0, 1, 0.001)]), (vec![], vec![]));
        // Three: one pair without it, which cannot outvote its partners.
        let three = [p(0, 1, 3.0), p(0, 2, 0.01), p(1, 2, 0.012)];
        assert_eq!(stragglers(3, &three), (vec![], vec![2]));
    }

    /// The loaded-machine case seen once: beside a throttled rank 2, the
    /// one pair without ranks 0 and 2 ran fast while rank 0's ran at a
    /// quarter of it. Against the best pair rank 0 looked slow everywhere;
    /// against the median of the pairs without it (two of them slow for
    /// rank 2's link) it is not, and rank 2 still is.
    #[test]
    fn one_fast_pair_frames_nobody() {
        let p = |a, b, gbps| PairRate { a, b, gbps };
        let rates = [
            p(0, 1, 0.838),
            p(0, 2, 0.012),
            p(0, 3, 0.80),
            p(1, 2, 0.011),
            p(1, 3, 3.236),
            p(2, 3, 0.012),
        ];
        assert_eq!(stragglers(4, &rates), (vec![2], vec![]));
    }
}
