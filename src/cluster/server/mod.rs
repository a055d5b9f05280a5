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

mod admission;
mod connection;
mod listen;
#[cfg(test)]
mod tests;
mod verdict;

pub use listen::{bind, bound_name};

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;

use super::auth::Token;
use super::barrier::{self, BarrierState, ConnId, Placement};
use super::checkin::CheckIn;
use super::protocol::{self, Msg};
use super::reachability::{self, Target};
use super::sealed::Channel;
use super::store::Store;
use crate::checklist::Check;
use crate::facts::Facts;
use crate::result::cluster::{ClusterReport, Probe};
use verdict::{Round, assemble, build_nodes, deaf_nodes};
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

type Writer = Arc<Mutex<tokio::io::WriteHalf<Channel>>>;

/// How long one rank's verdict frame may take to leave: a few kilobytes,
/// or for node mode's rank 0 the whole report, up to `MAX_FRAME`.
const VERDICT_WITHIN: Duration = Duration::from_millis(500);
const OWN_VERDICT_WITHIN: Duration = Duration::from_secs(5);
/// Verdict frames being written at once.
const SENDS_IN_FLIGHT: usize = 256;

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

/// When the store closes: connection tasks live until the verdict has gone
/// out, and then as long as the store: the collective stage's budget; each
/// connection still ends as soon as its rank closes it.
pub fn store_end(cfg: &ServerConfig) -> Instant {
    cfg.deadline + Duration::from_secs(3) + cfg.linger
}

pub async fn serve(cfg: ServerConfig, listener: TcpListener) -> ClusterReport {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let store = Arc::new(Store::default());
    let store_end = store_end(&cfg);
    let per_node = cfg
        .placement
        .tasks_per_node
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(cfg.placement.local_world_size);
    let limits =
        admission::pending_limits(crate::facts::limits::open_files(), cfg.world_size, per_node);
    let shared = Arc::new(Shared {
        owners: std::sync::Mutex::new(HashMap::new()),
        open: std::sync::atomic::AtomicUsize::new(0),
        max_open: 2 * cfg.world_size as usize + 64,
        pending: limits,
        per_conn: (per_node as usize).max(1),
        relayed: Default::default(),
        serving: (cfg.serving_rank, cfg.facts.hostname().to_string()),
    });
    let accept = tokio::spawn(admission::accept_loop(
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
    let closed_at = Instant::now();
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
    // Room for a probe's two tries (the second with twice the time): a
    // healthy cluster's replies all come long before the window ends.
    let probe_deadline = (now + Duration::from_millis(3500))
        .min((cfg.deadline + Duration::from_millis(800)).max(now + Duration::from_millis(300)));
    let probe_timeout = (probe_deadline
        .saturating_duration_since(now)
        .saturating_sub(Duration::from_millis(150))
        / 3)
    .min(Duration::from_secs(1))
    .max(Duration::from_millis(50));
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

    let probed_at = Instant::now();
    let told = interrupted
        .as_ref()
        .map(|i| notice(i, cfg.serving_rank, cfg.facts.hostname()));
    let round = Round {
        probes,
        deaf: &deaf,
        asked_to_probe: expected_replies,
    };
    let mut report = assemble(&cfg, &state, nodes, round, waited, told);
    let assembled_at = Instant::now();
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
    let views = report.rank_views();
    let duplicates: HashSet<ConnId> = state.duplicates.iter().map(|(c, _)| *c).collect();
    // Each connection's verdict is made when it is sent, a node's ranks
    // one after another so that one encoding serves them all, and a few
    // hundred frames in flight at most: at 16,384 nodes, every node's
    // frame made at once held a quarter of a gigabyte.
    let mut order: Vec<(Option<usize>, bool, ConnId, Writer)> = writers
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
    let ms = |d: Duration| d.as_millis() as u64;
    report.phases = Some(crate::result::cluster::Phases {
        checkin_ms: ms(waited),
        probes_ms: ms(probed_at - closed_at),
        assemble_ms: ms(assembled_at - probed_at),
        verdicts_ms: ms(assembled_at.elapsed()),
    });
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
