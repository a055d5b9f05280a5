//! Diagnose reading torch's Flight Recorder, without py-spy, on the
//! current torch (the mismatch, two-rank and healthy cases run it on
//! their own jobs: diagnose.rs) (the recorder is torch 2.2 and later; 2.15 records Gloo
//! groups): from the worker server a job runs (worker_main() with
//! TORCH_WORKER_SERVER_SOCKET, each rank adding its rank to the path),
//! and from the dumps torch writes (TORCH_FR_DUMP_TEMP_FILE and the
//! rank). Each case is a case /proc alone cannot settle: a rank blocked
//! in its own code looks, to the kernel, like a rank waiting in a
//! collective.

use super::*;

const BUFFER: (&str, &str) = ("TORCH_FR_BUFFER_SIZE", "2000");

/// A Flight Recorder for a job on a torch that keeps one (2.2 and
/// later), served by each rank's worker server under a directory of its
/// own; nothing on an older torch.
pub(super) struct Recorder {
    dir: Option<tempfile::TempDir>,
    base: PathBuf,
}

impl Recorder {
    pub(super) fn new(torch: &Torch) -> Recorder {
        let dir = (!torch.old_store).then(|| tempfile::tempdir().unwrap());
        let base = dir
            .as_ref()
            .map(|d| d.path().join("ws_"))
            .unwrap_or_default();
        Recorder { dir, base }
    }

    /// Whether the job keeps one.
    pub(super) fn kept(&self) -> bool {
        self.dir.is_some()
    }

    /// The job's variables for it: the buffer and the worker server's
    /// path, to which each rank adds its rank.
    pub(super) fn vars(&self) -> Vec<(&'static str, &Path)> {
        if !self.kept() {
            return Vec::new();
        }
        vec![
            (BUFFER.0, Path::new(BUFFER.1)),
            ("TORCH_WORKER_SERVER_SOCKET", &self.base),
        ]
    }
}

/// Diagnose (no py-spy) until `done` holds of the report, 60 s at most.
fn diagnose_until(pid: u32, done: impl Fn(&Diagnosis) -> bool) -> (i32, Diagnosis) {
    let start = Instant::now();
    loop {
        let (code, d) = diagnose(pid, Stacks::Off);
        if done(&d) {
            return (code, d);
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{d:#?}");
    }
}

fn named(d: &Diagnosis) -> Vec<u32> {
    d.jobs
        .first()
        .map(|j| j.culprits.iter().map(|c| c.rank).collect())
        .unwrap_or_default()
}

/// Rank 2 sleeps and rank 3 blocks in queue.Queue().get() before the 6th
/// all_reduce: to /proc, rank 3 waits as ranks 0-1 do; its recorder
/// shows it never called collective #6, which ranks 0-1 wait in. Both
/// are named, with no py-spy, and every rank's recorder is read from its
/// own server.
pub(super) fn two_stuck_ranks_without_py_spy(recorder: &Recorder, pid: u32) {
    let (code, d) = diagnose_until(pid, |d| named(d).len() == 2);
    let j = &d.jobs[0];
    assert_eq!(named(&d), [2, 3], "{d:#?}");
    let three = &j.culprits[1].reason;
    assert!(
        three.contains("its Flight Recorder shows it has not called collective #6 of group 0: all_reduce of [1024] Float, which ranks 0-1 called"),
        "{three}"
    );
    assert_eq!(j.flight.len(), 4, "{d:#?}");
    for f in &j.flight {
        assert!(
            f.source
                .starts_with(&format!("worker server {}", recorder.base.display())),
            "{f:?}"
        );
        assert_eq!(f.error, None, "{f:?}");
        let pending = f.pending.as_deref();
        if f.rank < 2 {
            assert_eq!(
                pending,
                Some("collective #6 of group 0: all_reduce of [1024] Float"),
                "{f:?}"
            );
        } else {
            assert_eq!(pending, None, "{f:?}");
        }
    }
    assert_eq!(code, 1);
}

/// No worker server, and the dumps of ranks 0-2 (torch's own writer,
/// into TORCH_FR_DUMP_TEMP_FILE and the rank, as a job's hang watchdog
/// has it write): rank 2, stopped before the 6th all_reduce, is named
/// from them. Rank 3 writes none; a dump at its path that says it is
/// behind is not taken while another user owns it, nor while it is older
/// than the job, and names rank 3 once it is the job's. The job's store is
/// torch 2.15's legacy server (USE_LIBUV=0), read as its libuv one is.
#[test]
fn the_dumps_a_job_writes_name_the_rank_that_has_not_called() {
    let Some(torch) = Torch::current() else {
        return;
    };
    let _serial = serial();
    let dir = common::tempdir_with_mode(0o777);
    let prefix = dir.path().join("fr_");
    let planted = dir.path().join("fr_3");
    let out = Command::new(&torch.python)
        .args([
            "-c",
            "import pickle, sys; open(sys.argv[1], 'wb').write(pickle.dumps({'version': '2.10', 'pg_status': {'0': {'last_enqueued_collective': 1, 'last_started_collective': -1, 'last_completed_collective': 1}}, 'entries': [{'collective_seq_id': 1, 'pg_id': 0, 'process_group': ('0', 'default_pg'), 'profiling_name': 'gloo:all_reduce', 'input_sizes': [[1024]], 'input_dtypes': ['Float'], 'state': 'scheduled', 'retired': True, 'is_p2p': False}]}, protocol=2))",
        ])
        .arg(&planted)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    let size = Path::new(BUFFER.1);
    let dumpers = Path::new("0,1,2");
    let job = TorchJob::start_with(
        &torch,
        "stop",
        2,
        &[
            ("TORCH_FR_DUMP_TEMP_FILE", &prefix),
            ("JOB_DUMP", dumpers),
            (BUFFER.0, size),
            ("USE_LIBUV", Path::new("0")),
        ],
    );
    job.wait_for_marker();
    let pid = marker_pid(&job);
    // Two ranks in #6 (their dumps written) and the job judged (the
    // moment their watchdogs write is a moment the job moved bytes).
    let pending_two = |d: &Diagnosis| {
        d.jobs.first().is_some_and(|j| {
            j.verdict == "held" && j.flight.iter().filter(|f| f.pending.is_some()).count() == 2
        })
    };
    let (code, d) = diagnose_until(pid, |d| pending_two(d) && d.jobs[0].flight.len() == 3);
    let j = &d.jobs[0];
    let store = j.store_read.as_ref().unwrap_or_else(|| panic!("{d:#?}"));
    assert_eq!(store.error, None, "{d:#?}");
    assert_eq!(store.server, "torch 2.2 or later", "{d:#?}");
    assert_eq!(store.arrived, [0, 1, 2, 3], "{d:#?}");
    let read: Vec<u32> = j.flight.iter().map(|f| f.rank).collect();
    assert_eq!(read, [0, 1, 2], "another user's dump is not read: {d:#?}");
    for f in &j.flight {
        assert_eq!(
            f.source,
            format!("dump {}{}", prefix.display(), f.rank),
            "{f:?}"
        );
    }
    assert_eq!(named(&d), [2], "{d:#?}");
    assert!(
        j.culprits[0].reason.contains(
            "its Flight Recorder shows it has not called collective #6 of group 0: all_reduce of [1024] Float, which ranks 0-1 called and wait in; its last was #5"
        ),
        "{d:#?}"
    );
    assert_eq!(code, 1);
    // The job's user's, an hour old: older than the job, not read.
    std::os::unix::fs::chown(&planted, Some(0), Some(0)).unwrap();
    let file = std::fs::File::options().write(true).open(&planted).unwrap();
    file.set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    let (_, d) = diagnose_until(pid, pending_two);
    assert_eq!(
        d.jobs[0].flight.len(),
        3,
        "a stale dump is not read: {d:#?}"
    );
    // Written now: the job's, read, and rank 3 is behind in it.
    file.set_modified(std::time::SystemTime::now()).unwrap();
    let (_, d) = diagnose_until(pid, pending_two);
    assert_eq!(d.jobs[0].flight.len(), 4, "{d:#?}");
    assert_eq!(named(&d), [2, 3], "{d:#?}");
}

/// NCCL's debug-info pipe, its heartbeat thread stood in for by the job
/// (a Gloo job has none): without `--ask-dumps` nothing is asked and no
/// recorder is read; with it, each rank is asked through its FIFO, its
/// dump waited for and read, and rank 2, stopped before the 6th
/// all_reduce, named from the dumps; the job goes on (asked again, the
/// same).
#[test]
fn asked_through_its_debug_info_pipe_each_rank_dumps_and_the_stopped_one_is_named() {
    let Some(torch) = Torch::current() else {
        return;
    };
    let _serial = serial();
    let dir = common::tempdir_with_mode(0o777);
    let prefix = dir.path().join("fr_");
    let pipe = dir.path().join("pipe_");
    let size = Path::new(BUFFER.1);
    let job = TorchJob::start_with(
        &torch,
        "stop",
        2,
        &[
            ("TORCH_FR_DUMP_TEMP_FILE", &prefix),
            ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", &pipe),
            (BUFFER.0, size),
        ],
    );
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let (_, d) = diagnose_until(pid, |d| d.jobs.first().is_some_and(|j| j.verdict == "held"));
    assert!(
        d.jobs[0].flight.is_empty(),
        "nothing asked, nothing read: {d:#?}"
    );
    for _ in 0..2 {
        let start = Instant::now();
        let out = Command::new(common::BIN)
            .args([
                "diagnose",
                "--format",
                "json",
                "--py-spy",
                "off",
                "--ask-dumps",
            ])
            .args(["--pid", &pid.to_string()])
            .output()
            .unwrap();
        let d: Diagnosis = diagnosis(&out);
        let j = &d.jobs[0];
        let read: Vec<u32> = j
            .flight
            .iter()
            .filter(|f| f.error.is_none())
            .map(|f| f.rank)
            .collect();
        assert_eq!(read, [0, 1, 2, 3], "{d:#?}");
        assert_eq!(named(&d), [2], "{d:#?}");
        assert!(
            j.culprits[0]
                .reason
                .contains("its Flight Recorder shows it has not called collective #6 of group 0"),
            "{d:#?}"
        );
        assert_eq!(out.status.code(), Some(1));
        assert!(
            start.elapsed() < Duration::from_secs(12),
            "{:?}",
            start.elapsed()
        );
    }
}

/// TORCH_NCCL_DESYNC_DEBUG's keys, written by the job where
/// ProcessGroupNCCL writes them (a Gloo job has none) on each torch's
/// store: rank 2, stopped before the 6th all_reduce, is named from them,
/// with no recorder and no py-spy; a healthy job's keys, read at both
/// ends of the window, are its progress.
fn desync_keys(torch: &Torch) {
    let _serial = serial();
    let one = Path::new("1");
    let job = TorchJob::start_with(
        torch,
        "stop",
        2,
        &[("TORCH_NCCL_DESYNC_DEBUG", one), ("JOB_DESYNC", one)],
    );
    job.wait_for_marker();
    let pid = marker_pid(&job);
    let (code, d) = diagnose_until(pid, |d| named(d) == [2] && d.jobs[0].flight.len() == 4);
    let j = &d.jobs[0];
    for f in &j.flight {
        assert_eq!(f.source, "store desync keys", "{f:?}");
    }
    assert!(
        j.culprits[0].reason.contains(
            "its desync keys show it has not called collective #6 of group NCCL: all_reduce, which ranks 0-1,3 called and wait in; its last was #5"
        ),
        "{d:#?}"
    );
    assert_eq!(code, 1);
    // Let go, the job's keys move: said as progress.
    drop(job);
    let job = TorchJob::start_with(
        torch,
        "healthy",
        0,
        &[("TORCH_NCCL_DESYNC_DEBUG", one), ("JOB_DESYNC", one)],
    );
    job.wait_for_marker();
    let (_, d) = diagnose(marker_pid(&job), Stacks::Off);
    let j = &d.jobs[0];
    assert_eq!(j.verdict, "progressing", "{d:#?}");
    assert!(
        j.moved
            .iter()
            .any(|m| m.starts_with("the desync keys of ranks 0-3 counted ")),
        "{d:#?}"
    );
}

on_each_torch!(
    the_desync_keys_name_the_rank_that_has_not_started_the_collective,
    super::desync_keys
);
