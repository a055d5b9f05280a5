//! What each rank runs in the collective stage, and how rank 0 turns every
//! rank's result into one report that every rank exits with.
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

use super::report::{BackendReport, CollectiveReport, OpStatus, timed_out};
use super::straggler::{self, PairRate};
use super::supervisor::{self, Libraries};
use super::sweep::{self, Failure, Hooks, Row, Step, human_bytes};
use super::tcp::{self, Tcp};
use super::worker::Found;
use super::{Backend, Dtype, Op, OpError};
use crate::cluster::store;
use crate::result::{CheckResult, Status};

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

    /// An upper bound on the stage's duration, for how long rank 0 keeps
    /// the store's connections open.
    pub fn budget(&self) -> Duration {
        let steps =
            (VERIFY_SIZES.len() * 8 + 1 + self.sizes().len() * 3 + straggler::MAX_ROUNDS * 2 + 8)
                as u32;
        self.step_timeout * steps * self.backends.len().max(1) as u32
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
        }
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
    /// PREFLIGHT_COLL_SAME_HOST: `tcp` keeps same-host pairs on TCP.
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
                let unix = tcp::same_host_unix(info.same_host.as_deref())?;
                let deadline = Instant::now() + cfg.step_timeout * 2;
                Tcp::init(info.conn, info.rank, info.world, &ip, unix, deadline).await
            };
            match init.await {
                Ok(mut b) => {
                    rb.init_ms = Some(t.elapsed().as_millis() as u64);
                    result.link = Some(b.link(&info.interfaces));
                    exercise(&mut b, cfg, &info.hooks, &mut rb, &mut |_| {}).await;
                    if rb.failure.is_some() {
                        b.abort();
                    } else {
                        mesh = Some(b);
                    }
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
    if let Some(b) = mesh.as_mut()
        && info.world >= 2
    {
        match straggler::round(b, cfg.pair_bytes(), cfg.step_timeout).await {
            Ok(p) => result.pairs = p,
            Err(e) => {
                result.pair_error = Some(e);
                b.abort();
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
        let step = Step {
            op,
            bytes,
            dtype,
            warmup,
            iters,
            timeout: cfg.step_timeout,
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
            Err(f) => {
                rb.failure = Some(f);
                return;
            }
        }
    }
}

/// A rank without rank 0's report: its own result only.
fn alone(cfg: &Config, hosts: &[String], own: RankResult, why: String) -> CollectiveReport {
    let world = hosts.len() as u32;
    let rank = own.rank;
    let mut all: Vec<Option<RankResult>> = (0..world).map(|_| None).collect();
    if let Some(slot) = all.get_mut(rank as usize) {
        *slot = Some(own);
    }
    let mut r = assemble(cfg, world, &all, hosts);
    r.missing.clear();
    for b in r.backends.iter_mut().filter(|b| b.available) {
        b.verdict = "fail".into();
        b.ended = Some(match b.ended.take() {
            Some(e) => format!("{e}; {why}"),
            None => why.clone(),
        });
    }
    r
}

/// Rank 0: one report from every rank's result.
pub fn assemble(
    cfg: &Config,
    world: u32,
    all: &[Option<RankResult>],
    hosts: &[String],
) -> CollectiveReport {
    let present: Vec<&RankResult> = all.iter().flatten().collect();
    let missing: Vec<u32> = (0..world)
        .filter(|r| all.get(*r as usize).is_none_or(Option::is_none))
        .collect();
    let host = |r: u32| {
        present
            .iter()
            .find(|x| x.rank == r)
            .map(|x| format!(" ({})", x.host))
            .or_else(|| hosts.get(r as usize).map(|h| format!(" ({h})")))
            .unwrap_or_default()
    };
    let mut backends = Vec::new();
    for (bi, name) in cfg.backends.iter().enumerate() {
        let per: Vec<(u32, &RankBackend)> = present
            .iter()
            .filter_map(|x| x.backends.get(bi).map(|b| (x.rank, b)))
            .collect();
        let available = !per.is_empty() && per.iter().all(|(_, b)| b.available);
        let reason = availability_reason(&per, &host);
        let found = per.iter().find_map(|(_, b)| b.found.clone());
        let library = found.map(|f| format!("{} at {}", f.version, f.path));
        // One line per distinct note, naming the ranks that said it.
        let mut said: Vec<(bool, &str, Vec<u32>)> = Vec::new();
        for (r, b) in &per {
            for (warning, text) in &b.notes {
                match said.iter_mut().find(|(w, t, _)| w == warning && t == text) {
                    Some((_, _, ranks)) => ranks.push(*r),
                    None => said.push((*warning, text, vec![*r])),
                }
            }
        }
        let notes: Vec<String> = said
            .iter()
            .map(|(warning, text, ranks)| {
                let who = if ranks.len() == 1 {
                    format!("rank {}{}", ranks[0], host(ranks[0]))
                } else if ranks.len() == per.len() {
                    "every rank".to_string()
                } else {
                    rank_list(ranks)
                };
                format!("{}{who}: {text}", if *warning { "warning: " } else { "" })
            })
            .collect();
        let env_set = per
            .first()
            .map(|(_, b)| b.env_set.clone())
            .unwrap_or_default();
        let log = per
            .iter()
            .find(|(_, b)| {
                !b.log.is_empty() && (b.failure.is_some() || b.init_error.is_some() || !b.available)
            })
            .or_else(|| per.iter().find(|(_, b)| !b.log.is_empty()))
            .map(|(r, b)| b.log.iter().map(|l| format!("rank {r}: {l}")).collect())
            .unwrap_or_default();
        if !available {
            backends.push(BackendReport {
                name: name.clone(),
                available,
                reason,
                library,
                env_set,
                init_ms: None,
                ops: Vec::new(),
                sweep: Vec::new(),
                notes,
                log,
                ended: None,
                verdict: "skip".into(),
            });
            continue;
        }
        let init_ms = per.iter().filter_map(|(_, b)| b.init_ms).max();
        let mut ended = None;
        if let Some((r, b)) = per.iter().find(|(_, b)| b.init_error.is_some()) {
            ended = Some(format!(
                "init failed on rank {r}{}: {}",
                host(*r),
                b.init_error.clone().unwrap_or_default()
            ));
        }
        let failures: Vec<(u32, &Failure)> = per
            .iter()
            .filter_map(|(r, b)| b.failure.as_ref().map(|f| (*r, f)))
            .collect();
        if ended.is_none() && !failures.is_empty() {
            ended = Some(explain(&failures, &present, &missing, &host));
        }
        if ended.is_none() && !missing.is_empty() {
            ended = Some(format!(
                "no result from {}: gone before the end of the stage",
                rank_list(&missing)
            ));
        }
        let failed_op = failures.first().map(|(_, f)| f.op);
        let ops = [
            Op::Allreduce,
            Op::Broadcast,
            Op::Allgather,
            Op::Sendrecv,
            Op::Barrier,
        ]
        .into_iter()
        .map(|op| {
            let everywhere = !per.is_empty()
                && missing.is_empty()
                && per.iter().all(|(_, b)| b.verified.contains(&op));
            let (status, detail) = if failed_op == Some(op) {
                ("failed", ended.clone())
            } else if everywhere {
                ("verified", None)
            } else {
                ("not_run", None)
            };
            OpStatus {
                op: op.name().into(),
                status: status.into(),
                detail,
            }
        })
        .collect();
        // A row counts only when every rank verified that step; its time
        // is the slowest rank's.
        let mut sweep: Vec<Row> = Vec::new();
        if let Some((_, first)) = per.first() {
            for row in &first.rows {
                let mut worst = row.time_us;
                let mut everywhere = true;
                for (_, b) in &per[1..] {
                    match b
                        .rows
                        .iter()
                        .find(|x| x.op == row.op && x.bytes == row.bytes)
                    {
                        Some(x) => worst = worst.max(x.time_us),
                        None => everywhere = false,
                    }
                }
                if everywhere {
                    sweep.push(Row::new(row.op, row.bytes, row.dtype, worst, world));
                }
            }
        }
        let verdict = if ended.is_some() { "fail" } else { "pass" };
        backends.push(BackendReport {
            name: name.clone(),
            available,
            reason,
            library,
            env_set,
            init_ms,
            ops,
            sweep,
            notes,
            log,
            ended,
            verdict: verdict.into(),
        });
    }
    let pairs: Vec<PairRate> = present.iter().flat_map(|x| x.pairs.clone()).collect();
    let stragglers = straggler::stragglers(world, &pairs)
        .into_iter()
        .map(|r| {
            let mine: Vec<f64> = pairs
                .iter()
                .filter(|p| p.a == r || p.b == r)
                .map(|p| p.gbps)
                .collect();
            let best = pairs.iter().map(|p| p.gbps).fold(0.0, f64::max);
            format!(
                "rank {r}{} is slow in every pair it is in: at most {:.3} GB/s, while other pairs reach {best:.3} GB/s",
                host(r),
                mine.iter().copied().fold(0.0, f64::max)
            )
        })
        .collect();
    CollectiveReport {
        mode: cfg.mode.name().into(),
        world_size: world,
        backends,
        pairs,
        stragglers,
        missing,
        links: present.iter().filter_map(|x| x.link.clone()).collect(),
    }
}

/// Why a backend cannot run, naming the ranks that lack it when not all
/// do. A rank that can run it but heard rank 0's "no" carries rank 0's
/// words, which already name the rank ("… (rank 2, host)").
fn availability_reason(per: &[(u32, &RankBackend)], host: &dyn Fn(u32) -> String) -> String {
    let lacking: Vec<(u32, &RankBackend)> = per
        .iter()
        .filter(|(_, b)| !b.available && !b.reason.contains("(rank "))
        .copied()
        .collect();
    if let Some((_, first)) = lacking.first() {
        let same = lacking.iter().all(|(_, b)| b.reason == first.reason);
        if lacking.len() == per.len() && same {
            return first.reason.clone();
        }
        let ranks: Vec<u32> = lacking.iter().map(|(r, _)| *r).collect();
        let hosts: Vec<String> = ranks.iter().map(|r| host(*r)).collect();
        return format!(
            "{} on {}{}",
            first.reason,
            rank_list(&ranks),
            hosts.concat()
        );
    }
    per.iter()
        .find(|(_, b)| !b.available)
        .or(per.first())
        .map(|(_, b)| b.reason.clone())
        .unwrap_or_else(|| "no rank reported".into())
}

fn rank_list(ranks: &[u32]) -> String {
    let names: Vec<String> = ranks.iter().map(u32::to_string).collect();
    if ranks.len() == 1 {
        format!("rank {}", names[0])
    } else {
        format!("ranks {}", names.join(", "))
    }
}

/// Why the backend stopped, naming the rank at fault: a wrong result
/// first (with the contribution that explains it), else the rank every
/// blame leads to: one that blames nobody itself (held, or gone).
fn explain(
    failures: &[(u32, &Failure)],
    present: &[&RankResult],
    missing: &[u32],
    host: &dyn Fn(u32) -> String,
) -> String {
    if let Some((r, f)) = failures.iter().find(|(_, f)| f.mismatch.is_some()) {
        let m = f.mismatch.as_ref().expect("checked above");
        let mut text = format!(
            "{} {} at {} gave a wrong result on rank {r}: element {} expected {} got {} ({} elements wrong)",
            m.op.name(),
            m.dtype.name(),
            human_bytes(f.bytes),
            m.index,
            m.expected,
            m.got,
            m.bad
        );
        if let Some(c) = &m.culprit {
            text.push_str(&format!("; {c}"));
        }
        for (_, g) in failures {
            if let Some(own) = &g.own_contribution_wrong {
                text.push_str(&format!("; {own}: its contribution is wrong"));
            }
        }
        return text;
    }
    let blames = |r: u32| -> Option<u32> {
        failures
            .iter()
            .find(|(x, _)| *x == r)
            .and_then(|(_, f)| f.error.as_ref())
            .and_then(OpError::blames)
    };
    // Count who is blamed by ranks whose own blame does not explain it.
    let mut best: Option<(u32, u32, &Failure)> = None;
    for (victim, f) in failures {
        let Some(culprit) = f.error.as_ref().and_then(OpError::blames) else {
            continue;
        };
        let culprit_is_root = missing.contains(&culprit)
            || blames(culprit).is_none()
            || !present.iter().any(|x| x.rank == culprit);
        if culprit_is_root {
            let prefer = matches!(f.error, Some(OpError::RecvTimeout { .. }));
            if best.is_none() || prefer {
                best = Some((*victim, culprit, f));
            }
        }
    }
    // A library backend cannot say whom it waits for: the rank a test hook
    // held, or one that gave no result, is the one the others waited on.
    if best.is_none() {
        let held: Vec<u32> = failures
            .iter()
            .filter(|(_, f)| matches!(f.error, Some(OpError::Held)))
            .map(|(r, _)| *r)
            .collect();
        let culprits: Vec<u32> = held.iter().chain(missing).copied().collect();
        let waiting: Vec<u32> = failures
            .iter()
            .filter(|(_, f)| matches!(f.error, Some(OpError::Stalled { .. })))
            .map(|(r, _)| *r)
            .collect();
        if let (Some(&c), Some((_, f))) = (
            culprits.first(),
            failures
                .iter()
                .find(|(_, f)| matches!(f.error, Some(OpError::Stalled { .. }))),
        ) {
            let gone = if missing.contains(&c) {
                " (gone: no result)"
            } else {
                ""
            };
            return format!(
                "{} timed out at {} on {}: rank {c}{} stopped taking part{gone}",
                f.op.name(),
                human_bytes(f.bytes),
                rank_list(&waiting),
                host(c)
            );
        }
    }
    let (victim, culprit, f) = match best {
        Some(b) => b,
        None => {
            let (victim, f) = failures[0];
            match f.error.as_ref().and_then(OpError::blames) {
                Some(c) => (victim, c, f),
                None => {
                    return format!(
                        "{} failed at {} on rank {victim}{}: {}",
                        f.op.name(),
                        human_bytes(f.bytes),
                        host(victim),
                        f.error
                            .as_ref()
                            .map(ToString::to_string)
                            .unwrap_or_default()
                    );
                }
            }
        }
    };
    let gone = if missing.contains(&culprit) {
        " and gave no result (gone)"
    } else {
        ""
    };
    match &f.error {
        Some(OpError::RecvTimeout { .. }) => format!(
            "{}{gone}",
            timed_out(
                f.op.name(),
                f.bytes,
                &format!("rank {culprit}{}", host(culprit)),
                victim,
                true
            ),
        ),
        Some(OpError::SendTimeout { .. }) => format!(
            "{}{gone}",
            timed_out(
                f.op.name(),
                f.bytes,
                &format!("rank {culprit}{}", host(culprit)),
                victim,
                false
            ),
        ),
        Some(e) => format!(
            "{} failed at {}: rank {culprit}{} broke off{gone}; rank {victim} saw: {e}",
            f.op.name(),
            human_bytes(f.bytes),
            host(culprit)
        ),
        None => format!("{} failed at {}", f.op.name(), human_bytes(f.bytes)),
    }
}

/// The checks this stage adds to the report.
pub fn checks(r: &CollectiveReport, required: &[String]) -> Vec<CheckResult> {
    let mut out = Vec::new();
    for b in &r.backends {
        let id = format!("collective.{}", b.name);
        let library = b
            .library
            .as_deref()
            .map(|l| format!(" ({l})"))
            .unwrap_or_default();
        let (status, message, hint) = match b.verdict.as_str() {
            "skip" if required.contains(&b.name) => (
                Status::Fail,
                format!(
                    "{}: required, but not available: {}{library}",
                    b.name, b.reason
                ),
                Some(missing_hint(&b.name)),
            ),
            "skip" => (
                Status::Skip,
                format!("{}: {}{library}", b.name, b.reason),
                None,
            ),
            "pass" => {
                let best = b
                    .sweep
                    .iter()
                    .filter(|x| x.op == Op::Allreduce)
                    .max_by_key(|x| x.bytes);
                let figure = best
                    .map(|x| {
                        format!(
                            "; allreduce {} busbw {:.3} GB/s",
                            human_bytes(x.bytes),
                            x.busbw
                        )
                    })
                    .unwrap_or_default();
                let warnings: Vec<&str> = b
                    .notes
                    .iter()
                    .filter_map(|n| n.strip_prefix("warning: "))
                    .collect();
                let text = format!(
                    "{}: 5 operations verified on {} ranks{figure}",
                    b.name, r.world_size
                );
                if warnings.is_empty() {
                    (Status::Pass, text, None)
                } else {
                    (
                        Status::Warn,
                        format!("{text}; {}", warnings.join("; ")),
                        Some("The backend works, but not as the node is built to: read the warning, then NCCL_DEBUG=INFO output on the rank named.".into()),
                    )
                }
            }
            _ => (
                Status::Fail,
                format!(
                    "{}: {}",
                    b.name,
                    b.ended.clone().unwrap_or_else(|| "failed".into())
                ),
                Some(if b.name == "tcp" {
                    "Run `preflight bench` on the nodes named; check the NIC, MTU, GLOO_SOCKET_IFNAME and firewall between them.".into()
                } else {
                    format!(
                        "Run `preflight bench --backends {}` on the nodes named and read the library's log in the collective section (JSON: collective.backends[].log); check the network settings it names.",
                        b.name
                    )
                }),
            ),
        };
        out.push(synthetic(&id, status, message, hint));
    }
    if !r.stragglers.is_empty() {
        out.push(synthetic(
            "collective.stragglers",
            Status::Warn,
            r.stragglers.join("; "),
            Some("Compare the named node's link speed, MTU and qdisc (`tc qdisc show`) with the others'.".into()),
        ));
    }
    out
}

/// What to do when a required backend is missing on a node.
pub fn missing_hint(backend: &str) -> String {
    match backend {
        "nccl" => "Install NCCL (or RCCL) where the job can load it, or point --nccl-lib / PREFLIGHT_NCCL_LIB at libnccl.so.2; on a node without a GPU or driver, check nvidia-smi first. Leave nccl out of --backends on CPU-only nodes.".into(),
        "oneccl" => "Install oneCCL 2022 or later (libccl.so.2), source its setvars.sh (CCL_ROOT), or point --oneccl-lib / PREFLIGHT_ONECCL_LIB at it.".into(),
        other => format!("Check that the {other} backend can run on the node named."),
    }
}

fn synthetic(id: &str, status: Status, message: String, hint: Option<String>) -> CheckResult {
    let mut c = crate::cluster::barrier::synthetic(id, "collective", status, message, hint);
    c.area = "collective".into();
    c.tags = vec!["collective".into()];
    c
}
