//! The barrier's bookkeeping on rank 0: who checked in, who is missing and
//! where they were expected, who claimed a rank twice, who disagrees about
//! the world size, who went away. Pure state: the deadline is enforced by
//! the server loop that feeds it (`--timeout`, default 60 s).

use std::collections::BTreeMap;

use super::checkin::CheckIn;
use preflight_result::cluster::{Barrier, Duplicate, Lost, Mismatch, Missing};
use preflight_result::{CheckResult, Status};

pub type ConnId = u64;

/// Where each rank was expected to run, as far as the launcher says.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// Slurm's expanded nodelist: node index to host.
    pub nodelist: Vec<String>,
    /// Ranks per node in node order (Slurm's tasks per node, or node mode's
    /// ranks per node); empty: `local_world_size` on every node.
    pub tasks_per_node: Vec<u32>,
    pub local_world_size: u32,
    /// MASTER_ADDR: where node 0 runs.
    pub master_host: Option<String>,
}

impl Placement {
    /// The node of `rank`: ranks fill the nodes in order (Slurm's default
    /// block distribution, torchrun's and node mode's layout).
    pub fn node_of(&self, rank: u32) -> u32 {
        let mut first = 0u32;
        for (node, &count) in self.tasks_per_node.iter().enumerate() {
            first = first.saturating_add(count);
            if rank < first {
                return node as u32;
            }
        }
        rank / self.local_world_size.max(1)
    }

    /// Whether several ranks share a node.
    fn shared(&self) -> bool {
        self.local_world_size > 1 || self.tasks_per_node.iter().any(|&c| c > 1)
    }
}

pub struct BarrierState {
    pub world_size: u32,
    placement: Placement,
    /// The first check-in of each rank.
    pub arrivals: BTreeMap<u32, (ConnId, CheckIn)>,
    /// Later claimants of a rank that had already checked in.
    pub duplicates: Vec<(ConnId, CheckIn)>,
    pub out_of_range: Vec<(ConnId, CheckIn)>,
    lost: Vec<(u32, String, String)>,
    /// Rejected preflights of another job, counted per source address
    /// (at most `LISTED_SOURCES` addresses), and in all.
    other_jobs: BTreeMap<String, usize>,
    other_jobs_total: usize,
    /// The first few dropped connections, for the report.
    pub dropped: Vec<String>,
    /// All of them, however many.
    pub dropped_total: usize,
    /// Connections rank 0 could not accept (out of descriptors), and why
    /// the first one failed.
    pub accept_failures: usize,
    pub accept_error: Option<String>,
}

/// Second claimants and ranks outside the world kept for the report.
pub const KEPT_CLAIMANTS: usize = 64;

/// Source addresses listed one by one in the report: a flood from many
/// addresses is counted, not listed.
pub const LISTED_SOURCES: usize = 32;

impl BarrierState {
    /// A preflight of another job knocked: counted, and listed by source
    /// address up to `LISTED_SOURCES` of them.
    pub fn other_job(&mut self, peer: String) {
        self.other_jobs_total += 1;
        if self.other_jobs.len() < LISTED_SOURCES || self.other_jobs.contains_key(&peer) {
            *self.other_jobs.entry(peer).or_default() += 1;
        }
    }
}

/// A rank as the report names it: what it says of itself, and where its
/// connection came from when that differs (NAT, or a peer that lies).
pub fn who(c: &CheckIn) -> String {
    match &c.seen_from {
        Some(seen) if *seen != c.addr => {
            format!(
                "{} ({}, connected from {seen}) pid {}",
                c.hostname, c.addr, c.pid
            )
        }
        _ => format!("{} ({}) pid {}", c.hostname, c.addr, c.pid),
    }
}

impl BarrierState {
    pub fn new(world_size: u32, placement: Placement) -> BarrierState {
        BarrierState {
            world_size,
            placement,
            arrivals: BTreeMap::new(),
            duplicates: Vec::new(),
            out_of_range: Vec::new(),
            lost: Vec::new(),
            other_jobs: BTreeMap::new(),
            other_jobs_total: 0,
            dropped: Vec::new(),
            dropped_total: 0,
            accept_failures: 0,
            accept_error: None,
        }
    }

    /// Records a check-in: the first of its rank, a later claimant of a
    /// rank already here, or a rank outside the world. Of the last two, the
    /// first `KEPT_CLAIMANTS` each are kept: enough to name the fault, and
    /// a peer repeating its check-in cannot grow rank 0's memory.
    pub fn arrive(&mut self, conn: ConnId, checkin: CheckIn) {
        let rank = checkin.identity.rank;
        if rank >= self.world_size {
            if self.out_of_range.len() < KEPT_CLAIMANTS {
                self.out_of_range.push((conn, checkin));
            }
            return;
        }
        match self.arrivals.entry(rank) {
            std::collections::btree_map::Entry::Occupied(_) => {
                if self.duplicates.len() < KEPT_CLAIMANTS {
                    self.duplicates.push((conn, checkin))
                }
            }
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert((conn, checkin));
            }
        }
    }

    /// A connection closed before the verdict.
    /// A node leader's connection carries its node's ranks: all are lost
    /// with it.
    pub fn lose(&mut self, conn: ConnId, reason: &str) {
        let found: Vec<(u32, String)> = self
            .arrivals
            .iter()
            .filter(|(_, (c, _))| *c == conn)
            .map(|(r, (_, ci))| (*r, ci.hostname.clone()))
            .collect();
        for (rank, host) in found {
            self.arrivals.remove(&rank);
            self.lost.push((rank, host, reason.to_string()));
        }
    }

    pub fn complete(&self) -> bool {
        self.arrivals.len() as u32 == self.world_size
    }

    /// Every rank has either checked in or checked in and gone away: no
    /// one is left to wait for (a rank whose connection closed after its
    /// check-in does not come back), so the verdict need not wait for the
    /// deadline to name the lost ones.
    pub fn settled(&self) -> bool {
        if self.lost.is_empty() {
            return self.complete();
        }
        let gone = self
            .lost
            .iter()
            .map(|l| l.0)
            .filter(|r| !self.arrivals.contains_key(r))
            .collect::<std::collections::BTreeSet<u32>>()
            .len();
        self.arrivals.len() + gone == self.world_size as usize
    }

    /// `1 of 4 ranks checked in; missing: rank 1 (expected on h1), ...`:
    /// what the barrier waits for, the first few missing ranks named.
    pub fn waiting(&self) -> String {
        const SHOWN: usize = 4;
        let missing: Vec<String> = (0..self.world_size)
            .filter(|r| !self.arrivals.contains_key(r))
            .filter(|r| !self.lost.iter().any(|l| l.0 == *r))
            .take(SHOWN + 1)
            .map(|r| match self.expected_on(r) {
                Some(h) => format!("rank {r} (expected on {h})"),
                None => format!("rank {r}"),
            })
            .collect();
        let count = self.world_size as usize - self.arrivals.len();
        let mut text = format!(
            "{} of {} checked in",
            self.arrivals.len(),
            preflight_ground::values::count(self.world_size as usize, "rank")
        );
        if !missing.is_empty() {
            let shown: Vec<&str> = missing.iter().take(SHOWN).map(String::as_str).collect();
            text.push_str(&format!("; missing: {}", shown.join(", ")));
            if count > SHOWN {
                text.push_str(&format!(" and {} more", count - SHOWN));
            }
        }
        text
    }

    pub fn missing(&self) -> Vec<u32> {
        (0..self.world_size)
            .filter(|r| !self.arrivals.contains_key(r))
            .filter(|r| !self.lost.iter().any(|l| l.0 == *r))
            .collect()
    }

    /// Where a rank was expected: the nodelist's host for its node, else a
    /// host where another rank of the same node checked in, else the
    /// master's host for node 0, else its node rank.
    fn expected_on(&self, rank: u32) -> Option<String> {
        let p = &self.placement;
        let node = p.node_of(rank);
        if let Some(h) = p.nodelist.get(node as usize) {
            return Some(h.clone());
        }
        if let Some((_, c)) = self
            .arrivals
            .values()
            .find(|(_, c)| p.shared() && p.node_of(c.identity.rank) == node)
        {
            return Some(format!("{} ({})", c.hostname, c.addr));
        }
        if let (0, Some(master)) = (node, &p.master_host) {
            return Some(master.clone());
        }
        if p.shared() || p.nodelist.is_empty() {
            return Some(format!("node rank {node}"));
        }
        None
    }

    pub fn summary(&self, waited_ms: u64) -> Barrier {
        let mut dups: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for (_, c) in &self.duplicates {
            let rank = c.identity.rank;
            let entry = dups.entry(rank).or_insert_with(|| {
                self.arrivals
                    .get(&rank)
                    .map(|(_, first)| vec![who(first)])
                    .unwrap_or_default()
            });
            entry.push(who(c));
        }
        let mismatch = self
            .arrivals
            .values()
            .map(|(_, c)| c)
            .chain(self.duplicates.iter().map(|(_, c)| c))
            .filter(|c| c.identity.world_size != self.world_size)
            .map(|c| Mismatch {
                rank: c.identity.rank,
                node: who(c),
                world_size: c.identity.world_size,
            })
            .collect();
        let missing = self.missing();
        Barrier {
            complete: self.complete() && self.duplicates.is_empty(),
            waited_ms,
            missing_count: missing.len(),
            missing_ranks: preflight_ground::values::rank_ranges(&missing),
            missing: missing
                .iter()
                .take(MISSING_LISTED)
                .map(|&rank| Missing {
                    rank,
                    expected_on: self.expected_on(rank),
                })
                .collect(),
            duplicates: dups
                .into_iter()
                .map(|(rank, claimants)| Duplicate { rank, claimants })
                .collect(),
            world_size_mismatch: mismatch,
            out_of_range: self
                .out_of_range
                .iter()
                .map(|(_, c)| Mismatch {
                    rank: c.identity.rank,
                    node: who(c),
                    world_size: c.identity.world_size,
                })
                .collect(),
            connections: self
                .arrivals
                .values()
                .map(|(conn, _)| *conn)
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            lost: self
                .lost
                .iter()
                .map(|(rank, node, reason)| Lost {
                    rank: *rank,
                    node: node.clone(),
                    reason: reason.clone(),
                })
                .collect(),
            other_job_clients: self
                .other_jobs
                .iter()
                .map(|(peer, n)| match n {
                    1 => peer.clone(),
                    n => format!("{peer} ({n} times)"),
                })
                .collect(),
            other_job_total: self.other_jobs_total,
            dropped: self.dropped.clone(),
            dropped_total: self.dropped_total,
        }
    }
}

/// Missing ranks kept with their hosts in the report, and named one by one
/// in the message; the rest are given as ranges.
pub const MISSING_LISTED: usize = 256;
const MISSING_NAMED: usize = 16;

pub const MISSING_HINT: &str = "Start the missing ranks (is the node up, did the launcher reach it?); give every process a distinct RANK and the same WORLD_SIZE.";

/// What to do, for the problems the barrier found: each its own remedy.
fn hint(b: &Barrier) -> String {
    let mut out: Vec<&str> = Vec::new();
    if b.missing_count > 0 && !b.other_job_clients.is_empty() {
        out.push("Give every rank the same PREFLIGHT_TOKEN (or PREFLIGHT_TOKEN_FILE): a rank with another one is refused before it can check in.");
    }
    if b.missing_count > 0 {
        out.push("Start the missing ranks (is the node up, did the launcher reach it?).");
    }
    if !b.world_size_mismatch.is_empty() || !b.out_of_range.is_empty() {
        out.push("Start every rank with the same WORLD_SIZE, and RANK below it: the launcher's node count times ranks per node, the same on every node (a rank started by an older or another launcher line?).");
    }
    if !b.duplicates.is_empty() {
        out.push("Give every process a distinct RANK: two launchers, or a RANK set by hand, start the same rank twice.");
    }
    if !b.lost.is_empty() {
        out.push("Look at the node whose ranks went away (dmesg, the launcher's log): it checked in, then died or was killed.");
    }
    if out.is_empty() {
        MISSING_HINT.to_string()
    } else {
        out.join(" ")
    }
}

/// The barrier as a check result: what went wrong, every culprit named.
/// `window` says how long the barrier waited: `within 1m`, or up to the
/// signal that closed it.
pub fn result(b: &Barrier, world_size: u32, window: &str) -> CheckResult {
    let mut problems = Vec::new();
    if b.missing_count > 0 {
        let mut list: Vec<String> = b
            .missing
            .iter()
            .take(MISSING_NAMED)
            .map(|m| match &m.expected_on {
                Some(h) => format!("rank {} (expected on {h})", m.rank),
                None => format!("rank {}", m.rank),
            })
            .collect();
        if b.missing_count > list.len() {
            list.push(format!("... (all missing: ranks {})", b.missing_ranks));
        }
        problems.push(format!(
            "{} of {world_size} ranks never checked in {window}: {}",
            b.missing_count,
            list.join(", ")
        ));
    }
    for d in &b.duplicates {
        problems.push(format!(
            "rank {} claimed by {} processes: {}",
            d.rank,
            d.claimants.len(),
            d.claimants.join(" and ")
        ));
    }
    for m in &b.world_size_mismatch {
        problems.push(format!(
            "rank {} on {} says WORLD_SIZE={}, rank 0 says {world_size}",
            m.rank, m.node, m.world_size
        ));
    }
    for m in &b.out_of_range {
        problems.push(format!(
            "a process on {} claims rank {}, outside the world of {world_size}",
            m.node, m.rank
        ));
    }
    // A node that dies loses all its ranks at once: one line per node and
    // cause, its ranks as ranges.
    let mut lost: Vec<(&str, &str, Vec<u32>)> = Vec::new();
    for l in &b.lost {
        match lost
            .iter_mut()
            .find(|(node, reason, _)| *node == l.node && *reason == l.reason)
        {
            Some((_, _, ranks)) => ranks.push(l.rank),
            None => lost.push((&l.node, &l.reason, vec![l.rank])),
        }
    }
    for (node, reason, mut ranks) in lost {
        ranks.sort_unstable();
        problems.push(format!(
            "{} {} on {node} checked in, then went away before the verdict ({reason})",
            if ranks.len() == 1 { "rank" } else { "ranks" },
            preflight_ground::values::rank_ranges(&ranks)
        ));
    }
    // A rank with another secret is refused before it can say which rank
    // it is: while ranks are missing, its knocking is the likely why.
    if b.missing_count > 0 && !b.other_job_clients.is_empty() {
        problems.push(format!(
            "meanwhile {} with another job secret came from {}: a rank started with another PREFLIGHT_TOKEN is likely a missing one",
            preflight_ground::values::count(b.other_job_total.max(b.other_job_clients.len()), "connection"),
            b.other_job_clients.join(", ")
        ));
    }
    let (status, message, hint) = if problems.is_empty() {
        (
            Status::Pass,
            format!(
                "all {} checked in ({} ms)",
                preflight_ground::values::count(world_size as usize, "rank"),
                b.waited_ms
            ),
            None,
        )
    } else {
        (
            Status::Fail,
            preflight_ground::values::listed(&problems, "; ", MISSING_NAMED),
            Some(hint(b)),
        )
    };
    let mut r = CheckResult::built_in(
        "cluster.barrier",
        "barrier",
        "cluster",
        status,
        message,
        hint,
    );
    if !b.world_size_mismatch.is_empty() {
        r.about.variables.push("WORLD_SIZE".into());
    }
    r.measured = Some(format!(
        "{} of {world_size} checked in",
        (world_size as usize)
            .saturating_sub(b.missing_count)
            .saturating_sub(b.lost.len())
    ));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkin::CheckIn;

    fn checkin(rank: u32, world: u32, host: &str) -> CheckIn {
        crate::checkin::sample(rank, world, host)
    }

    #[test]
    fn repeated_claimants_are_kept_up_to_a_bound() {
        let mut b = BarrierState::new(2, Placement::default());
        b.arrive(0, checkin(1, 2, "h1"));
        for i in 0..1000 {
            b.arrive(i + 1, checkin(1, 2, "h1"));
            b.arrive(i + 2000, checkin(7, 2, "h1"));
        }
        assert_eq!(b.duplicates.len(), KEPT_CLAIMANTS);
        assert_eq!(b.out_of_range.len(), KEPT_CLAIMANTS);
    }

    #[test]
    fn a_huge_missing_list_stays_small() {
        // The verdict travels in one frame to every rank: it must fit at any
        // world size.
        let mut b = BarrierState::new(1_000_000, Placement::default());
        b.arrive(1, checkin(0, 1_000_000, "h0"));
        let summary = b.summary(10);
        assert_eq!(summary.missing_count, 999_999);
        assert_eq!(summary.missing.len(), MISSING_LISTED);
        assert_eq!(summary.missing_ranks, "1-999999");
        let r = result(&summary, 1_000_000, "1s");
        assert!(
            r.message.ends_with("... (all missing: ranks 1-999999)"),
            "{}",
            r.message
        );
        assert!(r.message.len() < 2000, "{}", r.message.len());
    }

    #[test]
    fn missing_duplicate_mismatch_lost_and_out_of_range_are_all_named() {
        let nodes = ["h0", "h1", "h2", "h3", "h4"].map(String::from).to_vec();
        let placement = Placement {
            nodelist: nodes,
            local_world_size: 1,
            ..Placement::default()
        };
        let mut b = BarrierState::new(5, placement);
        b.arrive(1, checkin(0, 5, "h0"));
        b.arrive(2, checkin(1, 5, "h1"));
        b.arrive(3, checkin(1, 5, "h9"));
        b.arrive(4, checkin(2, 6, "h2"));
        b.arrive(5, checkin(7, 5, "h7"));
        b.arrive(6, checkin(3, 5, "h3"));
        b.lose(6, "the peer closed the connection");
        assert!(!b.complete());
        let r = result(&b.summary(10), 5, "within 1s");
        assert_eq!(r.status, Status::Fail);
        for want in [
            "rank 4 (expected on h4)",
            "rank 1 claimed by 2 processes: h1",
            "h9",
            "WORLD_SIZE=6, rank 0 says 5",
            "claims rank 7",
            "rank 3 on h3 checked in, then went away",
        ] {
            assert!(r.message.contains(want), "{want}: {}", r.message);
        }
        // A lost rank is not also reported missing.
        assert!(!r.message.contains("rank 3 (expected"), "{}", r.message);
    }

    #[test]
    fn uneven_slurm_nodes_name_the_host_of_each_missing_rank() {
        // SLURM_TASKS_PER_NODE=2(x3),1 over gpu[001-004]: ranks 0-1 on
        // gpu001, 2-3 on gpu002, 4-5 on gpu003, 6 on gpu004.
        let placement = Placement {
            nodelist: ["gpu001", "gpu002", "gpu003", "gpu004"]
                .map(String::from)
                .to_vec(),
            tasks_per_node: vec![2, 2, 2, 1],
            local_world_size: 2,
            master_host: None,
        };
        assert_eq!(
            (0..7).map(|r| placement.node_of(r)).collect::<Vec<_>>(),
            vec![0, 0, 1, 1, 2, 2, 3]
        );
        let mut b = BarrierState::new(7, placement);
        for r in [0, 1, 2, 4] {
            b.arrive(u64::from(r) + 1, checkin(r, 7, "x"));
        }
        let r = result(&b.summary(10), 7, "within 1s");
        for want in [
            "rank 3 (expected on gpu002)",
            "rank 5 (expected on gpu003)",
            "rank 6 (expected on gpu004)",
        ] {
            assert!(r.message.contains(want), "{want}: {}", r.message);
        }
    }

    #[test]
    fn node_mode_names_a_node_that_never_started_where_it_can() {
        // Three nodes of two ranks, no nodelist: node 0's host is the
        // master's; node 1's is where its other rank checked in; node 2 is
        // known only by its index.
        let placement = Placement {
            nodelist: Vec::new(),
            tasks_per_node: vec![2, 2, 2],
            local_world_size: 2,
            master_host: Some("head".into()),
        };
        let mut b = BarrierState::new(6, placement);
        let mut c = checkin(3, 6, "n1");
        c.addr = "10.0.0.2".into();
        b.arrive(1, c);
        let r = result(&b.summary(10), 6, "within 1s");
        for want in [
            "rank 0 (expected on head)",
            "rank 1 (expected on head)",
            "rank 2 (expected on n1 (10.0.0.2))",
            "rank 4 (expected on node rank 2)",
        ] {
            assert!(r.message.contains(want), "{want}: {}", r.message);
        }
    }

    #[test]
    fn all_present_is_a_pass() {
        let mut b = BarrierState::new(2, Placement::default());
        b.arrive(1, checkin(0, 2, "a"));
        b.arrive(2, checkin(1, 2, "b"));
        assert!(b.complete());
        assert_eq!(result(&b.summary(5), 2, "within 1s").status, Status::Pass);
    }
}
