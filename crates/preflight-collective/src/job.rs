//! What a library backend's worker process and its parent say to each
//! other: the job it gets (environment and socket), the messages both ways
//! over that socket, and the child's end of it (`Link`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::{Config, Mode};
use super::exercise::{Progress, exercise};
use super::rank::{Found, RankBackend};
use super::sweep::{Failure, Hooks};
use super::{Backend, Op};
use preflight_result::collective::Row;

/// The variable that carries the socket path to the child.
pub const SOCKET_ENV: &str = "PREFLIGHT_WORKER_SOCKET";

/// The job, as JSON: in the environment so the worker can probe before
/// its parent is ready to talk.
pub const JOB_ENV: &str = "PREFLIGHT_WORKER_JOB";

/// The parent's pid: a worker whose parent is already gone exits.
pub const PARENT_ENV: &str = "PREFLIGHT_WORKER_PARENT";

/// What the child needs to know; everything else comes from its
/// environment, which is the rank's own plus the library settings the
/// parent adds (see `supervisor::library_env`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub backend: String,
    pub rank: u32,
    pub world: u32,
    pub local_rank: u32,
    pub local_world: u32,
    /// `--nccl-lib` / `--oneccl-lib`.
    pub lib: Option<PathBuf>,
    pub config: JobConfig,
    pub hang_above: Option<usize>,
    #[serde(default)]
    pub hang_marker: Option<PathBuf>,
    pub corrupt_from: Option<usize>,
    /// How long init may take; the library's own timeout is set near it.
    pub init_timeout_ms: u64,
    /// A directory private to this child (NCCL's debug file goes there).
    pub scratch: PathBuf,
    /// `--root`: the node's /sys as the checks read it.
    #[serde(default = "system_root")]
    pub root: PathBuf,
}

fn system_root() -> PathBuf {
    PathBuf::from("/")
}

/// The sweep settings of [`Config`], as they travel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobConfig {
    pub mode: String,
    pub max_size: usize,
    pub step_factor: usize,
    pub warmup: u32,
    pub iters: u32,
    pub step_timeout_ms: u64,
    /// Milliseconds left until the run's deadline when the worker was
    /// started; the worker counts from its own start (a few ms later).
    #[serde(default)]
    pub left_ms: Option<u64>,
}

impl JobConfig {
    pub fn from_config(c: &Config) -> JobConfig {
        JobConfig {
            mode: c.mode.name().into(),
            max_size: c.max_size,
            step_factor: c.step_factor,
            warmup: c.warmup,
            iters: c.iters,
            step_timeout_ms: c.step_timeout.as_millis() as u64,
            left_ms: c.until.map(|u| {
                u.saturating_duration_since(tokio::time::Instant::now())
                    .as_millis() as u64
            }),
        }
    }

    pub fn to_config(&self, backend: &str) -> Config {
        Config {
            mode: match self.mode.as_str() {
                "full" => Mode::Full,
                "off" => Mode::Off,
                _ => Mode::Short,
            },
            backends: vec![backend.to_string()],
            required: Vec::new(),
            max_size: self.max_size,
            step_factor: self.step_factor,
            warmup: self.warmup,
            iters: self.iters,
            step_timeout: Duration::from_millis(self.step_timeout_ms),
            until: self
                .left_ms
                .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms)),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum ToWorker {
    /// Rank 0 only: make the unique id.
    MakeId,
    /// Every rank: the unique id (hex) to init with.
    Id { hex: String },
    /// Do not init: another rank cannot.
    Stop,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum ToParent {
    Probe {
        available: bool,
        /// Why not, or what was found, in words.
        reason: String,
        found: Option<Found>,
    },
    Id {
        hex: String,
    },
    Init {
        ms: u64,
    },
    InitFailed {
        error: String,
        /// Init was still in progress at its deadline (and was aborted):
        /// this rank waited, rather than failed on its own.
        #[serde(default)]
        stalled: bool,
    },
    /// A step begins; the parent's deadline for it starts now, its budget
    /// from now (0: the step timeout, from a worker that did not say).
    Step {
        op: Op,
        bytes: usize,
        #[serde(default)]
        budget_ms: u64,
    },
    /// The step passed verification (a sweep step: with its row).
    Passed {
        op: Op,
        row: Option<Row>,
    },
    /// Something the report should say about this rank's backend (the
    /// transport NCCL chose, a fallback and why).
    Note {
        warning: bool,
        text: String,
    },
    Done {
        verified: Vec<Op>,
        rows: Vec<Row>,
        failure: Option<Failure>,
    },
}

/// The child's end of the conversation.
pub struct Link {
    out: UnixStream,
    input: BufReader<UnixStream>,
}

impl Link {
    pub fn connect() -> Result<Link, String> {
        let path = std::env::var_os(SOCKET_ENV).ok_or_else(|| {
            format!("{SOCKET_ENV} is not set: this command is started by preflight itself")
        })?;
        let out = UnixStream::connect(&path)
            .map_err(|e| format!("cannot connect to {}: {e}", PathBuf::from(&path).display()))?;
        let input = BufReader::new(out.try_clone().map_err(|e| e.to_string())?);
        Ok(Link { out, input })
    }

    pub fn send(&mut self, msg: &ToParent) -> Result<(), String> {
        let mut line = serde_json::to_string(msg).map_err(|e| e.to_string())?;
        line.push('\n');
        self.out
            .write_all(line.as_bytes())
            .map_err(|e| format!("the parent is gone: {e}"))
    }

    /// Blocks until the parent speaks; the parent kills us rather than
    /// leave us waiting past its deadline.
    pub fn recv(&mut self) -> Result<ToWorker, String> {
        let mut line = String::new();
        match self.input.read_line(&mut line) {
            Ok(0) => Err("the parent closed the connection".into()),
            Ok(_) => serde_json::from_str(&line).map_err(|e| format!("bad message: {e}")),
            Err(e) => Err(format!("the parent is gone: {e}")),
        }
    }

    /// After a successful probe: the id for init, made here when asked
    /// (`make` gives the library's unique id), or `None` when the parent
    /// says stop.
    pub fn exchange_id(
        &mut self,
        make: impl FnOnce() -> Result<Vec<u8>, String>,
    ) -> Result<Option<Vec<u8>>, String> {
        let mut make = Some(make);
        loop {
            match self.recv()? {
                ToWorker::MakeId => {
                    let f = make.take().ok_or("asked twice for an id")?;
                    let hex = preflight_ground::values::hex(&f()?);
                    self.send(&ToParent::Id { hex })?;
                }
                ToWorker::Id { hex } => return from_hex(&hex).map(Some),
                ToWorker::Stop => return Ok(None),
            }
        }
    }

    /// The verification pass and the sweep, each step announced so the
    /// parent can time it; ends with `Done`.
    pub fn exercise<B: Backend>(&mut self, b: &mut B, job: &Job) -> Result<(), String> {
        let cfg = job.config.to_config(&job.backend);
        let hooks = Hooks {
            hang_above: job.hang_above,
            hang_marker: job.hang_marker.clone(),
            corrupt_from: job.corrupt_from,
        };
        let mut rb = RankBackend::new(&job.backend, true, String::new());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| e.to_string())?;
        let mut lost: Option<String> = None;
        runtime.block_on(exercise(b, &cfg, &hooks, &mut rb, &mut |p| {
            let msg = match p {
                Progress::Begin { op, bytes, budget } => ToParent::Step {
                    op,
                    bytes,
                    budget_ms: budget.as_millis() as u64,
                },
                Progress::Passed { op, row } => ToParent::Passed {
                    op,
                    row: row.cloned(),
                },
            };
            if lost.is_none()
                && let Err(e) = self.send(&msg)
            {
                lost = Some(e);
            }
        }));
        if let Some(e) = lost {
            return Err(e);
        }
        if rb.failure.is_some() {
            b.abort();
        }
        self.send(&ToParent::Done {
            verified: rb.verified,
            rows: rb.rows,
            failure: rb.failure,
        })
    }
}

/// The plan's id as the store carries it; a peer's text that is not hex
/// is an error, never a panic.
pub fn from_hex(hex: &str) -> Result<Vec<u8>, String> {
    preflight_ground::values::unhex(hex).ok_or_else(|| "an id that is not hex".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let id: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&preflight_ground::values::hex(&id)).unwrap(), id);
        assert!(from_hex("abc").is_err());
        assert!(from_hex("zz").is_err());
        // Multi-byte characters where the digits should be: the plan text
        // comes through the store, from a peer.
        assert!(from_hex("é0").is_err());
    }

    #[test]
    fn messages_are_tagged_lines() {
        let m = serde_json::to_string(&ToParent::Step {
            op: Op::Allreduce,
            bytes: 8,
            budget_ms: 60000,
        })
        .unwrap();
        assert_eq!(
            m,
            r#"{"msg":"step","op":"allreduce","bytes":8,"budget_ms":60000}"#
        );
    }
}
