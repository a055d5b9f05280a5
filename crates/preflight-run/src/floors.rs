//! `baseline capture --from REPORT...`: the measured floors of a profile,
//! from the reports of a healthy `preflight run` across nodes: per
//! backend and operation, the bus bandwidth at the largest size measured;
//! every pair between two nodes; every GPU's host-to-device and
//! device-to-host copy rate (`gpu_bandwidth`); each at a fraction of the
//! median (of the runs given, of the pairs, of the GPUs).

use std::collections::BTreeMap;
use std::path::PathBuf;

use preflight_ground::values::median;
use preflight_report::input::{files, read};
use preflight_result::Verdict;
use preflight_result::collective::CollectiveReport;
use preflight_result::gpu_copies::GpuCopy;

/// One run's collective section and each of its ranks' node.
struct Run {
    collective: CollectiveReport,
    hosts: Vec<String>,
}

/// A size as the profiles write it, exactly: `64MiB`, `8B`.
fn size(bytes: usize) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// A rate with three significant digits at least, so that a slow
/// figure is never written as 0 (which a profile refuses).
fn rate(gbps: f64) -> String {
    let digits = (2 - gbps.log10().floor() as i32).clamp(3, 12) as usize;
    format!("{gbps:.digits$}")
}

/// The runs of the reports: one per distinct collective section (every
/// rank of a run carries the same one), each rank's node from the
/// reports' own host names and the cluster view; and every GPU's copy
/// rates (`gpu_bandwidth`), once per node and check.
fn runs(inputs: &[PathBuf]) -> Result<(Vec<Run>, Vec<GpuCopy>), String> {
    let mut runs: Vec<(String, Run)> = Vec::new();
    let mut copies: BTreeMap<String, GpuCopy> = BTreeMap::new();
    let files = files(inputs)?;
    if files.is_empty() {
        return Err("--from: no report (*.json) found".to_string());
    }
    for f in &files {
        let r = read(f).map_err(|e| format!("{}: {e}", f.display()))?;
        if r.verdict != Verdict::Ready {
            return Err(format!(
                "{}: the run's verdict is {}, not ready: floors are taken from a healthy run",
                f.display(),
                r.verdict.name()
            ));
        }
        // A node's finding is shared with its ranks: each GPU once.
        for c in r.checks.iter().filter_map(|c| c.copies.as_ref()) {
            for g in &c.gpus {
                copies
                    .entry(format!("{} {}", r.node.hostname, g.bus_id))
                    .or_insert_with(|| g.clone());
            }
        }
        let Some(c) = r.collective.clone() else {
            continue;
        };
        // A report is a file anyone may have written: its world is held
        // to what a rendezvous admits before anything is sized by it.
        let admitted = |w: u32| (1..=preflight_cluster::identity::MAX_WORLD).contains(&w);
        if !admitted(c.world_size) {
            return Err(format!(
                "{}: a collective section of {} ranks (1 to {} are possible)",
                f.display(),
                c.world_size,
                preflight_cluster::identity::MAX_WORLD
            ));
        }
        let key = serde_json::to_string(&c).unwrap_or_default();
        let at = match runs.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let world = c.world_size as usize;
                runs.push((
                    key,
                    Run {
                        collective: c,
                        hosts: vec![String::new(); world],
                    },
                ));
                runs.len() - 1
            }
        };
        let hosts = &mut runs[at].1.hosts;
        if let Some(cluster) = r.cluster.as_ref().filter(|c| admitted(c.world_size)) {
            for (rank, h) in cluster.hosts_by_rank().into_iter().enumerate() {
                if let Some(slot) = hosts.get_mut(rank).filter(|s| s.is_empty()) {
                    *slot = h;
                }
            }
        }
        // The cluster view's name first (it tells apart nodes whose host
        // names clash); a report's own host name where it has none.
        if let Some(slot) = r
            .node
            .rank
            .and_then(|rank| hosts.get_mut(rank as usize))
            .filter(|s| s.is_empty())
        {
            *slot = r.node.hostname.clone();
        }
    }
    if runs.is_empty() && copies.is_empty() {
        return Err("--from: no report has a collective section (a `preflight run` with its collective stage) or a GPU copy check (`gpu_bandwidth`)".to_string());
    }
    // Pairs of 1 MiB (short) and of 4 MiB (full) are different figures:
    // one kind of run per profile.
    let modes: std::collections::BTreeSet<&str> = runs
        .iter()
        .map(|(_, r)| r.collective.mode.as_str())
        .collect();
    if modes.len() > 1 {
        return Err(format!(
            "--from: runs of different collective modes ({}): give the reports of one kind of run",
            modes.into_iter().collect::<Vec<_>>().join(" and ")
        ));
    }
    Ok((
        runs.into_iter().map(|(_, r)| r).collect(),
        copies.into_values().collect(),
    ))
}

/// The `floors:` lines of a profile's `expect`, at `fraction` of the
/// median, with a comment saying from what.
pub fn floors(inputs: &[PathBuf], fraction: f64) -> Result<String, String> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(format!(
            "--fraction {fraction}: a fraction of the median, above 0 and at most 1"
        ));
    }
    let (runs, copies) = runs(inputs)?;
    // Per backend and operation, the largest size any run measured, and
    // each run's figure there.
    let mut busbw: BTreeMap<(String, String), (usize, Vec<f64>)> = BTreeMap::new();
    for run in &runs {
        for b in run
            .collective
            .backends
            .iter()
            .filter(|b| b.available && b.verdict == "pass")
        {
            for row in &b.sweep {
                let e = busbw
                    .entry((b.name.clone(), row.op.name().to_string()))
                    .or_insert((0, Vec::new()));
                if row.bytes > e.0 {
                    *e = (row.bytes, Vec::new());
                }
                if row.bytes == e.0 && row.busbw > 0.0 {
                    e.1.push(row.busbw);
                }
            }
        }
    }
    // Node pairs (each one's best rate, as `collective.floors` holds them).
    let pairs: Vec<f64> = runs
        .iter()
        .flat_map(|run| {
            preflight_collective::isolate::node_pairs(
                &run.collective.pairs,
                &run.hosts,
                run.collective.world_size,
            )
        })
        .map(|p| p.gbps)
        .collect();
    let mut worlds: Vec<u32> = runs.iter().map(|r| r.collective.world_size).collect();
    worlds.sort_unstable();
    worlds.dedup();
    let worlds: Vec<String> = worlds.iter().map(u32::to_string).collect();
    let mut text = match runs.first() {
        Some(first) => format!(
            "  # Floors at {:.0}% of the median of {} ({} mode, {} ranks; baseline capture --from).\n  floors:\n",
            fraction * 100.0,
            preflight_ground::values::count(runs.len(), "run"),
            first.collective.mode,
            worlds.join(", ")
        ),
        None => format!(
            "  # Floors at {:.0}% of the median (baseline capture --from).\n  floors:\n",
            fraction * 100.0
        ),
    };
    let rows: Vec<String> = busbw
        .iter()
        .filter_map(|((backend, op), (bytes, figures))| {
            let m = median(figures.clone())?;
            Some(format!(
                "      - {{backend: {backend}, op: {op}, size: {}, gbps: {}}}\n",
                size(*bytes),
                rate(m * fraction)
            ))
        })
        .collect();
    if !rows.is_empty() {
        text.push_str("    busbw:\n");
        text.extend(rows);
    }
    let pair = median(pairs.clone());
    if let Some(m) = pair {
        text.push_str(&format!(
            "    # {} node pairs, median {m:.3} GB/s\n    pair_gbps: {}\n",
            pairs.len(),
            rate(m * fraction)
        ));
    }
    // Every GPU's copy rates, each direction's median.
    let h2d = median(copies.iter().map(|g| g.h2d_gbps).collect());
    let d2h = median(copies.iter().map(|g| g.d2h_gbps).collect());
    if let (Some(h), Some(d)) = (h2d, d2h) {
        text.push_str(&format!(
            "    # {} GPUs' copies, median {h:.1} GB/s host-to-device, {d:.1} device-to-host\n    h2d_gbps: {}\n    d2h_gbps: {}\n",
            copies.len(),
            rate(h * fraction),
            rate(d * fraction)
        ));
    }
    if busbw.values().all(|(_, f)| f.is_empty()) && pair.is_none() && h2d.is_none() {
        return Err("--from: the reports measured no bus bandwidth, no pair between two nodes and no GPU copy".to_string());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_written_exactly() {
        assert_eq!(size(1 << 20), "1MiB");
        assert_eq!(size(64 << 20), "64MiB");
        assert_eq!(size(8), "8B");
        assert_eq!(size(1536), "1536B");
        assert_eq!(size(3 << 30), "3GiB");
    }

    #[test]
    fn a_slow_rate_is_never_written_as_zero() {
        assert_eq!(rate(12.3456), "12.346");
        assert_eq!(rate(0.8), "0.800");
        assert_eq!(rate(0.0004567), "0.000457");
    }
}
