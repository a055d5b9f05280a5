//! `preflight diagnose` against real torch jobs under real torchrun, 4
//! ranks on this machine, on each torch: Debian's python3-torch (1.13)
//! and a current torch from PyPI in a virtual environment
//! (PREFLIGHT_TORCH_VENV, which .ci/install makes). The cases: a rank that
//! sleeps before init_process_group, a rank that stops before an
//! all_reduce, a healthy job, slow and jittery jobs (diagnosed fifty
//! times each beside four busy loops, and never called held), a
//! mismatched collective, two ranks stuck in different places, and a
//! non-store on the store's port. Each state is reached by an event (the
//! job writes a marker when its rank holds; diagnose is asked until the
//! others wait, 30 s at most), never by a sleep. The job's store is
//! read-only to diagnose: the job, let go, finishes normally.

use super::{cluster, common};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use preflight::schema::Diagnosis;

use super::Torch;
use crate::common::serial;

mod across_hosts;
mod flight_recorder;
mod nccl_ras;

use flight_recorder::Recorder;

/// A torch job under torchrun; killed with its ranks when dropped.
struct TorchJob {
    child: Child,
    marker: PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl TorchJob {
    fn start(torch: &Torch, mode: &str, held: u32) -> TorchJob {
        TorchJob::start_with(torch, mode, held, &[])
    }

    fn start_with(torch: &Torch, mode: &str, held: u32, vars: &[(&str, &Path)]) -> TorchJob {
        TorchJob::start_as(torch, mode, held, vars, &[])
    }

    /// `prefix` runs torchrun as another user (setpriv ...).
    fn start_as(
        torch: &Torch,
        mode: &str,
        held: u32,
        vars: &[(&str, &Path)],
        prefix: &[&str],
    ) -> TorchJob {
        // Writable by the job's user, whoever it is.
        let dir = common::tempdir_with_mode(0o777);
        let marker = dir.path().join("marker");
        let port = common::unused_port("127.0.0.1");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/services/torch_distributed/job.py");
        let torchrun = torch.torchrun.to_str().expect("a torchrun path in UTF-8");
        let (program, first): (&str, Vec<&str>) = match prefix.split_first() {
            Some((p, rest)) => (p, rest.iter().copied().chain([torchrun]).collect()),
            None => (torchrun, Vec::new()),
        };
        let child = Command::new(program)
            .args(first)
            .env("HOME", "/tmp")
            .args(["--nproc_per_node", "4", "--master_port", &port.to_string()])
            .args(["--redirects", "1", "--tee", "1", "--log_dir"])
            .arg(dir.path().join("logs"))
            .arg(&script)
            .env("JOB_MODE", mode)
            .env("JOB_RANK", held.to_string())
            .env("JOB_MARKER", &marker)
            .env("JOB_SECONDS", "120")
            .env("OMP_NUM_THREADS", "1")
            .envs(vars.iter().map(|(k, v)| (*k, *v)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: the ranks go with it.
            .process_group(0)
            .spawn()
            .expect("torchrun");
        TorchJob {
            child,
            marker,
            port,
            _dir: dir,
        }
    }

    fn wait_for_marker(&self) {
        let start = Instant::now();
        while !self.marker.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "the job never reached its mark"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TorchJob {
    fn drop(&mut self) {
        let group = -(self.child.id() as i32);
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group.to_string()])
            .status();
        let _ = self.child.wait();
    }
}

use std::os::unix::process::CommandExt;

/// py-spy for the cases run with it: PREFLIGHT_PY_SPY (.ci/install puts
/// it in a virtual environment); `None`, said, where it is not installed.
fn py_spy() -> Option<String> {
    let p = std::env::var("PREFLIGHT_PY_SPY")
        .ok()
        .filter(|p| Path::new(p).is_file());
    if p.is_none() {
        common::skip_unless_required("py-spy is not installed (PREFLIGHT_PY_SPY)");
    }
    p
}

/// Without py-spy, then with it where it is installed: each case's job
/// is diagnosed both ways (a torch job takes seconds to start).
fn both(py_spy: Option<&str>) -> Vec<Stacks<'_>> {
    std::iter::once(Stacks::Off)
        .chain(py_spy.map(Stacks::With))
        .collect()
}

/// With py-spy (its path) or without (`off`).
#[derive(Clone, Copy)]
enum Stacks<'a> {
    Off,
    With(&'a str),
}

impl Stacks<'_> {
    fn arg(&self) -> &str {
        match self {
            Stacks::Off => "off",
            Stacks::With(p) => p,
        }
    }
}

/// `preflight diagnose --format json` for the job of `pid`, at its
/// defaults (the watch window it ships with): exit code and report.
fn diagnose(pid: u32, stacks: Stacks<'_>) -> (i32, Diagnosis) {
    let out = Command::new(common::BIN)
        .args(["diagnose", "--format", "json", "--pid", &pid.to_string()])
        .args(["--py-spy", stacks.arg()])
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), diagnosis(&out))
}

/// diagnose's JSON output, read with the product's own types.
fn diagnosis<T: serde::de::DeserializeOwned>(out: &std::process::Output) -> T {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not a diagnosis ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// How many of the first job's ranks wait (none while no job is found).
fn waiting(d: &Diagnosis) -> usize {
    d.jobs.first().map_or(0, |j| {
        j.ranks.iter().filter(|r| r.state == "waiting").count()
    })
}

/// Diagnose until `n` ranks have come to wait (a rank still importing
/// torch is busy, one still finishing its last all_reduce moves bytes),
/// 60 s at most; the last answer.
fn diagnose_until_waiting(pid: u32, n: usize, stacks: Stacks<'_>) -> (i32, Diagnosis) {
    let start = Instant::now();
    loop {
        let (code, v) = diagnose(pid, stacks);
        if waiting(&v) == n {
            return (code, v);
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{v:#?}");
    }
}

fn diagnose_until_three_wait(pid: u32, stacks: Stacks<'_>) -> (i32, Diagnosis) {
    diagnose_until_waiting(pid, 3, stacks)
}

/// The store's key count and the values of the keys a job under torchrun
/// writes at init (each rank's Gloo address, in each torch's spelling),
/// read by the test itself over the wire in the torch's numbering
/// (GETNUMKEYS, CHECK and GET: nothing written), to compare before and
/// after diagnose.
fn store_snapshot(torch: &Torch, port: u16) -> String {
    let script = r#"
import socket, struct, sys
port, old = int(sys.argv[1]), sys.argv[2] == "old"
s = socket.create_connection(("127.0.0.1", port), timeout=5)
GET, CHECK, NUMKEYS = (2, 4, 6) if old else (3, 5, 7)
if not old:
    s.sendall(bytes([0]) + struct.pack("<I", 0x3C85F7CE))
def recv(n):
    b = b""
    while len(b) < n: b += s.recv(n - len(b))
    return b
s.sendall(bytes([NUMKEYS])); n = struct.unpack("<q", recv(8))[0]
out = ["keys %d" % n]
def check(k):
    kb = k.encode(); s.sendall(bytes([CHECK]) + struct.pack("<QQ", 1, len(kb)) + kb)
    return recv(1)[0] == 0
def get(k):
    kb = k.encode(); s.sendall(bytes([GET]) + struct.pack("<Q", len(kb)) + kb)
    l = struct.unpack("<Q", recv(8))[0]
    return recv(l).hex()
keys = ["//worker/attempt_0/default_pg/0/0/%d" % r for r in range(4)]
keys += ["/default_pg/0//cpu//0/%d" % r for r in range(4)]
for k in keys:
    out.append("%s=%s" % (k, get(k) if check(k) else "-"))
print(" ".join(out))
"#;
    let numbering = if torch.old_store { "old" } else { "new" };
    let out = Command::new("/usr/bin/python3")
        .args(["-c", script, &port.to_string(), numbering])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn marker_pid(job: &TorchJob) -> u32 {
    std::fs::read_to_string(&job.marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn states(d: &Diagnosis) -> Vec<(u32, String)> {
    d.jobs[0]
        .ranks
        .iter()
        .map(|r| (r.rank, r.state.clone()))
        .collect()
}

/// (a) Rank 3 sleeps before init_process_group: it is named, not
/// connected to the store, and the others are shown waiting in init.
fn asleep_before_init(torch: &Torch) {
    let _serial = serial();
    let job = TorchJob::start(torch, "late_init", 3);
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let spy = py_spy();
    for stacks in both(spy.as_deref()) {
        asleep_before_init_seen(torch, &job, pid, stacks);
    }
}

fn asleep_before_init_seen(torch: &Torch, job: &TorchJob, pid: u32, stacks: Stacks<'_>) {
    // A rank shows waiting in init as soon as it is connected to the
    // store; its address lands there a moment later (on a busy CI machine,
    // after a first diagnosis: CI, 2026-12-07). Diagnosed again until the
    // store holds ranks 0-2, or the deadline, then held to it below.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let (code, d) = loop {
        let (code, d) = diagnose_until_three_wait(pid, stacks);
        let arrived = d.jobs[0].store_read.as_ref().map(|s| s.arrived.clone());
        if arrived.as_deref() == Some(&[0, 1, 2][..]) || std::time::Instant::now() > deadline {
            break (code, d);
        }
    };
    // The store, read by diagnose, is as it was: diagnose again between
    // two snapshots.
    let before = store_snapshot(torch, job.port);
    let _ = diagnose(pid, stacks);
    assert_eq!(store_snapshot(torch, job.port), before);
    let j = &d.jobs[0];
    assert_eq!(j.world_size, 4, "{d:#?}");
    assert!(
        j.torch.is_some(),
        "the job's torch, read from a rank: {d:#?}"
    );
    // Read from the store: ranks 0-2 published their address, rank 3 not.
    let store = j
        .store_read
        .as_ref()
        .unwrap_or_else(|| panic!("the store was not read: {d:#?}"));
    assert_eq!(store.error, None, "{d:#?}");
    assert_eq!(store.arrived, [0, 1, 2], "{d:#?}");
    let server = if torch.old_store {
        "torch 1.13 to 2.1"
    } else {
        "torch 2.2 or later"
    };
    assert_eq!(store.server, server, "{d:#?}");
    let culprits = &j.culprits;
    assert_eq!(culprits.len(), 1, "{d:#?}");
    assert_eq!(culprits[0].rank, 3, "{d:#?}");
    assert_eq!(culprits[0].pid, Some(pid), "{d:#?}");
    assert_eq!(culprits[0].evidence, "rank", "{d:#?}");
    assert!(culprits[0].next_step.contains("not the node's"), "{d:#?}");
    let reason = culprits[0].reason.as_str();
    assert!(reason.contains("asleep in its own code"), "{reason}");
    assert!(reason.contains("ranks 0-2 wait in init"), "{reason}");
    assert!(
        reason.contains("not connected to the job's store"),
        "{reason}"
    );
    for (rank, state) in states(&d) {
        let want = if rank == 3 { "sleeping" } else { "waiting" };
        assert_eq!(state, want, "{d:#?}");
    }
    if let Stacks::With(_) = stacks {
        // The call each is in, and the culprit's line of its own code.
        assert!(
            reason.contains("ranks 0-2 wait in init_process_group ("),
            "{reason}"
        );
        assert!(reason.contains("at job.py:"), "{reason}");
        assert!(!culprits[0].stack.is_empty(), "{d:#?}");
        for r in &j.ranks {
            if r.rank != 3 {
                assert_eq!(r.call.as_deref(), Some("init_process_group"), "{d:#?}");
            }
        }
    }
    assert_eq!(code, 1);
}

on_each_torch!(
    /// A rank asleep before init is named, and the others wait in init:
    /// without py-spy, then with it, of the same job.
    a_rank_asleep_before_init_is_named,
    super::asleep_before_init
);

/// (b) Every rank loops all_reduce and rank 2 stops before one: rank 2
/// is named, and the others are shown after init (in all_reduce, where
/// py-spy says so); then let go, the job finishes normally.
fn stopped_before_an_all_reduce(torch: &Torch) {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let mut job = TorchJob::start_with(
        torch,
        "stop",
        2,
        &[("JOB_RELEASE", &release), ("JOB_ROUNDS", Path::new("40"))],
    );
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let spy = py_spy();
    for stacks in both(spy.as_deref()) {
        stopped_before_an_all_reduce_seen(pid, stacks);
    }
    let_go(&mut job, &release);
}

fn stopped_before_an_all_reduce_seen(pid: u32, stacks: Stacks<'_>) {
    let (code, d) = diagnose_until_three_wait(pid, stacks);
    let j = &d.jobs[0];
    let culprits = &j.culprits;
    assert_eq!(culprits.len(), 1, "{d:#?}");
    assert_eq!(culprits[0].rank, 2, "{d:#?}");
    let reason = culprits[0].reason.as_str();
    let others = match stacks {
        Stacks::Off => "while ranks 0-1,3 wait after init (connected to every other rank here)",
        Stacks::With(_) => {
            "while ranks 0-1,3 wait in all_reduce (after init: connected to every other rank here)"
        }
    };
    assert!(reason.contains(others), "{reason}");
    assert!(j.moved.is_empty(), "{d:#?}");
    for r in &j.ranks {
        assert_eq!(r.store_connected, Some(true), "{d:#?}");
        assert_eq!(r.peer_connections, 3, "{d:#?}");
        assert_eq!(r.moved_bytes, 0, "{d:#?}");
    }
    assert_eq!(code, 1);
    // Human output, the same verdict, what to do, and no kernel names.
    let out = Command::new(common::BIN)
        .args([
            "diagnose",
            "--pid",
            &pid.to_string(),
            "--py-spy",
            stacks.arg(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("HELD UP BY rank 2 ("), "{text}");
    assert!(
        text.contains("\n    next: a fault in the job's own code"),
        "{text}"
    );
    for kernel in ["futex", "hrtimer", "nanosleep", "ep_poll"] {
        assert!(
            !text.contains(kernel),
            "{kernel} in the human report: {text}"
        );
    }
    assert!(
        text.trim_end()
            .ends_with("HELD  a rank or a path holds its job up: named above"),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1));
    // Prometheus, written as node_exporter's textfile collector reads it,
    // passes the real promtool.
    let dir = tempfile::tempdir().unwrap();
    let prom = dir.path().join("diagnose.prom");
    let out = Command::new(common::BIN)
        .args([
            "diagnose",
            "--pid",
            &pid.to_string(),
            "--py-spy",
            stacks.arg(),
        ])
        .args(["--format", "prometheus", "--output"])
        .arg(&prom)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let metrics = std::fs::read_to_string(&prom).unwrap();
    assert!(
        metrics.contains("verdict=\"held\"} 1") && metrics.contains(",rank=\"2\","),
        "{metrics}"
    );
    assert!(
        metrics.contains(",state=\"waiting\"} 3") && metrics.contains(",state=\"sleeping\"} 1"),
        "{metrics}"
    );
    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&prom).unwrap())
        .output()
    {
        Ok(check) => assert!(
            check.status.success(),
            "{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        ),
        Err(_) => common::skip_unless_required("promtool is not installed (apt: prometheus)"),
    }
}

on_each_torch!(
    a_rank_stopped_before_an_all_reduce_is_named,
    super::stopped_before_an_all_reduce
);

/// (c) A healthy job keeps running: nothing is named, exit 0, and what
/// moved is said.
fn healthy(torch: &Torch) {
    let _serial = serial();
    let recorder = Recorder::new(torch);
    let job = TorchJob::start_with(torch, "healthy", 0, &recorder.vars());
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let spy = py_spy();
    for stacks in both(spy.as_deref()) {
        healthy_seen(&recorder, pid, stacks);
    }
}

/// And where the job keeps a Flight Recorder, its counts are said as
/// progress.
fn healthy_seen(recorder: &Recorder, pid: u32, stacks: Stacks<'_>) {
    let (code, d) = diagnose(pid, stacks);
    let j = &d.jobs[0];
    assert!(j.culprits.is_empty(), "{d:#?}");
    assert_eq!(j.verdict, "progressing", "{d:#?}");
    assert!(!j.moved.is_empty(), "{d:#?}");
    if recorder.kept() {
        assert!(
            j.moved
                .iter()
                .any(|m| m.starts_with("the Flight Recorders of ranks 0-3 counted ")),
            "{d:#?}"
        );
    }
    assert_eq!(code, 0, "{d:#?}");
    // A job that moves is seen to move before the window's end.
    assert!(d.watch_ms < 2000, "{d:#?}");
    // Diagnosed, the job goes on: its ranks still move.
    let (_, again) = diagnose(pid, stacks);
    let moved: u64 = again.jobs[0].ranks.iter().map(|r| r.moved_bytes).sum();
    assert!(moved > 0, "{again:#?}");
}

on_each_torch!(
    a_healthy_job_keeps_running_and_nothing_is_named,
    super::healthy
);

/// Four busy loops, one per rank, for as long as it lives: the noise of
/// a node whose CPUs are all taken.
struct BusyLoops(Vec<Child>);

impl BusyLoops {
    fn start() -> BusyLoops {
        BusyLoops(
            (0..4)
                .map(|_| {
                    Command::new("/usr/bin/python3")
                        .args(["-c", "while True: pass"])
                        .spawn()
                        .expect("python3")
                })
                .collect(),
        )
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Diagnoses asked of one job, `DIAGNOSES` in all and `AT_ONCE` at a
/// time (each mostly waits out its window), at the shipped defaults.
const DIAGNOSES: usize = 50;
const AT_ONCE: usize = 10;

fn many_diagnoses(pid: u32) -> Vec<(i32, Diagnosis)> {
    let mut out = Vec::new();
    while out.len() < DIAGNOSES {
        let batch: Vec<_> = (0..AT_ONCE.min(DIAGNOSES - out.len()))
            .map(|_| std::thread::spawn(move || diagnose(pid, Stacks::Off)))
            .collect();
        out.extend(batch.into_iter().map(|h| h.join().unwrap()));
    }
    out
}

/// (d) Healthy, jittery (a sleep of 0 to 0.8 s a step) and slow (32 MB
/// all_reduces and 0.3 s sleeps) jobs, beside four busy loops: never
/// held in fifty diagnoses each. A job with one stalled rank, beside the
/// same loops: that rank named in fifty of fifty.
fn never_held_when_moving_and_always_named_when_stalled(torch: &Torch) {
    let _serial = serial();
    for mode in ["healthy", "jitter", "slow"] {
        let job = TorchJob::start(torch, mode, 0);
        job.wait_for_marker();
        // The noise from the job's mark on: the diagnoses are what it is
        // for, and torch's imports under it would only make CI slower.
        let _noise = BusyLoops::start();
        let pid = marker_pid(&job);
        let held: Vec<String> = many_diagnoses(pid)
            .into_iter()
            .filter(|(code, d)| *code != 0 || d.verdict != "progressing")
            .map(|(code, d)| format!("exit {code}: {d:#?}"))
            .collect();
        assert!(
            held.is_empty(),
            "{mode} on {} torch: {} of {DIAGNOSES} not progressing; the first: {}",
            torch.name,
            held.len(),
            held[0]
        );
    }
    let job = TorchJob::start(torch, "stop", 2);
    job.wait_for_marker();
    let _noise = BusyLoops::start();
    let pid = marker_pid(&job);
    diagnose_until_three_wait(pid, Stacks::Off);
    let wrong: Vec<String> = many_diagnoses(pid)
        .into_iter()
        .filter(|(code, d)| {
            *code != 1
                || d.jobs[0]
                    .culprits
                    .iter()
                    .map(|c| c.rank)
                    .collect::<Vec<_>>()
                    != [2]
        })
        .map(|(code, d)| format!("exit {code}: {d:#?}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "stalled rank 2 on {} torch not named alone in {} of {DIAGNOSES}; the first: {}",
        torch.name,
        wrong.len(),
        wrong[0]
    );
}

on_each_torch!(
    a_moving_job_is_never_held_and_a_stalled_rank_always_named,
    super::never_held_when_moving_and_always_named_when_stalled
);

/// (e) Rank 2 calls all_gather where the others call all_reduce: named
/// as the odd one, with the call of each side (py-spy).
fn mismatched_collective(torch: &Torch) {
    let Some(p) = py_spy() else { return };
    let _serial = serial();
    let recorder = Recorder::new(torch);
    let job = TorchJob::start_with(torch, "mismatch", 2, &recorder.vars());
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let (code, d) = diagnose_until_waiting(pid, 4, Stacks::With(&p));
    let c = &d.jobs[0].culprits;
    assert_eq!(c.len(), 1, "{d:#?}");
    assert_eq!(c[0].rank, 2, "{d:#?}");
    assert!(
        c[0].reason
            .contains("a mismatched collective: it calls all_gather")
            && c[0].reason.contains("while ranks 0-1,3 call all_reduce"),
        "{d:#?}"
    );
    assert!(c[0].next_step.contains("job.py:"), "{d:#?}");
    assert_eq!(code, 1);
    // Without py-spy, from the Flight Recorders alone.
    if recorder.kept() {
        let (code, d) = diagnose(pid, Stacks::Off);
        let c = &d.jobs[0].culprits;
        assert_eq!(c.len(), 1, "{d:#?}");
        assert_eq!(c[0].rank, 2, "{d:#?}");
        assert!(
            c[0].reason.contains(
                "a mismatched collective: its Flight Recorder shows all_gather of [1024] Float as collective #6 of group 0, where ranks 0-1,3 call all_reduce of [1024] Float"
            ),
            "{d:#?}"
        );
        assert!(
            c[0].next_step
                .contains("every rank must call the same collectives"),
            "{d:#?}"
        );
        assert_eq!(code, 1);
    }
}

on_each_torch!(
    a_mismatched_collective_names_the_odd_rank,
    super::mismatched_collective
);

/// (f) Rank 2 sleeps and rank 3 blocks in queue.Queue().get(): both are
/// named, each with where it is (py-spy), and neither is counted among
/// the ranks waiting in a collective.
fn two_stuck_ranks(torch: &Torch) {
    let Some(p) = py_spy() else { return };
    let _serial = serial();
    let recorder = Recorder::new(torch);
    let mut vars = recorder.vars();
    vars.push(("JOB_RANK2", Path::new("3")));
    let job = TorchJob::start_with(torch, "two", 2, &vars);
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let (code, d) = diagnose_until_waiting(pid, 2, Stacks::With(&p));
    let j = &d.jobs[0];
    let named: Vec<u32> = j.culprits.iter().map(|c| c.rank).collect();
    assert_eq!(named, [2, 3], "{d:#?}");
    let three = &j.culprits[1];
    assert!(
        three
            .reason
            .contains("blocked on a lock or a condition at ")
            && three
                .reason
                .contains("in its own code and in no collective")
            && three.reason.contains("while ranks 0-1 wait in all_reduce"),
        "{d:#?}"
    );
    assert_eq!(code, 1);
    if recorder.kept() {
        flight_recorder::two_stuck_ranks_without_py_spy(&recorder, pid);
    }
}

on_each_torch!(
    two_ranks_stuck_in_different_places_are_both_named,
    super::two_stuck_ranks
);

const NOBODY: [&str; 4] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
];

/// As an ordinary user: the job runs as nobody, and diagnose, as nobody
/// too, sees its ranks, names the stopped one, and reads the store.
fn as_an_ordinary_user(torch: &Torch) {
    let _serial = serial();
    let job = TorchJob::start_as(torch, "stop", 2, &[], &NOBODY);
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let start = Instant::now();
    let (code, d) = loop {
        let out = Command::new(NOBODY[0])
            .args(&NOBODY[1..])
            .arg(common::BIN)
            .args([
                "diagnose",
                "--format",
                "json",
                "--pid",
                &pid.to_string(),
                "--py-spy",
                "off",
            ])
            .output()
            .unwrap();
        let d: Diagnosis = diagnosis(&out);
        if waiting(&d) == 3 {
            break (out.status.code(), d);
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{d:#?}");
    };
    let j = &d.jobs[0];
    assert_eq!(j.culprits[0].rank, 2, "{d:#?}");
    assert_eq!(j.culprits.len(), 1, "{d:#?}");
    assert!(j.torch.is_some(), "{d:#?}");
    assert_eq!(
        j.store_read.as_ref().and_then(|s| s.error.clone()),
        None,
        "{d:#?}"
    );
    for r in &j.ranks {
        assert_eq!(
            r.peer_connections, 3,
            "its own sockets are readable: {d:#?}"
        );
    }
    assert_eq!(code, Some(1));
}

on_each_torch!(
    as_the_jobs_own_ordinary_user_the_stopped_rank_is_named,
    super::as_an_ordinary_user
);

/// Diagnosed while held, then let go: the job finishes normally, every
/// rank through its all_reduces (diagnose wrote nothing, stopped nothing).
fn let_go(job: &mut TorchJob, release: &Path) {
    std::fs::write(release, "go").unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = job.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the job did not finish"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "torchrun: {status}");
}

/// A rank of the job's torch whose MASTER_ADDR:MASTER_PORT reaches an
/// HTTP server, not a store: said to be no store, never read as one.
fn a_non_store(torch: &Torch) {
    use std::io::{Read, Write};
    let _shared = crate::common::shared();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in l.incoming().take(8) {
            let Ok(mut c) = conn else { return };
            let mut b = [0u8; 256];
            let _ = c.read(&mut b);
            let _ = c.write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    // A process of the job's torch, with a rank's environment, that holds
    // until the test ends (its standard input closes).
    let mut rank = Command::new(&torch.python)
        .args([
            "-c",
            "import sys, torch; print('up', flush=True); sys.stdin.read()",
        ])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("LOCAL_WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut up = [0u8; 3];
    rank.stdout.as_mut().unwrap().read_exact(&mut up).unwrap();
    let (_, d) = diagnose(rank.id(), Stacks::Off);
    drop(rank.stdin.take());
    let _ = rank.wait();
    let store = d.jobs[0]
        .store_read
        .as_ref()
        .unwrap_or_else(|| panic!("{d:#?}"));
    let e = store.error.as_deref().unwrap_or_else(|| panic!("{d:#?}"));
    assert!(
        e.contains("is no torch store") && e.contains("HTTP/1.1"),
        "{e}"
    );
    assert_eq!(store.keys, None, "{d:#?}");
}

on_each_torch!(
    a_non_store_on_the_stores_port_is_refused,
    super::a_non_store
);

#[test]
fn no_job_is_said_and_exits_3() {
    let _shared = crate::common::shared();
    let out = Command::new(common::BIN)
        .args(["diagnose", "--format", "json", "--pid", "1"])
        .output()
        .unwrap();
    let d: Diagnosis = diagnosis(&out);
    assert_eq!(d.verdict, "no_job");
    assert_eq!(d.schema, "preflight.diagnosis/v2");
    assert_eq!(out.status.code(), Some(3));
    for bad in ["1ms", "61s", "soon"] {
        let out = Command::new(common::BIN)
            .args(["diagnose", "--watch", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--watch {bad}");
    }
}
