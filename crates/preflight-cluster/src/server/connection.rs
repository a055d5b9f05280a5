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

use super::{Event, Open, Shared, Writer, notice, reply};
use crate::auth::{self, AuthError, HANDSHAKE_LIMIT, Token};
use crate::barrier::ConnId;
use crate::protocol::now_us;
use crate::protocol::{self, FrameError, Msg};
use crate::sealed::Channel;
use crate::store::Store;

/// Probe results kept from one message.
const MAX_PROBE_RESULTS: usize = 1024;

/// What every connection of one server shares.
#[derive(Clone)]
pub(super) struct Serving {
    pub token: Token,
    /// Where a connection's events go to the barrier.
    pub tx: mpsc::UnboundedSender<Event>,
    pub store: Arc<Store>,
    /// Until when the store serves (past the verdict).
    pub store_end: Instant,
    /// The test hook's clock offset (`cluster::clock_offset`).
    pub offset_ms: i64,
    pub shared: Arc<Shared>,
}

pub(super) async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    conn: ConnId,
    permit: crate::unproven::Slot,
    serving: Serving,
) {
    let Serving {
        token,
        tx,
        store,
        store_end,
        offset_ms,
        shared,
    } = serving;
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
        reply::send_on(&mut stream, &reply::rejected(reason.clone())).await;
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
            i = preflight_ground::interrupt::wait(), if told.is_none() && checked_in => {
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
                if !reply::send(&writer, &reply, store_end).await {
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
                shared.owners.check_in(conn, c.identity.rank, first);
                let mut c = c;
                c.seen_from = Some(peer.clone());
                let _ = tx.send(Event::Arrived {
                    conn,
                    checkin: Box::new(c),
                    writer: Arc::clone(&writer),
                });
            }
            Msg::Attach { rank: r } if !checked_in => {
                let reply = match shared.owners.attach(conn, r) {
                    Ok(()) => {
                        checked_in = true;
                        rank = Some(r);
                        Msg::StoreValue {
                            key: "attach".into(),
                            value: None,
                        }
                    }
                    Err(reason) => reply::rejected(reason),
                };
                let _ = reply::send(&writer, &reply, store_end).await;
            }
            Msg::ProbeResults { mut results } => {
                // A node probes a few dozen peers at most (all pairs up to
                // reachability::ALL_PAIRS_MAX nodes, then ring + hypercube).
                results.truncate(MAX_PROBE_RESULTS);
                for r in &mut results {
                    crate::checkin::cut(&mut r.status, 32);
                    if let Some(d) = &mut r.detail {
                        crate::checkin::cut(d, 256);
                    }
                }
                let _ = tx.send(Event::Probes { conn, results });
            }
            Msg::StoreSet { key, value } => {
                let allowed = shared.owners.may_write(conn, rank, &key);
                let reply = match allowed.and_then(|()| store.set(key.clone(), value)) {
                    Ok(()) => Msg::StoreValue { key, value: None },
                    Err(reason) => reply::rejected(reason),
                };
                let _ = reply::send(&writer, &reply, store_end).await;
            }
            Msg::StoreGet { key, wait_ms } => {
                let refused = if key.len() > crate::store::MAX_KEY {
                    Some(format!(
                        "store: a key of {} bytes, over the {} allowed",
                        key.len(),
                        crate::store::MAX_KEY
                    ))
                } else if getting.swap(true, Ordering::AcqRel) {
                    Some("store: one get at a time on a connection".to_string())
                } else {
                    None
                };
                if let Some(reason) = refused {
                    let _ = reply::send(&writer, &reply::rejected(reason), store_end).await;
                    continue;
                }
                // Answered from its own task so the reader keeps reading.
                let store = Arc::clone(&store);
                let writer = Arc::clone(&writer);
                let getting = Arc::clone(&getting);
                tokio::spawn(async move {
                    let wait = (Instant::now() + Duration::from_millis(wait_ms)).min(store_end);
                    let value = store.get(&key, wait).await;
                    let _ = reply::send(&writer, &Msg::StoreValue { key, value }, store_end).await;
                    getting.store(false, Ordering::Release);
                });
            }
            // Anything else from a rank is out of turn: ignore it.
            _ => {}
        }
    }
}

// ---- the rank's side -------------------------------------------------------
