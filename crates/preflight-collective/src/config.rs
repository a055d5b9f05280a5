//! The collective stage's settings: which backends, the sweep, the
//! deadlines; and how a rank judges an error against the run's deadline.

use std::time::Duration;

use tokio::time::Instant;

use super::{OpError, sweep};

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

    pub fn pair_bytes(&self) -> usize {
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
