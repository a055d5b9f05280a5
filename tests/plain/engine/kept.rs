//! Kept passes (`cache:`): a slow check's pass reused while the node and
//! the check are unchanged, and never otherwise.

use std::path::Path;

use super::binary::{preflight, run};
use crate::common::{CheckResult, Report, Status};

fn report(args: &[&str], checks: &Path, state: &Path, root: Option<&Path>) -> Report {
    let mut cmd = preflight();
    cmd.args(["check", "--no-shipped", "--format", "json", "--checks"])
        .arg(checks)
        .arg("--state-dir")
        .arg(state)
        .args(args);
    if let Some(r) = root {
        cmd.arg("--root").arg(r);
    }
    let out = run(&mut cmd);
    assert!(matches!(out.code, 0 | 1), "{}\n{}", out.stdout, out.stderr);
    super::binary::report(&out)
}

fn line<'a>(r: &'a Report, id: &str) -> &'a CheckResult {
    crate::common::result(r, id)
}

/// A `command` check with `cache: 1h` runs once over two `check` runs,
/// and the second report marks it cached; a failing one runs each time.
#[test]
fn a_slow_commands_pass_is_run_once_and_reused() {
    let _shared = crate::common::shared();
    let d = tempfile::tempdir().unwrap();
    let count = d.path().join("count");
    let failing = d.path().join("failing");
    let checks = d.path().join("slow.yaml");
    std::fs::write(
        &checks,
        format!(
            "checks:\n\
             \x20 - id: site.slow_probe\n    kind: command\n    cache: 1h\n    tags: [slow]\n\
             \x20   argv: [sh, -c, 'echo run >> {c}']\n\
             \x20 - id: site.slow_failing\n    kind: command\n    cache: 1h\n\
             \x20   argv: [sh, -c, 'echo run >> {f}; exit 1']\n",
            c = count.display(),
            f = failing.display()
        ),
    )
    .unwrap();
    let state = d.path().join("state");
    let first = report(&[], &checks, &state, None);
    assert_eq!(
        line(&first, "site.slow_probe").status,
        Status::Pass,
        "{first}"
    );
    assert!(!line(&first, "site.slow_probe").cached);
    let second = report(&[], &checks, &state, None);
    let l = line(&second, "site.slow_probe");
    assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 1);
    assert!(l.cached, "{l:#?}");
    assert!(
        l.measured_at.as_deref().is_some_and(|t| t.ends_with('Z')),
        "{l:#?}"
    );
    assert!(l.message.contains("ago, reused until "), "{l:#?}");
    // A failure is never kept: it runs every time.
    assert_eq!(line(&second, "site.slow_failing").status, Status::Fail);
    assert_eq!(
        std::fs::read_to_string(&failing).unwrap().lines().count(),
        2
    );
    assert!(!state.join("kept/site.slow_failing.json").exists());
    // --fresh runs it, and --no-slow-now reuses the pass it has.
    report(&["--fresh"], &checks, &state, None);
    assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 2);
    let busy = report(&["--no-slow-now"], &checks, &state, None);
    assert!(line(&busy, "site.slow_probe").cached);
    assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 2);
    // A changed definition runs again.
    let text = std::fs::read_to_string(&checks)
        .unwrap()
        .replace("cache: 1h\n    tags", "cache: 2h\n    tags");
    std::fs::write(&checks, text).unwrap();
    let changed = report(&[], &checks, &state, None);
    assert!(!line(&changed, "site.slow_probe").cached);
    assert!(
        line(&changed, "site.slow_probe")
            .message
            .contains("the check's definition changed"),
        "{changed}"
    );
    assert_eq!(std::fs::read_to_string(&count).unwrap().lines().count(), 3);
    // Without a kept pass, --no-slow-now skips it and says why.
    std::fs::remove_dir_all(state.join("kept")).unwrap();
    let busy = report(&["--no-slow-now"], &checks, &state, None);
    let l = line(&busy, "site.slow_probe");
    assert_eq!(l.status, Status::Skip);
    assert!(l.message.contains("a job holds this node"), "{l:#?}");
}

/// A fixture node whose fingerprint the test changes: its driver, a new
/// Xid in its kernel log; and state files not to trust.
#[test]
fn a_changed_node_or_an_untrusted_state_file_runs_the_check_again() {
    let _shared = crate::common::shared();
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    for dir in ["proc/sys/kernel/random", "sys/module/nvidia", "dev", "etc"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("proc/sys/kernel/random/boot_id"), "7d1f\n").unwrap();
    std::fs::write(root.join("sys/module/nvidia/version"), "550.54.15\n").unwrap();
    std::fs::write(root.join("dev/kmsg"), "6,1,1,-;Linux version\n").unwrap();
    std::fs::write(root.join("etc/ready"), "").unwrap();
    let checks = d.path().join("kept.yaml");
    std::fs::write(
        &checks,
        "checks:\n  - id: site.ready\n    kind: file\n    path: /etc/ready\n    cache: 1h\n",
    )
    .unwrap();
    let state = d.path().join("state");
    let cached = |r: &Report| line(r, "site.ready").cached;
    let message = |r: &Report| line(r, "site.ready").message.clone();
    let again = |why: &str| {
        let r = report(&[], &checks, &state, Some(&root));
        assert!(!cached(&r), "{why}: {r}");
        r
    };
    again("first");
    assert!(cached(&report(&[], &checks, &state, Some(&root))));
    // A new driver.
    std::fs::write(root.join("sys/module/nvidia/version"), "570.86.10\n").unwrap();
    let r = again("a new driver");
    assert!(message(&r).contains("the node changed"), "{r}");
    assert!(cached(&report(&[], &checks, &state, Some(&root))));
    // A new Xid in the kernel log.
    std::fs::write(
        root.join("dev/kmsg"),
        "6,1,1,-;Linux version\n3,2,2,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n",
    )
    .unwrap();
    again("a new Xid");
    assert!(cached(&report(&[], &checks, &state, Some(&root))));
    // A corrupt state file.
    let file = state.join("kept/site.ready.json");
    std::fs::write(&file, "{\"schema\": \"preflight.kept/v1\", ").unwrap();
    let r = again("a corrupt file");
    assert!(
        message(&r).contains("not trusted") && message(&r).contains("corrupt"),
        "{r}"
    );
    // One from the future.
    assert!(cached(&report(&[], &checks, &state, Some(&root))));
    // The kept pass's own state file (`preflight.kept/v1`), no report: the
    // schema module has no type for it.
    let mut kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    kept["measured_at"] = (kept["measured_at"].as_u64().unwrap() + 86_400).into();
    kept["valid_until"] = (kept["valid_until"].as_u64().unwrap() + 86_400).into();
    std::fs::write(&file, kept.to_string()).unwrap();
    let r = again("a file from the future");
    assert!(message(&r).contains("measured in the future"), "{r}");
    // Another user's.
    if nix::unistd::geteuid().is_root() {
        assert!(cached(&report(&[], &checks, &state, Some(&root))));
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        let r = again("another user's file");
        assert!(message(&r).contains("belongs to uid 65534"), "{r}");
    }
    // Within its hour a kept pass stands for the check (the node is
    // unchanged by its fingerprint); run anyway (--fresh), a failure
    // removes it.
    assert!(cached(&report(&[], &checks, &state, Some(&root))));
    std::fs::remove_file(root.join("etc/ready")).unwrap();
    assert!(cached(&report(&[], &checks, &state, Some(&root))));
    let r = report(&["--fresh"], &checks, &state, Some(&root));
    assert_eq!(line(&r, "site.ready").status, Status::Fail);
    assert!(!file.exists());
    std::fs::write(root.join("etc/ready"), "").unwrap();
    again("after a failure");
}
