//! One connection, from the handshake to its close: the job's secret
//! proven, the check-ins it may carry, the store keys it may write, the
//! probe results it reports, each bounded in size and time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;

use super::{Event, Open, Shared, Writer, notice};
use crate::cluster::auth::{self, AuthError, HANDSHAKE_LIMIT, Token};
use crate::cluster::barrier::ConnId;
use crate::cluster::protocol::now_us;
use crate::cluster::protocol::{self, FrameError, Msg};
use crate::cluster::sealed::Channel;
use crate::cluster::store::Store;

/// Why this connection may not write `key`, if it may not: a rank writes
/// its own keys only (`store::owner`), and only as the first process that
/// checked in as that rank.
fn may_write(shared: &Shared, conn: ConnId, rank: Option<u32>, key: &str) -> Result<(), String> {
    let Some(rank) = rank else {
        return Err("store: this connection has not checked in, and may not write".into());
    };
    // The key's rank must be one this connection checked in (or attached)
    // as, first: a node leader's connection writes for its node's ranks
    // until they attach on their own.
    let owner = crate::cluster::store::owner(key);
    let first = shared
        .owners
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

/// A rank that its node leader checked in takes its store keys over on its
/// own connection, once; a rank that checked in itself, or one attached
/// already, is refused.
fn attach(shared: &Shared, conn: ConnId, rank: u32) -> Result<(), String> {
    let mut owners = shared.owners.lock().unwrap_or_else(|e| e.into_inner());
    let mut relayed = shared.relayed.lock().unwrap_or_else(|e| e.into_inner());
    // Taken out of `relayed` on success: a rank attaches once.
    if !relayed.remove(&rank) {
        return Err(format!(
            "store: rank {rank} was not checked in by its node's leader, or has attached already"
        ));
    }
    owners.insert(rank, conn);
    Ok(())
}

/// Probe results kept from one message.
const MAX_PROBE_RESULTS: usize = 1024;

#[allow(clippy::too_many_arguments)]
pub(super) async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    conn: ConnId,
    token: Token,
    tx: mpsc::UnboundedSender<Event>,
    store: Arc<Store>,
    store_end: Instant,
    offset_ms: i64,
    permit: crate::cluster::unproven::Slot,
    shared: Arc<Shared>,
) {
    let _ = stream.set_nodelay(true);
    let peer = peer.ip().to_string();
    // Until the store's end: a process that comes after the verdict is
    // still told that it came too late.
    let handshake = (Instant::now() + HANDSHAKE_LIMIT).min(store_end);
    let evicted = Arc::clone(&permit.evicted);
    let source = permit.ip();
    let guesses = permit.guesses();
    let authenticated = tokio::select! {
        r = async {
            guesses.pace(source).await;
            let r = auth::server(&mut stream, &token, handshake).await;
            if matches!(r, Err(AuthError::OtherJob { .. })) {
                guesses.failed(source);
            }
            r
        } => r,
        _ = evicted.notified() => {
            let _ = tx.send(Event::Dropped {
                peer,
                reason: "closed unproven to make room for a newer connection".to_string(),
            });
            return;
        }
    };
    let session = match authenticated {
        Ok(session) => session,
        Err(AuthError::OtherJob { .. }) => {
            let _ = tx.send(Event::OtherJob { peer });
            return;
        }
        Err(e) => {
            let _ = tx.send(Event::Dropped {
                peer,
                reason: e.to_string(),
            });
            return;
        }
    };
    drop(permit);
    let mut stream: Channel = session.seal(stream, &token, false);
    if shared.open.fetch_add(1, Ordering::Relaxed) >= shared.max_open {
        shared.open.fetch_sub(1, Ordering::Relaxed);
        let reason = format!(
            "rank 0 already holds {} authenticated connections, the most this world needs",
            shared.max_open
        );
        let deadline = Instant::now() + Duration::from_secs(1);
        let _ = protocol::write(
            &mut stream,
            &Msg::Rejected {
                reason: reason.clone(),
                source: None,
                fingerprint: None,
            },
            deadline,
        )
        .await;
        let _ = tx.send(Event::Dropped { peer, reason });
        return;
    }
    let _open = Open(Arc::clone(&shared));
    let (mut rd, wr) = tokio::io::split(stream);
    let writer: Writer = Arc::new(Mutex::new(wr));
    let mut checked_in = false;
    // The first rank checked in on this connection, how many were, and
    // the node (hostname, address) they are on.
    let mut rank: Option<u32> = None;
    let mut checkins = 0usize;
    let mut node: Option<(String, String)> = None;
    // One store get in flight per connection: a peer cannot pile up
    // waiting tasks.
    let getting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Once this process is interrupted, a rank that checked in is told at
    // once, and every request after gets the same answer: a rank blocked
    // in the collective stage learns it on its next use of the store.
    let mut told: Option<Msg> = None;
    loop {
        let read = tokio::select! {
            read = protocol::read_limited(&mut rd, store_end, protocol::MAX_RANK_FRAME) => read,
            i = crate::interrupt::wait(), if told.is_none() && checked_in => {
                let (rank, host) = &shared.serving;
                let msg = Msg::Interrupted {
                    notice: Box::new(notice(&i, *rank, host)),
                };
                let deadline = Instant::now() + Duration::from_millis(300);
                let _ = protocol::write(&mut *writer.lock().await, &msg, deadline).await;
                told = Some(msg);
                continue;
            }
        };
        let msg = match read {
            Ok(m) => m,
            Err(FrameError::Timeout) => return,
            Err(e) => {
                if checked_in {
                    let _ = tx.send(Event::Lost {
                        conn,
                        reason: e.to_string(),
                    });
                }
                return;
            }
        };
        if let (Some(answer), Msg::StoreGet { .. } | Msg::StoreSet { .. } | Msg::Attach { .. }) =
            (&told, &msg)
        {
            let deadline = Instant::now() + Duration::from_millis(300);
            let _ = protocol::write(&mut *writer.lock().await, answer, deadline).await;
            continue;
        }
        match msg {
            Msg::TimeRequest { t0 } => {
                let t1 = now_us(offset_ms);
                let reply = Msg::TimeReply {
                    t0,
                    t1,
                    t2: now_us(offset_ms),
                };
                let deadline = (Instant::now() + Duration::from_secs(1)).min(store_end);
                if protocol::write(&mut *writer.lock().await, &reply, deadline)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Msg::CheckIn(c) if checkins < shared.per_conn && (checkins > 0 || rank.is_none()) => {
                // A node leader relays its node's ranks on its own
                // connection: every one of them on the first one's node.
                let c = c.bounded();
                if let Some((host, addr)) = &node
                    && (c.hostname != *host || c.addr != *addr)
                {
                    continue;
                }
                node.get_or_insert_with(|| (c.hostname.clone(), c.addr.clone()));
                checkins += 1;
                checked_in = true;
                let first = *rank.get_or_insert(c.identity.rank);
                let mut owners = shared.owners.lock().unwrap_or_else(|e| e.into_inner());
                if let std::collections::hash_map::Entry::Vacant(slot) =
                    owners.entry(c.identity.rank)
                {
                    slot.insert(conn);
                    if c.identity.rank != first {
                        shared
                            .relayed
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(c.identity.rank);
                    }
                }
                drop(owners);
                let mut c = c;
                c.seen_from = Some(peer.clone());
                let _ = tx.send(Event::Arrived {
                    conn,
                    checkin: Box::new(c),
                    writer: Arc::clone(&writer),
                });
            }
            Msg::Attach { rank: r } if !checked_in => {
                let reply = match attach(&shared, conn, r) {
                    Ok(()) => {
                        checked_in = true;
                        rank = Some(r);
                        Msg::StoreValue {
                            key: "attach".into(),
                            value: None,
                        }
                    }
                    Err(reason) => Msg::Rejected {
                        reason,
                        source: None,
                        fingerprint: None,
                    },
                };
                let deadline = (Instant::now() + Duration::from_secs(1)).min(store_end);
                let _ = protocol::write(&mut *writer.lock().await, &reply, deadline).await;
            }
            Msg::ProbeResults { mut results } => {
                // A node probes a few dozen peers at most (all pairs up to
                // reachability::ALL_PAIRS_MAX nodes, then ring + hypercube).
                results.truncate(MAX_PROBE_RESULTS);
                for r in &mut results {
                    crate::cluster::checkin::cut(&mut r.status, 32);
                    if let Some(d) = &mut r.detail {
                        crate::cluster::checkin::cut(d, 256);
                    }
                }
                let _ = tx.send(Event::Probes { conn, results });
            }
            Msg::StoreSet { key, value } => {
                let allowed = may_write(&shared, conn, rank, &key);
                let reply = match allowed.and_then(|()| store.set(key.clone(), value)) {
                    Ok(()) => Msg::StoreValue { key, value: None },
                    Err(reason) => Msg::Rejected {
                        reason,
                        source: None,
                        fingerprint: None,
                    },
                };
                let deadline = (Instant::now() + Duration::from_secs(1)).min(store_end);
                let _ = protocol::write(&mut *writer.lock().await, &reply, deadline).await;
            }
            Msg::StoreGet { key, wait_ms } => {
                let refused = if key.len() > crate::cluster::store::MAX_KEY {
                    Some(format!(
                        "store: a key of {} bytes, over the {} allowed",
                        key.len(),
                        crate::cluster::store::MAX_KEY
                    ))
                } else if getting.swap(true, Ordering::AcqRel) {
                    Some("store: one get at a time on a connection".to_string())
                } else {
                    None
                };
                if let Some(reason) = refused {
                    let deadline = (Instant::now() + Duration::from_secs(1)).min(store_end);
                    let reply = Msg::Rejected {
                        reason,
                        source: None,
                        fingerprint: None,
                    };
                    let _ = protocol::write(&mut *writer.lock().await, &reply, deadline).await;
                    continue;
                }
                // Answered from its own task so the reader keeps reading.
                let store = Arc::clone(&store);
                let writer = Arc::clone(&writer);
                let getting = Arc::clone(&getting);
                tokio::spawn(async move {
                    let wait = (Instant::now() + Duration::from_millis(wait_ms)).min(store_end);
                    let value = store.get(&key, wait).await;
                    let deadline = (Instant::now() + Duration::from_secs(1)).min(store_end);
                    let reply = Msg::StoreValue { key, value };
                    let _ = protocol::write(&mut *writer.lock().await, &reply, deadline).await;
                    getting.store(false, Ordering::Release);
                });
            }
            // Anything else from a rank is out of turn: ignore it.
            _ => {}
        }
    }
}

// ---- the rank's side -------------------------------------------------------
