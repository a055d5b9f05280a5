//! The rendezvous server: rank 0 (the node-rank-0 agent in node mode)
//! serves on MASTER_ADDR:MASTER_PORT; every rank (see `client`) connects
//! with backoff until its deadline, authenticates, samples the clock,
//! checks in, runs the probes it is told to, and waits for the verdict
//! (see `verdict`).
//!
//! Each connection is its own task with its own deadlines, so garbage, an
//! oversized frame, a half-open or a slow connection is dropped (and
//! counted in the report) without disturbing the others. Nothing waits
//! without a deadline: the barrier ends at `--timeout` after rank 0
//! started, the probes at most 0.8 s later, and the verdict goes out
//! right after.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;

use super::auth::{self, AuthError, HANDSHAKE_LIMIT, Token};
use super::barrier::{self, BarrierState, ConnId, Placement};
use super::checkin::CheckIn;
use super::protocol::now_us;
use super::protocol::{self, FrameError, Msg};
use super::reachability::{self, Target};
use super::sealed::Channel;
use super::store::Store;
use super::unproven::Unproven;
use super::verdict::{assemble, build_nodes, deaf_nodes};
use crate::checklist::Check;
use crate::facts::Facts;
use crate::result::cluster::{ClusterReport, Probe};

/// Connections still authenticating at once, at most; beyond the limit
/// the next connection waits in the accept queue, so a flood of junk
/// connections cannot exhaust memory or descriptors.
const MAX_PENDING: usize = 4096;

/// How many connections may authenticate at once, in all and from one
/// source address: half the descriptors the world's own connections leave
/// (so a flood can never take the ones the ranks need), and from one
/// address twice the ranks one node runs (a node's ranks arrive together;
/// one stranger cannot hold them all).
fn pending_limits(open_files: Option<(u64, u64)>, world: u32, per_node: u32) -> (usize, usize) {
    let soft = open_files.map_or(1024, |(soft, _)| soft);
    let room = soft.saturating_sub(u64::from(world) + super::verdict::SPARE_FILES) / 2;
    let all = usize::try_from(room)
        .unwrap_or(MAX_PENDING)
        .clamp(16, MAX_PENDING);
    let per_source = (2 * per_node as usize).max(64).min(all);
    (all, per_source)
}

/// What a server's connections share beyond the store.
struct Shared {
    /// Rank to the connection that first checked in as it: the only one
    /// that may write that rank's store keys.
    owners: std::sync::Mutex<HashMap<u32, ConnId>>,
    /// Authenticated connections open now, and the most a world needs:
    /// each rank one, a second claimant or a retry each at most once more.
    open: std::sync::atomic::AtomicUsize,
    max_open: usize,
    /// Connections that may authenticate at once: in all, and from one
    /// address (`pending_limits`).
    pending: (usize, usize),
    /// The most check-ins one connection may carry: a node leader's, for
    /// the ranks of its node (1 where the layout is not known).
    per_conn: usize,
    /// Ranks a node leader checked in (not the first on its connection)
    /// that have not attached on their own connection yet.
    relayed: std::sync::Mutex<std::collections::HashSet<u32>>,
    /// Who the ranks are told was interrupted: this process's rank, host.
    serving: (Option<u32>, String),
}

/// One authenticated connection, counted while it lives.
struct Open(Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

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
    let owner = super::store::owner(key);
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

/// One source address's connections still authenticating; the count goes
/// down when the guard is dropped.
/// Probe results kept from one message.
const MAX_PROBE_RESULTS: usize = 1024;

type Writer = Arc<Mutex<tokio::io::WriteHalf<Channel>>>;

enum Event {
    Arrived {
        conn: ConnId,
        checkin: Box<CheckIn>,
        writer: Writer,
    },
    Lost {
        conn: ConnId,
        reason: String,
    },
    OtherJob {
        peer: String,
    },
    Dropped {
        peer: String,
        reason: String,
    },
    Probes {
        conn: ConnId,
        results: Vec<Probe>,
    },
    /// `accept` failed: the connection waits in the backlog, unserved.
    AcceptFailed {
        reason: String,
    },
}

pub struct ServerConfig {
    pub world_size: u32,
    /// Where each rank should run: names the host of a missing one.
    pub placement: Placement,
    /// host:port, as ranks were told.
    pub master: String,
    pub token: Token,
    pub started: Instant,
    /// The barrier's deadline.
    pub deadline: Instant,
    pub timeout: Duration,
    pub strict: bool,
    pub clock_offset_ms: i64,
    /// Where the listener is bound, when MASTER_ADDR is a name: a name
    /// that resolves to loopback here (Debian's 127.0.1.1) cannot be
    /// reached from other nodes. `None` for an address given as such.
    pub bound: Option<(String, SocketAddr)>,
    /// The cluster-scope checks.
    pub checks: Vec<Arc<Check>>,
    pub facts: Arc<Facts>,
    /// How long after the verdict the ranks' connections stay open, for
    /// the collective stage's use of the store.
    pub linger: Duration,
    /// The rank this process is (0), or none for node mode's agent: who
    /// the ranks are told was interrupted.
    pub serving_rank: Option<u32>,
    /// Said in the report's warnings: why rank 0 serves where it does.
    pub notes: Vec<String>,
    /// Where the barrier says whom it waits for, twice a second.
    pub waiting: super::Waiting,
}

/// What the ranks are told when this process is interrupted.
fn notice(
    i: &crate::interrupt::Interruption,
    rank: Option<u32>,
    host: &str,
) -> crate::result::report::Interrupted {
    crate::result::report::Interrupted {
        signal: i.signal.to_string(),
        phase: i.phase.clone(),
        rank,
        host: match rank {
            Some(_) => host.to_string(),
            None => format!("{host}, the rendezvous server"),
        },
        remote: true,
    }
}

/// Binds the rendezvous port: MASTER_ADDR's address where it is local,
/// else every address (the master may be named by an alias).
/// What `ServerConfig::bound` should hold for a listener on `addr`.
pub fn bound_name(addr: &str, listener: &TcpListener) -> Option<(String, SocketAddr)> {
    let bound = listener.local_addr().ok()?;
    if addr.parse::<std::net::IpAddr>().is_ok() && !bound.ip().is_unspecified() {
        return None;
    }
    Some((addr.to_string(), bound))
}

pub async fn bind(addr: &str, port: u16) -> Result<TcpListener, std::io::Error> {
    let resolved: Vec<SocketAddr> = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::lookup_host((addr, port)),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "resolving timed out"))??
    .collect();
    let mut last = None;
    for a in &resolved {
        match listen(*a) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    // MASTER_ADDR is none of this host's addresses (a NAT or a virtual IP
    // in front of it): every interface, said in the report's warnings.
    match listen(SocketAddr::from(([0, 0, 0, 0], port))) {
        Ok(l) => Ok(l),
        Err(e) => Err(last.unwrap_or(e)),
    }
}

/// Thousands of ranks connect within milliseconds of each other: the
/// accept queue holds as many as the kernel allows (`net.core.somaxconn`
/// caps it), not the 1,024 of a default listener, whose overflow costs a
/// rank a SYN retransmit (1 s, then 3 s).
const BACKLOG: u32 = 65_535;

fn listen(addr: SocketAddr) -> Result<TcpListener, std::io::Error> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a port of a run that just ended, in
    // TIME_WAIT, is free to serve the next.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

pub async fn serve(cfg: ServerConfig, listener: TcpListener) -> ClusterReport {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let store = Arc::new(Store::default());
    // Connection tasks live until the verdict has gone out, and then as
    // long as the store: the collective stage's budget; each connection
    // still ends as soon as its rank closes it.
    let store_end = cfg.deadline + Duration::from_secs(3) + cfg.linger;
    let per_node = cfg
        .placement
        .tasks_per_node
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(cfg.placement.local_world_size);
    let limits = pending_limits(crate::facts::limits::open_files(), cfg.world_size, per_node);
    let shared = Arc::new(Shared {
        owners: std::sync::Mutex::new(HashMap::new()),
        open: std::sync::atomic::AtomicUsize::new(0),
        max_open: 2 * cfg.world_size as usize + 64,
        pending: limits,
        per_conn: (per_node as usize).max(1),
        relayed: Default::default(),
        serving: (cfg.serving_rank, cfg.facts.hostname().to_string()),
    });
    let accept = tokio::spawn(accept_loop(
        listener,
        cfg.token.clone(),
        tx.clone(),
        Arc::clone(&store),
        store_end,
        cfg.clock_offset_ms,
        shared,
    ));
    drop(tx);
    let mut state = BarrierState::new(cfg.world_size, cfg.placement.clone());
    let mut writers: HashMap<ConnId, Writer> = HashMap::new();
    let mut probes: Vec<Probe> = Vec::new();
    let mut planned: Planned = HashMap::new();
    let mut replies = 0usize;

    // A signal closes the barrier at once: the ranks here are told why
    // there is no verdict instead of waiting for the deadline.
    let mut interrupted = None;
    // Twice a second at most: the first missing ranks are a scan of the
    // world, cheap at that rate at any size.
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !state.settled() {
        tokio::select! {
            biased;
            i = crate::interrupt::wait() => {
                interrupted = Some(i);
                break;
            }
            _ = tick.tick(), if cfg.waiting.is_some() => {
                if let Some(w) = &cfg.waiting {
                    let _ = w.send(state.waiting());
                }
            }
            ev = tokio::time::timeout_at(cfg.deadline, rx.recv()) => match ev {
                Ok(Some(ev)) => handle(
                    ev,
                    &mut state,
                    &mut writers,
                    &mut probes,
                    &mut planned,
                    &mut replies,
                ),
                Ok(None) | Err(_) => break,
            },
        }
    }
    let waited = cfg.started.elapsed();
    // The barrier is closed: nothing more to wait for.
    if let Some(w) = &cfg.waiting {
        let _ = w.send(String::new());
    }

    // Reachability among the nodes that are here.
    let nodes = build_nodes(&state);
    let n = if interrupted.is_some() {
        0
    } else {
        nodes.len()
    };
    let now = Instant::now();
    let probe_deadline = (now + Duration::from_secs(2))
        .min((cfg.deadline + Duration::from_millis(800)).max(now + Duration::from_millis(300)));
    let probe_timeout = probe_deadline
        .saturating_duration_since(now)
        .saturating_sub(Duration::from_millis(150))
        .min(Duration::from_secs(1))
        .max(Duration::from_millis(100));
    let mut expected_replies = 0;
    if n > 1 {
        for (i, (_, rep)) in nodes.iter().enumerate() {
            let Some((conn, _)) = state.arrivals.get(rep) else {
                continue;
            };
            let targets: Vec<Target> = reachability::partners(i, n)
                .into_iter()
                .filter_map(|j| {
                    let rep_j = nodes[j].1;
                    let addr = state.arrivals.get(&rep_j)?.1.probe_addr.clone()?;
                    Some(Target { node: j, addr })
                })
                .collect();
            if let Some(w) = writers.get(conn) {
                planned.insert(*conn, (i, targets.iter().map(|t| t.node).collect()));
                let msg = Msg::ProbePlan {
                    node: i,
                    targets,
                    timeout_ms: probe_timeout.as_millis() as u64,
                };
                if protocol::write(&mut *w.lock().await, &msg, probe_deadline)
                    .await
                    .is_ok()
                {
                    expected_replies += 1;
                }
            }
        }
        replies = 0;
        while replies < expected_replies {
            match tokio::time::timeout_at(probe_deadline, rx.recv()).await {
                Ok(Some(ev)) => handle(
                    ev,
                    &mut state,
                    &mut writers,
                    &mut probes,
                    &mut planned,
                    &mut replies,
                ),
                Ok(None) | Err(_) => break,
            }
        }
    }
    // Late arrivals (a second claimant of a rank) and losses still count.
    while let Ok(ev) = rx.try_recv() {
        handle(
            ev,
            &mut state,
            &mut writers,
            &mut probes,
            &mut planned,
            &mut replies,
        );
    }
    // A node that opened no probe listener cannot be probed: its peers'
    // probes to it are errors that carry its reason.
    let deaf = deaf_nodes(&state, &nodes);
    if n > 1 {
        for i in 0..n {
            for j in reachability::partners(i, n) {
                if let Some((_, why)) = deaf.iter().find(|(d, _)| *d == j) {
                    probes.push(Probe {
                        from: i,
                        to: j,
                        status: "error".into(),
                        rtt_ms: None,
                        detail: Some(why.clone()),
                    });
                }
            }
        }
    }

    let told = interrupted
        .as_ref()
        .map(|i| notice(i, cfg.serving_rank, cfg.facts.hostname()));
    let report = assemble(&cfg, &state, nodes, probes, &deaf, waited, told);
    let left_ms = cfg
        .deadline
        .saturating_duration_since(Instant::now())
        .as_millis() as u64;
    // Rank 0 gets the whole report; every other rank the verdict cut to
    // what it needs (`for_rank`), the same for every rank of one node, so
    // rank 0 sends O(N) bytes in all, not O(N) to each of N ranks.
    // A node leader's connection carries several ranks: the lowest names
    // it (rank 0's own node's leader is rank 0).
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
    // Which host each rank is on, for the collective stage's messages:
    // O(N), so fetched from the store by the ranks that run that stage,
    // not sent to all of them in the verdict.
    let hosts = report.hosts_by_rank();
    // The store is empty of ours yet and holds 64 MiB: this cannot fail
    // below millions of ranks, and a rank that finds no list says so.
    let _ = store.set_large(
        super::store::HOSTS_KEY,
        &serde_json::to_string(&hosts).unwrap_or_default(),
    );
    let mut per_node: HashMap<Option<usize>, Arc<Msg>> = HashMap::new();
    let full = Arc::new(Msg::Verdict {
        report: Box::new(report.clone()),
        left_ms,
    });
    let frame_deadline = Instant::now() + Duration::from_millis(500);
    let mut sends = tokio::task::JoinSet::new();
    for (conn, w) in writers {
        let rank = rank_of.get(&conn).copied();
        let msg = if rank == Some(0) && !state.duplicates.iter().any(|(c, _)| *c == conn) {
            Arc::clone(&full)
        } else {
            let node = rank.and_then(|r| node_of.get(&r).copied());
            Arc::clone(per_node.entry(node).or_insert_with(|| {
                Arc::new(Msg::Verdict {
                    report: Box::new(report.for_rank(node)),
                    left_ms,
                })
            }))
        };
        sends.spawn(async move {
            let _ = protocol::write(&mut *w.lock().await, &msg, frame_deadline).await;
        });
    }
    while sends.join_next().await.is_some() {}
    if interrupted.is_some() {
        accept.abort();
        return report;
    }
    // The barrier has closed. A process that checks in from now on (a
    // second claimant of a rank, a rank that started late) is not in this
    // verdict and cannot change it: it is told so, and exits not ready,
    // while the ranks in the verdict exit with its code. This lasts as long
    // as the store (this process serves the collective stage meanwhile).
    let closed = Closed {
        verdict: format!(
            "{}: {} of {} checked in",
            report.verdict.name(),
            state.arrivals.len(),
            crate::values::count(cfg.world_size as usize, "rank")
        ),
        world_size: cfg.world_size,
        held: state
            .arrivals
            .iter()
            .map(|(rank, (_, c))| (*rank, barrier::who(c)))
            .collect(),
    };
    tokio::spawn(async move {
        let _ = tokio::time::timeout_at(store_end, closed.answer(&mut rx)).await;
        accept.abort();
    });
    report
}

/// What a process that checks in after the verdict is told.
struct Closed {
    verdict: String,
    world_size: u32,
    held: HashMap<u32, String>,
}

impl Closed {
    async fn answer(&self, rx: &mut mpsc::UnboundedReceiver<Event>) {
        while let Some(ev) = rx.recv().await {
            if let Event::Arrived {
                checkin, writer, ..
            } = ev
            {
                let reason = self.too_late(&checkin);
                let deadline = Instant::now() + Duration::from_secs(1);
                let msg = Msg::Rejected {
                    reason,
                    source: None,
                    fingerprint: None,
                };
                let _ = protocol::write(&mut *writer.lock().await, &msg, deadline).await;
            }
        }
    }

    fn too_late(&self, c: &CheckIn) -> String {
        let rank = c.identity.rank;
        let why = match self.held.get(&rank) {
            Some(holder) => format!(
                "rank {rank} had checked in from {holder}: this process is a second claimant of rank {rank}"
            ),
            None if rank >= self.world_size => format!(
                "rank {rank} is outside the world of {}",
                crate::values::count(self.world_size as usize, "rank")
            ),
            None => format!("rank {rank} was reported missing"),
        };
        format!(
            "too late: rank 0 had already sent the verdict ({}) when this process checked in; {why}, and this process is not part of the job's verdict",
            self.verdict
        )
    }
}

/// Which connection was asked to probe for which node, and whom.
type Planned = HashMap<ConnId, (usize, Vec<usize>)>;

fn handle(
    ev: Event,
    state: &mut BarrierState,
    writers: &mut HashMap<ConnId, Writer>,
    probes: &mut Vec<Probe>,
    planned: &mut Planned,
    replies: &mut usize,
) {
    match ev {
        Event::Arrived {
            conn,
            checkin,
            writer,
        } => {
            // Duplicates and ranks outside the world are recorded by the
            // barrier and still get the verdict, so they exit with it too.
            writers.insert(conn, writer);
            state.arrive(conn, *checkin);
        }
        Event::Lost { conn, reason } => {
            writers.remove(&conn);
            state.lose(conn, &reason);
        }
        Event::OtherJob { peer } => state.other_job(peer),
        Event::Dropped { peer, reason } => {
            // A flood of junk must not grow the report without bound.
            state.dropped_total += 1;
            if state.dropped.len() < 32 {
                state.dropped.push(format!("{peer}: {reason}"));
            }
        }
        Event::Probes { conn, results } => {
            // One result set per node, from the rank asked to probe for it,
            // about the peers it was asked to probe: `from` is the plan's,
            // whatever the message says.
            if let Some((node, targets)) = planned.remove(&conn) {
                probes.extend(
                    results
                        .into_iter()
                        .filter(|p| targets.contains(&p.to))
                        .map(|p| Probe { from: node, ..p }),
                );
                *replies += 1;
            }
        }
        Event::AcceptFailed { reason } => {
            state.accept_failures += 1;
            state.accept_error.get_or_insert(reason);
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    token: Token,
    tx: mpsc::UnboundedSender<Event>,
    store: Arc<Store>,
    store_end: Instant,
    offset_ms: i64,
    shared: Arc<Shared>,
) {
    let (all, per_source) = shared.pending;
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
                let _ = tx.send(Event::AcceptFailed {
                    reason: e.to_string(),
                });
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let permit = unproven.admit(peer.ip());
        let conn = NEXT.fetch_add(1, Ordering::Relaxed);
        let token = token.clone();
        let tx = tx.clone();
        let store = Arc::clone(&store);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            connection(
                stream, peer, conn, token, tx, store, store_end, offset_ms, permit, shared,
            )
            .await;
        });
    }
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    conn: ConnId,
    token: Token,
    tx: mpsc::UnboundedSender<Event>,
    store: Arc<Store>,
    store_end: Instant,
    offset_ms: i64,
    permit: super::unproven::Slot,
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
                    super::checkin::cut(&mut r.status, 32);
                    if let Some(d) = &mut r.detail {
                        super::checkin::cut(d, 256);
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
                let refused = if key.len() > super::store::MAX_KEY {
                    Some(format!(
                        "store: a key of {} bytes, over the {} allowed",
                        key.len(),
                        super::store::MAX_KEY
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::client::{ClientConfig, await_verdict, connect};
    use crate::cluster::store;
    use crate::cluster::test_support::{block_on, ranked, server};
    use crate::result::Verdict;

    /// A process that checks in after the verdict went out is told it came
    /// too late and who held its rank, instead of waiting for a verdict
    /// that never comes.
    #[test]
    fn a_check_in_after_the_verdict_is_told_it_is_too_late() {
        block_on(async {
            let (server, client) = server(1, 5).await;
            let check_in = |c: CheckIn| Msg::CheckIn(Box::new(c));
            let mut first = connect(&client).await.unwrap();
            // Checking in a second after rank 0's start: a deadline counted
            // afresh from the verdict would land a second late.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let sample = crate::cluster::checkin::sample;
            protocol::write(&mut first, &check_in(sample(0, 1, "h0")), client.deadline)
                .await
                .unwrap();
            let (report, until) = await_verdict(&mut first, client.verdict_deadline)
                .await
                .unwrap();
            assert_eq!(report.verdict, Verdict::Ready);
            // The run's deadline travels with the verdict: rank 0's, not a
            // fresh --timeout from the moment the verdict arrived.
            assert!(until > Instant::now(), "{until:?}");
            assert!(
                until <= client.deadline + Duration::from_millis(500),
                "{until:?}"
            );
            assert!(server.await.unwrap().barrier.complete);
            // The barrier has closed: a second claimant of rank 0, then a
            // rank outside the world.
            for (rank, why) in [
                (
                    0,
                    "rank 0 had checked in from h0 (10.0.0.1, connected from 127.0.0.1) pid 100: this process is a second claimant of rank 0",
                ),
                (3, "rank 3 is outside the world of 1 rank"),
            ] {
                let mut late = connect(&client).await.unwrap();
                protocol::write(&mut late, &check_in(sample(rank, 1, "h9")), client.deadline)
                    .await
                    .unwrap();
                let e = await_verdict(&mut late, client.verdict_deadline)
                    .await
                    .unwrap_err();
                assert!(
                    e.contains("too late: rank 0 had already sent the verdict (ready: 1 of 1 rank checked in)")
                        && e.contains(why),
                    "{e}"
                );
            }
        });
    }

    #[test]
    fn pending_limits_leave_the_world_its_descriptors() {
        // Plenty of descriptors: the fixed ceiling; a node's ranks fit.
        assert_eq!(pending_limits(Some((1 << 20, 1 << 20)), 512, 8), (4096, 64));
        assert_eq!(
            pending_limits(Some((1 << 20, 1 << 20)), 300, 300),
            (4096, 600)
        );
        // 1,024 descriptors and 300 ranks: half of what the world leaves.
        assert_eq!(pending_limits(Some((1024, 1024)), 300, 300), (330, 330));
        // Fewer descriptors than the world needs: a floor, never a panic.
        assert_eq!(pending_limits(Some((32, 32)), 48, 48), (16, 16));
    }

    /// An authenticated peer that checks in with a 3 MiB hostname and
    /// thousands of variables: rank 0 keeps and sends a bounded view of
    /// it, and the verdict stays small and deliverable.
    #[test]
    fn a_check_in_with_huge_fields_is_bounded_on_receipt() {
        block_on(async {
            // Over the 1 MiB a rank's frame may have: refused unread.
            let (_server, client) = server(1, 5).await;
            let c = crate::cluster::checkin::sample(0, 1, &"h".repeat(3 << 20));
            let mut conn = connect(&client).await.unwrap();
            let _ = protocol::write(&mut conn, &Msg::CheckIn(Box::new(c)), client.deadline).await;
            let e = await_verdict(&mut conn, client.verdict_deadline)
                .await
                .unwrap_err();
            assert!(e.contains("the master went away before the verdict"), "{e}");
            // Under it, but with every field far too large: bounded.
            let (server, client) = server(1, 5).await;
            let mut c = crate::cluster::checkin::sample(0, 1, &"h".repeat(512 << 10));
            c.env = (0..300)
                .map(|i| (format!("NCCL_{i}"), "v".repeat(1000)))
                .collect();
            let mut conn = connect(&client).await.unwrap();
            protocol::write(&mut conn, &Msg::CheckIn(Box::new(c)), client.deadline)
                .await
                .unwrap();
            let (report, _) = await_verdict(&mut conn, client.verdict_deadline)
                .await
                .unwrap();
            assert!(
                report.nodes[0].hostname.len() < 512,
                "{}",
                report.nodes[0].hostname.len()
            );
            // It claimed 10.0.0.1 and connected from loopback: both named.
            assert_eq!(report.nodes[0].addr, "10.0.0.1");
            assert_eq!(report.nodes[0].seen_from.as_deref(), Some("127.0.0.1"));
            assert!(
                report.warnings.iter().any(|w| w.contains(
                    "says its address is 10.0.0.1 but its connection came from 127.0.0.1"
                )),
                "{:?}",
                report.warnings
            );
            let size = serde_json::to_vec(&report).unwrap().len();
            assert!(size < 128 << 10, "a verdict of {size} bytes");
            drop(server);
        });
    }

    async fn both_ranked(client: &ClientConfig) -> (Channel, Channel) {
        let mut a = ranked(client, 0, 2, "h0").await;
        let mut b = ranked(client, 1, 2, "h0").await;
        await_verdict(&mut a, client.verdict_deadline)
            .await
            .unwrap();
        await_verdict(&mut b, client.verdict_deadline)
            .await
            .unwrap();
        (a, b)
    }

    /// Store keys belong to ranks: rank 1 may not forge rank 0's report or
    /// plan, nor replace what it published; a process that has not checked
    /// in, or came second for a rank, writes nothing.
    #[test]
    fn store_keys_are_written_once_by_their_own_rank() {
        block_on(async {
            let start = Instant::now();
            let (_server, client) = server(2, 2).await;
            let (mut a, mut b) = both_ranked(&client).await;
            let deadline = start + Duration::from_secs(4);
            let refused = |r: Result<(), FrameError>| match r {
                Err(FrameError::Refused(why)) => why,
                other => panic!("not refused: {other:?}"),
            };
            for key in [
                "coll/report",
                "coll/nccl/plan",
                "coll/tcp/addr/0",
                "coll/report#0",
            ] {
                let why = refused(store::set(&mut b, key, "forged", deadline).await);
                assert!(
                    why.contains(&format!(
                        "`{key}` is rank 0's to write, and this connection is rank 1's"
                    )),
                    "{why}"
                );
            }
            store::set(&mut b, "coll/tcp/addr/1", "10.0.0.2:1", deadline)
                .await
                .unwrap();
            // The same value again is a retry; another one is refused.
            store::set(&mut b, "coll/tcp/addr/1", "10.0.0.2:1", deadline)
                .await
                .unwrap();
            let why = refused(store::set(&mut b, "coll/tcp/addr/1", "6.6.6.6:1", deadline).await);
            assert!(
                why.contains("already set, and keys are written once"),
                "{why}"
            );
            store::set(&mut a, "coll/report", "real", deadline)
                .await
                .unwrap();
            let got = store::get(&mut b, "coll/report", Duration::ZERO, deadline).await;
            assert_eq!(got.unwrap().as_deref(), Some("real"));
            // Authenticated, never checked in.
            let mut stranger = connect(&client).await.unwrap();
            let why = refused(store::set(&mut stranger, "coll/result/1", "x", deadline).await);
            assert!(why.contains("has not checked in"), "{why}");
            // A second process claiming rank 1, after the verdict.
            let mut second = ranked(&client, 1, 2, "h9").await;
            let _ = await_verdict(&mut second, client.verdict_deadline).await;
            let why = refused(store::set(&mut second, "coll/result/1", "x", deadline).await);
            assert!(
                why.contains("another process checked in as rank 1 first"),
                "{why}"
            );
        });
    }

    /// An authenticated peer cannot make rank 0 hold much: a key over the
    /// limit is refused on a get too, a get waits alone on its connection,
    /// a frame over 1 MiB closes the connection, and connections beyond
    /// what the world needs are turned away.
    #[test]
    fn an_authenticated_peer_cannot_exhaust_rank_0() {
        block_on(async {
            let start = Instant::now();
            let (_server, client) = server(1, 3).await;
            let deadline = start + Duration::from_secs(3);
            let mut c = connect(&client).await.unwrap();
            let e = store::get(&mut c, &"k".repeat(300), Duration::ZERO, deadline)
                .await
                .unwrap_err();
            assert!(
                e.to_string()
                    .contains("a key of 300 bytes, over the 256 allowed"),
                "{e}"
            );
            // Two gets at once on one connection: the second is refused
            // at once, the first still answered.
            let get = |key: &str| Msg::StoreGet {
                key: key.into(),
                wait_ms: 300,
            };
            protocol::write(&mut c, &get("a"), deadline).await.unwrap();
            protocol::write(&mut c, &get("b"), deadline).await.unwrap();
            match protocol::read(&mut c, deadline).await.unwrap() {
                Msg::Rejected { reason, .. } => {
                    assert!(reason.contains("one get at a time"), "{reason}")
                }
                other => panic!("{other:?}"),
            }
            assert!(matches!(
                protocol::read(&mut c, deadline).await.unwrap(),
                Msg::StoreValue { value: None, .. }
            ));
            // A 4 MiB key: the frame is over what a rank may send.
            let huge = Msg::StoreGet {
                key: "k".repeat(4 << 20),
                wait_ms: 0,
            };
            let mut h = connect(&client).await.unwrap();
            let _ = protocol::write(&mut h, &huge, deadline).await;
            assert!(protocol::read(&mut h, deadline).await.is_err());
            // A world of 1 needs 66 connections at most.
            let mut held = Vec::new();
            let mut turned_away = None;
            for _ in 0..80 {
                let mut conn = connect(&client).await.unwrap();
                let ping = Msg::TimeRequest { t0: 0 };
                protocol::write(&mut conn, &ping, deadline).await.unwrap();
                match protocol::read(&mut conn, deadline).await {
                    Ok(Msg::TimeReply { .. }) => held.push(conn),
                    Ok(Msg::Rejected { reason, .. }) => {
                        turned_away = Some(reason);
                        break;
                    }
                    other => panic!("{other:?}"),
                }
            }
            let why = turned_away.expect("some connection turned away");
            assert!(
                why.contains("already holds 66 authenticated connections"),
                "{why}"
            );
            assert!(held.len() <= 66, "{}", held.len());
        });
    }

    /// Probe results count only from the rank asked to probe for its node,
    /// about the peers it was asked to probe: a forged "node 0 cannot
    /// reach node 1" sent early by another rank is ignored.
    #[test]
    fn forged_probe_results_are_ignored() {
        block_on(async {
            let (server, client) = server(3, 5).await;
            let mut conns = Vec::new();
            for (rank, host) in [(2u32, "h2"), (0, "h0"), (1, "h1")] {
                let listener = reachability::listen("127.0.0.1", None)
                    .await
                    .unwrap()
                    .listener;
                let addr = listener.local_addr().unwrap().to_string();
                tokio::spawn(reachability::serve(listener));
                let mut c = crate::cluster::checkin::sample(rank, 3, host);
                c.probe_addr = Some(addr);
                let mut conn = connect(&client).await.unwrap();
                protocol::write(&mut conn, &Msg::CheckIn(Box::new(c)), client.deadline)
                    .await
                    .unwrap();
                if rank == 2 {
                    let forged = Msg::ProbeResults {
                        results: vec![Probe {
                            from: 0,
                            to: 1,
                            status: "timed_out".into(),
                            rtt_ms: None,
                            detail: Some("forged".into()),
                        }],
                    };
                    protocol::write(&mut conn, &forged, client.deadline)
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                conns.push(conn);
            }
            let waits: Vec<_> = conns
                .into_iter()
                .map(|mut c| {
                    let d = client.verdict_deadline;
                    tokio::spawn(async move { await_verdict(&mut c, d).await.map(|_| ()) })
                })
                .collect();
            for w in waits {
                w.await.unwrap().unwrap();
            }
            let report = server.await.unwrap();
            assert!(
                report.reachability.probes.iter().all(|p| p.status == "ok"),
                "{:#?}",
                report.reachability.probes
            );
            assert_eq!(report.reachability.probes.len(), 6);
        });
    }

    /// The store API the collective stages use, over real authenticated
    /// connections of checked-in ranks to a real server.
    #[test]
    fn ranks_exchange_values_through_the_store() {
        block_on(async {
            let start = Instant::now();
            let (server, client) = server(2, 2).await;
            let (mut a, mut b) = both_ranked(&client).await;
            let deadline = start + Duration::from_secs(4);
            let waiter = async {
                store::get(&mut b, "nccl-unique-id", Duration::from_secs(1), deadline).await
            };
            let setter = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                store::set(&mut a, "nccl-unique-id", "00ff", deadline).await
            };
            let (got, set) = tokio::join!(waiter, setter);
            set.unwrap();
            assert_eq!(got.unwrap().as_deref(), Some("00ff"));
            let none = store::get(&mut a, "absent", Duration::from_millis(20), deadline).await;
            assert_eq!(none.unwrap(), None);
            assert!(server.await.unwrap().barrier.complete);
        });
    }

    /// A value far above one item's limit goes through a real server in
    /// parts and comes back whole; one above the store's capacity is an
    /// error, never a hang or a silent loss.
    #[test]
    fn large_values_go_through_the_store_in_parts() {
        block_on(async {
            let start = Instant::now();
            let (server, client) = server(2, 3).await;
            let (mut a, mut b) = both_ranked(&client).await;
            let deadline = start + Duration::from_secs(5);
            let value: String = "rank 299 é€ ".chars().cycle().take(300_000).collect();
            let waiter = store::get_large(&mut b, "coll/report", Duration::from_secs(2), deadline);
            let setter = store::set_large(&mut a, "coll/report", &value, deadline);
            let (got, set) = tokio::join!(waiter, setter);
            set.unwrap();
            assert_eq!(got.unwrap().as_deref(), Some(value.as_str()));
            // A plain value under the key is no parts header: named.
            store::set(&mut a, "plain", "x", deadline).await.unwrap();
            let e = store::get_large(&mut b, "plain", Duration::ZERO, deadline)
                .await
                .unwrap_err();
            assert!(e.to_string().contains("`x` is not a parts header"), "{e}");
            let huge = "y".repeat(65 << 20);
            let e = store::set_large(&mut a, "huge", &huge, deadline)
                .await
                .unwrap_err();
            assert!(e.to_string().contains("more than the store holds"), "{e}");
            drop(server);
        });
    }
}
