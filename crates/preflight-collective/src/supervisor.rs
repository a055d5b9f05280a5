//! The rank's side of a library backend: starts the worker process (see
//! `worker`), agrees through the rendezvous store whether every rank can
//! run the backend, carries the unique id from rank 0's worker to every
//! other worker, and holds each phase to a deadline, killing the worker
//! when one passes. The worker's stdout and stderr (oneCCL and NCCL log
//! there) are kept as the backend's log.
//!
//! Store keys, per backend B: `coll/B/avail/R` (rank R's probe),
//! `coll/B/plan` (rank 0's decision: go with the id, or why not).

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::config::Config;
use super::job::{JOB_ENV, Job, JobConfig, PARENT_ENV, SOCKET_ENV, ToParent, ToWorker};
use super::library::EnvInput;
use super::rank::{RankBackend, RankInfo};
use super::registry::library;
use super::sweep::Failure;
use super::{Op, OpError};
use preflight_cluster::store;

/// Lines of the worker's output kept for the report.
const LOG_LINES: usize = 40;

/// Beyond a step's own deadline: the worker's library (NCCL) aborts at the
/// deadline itself and reports; only a worker stuck past this is killed.
const GRACE: Duration = Duration::from_secs(5);

/// Loading a library and probing the devices.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Serialize, Deserialize)]
struct Avail {
    available: bool,
    reason: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Plan {
    go: bool,
    /// The unique id, hex, when go.
    id: String,
    /// Why not, naming the rank.
    reason: String,
}

/// How long init may take: NCCL and oneCCL set up their own connections,
/// at least [`INIT_FLOOR`] however short the steps.
fn init_timeout(cfg: &Config) -> Duration {
    #[cfg(feature = "test-hooks")]
    let floor = std::env::var(preflight_ground::test_hooks::INIT_FLOOR_MS)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(INIT_FLOOR, Duration::from_millis);
    #[cfg(not(feature = "test-hooks"))]
    let floor = INIT_FLOOR;
    (cfg.step_timeout * 2).max(floor)
}

/// Init's least time: a large job's NCCL init exchanges every rank's
/// addresses and opens its rings before the first step.
const INIT_FLOOR: Duration = Duration::from_secs(30);

/// How a library backend began on this rank.
pub enum Started {
    /// The worker, loading and probing its library.
    Worker(Box<StartingWorker>),
    /// The library is nowhere its worker would look: why, in the worker's
    /// words, with no process started.
    Absent(String),
    /// The worker could not be started: why.
    Failed(String),
}

/// Starts backend `name`'s worker, which loads and probes its library at
/// once: started before the TCP backend runs, the probe costs no time. A
/// library that file lookups alone show missing starts nothing: a worker
/// and its loader would cost more than the TCP backend's whole run.
pub fn start(name: &str, cfg: &Config, info: &RankInfo<'_>) -> Started {
    let absent = library(name).and_then(|l| (l.absent)(info.libraries.get(name).as_deref()));
    if let Some(why) = absent {
        return Started::Absent(why);
    }
    match Worker::start(name, cfg, info, init_timeout(cfg)) {
        Ok(w) => Started::Worker(Box::new(w)),
        Err(e) => Started::Failed(e),
    }
}

/// Runs backend `name` on this rank with the worker `start` gave; every
/// failure is recorded in the result, never returned.
pub async fn run(
    name: &str,
    started: Started,
    cfg: &Config,
    info: &mut RankInfo<'_>,
) -> RankBackend {
    let mut rb = RankBackend::new(name, false, String::new());
    let init_timeout = init_timeout(cfg);
    let started = match started {
        Started::Worker(s) => Worker::connect(*s).await,
        Started::Failed(e) => Err((e, Vec::new())),
        Started::Absent(why) => {
            rb.reason = why;
            publish_avail(info, name, &rb).await;
            let _ = plan(info, name, &rb, None, cfg.deadline(init_timeout)).await;
            return rb;
        }
    };
    let mut worker = match started {
        Ok(w) => w,
        Err((e, log)) => {
            rb.reason = format!("cannot start the worker process: {e}");
            rb.log = log;
            publish_avail(info, name, &rb).await;
            let _ = plan(info, name, &rb, None, cfg.deadline(init_timeout)).await;
            return rb;
        }
    };
    // Probe.
    match worker.recv(cfg.deadline(PROBE_TIMEOUT)).await {
        Ok(ToParent::Probe {
            available,
            reason,
            found,
        }) => {
            rb.available = available;
            rb.reason = reason;
            rb.found = found;
        }
        Ok(other) => rb.reason = format!("the worker answered {other:?} to the probe"),
        Err(e) => rb.reason = format!("the probe {e}"),
    }
    rb.env_set = worker.env_set.clone();
    publish_avail(info, name, &rb).await;
    let go = plan(
        info,
        name,
        &rb,
        Some(&mut worker),
        cfg.deadline(init_timeout),
    )
    .await;
    let id = match go {
        Ok(id) => id,
        Err(reason) if cfg.out_of_time() => {
            rb.reason = format!("{reason}; {}", OpError::RunDeadline { waiting_for: None });
            rb.out_of_time = true;
            worker.kill().await;
            rb.log = worker.log_tail();
            return rb;
        }
        Err(reason) => {
            // Skip, on every rank alike; this rank's own reason stays when
            // it is the one that cannot.
            if rb.available {
                rb.available = false;
                rb.reason = reason;
            }
            worker.stop().await;
            rb.log = worker.log_tail();
            return rb;
        }
    };
    // Init.
    let t = std::time::Instant::now();
    if let Err(e) = worker.send(&ToWorker::Id { hex: id }).await {
        rb.init_error = Some(e);
        worker.kill().await;
        rb.log = worker.log_tail();
        return rb;
    }
    // The worker's library aborts init at init_timeout itself and says
    // so; the same instant here would race it and kill the worker first.
    let init_end = cfg.deadline(init_timeout + GRACE);
    loop {
        match next(&mut worker, init_end, info).await {
            Ok(ToParent::Init { ms }) => {
                rb.init_ms = Some(ms.max(t.elapsed().as_millis() as u64));
                break;
            }
            Ok(ToParent::InitFailed { error, stalled }) => {
                rb.init_error = Some(error);
                rb.init_stalled = stalled;
                break;
            }
            Ok(ToParent::Note { warning, text }) => rb.notes.push((warning, text)),
            Ok(other) => {
                rb.init_error = Some(format!("the worker answered {other:?} during init"));
                break;
            }
            Err(Heard::Rank0(notice)) => {
                rb.init_error = Some(notice.describe());
                rb.told = Some(notice);
                break;
            }
            Err(Heard::Worker(e)) => {
                rb.out_of_time = e == TIMED_OUT && cfg.out_of_time();
                rb.init_stalled = e == TIMED_OUT;
                rb.init_error = Some(match e.as_str() {
                    TIMED_OUT if rb.out_of_time => format!(
                        "init had not finished when the run's deadline (--timeout) came, {}s after it began",
                        t.elapsed().as_secs()
                    ),
                    TIMED_OUT => format!(
                        "init did not finish within {}s (a rank that never reached init, or a network the library cannot use)",
                        init_timeout.as_secs()
                    ),
                    _ => format!("the worker {e}"),
                });
                break;
            }
        }
    }
    if rb.init_error.is_some() {
        worker.kill().await;
        rb.log = worker.log_tail();
        return rb;
    }
    // Steps.
    // The worker holds the run's deadline too, and says so itself; GRACE
    // past it, the worker is killed.
    // Each step has the budget the worker announces (see sweep::budget),
    // the step timeout before the first.
    let step_end = |budget: Duration| {
        let end = Instant::now() + budget + GRACE;
        cfg.until.map_or(end, |u| end.min(u + GRACE))
    };
    let mut current: Option<(Op, usize)> = None;
    let mut budget = cfg.step_timeout;
    let mut deadline = step_end(budget);
    loop {
        match next(&mut worker, deadline, info).await {
            Ok(ToParent::Step {
                op,
                bytes,
                budget_ms,
            }) => {
                current = Some((op, bytes));
                budget = Duration::from_millis(budget_ms).max(cfg.step_timeout);
                deadline = step_end(budget);
            }
            Ok(ToParent::Passed { op, row }) => {
                if !rb.verified.contains(&op) {
                    rb.verified.push(op);
                }
                if let (Some(f), Some(r)) = (info.on_row, &row) {
                    f(name, r);
                }
                rb.rows.extend(row);
            }
            Ok(ToParent::Note { warning, text }) => rb.notes.push((warning, text)),
            Ok(ToParent::Done {
                verified,
                rows,
                failure,
            }) => {
                // The worker's own account is the whole one.
                rb.verified = verified;
                rb.rows = rows;
                rb.failure = failure;
                break;
            }
            Ok(other) => {
                rb.failure = Some(broke(current, format!("the worker said {other:?}")));
                break;
            }
            Err(Heard::Rank0(notice)) => {
                rb.failure = Some(stalled(current, notice.describe()));
                rb.told = Some(notice);
                break;
            }
            Err(Heard::Worker(e)) if e == TIMED_OUT && cfg.out_of_time() => {
                rb.failure = Some(failure(current, OpError::RunDeadline { waiting_for: None }));
                break;
            }
            Err(Heard::Worker(e)) => {
                // Only a worker still waiting at the deadline stalled; one
                // that died (a crash inside the library) failed by itself.
                rb.failure = Some(match e.as_str() {
                    TIMED_OUT => stalled(
                        current,
                        format!(
                            "did not complete within {}s; killed (the library does not say which peer it waits for)",
                            (budget + GRACE).as_secs()
                        ),
                    ),
                    _ => broke(current, format!("the worker {e}")),
                });
                break;
            }
        }
    }
    if rb.failure.is_some() {
        worker.kill().await;
        rb.log = worker.log_tail();
    } else {
        worker.finish().await;
        if rb.notes.iter().any(|(w, _)| *w) {
            rb.log = worker.log_tail();
        }
    }
    rb
}

/// What ended a wait on the worker: its own failure, or rank 0's word
/// that a signal interrupted it.
enum Heard {
    Worker(String),
    Rank0(Box<preflight_result::report::Interrupted>),
}

/// The worker's next message. A library blocked on a rank that left may
/// not notice for a long time: meanwhile a rank other than 0 looks, every
/// half second, for rank 0's word that a signal interrupted it (pushed to
/// it, not asked for: it costs rank 0 nothing).
async fn next(
    worker: &mut Worker,
    deadline: Instant,
    info: &mut RankInfo<'_>,
) -> Result<ToParent, Heard> {
    if info.rank == 0 {
        return worker.recv(deadline).await.map_err(Heard::Worker);
    }
    let every = Duration::from_millis(500);
    loop {
        let tick = (Instant::now() + every).min(deadline);
        match worker.recv(tick).await {
            Err(e) if e == TIMED_OUT && Instant::now() < deadline => {}
            got => return got.map_err(Heard::Worker),
        }
        if let Some(notice) = preflight_cluster::store::rank0_interrupted(info.conn).await {
            return Err(Heard::Rank0(notice));
        }
    }
}

/// The step `current` (or, before any step, the barrier at 0 bytes)
/// failed with `error`.
fn failure(current: Option<(Op, usize)>, error: OpError) -> Failure {
    let (op, bytes) = current.unwrap_or((Op::Barrier, 0));
    Failure {
        op,
        bytes,
        error: Some(error),
        mismatch: None,
        own_contribution_wrong: None,
    }
}

/// Still waiting at the deadline, on whom the library does not say.
fn stalled(current: Option<(Op, usize)>, detail: String) -> Failure {
    failure(current, OpError::Stalled { detail })
}

/// Failed by itself: the worker died or broke the protocol.
fn broke(current: Option<(Op, usize)>, detail: String) -> Failure {
    failure(current, OpError::Other { detail })
}

async fn publish_avail(info: &mut RankInfo<'_>, name: &str, rb: &RankBackend) {
    let a = Avail {
        available: rb.available,
        reason: rb.reason.clone(),
    };
    let _ = store::set(
        info.conn,
        &format!("coll/{name}/avail/{}", info.rank),
        &serde_json::to_string(&a).unwrap_or_default(),
        Instant::now() + Duration::from_secs(5),
    )
    .await;
}

/// Rank 0 decides from every rank's probe and, when all can, has its
/// worker make the id; every rank learns the plan by `end`. `Err` is why
/// not.
async fn plan(
    info: &mut RankInfo<'_>,
    name: &str,
    rb: &RankBackend,
    worker: Option<&mut Worker>,
    end: Instant,
) -> Result<String, String> {
    let key = format!("coll/{name}/plan");
    let wait = end.saturating_duration_since(Instant::now());
    if info.rank != 0 {
        let got = store::get(
            info.conn,
            &key,
            wait,
            Instant::now() + wait + Duration::from_secs(2),
        )
        .await;
        return match got {
            Ok(Some(v)) => match serde_json::from_str::<Plan>(&v) {
                Ok(p) if p.go => Ok(p.id),
                Ok(p) => Err(p.reason),
                Err(e) => Err(format!("rank 0's plan: {e}")),
            },
            Ok(None) => Err(format!(
                "rank 0 did not say within {}s whether every rank can run {name}",
                wait.as_secs()
            )),
            Err(e) => Err(format!("rank 0 is gone: {e}")),
        };
    }
    let mut why_not: Option<String> = None;
    if !rb.available {
        why_not = Some(format!("{} (rank 0{})", rb.reason, host(info, 0)));
    }
    for r in 1..info.world {
        if why_not.is_some() {
            break;
        }
        let left = end.saturating_duration_since(Instant::now());
        let got = store::get(
            info.conn,
            &format!("coll/{name}/avail/{r}"),
            left,
            end + Duration::from_secs(2),
        )
        .await;
        match got
            .ok()
            .flatten()
            .map(|v| serde_json::from_str::<Avail>(&v))
        {
            Some(Ok(a)) if a.available => {}
            Some(Ok(a)) => why_not = Some(format!("{} (rank {r}{})", a.reason, host(info, r))),
            _ => {
                why_not = Some(format!(
                    "rank {r}{} did not say whether it can run {name}",
                    host(info, r)
                ))
            }
        }
    }
    let mut id = String::new();
    if why_not.is_none() {
        match worker {
            Some(w) => match make_id(w, end.max(Instant::now() + Duration::from_secs(1))).await {
                Ok(hex) => id = hex,
                Err(e) => why_not = Some(format!("rank 0 could not make the unique id: {e}")),
            },
            None => why_not = Some("rank 0 has no worker".into()),
        }
    }
    let p = Plan {
        go: why_not.is_none(),
        id: id.clone(),
        reason: why_not.clone().unwrap_or_default(),
    };
    let _ = store::set(
        info.conn,
        &key,
        &serde_json::to_string(&p).unwrap_or_default(),
        Instant::now() + Duration::from_secs(5),
    )
    .await;
    match why_not {
        None => Ok(id),
        Some(w) => Err(w),
    }
}

async fn make_id(w: &mut Worker, deadline: Instant) -> Result<String, String> {
    w.send(&ToWorker::MakeId).await?;
    match w.recv(deadline).await? {
        ToParent::Id { hex } => Ok(hex),
        other => Err(format!("the worker answered {other:?}")),
    }
}

fn host(info: &RankInfo<'_>, r: u32) -> String {
    info.hosts
        .get(r as usize)
        .filter(|h| !h.is_empty())
        .map(|h| format!(", {h}"))
        .unwrap_or_default()
}

const TIMED_OUT: &str = "timed out";

struct Worker {
    child: Child,
    reader: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    writer: OwnedWriteHalf,
    log: Arc<Mutex<VecDeque<String>>>,
    /// The library settings this rank added to the worker's environment.
    env_set: Vec<String>,
    // Last: removed after the child is gone.
    _scratch: tempfile::TempDir,
}

impl Worker {
    fn start(
        name: &str,
        cfg: &Config,
        info: &RankInfo<'_>,
        init_timeout: Duration,
    ) -> Result<StartingWorker, String> {
        let scratch = tempfile::Builder::new()
            .prefix(&format!("preflight-{name}-{}-", info.rank))
            .tempdir()
            .map_err(|e| format!("cannot make a scratch directory: {e}"))?;
        let sock = scratch.path().join("worker.sock");
        let listener = UnixListener::bind(&sock)
            .map_err(|e| format!("cannot listen on {}: {e}", sock.display()))?;
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find our own binary: {e}"))?;
        let env_set = library(name).map_or_else(Vec::new, |l| {
            (l.env)(&EnvInput {
                info,
                init_timeout,
                scratch: scratch.path(),
            })
        });
        let job = Job {
            backend: name.into(),
            rank: info.rank,
            world: info.world,
            local_rank: info.local_rank,
            local_world: info.local_world,
            lib: info.libraries.get(name),
            config: JobConfig::from_config(cfg),
            hang_above: info.hooks.hang_above,
            hang_marker: info.hooks.hang_marker.clone(),
            corrupt_from: info.hooks.corrupt_from,
            init_timeout_ms: init_timeout.as_millis() as u64,
            scratch: scratch.path().to_path_buf(),
            root: info.root.clone(),
        };
        let job = serde_json::to_string(&job).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(exe);
        cmd.arg("collective-worker")
            .env(SOCKET_ENV, &sock)
            .env(JOB_ENV, job)
            .env(PARENT_ENV, std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in &env_set {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start `preflight collective-worker`: {e}"))?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            tokio::spawn(keep_lines(out, Arc::clone(&log)));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(keep_lines(err, Arc::clone(&log)));
        }
        Ok(StartingWorker {
            child,
            listener,
            log,
            env_set: env_set.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            scratch,
        })
    }

    async fn send(&mut self, msg: &ToWorker) -> Result<(), String> {
        let mut line = serde_json::to_string(msg).map_err(|e| e.to_string())?;
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("the worker is gone: {e}"))
    }

    async fn recv(&mut self, deadline: Instant) -> Result<ToParent, String> {
        match tokio::time::timeout_at(deadline, self.reader.next_line()).await {
            Err(_) => Err(TIMED_OUT.into()),
            Ok(Ok(Some(line))) => {
                serde_json::from_str(&line).map_err(|e| format!("sent a bad message: {e}"))
            }
            Ok(Ok(None)) | Ok(Err(_)) => Err(self.exit_words().await),
        }
    }

    /// The worker closed its socket: how it ended, with its last words.
    async fn exit_words(&mut self) -> String {
        let status = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
        let how = match status {
            Ok(Ok(s)) => describe_exit(s),
            _ => "closed its connection".into(),
        };
        let last = self
            .log
            .lock()
            .ok()
            .and_then(|l| l.back().cloned())
            .map(|l| format!(": {l}"))
            .unwrap_or_default();
        format!("{how}{last}")
    }

    async fn stop(&mut self) {
        let _ = self.send(&ToWorker::Stop).await;
        self.finish().await;
    }

    /// A worker that is done exits by itself; one that does not within a
    /// few seconds (a library's exit handler waiting on a peer) is killed.
    async fn finish(&mut self) {
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            self.kill().await;
        }
        // Let the readers drain what the child wrote last.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    fn log_tail(&self) -> Vec<String> {
        self.log
            .lock()
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Between spawning and the worker's connection.
pub struct StartingWorker {
    child: Child,
    listener: UnixListener,
    log: Arc<Mutex<VecDeque<String>>>,
    env_set: Vec<String>,
    scratch: tempfile::TempDir,
}

impl Worker {
    async fn connect(s: StartingWorker) -> Result<Worker, (String, Vec<String>)> {
        let StartingWorker {
            mut child,
            listener,
            log,
            env_set,
            scratch,
        } = s;
        let tail = |log: &Arc<Mutex<VecDeque<String>>>| -> Vec<String> {
            log.lock()
                .map(|l| l.iter().cloned().collect())
                .unwrap_or_default()
        };
        // A worker that finds no library says so and exits at once,
        // possibly before we accept: its connection is queued all the same.
        let accepted = tokio::select! {
            biased;
            a = tokio::time::timeout(PROBE_TIMEOUT, listener.accept()) => a,
            status = child.wait() => {
                match tokio::time::timeout(Duration::from_millis(200), listener.accept()).await {
                    Ok(a) => Ok(a),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let how = status.map(describe_exit).unwrap_or_else(|e| e.to_string());
                        return Err((format!("the worker {how} before it connected"), tail(&log)));
                    }
                }
            }
        };
        let stream = match accepted {
            Ok(Ok((stream, _))) => stream,
            Ok(Err(e)) => return Err((format!("the worker did not connect: {e}"), tail(&log))),
            Err(_) => {
                let _ = child.start_kill();
                return Err((
                    format!(
                        "the worker did not connect within {}s",
                        PROBE_TIMEOUT.as_secs()
                    ),
                    tail(&log),
                ));
            }
        };
        let (read, write) = stream.into_split();
        let w = Worker {
            child,
            reader: BufReader::new(read).lines(),
            writer: write,
            log,
            env_set,
            _scratch: scratch,
        };
        Ok(w)
    }
}

fn describe_exit(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "ended".into(),
    }
}

async fn keep_lines<R: AsyncRead + Unpin>(r: R, log: Arc<Mutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Ok(mut l) = log.lock() {
            if l.len() == LOG_LINES {
                l.pop_front();
            }
            l.push_back(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;

    fn config(step_timeout: Duration) -> Config {
        Config {
            mode: Mode::Short,
            backends: vec!["nccl".into()],
            required: Vec::new(),
            max_size: 1 << 20,
            step_factor: 2,
            warmup: 1,
            iters: 1,
            step_timeout,
            until: None,
        }
    }

    #[test]
    fn init_gets_twice_a_step_and_at_least_thirty_seconds() {
        assert_eq!(
            init_timeout(&config(Duration::from_secs(10))),
            Duration::from_secs(30)
        );
        assert_eq!(
            init_timeout(&config(Duration::from_secs(40))),
            Duration::from_secs(80)
        );
    }

    #[test]
    fn a_stall_names_the_step_it_was_in() {
        let f = stalled(Some((Op::Allgather, 4096)), "no progress".into());
        assert_eq!((f.op, f.bytes), (Op::Allgather, 4096));
        assert_eq!(
            f.error,
            Some(OpError::Stalled {
                detail: "no progress".into()
            })
        );
        // Before any step began: init, reported at the barrier.
        let f = stalled(None, "init".into());
        assert_eq!((f.op, f.bytes), (Op::Barrier, 0));
    }

    #[test]
    fn exits_are_described_by_status_or_signal() {
        let status = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .status()
            .unwrap();
        assert_eq!(describe_exit(status), "exited with status 3");
        let status = std::process::Command::new("sh")
            .args(["-c", "kill -9 $$"])
            .status()
            .unwrap();
        assert_eq!(describe_exit(status), "was killed by signal 9");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_log_keeps_the_last_lines() {
        let text: String = (0..LOG_LINES + 5).map(|i| format!("line {i}\n")).collect();
        let log = Arc::new(Mutex::new(VecDeque::new()));
        keep_lines(text.as_bytes(), Arc::clone(&log)).await;
        let kept: Vec<String> = log.lock().unwrap().iter().cloned().collect();
        assert_eq!(kept.len(), LOG_LINES);
        assert_eq!(kept.first().map(String::as_str), Some("line 5"));
        assert_eq!(
            kept.last().cloned(),
            Some(format!("line {}", LOG_LINES + 4))
        );
    }

    /// A real child that says something and exits before it connects: the
    /// rank learns how it ended, with its words, rather than waiting out
    /// the probe's deadline to say it never connected.
    #[tokio::test(flavor = "current_thread")]
    async fn a_worker_that_exits_before_connecting_is_reported_with_its_log() {
        let scratch = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(scratch.path().join("worker.sock")).unwrap();
        let mut child = Command::new("sh")
            .args(["-c", "echo cannot load libnccl.so.2 >&2; exit 4"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let stderr = child.stderr.take().unwrap();
        let reader = tokio::spawn(keep_lines(stderr, Arc::clone(&log)));
        let outcome = Worker::connect(StartingWorker {
            child,
            listener,
            log,
            env_set: Vec::new(),
            scratch,
        })
        .await;
        let _ = reader.await;
        let Err((why, tail)) = outcome else {
            panic!("a worker that never connected was accepted");
        };
        assert_eq!(why, "the worker exited with status 4 before it connected");
        assert_eq!(tail, vec!["cannot load libnccl.so.2".to_string()]);
    }
}
