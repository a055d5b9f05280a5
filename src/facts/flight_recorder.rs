//! torch's Flight Recorder (torch 2.2 and later; `TORCH_FR_BUFFER_SIZE`,
//! formerly `TORCH_NCCL_TRACE_BUFFER_SIZE`): the last collectives of each
//! process group of one rank, with their sequence numbers, operations,
//! sizes and states, and each group's last enqueued and completed
//! collective. Read two ways, neither of which the job can be harmed by:
//! - from the worker server a job sets up
//!   (`torch.distributed.elastic.control_plane.worker_main()` with
//!   `TORCH_WORKER_SERVER_SOCKET`): HTTP over that Unix socket, `POST
//!   /handler/fr_trace_json`, which copies the recorder and changes
//!   nothing (torch 2.15 records Gloo groups as well as NCCL's);
//! - from the dump a rank writes when a collective times out
//!   (`TORCH_FR_DUMP_TEMP_FILE`, formerly `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`,
//!   then the rank: `/tmp/nccl_trace_rank_3` by default), a pickle
//!   (protocol 2) of the same dictionary.
//!
//! Both are bounded in size and time, and a dump is taken only where the
//! job's own user wrote it after the job began.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The most of a recorder read: 2,000 entries with their frames are a few
/// megabytes.
const MAX_TRACE: u64 = 32 << 20;

/// Where torch writes a rank's dump when no variable says.
pub const DEFAULT_DUMP_PREFIX: &str = "/tmp/nccl_trace_rank_";

/// One collective as the recorder keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The process group's id (`0` for the default group).
    pub group: String,
    /// Its collective sequence number in that group (from 1).
    pub seq: i64,
    /// `all_reduce`, without the backend's `gloo:` or `nccl:`.
    pub op: String,
    pub input_sizes: Vec<Vec<i64>>,
    pub input_dtypes: Vec<String>,
    /// `scheduled`, `started` or `completed`.
    pub state: String,
    /// Whether the rank is done with it (its work was retired).
    pub retired: bool,
    pub p2p: bool,
}

impl Record {
    /// `all_reduce of [1024] Float`; the operation alone where the sizes
    /// are not known (a desync key).
    pub fn describe(&self) -> String {
        if self.input_sizes.is_empty() && self.input_dtypes.is_empty() {
            return self.op.clone();
        }
        let sizes: Vec<String> = self
            .input_sizes
            .iter()
            .map(|s| {
                format!(
                    "[{}]",
                    s.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
                )
            })
            .collect();
        format!(
            "{} of {} {}",
            self.op,
            sizes.join(" "),
            self.input_dtypes.join(" ")
        )
    }
}

/// One process group's progress, as the recorder counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStatus {
    pub last_enqueued: i64,
    pub last_completed: i64,
}

/// One rank's recorder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// The dump's format version (`2.10`).
    pub version: String,
    pub groups: BTreeMap<String, GroupStatus>,
    /// Oldest first.
    pub records: Vec<Record>,
}

impl Trace {
    /// Collectives enqueued and completed over every group: what grows
    /// while the job moves.
    pub fn progress(&self) -> (i64, i64) {
        self.groups.values().fold((0, 0), |(e, c), g| {
            (e + g.last_enqueued.max(0), c + g.last_completed.max(0))
        })
    }

    /// The collective a group's rank has called and not finished: the
    /// oldest record not retired past the group's last completed one.
    pub fn pending(&self, group: &str) -> Option<&Record> {
        let done = self.groups.get(group).map_or(-1, |g| g.last_completed);
        self.records
            .iter()
            .filter(|r| r.group == group && !r.p2p && !r.retired && r.seq > done)
            .min_by_key(|r| r.seq)
    }
}

/// A number the recorder writes as an int (pickle) or a string (JSON).
fn number(v: &serde_json::Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_str()?.trim().parse().ok())
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The recorder's dictionary, whichever form it came in.
fn from_value(v: &serde_json::Value) -> Result<Trace, String> {
    let entries = v
        .get("entries")
        .and_then(|e| e.as_array())
        .ok_or("no `entries` list: not a Flight Recorder dump")?;
    let mut t = Trace {
        version: v["version"].as_str().unwrap_or("").to_string(),
        ..Trace::default()
    };
    if let Some(groups) = v["pg_status"].as_object() {
        for (id, g) in groups {
            t.groups.insert(
                id.clone(),
                GroupStatus {
                    last_enqueued: number(&g["last_enqueued_collective"]).unwrap_or(-1),
                    last_completed: number(&g["last_completed_collective"]).unwrap_or(-1),
                },
            );
        }
    }
    for e in entries {
        let name = e["profiling_name"].as_str().unwrap_or("");
        t.records.push(Record {
            group: e["pg_id"]
                .as_i64()
                .map(|g| g.to_string())
                .or_else(|| e["pg_id"].as_str().map(String::from))
                .unwrap_or_default(),
            seq: number(&e["collective_seq_id"]).unwrap_or(-1),
            op: name.split_once(':').map_or(name, |(_, op)| op).to_string(),
            input_sizes: e["input_sizes"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| {
                            s.as_array()
                                .map(|d| d.iter().filter_map(|n| n.as_i64()).collect())
                                .unwrap_or_default()
                        })
                        .collect()
                })
                .unwrap_or_default(),
            input_dtypes: strings(&e["input_dtypes"]),
            state: e["state"].as_str().unwrap_or("").to_string(),
            retired: e["retired"].as_bool().unwrap_or(false),
            p2p: e["is_p2p"].as_bool().unwrap_or(false),
        });
    }
    Ok(t)
}

/// The JSON form (the worker server's `fr_trace_json`).
pub fn parse_json(bytes: &[u8]) -> Result<Trace, String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not the recorder's JSON: {e}"))?;
    from_value(&v)
}

/// How deep a dump's values may nest, and how many values it may hold
/// once its memo references are followed: torch's are 6 deep, and 2,000
/// entries with their frames are some hundred thousand values.
const MAX_DEPTH: u32 = 32;
const MAX_VALUES: u64 = 4 << 20;
/// How many values its stack and memo may hold while it is read.
const MAX_STACK: usize = 1 << 20;

/// A pickle's shape, before it is read: only the opcodes of the
/// protocol-2-to-4 data pickles torch writes (containers, strings,
/// numbers, the memo; nothing that names a class or calls one), nesting
/// no deeper than `MAX_DEPTH`, no container within itself, and no more
/// than `MAX_VALUES` values once memo references are counted out (one
/// list put twice into another, a few dozen times over, would otherwise
/// be billions of values to build).
fn check_pickle(b: &[u8]) -> Result<(), String> {
    // The containers, each with its items (`None` a leaf, else a
    // container's index); the stack and memo hold the same.
    #[derive(Clone, Copy)]
    enum Item {
        Mark,
        Value(Option<u32>),
    }
    let mut nodes: Vec<Vec<Option<u32>>> = Vec::new();
    let mut edges = 0usize;
    let mut stack: Vec<Item> = Vec::new();
    let mut memo: BTreeMap<u32, Option<u32>> = BTreeMap::new();
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
        let s = b.get(*at..*at + n).ok_or("it ends inside an opcode")?;
        *at += n;
        Ok(s)
    };
    let len = |s: &[u8]| s.iter().rev().fold(0usize, |n, b| (n << 8) | *b as usize);
    let value = |stack: &mut Vec<Item>| match stack.pop() {
        Some(Item::Value(v)) => Ok(v),
        _ => Err("too few values".to_string()),
    };
    loop {
        if stack.len() > MAX_STACK || memo.len() > MAX_STACK || edges > MAX_STACK {
            return Err(format!("over {MAX_STACK} values held at once"));
        }
        let op = take(&mut at, 1)?[0];
        match op {
            // PROTO, FRAME: their argument only.
            0x80 => {
                take(&mut at, 1)?;
            }
            0x95 => {
                take(&mut at, 8)?;
            }
            b'}' | b']' | b')' => {
                nodes.push(Vec::new());
                stack.push(Item::Value(Some(nodes.len() as u32 - 1)));
            }
            b'(' => stack.push(Item::Mark),
            b'X' | b'B' | b'T' | 0x8c | b'C' | b'U' | 0x8a => {
                let width = if matches!(op, b'X' | b'B' | b'T') {
                    4
                } else {
                    1
                };
                let n = len(take(&mut at, width)?);
                take(&mut at, n)?;
                stack.push(Item::Value(None));
            }
            b'J' | b'K' | b'M' | b'G' => {
                let n = match op {
                    b'J' => 4,
                    b'K' => 1,
                    b'M' => 2,
                    _ => 8,
                };
                take(&mut at, n)?;
                stack.push(Item::Value(None));
            }
            b'N' | 0x88 | 0x89 => stack.push(Item::Value(None)),
            // POP
            b'0' => {
                stack.pop().ok_or("a POP of nothing")?;
            }
            b'q' | b'r' | 0x94 => {
                let key = match op {
                    b'q' => len(take(&mut at, 1)?) as u32,
                    b'r' => len(take(&mut at, 4)?) as u32,
                    _ => memo.len() as u32,
                };
                let Some(Item::Value(top)) = stack.last().copied() else {
                    return Err("a memo put with nothing to put".into());
                };
                memo.insert(key, top);
            }
            b'h' | b'j' => {
                let width = if op == b'h' { 1 } else { 4 };
                let key = len(take(&mut at, width)?) as u32;
                let v = *memo.get(&key).ok_or("a memo get of nothing put")?;
                stack.push(Item::Value(v));
            }
            b'a' | b's' | b'e' | b'u' | b't' | 0x85..=0x87 => {
                let mut items = Vec::new();
                match op {
                    b'a' => items.push(value(&mut stack)?),
                    b's' => items.extend([value(&mut stack)?, value(&mut stack)?]),
                    0x85..=0x87 => {
                        for _ in 0..(op - 0x84) {
                            items.push(value(&mut stack)?);
                        }
                    }
                    _ => loop {
                        match stack.pop() {
                            Some(Item::Value(v)) => items.push(v),
                            Some(Item::Mark) => break,
                            None => return Err("no MARK to end at".into()),
                        }
                    },
                }
                edges += items.len();
                let into = if matches!(op, b't' | 0x85..=0x87) {
                    nodes.push(Vec::new());
                    nodes.len() as u32 - 1
                } else {
                    value(&mut stack)?.ok_or("items put into what is no container")?
                };
                nodes[into as usize].extend(items);
                stack.push(Item::Value(Some(into)));
            }
            b'.' => break,
            other => {
                return Err(format!(
                    "opcode 0x{other:02x} at byte {}, which torch's dumps do not use",
                    at - 1
                ));
            }
        }
    }
    // Each container's values and depth, its items first (no recursion:
    // an explicit stack), a container met again on its own path a cycle.
    let mut done: Vec<Option<(u64, u32)>> = vec![None; nodes.len()];
    let mut on_path = vec![false; nodes.len()];
    for root in 0..nodes.len() {
        let mut path: Vec<(usize, usize)> = vec![(root, 0)];
        while let Some(&mut (n, ref mut next)) = path.last_mut() {
            if done[n].is_some() {
                path.pop();
                continue;
            }
            on_path[n] = true;
            if let Some(child) = nodes[n].get(*next).copied() {
                *next += 1;
                if let Some(c) = child.map(|c| c as usize)
                    && done[c].is_none()
                {
                    if on_path[c] {
                        return Err("a container within itself".into());
                    }
                    path.push((c, 0));
                }
                continue;
            }
            let (values, depth) = nodes[n].iter().fold((1u64, 1u32), |(v, d), c| match c {
                None => (v.saturating_add(1), d),
                Some(c) => {
                    let (cv, cd) = done[*c as usize].unwrap_or((1, 1));
                    (v.saturating_add(cv), d.max(cd + 1))
                }
            });
            if depth > MAX_DEPTH {
                return Err(format!("values nested over {MAX_DEPTH} deep"));
            }
            if values > MAX_VALUES {
                return Err(format!("over {MAX_VALUES} values"));
            }
            done[n] = Some((values, depth));
            on_path[n] = false;
            path.pop();
        }
    }
    Ok(())
}

/// The pickled form (a dump file).
pub fn parse_pickle(bytes: &[u8]) -> Result<Trace, String> {
    check_pickle(bytes).map_err(|e| format!("not the recorder's pickle: {e}"))?;
    let v: serde_json::Value = serde_pickle::from_slice(bytes, serde_pickle::DeOptions::new())
        .map_err(|e| format!("not the recorder's pickle: {e}"))?;
    from_value(&v)
}

/// Asks the worker server at `socket` for the recorder, by `deadline`.
pub fn ask_worker_server(socket: &Path, deadline: Instant) -> Result<Trace, String> {
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    s.set_write_timeout(Some(left()))
        .map_err(|e| e.to_string())?;
    s.write_all(
        b"POST /handler/fr_trace_json HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    let mut body_at: Option<(usize, Option<usize>)> = None;
    loop {
        if Instant::now() >= deadline {
            return Err("no whole answer in time".into());
        }
        s.set_read_timeout(Some(left()))
            .map_err(|e| e.to_string())?;
        let n = match s.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read: {e}")),
        };
        answer.extend_from_slice(&chunk[..n]);
        if answer.len() as u64 > MAX_TRACE {
            return Err(format!("an answer over {} MiB", MAX_TRACE >> 20));
        }
        if body_at.is_none() {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut head = httparse::Response::new(&mut headers);
            match head.parse(&answer) {
                Ok(httparse::Status::Complete(at)) => {
                    if head.code != Some(200) {
                        return Err(format!(
                            "the worker server answered {} {}: this torch has no fr_trace_json handler",
                            head.code.unwrap_or(0),
                            head.reason.unwrap_or("")
                        ));
                    }
                    let length = head
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok());
                    body_at = Some((at, length));
                }
                Ok(httparse::Status::Partial) if n > 0 => {}
                Ok(httparse::Status::Partial) => {
                    return Err("the connection closed before an HTTP answer".into());
                }
                Err(e) => return Err(format!("not an HTTP answer: {e}")),
            }
        }
        if let Some((at, length)) = body_at {
            let whole = length.is_some_and(|l| answer.len() >= at + l);
            if whole || n == 0 {
                let end = length.map_or(answer.len(), |l| (at + l).min(answer.len()));
                return parse_json(&answer[at..end]);
            }
        }
        if n == 0 {
            return Err("the connection closed before an HTTP answer".into());
        }
    }
}

/// The Unix sockets `proc_pid` listens on whose path is `base` or begins
/// with it (a job that adds its rank to the path it was given), each as
/// this process reaches it (through the process's root where it runs in
/// another mount namespace).
pub fn worker_sockets(proc_pid: &Path, base: &str) -> Vec<PathBuf> {
    if base.is_empty() {
        return Vec::new();
    }
    let inodes: Vec<u64> = std::fs::read_dir(proc_pid.join("fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    let table = std::fs::read_to_string(proc_pid.join("net/unix")).unwrap_or_default();
    listening_paths(&table, &inodes)
        .into_iter()
        .filter(|p| p.starts_with(base))
        .map(|p| as_seen(proc_pid, &p))
        .collect()
}

/// `path`, as the process of `proc_pid` names it, as this process reaches
/// it: through that process's root where it runs in another mount
/// namespace (a container).
pub fn as_seen(proc_pid: &Path, path: &str) -> PathBuf {
    let same = std::fs::read_link(proc_pid.join("ns/mnt")).ok()
        == std::fs::read_link("/proc/self/ns/mnt").ok();
    if same {
        PathBuf::from(path)
    } else {
        proc_pid.join("root").join(path.trim_start_matches('/'))
    }
}

/// `/proc/PID/net/unix`'s listening stream sockets among `inodes`, by
/// path (`Num RefCount Protocol Flags Type St Inode Path`; flag 0x10000 is
/// a listening socket, type 1 a stream).
pub fn listening_paths(table: &str, inodes: &[u64]) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let flags = u32::from_str_radix(f.get(3)?, 16).ok()?;
            let stream = f.get(4)? == &"0001";
            let inode: u64 = f.get(6)?.parse().ok()?;
            let path = f.get(7)?;
            (flags & 0x10000 != 0 && stream && inodes.contains(&inode) && path.starts_with('/'))
                .then(|| path.to_string())
        })
        .collect()
}

/// The dump at `path`, where it is the job's: a file owned by `uid`,
/// written at or after `since`; `Ok(None)` where there is none.
pub fn read_dump(path: &Path, uid: u32, since: SystemTime) -> Result<Option<Trace>, String> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(None);
    };
    if !meta.is_file() || meta.uid() != uid {
        return Ok(None);
    }
    if meta.modified().is_ok_and(|m| m < since) {
        return Ok(None);
    }
    if meta.len() > MAX_TRACE {
        return Err(format!(
            "{}: over {} MiB, not read",
            path.display(),
            MAX_TRACE >> 20
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_pickle(&bytes)
        .or_else(|_| parse_json(&bytes))
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torchs_own_dump_is_read() {
        let dump = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/flight-recorder/gloo-2.15.pickle"),
        )
        .unwrap();
        let t = parse_pickle(&dump).unwrap();
        assert_eq!(t.version, "2.10");
        assert_eq!(
            t.groups["0"],
            GroupStatus {
                last_enqueued: 1,
                last_completed: 1
            }
        );
        assert_eq!(t.records.len(), 1);
        assert_eq!(t.records[0].describe(), "all_reduce of [10] Float");
        assert!(t.records[0].retired);
        assert_eq!(t.pending("0"), None);
    }

    #[test]
    fn a_pickle_that_would_build_billions_of_values_is_refused() {
        // Each list holds the one before it twice, by memo reference.
        let mut p = vec![0x80, 2, b']', b'q', 0];
        for i in 0..40u8 {
            p.extend([b']', b'q', i + 1, b'(', b'h', i, b'h', i, b'e']);
        }
        p.push(b'.');
        let e = parse_pickle(&p).unwrap_err();
        assert!(e.contains("over 4194304 values"), "{e}");
        // The same, each list filled only after the one above it holds it.
        let mut p = vec![0x80, 2];
        for i in 0..=40u8 {
            p.extend([b']', b'q', i, b'0']);
        }
        for i in (0..40u8).rev() {
            p.extend([b'h', i + 1, b'(', b'h', i, b'h', i, b'e', b'0']);
        }
        p.extend([b'N', b'.']);
        let e = parse_pickle(&p).unwrap_err();
        assert!(e.contains("over 4194304 values"), "{e}");
    }

    #[test]
    fn a_pickle_nested_too_deep_or_naming_code_is_refused() {
        let mut p = vec![0x80, 2];
        p.extend([b']'; 40]);
        p.extend([b'a'; 39]);
        p.push(b'.');
        let e = parse_pickle(&p).unwrap_err();
        assert!(e.contains("nested over 32 deep"), "{e}");
        // GLOBAL os system: never reached.
        let e = parse_pickle(b"\x80\x02cos\nsystem\n.").unwrap_err();
        assert!(e.contains("opcode 0x63 at byte 2"), "{e}");
        for cut in [b"\x80".as_slice(), b"\x80\x02X\xff\x00\x00\x00ab"] {
            assert!(parse_pickle(cut).is_err());
        }
    }

    #[test]
    fn listening_unix_sockets_among_the_processes_are_found() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 4242 /tmp/ws_0.sock
0000000000000000: 00000002 00000000 00010000 0001 01 4343 /tmp/other.sock
0000000000000000: 00000003 00000000 00000000 0001 03 4444 /tmp/ws_1.sock
0000000000000000: 00000002 00000000 00010000 0002 01 4545 /tmp/ws_2.sock
0000000000000000: 00000002 00000000 00010000 0001 01 4646 @abstract
";
        assert_eq!(
            listening_paths(table, &[4242, 4444, 4545, 4646]),
            ["/tmp/ws_0.sock"]
        );
    }
}
