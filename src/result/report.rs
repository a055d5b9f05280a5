//! The report document: one node's (or rank's) checks, verdict and stage
//! results, as `--format json` serializes it (`preflight.report/v1`).

use serde::Serialize;

use super::cluster::ClusterReport;
use super::collective::CollectiveReport;
use super::{CheckResult, Summary, Verdict};

pub const SCHEMA: &str = "preflight.report/v1";

/// Who produced the report.
#[derive(Debug, Clone, Serialize)]
pub struct Node {
    pub hostname: String,
    /// `--root`: "/" on a real node, a fixture tree in tests.
    pub root: String,
    pub pid: u32,
    /// `run` with a cluster stage: the rank whose report this is (in node
    /// mode, the node's first rank).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Tool {
    pub name: &'static str,
    pub version: &'static str,
}

pub const TOOL: Tool = Tool {
    name: "preflight",
    version: env!("CARGO_PKG_VERSION"),
};

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: &'static str,
    pub tool: Tool,
    /// The subcommand: `run` or `check`.
    pub command: &'static str,
    pub verdict: Verdict,
    pub exit_code: i32,
    pub strict: bool,
    pub node: Node,
    /// RFC 3339, UTC, whole seconds.
    pub started_at: String,
    pub duration_ms: u64,
    pub summary: Summary,
    pub checks: Vec<CheckResult>,
    /// `preflight run`'s cluster stage, as rank 0 sent it to every rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterReport>,
    /// The collective stage, as rank 0 assembled it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub collective: Option<CollectiveReport>,
}

impl Report {
    pub fn new(
        command: &'static str,
        node: Node,
        started_at: std::time::SystemTime,
        duration: std::time::Duration,
        mut checks: Vec<CheckResult>,
        strict: bool,
    ) -> Report {
        super::cause::attribute(&mut checks);
        let verdict = Verdict::of(&checks, strict);
        Report {
            schema: SCHEMA,
            tool: TOOL,
            command,
            verdict,
            exit_code: verdict.exit_code().code(),
            strict,
            node,
            started_at: humantime::format_rfc3339_seconds(started_at).to_string(),
            duration_ms: duration.as_millis() as u64,
            summary: Summary::of(&checks),
            checks,
            cluster: None,
            collective: None,
        }
    }

    /// Adds the cluster stage: its checks join this node's, and its verdict,
    /// the same on every rank, becomes this rank's.
    pub fn with_cluster(mut self, mut cluster: ClusterReport) -> Report {
        self.collective = cluster.collective.take();
        self.checks.extend(cluster.checks.iter().cloned());
        super::cause::attribute(&mut self.checks);
        self.summary = Summary::of(&self.checks);
        self.verdict = cluster.verdict;
        self.exit_code = cluster.exit_code;
        self.cluster = Some(cluster);
        self
    }
}
