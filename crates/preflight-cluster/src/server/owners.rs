//! Who may write which store keys: a rank writes its own keys only
//! (`store::owner`), and only as the first process that checked in as
//! that rank; a node leader's connection writes for the ranks it checked
//! in until each attaches on a connection of its own, once.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::barrier::ConnId;

#[derive(Default)]
pub(super) struct Owners {
    /// Rank to the connection that first checked in as it.
    first: Mutex<HashMap<u32, ConnId>>,
    /// Ranks a node leader checked in (not the first on its connection)
    /// that have not attached on their own connection yet.
    relayed: Mutex<HashSet<u32>>,
}

impl Owners {
    /// `rank` checked in on `conn`, whose first check-in was `first`: it
    /// owns the rank's keys unless another connection came first.
    pub(super) fn check_in(&self, conn: ConnId, rank: u32, first: u32) {
        let mut owners = self.first.lock().unwrap_or_else(|e| e.into_inner());
        if let std::collections::hash_map::Entry::Vacant(slot) = owners.entry(rank) {
            slot.insert(conn);
            if rank != first {
                self.relayed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(rank);
            }
        }
    }

    /// Why this connection may not write `key`, if it may not.
    pub(super) fn may_write(
        &self,
        conn: ConnId,
        rank: Option<u32>,
        key: &str,
    ) -> Result<(), String> {
        let Some(rank) = rank else {
            return Err("store: this connection has not checked in, and may not write".into());
        };
        // The key's rank must be one this connection checked in (or
        // attached) as, first.
        let owner = crate::store::owner(key);
        let first = self
            .first
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&owner)
            .copied();
        match first {
            Some(c) if c == conn => Ok(()),
            _ if owner == rank => Err(format!(
                "store: another process checked in as rank {rank} first; this one may not write"
            )),
            _ => Err(format!(
                "store: `{key}` is rank {owner}'s to write, and this connection is rank {rank}'s"
            )),
        }
    }

    /// The ranks whose keys `conn` writes: those it checked in first, or
    /// attached as.
    pub(super) fn ranks_of(&self, conn: ConnId) -> Vec<u32> {
        let owners = self.first.lock().unwrap_or_else(|e| e.into_inner());
        let mut ranks: Vec<u32> = owners
            .iter()
            .filter(|(_, c)| **c == conn)
            .map(|(r, _)| *r)
            .collect();
        ranks.sort_unstable();
        ranks
    }

    /// A rank that its node leader checked in takes its store keys over
    /// on its own connection, once; a rank that checked in itself, or one
    /// attached already, is refused.
    pub(super) fn attach(&self, conn: ConnId, rank: u32) -> Result<(), String> {
        let mut owners = self.first.lock().unwrap_or_else(|e| e.into_inner());
        let mut relayed = self.relayed.lock().unwrap_or_else(|e| e.into_inner());
        // Taken out of `relayed` on success: a rank attaches once.
        if !relayed.remove(&rank) {
            return Err(format!(
                "store: rank {rank} was not checked in by its node's leader, or has attached already"
            ));
        }
        owners.insert(rank, conn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaders_ranks_write_through_it_until_each_attaches_once() {
        let o = Owners::default();
        // Connection 1, a node leader, checks in ranks 2 and 3.
        o.check_in(1, 2, 2);
        o.check_in(1, 3, 2);
        assert!(o.may_write(1, Some(2), "coll/tcp/addr/3").is_ok());
        assert!(o.may_write(1, Some(2), "coll/tcp/addr/4").is_err());
        // A second claimant of rank 2 owns nothing.
        o.check_in(9, 2, 2);
        let e = o.may_write(9, Some(2), "coll/tcp/addr/2").unwrap_err();
        assert!(
            e.contains("another process checked in as rank 2 first"),
            "{e}"
        );
        // Rank 3 attaches on its own connection, once, and writes there;
        // rank 2 checked in itself (first on its connection) and cannot.
        assert!(o.attach(4, 3).is_ok());
        assert!(o.may_write(4, Some(3), "coll/tcp/addr/3").is_ok());
        assert!(o.may_write(1, Some(2), "coll/tcp/addr/3").is_err());
        assert!(o.attach(5, 3).is_err());
        assert!(o.attach(6, 2).is_err());
        assert!(o.may_write(7, None, "x").is_err());
        // Whose keys each connection writes now: the leader's ends for
        // rank 2 only, the second claimant's for none.
        assert_eq!(o.ranks_of(1), [2]);
        assert_eq!(o.ranks_of(4), [3]);
        assert!(o.ranks_of(9).is_empty());
    }
}
