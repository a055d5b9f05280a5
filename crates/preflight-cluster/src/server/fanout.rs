//! The verdict's way out: rank 0 gets the whole report; every other rank
//! the verdict cut to what it needs (`for_rank`), the same for every rank
//! of one node, so rank 0 sends O(N) bytes in all, not O(N) to each of N
//! ranks; and the ranks' hosts go into the store for the collective
//! stage, which fetches them instead of every verdict carrying them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::events::Gathered;
use super::{ServerConfig, Writer};
use crate::barrier::ConnId;
use crate::protocol::{self, Msg};
use crate::store::Store;
use preflight_result::cluster::ClusterReport;

/// How long one rank's verdict frame may take to leave: a few kilobytes,
/// or for node mode's rank 0 the whole report, up to `MAX_FRAME`.
const VERDICT_WITHIN: Duration = Duration::from_millis(500);
const OWN_VERDICT_WITHIN: Duration = Duration::from_secs(5);
/// Verdict frames being written at once.
const SENDS_IN_FLIGHT: usize = 256;

/// Sends every connection its verdict; returns once every frame is out or
/// past its deadline. `left_ms`: what is left of the run's deadline.
pub(super) async fn send_verdicts(
    cfg: &ServerConfig,
    g: &mut Gathered,
    report: &ClusterReport,
    store: &Store,
    left_ms: u64,
) {
    // A node leader's connection carries several ranks: the lowest names
    // it (rank 0's own node's leader is rank 0).
    let state = &g.state;
    let mut rank_of: HashMap<ConnId, u32> = HashMap::new();
    for (conn, rank) in state
        .arrivals
        .iter()
        .map(|(rank, (conn, _))| (*conn, *rank))
        .chain(
            state
                .duplicates
                .iter()
                .chain(&state.out_of_range)
                .map(|(conn, c)| (*conn, c.identity.rank)),
        )
    {
        let r = rank_of.entry(conn).or_insert(rank);
        *r = (*r).min(rank);
    }
    let node_of = report.node_of_rank();
    let hosts = report.hosts_by_rank();
    // The store is empty of ours yet and holds 64 MiB: this cannot fail
    // below millions of ranks, and a rank that finds no list says so.
    let _ = store.set_large(
        crate::store::HOSTS_KEY,
        &serde_json::to_string(&hosts).unwrap_or_default(),
    );
    let views = report.rank_views();
    let duplicates: HashSet<ConnId> = state.duplicates.iter().map(|(c, _)| *c).collect();
    // Each connection's verdict is made when it is sent, a node's ranks
    // one after another so that one encoding serves them all, and a few
    // hundred frames in flight at most: at 16,384 nodes, every node's
    // frame made at once held a quarter of a gigabyte.
    let mut order: Vec<(Option<usize>, bool, ConnId, Writer)> = std::mem::take(&mut g.writers)
        .into_iter()
        .map(|(conn, w)| {
            let rank = rank_of.get(&conn).copied();
            let rank0 = rank == Some(0) && !duplicates.contains(&conn);
            (rank.and_then(|r| node_of.get(&r).copied()), rank0, conn, w)
        })
        .collect();
    order.sort_by_key(|(node, rank0, conn, _)| (*node, !*rank0, *conn));
    let mut sends = tokio::task::JoinSet::new();
    let mut last: Option<(Option<usize>, Arc<Vec<u8>>)> = None;
    // Every frame is out before the ranks stop waiting for it (their
    // verdict deadline is 3 s past the barrier's), and rank 0's own
    // process, which waits for this server to finish, with them.
    let send_by = cfg.deadline + Duration::from_millis(2500);
    for (node, rank0, _, w) in order {
        let (frame, within) = if rank0 && cfg.serving_rank.is_none() {
            // Node mode: rank 0 is another process, which reports the
            // whole report when it fits in a frame (else its node's cut,
            // which points at this one). Where rank 0 serves, its own
            // process takes the whole report from here (`rank_stage`).
            let full = protocol::encode(&Msg::Verdict {
                report: Box::new(report.clone()),
                left_ms,
            });
            let frame = if full.len() <= protocol::MAX_FRAME as usize {
                full
            } else {
                protocol::encode(&Msg::Verdict {
                    report: Box::new(views.view(node)),
                    left_ms,
                })
            };
            (Arc::new(frame), OWN_VERDICT_WITHIN)
        } else {
            let frame = match &last {
                Some((n, f)) if *n == node => Arc::clone(f),
                _ => {
                    let f = Arc::new(protocol::encode(&Msg::Verdict {
                        report: Box::new(views.view(node)),
                        left_ms,
                    }));
                    last = Some((node, Arc::clone(&f)));
                    f
                }
            };
            (frame, VERDICT_WITHIN)
        };
        while sends.len() >= SENDS_IN_FLIGHT {
            sends.join_next().await;
        }
        // Each frame's own deadline, from when it is written: a slow
        // reader is let go without making the frames after it late.
        sends.spawn(async move {
            let mut w = w.lock().await;
            let by = (Instant::now() + within).min(send_by);
            let _ = protocol::write_frame(&mut *w, &frame, by).await;
        });
    }
    drop(last);
    drop(views);
    while sends.join_next().await.is_some() {}
}
