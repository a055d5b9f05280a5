//! The collective view: per backend, available or why not, init time,
//! each operation verified or failed, the sweep table (nccl-tests'
//! columns), where the sweep ended and why, the verdict; the pairwise
//! round with the straggler it names; and each rank's links.

use std::fmt::Write;

use super::style::Style;
use preflight_result::collective::{CollectiveReport, RankLink};

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
        // One rank has no peer: its "bandwidth" is a memory copy.
        if r.world_size == 1 {
            let _ = writeln!(
                out,
                "  {:<7} 1 rank: nothing to measure between ranks; start 2 or more (WORLD_SIZE=2 per rank, or `preflight run --nnodes 1 --nproc-per-node 2`)",
                ""
            );
        } else if !b.sweep.is_empty() {
            out.push_str(&sweep_tables(&b.sweep));
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
    if !r.cpu_wait.is_empty() {
        let mut waits: Vec<String> = r
            .cpu_wait
            .iter()
            .map(|w| format!("{} {:.0}%", w.rank, w.share() * 100.0))
            .collect();
        waits.truncate(16);
        let _ = writeln!(
            out,
            "  waited for a CPU in the pairwise round (by rank): {}",
            waits.join("  ")
        );
    }
    for st in &r.stragglers {
        let _ = writeln!(out, "  straggler: {st}");
    }
    if let Some(u) = &r.unjudged {
        let _ = writeln!(out, "  {u}");
    }
    if let Some(sp) = &r.second_pass {
        out.push_str(&second_pass(sp));
    }
    if let Some(l) = describe_links(&r.links).filter(|_| r.world_size > 1) {
        let _ = writeln!(out, "  tcp links: {l}");
    }
    out
}

/// The progress line for a step just measured on rank 0: its own time,
/// the table's is the slowest rank's.
pub fn live_row(backend: &str, row: &preflight_result::collective::Row) -> String {
    format!(
        "\r\x1b[K[{backend}] {} {} B: {:.1} us, busbw {:.3} GB/s (rank 0's time)",
        row.op.name(),
        row.bytes,
        row.time_us,
        row.busbw
    )
}

/// As nccl-tests prints it: one table per operation (size, count, type,
/// time, algbw, busbw), each closed by its average bus bandwidth.
pub fn sweep_tables(rows: &[preflight_result::collective::Row]) -> String {
    let mut out = String::new();
    let ops = preflight_result::collective::ops_in_order(rows);
    for op in ops {
        let mine: Vec<_> = rows.iter().filter(|r| r.op == op).collect();
        let _ = writeln!(
            out,
            "  {:<10} {:>12} {:>10} {:>6} {:>12} {:>9} {:>9}",
            op.name(),
            "size(B)",
            "count",
            "type",
            "time(us)",
            "algbw",
            "busbw"
        );
        for row in &mine {
            let _ = writeln!(
                out,
                "  {:<10} {:>12} {:>10} {:>6} {:>12.1} {:>9.3} {:>9.3}",
                "",
                row.bytes,
                row.count,
                row.dtype.name(),
                row.time_us,
                row.algbw,
                row.busbw
            );
        }
        let avg = mine.iter().map(|r| r.busbw).sum::<f64>() / mine.len().max(1) as f64;
        let _ = writeln!(
            out,
            "  {:<10} avg busbw {avg:.3} GB/s over {}",
            "",
            preflight_ground::values::count(mine.len(), "size")
        );
    }
    let _ = writeln!(
        out,
        "  (GB/s; time: the slowest rank's mean; busbw as nccl-tests: allreduce ×2(n−1)/n, allgather ×(n−1)/n)"
    );
    out
}

/// One line: each rank's interface and speed, which pairs were on one host
/// (single-copy reads or a plain Unix socket; the others used TCP), and
/// why single-copy reads were refused where they were.
pub fn describe_links(links: &[RankLink]) -> Option<String> {
    if links.is_empty() {
        return None;
    }
    let ifaces: Vec<String> = links
        .iter()
        .map(|l| {
            let speed = l
                .speed_mbps
                .map_or("no link speed".to_string(), |m| format!("{m} Mb/s"));
            let name = l.interface.as_deref().unwrap_or("?");
            format!("rank {} {name} ({speed})", l.rank)
        })
        .collect();
    // Each same-host pair once, by whether it read large messages
    // straight out of the peer's memory.
    let mut direct = Vec::new();
    let mut unix = Vec::new();
    for l in links {
        for p in l.unix_peers.iter().filter(|p| **p > l.rank) {
            let pair = format!("{}↔{p}", l.rank);
            if l.direct_peers.contains(p) {
                direct.push(pair);
            } else {
                unix.push(pair);
            }
        }
    }
    let mut parts = Vec::new();
    if !direct.is_empty() {
        parts.push(format!(
            "same host, single-copy reads: {}",
            direct.join(" ")
        ));
    }
    if !unix.is_empty() {
        parts.push(format!("same host, Unix socket: {}", unix.join(" ")));
    }
    let n = links.len();
    if direct.is_empty() && unix.is_empty() {
        parts.push("every pair over TCP".to_string());
    } else if direct.len() + unix.len() < n * (n - 1) / 2 {
        parts.push("other pairs TCP".to_string());
    }
    if let Some((rank, why)) = links
        .iter()
        .find_map(|l| l.direct_refused.as_ref().map(|w| (l.rank, w)))
    {
        parts.push(format!("no single-copy reads on rank {rank}: {why}"));
    }
    let pairs = parts.join("; ");
    Some(format!("{}; {pairs}", ifaces.join(", ")))
}

/// The pairwise round's second pass: why it ran or not, then what it
/// found (the slow nodes are among the stragglers above).
fn second_pass(sp: &preflight_result::collective::SecondPass) -> String {
    let mut out = String::new();
    if !sp.ran {
        let _ = writeln!(out, "  second pass: {}", sp.reason);
        return out;
    }
    let _ = writeln!(
        out,
        "  second pass ({:.1} s): {}",
        sp.ms as f64 / 1000.0,
        sp.reason
    );
    if !sp.pairs.is_empty() {
        let rates: Vec<String> = sp
            .pairs
            .iter()
            .map(|p| format!("{}↔{} {:.2}", p.a, p.b, p.gbps))
            .collect();
        let _ = writeln!(
            out,
            "    measured again (GB/s each way): {}",
            rates.join("  ")
        );
    }
    for l in &sp.slow_links {
        let _ = writeln!(out, "    slow link: {l}");
    }
    for c in &sp.cleared {
        let _ = writeln!(out, "    cleared: {c}");
    }
    for u in &sp.unconfirmed {
        let _ = writeln!(out, "    not confirmed: {u}");
    }
    if let Some(s) = &sp.skipped {
        let _ = writeln!(out, "    left out: {s}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_name_interfaces_and_unix_pairs() {
        let l = |rank, unix_peers: Vec<u32>| RankLink {
            rank,
            interface: Some("lo".into()),
            speed_mbps: None,
            direct_peers: unix_peers.clone(),
            direct_refused: None,
            connections: 2,
            unix_peers,
        };
        let text = describe_links(&[l(0, vec![1]), l(1, vec![0]), l(2, vec![])]).unwrap();
        assert!(text.contains("rank 0 lo (no link speed)"), "{text}");
        assert!(
            text.contains("same host, single-copy reads: 0↔1;"),
            "{text}"
        );
        assert!(text.ends_with("other pairs TCP"), "{text}");
        let one_host = describe_links(&[l(0, vec![1]), l(1, vec![0])]).unwrap();
        assert!(one_host.ends_with("single-copy reads: 0↔1"), "{one_host}");
        assert_eq!(describe_links(&[]), None);
    }
}
