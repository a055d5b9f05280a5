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
//!
//! `serve` is the order of things; each part is its own module:
//! pending (connections before they prove the secret), connection (one
//! connection's requests), owners (who writes which store keys), events
//! (what the barrier gathers), probes (the reachability round), verdict
//! (the report assembled), fanout (the verdict sent), closing (late
//! arrivals told), reply (the one refusal and reply deadline).

mod closing;
mod connection;
mod events;
mod fanout;
mod listen;
mod owners;
mod pending;
mod probes;
mod reply;
#[cfg(test)]
mod tests;
mod verdict;

pub use listen::{bind, bound_name};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;

use super::auth::Token;
use super::barrier::{BarrierState, ConnId, Placement};
use super::checkin::CheckIn;
use super::sealed::Channel;
use super::store::Store;
use events::Gathered;
use preflight_checklist::Check;
use preflight_facts::Facts;
use preflight_result::cluster::{ClusterReport, Probe};
use verdict::{Round, assemble, build_nodes};
/// What a server's connections share beyond the store.
struct Shared {
    /// Who may write which store keys.
    owners: owners::Owners,
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
    i: &preflight_ground::interrupt::Interruption,
    rank: Option<u32>,
    host: &str,
) -> preflight_result::report::Interrupted {
    preflight_result::report::Interrupted {
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
    let limits = pending::pending_limits(
        preflight_facts::limits::open_files(),
        cfg.world_size,
        per_node,
    );
    let shared = Arc::new(Shared {
        owners: owners::Owners::default(),
        open: std::sync::atomic::AtomicUsize::new(0),
        max_open: 2 * cfg.world_size as usize + 64,
        pending: limits,
        per_conn: (per_node as usize).max(1),
        serving: (cfg.serving_rank, cfg.facts.hostname().to_string()),
    });
    let accept = tokio::spawn(pending::accept_loop(
        listener,
        connection::Serving {
            token: cfg.token.clone(),
            tx: tx.clone(),
            store: Arc::clone(&store),
            store_end,
            offset_ms: cfg.clock_offset_ms,
            shared,
        },
    ));
    drop(tx);
    let mut g = Gathered::new(BarrierState::new(cfg.world_size, cfg.placement.clone()));

    // A signal closes the barrier at once: the ranks here are told why
    // there is no verdict instead of waiting for the deadline.
    let mut interrupted = None;
    // Twice a second at most: the first missing ranks are a scan of the
    // world, cheap at that rate at any size.
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !g.state.settled() {
        tokio::select! {
            biased;
            i = preflight_ground::interrupt::wait() => {
                interrupted = Some(i);
                break;
            }
            _ = tick.tick(), if cfg.waiting.is_some() => {
                if let Some(w) = &cfg.waiting {
                    let _ = w.send(g.state.waiting());
                }
            }
            ev = tokio::time::timeout_at(cfg.deadline, rx.recv()) => match ev {
                Ok(Some(ev)) => g.handle(ev),
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
    let nodes = build_nodes(&g.state);
    let probed = probes::round(&cfg, &mut g, &mut rx, &nodes, interrupted.is_none()).await;
    let probed_at = Instant::now();
    let told = interrupted
        .as_ref()
        .map(|i| notice(i, cfg.serving_rank, cfg.facts.hostname()));
    let round = Round {
        probes: std::mem::take(&mut g.probes),
        deaf: &probed.deaf,
        asked_to_probe: probed.asked,
    };
    let mut report = assemble(&cfg, &g.state, nodes, round, waited, told);
    let assembled_at = Instant::now();
    let left_ms = cfg
        .deadline
        .saturating_duration_since(Instant::now())
        .as_millis() as u64;
    fanout::send_verdicts(&cfg, &mut g, &report, &store, left_ms).await;
    let ms = |d: Duration| d.as_millis() as u64;
    report.phases = Some(preflight_result::cluster::Phases {
        checkin_ms: ms(waited),
        probes_ms: ms(probed_at - closed_at),
        assemble_ms: ms(assembled_at - probed_at),
        verdicts_ms: ms(assembled_at.elapsed()),
    });
    if interrupted.is_some() {
        accept.abort();
        return report;
    }
    // The barrier has closed: a process that checks in from now on is
    // told it came too late, for as long as the store serves.
    let closed = closing::Closed::new(&report, &g.state, cfg.world_size);
    tokio::spawn(async move {
        closed.answer(&mut rx, store_end).await;
        accept.abort();
    });
    report
}
