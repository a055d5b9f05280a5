//! What a node's result does to it in Slurm, and the drain reason: one
//! line, bounded, starting with the site's prefix, naming the first check
//! that failed and how many more did (the report file has them all).

use super::scontrol::one_line;
use crate::site::Incomplete;
use preflight_result::report::Report;
use preflight_result::{CheckResult, Status, Verdict};

/// Slurm keeps reasons of any length, but `sinfo -R` shows 20 columns and
/// operators read them in `scontrol show node`: one short line.
pub const REASON_MAX: usize = 200;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Drain this node with the reason.
    Drain(String),
    /// Ready: resume this node, only if preflight's prefix starts its
    /// reason (a node someone else drained stays drained).
    ResumeIfOurs,
    /// Leave the node as it is, and why.
    Keep(String),
    /// The job must not start on this allocation: requeue it (held when
    /// no node was named, so that it does not loop back onto the same
    /// nodes) with the reason in its comment; drain nothing here.
    StopJob { reason: String, hold: bool },
    /// The job runs, though the gate could not be kept (strangers held
    /// the rendezvous): why, in its comment and the log.
    RunNoted(String),
}

/// `PREFIX check.id: message (+N more)`, one line, at most REASON_MAX.
pub fn reason(prefix: &str, first: &str, more: usize) -> String {
    let tail = if more > 0 {
        format!(" (+{more} more)")
    } else {
        String::new()
    };
    let room = REASON_MAX.saturating_sub(prefix.len() + 1 + tail.len());
    format!("{prefix} {}{tail}", one_line(first, room))
}

/// A node judged alone (healthcheck, epilog, a prolog without the
/// cluster stage). `resume`: a ready node may be resumed (the health
/// check; a prolog or epilog runs on a node that is in service).
pub fn node_action(report: &Report, incomplete: Incomplete, prefix: &str, resume: bool) -> Action {
    let failing = |status: Status| -> Vec<&CheckResult> {
        report
            .checks
            .iter()
            .filter(|c| c.status == status)
            .collect()
    };
    let ready = || {
        if resume {
            Action::ResumeIfOurs
        } else {
            Action::Keep("ready".into())
        }
    };
    match report.verdict {
        Verdict::Ready => ready(),
        Verdict::NotReady => {
            let mut bad = failing(Status::Fail);
            if bad.is_empty() {
                // --strict: a warning made it not ready.
                bad = failing(Status::Warn);
            }
            match bad.first() {
                Some(c) => Action::Drain(reason(
                    prefix,
                    &format!("{}: {}", c.id, c.message),
                    bad.len() - 1,
                )),
                None => Action::Drain(reason(prefix, "not ready", 0)),
            }
        }
        Verdict::Incomplete => {
            let errs = failing(Status::Error);
            let first = errs
                .first()
                .map(|c| format!("{}: could not be evaluated: {}", c.id, c.message))
                .unwrap_or_else(|| "incomplete".into());
            match incomplete {
                Incomplete::Drain => {
                    Action::Drain(reason(prefix, &first, errs.len().saturating_sub(1)))
                }
                Incomplete::Ignore => Action::Keep(format!(
                    "incomplete, left as it is (incomplete: ignore): {}",
                    one_line(&first, REASON_MAX)
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use preflight_result::report::Node;

    fn report(statuses: &[(&str, Status)]) -> Report {
        let checks = statuses
            .iter()
            .map(|(id, s)| {
                CheckResult::built_in(id, "command", "system", *s, format!("{id} says\nwhy"), None)
            })
            .collect();
        let node = Node {
            hostname: "h".into(),
            root: "/".into(),
            pid: 1,
            rank: None,
        };
        Report::new(
            "check",
            node,
            std::time::SystemTime::now(),
            Default::default(),
            checks,
            false,
        )
    }

    #[test]
    fn the_first_failure_names_the_drain_and_the_rest_are_counted() {
        let r = report(&[
            ("a.ok", Status::Pass),
            ("net.x", Status::Fail),
            ("gpu.y", Status::Fail),
        ]);
        assert_eq!(
            node_action(&r, Incomplete::Ignore, "preflight:", true),
            Action::Drain("preflight: net.x: net.x says why (+1 more)".into())
        );
    }

    #[test]
    fn ready_resumes_only_in_the_health_check() {
        let r = report(&[("a.ok", Status::Pass)]);
        assert_eq!(
            node_action(&r, Incomplete::Drain, "p:", true),
            Action::ResumeIfOurs
        );
        assert!(matches!(
            node_action(&r, Incomplete::Drain, "p:", false),
            Action::Keep(_)
        ));
    }

    #[test]
    fn incomplete_follows_the_setting() {
        let r = report(&[("a.ok", Status::Pass), ("fs.hang", Status::Error)]);
        assert_eq!(r.verdict, Verdict::Incomplete);
        assert_eq!(
            node_action(&r, Incomplete::Drain, "preflight:", true),
            Action::Drain("preflight: fs.hang: could not be evaluated: fs.hang says why".into())
        );
        assert!(
            matches!(node_action(&r, Incomplete::Ignore, "preflight:", true), Action::Keep(k) if k.contains("fs.hang"))
        );
    }

    #[test]
    fn a_reason_is_bounded_and_keeps_its_count() {
        let r = reason("preflight:", &"x".repeat(1000), 7);
        assert!(r.len() <= REASON_MAX, "{}", r.len());
        assert!(
            r.starts_with("preflight: xxx") && r.ends_with("... (+7 more)"),
            "{r}"
        );
    }
}
