//! `preflight diagnose` against real torch jobs (Debian's python3-torch,
//! Gloo) under real torchrun, 4 ranks on this machine: a rank that sleeps
//! before init_process_group, a rank that stops before an all_reduce, and
//! a healthy job, which keeps running. Each state is reached by an event
//! (the job writes a marker when its rank holds; diagnose is asked until
//! the others wait, 30 s at most), never by a sleep. The job's store is
//! read-only to diagnose: the job, let go, finishes normally.

use super::{cluster, common};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use preflight::schema::Diagnosis;

use crate::common::serial;

mod across_hosts;

fn torchrun_here() -> bool {
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import torch.distributed"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
        && Path::new("/usr/bin/torchrun").exists();
    if !ok {
        common::skip_unless_required("torchrun and python3-torch are not installed");
    }
    ok
}

/// A torch job under torchrun; killed with its ranks when dropped.
struct TorchJob {
    child: Child,
    marker: PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl TorchJob {
    fn start(mode: &str, held: u32) -> TorchJob {
        TorchJob::start_with(mode, held, &[])
    }

    fn start_with(mode: &str, held: u32, vars: &[(&str, &Path)]) -> TorchJob {
        TorchJob::start_as(mode, held, vars, &[])
    }

    /// `prefix` runs torchrun as another user (setpriv ...).
    fn start_as(mode: &str, held: u32, vars: &[(&str, &Path)], prefix: &[&str]) -> TorchJob {
        // Writable by the job's user, whoever it is.
        let dir = common::tempdir_with_mode(0o777);
        let marker = dir.path().join("marker");
        let port = common::unused_port("127.0.0.1");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/services/torch_distributed/job.py");
        let (program, first): (&str, Vec<&str>) = match prefix.split_first() {
            Some((p, rest)) => (
                p,
                rest.iter().copied().chain(["/usr/bin/torchrun"]).collect(),
            ),
            None => ("/usr/bin/torchrun", Vec::new()),
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
                start.elapsed() < Duration::from_secs(60),
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

/// `preflight diagnose --format json` for the job of `pid`: exit code and
/// report.
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

/// Diagnose until the three other ranks have come to wait (a rank still
/// importing torch is busy, not waiting), 30 s at most; the last answer.
fn diagnose_until_three_wait(pid: u32, stacks: Stacks<'_>) -> (i32, Diagnosis) {
    let start = Instant::now();
    loop {
        let (code, v) = diagnose(pid, stacks);
        if waiting(&v) == 3 {
            return (code, v);
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{v:#?}");
    }
}

/// The store's key count and the values of the keys a 1.13 job under
/// torchrun writes at init (the workers' counter, each rank's Gloo
/// address), read by the test itself over the wire (GETNUMKEYS, CHECK and
/// GET: nothing written), to compare before and after diagnose.
fn store_snapshot(port: u16) -> String {
    let script = r#"
import socket, struct, sys
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(bytes([6])); n = struct.unpack("<q", s.recv(8))[0]
out = ["keys %d" % n]
def check(k):
    kb = k.encode(); s.sendall(bytes([4]) + struct.pack("<QQ", 1, len(kb)) + kb)
    return s.recv(1)[0] == 0
def get(k):
    kb = k.encode(); s.sendall(bytes([2]) + struct.pack("<Q", len(kb)) + kb)
    l = struct.unpack("<Q", s.recv(8))[0]; v = b""
    while len(v) < l: v += s.recv(l - len(v))
    return v.hex()
for k in ["init/"] + ["//worker/attempt_0/default_pg/0/0/%d" % r for r in range(4)]:
    out.append("%s=%s" % (k, get(k) if check(k) else "-"))
print(" ".join(out))
"#;
    let out = Command::new("/usr/bin/python3")
        .args(["-c", script, &port.to_string()])
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
fn asleep_before_init(stacks: Stacks<'_>) {
    let _serial = serial();
    if !torchrun_here() {
        return;
    }
    let job = TorchJob::start("late_init", 3);
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let (code, d) = diagnose_until_three_wait(pid, stacks);
    // The store, read by diagnose, is as it was: diagnose again between
    // two snapshots.
    let before = store_snapshot(job.port);
    let _ = diagnose(pid, stacks);
    assert_eq!(store_snapshot(job.port), before);
    let j = &d.jobs[0];
    assert_eq!(j.world_size, 4, "{d:#?}");
    // Read from the store: ranks 0-2 published their address, rank 3 not.
    let store = j
        .store_read
        .as_ref()
        .unwrap_or_else(|| panic!("the store was not read: {d:#?}"));
    assert_eq!(store.arrived, [0, 1, 2], "{d:#?}");
    assert_eq!(store.server, "torch 1.13 to 2.1", "{d:#?}");
    let culprits = &j.culprits;
    assert_eq!(culprits.len(), 1, "{d:#?}");
    assert_eq!(culprits[0].rank, 3, "{d:#?}");
    assert_eq!(culprits[0].pid, Some(pid), "{d:#?}");
    let reason = culprits[0].reason.as_str();
    assert!(reason.contains("sleeping in its own code"), "{reason}");
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
        for r in &j.ranks {
            if r.rank != 3 {
                assert_eq!(r.call.as_deref(), Some("init_process_group"), "{d:#?}");
            }
        }
    }
    assert_eq!(code, 1);
}

#[test]
fn a_rank_asleep_before_init_is_named_and_the_others_wait_in_init() {
    asleep_before_init(Stacks::Off);
}

#[test]
fn a_rank_asleep_before_init_is_named_with_py_spy() {
    if let Some(p) = py_spy() {
        asleep_before_init(Stacks::With(&p));
    }
}

/// (b) Every rank loops all_reduce and rank 2 stops before one: rank 2
/// is named, and the others are shown after init (in all_reduce, where
/// py-spy says so).
fn stopped_before_an_all_reduce(stacks: Stacks<'_>) {
    let _serial = serial();
    if !torchrun_here() {
        return;
    }
    let job = TorchJob::start("stop", 2);
    job.wait_for_marker();
    let pid = marker_pid(&job);
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
    for r in &j.ranks {
        assert_eq!(r.store_connected, Some(true), "{d:#?}");
        assert_eq!(r.peer_connections, 3, "{d:#?}");
    }
    assert_eq!(code, 1);
    // Human output, the same verdict.
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

#[test]
fn a_rank_stopped_before_an_all_reduce_is_named_and_the_others_wait_after_init() {
    stopped_before_an_all_reduce(Stacks::Off);
}

#[test]
fn a_rank_stopped_before_an_all_reduce_is_named_with_py_spy() {
    if let Some(p) = py_spy() {
        stopped_before_an_all_reduce(Stacks::With(&p));
    }
}

/// (c) A healthy job keeps running: nothing is named, exit 0.
fn healthy(stacks: Stacks<'_>) {
    let _serial = serial();
    if !torchrun_here() {
        return;
    }
    let job = TorchJob::start("healthy", 0);
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let (code, d) = diagnose(pid, stacks);
    let j = &d.jobs[0];
    assert!(j.culprits.is_empty(), "{d:#?}");
    assert_eq!(j.verdict, "progressing", "{d:#?}");
    assert_eq!(code, 0, "{d:#?}");
    // Diagnosed, the job goes on: its ranks still use the CPU.
    let (_, again) = diagnose(pid, stacks);
    let cpu: u64 = again.jobs[0].ranks.iter().map(|r| r.cpu_ms).sum();
    assert!(cpu > 0, "{again:#?}");
}

#[test]
fn a_healthy_job_keeps_running_and_nothing_is_named() {
    healthy(Stacks::Off);
}

#[test]
fn a_healthy_job_with_py_spy_keeps_running_and_nothing_is_named() {
    if let Some(p) = py_spy() {
        healthy(Stacks::With(&p));
    }
}

const NOBODY: [&str; 4] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
];

/// As an ordinary user: the job runs as nobody, and diagnose, as nobody
/// too, sees its ranks, names the stopped one, and reads the store.
#[test]
fn as_the_jobs_own_ordinary_user_the_stopped_rank_is_named() {
    let _serial = serial();
    if !torchrun_here() {
        return;
    }
    let job = TorchJob::start_as("stop", 2, &[], &NOBODY);
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
        assert!(start.elapsed() < Duration::from_secs(30), "{d:#?}");
    };
    let j = &d.jobs[0];
    assert_eq!(j.culprits[0].rank, 2, "{d:#?}");
    assert_eq!(j.culprits.len(), 1, "{d:#?}");
    for r in &j.ranks {
        assert_eq!(
            r.peer_connections, 3,
            "its own sockets are readable: {d:#?}"
        );
    }
    assert_eq!(code, Some(1));
}

/// Diagnosed while held, then let go: the job finishes normally, every
/// rank through its all_reduces (diagnose wrote nothing, stopped nothing).
#[test]
fn a_diagnosed_job_let_go_finishes_normally() {
    let _serial = serial();
    if !torchrun_here() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let mut job = TorchJob::start_with(
        "stop",
        2,
        &[("JOB_RELEASE", &release), ("JOB_ROUNDS", Path::new("40"))],
    );
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let (code, d) = diagnose_until_three_wait(pid, Stacks::Off);
    assert_eq!(code, 1, "{d:#?}");
    std::fs::write(&release, "go").unwrap();
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

#[test]
fn no_job_is_said_and_exits_3() {
    let _shared = crate::common::shared();
    let out = Command::new(common::BIN)
        .args(["diagnose", "--format", "json", "--pid", "1"])
        .output()
        .unwrap();
    let d: Diagnosis = diagnosis(&out);
    assert_eq!(d.verdict, "no_job");
    assert_eq!(d.schema, "preflight.diagnosis/v1");
    assert_eq!(out.status.code(), Some(3));
    let bad = Command::new(common::BIN)
        .args(["diagnose", "--sample", "1ms"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// A server speaking NCCL RAS's client protocol that replays one recorded
/// report (fixtures/nccl-ras/), as NCCL 2.28.7 (JSON) or an older NCCL
/// that knows only the text form (its answer to SET FORMAT is an error):
/// `CLIENT PROTOCOL n` → `SERVER PROTOCOL 2`, `SET FORMAT json` → `OK` or
/// `ERROR: Unknown command ...`, `STATUS` → the report in two sends, then
/// the connection closes. Returns its address.
fn ras_replay(case: &str, json: bool) -> String {
    use std::io::{BufRead, BufReader, Write};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/nccl-ras");
    let report =
        std::fs::read(dir.join(format!("{case}.{}", if json { "json" } else { "txt" }))).unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let Ok((s, _)) = l.accept() else { return };
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            let cmd = line.trim().to_ascii_uppercase();
            line.clear();
            let reply = if cmd.starts_with("CLIENT PROTOCOL") {
                "SERVER PROTOCOL 2\n".to_string()
            } else if cmd == "SET FORMAT JSON" && json {
                "OK\n".to_string()
            } else if cmd == "STATUS" || cmd == "VERBOSE STATUS" {
                let (a, b) = report.split_at(report.len() / 3);
                let _ = w.write_all(a);
                let _ = w.write_all(b);
                return;
            } else {
                format!("ERROR: Unknown command {cmd}\n")
            };
            let _ = w.write_all(reply.as_bytes());
        }
    });
    addr
}

fn ras(addr: &str) -> (i32, Diagnosis) {
    let out = Command::new(common::BIN)
        .args([
            "diagnose", "--format", "json", "--pid", "1", "--py-spy", "off",
        ])
        .args(["--nccl-ras", addr])
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), diagnosis(&out))
}

/// Each recorded report, in each form: the rank RAS points at is named
/// with its node and pid, and a healthy job names nobody.
#[test]
fn nccl_ras_reports_name_the_missing_dead_and_lagging_ranks() {
    let _shared = crate::common::shared();
    for json in [true, false] {
        let form = if json { "json" } else { "text" };
        let (code, d) = ras(&ras_replay("healthy", json));
        let r = d.nccl_ras.as_ref().expect("NCCL RAS's report");
        assert_eq!(r.format, form, "{d:#?}");
        assert_eq!(r.nccl_version.as_deref(), Some("2.28.7"), "{d:#?}");
        assert_eq!(r.communicators, 1, "{d:#?}");
        assert!(r.culprits.is_empty(), "{d:#?}");
        assert_eq!(d.verdict, "no_job", "{d:#?}");
        assert_eq!(code, 3);
        for (case, rank, pid, words) in [
            ("missing", 5, 4241, "missing from communicator"),
            (
                "dead",
                6,
                4242,
                if json {
                    "RAS considers it dead"
                } else {
                    "missing from communicator"
                },
            ),
            (
                "mismatch",
                3,
                4133,
                if json {
                    "behind in AllReduce: launched up to 41 where the others reached 42"
                } else {
                    "behind the others: has launched up to operation 41"
                },
            ),
        ] {
            let (code, d) = ras(&ras_replay(case, json));
            let c = &d.nccl_ras.as_ref().expect("NCCL RAS's report").culprits;
            assert_eq!(c.len(), 1, "{case} {form}: {d:#?}");
            assert_eq!(c[0].rank, rank, "{case} {form}: {d:#?}");
            assert_eq!(c[0].pid, Some(pid), "{case} {form}: {d:#?}");
            let node = if rank < 4 { "127.0.0.21" } else { "127.0.0.22" };
            assert_eq!(c[0].node, node, "{case} {form}: {d:#?}");
            let reason = c[0].reason.as_str();
            assert!(reason.contains(words), "{case} {form}: {reason}");
            // The node RAS names gets preflight's ping check, quoted.
            assert!(
                reason.contains(&format!("; ping check pass: {node} ({node}): 3/3 replies")),
                "{case} {form}: {reason}"
            );
            assert_eq!(d.verdict, "held", "{case} {form}");
            assert_eq!(code, 1, "{case} {form}");
        }
        // The text form says the dead process itself too.
        if !json {
            let (_, d) = ras(&ras_replay("dead", false));
            let f = d
                .nccl_ras
                .as_ref()
                .expect("NCCL RAS's report")
                .findings
                .join("\n");
            assert!(
                f.contains("process 4242 on node 127.0.0.22 is considered dead"),
                "{f}"
            );
        }
    }
    // Nothing listening where asked: said, never guessed at.
    let port = common::unused_port("127.0.0.1");
    let (code, d) = ras(&format!("127.0.0.1:{port}"));
    let e = d
        .nccl_ras
        .as_ref()
        .and_then(|r| r.error.as_deref())
        .unwrap_or_else(|| panic!("no error said: {d:#?}"));
    assert!(e.starts_with("no NCCL RAS at 127.0.0.1:"), "{e}");
    assert_eq!(code, 3);
}
