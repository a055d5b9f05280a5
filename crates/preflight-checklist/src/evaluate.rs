//! Which stage evaluates a check, and a check's result from what its probe
//! found: the one place that decides both, whichever stage asks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Check, Scope};
use preflight_facts::Facts;
use preflight_kinds::cluster::View;
use preflight_result::collective::CollectiveReport;
use preflight_result::{CheckResult, Finding, Status};

/// The stage that evaluates a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evaluator {
    /// The checklist engine, on each node.
    Node,
    /// Rank 0, over every node's check-in, at the barrier.
    Cluster,
    /// Every rank alike, over the collective stage's report.
    Collective,
}

impl Check {
    pub fn evaluator(&self) -> Evaluator {
        if self.probe.collective().is_some() {
            Evaluator::Collective
        } else if self.scope == Scope::Cluster {
            Evaluator::Cluster
        } else {
            Evaluator::Node
        }
    }
}

/// The cluster-scope checks, on rank 0, over the cluster view.
/// Each result comes with the nodes its finding blames.
pub fn evaluate_cluster(
    checks: &[Arc<Check>],
    view: &View<'_>,
    facts: &Facts,
) -> Vec<(CheckResult, Vec<String>)> {
    checks
        .iter()
        .filter(|c| c.evaluator() == Evaluator::Cluster)
        .filter_map(|c| {
            let probe = c.probe.cluster()?;
            let start = Instant::now();
            let finding = if let Some(reason) = c.when.unmet(facts) {
                Finding::skip(reason)
            } else {
                probe.evaluate_cluster(view)
            };
            let blames = finding.blames.to_vec();
            Some((complete(c, finding, start.elapsed(), facts), blames))
        })
        .collect()
}

/// The checks over the collective stage's report (its thresholds), on
/// every rank alike.
pub fn evaluate_collective(
    checks: &[Arc<Check>],
    report: &CollectiveReport,
    facts: &Facts,
) -> Vec<CheckResult> {
    checks
        .iter()
        .filter_map(|check| {
            let probe = check.probe.collective()?;
            let finding = probe.evaluate_collective(report);
            Some(complete(check, finding, Duration::ZERO, facts))
        })
        .collect()
}

/// A check's lines in the report: one, or one per problem where the
/// finding has parts (`<id>:<subject>`, each with its own status and
/// hint).
pub fn complete_all(
    check: &Check,
    mut finding: Finding,
    duration: Duration,
    facts: &Facts,
) -> Vec<CheckResult> {
    let parts = finding
        .extra
        .as_mut()
        .map(|e| std::mem::take(&mut e.parts))
        .unwrap_or_default();
    if parts.is_empty() {
        return vec![complete(check, finding, duration, facts)];
    }
    parts
        .into_iter()
        .map(|(subject, part)| {
            let mut r = complete(check, part, duration, facts);
            r.id = format!("{}:{subject}", check.id);
            r
        })
        .collect()
}

/// A check's line in the report: the finding with the check's severity
/// applied and its hint rendered.
pub fn complete(check: &Check, finding: Finding, duration: Duration, facts: &Facts) -> CheckResult {
    let finding = finding.with_severity(check.severity);
    let hint = match finding.status {
        Status::Fail | Status::Warn | Status::Error => check
            .hint
            .as_ref()
            .map(|h| h.render(&check.id, &finding, facts))
            .filter(|h| !h.is_empty()),
        Status::Pass | Status::Skip => None,
    };
    let about = finding.about();
    let (threshold, copies) = finding
        .extra
        .map(|e| (e.threshold, e.copies))
        .unwrap_or_default();
    CheckResult {
        id: check.id.clone(),
        kind: check.kind.name.to_string(),
        area: check.area.clone(),
        severity: check.severity,
        tags: check.tags.clone(),
        status: finding.status,
        measured: finding.measured,
        expected: finding.expected,
        message: finding.message,
        hint,
        duration,
        source: check.source.clone(),
        caused_by: None,
        about,
        threshold,
        copies,
        cached: false,
        measured_at: None,
        reused_until: None,
        shared: false,
    }
}
