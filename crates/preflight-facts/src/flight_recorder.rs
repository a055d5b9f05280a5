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
    /// By the group's name, which every rank of it shares (`0` for the
    /// default group); a process's own numbering of its groups differs
    /// from rank to rank, so a group no record names is left out.
    pub groups: BTreeMap<String, GroupStatus>,
    /// Groups that carry point-to-point operations, whose numbers count
    /// those too.
    pub p2p_groups: std::collections::BTreeSet<String>,
    /// Collectives enqueued and completed over every group, named or not.
    pub counted: (i64, i64),
    /// Oldest first.
    pub records: Vec<Record>,
}

impl Trace {
    /// Collectives enqueued and completed over every group: what grows
    /// while the job moves.
    pub fn progress(&self) -> (i64, i64) {
        self.counted
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
    // The process's own id of a group (`pg_id`, the key of `pg_status`)
    // to the group's name (`process_group[0]`), from the records.
    let local = |e: &serde_json::Value| {
        e["pg_id"]
            .as_i64()
            .map(|g| g.to_string())
            .or_else(|| e["pg_id"].as_str().map(String::from))
    };
    let names: BTreeMap<String, String> = entries
        .iter()
        .filter_map(|e| Some((local(e)?, e["process_group"][0].as_str()?.to_string())))
        .collect();
    if let Some(groups) = v["pg_status"].as_object() {
        for (id, g) in groups {
            let status = GroupStatus {
                last_enqueued: number(&g["last_enqueued_collective"]).unwrap_or(-1),
                last_completed: number(&g["last_completed_collective"]).unwrap_or(-1),
            };
            t.counted = (
                t.counted.0.saturating_add(status.last_enqueued.max(0)),
                t.counted.1.saturating_add(status.last_completed.max(0)),
            );
            if let Some(name) = names.get(id) {
                t.groups.insert(name.clone(), status);
            }
        }
    }
    for e in entries {
        let name = e["profiling_name"].as_str().unwrap_or("");
        let group = local(e)
            .and_then(|l| names.get(&l).cloned())
            .unwrap_or_default();
        if e["is_p2p"].as_bool() == Some(true) {
            t.p2p_groups.insert(group.clone());
        }
        t.records.push(Record {
            group,
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

/// How deep a dump's values may nest; how much it may hold once its
/// memo references are counted out (each value one, and a string or
/// number its bytes): torch's dumps are 6 deep and a few megabytes; how
/// many values, marks and memo entries its reading may hold at once.
const MAX_DEPTH: u32 = 32;
const MAX_WEIGHT: u64 = 4 * MAX_TRACE;
const MAX_HELD: usize = 1 << 20;
const MAX_MARKS: usize = 64;

/// A pickle's shape, before serde-pickle reads it (it copies a memo
/// value for each reference, and bounds none of this): only the opcodes
/// of the protocol-2-to-4 data pickles torch writes (containers, strings,
/// numbers, the memo; nothing that names a class or calls one), nesting
/// no deeper than `MAX_DEPTH`, no container within itself, each memo
/// entry put once and never a copy of another, and no more than
/// `MAX_WEIGHT` once memo references are counted out (one list put twice
/// into another, a few dozen times over, or one long string referenced a
/// million times, would otherwise be gigabytes to build).
fn check_pickle(b: &[u8]) -> Result<(), String> {
    // Every value is a node: its own weight and its items. The stack
    // holds nodes (and whether each came from the memo) and marks.
    #[derive(Clone, Copy)]
    enum Item {
        Mark,
        Value { node: u32, from_memo: bool },
    }
    let mut nodes: Vec<(u64, Vec<u32>)> = Vec::new();
    let mut edges = 0usize;
    let mut marks = 0usize;
    let mut stack: Vec<Item> = Vec::new();
    let mut memo: BTreeMap<u32, u32> = BTreeMap::new();
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
        let end = at.checked_add(n).ok_or("it ends inside an opcode")?;
        let s = b.get(*at..end).ok_or("it ends inside an opcode")?;
        *at = end;
        Ok(s)
    };
    let len = |s: &[u8]| s.iter().rev().fold(0usize, |n, b| (n << 8) | *b as usize);
    let new = |nodes: &mut Vec<(u64, Vec<u32>)>, weight: usize| {
        nodes.push((1 + weight as u64, Vec::new()));
        Item::Value {
            node: nodes.len() as u32 - 1,
            from_memo: false,
        }
    };
    let value = |stack: &mut Vec<Item>| match stack.pop() {
        Some(Item::Value { node, .. }) => Ok(node),
        _ => Err("too few values".to_string()),
    };
    loop {
        if stack.len() > MAX_HELD
            || memo.len() > MAX_HELD
            || edges > MAX_HELD
            || nodes.len() > MAX_HELD
        {
            return Err(format!("over {MAX_HELD} values held at once"));
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
                let v = new(&mut nodes, 0);
                stack.push(v);
            }
            b'(' => {
                marks += 1;
                if marks > MAX_MARKS {
                    return Err(format!("over {MAX_MARKS} marks open at once"));
                }
                stack.push(Item::Mark);
            }
            b'X' | b'B' | b'T' | 0x8c | b'C' | b'U' | 0x8a => {
                let width = if matches!(op, b'X' | b'B' | b'T') {
                    4
                } else {
                    1
                };
                let n = len(take(&mut at, width)?);
                take(&mut at, n)?;
                let v = new(&mut nodes, n);
                stack.push(v);
            }
            b'J' | b'K' | b'M' | b'G' => {
                let n = match op {
                    b'J' => 4,
                    b'K' => 1,
                    b'M' => 2,
                    _ => 8,
                };
                take(&mut at, n)?;
                let v = new(&mut nodes, n);
                stack.push(v);
            }
            b'N' | 0x88 | 0x89 => {
                let v = new(&mut nodes, 0);
                stack.push(v);
            }
            // POP
            b'0' => match stack.pop() {
                Some(Item::Mark) => marks -= 1,
                Some(_) => {}
                None => return Err("a POP of nothing".into()),
            },
            b'q' | b'r' | 0x94 => {
                let key = match op {
                    b'q' => len(take(&mut at, 1)?) as u32,
                    b'r' => len(take(&mut at, 4)?) as u32,
                    _ => memo.len() as u32,
                };
                let Some(Item::Value { node, from_memo }) = stack.last().copied() else {
                    return Err("a memo put with nothing to put".into());
                };
                // torch's pickler (and Python's) puts each value once.
                if from_memo || memo.contains_key(&key) {
                    return Err("a memo entry put twice".into());
                }
                memo.insert(key, node);
                // What is on the stack is the memo's now (serde-pickle
                // turns it into a reference): put again, it would be a copy.
                if let Some(Item::Value { from_memo, .. }) = stack.last_mut() {
                    *from_memo = true;
                }
            }
            b'h' | b'j' => {
                let width = if op == b'h' { 1 } else { 4 };
                let key = len(take(&mut at, width)?) as u32;
                let node = *memo.get(&key).ok_or("a memo get of nothing put")?;
                stack.push(Item::Value {
                    node,
                    from_memo: true,
                });
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
                            Some(Item::Value { node, .. }) => items.push(node),
                            Some(Item::Mark) => {
                                marks -= 1;
                                break;
                            }
                            None => return Err("no MARK to end at".into()),
                        }
                    },
                }
                edges += items.len();
                let into = if matches!(op, b't' | 0x85..=0x87) {
                    match new(&mut nodes, 0) {
                        Item::Value { node, .. } => node,
                        Item::Mark => unreachable!("a new value is no mark"),
                    }
                } else {
                    value(&mut stack)?
                };
                nodes[into as usize].1.extend(items);
                stack.push(Item::Value {
                    node: into,
                    from_memo: false,
                });
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
    // Each value's weight and depth, its items first (no recursion: an
    // explicit stack), a container met again on its own path a cycle.
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
            if let Some(&c) = nodes[n].1.get(*next) {
                *next += 1;
                let c = c as usize;
                if done[c].is_none() {
                    if on_path[c] {
                        return Err("a container within itself".into());
                    }
                    path.push((c, 0));
                }
                continue;
            }
            let (weight, depth) = nodes[n].1.iter().fold((nodes[n].0, 1u32), |(w, d), c| {
                let (cw, cd) = done[*c as usize].unwrap_or((1, 1));
                (w.saturating_add(cw), d.max(cd + 1))
            });
            if depth > MAX_DEPTH {
                return Err(format!("values nested over {MAX_DEPTH} deep"));
            }
            if weight > MAX_WEIGHT {
                return Err(format!(
                    "over {} MiB once its references are counted out",
                    MAX_WEIGHT >> 20
                ));
            }
            done[n] = Some((weight, depth));
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

/// A connection to the Unix socket at `path` that process `pid` itself
/// listens on (SO_PEERCRED, which the kernel gives in this process's PID
/// namespace): a path that leads elsewhere (a symlink in a container's
/// tree) is refused. Never waits: a listener whose backlog is full is
/// said to be so.
fn connect_to(path: &Path, pid: u32) -> Result<UnixStream, String> {
    let sock = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)
        .map_err(|e| format!("socket: {e}"))?;
    sock.set_nonblocking(true).map_err(|e| e.to_string())?;
    let addr = socket2::SockAddr::unix(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match sock.connect(&addr) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            return Err("connect: its backlog is full (it accepts nothing)".into());
        }
        Err(e) => return Err(format!("connect: {e}")),
    }
    sock.set_nonblocking(false).map_err(|e| e.to_string())?;
    let s: UnixStream = sock.into();
    let peer = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("SO_PEERCRED: {e}"))?;
    if u32::try_from(peer.pid()).ok() != Some(pid) {
        return Err(format!(
            "{} is process {}'s, not the rank's",
            path.display(),
            peer.pid()
        ));
    }
    Ok(s)
}

/// Asks the worker server at `socket`, which process `pid` serves, for
/// the recorder, by `deadline`.
pub fn ask_worker_server(socket: &Path, pid: u32, deadline: Instant) -> Result<Trace, String> {
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut s = connect_to(socket, pid)?;
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
                    let length: Option<usize> = head
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok());
                    if length.is_some_and(|l| l as u64 > MAX_TRACE) {
                        return Err(format!("an answer over {} MiB", MAX_TRACE >> 20));
                    }
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
        .filter_map(|p| as_seen(proc_pid, &p))
        .collect()
}

/// `path`, as the process of `proc_pid` names it, as this process reaches
/// it: through that process's root where it runs in another mount
/// namespace (a container).
/// `None` for a path that is not absolute or climbs (`..`): what is
/// opened there is checked besides (its type, its owner, the process at
/// the other end), since a symlink in a container's tree resolves in
/// this process's.
pub fn as_seen(proc_pid: &Path, path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    if !p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return None;
    }
    let same = std::fs::read_link(proc_pid.join("ns/mnt")).ok()
        == std::fs::read_link("/proc/self/ns/mnt").ok();
    Some(if same {
        PathBuf::from(path)
    } else {
        proc_pid.join("root").join(path.trim_start_matches('/'))
    })
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

/// A file as it stood at one moment: which file, how long, and when the
/// kernel last stamped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    /// `path` as it stands now (a symlink itself, not followed); `None`
    /// where there is nothing.
    pub fn of(path: &Path) -> Option<FileStamp> {
        std::fs::symlink_metadata(path)
            .ok()
            .map(|m| FileStamp::from_meta(&m))
    }

    fn from_meta(m: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// Which dump counts as fresh.
#[derive(Debug, Clone, Copy)]
pub enum Fresh {
    /// Written at or after this time (the job's start: seconds before).
    Since(SystemTime),
    /// Changed since it stood so (`None`: there was none), for a dump
    /// asked for a moment ago. Not a time: the kernel stamps a file from
    /// its coarse clock, up to a tick (4 ms) behind the time read before
    /// asking, and a dump the rank wrote 1 ms after it was asked was
    /// passed over as older (3 of 10 asks here); nor can a dump on a
    /// network file system be held to this node's clock. What it cannot
    /// see: the same file rewritten at the same size within the tick of
    /// a write just before the request.
    ChangedFrom(Option<FileStamp>),
}

impl Fresh {
    fn admits(&self, m: &std::fs::Metadata) -> bool {
        match self {
            Fresh::Since(t) => m.modified().is_ok_and(|m| m >= *t),
            Fresh::ChangedFrom(before) => *before != Some(FileStamp::from_meta(m)),
        }
    }
}

/// The dump at `path`, where it is the job's: a file owned by `uid`,
/// `fresh`; `Ok(None)` where there is none. Opened without following a
/// symlink or waiting on a FIFO, and checked as opened: nothing the job
/// swaps in after a look is read.
pub fn read_dump(path: &Path, uid: u32, fresh: Fresh) -> Result<Option<Trace>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        // None there, or a symlink (ELOOP): not the job's dump.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() || meta.uid() != uid || !fresh.admits(&meta) {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    file.take(MAX_TRACE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_TRACE {
        return Err(format!(
            "{}: over {} MiB, not read",
            path.display(),
            MAX_TRACE >> 20
        ));
    }
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
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../fixtures/flight-recorder/gloo-2.15.pickle"),
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
        assert!(e.contains("MiB once its references are counted out"), "{e}");
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
        assert!(e.contains("MiB once its references are counted out"), "{e}");
    }

    #[test]
    fn a_long_string_referenced_over_and_over_or_put_twice_is_refused() {
        let mut p = vec![0x80, 2, b'X'];
        p.extend((1u32 << 20).to_le_bytes());
        p.extend(vec![b'a'; 1 << 20]);
        p.extend([b'q', 0, b']', b'(']);
        for _ in 0..200 {
            p.extend([b'h', 0]);
        }
        p.extend([b'e', b'.']);
        let e = parse_pickle(&p).unwrap_err();
        assert!(e.contains("MiB once its references are counted out"), "{e}");
        let e = parse_pickle(b"\x80\x02X\x01\x00\x00\x00a\x94\x94.").unwrap_err();
        assert!(e.contains("a memo entry put twice"), "{e}");
        let mut marks = vec![0x80, 2];
        marks.extend([b'('; 100]);
        marks.extend([b'N', b'.']);
        let e = parse_pickle(&marks).unwrap_err();
        assert!(e.contains("marks open at once"), "{e}");
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
