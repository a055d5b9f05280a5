//! `--format prometheus`: the report in Prometheus' text exposition
//! format, for node_exporter's textfile collector (written with
//! `--output`, atomically, as the collector requires). One series per
//! check and status, 0 or 1, as goss and node_exporter's own state metrics
//! do, so that an alert is `preflight_check_status{status="fail"} == 1`;
//! units in the names (`_seconds`, `_bytes`), HELP and TYPE for each.

use std::fmt::Write;

use preflight_result::Status;
use preflight_result::report::Report;

const STATUSES: [Status; 5] = [
    Status::Pass,
    Status::Warn,
    Status::Fail,
    Status::Skip,
    Status::Error,
];

const VERDICTS: [&str; 3] = ["ready", "not_ready", "incomplete"];

pub fn prometheus(report: &Report) -> String {
    let mut s = String::new();
    // One series per check id: a report lists each once, but a duplicate
    // series would make the collector drop the whole file.
    let mut seen = std::collections::BTreeSet::new();
    let checks: Vec<_> = report
        .checks
        .iter()
        .filter(|c| seen.insert(c.id.as_str()))
        .collect();
    let host = escape(&report.node.hostname);
    family(
        &mut s,
        "preflight_info",
        "The preflight that wrote these metrics, the command and the node; always 1.",
    );
    let _ = writeln!(
        s,
        "preflight_info{{version=\"{}\",command=\"{}\",hostname=\"{host}\"}} 1",
        escape(&report.tool.version),
        escape(&report.command)
    );
    family(
        &mut s,
        "preflight_verdict",
        "The run's verdict: one series per verdict, 1 for the one it had.",
    );
    for v in VERDICTS {
        let _ = writeln!(
            s,
            "preflight_verdict{{verdict=\"{v}\"}} {}",
            u8::from(report.verdict.name() == v)
        );
    }
    family(
        &mut s,
        "preflight_ready",
        "1 when the verdict is ready (run: the whole cluster's), else 0.",
    );
    let _ = writeln!(
        s,
        "preflight_ready {}",
        u8::from(report.verdict.name() == "ready")
    );
    family(
        &mut s,
        "preflight_exit_code",
        "The exit code: 0 ready, 1 not ready, 3 incomplete.",
    );
    let _ = writeln!(s, "preflight_exit_code {}", report.exit_code);
    family(
        &mut s,
        "preflight_last_run_timestamp_seconds",
        "When the run started, in seconds since the Unix epoch.",
    );
    let started = humantime::parse_rfc3339(&report.started_at)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let _ = writeln!(s, "preflight_last_run_timestamp_seconds {started}");
    family(
        &mut s,
        "preflight_run_duration_seconds",
        "How long the run took.",
    );
    let _ = writeln!(
        s,
        "preflight_run_duration_seconds {}",
        report.duration_ms as f64 / 1e3
    );
    family(
        &mut s,
        "preflight_checks",
        "How many checks ended in each status.",
    );
    let sum = &report.summary;
    for (status, n) in [
        ("pass", sum.pass),
        ("warn", sum.warn),
        ("fail", sum.fail),
        ("skip", sum.skip),
        ("error", sum.error),
    ] {
        let _ = writeln!(s, "preflight_checks{{status=\"{status}\"}} {n}");
    }
    family(
        &mut s,
        "preflight_check_status",
        "One series per check and status: 1 for the status the check ended in, 0 for the others.",
    );
    for c in &checks {
        for st in STATUSES {
            let _ = writeln!(
                s,
                "preflight_check_status{{check=\"{}\",area=\"{}\",severity=\"{}\",status=\"{}\"}} {}",
                escape(&c.id),
                escape(&c.area),
                severity(c.severity),
                st.name(),
                u8::from(c.status == st)
            );
        }
    }
    family(
        &mut s,
        "preflight_check_duration_seconds",
        "How long each check took.",
    );
    for c in &checks {
        let _ = writeln!(
            s,
            "preflight_check_duration_seconds{{check=\"{}\"}} {}",
            escape(&c.id),
            c.duration.as_secs_f64()
        );
    }
    if let Some(cluster) = &report.cluster {
        family(
            &mut s,
            "preflight_cluster_world_size",
            "Ranks the cluster stage expected.",
        );
        let _ = writeln!(s, "preflight_cluster_world_size {}", cluster.world_size);
        family(
            &mut s,
            "preflight_cluster_culprit",
            "Nodes the cluster verdict holds responsible; 1 each.",
        );
        for c in &cluster.culprits {
            let _ = writeln!(
                s,
                "preflight_cluster_culprit{{node=\"{}\"}} 1",
                escape(&c.node)
            );
        }
    }
    if let Some(coll) = &report.collective {
        family(
            &mut s,
            "preflight_collective_backend_up",
            "1 when the backend ran and every operation verified, 0 when it failed or was skipped.",
        );
        for b in &coll.backends {
            let _ = writeln!(
                s,
                "preflight_collective_backend_up{{backend=\"{}\",verdict=\"{}\"}} {}",
                escape(&b.name),
                escape(&b.verdict),
                u8::from(b.verdict == "pass")
            );
        }
        family(
            &mut s,
            "preflight_collective_busbw_bytes_per_second",
            "Bus bandwidth (nccl-tests' busbw) per backend, operation and message size.",
        );
        for b in &coll.backends {
            for r in &b.sweep {
                let _ = writeln!(
                    s,
                    "preflight_collective_busbw_bytes_per_second{{backend=\"{}\",op=\"{}\",size_bytes=\"{}\"}} {}",
                    escape(&b.name),
                    r.op.name(),
                    r.bytes,
                    r.busbw * 1e9
                );
            }
        }
        family(
            &mut s,
            "preflight_collective_time_seconds",
            "Mean time per operation (the slowest rank's) per backend, operation and message size.",
        );
        for b in &coll.backends {
            for r in &b.sweep {
                let _ = writeln!(
                    s,
                    "preflight_collective_time_seconds{{backend=\"{}\",op=\"{}\",size_bytes=\"{}\"}} {}",
                    escape(&b.name),
                    r.op.name(),
                    r.bytes,
                    r.time_us / 1e6
                );
            }
        }
    }
    s
}

pub(super) fn family(s: &mut String, name: &str, help: &str) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge");
}

fn severity(s: preflight_result::Severity) -> &'static str {
    match s {
        preflight_result::Severity::Fail => "fail",
        preflight_result::Severity::Warn => "warn",
    }
}

/// A label value as the exposition format reads it: backslash, double
/// quote and newline escaped.
pub(super) fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    /// A real run's rank 0 report (the 4-host fixture: h1 and h3 at
    /// fault) gives the cluster families: the world, each culprit once,
    /// and the tool's info. (tests/network/cluster_loopback.rs runs
    /// `run --format prometheus` itself.)
    #[test]
    fn a_runs_report_names_world_and_culprits() {
        let report: Report = serde_json::from_str(include_str!(
            "../../../fixtures/reports/run-4node/rank0.json"
        ))
        .unwrap();
        let text = prometheus(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.contains(&"preflight_cluster_world_size 4"), "{text}");
        let culprits: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with("preflight_cluster_culprit{"))
            .collect();
        assert_eq!(
            culprits,
            [
                &"preflight_cluster_culprit{node=\"h1\"} 1",
                &"preflight_cluster_culprit{node=\"h3\"} 1"
            ]
        );
        assert!(
            lines.iter().any(
                |l| l.starts_with("preflight_info{version=\"") && l.contains("command=\"run\"")
            ),
            "{text}"
        );
    }
}
