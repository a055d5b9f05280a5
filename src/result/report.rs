//! The report document: one node's (or rank's) checks, verdict and stage
//! results, as `--format json` serializes it (`preflight.report/v1`).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::cluster::ClusterReport;
use super::collective::CollectiveReport;
use super::{CheckResult, Summary, Verdict};

pub const SCHEMA: &str = "preflight.report/v1";

/// Who produced the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Node {
    pub hostname: String,
    /// `--root`: "/" on a real node, a fixture tree in tests.
    #[serde(default)]
    pub root: String,
    #[serde(default)]
    pub pid: u32,
    /// `run` with a cluster stage: the rank whose report this is (in node
    /// mode, the node's first rank).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tool {
    pub name: Cow<'static, str>,
    pub version: Cow<'static, str>,
}

pub const TOOL: Tool = Tool {
    name: Cow::Borrowed("preflight"),
    version: Cow::Borrowed(env!("CARGO_PKG_VERSION")),
};

/// Read back by `preflight report`: the fields added since v1 first
/// shipped have defaults, so that older v1 reports still read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema: Cow<'static, str>,
    pub tool: Tool,
    /// The subcommand: `run`, `check`, `bench` or a `slurm` mode.
    pub command: Cow<'static, str>,
    pub verdict: Verdict,
    pub exit_code: i32,
    #[serde(default)]
    pub strict: bool,
    pub node: Node,
    /// RFC 3339, UTC, whole seconds.
    pub started_at: String,
    pub duration_ms: u64,
    #[serde(default)]
    pub summary: Summary,
    pub checks: Vec<CheckResult>,
    /// `preflight run`'s cluster stage, as rank 0 sent it to every rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterReport>,
    /// The collective stage, as rank 0 assembled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<CollectiveReport>,
    /// What went wrong around the checks without changing the verdict (a
    /// report that could not be posted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
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
            schema: Cow::Borrowed(SCHEMA),
            tool: TOOL,
            command: Cow::Borrowed(command),
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
            warnings: Vec::new(),
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
