//! The cluster view: what rank 0 prints of the cluster stage's result, and
//! the one line every other rank prints.

use std::fmt::Write;

use super::style::Style;
use crate::result::cluster::{ClusterReport, Probe};
use crate::values::{count, rank_ranges};

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
        assert_eq!(
            crate::values::rank_ranges(&[0, 1, 2, 3, 8, 10, 11]),
            "0-3,8,10-11"
        );
        assert_eq!(crate::values::rank_ranges(&[]), "");
    }
}
