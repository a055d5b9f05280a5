//! The torch_distributed kind through the binary, with a real Python and
//! torch, on each torch: Debian's python3-torch (1.13, CPU, Gloo) and a
//! current torch from PyPI (PREFLIGHT_TORCH_VENV). Tests that need torch
//! print why and return when that torch is missing, unless
//! PREFLIGHT_REQUIRE_LIBS=1 (CI), where that is a failure. The tests of
//! the missing interpreter and of the deadline need no torch.

use crate::common;
use crate::common::cluster;
use crate::common::serial;

pub use crate::torch::Torch;

/// `preflight diagnose` against real torch jobs under real torchrun.
mod diagnose;

use std::net::TcpListener;
use std::process::Command;

use common::{check, checklist, measured, message, result, status};

/// Whether a process is gone (or only a zombie waiting for its reaper).
/// Polled: the kill is asynchronous, and the reaper is init.
fn gone(pid: u32) -> bool {
    for _ in 0..100 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat) => {
                let state = stat
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .next();
                if state == Some("Z") {
                    return true;
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

fn a_one_process_world_passes_with_gloo_on_cpu_on(torch: &Torch) {
    let _serial = serial();
    let python = torch.python.display().to_string();
    let (_dir, path) = checklist(
        "checks:
  - {id: torch, kind: torch_distributed, timeout: 60s, hint: \"{advice}\"}
",
    );
    let (code, r) = check(&path, &[], &[("PREFLIGHT_PYTHON", &python)]);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(status(&r, "torch"), "pass", "{r:#}");
    let m = measured(&r, "torch");
    assert!(m.starts_with("torch ") && m.ends_with("gloo (cpu)"), "{m}");
    let msg = message(&r, "torch");
    assert!(
        msg.starts_with(
            "init_process_group(gloo), a Gloo CPU group, allreduce and barrier passed (one-process world on 127.0.0.1:"
        ),
        "{msg}"
    );
}

on_each_torch!(
    a_one_process_world_passes_with_gloo_on_cpu,
    super::a_one_process_world_passes_with_gloo_on_cpu_on
);

fn gloo_told_to_use_a_missing_interface_is_named_on(torch: &Torch) {
    let _serial = serial();
    let python = torch.python.display().to_string();
    let (_dir, path) = checklist(
        "checks:
  - {id: torch, kind: torch_distributed, timeout: 60s, hint: \"{advice}\"}
",
    );
    let (code, r) = check(
        &path,
        &[],
        &[
            ("PREFLIGHT_PYTHON", &python),
            ("GLOO_SOCKET_IFNAME", "nosuch0"),
        ],
    );
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(
        message(&r, "torch"),
        "init_process_group failed: Gloo found no address for interface nosuch0"
    );
    let hint = common::hint(&r, "torch");
    assert!(hint.contains("names `nosuch0`, which is missing"), "{hint}");
}

on_each_torch!(
    gloo_told_to_use_a_missing_interface_is_named,
    super::gloo_told_to_use_a_missing_interface_is_named_on
);

fn the_job_port_held_by_another_process_is_named_on(torch: &Torch) {
    let _serial = serial();
    let python = torch.python.display().to_string();
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port().to_string();
    let (_dir, path) = checklist(
        "checks:
  - {id: torch, kind: torch_distributed, rendezvous: job, deadline: 20s, timeout: 30s, hint: \"{advice}\"}
",
    );
    let (code, r) = check(
        &path,
        &[],
        &[
            ("PREFLIGHT_PYTHON", &python),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port),
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
        ],
    );
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(status(&r, "torch"), "fail");
    let msg = message(&r, "torch");
    assert!(
        msg.starts_with(&format!(
            "init_process_group failed: port {port} is already in use, held by pid {}",
            std::process::id()
        )),
        "{msg}"
    );
    let hint = common::hint(&r, "torch");
    assert!(
        hint.contains(&format!("MASTER_PORT {port} is already taken"))
            && hint.contains(&format!("ss -ltnp 'sport = :{port}'")),
        "{hint}"
    );
    drop(holder);

    // Without the launcher's variables, the job mode has nothing to join.
    let (code, r) = check(&path, &[], &[("PREFLIGHT_PYTHON", &python)]);
    assert_eq!(code, 0);
    assert_eq!(status(&r, "torch"), "skip");
    assert_eq!(
        message(&r, "torch"),
        "rendezvous: job needs the launcher's variables, and MASTER_ADDR is not set"
    );
}

on_each_torch!(
    the_job_port_held_by_another_process_is_named,
    super::the_job_port_held_by_another_process_is_named_on
);

fn a_backend_this_torch_cannot_use_is_named_on(torch: &Torch) {
    let _serial = serial();
    let python = torch.python.display().to_string();
    let (_dir, path) = checklist(
        "checks:
  - {id: nccl, kind: torch_distributed, backend: nccl, timeout: 60s, hint: \"{advice}\"}
  - {id: xccl, kind: torch_distributed, backend: xccl, device_id: omit, severity: warn, timeout: 60s}
",
    );
    let (code, r) = check(&path, &[], &[("PREFLIGHT_PYTHON", &python)]);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(status(&r, "nccl"), "fail");
    // A CPU build has no NCCL at all; a CUDA build on a machine without a
    // GPU has it but no device for it.
    let msg = message(&r, "nccl");
    assert!(
        msg == "device failed: this torch has no nccl backend"
            || msg.starts_with("device failed: no usable device"),
        "{msg}"
    );
    let m = measured(&r, "nccl");
    assert!(m.contains("nccl (cuda)"), "{m}");
    assert_eq!(status(&r, "xccl"), "warn");
    let msg = message(&r, "xccl");
    assert!(
        msg.contains("this torch has no xccl backend") || msg.contains("no usable device"),
        "{msg}"
    );
}

on_each_torch!(
    a_backend_this_torch_cannot_use_is_named,
    super::a_backend_this_torch_cannot_use_is_named_on
);

#[test]
fn a_missing_interpreter_or_torch_skips_unless_required() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (_d, path) = checklist(
        "checks:
  - {id: default, kind: torch_distributed}
  - {id: named, kind: torch_distributed, python: /nonexistent/python3}
  - {id: required, kind: torch_distributed, python: /nonexistent/python3, if_missing: error}
",
    );
    let (code, r) = check(
        &path,
        &[],
        &[("PREFLIGHT_PYTHON", "/nonexistent/bin/python")],
    );
    assert_eq!(code, 3, "{r:#}");
    assert_eq!(status(&r, "default"), "skip");
    assert_eq!(
        message(&r, "default"),
        "/nonexistent/bin/python not found (set `python:` on the check, or PREFLIGHT_PYTHON)"
    );
    assert_eq!(status(&r, "named"), "skip");
    assert!(message(&r, "named").starts_with("/nonexistent/python3 not found"));
    assert_eq!(status(&r, "required"), "error");
    assert_eq!(measured(&r, "required"), "no python");

    // A real Python that cannot see torch: -S leaves out site-packages,
    // where Debian and pip put it.
    if Command::new("/usr/bin/python3").arg("-V").output().is_err() {
        common::skip_unless_required("the no-torch half: /usr/bin/python3 is missing");
        return;
    }
    let bare = common::executable(
        dir.path(),
        "bare-python",
        "#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n",
    );
    let bare = bare.to_string_lossy().to_string();
    let (code, r) = check(
        &path,
        &["--only", "default"],
        &[("PREFLIGHT_PYTHON", &bare)],
    );
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(status(&r, "default"), "skip");
    let msg = message(&r, "default");
    assert!(
        msg.starts_with("torch is not installed for /usr/bin/python3 (Python 3."),
        "{msg}"
    );
    assert_eq!(measured(&r, "default"), "no torch");

    // A torch that is there but does not import is the job's failure too.
    let shadow = dir.path().join("site/torch");
    std::fs::create_dir_all(&shadow).unwrap();
    std::fs::write(
        shadow.join("__init__.py"),
        "raise ImportError('libtorch_cuda.so: cannot open shared object file')\n",
    )
    .unwrap();
    let site = dir.path().join("site").to_string_lossy().to_string();
    let (code, r) = check(
        &path,
        &["--only", "default"],
        &[
            ("PREFLIGHT_PYTHON", "/usr/bin/python3"),
            ("PYTHONPATH", &site),
        ],
    );
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(
        message(&r, "default"),
        "import failed: ImportError: libtorch_cuda.so: cannot open shared object file"
    );
    assert_eq!(measured(&r, "default"), "torch (version unknown)");
}

#[test]
fn a_hung_interpreter_is_killed_with_its_whole_group() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    // Stands in for an init that never returns: a helper in the
    // background and the "interpreter" itself, both asleep.
    let hang = common::executable(
        dir.path(),
        "hang",
        &format!(
            "#!/bin/sh\nsleep 300 &\necho $! >> {p}\necho $$ >> {p}\nexec sleep 300\n",
            p = pids.display()
        ),
    );
    let hang = hang.to_string_lossy().to_string();
    let (_d, path) = checklist(&format!(
        "checks:
  - {{id: deadline, kind: torch_distributed, python: \"{hang}\", deadline: 1s, timeout: 30s, hint: \"{{advice}}\"}}
"
    ));
    let (code, r) = check(&path, &[], &[]);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(status(&r, "deadline"), "fail");
    assert_eq!(
        message(&r, "deadline"),
        "no answer after 1s: stopped in start"
    );
    assert_eq!(
        result(&r, "deadline").expected.as_deref(),
        Some("done within 1s")
    );
    let text = std::fs::read_to_string(&pids).unwrap();
    let listed: Vec<u32> = text.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(listed.len(), 2, "{text}");
    for pid in &listed {
        assert!(gone(*pid), "pid {pid} outlived the deadline");
    }

    // The check's own timeout ends the probe before its deadline: the
    // group goes just the same.
    std::fs::remove_file(&pids).unwrap();
    let (_d, path) = checklist(&format!(
        "checks:
  - {{id: timeout, kind: torch_distributed, python: \"{hang}\", deadline: 60s, timeout: 1s}}
"
    ));
    let (code, r) = check(&path, &[], &[]);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(message(&r, "timeout"), "timed out after 1s");
    let text = std::fs::read_to_string(&pids).unwrap();
    for pid in text.lines().map(|l| l.trim().parse::<u32>().unwrap()) {
        assert!(gone(pid), "pid {pid} outlived the check's timeout");
    }
}

fn the_shipped_check_runs_the_probe_on(torch: &Torch) {
    let _serial = serial();
    let python = torch.python.display().to_string();
    let out = Command::new(common::BIN)
        .args([
            "check",
            "--only",
            "framework.torch_distributed",
            "--format",
            "json",
        ])
        .env_clear()
        .env("PATH", common::netns::PATH)
        .env("PREFLIGHT_PYTHON", &python)
        .output()
        .unwrap();
    let r = common::report_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert_eq!(status(&r, "framework.torch_distributed"), "pass", "{r:#}");
    assert_eq!(
        result(&r, "framework.torch_distributed").severity,
        common::Severity::Warn
    );
}

on_each_torch!(
    the_shipped_check_runs_the_probe,
    super::the_shipped_check_runs_the_probe_on
);
