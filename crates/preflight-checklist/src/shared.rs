//! The node's findings, evaluated once per node: where a job's node layout
//! is known, its leader (local rank 0) evaluates the node-scope checks and
//! hands its findings to the node's other ranks, which evaluate only their
//! own (rank-scope) checks. Each of them still reports the whole
//! checklist, the node's findings marked as shared.

use std::sync::Arc;
use std::time::Duration;

use super::{Check, Evaluator, Scope, complete};
use preflight_facts::Facts;
use preflight_result::{CheckResult, Finding, Status};

/// The message of a node check a led rank leaves to its leader, until
/// the leader's finding replaces it.
const LEFT_TO_LEADER: &str =
    "the node's check: evaluated once, by this node's leader (local rank 0)";

/// Whether the node's leader evaluates `check` for the node's ranks: a
/// node check whose condition cannot differ between the node's ranks.
pub fn is_nodes(check: &Check) -> bool {
    check.scope == Scope::Node && check.evaluator() == Evaluator::Node && !check.when.per_rank()
}

/// A led rank's line for a node check, until its leader's finding comes.
pub fn left_to_leader(check: &Check, facts: &Facts) -> CheckResult {
    let mut r = complete(check, Finding::skip(LEFT_TO_LEADER), Duration::ZERO, facts);
    r.shared = true;
    r
}

/// A leader's lines for the node checks (one check may have several:
/// `<id>:<subject>`), to share with its node's ranks.
pub fn node_findings(checks: &[Arc<Check>], results: &[CheckResult]) -> Vec<CheckResult> {
    results
        .iter()
        .filter(|r| checks.iter().any(|c| is_nodes(c) && of_check(&c.id, &r.id)))
        .cloned()
        .collect()
}

fn of_check(check: &str, line: &str) -> bool {
    line == check
        || line
            .strip_prefix(check)
            .is_some_and(|rest| rest.starts_with(':'))
}

/// A led rank's results with its leader's findings in place of the lines
/// it left to the leader. Only lines for those checks are taken, each at
/// most once; a check the leader sent nothing for, or a leader that sent
/// nothing at all (it went away before the verdict), is said: not
/// evaluated, never a silent pass.
pub fn fill(results: Vec<CheckResult>, from_leader: Option<&[CheckResult]>) -> Vec<CheckResult> {
    let left =
        |r: &CheckResult| r.shared && r.status == Status::Skip && r.message == LEFT_TO_LEADER;
    let mut out = Vec::with_capacity(results.len());
    for r in results {
        if !left(&r) {
            out.push(r);
            continue;
        }
        let taken: Vec<CheckResult> = from_leader
            .unwrap_or_default()
            .iter()
            .filter(|l| of_check(&r.id, &l.id) && !out.iter().any(|o: &CheckResult| o.id == l.id))
            .take(MAX_LINES_PER_CHECK)
            .cloned()
            .map(|mut l| {
                l.shared = true;
                l
            })
            .collect();
        if taken.is_empty() {
            let mut e = r;
            e.status = Status::Error;
            e.message = match from_leader {
                Some(_) => "not evaluated: this node's leader (local rank 0) evaluates the node's checks once for its ranks, and sent no finding for this one (its checklist differs from this rank's?)".into(),
                None => "not evaluated: this node's leader (local rank 0) evaluates the node's checks once for its ranks, and went away before it shared its findings".into(),
            };
            out.push(e);
        } else {
            out.extend(taken);
        }
    }
    out
}

/// At most this many lines of one check are taken from a leader: a check
/// reports one line per problem, and no check has more subjects.
const MAX_LINES_PER_CHECK: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use preflight_result::Severity;

    fn line(id: &str, status: Status, message: &str, shared: bool) -> CheckResult {
        let mut r = CheckResult::built_in(id, "test", "test", status, message.into(), None);
        r.severity = Severity::Fail;
        r.shared = shared;
        r
    }

    #[test]
    fn a_leaders_lines_replace_what_was_left_to_it_and_nothing_else() {
        let results = vec![
            line("env.rank", Status::Pass, "ok", false),
            line("net.firewall", Status::Skip, LEFT_TO_LEADER, true),
            line("gpu.health", Status::Skip, LEFT_TO_LEADER, true),
        ];
        let leader = vec![
            line("net.firewall", Status::Fail, "DROP on 29500", false),
            line("gpu.health:0", Status::Pass, "ok", false),
            line("gpu.health:1", Status::Warn, "ecc", false),
            // Never the rank's own: the leader does not speak for it.
            line("env.rank", Status::Fail, "forged", false),
            line("gpu.healthy", Status::Fail, "another check", false),
        ];
        let out = fill(results, Some(&leader));
        let ids: Vec<(&str, Status, bool)> = out
            .iter()
            .map(|r| (r.id.as_str(), r.status, r.shared))
            .collect();
        assert_eq!(
            ids,
            vec![
                ("env.rank", Status::Pass, false),
                ("net.firewall", Status::Fail, true),
                ("gpu.health:0", Status::Pass, true),
                ("gpu.health:1", Status::Warn, true),
            ]
        );
    }

    #[test]
    fn a_leader_that_sent_nothing_leaves_errors_not_passes() {
        let results = vec![line("net.firewall", Status::Skip, LEFT_TO_LEADER, true)];
        let out = fill(results.clone(), None);
        assert_eq!(out[0].status, Status::Error);
        assert!(out[0].message.contains("went away"), "{}", out[0].message);
        let out = fill(results, Some(&[]));
        assert_eq!(out[0].status, Status::Error);
        assert!(
            out[0].message.contains("sent no finding"),
            "{}",
            out[0].message
        );
    }
}
