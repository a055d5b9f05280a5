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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::facts::py_spy::{self, PyFrame};

pub use find::{Filter, jobs};
pub use judge::judge;
pub use observe::observe;

use crate::result::diagnosis::{Diagnosis, SCHEMA};

/// How long py-spy may take for every rank at once.
const STACKS_WITHIN: Duration = Duration::from_secs(3);

/// Each process's main-thread stack from py-spy, all at once, or why not.
pub type Stacks = BTreeMap<u32, Result<Vec<PyFrame>, String>>;

fn stacks(py_spy: &Path, pids: &[u32]) -> Stacks {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Stacks::new();
    };
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for &pid in pids {
            let exe = py_spy.to_path_buf();
            set.spawn(async move { (pid, py_spy::dump(&exe, pid, STACKS_WITHIN).await) });
        }
        let mut out = Stacks::new();
        while let Some(Ok((pid, stack))) = set.join_next().await {
            out.insert(pid, stack);
        }
        out
    })
}

/// Every job on the node (under `proc_dir`) that `filter` keeps, each
/// rank watched for `sample` (and its Python stack read with `py_spy`,
/// where given), judged.
pub fn diagnose(
    proc_dir: &Path,
    node: &str,
    filter: &Filter,
    sample: Duration,
    py_spy: Option<PathBuf>,
) -> Diagnosis {
    let found = jobs(proc_dir, filter);
    let pids: Vec<u32> = found
        .iter()
        .flat_map(|j| j.ranks.iter().map(|r| r.pid))
        .collect();
    let watched = observe(proc_dir, &pids, sample);
    let stacks = py_spy.map(|p| stacks(&p, &pids)).unwrap_or_default();
    let ms = sample.as_millis() as u64;
    let judged: Vec<_> = found
        .iter()
        .map(|j| judge(j, &watched, &stacks, node, ms))
        .collect();
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
