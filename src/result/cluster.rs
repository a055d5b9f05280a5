//! The cluster stage's result: what rank 0 assembles and sends to every
//! rank, and what the JSON report's `cluster` section holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CheckResult, Status, Verdict};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterReport {
    pub verdict: Verdict,
    pub exit_code: i32,
    pub world_size: u32,
    /// host:port of the rendezvous.
    pub master: String,
    /// Where the job token came from (never its value) and a fingerprint
    /// that is equal on every rank of one job.
    pub token: String,
    pub duration_ms: u64,
    pub nodes: Vec<NodeView>,
    pub barrier: Barrier,
    /// The cluster-scope checks, and the barrier's own result.
    pub checks: Vec<CheckResult>,
    pub reachability: Matrix,
    /// The nodes this verdict holds responsible, each with why: what an
    /// orchestrator (an Ansible play, a Slurm prolog) acts on, so that only
    /// those nodes are failed or drained. Empty when the cluster is ready,
    /// and when it is not but no node can be singled out (a rank that
    /// never arrived may be a dead node or a firewall on the master's).
    #[serde(default)]
    pub culprits: Vec<Culprit>,
    pub warnings: Vec<String>,
    /// The collective stage, run after the verdict; the report moves it to
    /// its own top-level `collective` section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<super::collective::CollectiveReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Culprit {
    /// The node's name, as in `nodes`.
    pub node: String,
    pub ranks: Vec<u32>,
    /// `check id: message`, one per check that names this node.
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeView {
    /// Where rank 0 saw this node's first rank connect from, when that is
    /// not the address it claims (`addr`): NAT, or a peer that lies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_from: Option<String>,
    /// How the report names the node: its hostname, or its address where
    /// several nodes share one hostname.
    pub name: String,
    pub hostname: String,
    pub addr: String,
    pub ranks: Vec<u32>,
    pub tool_version: String,
    pub checklist_hash: String,
    pub versions: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub devices: Devices,
    pub clock: Option<Clock>,
    pub interface: Option<String>,
    /// Where its peers probed it; absent where it opened no listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_addr: Option<String>,
    pub hostname_addrs: Vec<String>,
    pub local_verdict: String,
    pub failed: Vec<FailedCheck>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Barrier {
    pub complete: bool,
    pub waited_ms: u64,
    /// The first missing ranks with their expected hosts (at most
    /// `MISSING_LISTED`, so the verdict frame stays small at any scale).
    pub missing: Vec<Missing>,
    /// How many ranks are missing, and all of them as ranges ("3,8-1023").
    pub missing_count: usize,
    pub missing_ranks: String,
    pub duplicates: Vec<Duplicate>,
    pub world_size_mismatch: Vec<Mismatch>,
    pub out_of_range: Vec<Mismatch>,
    /// Ranks that checked in and then went away before the verdict.
    pub lost: Vec<Lost>,
    /// Source addresses of clients of another job (another token) that
    /// knocked on our port, with how often when more than once; at most 32.
    pub other_job_clients: Vec<String>,
    /// How many such connections there were in all.
    #[serde(default)]
    pub other_job_total: usize,
    /// Connections dropped before authenticating: garbage, oversized
    /// frames, silence.
    pub dropped: Vec<String>,
    /// How many were dropped in all; `dropped` lists the first few.
    pub dropped_total: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Missing {
    pub rank: u32,
    /// Where a nodelist or node mode says it should have run.
    pub expected_on: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Duplicate {
    pub rank: u32,
    /// "host pid N" of every process that claimed the rank.
    pub claimants: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mismatch {
    pub rank: u32,
    pub node: String,
    pub world_size: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lost {
    pub rank: u32,
    pub node: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Matrix {
    /// "all pairs" or "ring + hypercube".
    pub mode: String,
    pub nodes: Vec<String>,
    pub probes: Vec<Probe>,
    pub findings: Vec<String>,
}

impl ClusterReport {
    pub fn problems(&self) -> Vec<&CheckResult> {
        self.checks
            .iter()
            .filter(|c| matches!(c.status, Status::Fail | Status::Warn | Status::Error))
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FailedCheck {
    pub id: String,
    pub status: Status,
    pub message: String,
    pub hint: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Devices {
    pub count: usize,
    /// "NVIDIA H100 80GB HBM3" x8, ...: model names in PCI order.
    pub models: Vec<String>,
}

/// The best of several NTP-style samples: the one with the smallest
/// round trip bounds the offset most tightly.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Clock {
    /// This node's clock minus the master's, in milliseconds.
    pub offset_ms: f64,
    pub rtt_ms: f64,
}

impl Clock {
    /// One sample from the four timestamps (µs): t0 client send, t1 server
    /// receive, t2 server send, t3 client receive.
    pub fn sample(t0: i64, t1: i64, t2: i64, t3: i64) -> Clock {
        // In i128: the server's timestamps are a peer's input and must not
        // overflow the arithmetic, however wrong they are.
        let (t0, t1, t2, t3) = (t0 as i128, t1 as i128, t2 as i128, t3 as i128);
        let server_minus_client = ((t1 - t0) + (t2 - t3)) as f64 / 2.0;
        let rtt = ((t3 - t0) - (t2 - t1)).max(0) as f64;
        Clock {
            offset_ms: -server_minus_client / 1000.0,
            rtt_ms: rtt / 1000.0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Probe {
    pub from: usize,
    pub to: usize,
    /// ok, refused, timed_out, unreachable, error
    pub status: String,
    pub rtt_ms: Option<f64>,
    pub detail: Option<String>,
}
