//! The collective stage: after the cluster stage, every rank moves real
//! data through each selected backend, verifies every element, measures a
//! size sweep, and looks for a straggler; rank 0 assembles one report.
//!
//! One concept per module: `config` (the stage's settings), `rank` (a
//! rank's place and its result), `stage` (what a rank runs), `exercise`
//! (one backend's verification pass and sweep), `tcp` (the built-in TCP
//! backend), `verify` (known buffers and their checks), `sweep` (sizes,
//! timing, the table), `straggler` (pairwise round), `isolate` (its second pass: a slow node told from a
//! slow link), `starved` (a node starved of CPU, by its own wait), `slowness`
//! (rank 0's verdict on who is slow, from both), `assemble` (how rank
//! 0 makes one report of every rank's result), `ending` (why a backend
//! ended, and who is at fault), `checks` (the check results
//! it adds), `floors` (its figures against the node profile's floors).
//! The library backends run in a child process each: `library`
//! (what a library backend says about itself), `driver` (what every
//! library backend shares: the id, init, the exercise as a `Backend`) and
//! `registry` (the list of
//! them), `job` (what the child and its parent say to each other),
//! `worker` (the child), `supervisor` (the parent's side: deadlines, the id
//! exchange, the log), `oneccl` and `nccl` (the backends over our -sys
//! crates). The stage's result is `result::collective`; `report::collective`
//! renders it.

pub mod assemble;
pub mod checks;
pub mod config;
pub mod driver;
mod ending;
pub mod exercise;
pub mod floors;
pub mod isolate;
pub mod job;
pub mod library;
pub mod nccl;
pub mod oneccl;
pub mod rank;
pub mod registry;
pub mod slowness;
pub mod stage;
pub mod starved;
pub mod straggler;
pub mod supervisor;
pub mod sweep;
pub mod tcp;
pub mod verify;
pub mod worker;

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

pub use preflight_result::collective::{Dtype, Op};

/// Why an operation did not complete. Each names the peer when one is to
/// blame, so rank 0 can name the rank that stalled or went away.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OpError {
    /// Nothing (more) arrived from `from` before the deadline.
    RecvTimeout { from: u32 },
    /// `to` stopped taking our data before the deadline.
    SendTimeout { to: u32 },
    /// The connection to `peer` closed or failed.
    Closed { peer: u32, detail: String },
    /// A test hook held this rank (never in a release run).
    Held,
    /// The operation did not complete by its deadline, and the library
    /// does not say which peer it waits for (NCCL, oneCCL).
    Stalled { detail: String },
    /// The library says a peer went away or the network failed (NCCL's
    /// ncclRemoteError): what a rank sees when a peer aborted or died,
    /// not a fault of its own; the peer is not named.
    Remote { detail: String },
    /// Any other failure, in words.
    Other { detail: String },
    /// Data still moved when the step's time budget ran out: a slow step,
    /// not a hang, and nobody to blame. `busbw_mbps` (MB/s of bus
    /// bandwidth), `needs_ms` (what the whole step would take at that
    /// rate) and `budget_ms` are 0 where the backend could not tell; the
    /// sweep fills them in.
    Slow {
        busbw_mbps: u64,
        needs_ms: u64,
        budget_ms: u64,
        /// The peer this rank was still exchanging with when the budget
        /// ran out, if one.
        #[serde(default)]
        waiting_for: Option<u32>,
    },
    /// The run's deadline (`--timeout`) came before the operation ended:
    /// not a fault of the cluster's. `waiting_for`: the peer this rank was
    /// still waiting on then, if any.
    RunDeadline { waiting_for: Option<u32> },
}

impl OpError {
    /// The peer this rank blames, if any.
    pub fn blames(&self) -> Option<u32> {
        match self {
            OpError::RecvTimeout { from } => Some(*from),
            OpError::SendTimeout { to } => Some(*to),
            OpError::Closed { peer, .. } => Some(*peer),
            OpError::Held
            | OpError::Stalled { .. }
            | OpError::Remote { .. }
            | OpError::Other { .. }
            | OpError::Slow { .. }
            | OpError::RunDeadline { .. } => None,
        }
    }

    /// A slow step as a backend sees it, before the sweep adds its
    /// figures: still exchanging with `waiting_for`, if one.
    pub fn still_moving(waiting_for: Option<u32>) -> OpError {
        OpError::Slow {
            busbw_mbps: 0,
            needs_ms: 0,
            budget_ms: 0,
            waiting_for,
        }
    }

    /// What a timeout means when the run's deadline cut the wait short:
    /// the run ran out of time, whoever was being waited on. A closed
    /// connection or a wrong result still means what it says.
    pub fn at_run_deadline(self) -> OpError {
        match self {
            OpError::RecvTimeout { from: p } | OpError::SendTimeout { to: p } => {
                OpError::RunDeadline {
                    waiting_for: Some(p),
                }
            }
            OpError::Slow { waiting_for, .. } => OpError::RunDeadline { waiting_for },
            OpError::Held | OpError::Stalled { .. } => OpError::RunDeadline { waiting_for: None },
            other => other,
        }
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpError::RecvTimeout { from } => write!(f, "nothing arrived from rank {from}"),
            OpError::SendTimeout { to } => write!(f, "rank {to} stopped receiving"),
            OpError::Closed { peer, detail } => {
                write!(f, "the connection to rank {peer} closed ({detail})")
            }
            OpError::Held => write!(f, "held by the test hook"),
            OpError::Stalled { detail } => write!(f, "{detail}"),
            OpError::Remote { detail } | OpError::Other { detail } => write!(f, "{detail}"),
            OpError::Slow {
                busbw_mbps,
                needs_ms,
                budget_ms,
                ..
            } => {
                let d = |ms: &u64| {
                    preflight_ground::values::format_duration(Duration::from_millis(*ms))
                };
                if *busbw_mbps == 0 {
                    write!(
                        f,
                        "data still moved when the step's budget ({}) ran out",
                        d(budget_ms)
                    )
                } else {
                    write!(
                        f,
                        "busbw {:.3} GB/s, the step needs about {}, over its budget of {}",
                        *busbw_mbps as f64 / 1e3,
                        d(needs_ms),
                        d(budget_ms)
                    )
                }
            }
            OpError::RunDeadline { waiting_for: None } => {
                write!(f, "the run's deadline (--timeout) came first")
            }
            OpError::RunDeadline {
                waiting_for: Some(p),
            } => write!(
                f,
                "the run's deadline (--timeout) came first, while waiting for rank {p}"
            ),
        }
    }
}

/// One collective backend. Every call has a deadline; `abort` closes every
/// connection so that peers blocked on this rank learn at once.
// Each rank drives its backends on one current-thread runtime: the
// futures never cross threads, so they need no `Send` bound.
#[allow(async_fn_in_trait)]
pub trait Backend {
    fn name(&self) -> &'static str;
    fn rank(&self) -> u32;
    fn world(&self) -> u32;
    /// Sum of every rank's `buf`, in place.
    async fn allreduce(
        &mut self,
        buf: &mut [u8],
        dtype: Dtype,
        deadline: Instant,
    ) -> Result<(), OpError>;
    /// `root`'s `buf` into every rank's `buf`.
    async fn broadcast(
        &mut self,
        buf: &mut [u8],
        root: u32,
        deadline: Instant,
    ) -> Result<(), OpError>;
    /// Every rank's `input` into `out`, block r from rank r.
    async fn allgather(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        deadline: Instant,
    ) -> Result<(), OpError>;
    /// Sends `send` to `to` while receiving `recv` from `from`.
    async fn sendrecv(
        &mut self,
        send: &[u8],
        to: u32,
        recv: &mut [u8],
        from: u32,
        deadline: Instant,
    ) -> Result<(), OpError>;
    async fn barrier(&mut self, deadline: Instant) -> Result<(), OpError>;
    fn abort(&mut self);
    /// The last operation's own time when the backend measures it better
    /// than the caller's clock can (a device backend leaves out the copies
    /// between host and device that verification needs); `None`: time the
    /// call.
    fn last_op_time(&self) -> Option<Duration> {
        None
    }
    /// Bytes this rank has sent and received so far, where the backend
    /// sees them (the TCP backend; a library does not say): how a step
    /// tells slow from stopped, and how fast it went when cut short.
    fn moved(&self) -> Option<u64> {
        None
    }
}

/// Where a backend stands on this node before anything runs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Availability {
    pub available: bool,
    pub reason: String,
}

/// The built-in backend's availability; the library backends answer from
/// their worker (see `supervisor`), since only loading the library there
/// can tell.
pub fn builtin(name: &str) -> Option<Availability> {
    (name == "tcp").then(|| Availability {
        available: true,
        reason: "built in (CPU, TCP sockets)".into(),
    })
}
