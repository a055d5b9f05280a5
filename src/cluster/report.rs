//! The cluster section: assembled by rank 0, sent to every rank, printed
//! by rank 0 as the cluster view and by the others as one line, and the
//! `cluster` section of the JSON report.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::checkin::{Clock, Devices, FailedCheck};
use super::reachability::Probe;
use crate::report::style::Style;
use crate::result::{CheckResult, Status, Verdict};

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
    pub warnings: Vec<String>,
    /// The collective stage, run after the verdict; the report moves it to
    /// its own top-level `collective` section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<crate::collective::report::CollectiveReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeView {
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
    /// Clients of another job (another token) that knocked on our port.
    pub other_job_clients: Vec<String>,
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

/// The cluster view: nodes × areas, then the matrix when a probe failed.
/// Failures with their hints are in the report's Problems list already.
pub fn render(report: &ClusterReport, s: &Style) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{}  {} · {} · master {} · token {}",
        s.bold("Cluster"),
        count(report.nodes.len(), "node"),
        count(report.world_size as usize, "rank"),
        report.master,
        report.token
    );
    let width = report
        .nodes
        .iter()
        .map(|n| n.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "  {:<width$}  {:<9}  {:<10}  {:<8}  {:>7}  {:>11}  {:<8}  reach",
        "node", "ranks", "checks", "version", "devices", "clock", "iface"
    );
    for (i, n) in report.nodes.iter().enumerate() {
        let ranks = rank_ranges(&n.ranks);
        let clock = n
            .clock
            .map(|c| format!("{:+.1}ms", c.offset_ms))
            .unwrap_or_else(|| "-".into());
        let probes: Vec<&Probe> = report
            .reachability
            .probes
            .iter()
            .filter(|p| p.from == i || p.to == i)
            .collect();
        let bad = probes.iter().filter(|p| p.status != "ok").count();
        let reach = if probes.is_empty() {
            "-".to_string()
        } else if bad == 0 {
            "ok".to_string()
        } else {
            format!("{bad} failed")
        };
        let _ = writeln!(
            out,
            "  {:<width$}  {:<9}  {:<10}  {:<8}  {:>7}  {:>11}  {:<8}  {}",
            n.name,
            ranks,
            n.local_verdict,
            n.tool_version,
            n.devices.count,
            clock,
            n.interface.as_deref().unwrap_or("-"),
            reach
        );
    }
    for m in &report.barrier.missing {
        let _ = writeln!(
            out,
            "  {:<width$}  {:<9}  {}",
            m.expected_on.as_deref().unwrap_or("?"),
            m.rank,
            s.bold("missing: never checked in")
        );
    }
    let failed = report.reachability.probes.iter().any(|p| p.status != "ok");
    if failed {
        let _ = writeln!(
            out,
            "\n{}  ({}; row probes column)",
            s.bold("Reachability"),
            report.reachability.mode
        );
        let names = &report.reachability.nodes;
        let w = names.iter().map(|n| n.len()).max().unwrap_or(4).max(9);
        let _ = write!(out, "  {:<w$}", "");
        for name in names {
            let _ = write!(out, "  {name:>w$}");
        }
        let _ = writeln!(out);
        for (i, from) in names.iter().enumerate() {
            let _ = write!(out, "  {from:<w$}");
            for j in 0..names.len() {
                let cell = if i == j {
                    "·".to_string()
                } else {
                    report
                        .reachability
                        .probes
                        .iter()
                        .find(|p| p.from == i && p.to == j)
                        .map(|p| match p.rtt_ms {
                            Some(r) if p.status == "ok" => format!("ok {r:.1}ms"),
                            _ => p.status.clone(),
                        })
                        .unwrap_or_else(|| "-".into())
                };
                let _ = write!(out, "  {cell:>w$}");
            }
            let _ = writeln!(out);
        }
        for f in &report.reachability.findings {
            let _ = writeln!(out, "  {f}");
        }
    }
    for w in &report.warnings {
        let _ = writeln!(out, "  warning: {w}");
    }
    out
}

/// "1 node", "3 nodes".
pub fn count(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// `0-3,8`
pub fn rank_ranges(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let start = ranks[i];
        let mut end = start;
        while i + 1 < ranks.len() && ranks[i + 1] == end + 1 {
            i += 1;
            end = ranks[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

/// What a rank other than 0 prints: one line.
pub fn one_line(report: &ClusterReport, rank: u32, s: &Style) -> String {
    // A rank that never got a verdict reports its own failure in full:
    // rank 0 may know nothing about it.
    if let Some(own) = report.checks.iter().find(|c| c.id == "cluster.rendezvous") {
        return format!(
            "{}  rank {rank} of {} · {}",
            s.verdict(report.verdict),
            report.world_size,
            own.message
        );
    }
    let problems: Vec<&str> = report.problems().iter().map(|c| c.id.as_str()).collect();
    let mut line = format!(
        "{}  rank {rank} of {} · {}",
        s.verdict(report.verdict),
        report.world_size,
        count(report.nodes.len(), "node")
    );
    if !problems.is_empty() {
        let _ = write!(line, " · problems: {}", problems.join(", "));
        if let Some(first) = report.problems().first() {
            let _ = write!(line, " · {}", first.message);
        }
        let _ = write!(line, " (rank 0 prints the details)");
    }
    line
}

#[cfg(test)]
mod tests {
    #[test]
    fn rank_ranges_compress() {
        assert_eq!(super::rank_ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(super::rank_ranges(&[]), "");
    }
}
