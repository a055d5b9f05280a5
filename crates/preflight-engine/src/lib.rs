//! The checklist engine: runs the applicable checks concurrently, each under
//! its own timeout and all under the checklist's deadline, and returns results in
//! checklist order whatever order they finish in.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::task::JoinSet;

use preflight_checklist::kept::{Lookup, Store};
use preflight_checklist::{Check, Evaluator, complete, complete_all, shared};
use preflight_facts::Facts;
use preflight_ground::values::{Span, format_duration};
use preflight_result::{CheckResult, Finding};

/// At most this many checks run at once by default: enough to overlap
/// slow probes, few enough not to fork a storm of commands on a busy node.
pub const MAX_PARALLEL: usize = 16;

/// How a run treats its checks beyond their own settings.
#[derive(Debug)]
pub struct Options<'a> {
    /// Kept passes (`cache:`), reused and kept; none: nothing kept.
    pub kept: Option<&'a Store>,
    /// Checks run at once (`--max-concurrent`).
    pub max_concurrent: usize,
    /// `--no-slow-now`: a check tagged slow reuses its kept pass or is
    /// skipped (the health check while a job holds the node).
    pub no_slow_now: bool,
    /// A rank whose node's leader evaluates the node checks for it: it
    /// evaluates only its own (`checklist::shared`).
    pub led: bool,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            kept: None,
            max_concurrent: MAX_PARALLEL,
            no_slow_now: false,
            led: false,
        }
    }
}

/// The tag of the checks too slow for every run (DCGM's longer levels,
/// torch's import): `--no-slow-now` holds them back.
const SLOW_TAG: &str = "slow";

/// What the engine reports while it works, for progress displays.
pub enum Progress<'a> {
    Finished {
        done: usize,
        total: usize,
        result: &'a CheckResult,
        /// The checks still running, in checklist order.
        running: Vec<&'a str>,
    },
}

/// A check's result when it is known without running it: skipped (it
/// does not apply here, or it is slow and must wait: `--no-slow-now`), or
/// its kept pass; `None`: run it, `not_kept` saying why a kept pass was
/// not taken.
fn settle(
    check: &Check,
    facts: &Facts,
    options: &Options<'_>,
    not_kept: &mut Option<String>,
) -> Option<CheckResult> {
    let unmet = if check.evaluator() != Evaluator::Node {
        Some(preflight_kinds::cluster::NOT_HERE.to_string())
    } else {
        check.when.unmet(facts)
    };
    if unmet.is_none() && options.led && shared::is_nodes(check) {
        return Some(shared::left_to_leader(check, facts));
    }
    if let Some(reason) = unmet {
        return Some(complete(
            check,
            Finding::skip(reason),
            Duration::ZERO,
            facts,
        ));
    }
    if let Some(store) = options.kept {
        match store.lookup(check, SystemTime::now()) {
            Lookup::Reuse(result) => return Some(*result),
            Lookup::Run { why } => *not_kept = why,
        }
    }
    if options.no_slow_now && check.tags.iter().any(|t| t == SLOW_TAG) {
        let why = format!(
            "not run now: a job holds this node, and slow checks run between jobs ({})",
            not_kept
                .take()
                .unwrap_or_else(|| "no kept pass to reuse".into())
        );
        return Some(complete(check, Finding::skip(why), Duration::ZERO, facts));
    }
    None
}

pub async fn run(
    checks: &[Arc<Check>],
    facts: &Arc<Facts>,
    run_timeout: Duration,
    options: &Options<'_>,
    mut progress: impl FnMut(Progress<'_>),
) -> Vec<CheckResult> {
    let now = tokio::time::Instant::now();
    // Durations are capped when parsed; this only guards the arithmetic.
    let deadline = now.checked_add(run_timeout).unwrap_or(now + Span::LONGEST);
    // What a budgeted kind plans within: the same deadline, on the clock
    // the kinds read.
    facts.set_run_deadline(deadline.into_std());
    let total = checks.len();
    // One check may report several lines (a finding with parts).
    let mut results: Vec<Option<Vec<CheckResult>>> = vec![None; total];
    let mut done = 0;
    let mut running = std::collections::BTreeSet::new();

    let limit = Arc::new(tokio::sync::Semaphore::new(options.max_concurrent.max(1)));
    // Why a check's kept pass was not taken, said with its result.
    let mut not_kept: Vec<Option<String>> = vec![None; total];
    let mut tasks = JoinSet::new();
    let run_start = Instant::now();
    for (index, check) in checks.iter().enumerate() {
        // What is known without running the check: it does not apply
        // here, its kept pass stands, or it is slow and must wait.
        let settled = settle(check, facts, options, &mut not_kept[index]);
        if let Some(result) = settled {
            done += 1;
            progress(Progress::Finished {
                done,
                total,
                result: &result,
                running: Vec::new(),
            });
            results[index] = Some(vec![result]);
            continue;
        }
        running.insert(index);
        let check = Arc::clone(check);
        let facts = Arc::clone(facts);
        let limit = Arc::clone(&limit);
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let start = Instant::now();
            // The probe runs as its own task so that a panic in it (a bug of
            // ours) becomes this check's error instead of a lost result.
            let probe = tokio::spawn(Arc::clone(&check.probe).evaluate(facts));
            let abort = probe.abort_handle();
            let finding = match tokio::time::timeout(check.timeout, probe).await {
                Ok(Ok(finding)) => finding,
                Ok(Err(e)) => Finding::error(format!("internal error: the probe crashed ({e})")),
                Err(_) => {
                    abort.abort();
                    Finding::fail(format!(
                        "timed out after {}",
                        format_duration(check.timeout)
                    ))
                    .measured(format!("> {}", format_duration(check.timeout)))
                }
            };
            (index, start, finding)
        });
    }

    // A signal ends the checklist at once; a check that ends with it (a
    // command the same Ctrl-C killed) is not evaluated rather than failed.
    let mut interrupted = None;
    loop {
        let next = tokio::select! {
            biased;
            i = preflight_ground::interrupt::wait() => {
                interrupted = Some(i);
                tasks.abort_all();
                break;
            }
            next = tokio::time::timeout_at(deadline, tasks.join_next()) => next,
        };
        match next {
            Ok(None) => break,
            Ok(Some(Ok((index, start, finding)))) => {
                let check = &checks[index];
                let mut lines = complete_all(check, finding, start.elapsed(), facts);
                if let (Some(store), [line]) = (options.kept, lines.as_mut_slice()) {
                    if let Err(e) = store.keep(check, line, SystemTime::now()) {
                        line.message.push_str(&format!(" ({e})"));
                    }
                    if let Some(why) = not_kept[index].take() {
                        line.message.push_str(&format!(" ({why})"));
                    }
                }
                done += 1;
                running.remove(&index);
                if let Some(first) = lines.first() {
                    progress(Progress::Finished {
                        done,
                        total,
                        result: first,
                        running: running.iter().map(|i| checks[*i].id.as_str()).collect(),
                    });
                }
                results[index] = Some(lines);
            }
            // Only cancellation ends a task without a result, and only the
            // deadline cancels; the check is reported as timed out below.
            Ok(Some(Err(_))) => {}
            Err(_) => {
                tasks.abort_all();
                break;
            }
        }
    }

    results
        .into_iter()
        .enumerate()
        .flat_map(|(index, result)| {
            result.unwrap_or_else(|| {
                let check = &checks[index];
                // Not evaluated: the check's own timeout had not passed, so
                // nothing says the node is at fault; the run is incomplete.
                let finding = Finding::error(match &interrupted {
                    Some(i) => format!(
                        "not evaluated: the run was interrupted by {} before this check finished",
                        i.signal
                    ),
                    None => format!(
                        "not evaluated: the checklist's deadline ({}) passed before this check finished",
                        format_duration(run_timeout)
                    ),
                });
                vec![complete(check, finding, run_start.elapsed(), facts)]
            })
        })
        .collect()
}
