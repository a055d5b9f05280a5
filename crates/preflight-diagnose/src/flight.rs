//! The job's Flight Recorders, rank by rank: read where the job offers
//! them (a worker server, else a dump it wrote when a collective timed
//! out), at both ends of the window. What they tell: collectives counted
//! over the window (the job moved), the collective each rank is in, and
//! the ranks the others wait for: one that has not called the collective
//! the others called (its number says so), one whose collective differs
//! in operation, size or type from the others' at the same number.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{Job, rank_list};
use preflight_facts::flight_recorder::{self, FileStamp, Fresh, Record, Trace};
use preflight_facts::procs;
use preflight_result::diagnosis::FlightRead;

/// How long reading every rank's recorder may take, each time.
pub const READ_WITHIN: Duration = Duration::from_secs(1);

/// One rank's recorder as read: where from, and what.
pub type Reads = BTreeMap<u32, (String, Result<Trace, String>)>;

/// How long a rank asked for a dump is waited for: NCCL's heartbeat
/// thread polls its pipe (the dump came 5.1 s after the request on an
/// H200).
pub const ASK_WITHIN: Duration = Duration::from_secs(8);

/// A rank asked for a dump: through which FIFO, when, and its dump file
/// as it stood just before.
#[derive(Debug, Clone)]
pub struct AskedRank {
    pipe: PathBuf,
    at: Instant,
    before: Option<FileStamp>,
}

/// The ranks asked for a dump.
pub type Asked = BTreeMap<u32, AskedRank>;

/// Where rank `r` writes its dump, as this process sees it.
fn dump_path(proc_pid: &Path, r: &super::find::RankProcess) -> Option<PathBuf> {
    flight_recorder::as_seen(proc_pid, &format!("{}{}", r.dump_prefix, r.rank))
}

/// Asks each rank of `job` here that takes requests for a dump (its
/// NCCL process group's debug-info pipe, `TORCH_NCCL_DEBUG_INFO_PIPE_FILE`
/// and `<rank>.pipe`) for one: a line written to that FIFO, which the
/// rank reads, dumps its recorder and goes on. Only a FIFO of the rank's
/// own user's, only where a reader has it open (a write that would wait
/// is not made), and nothing else is ever written to the job.
pub fn ask(proc_dir: &Path, job: &Job) -> Asked {
    use std::io::Write;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let mut out = Asked::new();
    for r in &job.ranks {
        let Some(pipe) = &r.dump_pipe else { continue };
        let proc_pid = proc_dir.join(r.pid.to_string());
        let (Some(uid), Some(fifo), Some(dump)) = (
            procs::uid(&proc_pid),
            flight_recorder::as_seen(&proc_pid, &format!("{pipe}{}.pipe", r.rank)),
            dump_path(&proc_pid, r),
        ) else {
            continue;
        };
        let asked = AskedRank {
            before: FileStamp::of(&dump),
            at: Instant::now(),
            pipe: fifo.clone(),
        };
        // Opened without following a symlink or waiting for a reader,
        // then checked as opened: the rank's own user's FIFO, or nothing
        // is written.
        let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&fifo)
        else {
            continue;
        };
        let theirs = f
            .metadata()
            .is_ok_and(|m| m.file_type().is_fifo() && m.uid() == uid);
        if theirs && f.write_all(b"1\n").is_ok() {
            out.insert(r.rank, asked);
        }
    }
    out
}

/// Each rank of `job` here whose recorder can be had: from its worker
/// server where it runs one, else from a dump it wrote since the job
/// began (since it was `asked`, for a rank asked, waited for until
/// `ASK_WITHIN` after); every other read done by `deadline`.
pub fn read(proc_dir: &Path, job: &Job, deadline: Instant, asked: &Asked) -> Reads {
    let since = job
        .ranks
        .iter()
        .filter_map(|r| procs::started(&proc_dir.join(r.pid.to_string())))
        .min();
    let mut out = Reads::new();
    for r in &job.ranks {
        let proc_pid = proc_dir.join(r.pid.to_string());
        let server = r.worker_socket.as_deref().and_then(|base| {
            flight_recorder::worker_sockets(&proc_pid, base)
                .into_iter()
                .next()
        });
        if let Some(socket) = server {
            let got = flight_recorder::ask_worker_server(&socket, r.pid, deadline);
            out.insert(r.rank, (format!("worker server {}", socket.display()), got));
            continue;
        }
        // Where ranks were asked, only what they wrote since: a rank not
        // asked keeps an older dump, of another moment.
        if !asked.is_empty() && !asked.contains_key(&r.rank) {
            continue;
        }
        let (Some(since), Some(uid)) = (since, procs::uid(&proc_pid)) else {
            continue;
        };
        let Some(dump) = dump_path(&proc_pid, r) else {
            continue;
        };
        let got = match asked.get(&r.rank) {
            // Written in place by torch: empty or half written is not yet.
            Some(a) => {
                let until = a.at + ASK_WITHIN;
                loop {
                    let got = flight_recorder::read_dump(&dump, uid, Fresh::ChangedFrom(a.before));
                    if matches!(got, Ok(Some(_))) || Instant::now() >= until {
                        break match got {
                            Ok(None) => Err(unanswered(a, &dump, uid)),
                            got => got,
                        };
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            None => flight_recorder::read_dump(&dump, uid, Fresh::Since(since)),
        };
        match got {
            Ok(Some(t)) => {
                out.insert(r.rank, (format!("dump {}", dump.display()), Ok(t)));
            }
            Ok(None) => {}
            Err(e) => {
                out.insert(r.rank, (format!("dump {}", dump.display()), Err(e)));
            }
        }
    }
    out
}

/// Why a rank asked for a dump has none to read: the file there is not
/// one taken (a symlink, not a file, another user's), or it is unchanged
/// since the request, or there is none.
fn unanswered(a: &AskedRank, dump: &Path, uid: u32) -> String {
    let asked = format!("asked through {}", a.pipe.display());
    match std::fs::symlink_metadata(dump) {
        Ok(m) if m.file_type().is_symlink() => {
            format!("{asked}; {} is a symlink, never followed", dump.display())
        }
        Ok(m) if !m.is_file() => format!("{asked}; {} is not a file", dump.display()),
        Ok(m) if m.uid() != uid => format!(
            "{asked}; {} belongs to uid {}, not the rank's ({uid}): not read",
            dump.display(),
            m.uid()
        ),
        _ => format!("{asked}, wrote no dump within {} s", ASK_WITHIN.as_secs()),
    }
}

/// `read` as a rank's recorder where none was read, or none could be
/// (its read an error): its desync keys, say.
pub fn stand_in(reads: &mut Reads, rank: u32, read: (String, Result<Trace, String>)) {
    if !matches!(reads.get(&rank), Some((_, Ok(_)))) {
        reads.insert(rank, read);
    }
}

/// A desync key ProcessGroupNCCL writes under TORCH_NCCL_DESYNC_DEBUG.
#[derive(Debug, Clone)]
pub struct TraceKey {
    pub rank: u32,
    /// `_trace_start` (the last collective it started), else `_trace_end`.
    pub start: bool,
    /// As the store spells it.
    pub key: String,
}

/// Each rank's desync keys (`NCCL_<rank>_trace_start` and `_end`) in the
/// store of its NCCL backend, in the spellings of torch's numbering:
/// `default_pg/0/` up to 2.1 (and 2.0's `default_pg/0/cuda/`), then
/// `default_pg/0//cuda//` (torch 2.15's `distributed_c10d.py`: the
/// backend's store is `PrefixStore("cuda/", PrefixStore("0/",
/// PrefixStore("default_pg", store)))`), each under every `prefixes`.
pub fn desync_keys(
    prefixes: &[String],
    numbering: preflight_facts::tcp_store::Numbering,
    world: u32,
) -> Vec<TraceKey> {
    use preflight_facts::tcp_store::Numbering;
    let groups: &[&str] = match numbering {
        Numbering::Old => &["default_pg/0/", "default_pg/0/cuda/"],
        Numbering::New => &["default_pg/0//cuda//"],
    };
    let mut out = Vec::new();
    for rank in 0..world.min(4096) {
        for p in prefixes {
            for g in groups {
                for start in [true, false] {
                    let end = if start { "start" } else { "end" };
                    out.push(TraceKey {
                        rank,
                        start,
                        key: format!("/{p}{g}NCCL_{rank}_trace_{end}"),
                    });
                }
            }
        }
    }
    out
}

/// A desync key's value: the collective's sequence number (8 bytes,
/// little-endian, as ProcessGroupNCCL copies its uint64) and its name,
/// NUL-ended.
fn trace_value(v: &[u8]) -> Option<(i64, String)> {
    let (seq, rest) = v.split_first_chunk::<8>()?;
    let name = rest.split(|b| *b == 0).next().unwrap_or_default();
    let name = std::str::from_utf8(name).ok().filter(|n| n.len() <= 64)?;
    let seq = i64::try_from(u64::from_le_bytes(*seq)).ok()?;
    Some((seq, name.to_string()))
}

/// The ranks' desync keys as read (`values`, one per `keys`), each rank's
/// as the recorder it stands for: its last collective started as the
/// last enqueued, its last ended as the last completed, in a group of its
/// own (`NCCL`).
pub fn desync(keys: &[TraceKey], values: &[(String, Option<Vec<u8>>)]) -> Reads {
    // Each rank's last started and last ended: (number, name).
    type Last = Option<(i64, String)>;
    let mut seen: BTreeMap<u32, (Last, Last)> = BTreeMap::new();
    for (k, (_, v)) in keys.iter().zip(values) {
        let Some(v) = v.as_deref().and_then(trace_value) else {
            continue;
        };
        let e = seen.entry(k.rank).or_default();
        if k.start {
            e.0 = Some(v);
        } else {
            e.1 = Some(v);
        }
    }
    seen.into_iter()
        .filter_map(|(rank, (start, end))| {
            let (started, op) = start?;
            let ended = end.map_or(0, |(e, _)| e);
            let mut t = Trace {
                version: "desync".into(),
                ..Trace::default()
            };
            t.groups.insert(
                "NCCL".into(),
                flight_recorder::GroupStatus {
                    last_enqueued: started,
                    last_completed: ended,
                },
            );
            t.counted = (started, ended);
            if started > ended {
                t.records.push(Record {
                    group: "NCCL".into(),
                    seq: started,
                    op,
                    input_sizes: Vec::new(),
                    input_dtypes: Vec::new(),
                    state: "started".into(),
                    retired: false,
                    p2p: false,
                });
            }
            Some((rank, ("store desync keys".to_string(), Ok(t))))
        })
        .collect()
}

/// What the recorders tell of the job.
#[derive(Debug, Default)]
pub struct Flight {
    pub reads: Vec<FlightRead>,
    /// Ranks whose recorder counted a collective over the window, and how
    /// many it completed.
    pub moved: Vec<(u32, i64)>,
    /// Whether those counts came from the store's desync keys alone.
    pub moved_by_desync: bool,
    /// The collective each rank is in, where its recorder shows one.
    pub calls: BTreeMap<u32, String>,
    /// The ranks the recorders set apart, each with why, and whether it
    /// is a mismatch (a wrong call, not a rank held elsewhere).
    pub odd: Vec<(u32, String, bool)>,
}

impl Flight {
    /// "the Flight Recorders of ranks 0-3 counted 12 collectives completed".
    pub fn moved_words(&self) -> Option<String> {
        if self.moved.is_empty() {
            return None;
        }
        let ids: Vec<u32> = self.moved.iter().map(|(r, _)| *r).collect();
        let done = self
            .moved
            .iter()
            .fold(0i64, |n, (_, m)| n.saturating_add(*m));
        let whose = if self.moved_by_desync {
            "the desync keys"
        } else {
            "the Flight Recorders"
        };
        Some(format!(
            "{whose} of {} counted {done} collectives completed",
            rank_list(&ids)
        ))
    }
}

fn where_in(p: &Record) -> String {
    format!(
        "collective #{} of group {}: {}",
        p.seq,
        p.group,
        p.describe()
    )
}

/// The recorders at the window's start (`before`) and end (`after`),
/// weighed.
pub fn weigh(before: &Reads, after: &Reads) -> Flight {
    let mut f = Flight::default();
    let mut desync_moved = 0;
    for (rank, (source, got)) in after {
        let mut read = FlightRead {
            rank: *rank,
            source: source.clone(),
            ..FlightRead::default()
        };
        match got {
            Ok(t) => {
                (read.enqueued, read.completed) = t.progress();
                let pending = t.groups.keys().find_map(|g| t.pending(g));
                read.pending = pending.map(where_in);
                if let Some(p) = pending {
                    f.calls.insert(*rank, p.op.clone());
                }
                // Collectives completed, counted by the same recorder at
                // both ends (a dump and the store's keys count apart);
                // one enqueued is no progress: the CPU enqueues while a
                // GPU's kernels hang.
                if let Some((from, Ok(b))) = before.get(rank)
                    && from == source
                {
                    let (_, c0) = b.progress();
                    if read.completed > c0 {
                        f.moved.push((*rank, read.completed.saturating_sub(c0)));
                        desync_moved += usize::from(t.version == "desync");
                    }
                }
            }
            Err(e) => read.error = Some(e.clone()),
        }
        f.reads.push(read);
    }
    f.moved_by_desync = !f.moved.is_empty() && desync_moved == f.moved.len();
    let traces: BTreeMap<u32, &Trace> = after
        .iter()
        .filter_map(|(r, (_, t))| Some((*r, t.as_ref().ok()?)))
        .collect();
    let groups: std::collections::BTreeSet<&String> =
        traces.values().flat_map(|t| t.groups.keys()).collect();
    for g in groups {
        // A group's numbers count its point-to-point operations too,
        // which ranks need not share.
        if traces.values().any(|t| t.p2p_groups.contains(g)) {
            continue;
        }
        odd_in_group(g, &traces, &mut f.odd);
    }
    f
}

/// Collectives whose ranks send and receive different sizes by design
/// (uneven splits, a root's buffers): compared by operation and type.
const UNEVEN: &[&str] = &[
    "all_to_all",
    "all_to_all_single",
    "alltoall",
    "alltoall_base",
    "scatter",
    "gather",
];

/// What ranks in the same collective must agree on.
fn kind(p: &Record) -> String {
    if UNEVEN.contains(&p.op.as_str()) {
        format!("{} {}", p.op, p.input_dtypes.join(" "))
    } else {
        p.describe()
    }
}

/// Within group `g`: the ranks behind the collective the others called,
/// then those whose collective at that number differs from the most's.
fn odd_in_group(g: &str, traces: &BTreeMap<u32, &Trace>, odd: &mut Vec<(u32, String, bool)>) {
    let status: Vec<(u32, i64, Option<&Record>)> = traces
        .iter()
        .filter_map(|(r, t)| Some((*r, t.groups.get(g)?.last_enqueued, t.pending(g))))
        .collect();
    let Some(front) = status.iter().map(|s| s.1).max() else {
        return;
    };
    // The ranks in the front collective, not done with it.
    let waiting: Vec<(u32, &Record)> = status
        .iter()
        .filter_map(|(r, e, p)| Some((*r, p.filter(|p| p.seq == front && *e == front)?)))
        .collect();
    let Some((_, example)) = waiting.first() else {
        return;
    };
    let waiters: Vec<u32> = waiting.iter().map(|(r, _)| *r).collect();
    // Whose words: a recorder's, or the store's desync keys.
    let shows = |r: &u32| {
        if traces.get(r).is_some_and(|t| t.version == "desync") {
            "its desync keys show"
        } else {
            "its Flight Recorder shows"
        }
    };
    for (r, enqueued, pending) in &status {
        if *enqueued >= front {
            continue;
        }
        let why = match pending {
            Some(p) => {
                format!(
                    "{} it in {}, while {} {} in {}: it called fewer collectives than they did (a sequence mismatch, or a collective it skipped)",
                    shows(r),
                    where_in(p),
                    rank_list(&waiters),
                    if waiters.len() == 1 { "waits" } else { "wait" },
                    where_in(example)
                )
            }
            _ => format!(
                "{} it has not called {}, which {} called and {} in; its last was #{enqueued}",
                shows(r),
                where_in(example),
                rank_list(&waiters),
                if waiters.len() == 1 { "waits" } else { "wait" }
            ),
        };
        odd.push((*r, why, false));
    }
    // At the front number, the same operation, sizes and types for all.
    let mut kinds: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (r, p) in &waiting {
        kinds.entry(kind(p)).or_default().push(*r);
    }
    if kinds.len() < 2 {
        return;
    }
    let most = kinds.values().map(Vec::len).max().unwrap_or(0);
    // On a tie, which side is wrong is not known: no one is named.
    if kinds.values().filter(|v| v.len() == most).count() > 1 {
        return;
    }
    for (kind, ranks) in &kinds {
        if ranks.len() == most {
            continue;
        }
        let others: Vec<String> = kinds
            .iter()
            .filter(|(k, _)| *k != kind)
            .map(|(k, rs)| {
                format!(
                    "{} {} {k}",
                    rank_list(rs),
                    if rs.len() == 1 { "calls" } else { "call" }
                )
            })
            .collect();
        for r in ranks {
            odd.push((
                *r,
                format!(
                    "a mismatched collective: {} {kind} as collective #{front} of group {g}, where {}",
                    shows(r),
                    others.join(" and ")
                ),
                true,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One rank's recorder in the shape torch 2.15's worker server gives
    /// (`fr_trace_json`, measured): five all_reduces done, `last` pending.
    fn rank(enqueued: i64, last: Option<(&str, i64, u32)>) -> Trace {
        rank_of("0", enqueued, last)
    }

    /// The same, the group named `name` (the process numbers it 0).
    fn rank_of(name: &str, enqueued: i64, last: Option<(&str, i64, u32)>) -> Trace {
        let mut entries: Vec<String> = (1..enqueued.min(6))
            .map(|seq| {
                format!(
                    r#"{{"collective_seq_id":{seq},"input_dtypes":["Float"],"input_sizes":[[1024]],"is_p2p":false,"pg_id":0,"process_group":["{name}","default_pg"],"profiling_name":"gloo:all_reduce","retired":true,"state":"scheduled"}}"#
                )
            })
            .collect();
        if let Some((op, seq, size)) = last {
            entries.push(format!(
                r#"{{"collective_seq_id":{seq},"input_dtypes":["Float"],"input_sizes":[[{size}]],"is_p2p":false,"pg_id":0,"process_group":["{name}","default_pg"],"profiling_name":"gloo:{op}","retired":false,"state":"scheduled"}}"#
            ));
        }
        let completed = last.map_or(enqueued, |(_, seq, _)| seq - 1);
        flight_recorder::parse_json(
            format!(
                r#"{{"version":"2.10","entries":[{}],"pg_status":{{"0":{{"last_completed_collective":"{completed}","last_enqueued_collective":"{enqueued}","last_started_collective":"-1"}}}}}}"#,
                entries.join(",")
            )
            .as_bytes(),
        )
        .unwrap()
    }

    fn reads(ranks: Vec<Trace>) -> Reads {
        ranks
            .into_iter()
            .enumerate()
            .map(|(r, t)| (r as u32, ("worker server".to_string(), Ok(t))))
            .collect()
    }

    #[test]
    fn a_size_that_differs_at_the_same_number_names_its_rank() {
        let ranks = reads(vec![
            rank(6, Some(("all_reduce", 6, 1024))),
            rank(6, Some(("all_reduce", 6, 1024))),
            rank(6, Some(("all_reduce", 6, 2048))),
            rank(6, Some(("all_reduce", 6, 1024))),
        ]);
        let f = weigh(&ranks, &ranks);
        assert!(f.moved.is_empty());
        assert_eq!(f.odd.len(), 1, "{f:?}");
        assert_eq!(f.odd[0].0, 2);
        assert_eq!(
            f.odd[0].1,
            "a mismatched collective: its Flight Recorder shows all_reduce of [2048] Float as collective #6 of group 0, where ranks 0-1,3 call all_reduce of [1024] Float"
        );
        assert!(f.odd[0].2);
    }

    #[test]
    fn a_tie_an_uneven_all_to_all_and_another_group_name_no_one() {
        // Two sizes, two ranks each: which is wrong is not known.
        let tie = reads(vec![
            rank(6, Some(("all_reduce", 6, 1024))),
            rank(6, Some(("all_reduce", 6, 1024))),
            rank(6, Some(("all_reduce", 6, 2048))),
            rank(6, Some(("all_reduce", 6, 2048))),
        ]);
        assert!(weigh(&tie, &tie).odd.is_empty());
        // all_to_all's splits differ by design.
        let uneven = reads(vec![
            rank(6, Some(("all_to_all", 6, 1024))),
            rank(6, Some(("all_to_all", 6, 1024))),
            rank(6, Some(("all_to_all", 6, 512))),
        ]);
        assert!(weigh(&uneven, &uneven).odd.is_empty());
        // Ranks of two subgroups, each its process's group 0 by number:
        // their numbers are not compared.
        let a = rank(6, Some(("all_reduce", 6, 1024)));
        let b = rank_of("7", 5, None);
        let apart = reads(vec![a.clone(), a, b]);
        assert!(weigh(&apart, &apart).odd.is_empty());
    }

    #[test]
    fn a_rank_a_collective_behind_is_a_sequence_mismatch() {
        let ranks = reads(vec![
            rank(6, Some(("all_reduce", 6, 1024))),
            rank(5, Some(("all_reduce", 5, 1024))),
            rank(6, Some(("all_reduce", 6, 1024))),
        ]);
        let f = weigh(&ranks, &ranks);
        assert_eq!(f.odd.len(), 1, "{f:?}");
        assert_eq!(f.odd[0].0, 1);
        assert!(
            f.odd[0].1.starts_with("its Flight Recorder shows it in collective #5 of group 0: all_reduce of [1024] Float, while ranks 0,2 wait in collective #6"),
            "{}",
            f.odd[0].1
        );
        // The same recorders a collective on at the end: moved, counted.
        let later = reads(vec![rank(7, None), rank(7, None), rank(7, None)]);
        let f = weigh(&ranks, &later);
        assert_eq!(f.moved.len(), 3, "{f:?}");
        assert!(f.odd.is_empty(), "{f:?}");
    }

    /// This process as rank 0 of a job whose dumps and debug-info pipe
    /// are under `dir`, its FIFO made and held open for reading as NCCL's
    /// heartbeat thread holds it, and an hour-old dump of its own there.
    fn self_as_rank(dir: &Path) -> (Job, std::fs::File, PathBuf) {
        use std::os::unix::fs::OpenOptionsExt;
        let fifo = dir.join("pipe_0.pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let dump = dir.join("fr_0");
        let rank = super::super::find::RankProcess {
            rank: 0,
            pid: std::process::id(),
            local_world: Some(1),
            worker_socket: None,
            dump_prefix: dir.join("fr_").display().to_string(),
            dump_pipe: Some(dir.join("pipe_").display().to_string()),
        };
        let job = Job {
            name: "test".to_string(),
            ids: Vec::new(),
            world: 1,
            store: None,
            ranks: vec![rank],
            pids: vec![std::process::id()],
            agent_attempt: None,
            desync_debug: false,
            ras_addr: None,
        };
        (job, reader, dump)
    }

    fn torchs_dump() -> Vec<u8> {
        std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../fixtures/flight-recorder/gloo-2.15.pickle"),
        )
        .unwrap()
    }

    fn make_old(dump: &Path) {
        let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(dump)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
    }

    /// The request, as the rank reads it from its FIFO.
    fn request(mut reader: &std::fs::File) -> Vec<u8> {
        use std::io::Read;
        let mut got = [0u8; 64];
        match reader.read(&mut got) {
            Ok(n) => got[..n].to_vec(),
            Err(e) => panic!("no request in the FIFO: {e}"),
        }
    }

    /// A rank that dumps the moment it is asked, within the tick of the
    /// clock the kernel stamps files with (its dump stamped up to 4 ms
    /// before the time read as it was asked): read each time.
    #[test]
    fn a_dump_written_the_moment_it_is_asked_for_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let (job, reader, dump) = self_as_rank(dir.path());
        std::fs::write(&dump, torchs_dump()).unwrap();
        for _ in 0..20 {
            make_old(&dump);
            let asked = ask(Path::new("/proc"), &job);
            assert!(asked.contains_key(&0), "{asked:?}");
            assert_eq!(request(&reader), b"1\n");
            std::fs::write(&dump, torchs_dump()).unwrap();
            let by = Instant::now() + READ_WITHIN;
            let got = read(Path::new("/proc"), &job, by, &asked);
            let (source, trace) = &got[&0];
            assert_eq!(source, &format!("dump {}", dump.display()));
            assert!(trace.is_ok(), "{got:?}");
        }
    }

    /// A dump the rank cannot have written for this request (a symlink
    /// put in its place) is not read, and the report says why.
    #[test]
    fn a_symlink_in_the_dumps_place_is_named_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (job, reader, dump) = self_as_rank(dir.path());
        let real = dir.path().join("elsewhere");
        std::fs::write(&real, torchs_dump()).unwrap();
        let mut asked = ask(Path::new("/proc"), &job);
        assert_eq!(request(&reader), b"1\n");
        std::os::unix::fs::symlink(&real, &dump).unwrap();
        let a = asked.get_mut(&0).unwrap();
        a.at = a.at.checked_sub(ASK_WITHIN).unwrap();
        let got = read(
            Path::new("/proc"),
            &job,
            Instant::now() + READ_WITHIN,
            &asked,
        );
        let Err(e) = &got[&0].1 else {
            panic!("a symlink followed: {got:?}")
        };
        assert!(e.ends_with("is a symlink, never followed"), "{e}");
    }

    /// A rank's desync keys stand for its recorder where the recorder
    /// could not be read (a rank asked that wrote nothing), never over
    /// one that was.
    #[test]
    fn desync_keys_stand_in_for_a_recorder_not_read() {
        let keys = || ("store desync keys".to_string(), Ok(rank(6, None)));
        let mut reads = Reads::new();
        reads.insert(0, ("dump /tmp/fr_0".into(), Err("asked, no dump".into())));
        reads.insert(1, ("dump /tmp/fr_1".into(), Ok(rank(5, None))));
        stand_in(&mut reads, 0, keys());
        stand_in(&mut reads, 1, keys());
        stand_in(&mut reads, 2, keys());
        assert_eq!(reads[&0].0, "store desync keys");
        assert_eq!(reads[&1].0, "dump /tmp/fr_1");
        assert_eq!(reads[&2].0, "store desync keys");
    }

    /// A rank that takes the request and writes nothing is said to be
    /// one, its FIFO named: not read, and not left out of the report.
    #[test]
    fn a_rank_asked_that_writes_no_dump_is_named_with_its_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let (job, reader, dump) = self_as_rank(dir.path());
        std::fs::write(&dump, torchs_dump()).unwrap();
        let mut asked = ask(Path::new("/proc"), &job);
        assert_eq!(request(&reader), b"1\n");
        // Asked ASK_WITHIN ago: waited for no longer.
        let a = asked.get_mut(&0).unwrap();
        a.at = a.at.checked_sub(ASK_WITHIN).unwrap();
        let start = Instant::now();
        let got = read(
            Path::new("/proc"),
            &job,
            Instant::now() + READ_WITHIN,
            &asked,
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        let Err(e) = &got[&0].1 else {
            panic!("an older dump read as the answer: {got:?}")
        };
        assert_eq!(
            e,
            &format!(
                "asked through {}, wrote no dump within 8 s",
                dir.path().join("pipe_0.pipe").display()
            )
        );
    }
}
