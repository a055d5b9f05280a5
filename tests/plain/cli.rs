//! The other subcommands and the behaviour of the binary as a whole.

use crate::common;
use crate::common::binary;

use std::io::Read;
use std::process::Stdio;

use binary::{json, preflight, report, run};
use common::{Severity, Status};

mod help;

const MIXED: &str = "fixtures/checklists/valid/mixed.yaml";

#[test]
fn run_on_this_machine_as_it_is_prints_a_verdict() {
    let _shared = crate::common::shared();
    // A fresh machine with no cluster environment: the shipped checklist
    // must work and say ready, skipping what does not apply.
    let out = run(preflight().arg("run"));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let verdict = out.stdout.trim_end().lines().last().unwrap();
    assert!(verdict.starts_with("READY"), "{verdict}");
}

#[test]
fn check_reports_the_shipped_checks_with_skip_reasons() {
    let _shared = crate::common::shared();
    let report = report(&run(preflight().args(["check", "--format", "json"])));
    assert_eq!(report.command, "check");
    let checks = &report.checks;
    assert!(!checks.is_empty());
    for c in checks {
        assert_ne!(c.status, Status::Error, "{c:#?}");
        if c.status == Status::Skip {
            assert!(!c.message.is_empty(), "a skip says why: {c:#?}");
        }
    }
}

#[test]
fn the_shipped_checklists_validate() {
    let _shared = crate::common::shared();
    let out = run(preflight().args(["validate", "checks"]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("ok: "), "{}", out.stdout);
}

#[test]
fn colour_follows_the_flag_and_no_color() {
    let _shared = crate::common::shared();
    let args = [
        "check",
        "--no-shipped",
        "--checks",
        MIXED,
        "--only",
        "shell.true",
    ];
    let always = run(preflight().args(args).args(["--color", "always"]));
    assert!(
        always.stdout.contains("\x1b[1;32mREADY\x1b[0m"),
        "{}",
        always.stdout
    );
    let never = run(preflight().args(args).args(["--color", "never"]));
    assert!(!never.stdout.contains('\x1b'));
    // auto without a terminal (a pipe here): plain.
    let piped = run(preflight().args(args));
    assert!(!piped.stdout.contains('\x1b'), "{}", piped.stdout);
    // auto on a real terminal: a pty from util-linux `script`. Colour,
    // unless NO_COLOR is set (to anything but empty) or TERM is dumb. The
    // progress line's erase sequence (`ESC [K`) is no colour.
    let colour = regex::Regex::new("\x1b\\[[0-9;]*m").unwrap();
    let on_tty = |env: &[(&str, &str)]| {
        let command = format!("{} {}", env!("CARGO_BIN_EXE_preflight"), args.join(" "));
        run(std::process::Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("TERM", "xterm")
            .envs(env.iter().copied()))
    };
    let tty = on_tty(&[]);
    assert_eq!(tty.code, 0, "{}{}", tty.stdout, tty.stderr);
    assert!(
        tty.stdout.contains("\x1b[1;32mREADY\x1b[0m"),
        "{}",
        tty.stdout
    );
    // On a terminal, progress goes to stderr (which `script` shows too).
    assert!(
        tty.stdout.contains("[1/1] pass shell.true"),
        "{:?}",
        tty.stdout
    );
    for env in [[("NO_COLOR", "1")], [("TERM", "dumb")]] {
        let plain = on_tty(&env);
        assert_eq!(plain.code, 0, "{env:?}: {}{}", plain.stdout, plain.stderr);
        assert!(plain.stdout.contains("READY"), "{env:?}: {}", plain.stdout);
        assert!(
            !colour.is_match(&plain.stdout),
            "{env:?}: {:?}",
            plain.stdout
        );
    }
}

#[test]
fn quiet_and_verbose() {
    let _shared = crate::common::shared();
    let base = [
        "check",
        "--no-shipped",
        "--checks",
        MIXED,
        "--root",
        "fixtures/minimal-root",
    ];
    let quiet = run(preflight()
        .args(base)
        .arg("-q")
        .env("PREFLIGHT_FIXTURE_MODE", "safe")
        .env("PREFLIGHT_FIXTURE_TOKEN", "x"));
    assert!(!quiet.stdout.contains("PASS"), "{}", quiet.stdout);
    // Quiet output starts with its first problem, not a blank line.
    assert!(quiet.stdout.starts_with("Problems\n"), "{:?}", quiet.stdout);
    // The verdict line, naming what failed.
    let last = quiet.stdout.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("NOT READY") && last.contains(")  · failed: "),
        "{last}"
    );
    let verbose = run(preflight().args(base).arg("-v"));
    // The expectation under the check; its measured value is in the
    // message already.
    let under = regex::Regex::new(
        r"net\.ipv4\.ip_local_port_range = 32768 60999  \([^)\n]+\)\n        expected: = 32768 60999\n",
    )
    .unwrap();
    assert!(under.is_match(&verbose.stdout), "{}", verbose.stdout);
    // Said once: no line of a duration alone, and no measured value the
    // message above it already says.
    let lines: Vec<&str> = verbose.stdout.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let line = line.trim();
        assert!(
            !(line.starts_with('(') && line.ends_with("ms)")),
            "a lone duration: {line}\n{}",
            verbose.stdout
        );
        if let Some(m) = line.strip_prefix("measured: ") {
            let m = m.split("   expected:").next().unwrap();
            assert!(!lines[i - 1].contains(m), "{}\n{line}", lines[i - 1]);
        }
    }
}

/// Problems by severity: a failure that blocks the job is listed before a
/// warning, whatever the checklist's order.
#[test]
fn problems_are_listed_failures_first() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("order.yaml");
    std::fs::write(
        &list,
        "checks:\n  - id: a.warned\n    kind: env\n    name: W\n    set: false\n    severity: warn\n  - id: b.failed\n    kind: env\n    name: F\n",
    )
    .unwrap();
    let out = run(preflight()
        .args(["check", "--no-shipped", "--checks", list.to_str().unwrap()])
        .env("W", "1"));
    let warned = out.stdout.find("WARN  a.warned").expect(&out.stdout);
    let failed = out.stdout.find("FAIL  b.failed").expect(&out.stdout);
    assert!(failed < warned, "{}", out.stdout);
}

#[test]
fn a_closed_stdout_is_not_a_crash() {
    let _shared = crate::common::shared();
    let mut child = preflight()
        .args(["explain", "kernel.somaxconn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status.code(), Some(0), "{stderr}");
}

#[test]
fn bad_timeout_values_are_usage_errors() {
    let _shared = crate::common::shared();
    let out = run(preflight().args(["check", "--timeout", "10"]));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains("a duration needs a unit"),
        "{}",
        out.stderr
    );
}

#[test]
fn backends_flag_drives_backend_conditions() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("b.yaml");
    std::fs::write(&list, "checks:\n  - id: nccl.only\n    kind: env\n    name: PATH\n    when:\n      backend: nccl\n").unwrap();
    let skipped = report(&run(preflight()
        .args([
            "check",
            "--no-shipped",
            "--format",
            "json",
            "--backends",
            "tcp",
            "--checks",
        ])
        .arg(&list)));
    assert_eq!(skipped.checks[0].status, Status::Skip);
    assert_eq!(skipped.checks[0].message, "backend nccl not requested");
    let ran = report(&run(preflight()
        .args([
            "check",
            "--no-shipped",
            "--format",
            "json",
            "--backends",
            "tcp,nccl",
            "--checks",
        ])
        .arg(&list)));
    assert_eq!(ran.checks[0].status, Status::Pass);
    let bad = run(preflight().args(["check", "--backends", "mpi"]));
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.contains("unknown backend `mpi`"),
        "{}",
        bad.stderr
    );
}

#[test]
fn init_method_flag_catches_the_hard_coded_port() {
    let _shared = crate::common::shared();
    // The field story: init_method hard-coded to port 29500 while the
    // launcher set MASTER_PORT to another; every rank but 0 hung.
    let out = run(preflight()
        .args([
            "check",
            "--only",
            "launch.env",
            "--format",
            "json",
            "--init-method",
            "tcp://127.0.0.1:29500",
        ])
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", "29400")
        .env("RANK", "1")
        .env("WORLD_SIZE", "2"));
    assert_eq!(out.code, 1, "{}", out.stdout);
    let report = binary::report(&out);
    let launch = common::result(&report, "launch.env");
    assert_eq!(launch.status, common::Status::Fail);
    assert!(
        launch.message.contains(
            "--init-method `tcp://127.0.0.1:29500` uses port 29500 but MASTER_PORT=29400"
        ),
        "{launch:#?}"
    );
}

#[test]
fn a_bad_collective_setting_is_a_usage_error_before_anything_runs() {
    let _shared = crate::common::shared();
    let out = run(preflight()
        .args(["run", "--backends", "tcp"])
        .env("PREFLIGHT_COLL_SAME_HOST", "shm"));
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("PREFLIGHT_COLL_SAME_HOST=shm") && out.stderr.contains("`tcp`"),
        "{}",
        out.stderr
    );
    // With the collective stage off the variable is not read.
    let out = run(preflight()
        .args(["run", "--backends", "tcp", "--collective", "off"])
        .env("PREFLIGHT_COLL_SAME_HOST", "shm"));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
}

/// README: `--timeout` at most 24h; a longer one is a usage error.
#[test]
fn a_timeout_over_a_day_is_refused() {
    let _shared = crate::common::shared();
    let out = run(preflight().args([
        "check",
        "--no-shipped",
        "--checks",
        MIXED,
        "--timeout",
        "25h",
    ]));
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("`25h` is longer than 24h"),
        "{}",
        out.stderr
    );
    let ok = run(preflight().args([
        "check",
        "--no-shipped",
        "--checks",
        MIXED,
        "--only",
        "shell.true",
        "--timeout",
        "24h",
    ]));
    assert_eq!(ok.code, 0, "{}", ok.stderr);
}

/// README: a `--checks` directory contributes its `*.yaml` and `*.yml`
/// files, in name order, and nothing else.
#[test]
fn a_checks_directory_reads_yaml_and_yml_files() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let check = |id: &str| format!("checks:\n  - {{id: {id}, kind: command, argv: [\"true\"]}}\n");
    std::fs::write(dir.path().join("a.yaml"), check("dir.a")).unwrap();
    std::fs::write(dir.path().join("b.yml"), check("dir.b")).unwrap();
    std::fs::write(dir.path().join("c.txt"), check("dir.c")).unwrap();
    let report = report(&run(preflight().args([
        "check",
        "--no-shipped",
        "--format",
        "json",
        "--checks",
        dir.path().to_str().unwrap(),
    ])));
    let ids: Vec<&str> = report.checks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["dir.a", "dir.b"], "{report}");
}

/// README: in JUnit a warning is a `<failure>` only under `--strict`.
#[test]
fn junit_warnings_fail_only_under_strict() {
    let _shared = crate::common::shared();
    let args = [
        "check",
        "--no-shipped",
        "--checks",
        MIXED,
        "--root",
        "fixtures/minimal-root",
        "--only",
        "kernel.backlog",
        "--format",
        "junit",
    ];
    let plain = run(preflight().args(args));
    assert!(plain.stdout.contains("failures=\"0\""), "{}", plain.stdout);
    assert!(
        !plain.stdout.contains("<failure type=\"warn\""),
        "{}",
        plain.stdout
    );
    let strict = run(preflight().args(args).arg("--strict"));
    assert_eq!(strict.code, 1, "{}", strict.stdout);
    assert!(
        strict.stdout.contains("<failure type=\"warn\""),
        "{}",
        strict.stdout
    );
    assert!(
        strict.stdout.contains("failures=\"1\""),
        "{}",
        strict.stdout
    );
}

/// What the operator set is never silently replaced: WORLD_SIZE without
/// RANK is not a world of one. `run` refuses it before anything starts;
/// `check` fails the launch check, naming what is missing.
#[test]
fn a_world_size_without_a_rank_is_refused() {
    let _shared = crate::common::shared();
    let run_out = run(preflight()
        .args([
            "run",
            "--no-shipped",
            "--checks",
            MIXED,
            "--only",
            "shell.true",
        ])
        .env("WORLD_SIZE", "4"));
    assert_eq!(run_out.code, 2, "{}{}", run_out.stdout, run_out.stderr);
    assert!(
        run_out
            .stderr
            .contains("WORLD_SIZE=4 is set but RANK is not: torchrun gives every process both; set RANK (0 to 3) or unset WORLD_SIZE"),
        "{}",
        run_out.stderr
    );
    let report = report(&run(preflight()
        .args(["check", "--format", "json", "--only", "launch.env"])
        .env("WORLD_SIZE", "4")));
    let check = &report.checks[0];
    assert_eq!(check.status, Status::Fail, "{check:#?}");
    assert!(
        check
            .message
            .contains("WORLD_SIZE=4 is set but RANK is not"),
        "{check:#?}"
    );
}

/// Counts read as English: one file, one check, one rank.
#[test]
fn counts_of_one_are_singular() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("one.yaml");
    std::fs::write(
        &file,
        "checks:\n  - {id: one, kind: command, argv: [\"true\"]}\n",
    )
    .unwrap();
    let out = run(preflight().args(["validate", file.to_str().unwrap()]));
    assert_eq!(out.stdout, "ok: 1 file, 1 check\n", "{}", out.stderr);
    let human =
        run(preflight().args(["check", "--no-shipped", "--checks", file.to_str().unwrap()]));
    assert!(human.stdout.contains(" · 1 check\n"), "{}", human.stdout);
    let listed =
        run(preflight().args(["list", "--no-shipped", "--checks", file.to_str().unwrap()]));
    assert!(
        listed
            .stdout
            .contains("\n1 check: 1 on each node (1 of them by `check`, 0 opt-in; 1 apply here)"),
        "{}",
        listed.stdout
    );
    let two = run(preflight().args(["validate", file.to_str().unwrap(), MIXED]));
    assert!(two.stdout.starts_with("ok: 2 files, "), "{}", two.stdout);
}

/// A flag the command would ignore is refused with exit 2, naming it and
/// why; the same flags where they do something are accepted.
#[test]
fn flags_that_would_do_nothing_are_refused() {
    let _shared = crate::common::shared();
    for (args, named) in [
        (&["check", "--master-addr", "10.0.0.1"][..], "--master-addr"),
        (
            &["check", "--nnodes", "3", "--collective", "full"][..],
            "--nnodes, --collective",
        ),
        (
            &["check", "--nccl-lib", "/x/libnccl.so.2"][..],
            "--nccl-lib",
        ),
        (
            &["bench", "--checks", MIXED, "--only", "x", "--strict"][..],
            "--checks, --only, --strict",
        ),
    ] {
        let out = run(preflight().args(args));
        assert_eq!(out.code, 2, "{args:?}: {}\n{}", out.stdout, out.stderr);
        assert!(
            out.stderr.contains(&format!("{named} does nothing here")),
            "{args:?}: {}",
            out.stderr
        );
    }
    // Defaults are not "given": a plain check and one with a checklist
    // flag it uses pass.
    let out = run(preflight().args([
        "check",
        "--no-shipped",
        "--checks",
        MIXED,
        "--only",
        "kernel",
    ]));
    assert_ne!(out.code, 2, "{}", out.stderr);
}

/// Quiet when healthy: the default output is the problems and one line for
/// the rest; `-v` lists every check, with values and durations for those
/// that ran (none for a skipped one: nothing was measured).
#[test]
fn the_default_output_is_the_problems_and_one_line_for_the_rest() {
    let _shared = crate::common::shared();
    let base = [
        "check",
        "--no-shipped",
        "--checks",
        MIXED,
        "--root",
        "fixtures/minimal-root",
    ];
    let out = run(preflight().args(base));
    assert!(!out.stdout.contains("PASS"), "{}", out.stdout);
    assert!(!out.stdout.contains("SKIP"), "{}", out.stdout);
    assert!(out.stdout.contains("\nProblems\n"), "{}", out.stdout);
    assert!(
        out.stdout.contains("passed, ") && out.stdout.contains("-v lists every check"),
        "{}",
        out.stdout
    );
    let verbose = run(preflight().args(base).arg("-v"));
    assert!(verbose.stdout.contains("PASS"), "{}", verbose.stdout);
    let lines: Vec<&str> = verbose.stdout.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("SKIP") {
            let next = lines.get(i + 1).copied().unwrap_or_default();
            assert!(
                !next.trim_start().starts_with('('),
                "a duration under a skip: {next}"
            );
        }
    }
}

/// `check` meets no other node: the checks across nodes are `run`'s and
/// not listed as skipped.
#[test]
fn check_leaves_out_the_checks_across_nodes() {
    let _shared = crate::common::shared();
    let out = run(preflight().args(["check", "--format", "json"]));
    let report = report(&out);
    let ids: Vec<&str> = report.checks.iter().map(|c| c.id.as_str()).collect();
    assert!(!ids.is_empty());
    assert!(!ids.iter().any(|id| id.starts_with("cluster.")), "{ids:?}");
    // And `list` does not count them as applying on this node.
    let listed = run(preflight().args(["list", "--format", "json"]));
    // `list`'s entries are no report: its JSON has no schema type.
    let entries = json(&listed);
    let versions = entries
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "cluster.versions")
        .unwrap();
    assert_eq!(versions["applies"], false, "{versions:#}");
    assert!(
        versions["reason"]
            .as_str()
            .unwrap()
            .starts_with("preflight run only"),
        "{versions:#}"
    );
}

/// Without a UTF-8 locale (unset is C), the report is plain ASCII.
#[test]
fn the_report_is_ascii_without_a_utf8_locale() {
    let _shared = crate::common::shared();
    let base = [
        "check",
        "--no-shipped",
        "--checks",
        MIXED,
        "--root",
        "fixtures/minimal-root",
    ];
    let utf8 = run(preflight().args(base));
    assert!(utf8.stdout.contains(" · "), "{}", utf8.stdout);
    for lang in [None, Some("C"), Some("en_US.ISO-8859-1")] {
        let mut cmd = preflight();
        cmd.args(base).env_remove("LANG");
        if let Some(l) = lang {
            cmd.env("LANG", l);
        }
        let out = run(&mut cmd);
        assert!(out.stdout.is_ascii(), "{lang:?}: {}", out.stdout);
        assert!(out.stdout.contains(" - "), "{lang:?}: {}", out.stdout);
    }
}

/// On a terminal, the progress line names the checks still running.
#[test]
fn the_progress_line_names_the_checks_still_running() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("slow.yaml");
    // The slow check ends a second after the quick one has: ordered by
    // the quick one's own mark, not by hoping `sleep` outlasts `true`.
    let mark = dir.path().join("quick-done");
    std::fs::write(
        &list,
        format!(
            "checks:\n  - id: shell.slow\n    kind: command\n    argv: [sh, -c, 'while [ ! -e {m} ]; do sleep 0.02; done; sleep 1']\n  - id: shell.quick\n    kind: command\n    argv: [touch, {m}]\n",
            m = mark.display()
        ),
    )
    .unwrap();
    let command = format!(
        "{} check --no-shipped --checks {}",
        env!("CARGO_BIN_EXE_preflight"),
        list.display()
    );
    let tty = run(std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TERM", "xterm")
        .env("LANG", "C.UTF-8"));
    assert_eq!(tty.code, 0, "{}{}", tty.stdout, tty.stderr);
    assert!(
        tty.stdout.contains("pass shell.quick  running: shell.slow"),
        "{:?}",
        tty.stdout
    );
}

#[test]
fn json_report_writes_the_json_beside_the_metrics_from_one_run() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let prom = dir.path().join("preflight.prom");
    let report = dir.path().join("periodic.json");
    let out = run(preflight()
        .args([
            "check",
            "--no-shipped",
            "--checks",
            MIXED,
            "--format",
            "prometheus",
        ])
        .arg("--output")
        .arg(&prom)
        .arg("--json-report")
        .arg(&report));
    let metrics = std::fs::read_to_string(&prom).unwrap();
    let doc = common::report(&std::fs::read_to_string(&report).unwrap(), &out.stderr);
    assert_eq!(doc.command, "check");
    let verdict = doc.verdict.name();
    assert!(
        metrics.contains(&format!("preflight_verdict{{verdict=\"{verdict}\"}} 1")),
        "{verdict}\n{metrics}"
    );
    // The same run: the same checks, each with the status the metrics say.
    for check in &doc.checks {
        let severity = match check.severity {
            Severity::Fail => "fail",
            Severity::Warn => "warn",
        };
        let line = format!(
            "check=\"{}\",area=\"{}\",severity=\"{severity}\",status=\"{}\"}} 1",
            check.id,
            check.area,
            check.status.name()
        );
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }
    assert_eq!(out.code, doc.exit_code);
    // A directory that cannot take it is the operator's to hear of.
    let bad = run(preflight()
        .args(["check", "--no-shipped", "--checks", MIXED, "--json-report"])
        .arg(dir.path().join("missing/dir/r.json")));
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr.contains("cannot write the JSON report to"),
        "{}",
        bad.stderr
    );
}

/// `--output /dev/null` (or a FIFO) is written to, never renamed over:
/// the atomic write must not turn the machine's /dev/null into a file.
#[test]
fn output_to_a_device_writes_through_it() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // Held open for reading and writing, the FIFO takes the report
    // (smaller than its 64 KiB buffer) without a reader waiting, so a
    // broken write cannot hang the test.
    use std::os::unix::fs::OpenOptionsExt;
    let mut held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let out = run(preflight()
        .args([
            "check",
            "--no-shipped",
            "--checks",
            MIXED,
            "--format",
            "json",
            "--output",
        ])
        .arg(&fifo));
    assert!(matches!(out.code, 0 | 1 | 3), "{}", out.stderr);
    let mut bytes = vec![0u8; 65536];
    let n = std::io::Read::read(&mut held, &mut bytes).unwrap_or(0);
    let text = String::from_utf8_lossy(&bytes[..n]);
    assert!(text.contains("\"command\": \"check\""), "{text}");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let listed: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(listed.len(), 1, "a temporary file left beside it");
}

/// One rank moves nothing between ranks: its backend says what it
/// verified, with no "busbw 0.000 GB/s" beside it.
#[test]
fn a_one_rank_run_gives_no_bus_bandwidth() {
    let _shared = crate::common::shared();
    let report = binary::report(&run(preflight().args(["run", "--format", "json"])));
    let message = common::message(&report, "collective.tcp");
    assert!(
        message.starts_with("tcp: 5 operations verified on 1 rank"),
        "{message}"
    );
    assert!(!message.contains("busbw"), "{message}");
}
