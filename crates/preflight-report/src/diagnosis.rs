//! `preflight diagnose` for people: per job, each rank's line, then the
//! ranks that hold the job up (or why nothing was named), and the verdict.

use std::fmt::Write;

use super::prometheus::{escape, family};
use preflight_result::diagnosis::{ClusterDiagnosis, Culprit, Diagnosis};

const VERDICTS: [&str; 4] = ["held", "progressing", "unknown", "no_job"];

/// `--format prometheus`, for node_exporter's textfile collector (a
/// watchdog's diagnose every minute): the verdict, one series per state
/// with the number of ranks in it per job, and each culprit, 1.
pub fn prometheus(d: &Diagnosis) -> String {
    let mut s = String::new();
    let node = escape(&d.node);
    family(
        &mut s,
        "preflight_diagnose_verdict",
        "diagnose's verdict on this node: one series per verdict, 1 for the one it had.",
    );
    for v in VERDICTS {
        let _ = writeln!(
            s,
            "preflight_diagnose_verdict{{node=\"{node}\",verdict=\"{v}\"}} {}",
            u8::from(d.verdict == v)
        );
    }
    family(
        &mut s,
        "preflight_diagnose_ranks",
        "Ranks of each job on this node by what they were doing.",
    );
    for j in &d.jobs {
        let mut by: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
        for r in &j.ranks {
            *by.entry(r.state.as_str()).or_default() += 1;
        }
        for (state, n) in by {
            let _ = writeln!(
                s,
                "preflight_diagnose_ranks{{node=\"{node}\",job=\"{}\",state=\"{state}\"}} {n}",
                escape(&j.job)
            );
        }
    }
    family(
        &mut s,
        "preflight_diagnose_culprit",
        "A rank named as holding its job up (1), with its node and pid.",
    );
    let ras = d
        .nccl_ras
        .iter()
        .flat_map(|r| r.culprits.iter().map(|c| ("nccl ras", c)));
    let named = d
        .jobs
        .iter()
        .flat_map(|j| j.culprits.iter().map(move |c| (j.job.as_str(), c)))
        .chain(ras);
    let mut seen = std::collections::BTreeSet::new();
    for (job, c) in named {
        let pid = c.pid.map(|p| p.to_string()).unwrap_or_default();
        if seen.insert((job.to_string(), c.rank, pid.clone())) {
            let _ = writeln!(
                s,
                "preflight_diagnose_culprit{{job=\"{}\",rank=\"{}\",node=\"{}\",pid=\"{pid}\",evidence=\"{}\"}} 1",
                escape(job),
                c.rank,
                escape(&c.node),
                escape(&c.evidence)
            );
        }
    }
    s
}

/// Frames of a culprit's stack shown: where it is, not all its callers.
const FRAMES_SHOWN: usize = 12;

/// One culprit's lines, wherever it was named: who and why, what to do
/// next, and its stack where py-spy read one.
fn held_up_by(c: &Culprit) -> String {
    let pid = c.pid.map(|p| format!(", pid {p}")).unwrap_or_default();
    let mut out = format!(
        "  HELD UP BY rank {} ({}{pid}): {}",
        c.rank, c.node, c.reason
    );
    if !c.next_step.is_empty() {
        let _ = write!(out, "\n    next: {}", c.next_step);
    }
    if !c.stack.is_empty() {
        out.push_str("\n    its stack, innermost first:");
        for f in c.stack.iter().take(FRAMES_SHOWN) {
            let _ = write!(out, "\n      {f}");
        }
        if c.stack.len() > FRAMES_SHOWN {
            let _ = write!(out, "\n      ({} more)", c.stack.len() - FRAMES_SHOWN);
        }
    }
    out
}

pub fn human(d: &Diagnosis) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "preflight diagnose · node {} · {} (watched {} ms)",
        d.node,
        preflight_ground::values::count(d.jobs.len(), "job"),
        d.watch_ms
    );
    for j in &d.jobs {
        let torch = j
            .torch
            .as_deref()
            .map(|t| format!(" · torch {t}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "\n{} · {} · store {}{torch}",
            j.job,
            preflight_ground::values::count(j.world_size as usize, "rank"),
            j.store.as_deref().unwrap_or("unknown")
        );
        if let Some(sr) = &j.store_read {
            match &sr.error {
                Some(e) => {
                    let _ = writeln!(out, "  store not read: {e}");
                }
                None => {
                    let keys = sr.keys.map(|k| format!(", {k} keys")).unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "  store ({}{keys}, read only): {} of {} ranks reached init_process_group",
                        sr.server,
                        sr.arrived.len(),
                        j.world_size
                    );
                }
            }
        }
        for r in &j.ranks {
            let store = match r.store_connected {
                Some(true) => "store ✓",
                Some(false) => "store ✗",
                None => "store ?",
            };
            let _ = writeln!(
                out,
                "  rank {:<4} pid {:<7} {:<9} {} · {store} · {} peer conns · {} unread",
                r.rank,
                r.pid,
                r.state,
                r.doing,
                r.peer_connections,
                preflight_ground::values::format_bytes(r.unread_bytes)
            );
        }
        for m in &j.missing {
            let _ = writeln!(out, "  rank {m:<4} absent from this node");
        }
        if j.elsewhere > 0 {
            let _ = writeln!(
                out,
                "  ({} run elsewhere: not examined here)",
                preflight_ground::values::count(j.elsewhere as usize, "rank")
            );
        }
        for f in &j.flight {
            if let Some(e) = &f.error {
                let _ = writeln!(
                    out,
                    "  rank {} Flight Recorder not read ({}): {e}",
                    f.rank, f.source
                );
            }
        }
        for m in &j.moved {
            let _ = writeln!(out, "  MOVED: {m}");
        }
        for c in &j.culprits {
            let _ = writeln!(out, "{}", held_up_by(c));
        }
        for p in &j.paths {
            let _ = writeln!(out, "  PATH: {p}");
        }
        if j.culprits.is_empty() && j.moved.is_empty() {
            let _ = writeln!(out, "  {}", j.summary);
        }
    }
    if let Some(r) = &d.nccl_ras {
        let _ = writeln!(out, "\nNCCL RAS at {}", r.address);
        match &r.error {
            Some(e) => {
                let _ = writeln!(out, "  not read: {e}");
            }
            None => {
                let _ = writeln!(
                    out,
                    "  NCCL {} · {} ({} form)",
                    r.nccl_version.as_deref().unwrap_or("?"),
                    preflight_ground::values::count(r.communicators as usize, "communicator"),
                    r.format
                );
                for f in &r.findings {
                    let _ = writeln!(out, "  {f}");
                }
                for c in &r.culprits {
                    let _ = writeln!(out, "{}", held_up_by(c));
                }
            }
        }
    }
    let line = match d.verdict.as_str() {
        "held" => "HELD  a rank or a path holds its job up: named above",
        "progressing" => "PROGRESSING  nothing holds a job up",
        "no_job" => {
            "NO JOB  no distributed job on this node that this user can see (RANK/WORLD_SIZE or a launcher's equivalents in a process's environment)"
        }
        _ => "UNKNOWN  the evidence here names no rank",
    };
    let _ = writeln!(out, "\n{line}");
    out
}

/// `--hosts`: each node's diagnosis, then the job's verdict across them.
pub fn human_across(c: &ClusterDiagnosis) -> String {
    let mut out = String::new();
    for d in &c.nodes {
        out.push_str(&human(d));
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "across {} ({} answered)",
        preflight_ground::values::count(c.nodes.len() + c.unreachable.len(), "node"),
        c.nodes.len()
    );
    for u in &c.unreachable {
        let _ = writeln!(out, "  UNREACHABLE {}: {}", u.host, u.why);
    }
    for e in &c.elsewhere {
        let _ = writeln!(out, "  ELSEWHERE {e}");
    }
    for x in &c.culprits {
        let _ = writeln!(out, "{}", held_up_by(x));
    }
    for p in &c.paths {
        let _ = writeln!(out, "  PATH: {p}");
    }
    if !c.summary.is_empty() {
        let _ = writeln!(out, "  {}", c.summary);
    }
    let line = match c.verdict.as_str() {
        "held" => "HELD  a rank or a path holds the job up: named above",
        "progressing" => "PROGRESSING  nothing holds the job up on any node",
        "no_job" => "NO JOB  no node runs a distributed job this user can see",
        _ => "UNKNOWN  the evidence names no rank: the nodes not asked may hold the answer",
    };
    let _ = writeln!(out, "\n{line}");
    out
}
