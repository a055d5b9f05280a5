//! The `collective` section: per backend, available or why not, init
//! time, each operation verified or failed, the sweep table (nccl-tests'
//! columns), where the sweep ended and why, the verdict; and the pairwise
//! round with the straggler it names.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::straggler::PairRate;
use super::sweep::{Row, human_bytes};
use crate::report::style::Style;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CollectiveReport {
    /// `short` (run's default) or `full` (`--collective full`, `bench`).
    pub mode: String,
    pub world_size: u32,
    pub backends: Vec<BackendReport>,
    pub pairs: Vec<PairRate>,
    /// Ranks slow in every pair they are in, with their hosts.
    pub stragglers: Vec<String>,
    /// Ranks whose result never reached rank 0.
    pub missing: Vec<u32>,
    /// Each rank's TCP-backend interface, link speed and Unix-socket peers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<super::tcp::RankLink>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackendReport {
    pub name: String,
    pub available: bool,
    pub reason: String,
    /// The library loaded ("NCCL 2.21.5 at /usr/lib/…"), for library
    /// backends.
    #[serde(default)]
    pub library: Option<String>,
    /// Library settings preflight added where the job left them unset.
    #[serde(default)]
    pub env_set: Vec<String>,
    /// The slowest rank's init, ms.
    pub init_ms: Option<u64>,
    pub ops: Vec<OpStatus>,
    /// Verified steps only: a wrong result never gets a bandwidth.
    pub sweep: Vec<Row>,
    /// What ranks said about the backend (the transport chosen, a
    /// fallback), "warning: " first when it is one.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The library's own output from the rank that failed (or the first
    /// rank with any), for the operator to read.
    #[serde(default)]
    pub log: Vec<String>,
    /// Why the sweep ended early, in words.
    pub ended: Option<String>,
    /// pass, fail or skip.
    pub verdict: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpStatus {
    pub op: String,
    /// verified, failed or not_run.
    pub status: String,
    pub detail: Option<String>,
}

/// Lines of a failed library backend's log in the human view (JSON has
/// all that were kept).
const LOG_SHOWN: usize = 12;

pub fn render(r: &CollectiveReport, s: &Style) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{}  {} · {} rank{}",
        s.bold("Collective"),
        r.mode,
        r.world_size,
        if r.world_size == 1 { "" } else { "s" }
    );
    for b in &r.backends {
        if !b.available {
            let _ = writeln!(out, "  {:<7} skip: {}", b.name, b.reason);
            if let Some(lib) = &b.library {
                let _ = writeln!(out, "  {:<7} library: {lib}", "");
            }
            continue;
        }
        let ops: Vec<String> = b
            .ops
            .iter()
            .map(|o| format!("{} {}", o.op, o.status))
            .collect();
        let _ = writeln!(
            out,
            "  {:<7} {} · init {} ms · {}",
            b.name,
            b.verdict,
            b.init_ms.map_or("-".into(), |m| m.to_string()),
            ops.join(", ")
        );
        if let Some(lib) = &b.library {
            let _ = writeln!(out, "  {:<7} library: {lib}", "");
        }
        if !b.env_set.is_empty() {
            let _ = writeln!(out, "  {:<7} set where unset: {}", "", b.env_set.join(" "));
        }
        for n in &b.notes {
            let _ = writeln!(out, "  {:<7} {n}", "");
        }
        for o in b
            .ops
            .iter()
            .filter(|o| o.status == "failed" || o.status == "not_finished")
        {
            if let Some(d) = &o.detail {
                let _ = writeln!(out, "          {}: {d}", o.op);
            }
        }
        if !b.sweep.is_empty() {
            let _ = writeln!(
                out,
                "  {:>10} {:>12} {:>10} {:>6} {:>12} {:>9} {:>9}",
                "op", "size", "count", "type", "time(us)", "algbw", "busbw"
            );
            for row in &b.sweep {
                let _ = writeln!(
                    out,
                    "  {:>10} {:>12} {:>10} {:>6} {:>12.1} {:>9.3} {:>9.3}",
                    row.op.name(),
                    row.bytes,
                    row.count,
                    row.dtype.name(),
                    row.time_us,
                    row.algbw,
                    row.busbw
                );
            }
            let _ = writeln!(
                out,
                "  (GB/s; busbw as nccl-tests: allreduce ×2(n−1)/n, allgather ×(n−1)/n)"
            );
        }
        if let Some(e) = &b.ended {
            let _ = writeln!(out, "  {:<7} {e}", "");
            // The library's own words, last lines first to go.
            let skip = b.log.len().saturating_sub(LOG_SHOWN);
            if !b.log.is_empty() {
                let _ = writeln!(
                    out,
                    "  {:<7} its log ({} lines, last {}):",
                    "",
                    b.log.len(),
                    b.log.len() - skip
                );
            }
            for line in &b.log[skip..] {
                let _ = writeln!(out, "  {:<7}   {line}", "");
            }
        }
    }
    if !r.pairs.is_empty() {
        let mut rates: Vec<String> = r
            .pairs
            .iter()
            .map(|p| format!("{}↔{} {:.2}", p.a, p.b, p.gbps))
            .collect();
        rates.truncate(16);
        let _ = writeln!(out, "  pairs (GB/s each way): {}", rates.join("  "));
    }
    for st in &r.stragglers {
        let _ = writeln!(out, "  straggler: {st}");
    }
    if let Some(l) = super::tcp::describe_links(&r.links) {
        let _ = writeln!(out, "  tcp links: {l}");
    }
    out
}

/// `ended` for a step that timed out, e.g. "timed out at 64 KiB: rank 3
/// stopped sending to rank 0".
/// `culprit` is "rank 3" or "rank 3 (host)".
pub fn timed_out(op: &str, bytes: usize, culprit: &str, victim: u32, sending: bool) -> String {
    if sending {
        format!(
            "{op} timed out at {}: {culprit} stopped sending to rank {victim}",
            human_bytes(bytes)
        )
    } else {
        format!(
            "{op} timed out at {}: {culprit} stopped receiving from rank {victim}",
            human_bytes(bytes)
        )
    }
}
