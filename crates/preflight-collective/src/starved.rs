//! Nodes starved of CPU during the pairwise round, from each rank's own
//! wait for a CPU (`CpuWait`: run-queue delay and cgroup throttling, as
//! the kernel accounts them). A starved rank makes every pair it is in
//! slow, so the network evidence points at it and at its partners alike;
//! its own wait points at it alone. A starved node is named by its wait,
//! and its partners' slow pairs are evidence against nobody.
//!
//! "Starved" is judged against the other nodes of the same run, so that
//! a machine where every rank waits (busy loops on every core) names
//! nobody: a node's ranks waited at least four fifths of the round, and a
//! quarter of the round more than the other nodes' median. (At half the
//! round, a healthy rank 0 among busy loops was once named: 51 % against
//! the others' 20 %, in a round of under a second.)

use super::isolate::node;
use preflight_ground::values::median;
use preflight_result::collective::CpuWait;

/// The least part of the round a starved node waited for a CPU.
pub const STARVED: f64 = 0.8;
/// How much more than the other nodes' median it waited.
pub const ABOVE_OTHERS: f64 = 0.25;

/// A starved node: its name, its ranks, its wait and the others'.
#[derive(Debug, Clone, PartialEq)]
pub struct Starved {
    pub node: String,
    pub ranks: Vec<u32>,
    /// Its ranks' longest wait, as a part of the round.
    pub share: f64,
    /// The other nodes' median.
    pub others: f64,
}

impl Starved {
    /// The finding, in words.
    pub fn describe(&self, slowest_pair: Option<f64>) -> String {
        let pairs = slowest_pair
            .map(|g| format!(", and its pairs ran at {g:.3} GB/s at best"))
            .unwrap_or_default();
        format!(
            "node {} ({}) is starved of CPU: its ranks waited {:.0} % of the pairwise round for a CPU (the other nodes {:.0} %){pairs}; its partners' slow pairs are its own: look at what else runs there or its CPU limit (cgroup cpu.max), or drain {}",
            self.node,
            super::ending::rank_list(&self.ranks),
            self.share * 100.0,
            self.others * 100.0,
            self.node
        )
    }
}

/// Each node's longest rank wait, by node name, in rank order of first
/// appearance.
fn by_node(waits: &[CpuWait], hosts: &[String]) -> Vec<(String, Vec<u32>, f64)> {
    let mut out: Vec<(String, Vec<u32>, f64)> = Vec::new();
    for w in waits {
        let name = node(hosts, w.rank);
        match out.iter_mut().find(|(n, _, _)| *n == name) {
            Some((_, ranks, share)) => {
                ranks.push(w.rank);
                *share = share.max(w.share());
            }
            None => out.push((name, vec![w.rank], w.share())),
        }
    }
    out
}

/// The starved nodes; none where fewer than two nodes measured their
/// wait (nothing to compare with).
pub fn starved(waits: &[CpuWait], hosts: &[String]) -> Vec<Starved> {
    let nodes = by_node(waits, hosts);
    if nodes.len() < 2 {
        return Vec::new();
    }
    nodes
        .iter()
        .filter_map(|(name, ranks, share)| {
            let others = median(
                nodes
                    .iter()
                    .filter(|(n, _, _)| n != name)
                    .map(|(_, _, s)| *s)
                    .collect(),
            )?;
            (*share >= STARVED && *share >= others + ABOVE_OTHERS).then(|| Starved {
                node: name.clone(),
                ranks: ranks.clone(),
                share: *share,
                others,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(rank: u32, pct: u64) -> CpuWait {
        CpuWait {
            rank,
            waited_ms: pct * 10,
            wall_ms: 1000,
        }
    }

    fn hosts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("h{i}")).collect()
    }

    #[test]
    fn a_node_that_waited_far_more_than_the_others_is_starved() {
        let s = starved(&[w(0, 3), w(1, 2), w(2, 92)], &hosts(3));
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].node, "h2");
        assert_eq!(s[0].ranks, vec![2]);
        assert!(
            s[0].describe(Some(0.012)).starts_with(
                "node h2 (rank 2) is starved of CPU: its ranks waited 92 % of the pairwise round for a CPU (the other nodes 2 %), and its pairs ran at 0.012 GB/s at best"
            ),
            "{}",
            s[0].describe(Some(0.012))
        );
    }

    #[test]
    fn a_machine_where_every_rank_waits_names_nobody() {
        assert!(starved(&[w(0, 70), w(1, 64), w(2, 81)], &hosts(3)).is_empty());
        // Starved beside busy neighbours: still named.
        let s = starved(&[w(0, 60), w(1, 55), w(2, 97)], &hosts(3));
        assert_eq!(
            s.iter().map(|s| s.node.as_str()).collect::<Vec<_>>(),
            ["h2"]
        );
        // A little wait is no starvation, however far above the others;
        // nor is half the round beside busy neighbours (seen once, on a
        // healthy rank 0).
        assert!(starved(&[w(0, 1), w(1, 1), w(2, 40)], &hosts(3)).is_empty());
        assert!(starved(&[w(0, 51), w(1, 20), w(2, 18)], &hosts(3)).is_empty());
        // One node: nothing to compare with.
        assert!(starved(&[w(0, 99)], &hosts(1)).is_empty());
    }

    #[test]
    fn a_nodes_ranks_count_together() {
        let h: Vec<String> = ["a", "a", "b", "b"].iter().map(|s| s.to_string()).collect();
        let s = starved(&[w(0, 2), w(1, 90), w(2, 3), w(3, 4)], &h);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].node.as_str(), s[0].ranks.clone()), ("a", vec![0, 1]));
    }
}
