//! Admission before authentication: how many connections may still be
//! proving the job's secret at once, in all and from one address, and the
//! accept loop that keeps to it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;

use super::Event;
use super::connection::Serving;
use crate::store;
use crate::unproven::Unproven;

/// Connections still authenticating at once, at most; beyond the limit
/// the next connection waits in the accept queue, so a flood of junk
/// connections cannot exhaust memory or descriptors.
const MAX_PENDING: usize = 4096;

/// How many connections may authenticate at once, in all and from one
/// source address: half the descriptors the world's own connections leave
/// (so a flood can never take the ones the ranks need), and from one
/// address twice the ranks one node runs (a node's ranks arrive together;
/// one stranger cannot hold them all).
pub(super) fn pending_limits(
    open_files: Option<(u64, u64)>,
    world: u32,
    per_node: u32,
) -> (usize, usize) {
    let soft = open_files.map_or(1024, |(soft, _)| soft);
    let room = soft.saturating_sub(u64::from(world) + super::verdict::SPARE_FILES) / 2;
    let all = usize::try_from(room)
        .unwrap_or(MAX_PENDING)
        .clamp(16, MAX_PENDING);
    let per_source = (2 * per_node as usize).max(64).min(all);
    (all, per_source)
}

pub(super) async fn accept_loop(listener: TcpListener, serving: Serving) {
    let (all, per_source) = serving.shared.pending;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let unproven = Unproven::new(all, per_source);
    loop {
        // Past `all` connections authenticating at once, the next waits in
        // the kernel's accept queue rather than being closed (a burst of
        // thousands of ranks is served as fast as handshakes finish),
        // until the oldest of them has had its grace and is closed for it:
        // a flood holds no slot against the job's ranks for long.
        unproven.room().await;
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors or similar: said in the report, and
                // no spin.
                let _ = serving.tx.send(Event::AcceptFailed {
                    reason: e.to_string(),
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let permit = unproven.admit(peer.ip());
        let conn = NEXT.fetch_add(1, Ordering::Relaxed);
        let serving = serving.clone();
        tokio::spawn(async move {
            let (store, shared) = (Arc::clone(&serving.store), Arc::clone(&serving.shared));
            super::connection::connection(stream, peer, conn, permit, serving).await;
            // Said in the store once the connection that writes a rank's
            // keys ends: whoever waits on that rank waits no longer.
            for rank in shared.owners.ranks_of(conn) {
                let _ = store.set(store::gone_key(rank), String::new());
            }
        });
    }
}
