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

/// A run cut short by a signal: the verdict is `incomplete`, whatever the
/// checks that finished found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interrupted {
    /// `SIGTERM`, `SIGINT` or `SIGHUP`.
    pub signal: String,
    /// What the interrupted process was doing: `startup`, `checks`,
    /// `rendezvous`, `collective (BACKEND)` or `report`.
    pub phase: String,
    /// The rank that was interrupted, in a run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Its host.
    pub host: String,
    /// Another process's interruption that this one was told of (rank 0's,
    /// on the other ranks); false on the interrupted process itself.
    #[serde(default)]
    pub remote: bool,
}

impl Interrupted {
    /// The phase once every stage is over and the report is being written.
    pub const REPORT_PHASE: &'static str = "report";

    /// "interrupted by SIGTERM during the checks", or for a peer's: "rank 0
    /// (h1) was interrupted by SIGTERM during the rendezvous".
    pub fn describe(&self) -> String {
        let during = match self.phase.as_str() {
            "startup" => "before any check ran".to_string(),
            Interrupted::REPORT_PHASE => "while writing the report".to_string(),
            p => format!("during the {p}"),
        };
        if self.remote {
            let who = match self.rank {
                Some(r) => format!("rank {r} ({})", self.host),
                None => self.host.clone(),
            };
            format!("{who} was interrupted by {} {during}", self.signal)
        } else {
            format!("interrupted by {} {during}", self.signal)
        }
    }
}

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
    /// Set when a signal cut the run short (this process's, or rank 0's
    /// that it told this rank of): the verdict is then `incomplete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<Interrupted>,
    /// Where this process's time went, by phase (`run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// Where a run's time went, by phase, and what it cost this process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    /// The checklist stage, wall clock.
    pub checks_ms: u64,
    /// Checks this process evaluated.
    pub evaluated: usize,
    /// Checks its node's leader evaluated for it (`shared`).
    pub shared: usize,
    /// Finding its node's leader, check-in, barrier and verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendezvous_ms: Option<u64>,
    /// The collective stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_ms: Option<u64>,
    /// CPU time of this process and the programs it ran (nft, nvidia-smi,
    /// ...), user and system.
    pub cpu_ms: u64,
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
        super::cause::attribute(&mut checks, super::cause::Scope::Node);
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
            interrupted: None,
            timings: None,
        }
    }

    /// A signal cut the run short: whatever was found, nothing says the
    /// node is ready or not, so the verdict is `incomplete` (exit 3).
    pub fn interrupted(mut self, how: Interrupted) -> Report {
        self.verdict = Verdict::Incomplete;
        self.exit_code = self.verdict.exit_code().code();
        self.interrupted = Some(how);
        self
    }

    /// This process's own signal. It replaces any interruption rank 0 told
    /// this rank of, unless it came only once the stages were over: rank
    /// 0's notice had ended them, and is what cut the run short.
    pub fn signalled(mut self, how: Interrupted) -> Report {
        if self.interrupted.is_some() && how.phase == Interrupted::REPORT_PHASE {
            return self;
        }
        self.node.rank = self.node.rank.or(how.rank);
        self.interrupted(how)
    }

    /// Adds the cluster stage: its checks join this node's, and its verdict,
    /// the same on every rank, becomes this rank's.
    pub fn with_cluster(mut self, mut cluster: ClusterReport) -> Report {
        self.collective = cluster.collective.take();
        self.checks.extend(cluster.checks.iter().cloned());
        super::cause::attribute(&mut self.checks, super::cause::Scope::Node);
        self.summary = Summary::of(&self.checks);
        self.verdict = cluster.verdict;
        self.exit_code = cluster.exit_code;
        // Rank 0 interrupted: every rank it told is as incomplete as it.
        let told = cluster.interrupted.clone();
        self.cluster = Some(cluster);
        match told {
            Some(how) => self.interrupted(how),
            None => self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let node = Node {
            hostname: "h1".into(),
            root: "/".into(),
            pid: 1,
            rank: Some(1),
        };
        Report::new(
            "run",
            node,
            std::time::SystemTime::now(),
            Default::default(),
            Vec::new(),
            false,
        )
    }

    fn signal(phase: &str, remote: bool) -> Interrupted {
        Interrupted {
            signal: "SIGTERM".into(),
            phase: phase.into(),
            rank: Some(if remote { 0 } else { 1 }),
            host: if remote { "h0" } else { "h1" }.into(),
            remote,
        }
    }

    #[test]
    fn the_interruption_that_cut_the_run_short_is_the_one_reported() {
        // Told by rank 0 during the rendezvous, then this rank's own signal
        // (its node agent passing it on) while it wrote the report.
        let told = signal("rendezvous", true);
        let r = report().interrupted(told.clone());
        assert_eq!(
            r.signalled(signal(Interrupted::REPORT_PHASE, false))
                .interrupted,
            Some(told)
        );
        // Its own signal during a stage is its own story, told or not.
        let own = signal("rendezvous", false);
        let r = report().interrupted(signal("rendezvous", true));
        assert_eq!(r.signalled(own.clone()).interrupted, Some(own));
        // Alone, a signal while writing the report is still the report's.
        let late = signal(Interrupted::REPORT_PHASE, false);
        let r = report().signalled(late.clone());
        assert_eq!(r.interrupted, Some(late));
        assert_eq!(r.verdict, Verdict::Incomplete);
    }
}
