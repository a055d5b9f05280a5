//! The cluster view: what rank 0 prints of the cluster stage's result, and
//! the one line every other rank prints.

use std::fmt::Write;

use super::style::Style;
use preflight_ground::values::{count, rank_ranges};
use preflight_result::cluster::{ClusterReport, Probe};

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
    // The missing ranks' rows share the table: their host names count.
    let width = report
        .nodes
        .iter()
        .map(|n| n.name.len())
        .chain(
            report
                .barrier
                .missing
                .iter()
                .map(|m| m.expected_on.as_deref().unwrap_or("?").len()),
        )
        .max()
        .unwrap_or(4)
        .max(4);
    if !report.nodes.is_empty() || !report.barrier.missing.is_empty() {
        let _ = writeln!(
            out,
            "  {:<width$}  {:<9}  {:<10}  {:<8}  {:>7}  {:>11}  {:<8}  reach",
            "node", "ranks", "checks", "version", "devices", "clock", "iface"
        );
    }
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
        count(report.node_count.max(report.nodes.len()), "node")
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
    use super::*;

    fn node(name: &str, rank: u32) -> serde_json::Value {
        serde_json::json!({
            "name": name, "hostname": "h", "addr": name, "ranks": [rank],
            "tool_version": "0.1.0", "checklist_hash": "abc", "versions": {},
            "env": {}, "devices": {"count": 0, "models": []},
            "clock": {"offset_ms": 0.25, "rtt_ms": 0.1}, "interface": "eth0",
            "hostname_addrs": [], "local_verdict": "ready", "failed": []
        })
    }

    /// Rank 0's view of three nodes where the third drops incoming
    /// connections: the table, then the matrix (shown only when a probe
    /// failed) with the finding under it; the others' one line.
    #[test]
    fn the_cluster_view_shows_the_matrix_when_a_probe_failed() {
        let probe = |from: usize, to: usize, status: &str| {
            serde_json::json!({"from": from, "to": to, "status": status,
                "rtt_ms": if status == "ok" { Some(0.5) } else { None }, "detail": null})
        };
        let report: ClusterReport = serde_json::from_value(serde_json::json!({
            "verdict": "not_ready", "exit_code": 1, "world_size": 3,
            "master": "10.0.0.1:29500", "token": "PREFLIGHT_TOKEN (3c0c65e3)",
            "duration_ms": 1000,
            "nodes": [node("n1", 0), node("n2", 1), node("n3", 2)],
            "barrier": {"complete": true, "waited_ms": 10, "missing": [],
                "missing_count": 0, "missing_ranks": "", "duplicates": [],
                "world_size_mismatch": [], "out_of_range": [], "lost": [],
                "other_job_clients": [], "dropped": [], "dropped_total": 0},
            "checks": [{"id": "cluster.reachability", "kind": "cluster_reachability",
                "area": "cluster", "severity": "fail", "tags": [], "status": "fail",
                "measured": null, "expected": null, "message": "n3 drops incoming connections",
                "hint": null, "duration_ms": 0.0, "source": "built-in"}],
            "reachability": {"mode": "all pairs", "nodes": ["n1", "n2", "n3"],
                "probes": [probe(0, 1, "ok"), probe(0, 2, "timed_out"), probe(1, 0, "ok"),
                    probe(1, 2, "timed_out"), probe(2, 0, "ok"), probe(2, 1, "ok")],
                "findings": ["n3 drops incoming connections (a firewall DROP rule?)"]},
            "warnings": []
        }))
        .unwrap();
        let s = Style { color: false };
        let view = render(&report, &s);
        assert!(
            view.contains("Cluster  3 nodes · 3 ranks · master 10.0.0.1:29500 · token PREFLIGHT_TOKEN (3c0c65e3)"),
            "{view}"
        );
        assert!(
            view.contains("Reachability  (all pairs; row probes column)"),
            "{view}"
        );
        let row = view
            .lines()
            .find(|l| l.trim_start().starts_with("n1 ") && l.contains("ok 0.5ms"));
        let row = row.unwrap_or_else(|| panic!("no matrix row for n1:\n{view}"));
        assert!(row.contains("timed_out"), "{row}");
        assert!(
            view.contains("n3 drops incoming connections (a firewall DROP rule?)"),
            "{view}"
        );
        let line = one_line(&report, 2, &s);
        assert!(
            line.starts_with("NOT READY  rank 2 of 3 · 3 nodes · problems: cluster.reachability · n3 drops incoming connections (rank 0 prints the details)"),
            "{line}"
        );
        // No failed probe: no matrix.
        let mut healthy = report.clone();
        healthy.reachability.probes.retain(|p| p.status == "ok");
        assert!(!render(&healthy, &s).contains("Reachability"));
    }

    /// A missing rank's row lines up with the table whatever its host's
    /// name, and a table with no row has no header.
    #[test]
    fn missing_rows_line_up_and_an_empty_table_has_no_header() {
        let mut report: ClusterReport = serde_json::from_value(serde_json::json!({
            "verdict": "not_ready", "exit_code": 1, "world_size": 3,
            "master": "10.0.0.1:29500", "token": "PREFLIGHT_TOKEN",
            "duration_ms": 1000,
            "nodes": [node("n1", 0)],
            "barrier": {"complete": false, "waited_ms": 10,
                "missing": [{"rank": 2, "expected_on": "node rank 2"}],
                "missing_count": 1, "missing_ranks": "2", "duplicates": [],
                "world_size_mismatch": [], "out_of_range": [], "lost": [],
                "other_job_clients": [], "dropped": [], "dropped_total": 0},
            "checks": [],
            "reachability": {"mode": "all pairs", "nodes": [], "probes": [], "findings": []},
            "warnings": []
        }))
        .unwrap();
        let s = Style { color: false };
        let view = render(&report, &s);
        let header = view
            .lines()
            .find(|l| l.trim_start().starts_with("node "))
            .unwrap();
        let missing = view
            .lines()
            .find(|l| l.contains("missing: never checked in"))
            .unwrap();
        let column = |line: &str, word: &str| line.find(word).unwrap();
        assert_eq!(
            column(header, "checks"),
            column(missing, "missing"),
            "{view}"
        );
        let row = view
            .lines()
            .find(|l| l.trim_start().starts_with("n1 "))
            .unwrap();
        assert_eq!(column(header, "checks"), column(row, "ready"), "{view}");
        // No node checked in and none known to be missing: no table.
        report.nodes.clear();
        report.barrier.missing.clear();
        let view = render(&report, &s);
        assert!(!view.contains("version"), "{view}");
    }

    #[test]
    fn rank_ranges_compress() {
        assert_eq!(
            preflight_ground::values::rank_ranges(&[0, 1, 2, 3, 8, 10, 11]),
            "0-3,8,10-11"
        );
        assert_eq!(preflight_ground::values::rank_ranges(&[]), "");
    }
}
