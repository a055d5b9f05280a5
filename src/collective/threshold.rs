//! `collective_busbw`: the checklist's minimum bus bandwidth per backend,
//! operation and size, evaluated (with `scope: cluster`) against the
//! collective report that every rank holds after the stage. The check's
//! `severity` makes a shortfall a warning or a failure, as for any kind.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::report::CollectiveReport;
use super::sweep::human_bytes;
use crate::cluster::compare::{ClusterProbe, View};
use crate::facts::Facts;
use crate::kinds::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use crate::result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "collective_busbw",
    area: "collective",
    summary: "The collective stage's bus bandwidth for one backend, operation and size is at least a minimum (GB/s, nccl-tests' busbw).",
    params: &[
        ParamDoc {
            name: "backend",
            ty: "string",
            default: Some("tcp"),
            doc: "tcp, nccl or oneccl.",
        },
        ParamDoc {
            name: "op",
            ty: "string",
            default: Some("allreduce"),
            doc: "allreduce, allgather or broadcast.",
        },
        ParamDoc {
            name: "size",
            ty: "size",
            default: Some("the largest size measured"),
            doc: "Which row of the sweep, e.g. 1MiB.",
        },
        ParamDoc {
            name: "min_busbw",
            ty: "number",
            default: None,
            doc: "GB/s (10^9 B/s); below it the check fails (or warns, with severity: warn).",
        },
    ],
    hint_vars: &[],
    parse: parse_params::<Busbw>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Busbw {
    #[serde(default = "default_backend")]
    backend: String,
    #[serde(default = "default_op")]
    op: String,
    #[serde(default)]
    size: Option<String>,
    min_busbw: f64,
}

fn default_backend() -> String {
    "tcp".into()
}

fn default_op() -> String {
    "allreduce".into()
}

impl Params for Busbw {
    fn validate(&self) -> Result<(), String> {
        if !["allreduce", "allgather", "broadcast"].contains(&self.op.as_str()) {
            return Err("`op` must be allreduce, allgather or broadcast".into());
        }
        if !["tcp", "nccl", "oneccl"].contains(&self.backend.as_str()) {
            return Err("`backend` must be tcp, nccl or oneccl".into());
        }
        if let Some(s) = &self.size {
            crate::cli::parse_size(s).map_err(|e| format!("`size` {e}"))?;
        }
        if !(self.min_busbw.is_finite() && self.min_busbw > 0.0) {
            return Err("`min_busbw` must be a positive number of GB/s".into());
        }
        Ok(())
    }
}

pub const LATER: &str = "evaluated after the collective stage of `preflight run`/`bench`";

impl Probe for Busbw {
    fn evaluate(self: Arc<Self>, _facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async { Finding::skip(crate::cluster::compare::NOT_HERE) })
    }
    fn cluster(&self) -> Option<&dyn ClusterProbe> {
        Some(self)
    }
    fn collective(&self) -> Option<&dyn CollectiveProbe> {
        Some(self)
    }
}

impl ClusterProbe for Busbw {
    // Never asked at the barrier (compare::evaluate leaves collective
    // kinds out); the answer if it were.
    fn evaluate_cluster(&self, _view: &View<'_>) -> Finding {
        Finding::skip(LATER)
    }
}

pub trait CollectiveProbe: Send + Sync {
    fn evaluate_collective(&self, report: &CollectiveReport) -> Finding;
}

impl CollectiveProbe for Busbw {
    fn evaluate_collective(&self, report: &CollectiveReport) -> Finding {
        let Some(b) = report.backends.iter().find(|b| b.name == self.backend) else {
            return Finding::skip(format!(
                "backend {} was not selected (--backends)",
                self.backend
            ));
        };
        if !b.available {
            return Finding::skip(format!("{}: {}", b.name, b.reason));
        }
        let size = self
            .size
            .as_deref()
            .and_then(|s| crate::cli::parse_size(s).ok());
        let rows: Vec<_> = b.sweep.iter().filter(|r| r.op.name() == self.op).collect();
        let row = match size {
            Some(s) => rows.iter().find(|r| r.bytes == s).copied(),
            None => rows.iter().max_by_key(|r| r.bytes).copied(),
        };
        let expected = format!(">= {:.3} GB/s", self.min_busbw);
        let Some(row) = row else {
            let what = size.map(human_bytes).unwrap_or_else(|| "any size".into());
            return Finding::fail(format!(
                "{} {} has no verified result at {what} (the sweep ended early, or does not reach that size: --max-size)",
                b.name, self.op
            ))
            .expected(expected);
        };
        let measured = format!("{:.3} GB/s", row.busbw);
        let text = format!(
            "{} {} {} busbw {measured} (minimum {:.3} GB/s)",
            b.name,
            self.op,
            human_bytes(row.bytes),
            self.min_busbw
        );
        let f = if row.busbw >= self.min_busbw {
            Finding::pass(text)
        } else {
            Finding::fail(text)
        };
        f.measured(measured).expected(expected)
    }
}
