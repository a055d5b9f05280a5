//! The oneCCL backend for real: oneCCL 2022's C API on CPU (the PyPI
//! wheels tests/setup/collective-libs.sh caches), ranks as plain processes
//! on loopback, each running oneCCL in its worker process. Also the 2021
//! library (C++ API only) reported as unsupported, a missing library as
//! optional or required, and a rank that stops mid-sweep named while the
//! others' workers are killed at the deadline.
//!
//! Skips with a reason when the libraries are absent, unless
//! PREFLIGHT_REQUIRE_LIBS=1 (CI), which makes that a failure.

use crate::common;
use crate::common::cluster;

use std::time::Duration;

use cluster::{Outcome, Proc, local, run_args};
use preflight::schema::BackendReport;

use crate::common::serial;

const MARGIN: Duration = Duration::from_secs(120);

/// A cached library, or `None` after saying why (a failure under
/// PREFLIGHT_REQUIRE_LIBS=1).
fn lib(var: &str, relative: &str) -> Option<String> {
    common::cached_lib(var, relative).map(|p| p.display().to_string())
}

fn oneccl_2022() -> Option<String> {
    lib("PREFLIGHT_TEST_ONECCL_LIB", "oneccl/lib/libccl.so.2")
}

/// Starts `world` ranks on loopback; `extra` arguments and `env` on every
/// rank; `per_rank` adds variables to one rank.
fn ranks(world: u32, extra: &[String], env: &[(&str, &str)]) -> Vec<Outcome> {
    ranks_until("60s", world, extra, env)
}

/// As `ranks`, with the run's `--timeout`.
fn ranks_until(timeout: &str, world: u32, extra: &[String], env: &[(&str, &str)]) -> Vec<Outcome> {
    let port = cluster::free_port().to_string();
    let mut args = run_args(timeout);
    args.extend(extra.iter().cloned());
    let w = world.to_string();
    let procs: Vec<Proc> = (0..world)
        .map(|r| {
            let rank = r.to_string();
            let mut e = vec![
                ("RANK", rank.as_str()),
                ("WORLD_SIZE", w.as_str()),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port.as_str()),
                ("PREFLIGHT_TOKEN", "34276ebbcd4a55d87d8b3839bf6f53af"),
            ];
            e.extend_from_slice(env);
            local(&format!("rank{r}"), &args, &e)
        })
        .collect();
    procs.into_iter().map(|p| p.finish(MARGIN)).collect()
}

fn all_exit(out: &[Outcome], code: i32) {
    for o in out {
        assert_eq!(o.code, code, "{}: {}\n{}", o.label, o.stdout, o.stderr);
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn two_and_four_ranks_verify_every_operation() {
    let Some(lib) = oneccl_2022() else { return };
    let _serial = serial();
    for world in [2u32, 4] {
        let out = ranks(
            world,
            &args(&["--backends", "tcp,oneccl", "--oneccl-lib", &lib]),
            &[],
        );
        all_exit(&out, 0);
        for o in &out {
            let report = o.report();
            let b = report.backend("oneccl");
            assert_eq!(b.verdict, "pass", "world {world}: {b:#?}");
            assert!(b.available, "{b:#?}");
            let ops = &b.ops;
            assert_eq!(ops.len(), 5, "{b:#?}");
            for op in ops {
                assert_eq!(op.status, "verified", "world {world}: {op:#?}");
            }
            let library = b.library.as_deref().unwrap_or_default();
            assert!(
                library.starts_with("oneCCL 2022") && library.ends_with("libccl.so.2"),
                "{library}"
            );
            // The loopback interface the ranks met on, for oneCCL's store.
            let set = &b.env_set;
            assert!(set.iter().any(|s| s == "CCL_KVS_IFACE=lo"), "{set:?}");
            assert!(!b.sweep.is_empty(), "{b:#?}");
            assert_eq!(common::status(&report, "collective.oneccl"), "pass");
        }
    }
}

/// Three ranks sweep ×4 up to 256 KiB, one iteration a step, and rank 2
/// stops from 128 KiB on; `timeout` is the run's, `step_timeout` each
/// step's.
fn held_at_128k(lib: &str, timeout: &str, step_timeout: &str) -> Vec<Outcome> {
    ranks_until(
        timeout,
        3,
        &args(&[
            "--backends",
            "oneccl",
            "--oneccl-lib",
            lib,
            "--collective",
            "full",
            "--max-size",
            "256KiB",
            "--step-factor",
            "4",
            "--warmup",
            "0",
            "--iters",
            "1",
            "--step-timeout",
            step_timeout,
        ]),
        &[("PREFLIGHT_TEST_COLL_HANG", "2:65536")],
    )
}

/// Steps below the hang (×4: …, 8 KiB, 32 KiB) kept their verified rows,
/// though the waiting ranks' workers were killed.
fn kept_rows_below_the_hang(b: &BackendReport) {
    assert!(b.sweep.iter().any(|r| r.bytes == 32768), "{b:#?}");
}

/// oneCCL cannot be interrupted: the ranks waiting on the held one are
/// killed at the step's deadline by their own rank, which names the rank
/// that stopped taking part.
#[test]
fn a_rank_that_stops_mid_sweep_is_named_and_nothing_hangs() {
    let Some(lib) = oneccl_2022() else { return };
    let _serial = serial();
    let out = held_at_128k(&lib, "60s", "3s");
    all_exit(&out, 1);
    for o in &out {
        let report = o.report();
        let b = report.backend("oneccl");
        assert_eq!(b.verdict, "fail", "{b:#?}");
        let ended = b.ended.as_deref().unwrap_or_default();
        assert!(
            ended.contains("rank 2") && ended.contains("128 KiB"),
            "{}: {ended}",
            o.label
        );
        kept_rows_below_the_hang(b);
    }
}

/// The run's deadline comes long before the step's: the worker stuck in
/// oneCCL is killed then, and the stage is incomplete, not failed.
#[test]
fn the_runs_deadline_ends_a_stuck_library_step_as_incomplete() {
    let Some(lib) = oneccl_2022() else { return };
    let _serial = serial();
    let out = held_at_128k(&lib, "15s", "120s");
    all_exit(&out, 3);
    for o in &out {
        let report = o.report();
        let b = report.backend("oneccl");
        assert_eq!(b.verdict, "incomplete", "{b:#?}");
        let ended = b.ended.as_deref().unwrap_or_default();
        assert!(
            ended.contains("the run's deadline (--timeout) came during allreduce at 128 KiB"),
            "{}: {ended}",
            o.label
        );
        kept_rows_below_the_hang(b);
        // The run's deadline ended it, as `ended` says; the step's (120 s)
        // would have read "timed out at".
        assert_eq!(common::status(&report, "collective.oneccl"), "error");
        assert!(!ended.contains("timed out at"), "{}: {ended}", o.label);
    }
}

#[test]
fn the_2021_library_is_an_unsupported_version() {
    let Some(old) = lib(
        "PREFLIGHT_TEST_ONECCL_2021_LIB",
        "oneccl-2021/lib/libccl.so.1",
    ) else {
        return;
    };
    let _serial = serial();
    // Named on the command line: required, so not ready.
    let out = ranks(
        2,
        &args(&["--backends", "tcp,oneccl", "--oneccl-lib", &old]),
        &[],
    );
    all_exit(&out, 1);
    let report = out[0].report();
    let b = report.backend("oneccl");
    assert_eq!(b.verdict, "skip", "{b:#?}");
    let reason = &b.reason;
    assert!(
        reason.contains("unsupported oneCCL version") && reason.contains("2021.16"),
        "{reason}"
    );
    let msg = out[0].message("collective.oneccl");
    assert!(msg.contains("required, but not available"), "{msg}");
}

#[test]
fn a_missing_library_is_optional_unless_the_checklist_requires_it() {
    let _serial = serial();
    let missing = "/nonexistent/libccl.so.2";
    // auto: skipped with what was tried; ready.
    let out = ranks(
        2,
        &args(&["--backends", "auto"]),
        &[("PREFLIGHT_ONECCL_LIB", missing)],
    );
    all_exit(&out, 0);
    let report = out[1].report();
    let b = report.backend("oneccl");
    assert_eq!(b.verdict, "skip", "{b:#?}");
    assert!(b.reason.contains(missing), "{}", b.reason);
    assert_eq!(common::status(&report, "collective.oneccl"), "skip");

    // The checklist requires it: not ready, on every rank, with the reason.
    let (_dir, path) = common::checklist(
        "checks:\n  - id: job.needs_oneccl\n    kind: collective_backend\n    backend: oneccl\n",
    );
    let out = ranks(
        2,
        &args(&[
            "--backends",
            "auto",
            "--checks",
            &path.display().to_string(),
        ]),
        &[("PREFLIGHT_ONECCL_LIB", missing)],
    );
    all_exit(&out, 1);
    for o in &out {
        assert_eq!(o.status("job.needs_oneccl"), "fail");
        let msg = o.message("job.needs_oneccl");
        assert!(
            msg.contains("oneccl is required but not available") && msg.contains(missing),
            "{msg}"
        );
    }
}

/// `CCL_YIELD=sched_yield` is set where the job left it unset and the node
/// has fewer than two cores per local rank (busy polling starves the
/// ranks), listed in `env_set`; where the operator set it, their value
/// stands and nothing is listed.
#[test]
fn ccl_yield_is_set_only_where_the_job_left_it_unset() {
    let Some(lib) = oneccl_2022() else { return };
    let _serial = serial();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let crowded = cores < 2 * 2;
    for operator in [None, Some("pause")] {
        let port = cluster::free_port().to_string();
        let args = {
            let mut a = run_args("60s");
            a.extend(args(&["--backends", "oneccl", "--oneccl-lib", &lib]));
            a
        };
        let procs: Vec<Proc> = ["0", "1"]
            .iter()
            .map(|r| {
                let mut e = vec![
                    ("RANK", *r),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_RANK", *r),
                    ("LOCAL_WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", port.as_str()),
                    ("PREFLIGHT_TOKEN", "34276ebbcd4a55d87d8b3839bf6f53af"),
                ];
                if let Some(v) = operator {
                    e.push(("CCL_YIELD", v));
                }
                local(&format!("rank{r}"), &args, &e)
            })
            .collect();
        let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
        all_exit(&out, 0);
        let report = out[0].report();
        // The list as one text, as the checks below read it.
        let set = format!("{:?}", report.backend("oneccl").env_set);
        let expected = crowded && operator.is_none();
        assert_eq!(
            set.contains("CCL_YIELD=sched_yield"),
            expected,
            "{cores} cores, CCL_YIELD={operator:?}: {set}"
        );
        assert!(!set.contains("CCL_YIELD=pause"), "{set}");
    }
}

/// One rank without the library: every rank skips oneccl alike (a
/// collective needs all of them), and the reason names that rank; the job
/// is ready on the other backends.
#[test]
fn one_rank_lacking_a_backend_makes_every_rank_skip_it_naming_the_rank() {
    let Some(lib) = oneccl_2022() else { return };
    let _serial = serial();
    let missing = "/nonexistent/libccl.so.2";
    let port = cluster::free_port().to_string();
    let args = {
        let mut a = run_args("60s");
        a.extend(args(&["--backends", "auto"]));
        a
    };
    let procs: Vec<Proc> = [("0", lib.as_str()), ("1", missing)]
        .iter()
        .map(|(r, l)| {
            let e = vec![
                ("RANK", *r),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port.as_str()),
                ("PREFLIGHT_TOKEN", "34276ebbcd4a55d87d8b3839bf6f53af"),
                ("PREFLIGHT_ONECCL_LIB", *l),
            ];
            local(&format!("rank{r}"), &args, &e)
        })
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 0);
    for o in &out {
        let report = o.report();
        let b = report.backend("oneccl");
        assert_eq!(b.verdict, "skip", "{}: {b:#?}", o.label);
        let reason = &b.reason;
        assert!(reason.contains("rank 1"), "{}: {reason}", o.label);
        assert!(reason.contains(missing), "{}: {reason}", o.label);
        assert_eq!(report.backend("tcp").verdict, "pass", "{report}");
    }
}

/// The library workers of this process: its children running the hidden
/// `collective-worker` command.
fn workers_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        // pid (comm) state ppid ...: the comm may hold spaces, so after ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        if ppid == Some(pid) && String::from_utf8_lossy(&cmdline).contains("collective-worker") {
            out.push(child);
        }
    }
    out
}

/// A rank killed with SIGKILL (no chance to clean up) takes its library
/// worker with it (PR_SET_PDEATHSIG), even a worker that could not notice
/// (stopped here, as one stuck inside a library call): no oneCCL process
/// is left behind holding cores and sockets after the job's preflight.
#[test]
fn a_library_worker_dies_with_its_rank() {
    let Some(lib) = oneccl_2022() else { return };
    let _serial = serial();
    let port = cluster::free_port().to_string();
    let mut args = run_args("120s");
    args.extend(self::args(&[
        "--backends",
        "oneccl",
        "--oneccl-lib",
        &lib,
        "--collective",
        "full",
        "--max-size",
        "256KiB",
        "--step-timeout",
        "100s",
    ]));
    let procs: Vec<Proc> = ["0", "1"]
        .iter()
        .map(|r| {
            let e = vec![
                ("RANK", *r),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port.as_str()),
                ("PREFLIGHT_TOKEN", "34276ebbcd4a55d87d8b3839bf6f53af"),
                // Rank 1 stops at 64 KiB: rank 0's worker waits in oneCCL.
                ("PREFLIGHT_TEST_COLL_HANG", "1:65536"),
            ];
            local(&format!("rank{r}"), &args, &e)
        })
        .collect();
    // Rank 0's worker, once it runs and has connected to its rank: it
    // asks the kernel for its parent's death signal before that, so a
    // worker stopped earlier (just after its exec) would never get it.
    let connected = |w: u32| {
        std::fs::read_dir(format!("/proc/{w}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|f| {
                std::fs::read_link(f.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("socket:["))
            })
        })
    };
    let start = std::time::Instant::now();
    let worker = loop {
        if let Some(w) = workers_of(procs[0].pid).into_iter().find(|w| connected(*w)) {
            break w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "rank 0 never started its oneCCL worker"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let signal = |sig: &str, pid: u32| {
        let sent = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill {sig} {pid}");
    };
    // Stopped, the worker cannot notice its rank's end by itself (a closed
    // pipe): only the kernel's death signal can end it now.
    signal("-STOP", worker);
    signal("-KILL", procs[0].pid);
    let gone = std::time::Instant::now();
    while std::path::Path::new(&format!("/proc/{worker}")).exists()
        && std::fs::read_to_string(format!("/proc/{worker}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
    {
        if gone.elapsed() > Duration::from_secs(30) {
            signal("-KILL", worker);
            panic!("rank 0's worker {worker} outlived its rank");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(procs);
}
