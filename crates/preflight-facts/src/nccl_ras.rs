//! NCCL's RAS port (NCCL 2.24 and later; `NCCL_RAS_ADDR`, else
//! localhost:28028): the client protocol of NCCL's src/ras/ (a line
//! `CLIENT PROTOCOL 2`, answered `SERVER PROTOCOL n`; `SET FORMAT json`
//! from 2.28.7, answered `OK` or `ERROR: ...`; then `STATUS`, answered with
//! the report, after which the server closes), and what its report says
//! of the job: communicators with missing or dead ranks, ranks whose
//! collective counts fall behind the others', asynchronous errors. Read in
//! the JSON form where the library has it, else the text form; both
//! bounded in size and time.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The most of a report read: a job of thousands of ranks is megabytes.
const MAX_REPORT: u64 = 16 << 20;

pub const DEFAULT_ADDR: &str = "localhost:28028";

/// One rank RAS names, with where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RasRank {
    pub rank: u32,
    pub host: String,
    pub pid: Option<u32>,
    /// Why it is named, in words.
    pub why: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RasStatus {
    /// `json` or `text`.
    pub format: String,
    pub nccl_version: Option<String>,
    pub communicators: u32,
    /// Ranks a communicator misses, dead ranks, ranks behind in a
    /// collective's count, ranks with an error.
    pub named: Vec<RasRank>,
    /// What was found, in words, one line each.
    pub findings: Vec<String>,
    /// The collective counts the report gives, by what they count (a
    /// rank's collective in a communicator; in the text form, a line's
    /// ranks): two reports compared say whether the job moved between.
    pub counts: BTreeMap<String, u64>,
}

impl RasStatus {
    /// How many collectives more `self` counts than `before`, over the
    /// counts both have; 0 where none grew.
    pub fn counted_since(&self, before: &RasStatus) -> u64 {
        self.counts
            .iter()
            .filter_map(|(k, n)| Some(n.saturating_sub(*before.counts.get(k)?)))
            .sum()
    }
}

/// Reads what is there by `deadline`: at most `max` bytes, up to and
/// with the first newline when `line`, else to the end of the stream.
fn read_until(
    s: &mut TcpStream,
    deadline: Instant,
    max: u64,
    line: bool,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("no whole answer in time".into());
        }
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        // A line is read a byte at a time: nothing past it is taken.
        let want = if line { 1 } else { chunk.len() };
        match s.read(&mut chunk[..want]) {
            Ok(0) => return Ok(out),
            Ok(n) => {
                out.extend_from_slice(&chunk[..n]);
                if out.len() as u64 > max {
                    return Err(format!("an answer over {max} bytes"));
                }
                if line && out.ends_with(b"\n") {
                    return Ok(out);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// `host:port`, or `[v6]:port`.
fn split_addr(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port.parse().ok()?))
}

/// Asks the RAS port at `addr` for the job's status, all within `timeout`.
pub fn status(addr: &str, timeout: Duration) -> Result<RasStatus, String> {
    let end = Instant::now() + timeout;
    let (host, port) =
        split_addr(addr).ok_or_else(|| format!("NCCL_RAS_ADDR {addr}: not HOST:PORT"))?;
    let target: SocketAddr = super::resolve::within(host, port, timeout)
        .map_err(|e| format!("NCCL_RAS_ADDR {addr}: {e}"))?;
    let left = end.saturating_duration_since(Instant::now());
    let mut s = TcpStream::connect_timeout(&target, left.max(Duration::from_millis(1)))
        .map_err(|e| format!("no NCCL RAS at {addr}: {e}"))?;
    let ras = |e: String| format!("NCCL RAS at {addr}: {e}");
    let say = |s: &mut TcpStream, l: &str| {
        let left = end.saturating_duration_since(Instant::now());
        s.set_write_timeout(Some(left.max(Duration::from_millis(1))))
            .and_then(|()| s.write_all(format!("{l}\n").as_bytes()))
            .map_err(|e| ras(e.to_string()))
    };
    say(&mut s, "CLIENT PROTOCOL 2")?;
    let hello = read_until(&mut s, end, 4096, true).map_err(ras)?;
    let hello = String::from_utf8_lossy(&hello).trim_end().to_string();
    if !hello.starts_with("SERVER PROTOCOL ") {
        return Err(format!(
            "{addr} is not NCCL's RAS port: it answered {hello:?}"
        ));
    }
    say(&mut s, "SET FORMAT json")?;
    let ok = read_until(&mut s, end, 4096, true).map_err(ras)?;
    let json = String::from_utf8_lossy(&ok)
        .trim()
        .eq_ignore_ascii_case("OK");
    say(&mut s, "STATUS")?;
    let report = read_until(&mut s, end, MAX_REPORT, false).map_err(ras)?;
    let text = String::from_utf8_lossy(&report);
    if json {
        parse_json(&text)
    } else {
        Ok(parse_text(&text))
    }
}

/// NCCL 2.28.7 and 2.28.9 leave out the comma after `"nvml_dev": N` of a
/// missing rank: put it back.
fn mend(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        out.push_str(l);
        let next_is_key = lines
            .peek()
            .is_some_and(|n| n.trim_start().starts_with('"'));
        if l.trim_start().starts_with("\"nvml_dev\"") && !l.trim_end().ends_with(',') && next_is_key
        {
            out.push(',');
        }
        out.push('\n');
    }
    out
}

const COLLECTIVES: [&str; 5] = [
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AllReduce",
];

pub fn parse_json(text: &str) -> Result<RasStatus, String> {
    let v: serde_json::Value =
        serde_json::from_str(&mend(text)).map_err(|e| format!("NCCL RAS's JSON: {e}"))?;
    let mut st = RasStatus {
        format: "json".into(),
        nccl_version: v["nccl_version"].as_str().map(String::from),
        ..RasStatus::default()
    };
    let comms = v["communicators"].as_array().cloned().unwrap_or_default();
    st.communicators = comms.len() as u32;
    let who = |r: &serde_json::Value| {
        (
            r["rank"].as_u64().unwrap_or(0) as u32,
            r["host"].as_str().unwrap_or("unknown").to_string(),
            r["pid"].as_i64().filter(|p| *p > 0).map(|p| p as u32),
        )
    };
    for c in &comms {
        let hash = c["hash"].as_str().unwrap_or("?");
        let missing = c["missing_ranks"].as_array().cloned().unwrap_or_default();
        for m in &missing {
            let (rank, host, pid) = who(m);
            let dead = m["status"]["considered_dead"].as_bool() == Some(true);
            let why = if dead {
                format!("RAS considers it dead (communicator {hash})")
            } else {
                format!("missing from communicator {hash}: it sent RAS no data")
            };
            st.named.push(RasRank {
                rank,
                host,
                pid,
                why,
            });
        }
        if !missing.is_empty() {
            st.findings.push(format!(
                "communicator {hash}: {} of {} ranks missing",
                missing.len(),
                c["size"].as_u64().unwrap_or(0)
            ));
        }
        let ranks = c["ranks"].as_array().cloned().unwrap_or_default();
        for r in &ranks {
            let (rank, host, pid) = who(r);
            for (field, what) in [
                ("async_error", "an asynchronous error"),
                ("init_state", "an initialization error"),
            ] {
                let code = r["status"][field].as_i64().unwrap_or(0);
                // 7: ncclInProgress, not an error.
                if code != 0 && code != 7 {
                    st.named.push(RasRank {
                        rank,
                        host: host.clone(),
                        pid,
                        why: format!(
                            "reported {what} ({}) in communicator {hash}",
                            result_name(code)
                        ),
                    });
                }
            }
        }
        for r in &ranks {
            for op in COLLECTIVES {
                if let Some(n) = r["collective_counts"][op].as_u64() {
                    let rank = r["rank"].as_u64().unwrap_or(0);
                    st.counts.insert(format!("{hash} rank {rank} {op}"), n);
                }
            }
        }
        for op in COLLECTIVES {
            let counts: Vec<u64> = ranks
                .iter()
                .map(|r| r["collective_counts"][op].as_u64().unwrap_or(0))
                .collect();
            let Some(&most) = counts.iter().max() else {
                continue;
            };
            if counts.iter().all(|c| *c == most) {
                continue;
            }
            let behind: Vec<&serde_json::Value> = ranks
                .iter()
                .zip(&counts)
                .filter(|(_, c)| **c < most)
                .map(|(r, _)| r)
                .collect();
            // Only a minority behind is evidence against it.
            if behind.len() * 2 < ranks.len() {
                for r in behind {
                    let (rank, host, pid) = who(r);
                    st.named.push(RasRank {
                        rank,
                        host,
                        pid,
                        why: format!(
                            "behind in {op}: launched up to {} where the others reached {most} (communicator {hash})",
                            r["collective_counts"][op].as_u64().unwrap_or(0)
                        ),
                    });
                }
            }
            st.findings.push(format!(
                "communicator {hash}: ranks have different {op} counts"
            ));
        }
    }
    Ok(st)
}

fn result_name(code: i64) -> &'static str {
    match code {
        1 => "unhandled CUDA error",
        2 => "system error",
        3 => "internal error",
        4 => "invalid argument",
        5 => "invalid usage",
        6 => "remote process error",
        _ => "unexpected error",
    }
}

/// `... managed by process PID on node HOST` at the end of a line.
fn where_from(l: &str) -> (Option<u32>, String) {
    match l.rsplit_once("managed by process ") {
        Some((_, tail)) => match tail.split_once(" on node ") {
            Some((pid, host)) => (pid.trim().parse().ok(), host.trim().to_string()),
            None => (None, "unknown".into()),
        },
        None => (None, "unknown".into()),
    }
}

/// The text form's Errors and Warnings (NCCL 2.24 and later).
pub fn parse_text(text: &str) -> RasStatus {
    let mut st = RasStatus {
        format: "text".into(),
        ..RasStatus::default()
    };
    st.nccl_version = text
        .lines()
        .find_map(|l| l.strip_prefix("NCCL version "))
        .and_then(|v| v.split_whitespace().next())
        .map(String::from);
    let mut section = "";
    let mut heading = String::new();
    for l in text.lines() {
        match l.trim() {
            "Errors" => section = "errors",
            "Warnings" => section = "warnings",
            _ => {}
        }
        if section.is_empty() {
            // The communicators table: one row per group, "  GROUP  N ...".
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 8 && f[0].parse::<u32>().is_ok() && f[1].parse::<u32>().is_ok() {
                st.communicators += f[1].parse::<u32>().unwrap_or(0);
            }
            continue;
        }
        if !l.starts_with(' ') && !l.trim().is_empty() && !l.starts_with('=') {
            heading = l.trim().to_string();
            if l.starts_with('#') || l == "DEAD" || l == "INCOMPLETE" {
                st.findings.push(heading.clone());
            }
            continue;
        }
        let t = l.trim();
        if let Some((who, n)) = t.split_once(" launched up to operation ") {
            let n = n.split_whitespace().next().and_then(|n| n.parse().ok());
            if let Some(n) = n {
                st.counts.insert(format!("{heading}: {who}"), n);
            }
        }
        let Some(rest) = t.strip_prefix("Rank ") else {
            if let Some(rest) = t.strip_prefix("Process ")
                && heading == "DEAD"
            {
                // A dead process has no rank here; its communicators'
                // INCOMPLETE sections name its ranks.
                let host = rest
                    .split_once(" on node ")
                    .map_or("unknown", |(_, h)| h.split(" managing").next().unwrap_or(h))
                    .trim();
                let pid = rest.split_whitespace().next().unwrap_or("?");
                st.findings
                    .push(format!("process {pid} on node {host} is considered dead"));
            }
            continue;
        };
        let rank: Option<u32> = rest
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|r| r.parse().ok());
        let Some(rank) = rank else { continue };
        let (pid, host) = where_from(t);
        let why = if heading.ends_with("INCOMPLETE") {
            format!(
                "missing from communicator {}",
                heading.split_whitespace().next().unwrap_or("?")
            )
        } else if t.contains("has launched up to operation") || t.contains("has not launched any") {
            let tail = t.split(" -- ").next().unwrap_or(t);
            format!(
                "behind the others: {}",
                tail.trim_start_matches(&format!("Rank {rank} "))
            )
        } else if t.contains(" reported ") {
            t.split(" -- ").next().unwrap_or(t).to_string()
        } else if heading.ends_with("ERROR") {
            format!(
                "an error in communicator {}",
                heading.split_whitespace().next().unwrap_or("?")
            )
        } else {
            continue;
        };
        st.named.push(RasRank {
            rank,
            host,
            pid,
            why,
        });
    }
    st
}
