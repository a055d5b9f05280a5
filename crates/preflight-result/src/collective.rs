//! The collective stage's result: per backend, what ran, what it measured
//! and how it ended; the pairwise round; each rank's links. Rank 0
//! assembles it, and the JSON report's `collective` section holds it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CollectiveReport {
    /// `short` (run's default) or `full` (`--collective full`, `bench`).
    pub mode: String,
    pub world_size: u32,
    pub backends: Vec<BackendReport>,
    pub pairs: Vec<PairRate>,
    /// Ranks slow in every pair they are in, with their hosts.
    pub stragglers: Vec<String>,
    /// Those ranks, for the reports that mark their nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub straggler_ranks: Vec<u32>,
    /// Pairs left out of the straggler judgement, and why (both ranks on a
    /// host with more ranks than CPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unjudged: Option<String>,
    /// Ranks whose result never reached rank 0.
    pub missing: Vec<u32>,
    /// Each rank's TCP-backend interface, link speed and Unix-socket peers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<RankLink>,
    /// Rank 0 was interrupted by a signal during the stage, as it told
    /// this rank: the stage has no verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<super::report::Interrupted>,
    /// What the sweep ran with, so that a figure can be reproduced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<SweepSettings>,
    /// The pairwise round's second pass: whether it ran, why, and what it
    /// found. Absent where the pairwise round did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub second_pass: Option<SecondPass>,
    /// How long each rank waited for a CPU during the pairwise round: a
    /// starved node is named by its own wait, not by its partners' slow
    /// pairs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_wait: Vec<CpuWait>,
}

/// One rank's wait for a CPU over a stretch of time (the pairwise round),
/// from its thread's scheduler accounting: run-queue delay and cgroup
/// throttling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuWait {
    pub rank: u32,
    /// Time runnable and waiting for a CPU, ms.
    pub waited_ms: u64,
    /// The stretch measured, ms.
    pub wall_ms: u64,
}

impl CpuWait {
    /// The part of the stretch spent waiting for a CPU, 0 to 1.
    pub fn share(&self) -> f64 {
        if self.wall_ms == 0 {
            0.0
        } else {
            (self.waited_ms as f64 / self.wall_ms as f64).min(1.0)
        }
    }
}

impl CollectiveReport {
    /// A report of `backends` alone: no pairs, stragglers, missing ranks,
    /// links or second pass (what a kind's judgement starts from).
    pub fn of(mode: &str, world_size: u32, backends: Vec<BackendReport>) -> CollectiveReport {
        CollectiveReport {
            mode: mode.into(),
            world_size,
            backends,
            pairs: Vec::new(),
            stragglers: Vec::new(),
            straggler_ranks: Vec::new(),
            unjudged: None,
            missing: Vec::new(),
            links: Vec::new(),
            interrupted: None,
            settings: None,
            second_pass: None,
            cpu_wait: Vec::new(),
        }
    }
}

/// The second pass of the pairwise round: each node the first pass
/// suspected, measured again with nodes that ran at full rate, which tells
/// a slow node (slow with every good partner: drain it) from a slow link
/// (slow only between two nodes that each run at full rate elsewhere:
/// drain neither).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SecondPass {
    /// Whether it ran; `reason` says why, or why not.
    pub ran: bool,
    pub reason: String,
    /// The node pairs measured again (each node played by its first
    /// rank), GB/s each way.
    #[serde(default)]
    pub pairs: Vec<PairRate>,
    /// What the healthy node pairs of the first pass reached (their
    /// median), GB/s: what "slow" is measured against.
    #[serde(default)]
    pub reference_gbps: f64,
    /// Nodes slow with every good partner, in words.
    #[serde(default)]
    pub slow_nodes: Vec<String>,
    /// Every rank on those nodes.
    #[serde(default)]
    pub slow_node_ranks: Vec<u32>,
    /// Links slow in both passes between nodes that each reach full rate
    /// with others, in words.
    #[serde(default)]
    pub slow_links: Vec<String>,
    /// Suspects of the first pass that ran at full rate when measured
    /// again, in words.
    #[serde(default)]
    pub cleared: Vec<String>,
    /// Suspects the pass could not judge (not measured again, or nothing
    /// measured beside them to judge one flow against), and why.
    #[serde(default)]
    pub unconfirmed: Vec<String>,
    /// What the time left could not hold, or a pair that failed.
    #[serde(default)]
    pub skipped: Option<String>,
    /// The pass's time, from the shared table to the last pair, ms.
    #[serde(default)]
    pub ms: u64,
}

/// The sweep's parameters as this run used them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepSettings {
    /// The largest size, bytes.
    pub max_size: usize,
    pub step_factor: usize,
    /// Untimed and timed iterations per step.
    pub warmup: u32,
    pub iters: u32,
    /// Each step's deadline, all its iterations.
    pub step_timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackendReport {
    pub name: String,
    pub available: bool,
    pub reason: String,
    /// The library loaded ("NCCL 2.21.5 at /usr/lib/…"), for library
    /// backends.
    #[serde(default)]
    pub library: Option<String>,
    /// Library settings preflight added where the job left them unset.
    #[serde(default)]
    pub env_set: Vec<String>,
    /// The slowest rank's init, ms.
    pub init_ms: Option<u64>,
    pub ops: Vec<OpStatus>,
    /// Verified steps only: a wrong result never gets a bandwidth.
    pub sweep: Vec<Row>,
    /// What ranks said about the backend (the transport chosen, a
    /// fallback), "warning: " first when it is one.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The library's own output from the rank that failed (or the first
    /// rank with any), for the operator to read.
    #[serde(default)]
    pub log: Vec<String>,
    /// Why the sweep ended early, in words.
    pub ended: Option<String>,
    /// The job's variables the init failure was about, for the cause rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub about_variables: Vec<String>,
    /// pass, fail or skip.
    pub verdict: String,
}

impl BackendReport {
    /// Backend `name`, available, with `verdict` and what it measured
    /// (`sweep`); nothing else said.
    pub fn available(name: &str, verdict: &str, sweep: Vec<Row>) -> BackendReport {
        BackendReport {
            name: name.into(),
            available: true,
            reason: String::new(),
            library: None,
            env_set: Vec::new(),
            init_ms: Some(1),
            ops: Vec::new(),
            sweep,
            notes: Vec::new(),
            log: Vec::new(),
            ended: None,
            about_variables: Vec::new(),
            verdict: verdict.into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpStatus {
    pub op: String,
    /// verified; partial (verified by every rank that gave a result, some
    /// gave none); failed; not_finished (the deadline came during it);
    /// not_run.
    pub status: String,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub op: Op,
    /// nccl-tests' size: the buffer (allgather: the whole output).
    pub bytes: usize,
    pub count: usize,
    pub dtype: Dtype,
    /// Mean time per operation, microseconds (rank 0's table: the slowest
    /// rank's).
    pub time_us: f64,
    /// GB/s (10^9 bytes per second).
    pub algbw: f64,
    pub busbw: f64,
}

/// The operations of a sweep, each once, in the order they were measured.
pub fn ops_in_order<'a>(rows: impl IntoIterator<Item = &'a Row>) -> Vec<Op> {
    let mut ops = Vec::new();
    for r in rows {
        if !ops.contains(&r.op) {
            ops.push(r.op);
        }
    }
    ops
}

impl Row {
    pub fn new(op: Op, bytes: usize, dtype: Dtype, time_us: f64, world: u32) -> Row {
        let algbw = if time_us > 0.0 {
            bytes as f64 / (time_us * 1e3)
        } else {
            0.0
        };
        Row {
            op,
            bytes,
            count: bytes / Dtype::SIZE,
            dtype,
            time_us,
            algbw,
            busbw: algbw * op.bus_factor(world),
        }
    }
}

/// What a `collective_busbw` check compared: the sweep row it judged and
/// the minimum it held that row to, so that a report can draw the line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Threshold {
    pub backend: String,
    pub op: String,
    /// The row's size; `None` where the check named a size the sweep never
    /// reached.
    pub bytes: Option<usize>,
    /// GB/s.
    pub min_busbw: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairRate {
    pub a: u32,
    pub b: u32,
    /// GB/s each way.
    pub gbps: f64,
}

/// What one rank's TCP backend ran over, for the report and the relative
/// `collective_busbw` threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankLink {
    pub rank: u32,
    /// The interface holding the TCP listener's address (from the
    /// interface facts); `None` when no interface holds it.
    pub interface: Option<String>,
    /// Its link speed in Mbit/s; `None` where the interface reports none
    /// (loopback, some virtual links, a down port).
    pub speed_mbps: Option<u64>,
    /// Peers reached over a Unix socket (same host); the others over TCP.
    pub unix_peers: Vec<u32>,
    /// Of those, the peers whose large messages this rank copies straight
    /// out of their memory (single copy).
    #[serde(default)]
    pub direct_peers: Vec<u32>,
    /// Why some same-host peer could not use single-copy reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_refused: Option<String>,
    /// The peers this rank holds a connection to (its partners).
    #[serde(default)]
    pub connections: u32,
}

/// Element types the operations move. Both are 4 bytes, little endian on
/// the wire, so one byte buffer serves both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    F32,
    I32,
}

impl Dtype {
    pub const SIZE: usize = 4;

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float",
            Dtype::I32 => "int32",
        }
    }
}

/// The five operations every backend implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Allreduce,
    Broadcast,
    Allgather,
    Sendrecv,
    Barrier,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Allreduce => "allreduce",
            Op::Broadcast => "broadcast",
            Op::Allgather => "allgather",
            Op::Sendrecv => "sendrecv",
            Op::Barrier => "barrier",
        }
    }

    /// nccl-tests' bus bandwidth factor: what each link carries relative
    /// to the algorithm bandwidth, so figures compare across world sizes.
    pub fn bus_factor(self, n: u32) -> f64 {
        // One rank moves nothing over any bus.
        if n <= 1 {
            return 0.0;
        }
        let n = f64::from(n);
        match self {
            Op::Allreduce => 2.0 * (n - 1.0) / n,
            Op::Allgather => (n - 1.0) / n,
            Op::Broadcast | Op::Sendrecv | Op::Barrier => 1.0,
        }
    }
}
