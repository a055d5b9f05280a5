//! The NCCL backend's whole path, run for real over the CPU stand-in for
//! libcuda.so.1 and libnccl.so.2 (tests/standin/standin.c, see
//! tests/common/standin.rs): the real binary in node mode, its library
//! workers loading the stand-in through `--nccl-lib` and
//! PREFLIGHT_CUDA_LIB, the probe, non-blocking init, every operation
//! verified, the sweep, ncclCommAbort at a step's deadline, an init that
//! never completes, a corrupted result, an asynchronous error, no device,
//! and the transport NCCL says it chose judged against the node's
//! InfiniBand ports (a fixture tree behind --root).
//!
//! On a machine with GPUs, tests/gpu/nccl-standin-suite.sh runs this file
//! with the real libraries (only the library paths differ); the tests that
//! need a fault switch say so and return there.

use crate::common;
use crate::common::cluster;

use std::time::Duration;

use cluster::{Outcome, local, run_args};
use common::standin::{Libs, libs, standin};
use common::{Report, Verdict};
use preflight::schema::BackendReport;

/// Slow only when something waits without a deadline: every run here has
/// a `--timeout` of 60 s at most.
const MARGIN: Duration = Duration::from_secs(120);

use crate::common::serial;

/// `ranks` ranks of the job in node mode on this machine, the nccl
/// backend required, over `libs`; `extra` flags, `env` besides.
fn node(libs: &Libs, ranks: u32, extra: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut args = run_args("60s");
    let nccl = libs.nccl.display().to_string();
    let n = ranks.to_string();
    args.extend(
        [
            "--nproc-per-node",
            &n,
            "--backends",
            "nccl",
            "--nccl-lib",
            &nccl,
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args.extend(extra.iter().map(|s| s.to_string()));
    let cuda = libs.cuda.display().to_string();
    let mut all: Vec<(&str, &str)> = vec![
        ("PREFLIGHT_CUDA_LIB", cuda.as_str()),
        ("PREFLIGHT_TOKEN", "646f4fcbf27a3cd0005a747761d76a5c"),
        ("PREFLIGHT_STANDIN_DEVICES", n.as_str()),
    ];
    all.extend_from_slice(env);
    local("node", &args, &all).finish(MARGIN)
}

/// A run that must fail in the nccl backend: exit 1, the backend's verdict
/// `fail`; the report and the backend's part of it.
fn failing(
    libs: &Libs,
    ranks: u32,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Report, BackendReport) {
    let out = node(libs, ranks, extra, env);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let report = out.report();
    let b = report.backend("nccl").clone();
    assert_eq!(b.verdict, "fail", "{b:#?}");
    (report, b)
}

/// A fault-matrix row's promise (docs/faults.md): the run's verdict within
/// `secs` (its `duration_ms`), generous on a loaded machine and far below
/// the 60 s the run may take.
fn within(report: &Report, secs: u64) {
    let ms = report.duration_ms;
    assert!(
        ms < secs * 1000,
        "verdict after {ms} ms, promised within {secs} s"
    );
}

fn op_status<'a>(b: &'a BackendReport, op: &str) -> &'a str {
    b.ops
        .iter()
        .find(|o| o.op == op)
        .map_or("", |o| o.status.as_str())
}

/// The failed operation's text: the report's `ended`, the failing op's
/// detail and the library's log lines, together.
fn failure_text(b: &BackendReport) -> String {
    format!(
        "{} | {:?} | {:?}",
        b.ended.as_deref().unwrap_or(""),
        b.ops,
        b.log
    )
}

/// 1 to 4 ranks, one per device: the library found and named, every
/// operation verified element by element in f32 and i32, the sweep
/// measured for each operation at every size up to the largest.
#[test]
fn one_to_four_ranks_verify_every_operation_and_sweep() {
    let Some(libs) = libs() else { return };
    let _serial = serial();
    for ranks in 1..=libs.max_ranks.min(4) {
        let out = node(
            libs,
            ranks,
            &[
                "--collective",
                "full",
                "--max-size",
                "256KiB",
                "--iters",
                "2",
                "--warmup",
                "1",
            ],
            &[],
        );
        assert_eq!(out.code, 0, "{ranks} ranks: {}\n{}", out.stdout, out.stderr);
        let report = out.report();
        let b = report.backend("nccl");
        assert_eq!(b.verdict, "pass", "{ranks} ranks: {b:#?}");
        if libs.standin {
            assert!(
                b.library
                    .as_deref()
                    .is_some_and(|l| l.starts_with("NCCL 2.32.3 at ")),
                "{b:#?}"
            );
        }
        for op in ["allreduce", "broadcast", "allgather", "sendrecv", "barrier"] {
            assert_eq!(op_status(b, op), "verified", "{ranks} ranks, {op}: {b:#?}");
        }
        let sweep = &b.sweep;
        for op in ["allreduce", "allgather", "broadcast"] {
            assert!(
                sweep
                    .iter()
                    .any(|r| r.op.name() == op && r.bytes == 256 * 1024),
                "{ranks} ranks: no {op} row at 256 KiB: {sweep:?}"
            );
        }
        assert!(b.reason.contains("rank 0 on GPU 0"), "{b:#?}");
    }
}

/// A rank whose operations above 64 KiB never complete: the others wait
/// on it until the step's deadline, where each ends its own operation with
/// ncclCommAbort (said in the worker's log) instead of being killed, and
/// the failure is at the first size above the hang; the sizes below it
/// were measured and kept.
#[test]
fn a_hang_at_one_size_ends_in_ncclcommabort_at_the_step_deadline() {
    let Some(libs) = standin() else { return };
    let _serial = serial();
    let (report, b) = failing(
        libs,
        2,
        &[
            "--collective",
            "full",
            "--max-size",
            "256KiB",
            "--step-timeout",
            "3s",
            "--iters",
            "1",
            "--warmup",
            "0",
        ],
        &[("PREFLIGHT_STANDIN_HANG", "1:65536")],
    );
    within(&report, 12);
    let text = failure_text(&b);
    // Said by the worker after the call returned, not by the report's
    // template: the rank ended its operation itself.
    assert!(
        b.log.iter().any(|l| l.contains("ncclCommAbort done")),
        "{text}"
    );
    // The ranks that waited to the deadline are named and none is blamed
    // alone (NCCL cannot say which held up the other): both, or rank 1
    // alone when its abort came first and rank 0 saw its connection close.
    let ended = b.ended.as_deref().unwrap();
    assert!(
        (ended.starts_with("allreduce timed out at 128 KiB on ranks 0, 1 (every rank): ")
            || (ended.starts_with("allreduce timed out at 128 KiB on rank 1: rank 1 says: ")
                && ended.contains("; then rank 0 saw the aborts (")))
            && ended.contains("the library does not say which rank held up the others"),
        "{text}"
    );
    assert!(
        b.sweep.iter().any(|r| r.bytes == 65536),
        "the sizes below the hang were kept: {b:#?}"
    );
}

/// A rank that never completes init: every rank's non-blocking init is
/// still in progress at its deadline, and is aborted; the stage fails at
/// init by the step's deadline, not the run's (which would make it
/// incomplete), and every rank is named.
#[test]
fn an_init_that_never_completes_is_aborted_at_its_deadline() {
    let Some(libs) = standin() else { return };
    let _serial = serial();
    let (report, b) = failing(
        libs,
        2,
        &["--step-timeout", "2s"],
        // Init's deadline is then twice the step's, 4 s, not the 30 s floor.
        &[
            ("PREFLIGHT_STANDIN_INIT_HANG", "1"),
            ("PREFLIGHT_TEST_INIT_FLOOR_MS", "0"),
        ],
    );
    within(&report, 20);
    let text = failure_text(&b);
    assert!(
        b.ended
            .as_deref()
            .unwrap()
            .starts_with("init did not finish on ranks 0, 1 (every rank): rank 0 says: deadline passed: NCCL init of rank 0 of 2 still in progress"),
        "{text}"
    );
    // Ended by init's own deadline (the step's), not the run's: a fail,
    // not an incomplete run.
    assert_eq!(report.verdict, Verdict::NotReady, "{report}");
}

/// A rank whose results are wrong from 4 KiB on: the verification names
/// the operation and the rank whose result differs; no bandwidth is
/// reported for a wrong result.
#[test]
fn a_corrupted_result_is_detected_and_the_rank_named() {
    let Some(libs) = standin() else { return };
    let _serial = serial();
    let (report, b) = failing(
        libs,
        2,
        &["--collective", "full", "--max-size", "64KiB"],
        &[("PREFLIGHT_STANDIN_CORRUPT", "1:4096")],
    );
    within(&report, 10);
    let ended = b.ended.as_deref().unwrap();
    // The stand-in flips the byte holding the float's exponent: 5 arrives
    // as a denormal, said as a number a person can read.
    assert!(
        ended.starts_with("allreduce float at 4 KiB gave a wrong result on rank 1: element 0 expected 5 got 1.469368e-38"),
        "{ended}"
    );
    assert!(
        !b.sweep
            .iter()
            .any(|r| r.bytes >= 4096 && r.op.name() == "allreduce"),
        "a wrong result got a bandwidth: {b:#?}"
    );
}

/// An asynchronous error (ncclRemoteError, a peer's connection gone):
/// ncclCommGetAsyncError reports it while the rank waits, and the report
/// carries NCCL's words for it, the name and ncclGetLastError's text.
#[test]
fn an_async_error_is_reported_in_nccls_words() {
    let Some(libs) = standin() else { return };
    let _serial = serial();
    let (report, b) = failing(
        libs,
        2,
        &["--collective", "full", "--max-size", "256KiB"],
        &[("PREFLIGHT_STANDIN_ASYNC_ERROR", "1:65536")],
    );
    within(&report, 10);
    let ended = b.ended.as_deref().unwrap();
    // Both ranks hold the library's remote error (rank 1's injected, rank
    // 0's from rank 1's leaving, on its send or its receive, whichever
    // comes first): neither failed by itself, and each names the other.
    let on_0 = ended.starts_with("allreduce failed at 64 KiB on rank 0")
        && (ended.contains("Connection closed by remote peer rank 1")
            || ended.contains("NET/Socket : send to rank 1 failed"));
    let on_1 = ended.starts_with("allreduce failed at 64 KiB on rank 1")
        && ended.contains("Connection closed by remote peer rank 0");
    assert!(
        (on_0 || on_1)
            && ended.contains("remote process exited or there was a network error (ncclResult 6)"),
        "{ended}"
    );
}

/// A driver with no devices: cuInit says CUDA_ERROR_NO_DEVICE, the probe
/// says so, no communicator is made, and the backend, named on the
/// command line, is not ready.
#[test]
fn a_driver_without_devices_is_said_as_such() {
    let Some(libs) = standin() else { return };
    let _serial = serial();
    let mut args = run_args("30s");
    let (nccl_lib, cuda) = (
        libs.nccl.display().to_string(),
        libs.cuda.display().to_string(),
    );
    args.extend(
        [
            "--nproc-per-node",
            "2",
            "--backends",
            "nccl",
            "--nccl-lib",
            &nccl_lib,
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let out = local(
        "node",
        &args,
        &[
            ("PREFLIGHT_CUDA_LIB", cuda.as_str()),
            ("PREFLIGHT_STANDIN_DEVICES", "0"),
        ],
    )
    .finish(MARGIN);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    let report = out.report();
    let b = report.backend("nccl");
    assert!(!b.available, "{b:#?}");
    assert!(b.reason.contains("0 devices"), "{b:#?}");
}

/// The network NCCL says it chose, judged against the node's InfiniBand
/// ports as the node's tree shows them (--root): IB taken is a note; a
/// fall back to sockets on a node with active IB ports is a warning that
/// quotes NCCL's reason.
#[test]
fn the_network_nccl_chose_is_judged_against_the_nodes_ib_ports() {
    let Some(libs) = standin() else { return };
    let _serial = serial();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/h100-ib-healthy/root");
    let ib = node(
        libs,
        2,
        &["--root", root],
        &[("PREFLIGHT_STANDIN_NET", "ib")],
    );
    assert_eq!(ib.code, 0, "{}\n{}", ib.stdout, ib.stderr);
    let report = ib.report();
    // The notes as one text, as the checks below read them.
    let notes = report.backend("nccl").notes.join("\n");
    assert!(notes.contains("NET/IB over mlx5_0:1/IB"), "{notes}");
    assert!(!notes.contains("warning"), "{notes}");

    let fallback = node(
        libs,
        2,
        &["--root", root],
        &[("PREFLIGHT_STANDIN_NET", "ib-fallback")],
    );
    let report = fallback.report();
    let notes = report.backend("nccl").notes.join("\n");
    assert!(
        notes.contains("fell back to sockets although this node has active RDMA ports")
            && notes.contains("NET/IB : No device found."),
        "{notes}"
    );
    assert_eq!(fallback.status("collective.nccl"), "warn", "{report}");
}

/// More ranks on a node than the GPUs they see: the backend gives each
/// rank its local rank modulo the devices (one rank per GPU; a process
/// driving several GPUs is not what it does), so two ranks share GPU 0,
/// and NCCL's duplicate check fails init; the report carries NCCL's words
/// and says how the ranks came to share it. With the real library, the
/// ranks are shown one device (CUDA_VISIBLE_DEVICES=0) to the same end.
#[test]
fn two_ranks_on_one_gpu_fail_init_with_nccls_duplicate_check() {
    let Some(libs) = libs() else { return };
    let _serial = serial();
    let (report, b) = failing(
        libs,
        2,
        &["--step-timeout", "5s"],
        &[
            ("PREFLIGHT_STANDIN_DEVICES", "1"),
            ("CUDA_VISIBLE_DEVICES", "0"),
        ],
    );
    within(&report, 10);
    let ended = b.ended.as_deref().unwrap();
    assert!(
        ended.starts_with("init failed on rank ")
            && ended.contains("Duplicate GPU detected : rank ")
            && ended.contains("took GPU 0 of the 1 it sees"),
        "{ended}"
    );
}
