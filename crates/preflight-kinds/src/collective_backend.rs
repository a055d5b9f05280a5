//! `collective_backend`: the checklist requires a collective backend. A
//! backend the operator only selected is `skip` when a node lacks it; one
//! the checklist requires makes the node not ready (the check's severity:
//! fail, or warn). Evaluated like `collective_busbw`, over the collective
//! report every rank holds after the stage.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::cluster::{ClusterProbe, NOT_HERE, View};
use super::collective_busbw::{CollectiveProbe, LATER};
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use preflight_facts::Facts;
use preflight_result::Finding;
use preflight_result::collective::CollectiveReport;

pub const KIND: KindInfo = KindInfo {
    name: "collective_backend",
    scope: crate::Scope::Cluster,
    area: "collective",
    summary: "A collective backend is available on every rank and passed the collective stage (all five operations verified).",
    params: &[ParamDoc {
        name: "backend",
        ty: "string",
        default: None,
        doc: "tcp, nccl or oneccl: the backend the job needs.",
    }],
    hint_vars: &[],
    parse: parse_params::<Required>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Required {
    backend: String,
}

impl Params for Required {
    fn validate(&self) -> Result<(), String> {
        if preflight_facts::Backend::from_name(&self.backend).is_none() {
            return Err(format!(
                "`backend` must be {}",
                preflight_facts::Backend::choices()
            ));
        }
        Ok(())
    }
}

impl Probe for Required {
    fn evaluate(self: Arc<Self>, _facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async { Finding::skip(NOT_HERE) })
    }
    fn cluster(&self) -> Option<&dyn ClusterProbe> {
        Some(self)
    }
    fn collective(&self) -> Option<&dyn CollectiveProbe> {
        Some(self)
    }
}

impl ClusterProbe for Required {
    fn evaluate_cluster(&self, _view: &View<'_>) -> Finding {
        Finding::skip(LATER)
    }
}

impl CollectiveProbe for Required {
    fn evaluate_collective(&self, report: &CollectiveReport) -> Finding {
        let name = &self.backend;
        let Some(b) = report.backends.iter().find(|b| &b.name == name) else {
            // Required, yet not run: nobody knows whether it works.
            return Finding::error(format!(
                "{name} is required but the collective stage did not run it (add it to --backends)"
            ));
        };
        let expected = "available on every rank, five operations verified".to_string();
        let library = b
            .library
            .as_deref()
            .map(|l| format!(" ({l})"))
            .unwrap_or_default();
        let f = match b.verdict.as_str() {
            "pass" => Finding::pass(format!(
                "{name}: available and verified on {}{library}",
                preflight_ground::values::count(report.world_size as usize, "rank")
            ))
            .measured("verified"),
            "skip" => Finding::fail(format!(
                "{name} is required but not available: {}{library}",
                b.reason
            ))
            .measured("not available"),
            "incomplete" => Finding::error(format!(
                "{name} is required and did not finish: {}",
                b.ended
                    .as_deref()
                    .unwrap_or("the run's deadline came first")
            ))
            .measured("not finished"),
            _ => Finding::fail(format!(
                "{name} is required and failed: {}",
                b.ended.as_deref().unwrap_or("see the collective section")
            ))
            .measured("failed"),
        };
        f.expected(expected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use preflight_result::Status;
    use preflight_result::collective::BackendReport;

    fn with(verdict: &str) -> CollectiveReport {
        let oneccl = BackendReport {
            init_ms: None,
            ended: Some("the run's deadline (--timeout) came during init".into()),
            ..BackendReport::available("oneccl", verdict, Vec::new())
        };
        CollectiveReport::of("short", 2, vec![oneccl])
    }

    #[test]
    fn a_backend_cut_by_the_runs_deadline_could_not_be_evaluated() {
        let need = Required {
            backend: "oneccl".into(),
        };
        let f = need.evaluate_collective(&with("incomplete"));
        assert_eq!(f.status, Status::Error, "{}", f.message);
        assert!(
            f.message.contains("did not finish: the run's deadline"),
            "{}",
            f.message
        );
        assert_eq!(need.evaluate_collective(&with("fail")).status, Status::Fail);
    }
}
