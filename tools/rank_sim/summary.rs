//! What the tool prints: each phase, the CPU of rank 0 and of the
//! simulator, the verdicts the ranks got, and whether they are rank 0's.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::{Args, Job, Outcome};

/// The real rank 0 the simulated ranks met: how it ended.
pub(super) struct Rank0<'a> {
    /// Its exit code; `None`: ended by a signal.
    pub code: Option<i32>,
    pub pid: u32,
    pub report: &'a serde_json::Value,
    /// Its peak resident memory.
    pub rss_mb: f64,
}

pub(super) fn summarize(
    args: &Args,
    job: &Job,
    outcomes: &[Outcome],
    rank0: Rank0<'_>,
    nodes: u32,
) -> i32 {
    let Rank0 {
        code: rank0_code,
        pid: rank0_pid,
        report: rank0_report,
        rss_mb,
    } = rank0;
    let connected: Vec<f64> = outcomes.iter().filter_map(|o| o.connected_ms).collect();
    let checked: Vec<f64> = outcomes.iter().filter_map(|o| o.checked_in_ms).collect();
    let verdicts: Vec<f64> = outcomes.iter().filter_map(|o| o.verdict_ms).collect();
    let first = connected.iter().copied().fold(f64::INFINITY, f64::min);
    let first = if first.is_finite() { first } else { 0.0 };
    let last_checkin = checked.iter().copied().fold(0.0, f64::max);
    let last_verdict = verdicts.iter().copied().fold(0.0, f64::max);
    println!(
        "rank 0: pid {rank0_pid}, exit {}, verdict {}",
        rank0_code.map_or("by a signal".into(), |c| c.to_string()),
        rank0_report["verdict"].as_str().unwrap_or("(no report)")
    );
    println!(
        "connect+handshake: {} of {} simulated ranks, first at {first:.0} ms, p50 {:.0} ms, last {:.0} ms",
        connected.len(),
        outcomes.len(),
        percentile(connected.clone(), 0.5),
        percentile(connected.clone(), 1.0)
    );
    println!(
        "check-in: {} sent, last at {last_checkin:.0} ms",
        checked.len()
    );
    let span = |v: Vec<f64>| {
        let first = v.iter().copied().fold(f64::INFINITY, f64::min);
        let last = v.iter().copied().fold(0.0, f64::max);
        (v.len(), if first.is_finite() { first } else { 0.0 }, last)
    };
    let (plans, first_plan, last_plan) = span(outcomes.iter().filter_map(|o| o.plan_ms).collect());
    let (_, _, last_probed) = span(outcomes.iter().filter_map(|o| o.probed_ms).collect());
    let (_, first_verdict, _) = span(verdicts.clone());
    println!(
        "probe plans: {plans} (per rank of a node) from {first_plan:.0} to {last_plan:.0} ms, last results sent at {last_probed:.0} ms"
    );
    println!(
        "verdict: {} received, first at {first_verdict:.0} ms, last at {last_verdict:.0} ms ({:.0} ms after the last check-in)",
        verdicts.len(),
        (last_verdict - last_checkin).max(0.0)
    );
    let phases = &rank0_report["cluster"]["phases"];
    if phases.is_object() {
        let p = |k: &str| phases[k].as_u64().unwrap_or(0);
        println!(
            "rank 0: check-ins until {} ms, probes {} ms, comparisons and report {} ms, verdicts sent {} ms",
            p("checkin_ms"),
            p("probes_ms"),
            p("assemble_ms"),
            p("verdicts_ms")
        );
    }
    let mut by_verdict: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes {
        let key = match (&o.verdict, &o.error) {
            (Some((v, code)), _) => format!("{v} (exit {code})"),
            (None, Some(e)) => format!("no verdict: {e}"),
            (None, None) => "no verdict".into(),
        };
        *by_verdict.entry(key).or_default() += 1;
    }
    for (k, n) in &by_verdict {
        println!("ranks: {n} × {k}");
    }
    if let Some(culprits) = rank0_report["cluster"]["culprits"].as_array() {
        for c in culprits.iter().take(8) {
            println!(
                "culprit: {} ranks {} · {}",
                c["node"].as_str().unwrap_or("?"),
                c["ranks"].as_array().map_or(0, Vec::len),
                c["reasons"][0].as_str().unwrap_or("")
            );
        }
    }
    let bytes = job.received.load(Ordering::Relaxed);
    println!(
        "ranks={} layout={} nodes={nodes} checkin_ms={:.0} verdict_ms={:.0} rank0_rss_mb={rss_mb:.1} rank0_bytes_sent={bytes}",
        args.world,
        args.layout.name(),
        last_checkin - first,
        (last_verdict - last_checkin).max(0.0),
    );
    // One verdict for the job: every rank that lived to hear it got rank
    // 0's, and rank 0 exited with its code.
    let rank0_verdict = rank0_report["verdict"].as_str().map(str::to_string);
    let agreed = outcomes.iter().all(|o| match &o.verdict {
        Some((v, code)) => Some(v) == rank0_verdict.as_ref() && Some(*code) == rank0_code,
        None => job.kill_node.is_some() && o.error.as_deref() == Some("killed after check-in"),
    });
    if agreed {
        println!("one verdict: every rank that lived exited as rank 0 did");
        0
    } else {
        println!("SPLIT: the ranks did not all get rank 0's verdict");
        1
    }
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}
