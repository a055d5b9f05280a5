//! The report for people: checks grouped by area, problems repeated at the
//! end with their hints, and a one-line verdict.

use std::fmt::Write;

use super::style::Style;
use preflight_ground::values::format_duration;
use preflight_result::report::Report;
use preflight_result::{CheckResult, Status, Verdict};

/// Where a run's time went: `-v`'s line under the header.
fn timings_line(t: &preflight_result::report::Timings) -> String {
    let mut parts = vec![format!(
        "checks {} ms ({} evaluated here{})",
        t.checks_ms,
        t.evaluated,
        if t.shared > 0 {
            format!(", {} from the node's leader", t.shared)
        } else {
            String::new()
        }
    )];
    if let Some(ms) = t.rendezvous_ms {
        parts.push(format!("rendezvous {ms} ms"));
    }
    if let Some(ms) = t.collective_ms {
        parts.push(format!("collective {ms} ms"));
    }
    format!("time: {}; CPU {} ms", parts.join(", "), t.cpu_ms)
}

/// After a finding a rank's leader shared: whose it is.
const SHARED: &str = "(the node's, from local rank 0)";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Problems and the verdict only.
    Quiet,
    /// Problems, one line for what passed or does not apply, and the
    /// verdict.
    Normal,
    /// Every check by area, with measured and expected values and
    /// durations (not for skipped checks: nothing was measured).
    Verbose,
}

pub struct Human {
    pub style: Style,
    pub detail: Detail,
}

impl Human {
    pub fn render(&self, report: &Report) -> String {
        let mut out = String::new();
        let s = &self.style;
        if self.detail == Detail::Normal {
            // Quiet when healthy, as NHC and goss are: the problems, then
            // one line for everything else.
            let _ = writeln!(out, "{}", header(report, s));
            out.push_str(&problems(report.checks.iter(), s));
            let n = &report.summary;
            let _ = writeln!(
                out,
                "\n{} passed, {} do not apply here{}; -v lists every check",
                n.pass,
                n.skip,
                match n.warn + n.fail + n.error {
                    0 => String::new(),
                    k => format!(", {k} listed above"),
                }
            );
            let _ = writeln!(out, "\n{}", verdict_line(report, s));
            return out;
        }
        if self.detail == Detail::Verbose {
            let _ = writeln!(out, "{}", header(report, s));
            if let Some(t) = &report.timings {
                let _ = writeln!(out, "{}", s.dim(&timings_line(t)));
            }
            let width = report.checks.iter().map(|c| c.id.len()).max().unwrap_or(0);
            let mut areas: Vec<&str> = Vec::new();
            for check in &report.checks {
                if !areas.contains(&check.area.as_str()) {
                    areas.push(&check.area);
                }
            }
            for area in areas {
                let _ = writeln!(out, "\n{}", s.bold(area));
                for check in report.checks.iter().filter(|c| c.area == area) {
                    // The duration ends the check's own line (nothing was
                    // measured for a skip); the values follow on a line of
                    // their own only when they say more than the message.
                    let took = if check.shared {
                        format!("  {}", s.dim(SHARED))
                    } else if check.status == Status::Skip {
                        String::new()
                    } else {
                        format!(
                            "  {}",
                            s.dim(&format!("({})", format_duration(check.duration)))
                        )
                    };
                    let _ = writeln!(
                        out,
                        "  {}  {:<width$}  {}{took}",
                        s.mark(check.status),
                        check.id,
                        under(&check.message, width + 10)
                    );
                    let values = values_line(check);
                    if check.status != Status::Skip && !values.is_empty() {
                        let _ = writeln!(out, "        {}", s.dim(&values));
                    }
                }
            }
        }
        let listed = problems(report.checks.iter(), s);
        // Quiet output starts with its first problem, not a blank line.
        out.push_str(if out.is_empty() {
            listed.trim_start_matches('\n')
        } else {
            &listed
        });
        let verdict = verdict_line(report, s);
        if out.is_empty() {
            let _ = writeln!(out, "{verdict}");
        } else {
            let _ = writeln!(out, "\n{verdict}");
        }
        out
    }
}

/// `preflight 0.1.0 · check · gpu017 · 41 checks`
fn header(report: &Report, s: &Style) -> String {
    format!(
        "{} {} · {} · {} · {}",
        s.bold("preflight"),
        report.tool.version,
        report.command,
        report.node.hostname,
        preflight_ground::values::count(report.checks.len(), "check")
    )
}

/// The "Problems" section: every failed, warning or unevaluated check with
/// its values and hint; empty when there is none.
pub fn problems<'a>(checks: impl Iterator<Item = &'a CheckResult>, s: &Style) -> String {
    let mut out = String::new();
    let mut problems: Vec<&CheckResult> = checks
        .filter(|c| matches!(c.status, Status::Fail | Status::Warn | Status::Error))
        .collect();
    // The causes by severity (what blocks the job before what may), then
    // what follows from them, each group in checklist order.
    problems.sort_by_key(|c| {
        let rank = match c.status {
            Status::Fail => 0,
            Status::Error => 1,
            _ => 2,
        };
        (c.caused_by.is_some(), rank)
    });
    if !problems.is_empty() {
        let _ = writeln!(out, "\n{}", s.bold("Problems"));
        for check in problems {
            // A consequence is named once, under its cause's remedy.
            if let Some(cause) = &check.caused_by {
                let _ = writeln!(
                    out,
                    "  {}  {}: caused by {cause} (its remedy above fixes this too)",
                    s.mark(check.status),
                    check.id
                );
                continue;
            }
            let _ = writeln!(
                out,
                "  {}  {}: {}{}",
                s.mark(check.status),
                check.id,
                under(&check.message, 8),
                if check.shared {
                    format!(" {}", s.dim(SHARED))
                } else {
                    String::new()
                }
            );
            let values = values_line(check);
            if !values.is_empty() {
                let _ = writeln!(out, "        {}", under(&values, 8));
            }
            if let Some(hint) = &check.hint {
                let _ = writeln!(out, "        hint: {}", under(hint, 14));
            }
        }
    }
    out
}

/// Text that may hold line breaks (a foreign tool's stderr, a quoted
/// log) kept under its check: every line after the first indented by
/// `indent`, never at column 0 where it would read as output of its own.
fn under(text: &str, indent: usize) -> String {
    let text = text.trim_end();
    if !text.contains('\n') {
        return text.to_string();
    }
    let pad = format!("\n{}", " ".repeat(indent));
    text.lines().collect::<Vec<_>>().join(&pad)
}

/// `measured: ...   expected: ...`, leaving out a measured value the
/// message already says word for word.
fn values_line(check: &CheckResult) -> String {
    let measured = check
        .measured
        .as_ref()
        .filter(|m| !check.message.contains(m.as_str()));
    match (measured, &check.expected) {
        (Some(m), Some(e)) => format!("measured: {m}   expected: {e}"),
        (Some(m), None) => format!("measured: {m}"),
        (None, Some(e)) => format!("expected: {e}"),
        (None, None) => String::new(),
    }
}

/// `READY  12 pass · 1 warn · 0 fail · 3 skip · 0 error  (35ms)`
pub fn verdict_line(report: &Report, s: &Style) -> String {
    let n = &report.summary;
    format!(
        "{}  {} pass · {} warn · {} fail · {} skip · {} error  ({}){}{}",
        s.verdict(report.verdict),
        n.pass,
        n.warn,
        n.fail,
        n.skip,
        n.error,
        format_duration(std::time::Duration::from_millis(report.duration_ms)),
        if report.strict { "  [strict]" } else { "" },
        root_causes(report)
    )
}

/// `  · cause: env.lint` where some failures are another's consequence:
/// the line names what to fix first; otherwise, on a node that is not
/// ready, `  · failed: id, id`, so that the one line alone (a Slurm log,
/// a node-problem-detector condition) says what to look at.
fn root_causes(report: &Report) -> String {
    if let Some(how) = &report.interrupted {
        return format!("  · {}", how.describe());
    }
    if !report.checks.iter().any(|c| c.caused_by.is_some()) {
        let (label, status) = match report.verdict {
            Verdict::Ready => return String::new(),
            Verdict::NotReady if report.summary.fail == 0 => ("warned", Status::Warn),
            Verdict::NotReady => ("failed", Status::Fail),
            Verdict::Incomplete => ("not evaluated", Status::Error),
        };
        let ids: Vec<String> = report
            .checks
            .iter()
            .filter(|c| c.status == status)
            .map(|c| c.id.clone())
            .collect();
        if ids.is_empty() {
            return String::new();
        }
        return format!(
            "  · {label}: {}",
            preflight_ground::values::listed(&ids, ", ", 3)
        );
    }
    let roots: Vec<String> = preflight_result::cause::roots(&report.checks)
        .iter()
        .map(|c| c.id.clone())
        .collect();
    if roots.is_empty() {
        return String::new();
    }
    format!(
        "  · cause: {}",
        preflight_ground::values::listed(&roots, ", ", 3)
    )
}

/// One progress line for stderr, rewritten in place as checks finish.
/// `[12/48] pass net.hostname  running: ib.rate, time.sync`: what
/// finished last, and what the run is still waiting for.
pub fn progress_line(done: usize, total: usize, last: &CheckResult, running: &[&str]) -> String {
    let mut line = format!(
        "\r\x1b[K[{done}/{total}] {} {}",
        last.status.name(),
        last.id
    );
    if !running.is_empty() {
        let shown: Vec<String> = running.iter().map(|s| s.to_string()).collect();
        line.push_str(&format!(
            "  running: {}",
            preflight_ground::values::listed(&shown, ", ", 3)
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::{timings_line, under};

    #[test]
    fn the_time_line_says_each_phase_and_what_the_leader_did() {
        let t = preflight_result::report::Timings {
            checks_ms: 4,
            evaluated: 5,
            shared: 10,
            rendezvous_ms: Some(12),
            collective_ms: None,
            cpu_ms: 21,
        };
        assert_eq!(
            timings_line(&t),
            "time: checks 4 ms (5 evaluated here, 10 from the node's leader), rendezvous 12 ms; CPU 21 ms"
        );
    }

    #[test]
    fn a_message_of_several_lines_stays_under_its_check() {
        assert_eq!(under("one line", 8), "one line");
        assert_eq!(
            under(
                "nft failed: Operation not permitted\nnetlink: Error: cache initialization failed\n",
                8
            ),
            "nft failed: Operation not permitted\n        netlink: Error: cache initialization failed"
        );
    }
}
