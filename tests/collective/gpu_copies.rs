//! `gpu_bandwidth` and `gpu_memory_test` over the CUDA stand-in's copies
//! (tests/standin/copies.c: each copy's time modelled from its link), on
//! the HGX H100 tree's eight GPUs (fixtures/h100-ib-healthy: Gen5 x16
//! links, 63.0 GB/s after encoding): a GPU at half rate, one slow GPU
//! among eight, two behind a starved switch, a hung GPU, the profile's
//! floors, a stuck bit, the budget.

use std::time::{Duration, Instant};

use crate::common::standin::standin;
use crate::common::{self, Report, checklist, message, result, status};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/h100-ib-healthy/root");
const XML: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/h100-ib-healthy/nvidia-smi-q.xml"
);
/// The tree's GPUs, in CUDA's order.
const BUS_IDS: &str = "0000:18:00.0,0000:2a:00.0,0000:3a:00.0,0000:5d:00.0,0000:9a:00.0,0000:ab:00.0,0000:ba:00.0,0000:db:00.0";

/// Runs `checks` on the tree over the stand-in's eight GPUs (53 GB/s host
/// copies, as an H100 on Gen5 x16 reaches, and 128 MiB each), with `env`.
fn on_tree(checks: &str, extra: &[&str], env: &[(&str, &str)]) -> Option<(i32, Report)> {
    on_root(ROOT, checks, extra, env)
}

fn on_root(
    root: &str,
    checks: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Option<(i32, Report)> {
    let libs = standin()?;
    let (_dir, file) = checklist(checks);
    let cuda = libs.cuda.display().to_string();
    let mut all = vec![
        ("PREFLIGHT_CUDA_LIB", cuda.as_str()),
        ("PREFLIGHT_STANDIN_BUS_IDS", BUS_IDS),
        ("PREFLIGHT_STANDIN_HOST_GBPS", "53"),
        ("PREFLIGHT_STANDIN_MEMORY", "134217728"),
    ];
    all.extend_from_slice(env);
    let mut args = vec!["--root", root];
    args.extend_from_slice(extra);
    Some(common::check(&file, &args, &all))
}

/// Copies of tens of MiB, as a bandwidth check times them on a GPU.
const BANDWIDTH: &str =
    "checks:\n  - {id: gpu.copy, kind: gpu_bandwidth, area: accelerators, sizes: [16MiB, 32MiB]}\n";

fn bandwidth(env: &[(&str, &str)]) -> Option<Report> {
    let (_, report) = on_tree(BANDWIDTH, &[], env)?;
    Some(report)
}

/// The GPUs the copy check's message names ("GPU N (").
fn named(report: &Report) -> Vec<usize> {
    let text = message(report, "gpu.copy");
    (0..8)
        .filter(|i| text.contains(&format!("GPU {i} (")))
        .collect()
}

#[test]
fn eight_healthy_gpus_reach_their_links_and_each_other() {
    // Gigabytes of the stand-in's copies: alone.
    let _serial = crate::common::serial();
    let Some(report) = bandwidth(&[]) else { return };
    assert_eq!(status(&report, "gpu.copy"), "pass", "{report}");
    let copies = result(&report, "gpu.copy").copies.clone().expect("copies");
    let buses: Vec<&str> = copies.gpus.iter().map(|g| g.bus_id.as_str()).collect();
    assert_eq!(buses.join(","), BUS_IDS, "{report}");
    for g in &copies.gpus {
        // Best of three runs of a modelled 53 GB/s copy.
        assert!((50.0..=53.5).contains(&g.h2d_gbps), "{g:?}");
        assert!((50.0..=53.5).contains(&g.d2h_gbps), "{g:?}");
        assert!(g.d2d_gbps > 900.0, "{g:?}");
        assert!(g.together_h2d_gbps.is_some_and(|r| r > 45.0), "{g:?}");
    }
}

#[test]
fn a_gpu_at_half_rate_is_named_against_its_link_and_its_peers() {
    // Gigabytes of the stand-in's copies: alone.
    let _serial = crate::common::serial();
    let Some(report) = bandwidth(&[("PREFLIGHT_STANDIN_SLOW_GPU", "3:0.5")]) else {
        return;
    };
    assert_eq!(status(&report, "gpu.copy"), "fail", "{report}");
    let m = message(&report, "gpu.copy");
    assert_eq!(named(&report), [3], "{m}");
    assert!(
        m.contains("GPU 3 (0000:5d:00.0): host-to-device 26."),
        "{m}"
    );
    assert!(m.contains("42% of its x16 32 GT/s link's 63.0"), "{m}");
    assert!(m.contains("the node's GPUs reach 53.0, median"), "{m}");
}

/// A GPU capable of Gen5 in a port capable of Gen4 runs at Gen4: the
/// slower end is what the copies are held to.
#[test]
fn the_link_is_the_slower_of_the_gpu_and_its_port() {
    // Gigabytes of the stand-in's copies: alone.
    let _serial = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let copied = std::process::Command::new("cp")
        .args(["-a", ROOT])
        .arg(&root)
        .status()
        .unwrap();
    assert!(copied.success());
    // GPU 0 (0000:18:00.0) hangs from the switch port 0000:17:00.0.
    let port = root.join("sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0");
    std::fs::write(port.join("max_link_speed"), "16.0 GT/s PCIe\n").unwrap();
    // 0.4 of 53: 21.2 GB/s, 34% of Gen5 x16 but 67% of Gen4 x16's 31.5.
    let Some((_, report)) = on_root(
        root.to_str().unwrap(),
        BANDWIDTH,
        &[],
        &[("PREFLIGHT_STANDIN_SLOW_GPU", "0:0.4")],
    ) else {
        return;
    };
    let m = message(&report, "gpu.copy");
    assert!(m.contains("67% of its x16 16 GT/s link's 31.5"), "{m}");
}

#[test]
fn a_host_slow_to_queue_the_copies_does_not_slow_the_gpus() {
    // Gigabytes of the stand-in's copies: alone.
    let _serial = crate::common::serial();
    // 2 ms between two calls, where a 16 MiB copy lasts 0.32 ms: a stream
    // not held until all its copies are queued would run dry between
    // them, and its events would time the host's pauses.
    let Some(report) = bandwidth(&[("PREFLIGHT_STANDIN_QUEUE_PAUSE_US", "2000")]) else {
        return;
    };
    assert_eq!(status(&report, "gpu.copy"), "pass", "{report}");
    let copies = result(&report, "gpu.copy").copies.clone().expect("copies");
    for g in &copies.gpus {
        assert!((50.0..=53.5).contains(&g.h2d_gbps), "{g:?}");
        assert!((50.0..=53.5).contains(&g.d2h_gbps), "{g:?}");
        assert!(g.together_h2d_gbps.is_some_and(|r| r > 45.0), "{g:?}");
    }
}

#[test]
fn one_slow_gpu_among_eight_is_the_odd_one_out() {
    // Gigabytes of the stand-in's copies: alone.
    let _serial = crate::common::serial();
    // 0.75 of 60 GB/s: 45.0, within 70% of its link (44.1) but not of
    // its peers (80% of 60).
    let Some(report) = bandwidth(&[
        ("PREFLIGHT_STANDIN_HOST_GBPS", "60"),
        ("PREFLIGHT_STANDIN_SLOW_GPU", "5:0.75"),
    ]) else {
        return;
    };
    assert_eq!(status(&report, "gpu.copy"), "fail", "{report}");
    let m = message(&report, "gpu.copy");
    assert_eq!(named(&report), [5], "{m}");
    assert!(m.contains("the node's GPUs reach 60.0, median"), "{m}");
    assert!(!m.contains("link's"), "{m}");
}

#[test]
fn gpus_behind_a_starved_switch_are_slow_only_together() {
    // Gigabytes of the stand-in's copies: alone.
    let _serial = crate::common::serial();
    // GPUs 2 and 3 share one 53 GB/s uplink: each reaches 53 alone, half
    // of it together.
    let Some(report) = bandwidth(&[("PREFLIGHT_STANDIN_UPLINK", "2:53:1")]) else {
        return;
    };
    assert_eq!(status(&report, "gpu.copy"), "fail", "{report}");
    let m = message(&report, "gpu.copy");
    assert_eq!(named(&report), [2, 3], "{m}");
    assert!(m.contains("with every GPU copying at once"), "{m}");
    assert!(m.contains("a shared PCIe switch or uplink"), "{m}");
    assert!(!m.contains("link's"), "{m}");
}

#[test]
fn a_hung_gpu_is_named_by_the_deadline_and_the_others_still_measured() {
    // Timed, and its single size is the smallest: it runs alone.
    let _serial = crate::common::serial();
    let checks = "checks:\n  - {id: gpu.copy, kind: gpu_bandwidth, area: accelerators, sizes: [16MiB], deadline: 1s}\n";
    let started = Instant::now();
    let Some((code, report)) = on_tree(checks, &[], &[("PREFLIGHT_STANDIN_COPY_HANG", "6")]) else {
        return;
    };
    // One deadline for the hung GPU, well under the check's timeout.
    assert!(started.elapsed() < Duration::from_secs(15), "{report}");
    assert_eq!(code, 1, "{report}");
    let m = message(&report, "gpu.copy");
    assert!(
        m.contains("GPU 6 (0000:ba:00.0): its copies (144 MiB) did not finish within 1s: below 0.15 GB/s, or hung"),
        "{m}"
    );
    assert_eq!(named(&report), [6], "{m}");
    let copies = result(&report, "gpu.copy").copies.clone().expect("copies");
    assert_eq!(copies.gpus.len(), 7, "{report}");
}

#[test]
fn the_profile_floors_hold_every_gpu() {
    // Gigabytes of the stand-in's copies: alone.
    let _serial = crate::common::serial();
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("p.yaml");
    std::fs::write(
        &profile,
        "profile: h100-site\nmatch: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8}\nexpect:\n  floors: {h2d_gbps: 55, d2h_gbps: 40}\n",
    )
    .unwrap();
    let path = profile.display().to_string();
    let Some((_, report)) = on_tree(BANDWIDTH, &["--profile", &path], &[]) else {
        return;
    };
    assert_eq!(status(&report, "gpu.copy"), "fail", "{report}");
    let m = message(&report, "gpu.copy");
    assert_eq!(named(&report), (0..8).collect::<Vec<_>>(), "{m}");
    assert!(
        m.contains("below profile h100-site (") && m.contains("'s floor of 55.0"),
        "{m}"
    );
    assert!(!m.contains("device-to-host"), "{m}");
}

const MEMORY: &str = "checks:\n  - id: gpu.memory\n    kind: gpu_memory_test\n    area: accelerators\n    fraction: 0.125\n    chunk: 1MiB\n    nvidia_smi_xml: XML\n";

fn memory(extra_yaml: &str, env: &[(&str, &str)]) -> Option<Report> {
    let checks = MEMORY.replace("XML", XML) + extra_yaml;
    let (_, report) = on_tree(&checks, &[], env)?;
    Some(report)
}

#[test]
fn a_stuck_bit_is_named_by_gpu_serial_and_address() {
    let _shared = crate::common::shared();
    // Byte 4099 of GPU 2's memory: bit 4 stuck at one.
    let Some(report) = memory("", &[("PREFLIGHT_STANDIN_BAD_BYTE", "2:4099")]) else {
        return;
    };
    assert_eq!(status(&report, "gpu.memory"), "fail", "{report}");
    let m = message(&report, "gpu.memory");
    assert!(
        m.starts_with("GPU 2 (0000:3a:00.0, serial 1654923003708): "),
        "{m}"
    );
    // The stand-in's device 2 starts at 0x7e2000000000; the word holding
    // byte 4099 is the range, with what was written and read.
    assert!(
        m.contains("in 1 range: 0x7e2000001000-0x7e2000001003"),
        "{m}"
    );
    assert!(
        m.contains("(wrote 0x00000001, read 0x10000001, walking ones)"),
        "{m}"
    );
    assert!(!m.contains("GPU 1 (") && !m.contains("GPU 3 ("), "{m}");
}

/// A GPU whose copies hang is named, the others are tested through, and
/// the check ends: nothing waits on the hung GPU's work when its buffers
/// go (the stand-in's context waits for a destroyed stream's work, as the
/// driver's does).
#[test]
fn a_gpu_that_hangs_under_the_memory_test_is_named_and_the_rest_tested() {
    let _serial = crate::common::serial();
    let started = Instant::now();
    let Some(report) = memory("", &[("PREFLIGHT_STANDIN_COPY_HANG", "4")]) else {
        return;
    };
    assert!(started.elapsed() < Duration::from_secs(30), "{report}");
    assert_eq!(status(&report, "gpu.memory"), "fail", "{report}");
    let m = message(&report, "gpu.memory");
    assert!(
        m.starts_with("GPU 4 (0000:9a:00.0, serial 1654923008049): its memory test kernels over ")
            && m.contains("did not finish within 5")
            && m.ends_with("s: the GPU hangs"),
        "{report}"
    );
}

#[test]
fn healthy_memory_passes_every_pattern() {
    let _shared = crate::common::shared();
    let Some(report) = memory("", &[]) else {
        return;
    };
    assert_eq!(status(&report, "gpu.memory"), "pass", "{report}");
    let r = result(&report, "gpu.memory");
    let measured = r.measured.as_deref().unwrap_or_default();
    assert!(
        measured.starts_with("0 bad ranges over 128 MiB on 8 GPUs (5 of 5 passes in "),
        "{report}"
    );
}

#[test]
fn the_memory_test_keeps_to_its_budget() {
    let _shared = crate::common::shared();
    let started = Instant::now();
    let Some(report) = memory("    budget: 1ms\n", &[]) else {
        return;
    };
    assert!(started.elapsed() < Duration::from_secs(20), "{report}");
    assert_eq!(status(&report, "gpu.memory"), "warn", "{report}");
    assert!(
        message(&report, "gpu.memory").contains("passes that fit in 1ms"),
        "{report}"
    );
}

/// `preflight run` with the shipped checklist's memory test alone, at
/// its defaults, over two stand-in GPUs of 64 MiB: the report, and how
/// long the run took.
fn shipped_memory_test(
    state: &std::path::Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Option<(i32, Report, Duration)> {
    let libs = standin()?;
    let mut cmd = std::process::Command::new(common::BIN);
    cmd.args([
        "run",
        "--root",
        ROOT,
        "--only",
        "nvidia.memory_test",
        "--format",
        "json",
    ])
    .arg("--state-dir")
    .arg(state)
    .args(extra)
    .env_clear()
    .env("PATH", common::netns::PATH)
    .env("PREFLIGHT_CUDA_LIB", &libs.cuda)
    .env("PREFLIGHT_STANDIN_DEVICES", "2")
    .env("PREFLIGHT_STANDIN_BUS_IDS", &BUS_IDS[..25])
    .env("PREFLIGHT_STANDIN_MEMORY", "67108864")
    .envs(env.iter().copied());
    let started = Instant::now();
    let out = cmd.output().expect("run preflight");
    Some((
        out.status.code().unwrap_or(-1),
        common::report_of(&out),
        started.elapsed(),
    ))
}

/// The shipped check at its defaults, as `preflight run` runs it: at
/// least nine-tenths of each GPU's free memory tested with every pattern
/// well inside the run's deadline, the pass kept and reused by the next
/// run; a stuck bit named with its GPU and address range.
#[test]
fn the_shipped_memory_test_at_its_defaults_passes_in_the_run_is_kept_and_names_a_stuck_bit() {
    let _serial = crate::common::serial();
    let d = tempfile::tempdir().unwrap();
    let Some((code, report, took)) = shipped_memory_test(&d.path().join("state"), &[], &[]) else {
        return;
    };
    assert_eq!(code, 0, "{report}");
    let r = result(&report, "nvidia.memory_test");
    assert_eq!(status(&report, "nvidia.memory_test"), "pass", "{report}");
    assert!(
        r.message.starts_with(
            "no bad address: 5 passes over 57.6 MiB per GPU (90 % of free) on 2 GPUs in "
        ),
        "{report}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}: {report}");
    let (_, again, _) = shipped_memory_test(&d.path().join("state"), &[], &[]).unwrap();
    assert!(result(&again, "nvidia.memory_test").cached, "{again}");
    // Byte 1,000,003 of GPU 1: bit 4 stuck at one.
    let (code, bad, _) = shipped_memory_test(
        &d.path().join("state-bad"),
        &[],
        &[("PREFLIGHT_STANDIN_BAD_BYTE", "1:1000003")],
    )
    .unwrap();
    assert_eq!(code, 1, "{bad}");
    let m = message(&bad, "nvidia.memory_test");
    assert!(m.starts_with("GPU 1 (0000:2a:00.0): "), "{m}");
    assert!(m.contains("0x7e10000f4240-0x7e10000f4243 (wrote "), "{m}");
    assert!(!m.contains("GPU 0 ("), "{m}");
}

/// The run's deadline caps the budget: memory that tests slowly (the
/// stand-in's at 0.05 GB/s) under `--timeout 8s`, with the check's own
/// 60 s budget, ends with a warning that says how far it got and why,
/// inside the deadline; never "not evaluated".
#[test]
fn the_memory_tests_budget_never_outlives_the_run() {
    let _serial = crate::common::serial();
    let d = tempfile::tempdir().unwrap();
    let Some((code, report, took)) = shipped_memory_test(
        &d.path().join("state"),
        &["--timeout", "8s"],
        &[("PREFLIGHT_STANDIN_MEM_GBPS", "0.05")],
    ) else {
        return;
    };
    assert_eq!(status(&report, "nvidia.memory_test"), "warn", "{report}");
    let m = message(&report, "nvidia.memory_test");
    assert!(
        m.starts_with("no bad address in the 1 of 5 passes that fit in ")
            && m.ends_with("the run's deadline left no more; give the run a longer --timeout"),
        "{m}"
    );
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert_eq!(code, 0, "{report}");
}

/// The memory test's kernels, the PTX text nccl-sys ships, compile with
/// NVIDIA's own ptxas (CUDA 12.9, from PyPI) for each GPU generation a
/// node may have, Maxwell to Blackwell, as each node's driver compiles
/// them when they load.
#[test]
fn the_memory_tests_ptx_compiles_for_every_gpu_generation() {
    let _shared = crate::common::shared();
    let Some(ptxas) = common::cached_lib("PREFLIGHT_TEST_PTXAS", "ptxas/ptxas") else {
        return;
    };
    let ptx = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/nccl-sys/src/patterns.ptx"
    );
    let d = tempfile::tempdir().unwrap();
    for arch in ["sm_50", "sm_70", "sm_80", "sm_90", "sm_100"] {
        let out = std::process::Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg(ptx)
            .arg("-o")
            .arg(d.path().join(format!("{arch}.cubin")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{arch}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A fixture tree has no GPU: without a driver named, both kinds skip
/// and say how to name one.
#[test]
fn a_tree_without_a_named_driver_skips() {
    let _shared = crate::common::shared();
    let (_dir, file) = checklist(
        &(BANDWIDTH.to_string()
            + "  - {id: gpu.memory, kind: gpu_memory_test, area: accelerators}\n"),
    );
    let (code, report) = common::check(&file, &["--root", ROOT], &[]);
    assert_eq!(code, 0, "{report}");
    for id in ["gpu.copy", "gpu.memory"] {
        assert_eq!(status(&report, id), "skip", "{report}");
        assert!(
            message(&report, id).contains("PREFLIGHT_CUDA_LIB"),
            "{report}"
        );
    }
}

#[test]
fn copy_sizes_and_fractions_are_held_to_what_a_gpu_can_take() {
    let _shared = crate::common::shared();
    for (yaml, says) in [
        ("sizes: [3]", "`sizes`: 3 is not a copy size"),
        ("sizes: []", "`sizes` needs at least one size"),
        ("link_fraction: 1.5", "`link_fraction` must be above 0"),
        ("runs: 0", "`runs` must be 1 to 100"),
    ] {
        let (_dir, file) = checklist(&format!(
            "checks:\n  - {{id: gpu.copy, kind: gpu_bandwidth, area: accelerators, {yaml}}}\n"
        ));
        let out = std::process::Command::new(common::BIN)
            .arg("validate")
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{yaml}: {err}");
        assert!(err.contains(says) && err.contains(":2:"), "{yaml}: {err}");
    }
}

/// `baseline capture --from` a healthy run's report writes the copy
/// floors at the fraction of the GPUs' median, and a profile with them
/// validates and holds the next run.
#[test]
fn baseline_capture_writes_the_copy_floors() {
    // Gigabytes of the stand-in's copies: alone.
    let _serial = crate::common::serial();
    let Some((code, report)) = on_tree(BANDWIDTH, &[], &[]) else {
        return;
    };
    assert_eq!(code, 0, "{report}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.json");
    std::fs::write(&file, serde_json::to_string(&report.0).unwrap()).unwrap();
    let captured = std::process::Command::new(common::BIN)
        .args([
            "baseline",
            "capture",
            "--name",
            "h100-site",
            "--root",
            ROOT,
            "--from",
        ])
        .arg(&file)
        .args(["--fraction", "0.5"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&captured.stdout).to_string();
    assert_eq!(
        captured.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&captured.stderr)
    );
    assert!(
        text.contains("    # 8 GPUs' copies, median 53.0 GB/s host-to-device"),
        "{text}"
    );
    assert!(text.contains("    h2d_gbps: 26.5"), "{text}");
    assert!(text.contains("    d2h_gbps: 26.5"), "{text}");
    let profile = dir.path().join("p.yaml");
    std::fs::write(&profile, &text).unwrap();
    let path = profile.display().to_string();
    let Some((code, held)) = on_tree(BANDWIDTH, &["--profile", &path], &[]) else {
        return;
    };
    assert_eq!(code, 0, "{text}\n{held}");
    assert!(
        result(&held, "gpu.copy")
            .expected
            .as_deref()
            .is_some_and(|e| e.ends_with("the profile's floors")),
        "{held}"
    );
}
