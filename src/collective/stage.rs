//! What each rank runs in the collective stage; `assemble` turns every
//! rank's result into the one report that every rank exits with.
//!
//! Order per backend: init through the rendezvous store; a verification
//! pass (all five operations, f32 and i32, odd element counts); the sweep
//! (allreduce, allgather, broadcast over the sizes); then the pairwise
//! round. The first failure ends the backend: its connections are closed so
//! that peers blocked on this rank learn at once. Each rank stores its
//! result under `coll/result/RANK`; rank 0 gathers them (waiting at most a
//! step's deadline plus a margin), names the culprit, and stores the
//! report under `coll/report`, which the others wait for.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::assemble::{alone, assemble};
use super::report::CollectiveReport;
use super::straggler::{self, PairRate};
use super::supervisor::{self, Libraries};
use super::sweep::{self, Failure, Hooks, Row, Step};
use super::tcp::{self, Tcp};
use super::worker::Found;
use super::{Backend, Dtype, Op, OpError};
use crate::cluster::store;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Off,
    Short,
    Full,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Short => "short",
            Mode::Full => "full",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub backends: Vec<String>,
    /// Backends whose absence makes the node not ready (named on the
    /// command line; the checklist's `collective_backend` adds its own).
    pub required: Vec<String>,
    pub max_size: usize,
    pub step_factor: usize,
    pub warmup: u32,
    pub iters: u32,
    pub step_timeout: Duration,
    /// The run's deadline (`--timeout`, as rank 0 set it): no phase of the
    /// stage waits past it. None until the verdict has said when it is.
    pub until: Option<Instant>,
}

/// Element counts that are not powers of two and do not divide evenly
/// among most world sizes: 1, 257 and 1027 elements.
const VERIFY_SIZES: [usize; 3] = [4, 1028, 4108];

impl Config {
    pub fn sizes(&self) -> Vec<usize> {
        match self.mode {
            Mode::Off => Vec::new(),
            // A few sizes: latency, mid, and bandwidth.
            Mode::Short => sweep::sizes(self.max_size, self.step_factor)
                .into_iter()
                .filter(|s| [8, 64 << 10, self.max_size].contains(s))
                .collect(),
            Mode::Full => sweep::sizes(self.max_size, self.step_factor),
        }
    }

    fn pair_bytes(&self) -> usize {
        match self.mode {
            Mode::Full => 4 << 20,
            _ => 1 << 20,
        }
    }

    /// The deadline of a phase that may take `d`: `d` from now, or the
    /// run's deadline when that comes first.
    pub fn deadline(&self, d: Duration) -> Instant {
        let end = Instant::now() + d;
        self.until.map_or(end, |u| end.min(u))
    }

    /// Whether the run's deadline has passed.
    pub fn out_of_time(&self) -> bool {
        self.until.is_some_and(|u| Instant::now() >= u)
    }

    /// An error as it stands once the run's deadline may have cut the
    /// wait that ended in it (see `OpError::at_run_deadline`).
    pub fn judge(&self, e: OpError) -> OpError {
        if self.out_of_time() {
            e.at_run_deadline()
        } else {
            e
        }
    }

    /// How long past the run's deadline the stage may still take, for
    /// how long rank 0 keeps the store's connections open: every phase
    /// ends by the deadline, then a stuck library worker has its grace and
    /// is killed, rank 0 waits for the results (a step's deadline and 5 s
    /// at most), and the report goes out.
    pub fn budget(&self) -> Duration {
        (self.step_timeout + Duration::from_secs(5)) * 2 + Duration::from_secs(30)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankResult {
    pub rank: u32,
    /// "hostname (address)".
    pub host: String,
    pub backends: Vec<RankBackend>,
    pub pairs: Vec<PairRate>,
    pub pair_error: Option<OpError>,
    /// The TCP backend's interface, link speed and transports.
    #[serde(default)]
    pub link: Option<tcp::RankLink>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankBackend {
    pub name: String,
    pub available: bool,
    pub reason: String,
    /// The library a worker loaded, and its version.
    #[serde(default)]
    pub found: Option<Found>,
    /// Library settings this rank added to the worker's environment.
    #[serde(default)]
    pub env_set: Vec<String>,
    pub init_ms: Option<u64>,
    pub init_error: Option<String>,
    pub verified: Vec<Op>,
    pub rows: Vec<Row>,
    pub failure: Option<Failure>,
    /// What the backend said about itself (warning?, text): the transport
    /// chosen, a fallback and why.
    #[serde(default)]
    pub notes: Vec<(bool, String)>,
    /// The worker's last output lines, kept when something went wrong.
    #[serde(default)]
    pub log: Vec<String>,
    /// The run's deadline ended the probe, the plan or init.
    #[serde(default)]
    pub out_of_time: bool,
}

impl RankBackend {
    pub fn new(name: &str, available: bool, reason: String) -> RankBackend {
        RankBackend {
            name: name.into(),
            available,
            reason,
            found: None,
            env_set: Vec::new(),
            init_ms: None,
            init_error: None,
            verified: Vec::new(),
            rows: Vec::new(),
            failure: None,
            notes: Vec::new(),
            log: Vec::new(),
            out_of_time: false,
        }
    }

    /// Whether the run's deadline, not a fault, ended this backend.
    pub fn ran_out_of_time(&self) -> bool {
        self.out_of_time
            || matches!(
                self.failure.as_ref().and_then(|f| f.error.as_ref()),
                Some(OpError::RunDeadline { .. })
            )
    }
}

pub struct RankInfo<'a> {
    pub rank: u32,
    pub world: u32,
    pub local_rank: u32,
    pub local_world: u32,
    pub libraries: Libraries,
    pub host: String,
    /// The address this rank reached the master from: the route's choice.
    pub route_ip: String,
    pub gloo_ifname: Option<String>,
    /// PREFLIGHT_COLL_SAME_HOST: how same-host pairs talk (`direct`,
    /// `unix` or `tcp`).
    pub same_host: Option<String>,
    /// The node's interface facts, for the TCP backend's link speed.
    pub interfaces: Vec<crate::facts::Interface>,
    pub hooks: Hooks,
    /// Each rank's node as the cluster report names it, for ranks whose
    /// own result never arrives.
    pub hosts: Vec<String>,
    pub conn: &'a mut TcpStream,
}

/// One rank's whole stage; every rank returns the same report (or, when
/// rank 0 is gone, its own view).
pub async fn run(cfg: &Config, mut info: RankInfo<'_>) -> CollectiveReport {
    let mut result = RankResult {
        rank: info.rank,
        host: info.host.clone(),
        backends: Vec::new(),
        pairs: Vec::new(),
        pair_error: None,
        link: None,
    };
    let mut mesh: Option<Tcp> = None;
    // The library workers load and probe while the TCP backend runs.
    let mut starting: Vec<(String, Result<supervisor::StartingWorker, String>)> = cfg
        .backends
        .iter()
        .filter(|n| super::builtin(n).is_none())
        .map(|n| (n.clone(), supervisor::start(n, cfg, &info)))
        .collect();
    for name in &cfg.backends {
        if let Some(avail) = super::builtin(name) {
            let mut rb = RankBackend::new(name, avail.available, avail.reason);
            let t = Instant::now();
            let init = async {
                let ip = tcp::listen_ip(info.gloo_ifname.as_deref(), &info.route_ip)?;
                let same_host = tcp::same_host_mode(info.same_host.as_deref())?;
                let deadline = cfg.deadline(cfg.step_timeout * 2);
                Tcp::init(info.conn, info.rank, info.world, &ip, same_host, deadline).await
            };
            match init.await {
                Ok(mut b) => {
                    rb.init_ms = Some(t.elapsed().as_millis() as u64);
                    result.link = Some(b.link(&info.interfaces));
                    exercise(&mut b, cfg, &info.hooks, &mut rb, &mut |_| {}).await;
                    // Out of time, the connections stay open: a peer whose
                    // clock reads the deadline a moment later must not see
                    // this rank leave and blame it.
                    if rb.failure.is_some() && !rb.ran_out_of_time() {
                        b.abort();
                    } else {
                        mesh = Some(b);
                    }
                }
                Err(e) if cfg.out_of_time() => {
                    rb.init_error = Some(format!(
                        "{e}; {}",
                        OpError::RunDeadline { waiting_for: None }
                    ));
                    rb.out_of_time = true;
                }
                Err(e) => rb.init_error = Some(e),
            }
            result.backends.push(rb);
        } else {
            let i = starting.iter().position(|(n, _)| n == name);
            let started = match i {
                Some(i) => starting.swap_remove(i).1,
                None => Err("no worker was started".into()),
            };
            let rb = supervisor::run(name, started, cfg, &mut info).await;
            result.backends.push(rb);
        }
    }
    // Not when a backend ran out of time: the round would only wait for
    // ranks that are done.
    if let Some(b) = mesh.as_mut()
        && info.world >= 2
        && !result.backends.iter().any(RankBackend::ran_out_of_time)
        && !cfg.out_of_time()
    {
        match straggler::round(b, cfg.pair_bytes(), || cfg.deadline(cfg.step_timeout)).await {
            Ok(p) => result.pairs = p,
            Err(e) => {
                let e = cfg.judge(e);
                if !matches!(e, OpError::RunDeadline { .. }) {
                    b.abort();
                }
                result.pair_error = Some(e);
            }
        }
    }
    let margin = cfg.step_timeout + Duration::from_secs(5);
    let json = serde_json::to_string(&result).unwrap_or_default();
    let key = format!("coll/result/{}", info.rank);
    let _ = store::set(
        info.conn,
        &key,
        &json,
        Instant::now() + Duration::from_secs(5),
    )
    .await;
    if info.rank == 0 {
        let gather_end = Instant::now() + margin;
        let mut all: Vec<Option<RankResult>> = (0..info.world).map(|_| None).collect();
        all[0] = Some(result);
        // Poll rather than wait on one rank at a time: a rank whose sockets
        // every peer saw close is gone, and waiting out the margin for its
        // result would only delay the verdict.
        loop {
            for r in 1..info.world {
                if all[r as usize].is_some() {
                    continue;
                }
                all[r as usize] = store::get(
                    info.conn,
                    &format!("coll/result/{r}"),
                    Duration::ZERO,
                    Instant::now() + Duration::from_secs(2),
                )
                .await
                .ok()
                .flatten()
                .and_then(|v| serde_json::from_str::<RankResult>(&v).ok());
            }
            let absent: Vec<u32> = (0..info.world)
                .filter(|r| all[*r as usize].is_none())
                .collect();
            if absent.is_empty() || Instant::now() >= gather_end {
                break;
            }
            let gone = |r: u32| {
                all.iter().flatten().any(|x| {
                    x.backends.iter().any(|b| {
                        matches!(
                            b.failure.as_ref().and_then(|f| f.error.as_ref()),
                            Some(OpError::Closed { peer, .. }) if *peer == r
                        )
                    })
                })
            };
            // Everyone else has reported and every absent rank is gone.
            if absent.iter().all(|r| gone(*r)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let report = assemble(cfg, info.world, &all, &info.hosts);
        let text = serde_json::to_string(&report).unwrap_or_default();
        let _ = store::set(
            info.conn,
            "coll/report",
            &text,
            Instant::now() + Duration::from_secs(5),
        )
        .await;
        // The store lives in this process: stay until every rank that gave
        // a result has fetched the report (each acknowledges), 5 s at most.
        let ack_end = Instant::now() + Duration::from_secs(5);
        for r in 1..info.world {
            if report.missing.contains(&r) {
                continue;
            }
            let wait = ack_end.saturating_duration_since(Instant::now());
            let _ = store::get(
                info.conn,
                &format!("coll/ack/{r}"),
                wait,
                ack_end + Duration::from_secs(1),
            )
            .await;
        }
        report
    } else {
        let wait = margin * 2;
        let got = store::get(
            info.conn,
            "coll/report",
            wait,
            Instant::now() + wait + Duration::from_secs(2),
        )
        .await;
        if let Ok(Some(_)) = &got {
            let _ = store::set(
                info.conn,
                &format!("coll/ack/{}", info.rank),
                "1",
                Instant::now() + Duration::from_secs(2),
            )
            .await;
        }
        match got {
            Ok(Some(v)) => match serde_json::from_str(&v) {
                Ok(r) => r,
                Err(e) => alone(cfg, &info.hosts, result, format!("rank 0's report: {e}")),
            },
            Ok(None) => alone(
                cfg,
                &info.hosts,
                result,
                "rank 0 sent no collective report in time".into(),
            ),
            Err(e) => alone(
                cfg,
                &info.hosts,
                result,
                format!("rank 0 is gone (the rendezvous connection failed: {e})"),
            ),
        }
    }
}

/// What `exercise` tells its caller as it goes: a worker passes it on to
/// its parent, which holds each step's deadline and keeps the steps that
/// passed should the worker have to be killed later.
pub enum Progress<'a> {
    Begin { op: Op, bytes: usize },
    Passed { op: Op, row: Option<&'a Row> },
}

/// The verification pass, then the sweep, recording into `rb`.
pub async fn exercise<B: Backend>(
    b: &mut B,
    cfg: &Config,
    hooks: &Hooks,
    rb: &mut RankBackend,
    progress: &mut dyn FnMut(Progress<'_>),
) {
    debug_assert_eq!(b.name(), rb.name);
    let mut plan: Vec<(Op, usize, Dtype, u32, u32, bool)> = Vec::new();
    for dtype in [Dtype::F32, Dtype::I32] {
        for op in [Op::Allreduce, Op::Broadcast, Op::Allgather, Op::Sendrecv] {
            for &size in &VERIFY_SIZES {
                plan.push((op, size, dtype, 0, 1, false));
            }
        }
    }
    plan.push((Op::Barrier, 0, Dtype::F32, 0, 1, false));
    for size in cfg.sizes() {
        for op in [Op::Allreduce, Op::Allgather, Op::Broadcast] {
            plan.push((op, size, Dtype::F32, cfg.warmup, cfg.iters, true));
        }
    }
    for (op, bytes, dtype, warmup, iters, timed) in plan {
        if cfg.out_of_time() {
            rb.failure = Some(Failure {
                op,
                bytes,
                error: Some(OpError::RunDeadline { waiting_for: None }),
                mismatch: None,
                own_contribution_wrong: None,
            });
            return;
        }
        let step = Step {
            op,
            bytes,
            dtype,
            warmup,
            iters,
            deadline: cfg.deadline(cfg.step_timeout),
            hooks,
        };
        progress(Progress::Begin { op, bytes });
        match sweep::step(b, &step).await {
            Ok(row) => {
                progress(Progress::Passed {
                    op,
                    row: timed.then_some(&row),
                });
                if !rb.verified.contains(&op) {
                    rb.verified.push(op);
                }
                if timed {
                    rb.rows.push(row);
                }
            }
            Err(mut f) => {
                f.error = f.error.map(|e| cfg.judge(e));
                rb.failure = Some(f);
                return;
            }
        }
    }
}
