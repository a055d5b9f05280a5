//! `preflight diagnose`: the running distributed jobs on this node, each
//! rank's state as the kernel shows it, and the ranks that hold the others
//! up, named only on evidence. It changes nothing in the job: it reads
//! /proc (no signal, no ptrace stop, nothing written to the job's store).
//!
//! `find` (the jobs and their ranks, from each process's environment),
//! `observe` (a rank's state over a short sample: its task, its CPU time,
//! its sockets), `judge` (the verdict).

mod find;
mod judge;
mod observe;

use std::path::Path;
use std::time::Duration;

pub use find::{Filter, jobs};
pub use judge::judge;
pub use observe::observe;

use crate::result::diagnosis::{Diagnosis, SCHEMA};

/// Every job on the node (under `proc_dir`) that `filter` keeps, each
/// rank watched for `sample`, judged.
pub fn diagnose(proc_dir: &Path, node: &str, filter: &Filter, sample: Duration) -> Diagnosis {
    let found = jobs(proc_dir, filter);
    let pids: Vec<u32> = found
        .iter()
        .flat_map(|j| j.ranks.iter().map(|r| r.pid))
        .collect();
    let watched = observe(proc_dir, &pids, sample);
    let ms = sample.as_millis() as u64;
    let judged: Vec<_> = found.iter().map(|j| judge(j, &watched, node, ms)).collect();
    let verdict = if judged.is_empty() {
        "no_job"
    } else if judged.iter().any(|j| j.verdict == "held") {
        "held"
    } else if judged.iter().all(|j| j.verdict == "progressing") {
        "progressing"
    } else {
        "unknown"
    };
    Diagnosis {
        schema: SCHEMA.into(),
        node: node.into(),
        sample_ms: sample.as_millis() as u64,
        jobs: judged,
        verdict: verdict.into(),
    }
}
