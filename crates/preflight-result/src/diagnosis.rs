//! What `preflight diagnose` found on a node: each running job's ranks,
//! what each one is doing, and the ranks that hold the others up, named
//! only on evidence. The JSON output is this, as written.

use serde::{Deserialize, Serialize};

pub const SCHEMA: &str = "preflight.diagnosis/v2";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Diagnosis {
    pub schema: String,
    pub node: String,
    /// How long the ranks were watched, ms: the window (`--watch`), or
    /// less where every rank moved before its end.
    pub watch_ms: u64,
    pub jobs: Vec<JobDiagnosis>,
    /// What NCCL's RAS port on this node says of the job's communicators,
    /// where one answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_ras: Option<RasReport>,
    /// `held` (a culprit named), `progressing` (nothing holds a job up),
    /// `unknown` (it could not tell), `no_job` (none found).
    pub verdict: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobDiagnosis {
    /// The torch its ranks loaded (`2.15.0+cu132`), read from a rank's
    /// process; `None` where none was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<String>,
    /// What moved over the window, in words; empty: nothing did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moved: Vec<String>,
    /// How many of its ranks run on this node (LOCAL_WORLD_SIZE or a
    /// launcher's equivalent), where the ranks say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_here: Option<u32>,
    /// What identifies the job: `torchrun run 4f2a…`, `slurm job 1234`,
    /// `master 10.0.0.1:29500`.
    pub job: String,
    pub world_size: u32,
    /// The job's store, where its ranks say it is (MASTER_ADDR:MASTER_PORT).
    pub store: Option<String>,
    pub ranks: Vec<RankState>,
    /// Ranks expected on this node and not found running here.
    pub missing: Vec<u32>,
    /// Ranks that run on other nodes (not judged here).
    pub elsewhere: u32,
    pub culprits: Vec<Culprit>,
    /// Paths that drop the job's data: a waiting rank's connection whose
    /// data the peer never acknowledges (the kernel retransmitting it), in
    /// words, with what a connect from this node to the peer found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// What the job's store holds, read without writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_read: Option<StoreRead>,
    /// Each rank's Flight Recorder, where the job keeps one and offers it
    /// (a worker server, or a dump written when a collective timed out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flight: Vec<FlightRead>,
    /// The others' state in one line ("ranks 0, 1, 3 wait ...").
    pub summary: String,
    /// `held`, `progressing` or `unknown`.
    pub verdict: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankState {
    pub rank: u32,
    pub pid: u32,
    /// `moving` (it moved bytes), `waiting`, `blocked` (on a lock in its
    /// own code), `sleeping`, `running`, `stopped`, `exited`, `in_kernel`
    /// or `idle`.
    pub state: String,
    /// What it does, in words.
    pub doing: String,
    pub wchan: Option<String>,
    pub syscall: Option<String>,
    /// CPU time used over the window, ms.
    pub cpu_ms: u64,
    /// Bytes it moved over the window: through its read and write calls
    /// (`/proc/PID/io`) and its sockets' queues.
    #[serde(default)]
    pub moved_bytes: u64,
    /// Connected to the job's store; `None` when its sockets could not be
    /// read or no store is known.
    pub store_connected: Option<bool>,
    /// Established connections to other ranks of the job on this node.
    pub peer_connections: u32,
    /// Bytes received and not read, over all its connections.
    pub unread_bytes: u64,
    /// Bytes written and not yet taken by its peers.
    pub unsent_bytes: u64,
    /// The distributed call its main thread is in (`init_process_group`,
    /// `all_reduce`), or where in its own code (`job.py:12 in <module>`),
    /// from py-spy where it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    /// Its Python stack, innermost first, from py-spy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
    /// Whether its process group address is in the job's store (it
    /// reached init_process_group); `None` where the store was not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_store: Option<bool>,
    /// Why py-spy gave no stack, where it was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_error: Option<String>,
}

/// One rank's Flight Recorder, as diagnose read it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FlightRead {
    pub rank: u32,
    /// `worker server /run/ws_1.sock`, or `dump /tmp/nccl_trace_rank_1`.
    pub source: String,
    /// Collectives enqueued and completed, over its process groups, at
    /// the end of the window.
    pub enqueued: i64,
    pub completed: i64,
    /// The collective it called and has not finished (`collective #6 of
    /// group 0: all_reduce of [1024] Float`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    /// Why it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// NCCL's RAS report, folded in.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RasReport {
    pub address: String,
    /// `json` (NCCL 2.28.7 and later) or `text`.
    pub format: String,
    pub nccl_version: Option<String>,
    pub communicators: u32,
    /// Incomplete communicators, dead processes, mismatched counts.
    pub findings: Vec<String>,
    /// Ranks RAS names: missing or dead, behind in a collective's count,
    /// with an error.
    pub culprits: Vec<Culprit>,
    /// Why it could not be read.
    pub error: Option<String>,
    /// How its collective counts grew across the window, in words, where
    /// they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved: Option<String>,
}

/// The job's store, as diagnose read it (CHECK and GET only).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StoreRead {
    /// `torch 1.13 to 2.1` or `torch 2.2 or later`, from how it answered.
    pub server: String,
    /// How many keys it holds.
    pub keys: Option<i64>,
    /// Ranks whose process group address is in the store: they reached
    /// init_process_group.
    pub arrived: Vec<u32>,
    /// Why it could not be read.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Culprit {
    pub rank: u32,
    pub node: String,
    pub pid: Option<u32>,
    pub reason: String,
    /// What the evidence is against: `node` (a dropping path, a GPU
    /// driver's wait, a peer NCCL's RAS finds dead: draining the node
    /// helps) or `rank` (the job's own code or process: it does not).
    /// The epilog drains on `node` alone.
    #[serde(default = "rank_evidence")]
    pub evidence: String,
    /// What to do next, in words.
    #[serde(default)]
    pub next_step: String,
    /// Its Python stack, innermost first, where py-spy read one: for a
    /// rank held in its own code, where to look.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
}

fn rank_evidence() -> String {
    "rank".into()
}

/// `preflight diagnose --hosts`: every node's diagnosis, and one verdict
/// for the job across them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterDiagnosis {
    pub schema: String,
    pub nodes: Vec<Diagnosis>,
    /// Nodes that could not be asked, and why: never guessed at.
    pub unreachable: Vec<Unreachable>,
    /// Ranks that run on nodes not asked, in words with the count ("ranks
    /// 2-3 run on nodes not asked"): nothing is said of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elsewhere: Vec<String>,
    /// The ranks that hold a job up, from the nodes' own findings and
    /// from every node's ranks taken together (a rank asleep on one node
    /// while every other rank, on every node, waits).
    pub culprits: Vec<Culprit>,
    /// Paths that drop a job's data, as the nodes found them.
    pub paths: Vec<String>,
    pub summary: String,
    /// `held`, `progressing`, `unknown` or `no_job`.
    pub verdict: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Unreachable {
    pub host: String,
    pub why: String,
}

pub const CLUSTER_SCHEMA: &str = "preflight.cluster-diagnosis/v2";
