//! The checklist engine end to end: reports, verdicts and exit codes,
//! timeouts, concurrency, selection and replacing shipped checks.

/// Kept passes (`cache:`).
mod kept;

use crate::common::{self, Status, Verdict, binary, measured, result, status};
use binary::{assert_snapshot, preflight, report, run};

const MIXED: &str = "fixtures/checklists/valid/mixed.yaml";
const EXIT: &str = "fixtures/checklists/valid/exit-codes.yaml";
const ROOT: &str = "fixtures/minimal-root";

fn mixed(format: &str) -> binary::Run {
    mixed_with(format, &[])
}

fn mixed_with(format: &str, extra: &[&str]) -> binary::Run {
    run(preflight()
        .args([
            "check",
            "--no-shipped",
            "--checks",
            MIXED,
            "--root",
            ROOT,
            "--format",
            format,
        ])
        .args(extra)
        .env("PREFLIGHT_FIXTURE_TOKEN", "abc")
        .env("PREFLIGHT_FIXTURE_MODE", "turbo"))
}

/// Replaces `at` (the report's field `what`) with `with`, after checking
/// that `valid` holds for what the run wrote there.
fn normalise<T: std::fmt::Debug>(what: &str, at: &mut T, with: T, valid: impl Fn(&T) -> bool) {
    assert!(valid(at), "{what}: {at:?} is not in its format");
    *at = with;
}

#[test]
fn json_report_snapshot() {
    let _shared = crate::common::shared();
    let out = mixed("json");
    assert_eq!(out.code, 1, "{}", out.stderr);
    let mut report = report(&out);
    // The types read all the report says: written back, it is the text
    // the run printed, byte for byte; the snapshot below is of what they
    // read (and a negative duration, which they read as 0, differs here).
    assert_eq!(
        format!("{report}\n"),
        out.stdout,
        "the report as its types read it"
    );
    assert_eq!(report.schema, "preflight.report/v1");
    assert_eq!(report.verdict, Verdict::NotReady);
    assert_eq!(report.exit_code, 1);
    // What varies from run to run, each checked before it is normalised:
    // the ms are whole numbers by their type, which also fails a report
    // missing one (`timings`, optional in the type, is required here).
    let rfc3339 = regex::Regex::new(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$").unwrap();
    let r = &mut report.0;
    normalise("started_at", &mut r.started_at, "<time>".into(), |t| {
        rfc3339.is_match(t)
    });
    r.duration_ms = 0;
    let timings = r
        .timings
        .as_mut()
        .unwrap_or_else(|| panic!("the report has no timings:\n{}", out.stdout));
    timings.checks_ms = 0;
    timings.cpu_ms = 0;
    normalise("node.pid", &mut r.node.pid, 0, |p| *p > 0);
    normalise(
        "tool.version",
        &mut r.tool.version,
        "<version>".into(),
        |v| v.as_ref() == env!("CARGO_PKG_VERSION"),
    );
    for c in &mut r.checks {
        c.duration = std::time::Duration::ZERO;
    }
    assert_snapshot("mixed.json", &format!("{report}\n"));
}

#[test]
fn junit_report_snapshot() {
    let _shared = crate::common::shared();
    let out = mixed("junit");
    assert_eq!(out.code, 1);
    let times = regex::Regex::new(r#"(time|timestamp)="[^"]*""#).unwrap();
    let normal = times.replace_all(&out.stdout, r#"$1="_""#);
    assert_snapshot("mixed.junit.xml", &normal);
}

#[test]
fn human_report_groups_by_area_and_repeats_problems_with_hints() {
    let _shared = crate::common::shared();
    // Every check by area is `-v`'s; the default is quiet when healthy.
    let out = mixed_with("human", &["-v"]);
    assert_eq!(out.code, 1);
    let text = &out.stdout;
    let kernel = text.find("\nkernel\n").expect("kernel area");
    let network = text.find("\nnetwork\n").expect("network area");
    assert!(kernel < network, "areas in checklist order:\n{text}");
    let problems = text.find("\nProblems\n").expect("problems section");
    assert!(
        text[problems..].contains("hint: remove `127.0.1.1 fixture-node` from /etc/hosts"),
        "{text}"
    );
    assert!(
        text[problems..].contains(
            "hint: raise it: sysctl -w net.core.somaxconn=4096 (now 128 on fixture-node)"
        )
    );
    assert!(
        text.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("NOT READY  2 pass · 1 warn · 2 fail · 2 skip · 1 error")
    );
    // Not a terminal: no colour codes.
    assert!(!text.contains('\x1b'));
}

#[test]
fn secrets_stay_out_of_reports() {
    let _shared = crate::common::shared();
    let out = mixed("json");
    assert!(!out.stdout.contains("\"abc\""));
    assert_eq!(
        measured(&report(&out), "env.job_token"),
        "<redacted, 3 characters>"
    );
    // A distinctive secret, in a passing check and in a failing one whose
    // hint quotes `{value}` and `{measured}`, in every format: nowhere.
    let secret = "Zq7vK2-distinctive-9fT4";
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("secret.yaml");
    std::fs::write(
        &list,
        "checks:\n  - {id: token.set, kind: env, name: JOB_SECRET}\n  - id: token.shape\n    kind: env\n    name: JOB_SECRET\n    matches: '^nope$'\n    hint: 'value {value}, measured {measured}'\n",
    )
    .unwrap();
    for format in ["human", "json", "junit", "prometheus"] {
        let out = run(preflight()
            .args(["check", "--no-shipped", "--checks"])
            .arg(&list)
            .args(["--root", ROOT, "--format", format, "-v"])
            .env("JOB_SECRET", secret));
        assert_eq!(out.code, 1, "{format}: {}{}", out.stdout, out.stderr);
        assert!(
            out.stdout.contains("token.shape"),
            "{format}: {}",
            out.stdout
        );
        for text in [&out.stdout, &out.stderr] {
            assert!(!text.contains(secret), "{format} shows the secret:\n{text}");
            assert!(
                !text.contains("Zq7vK2"),
                "{format} shows part of it:\n{text}"
            );
        }
    }
}

fn exit_case(selector: &str, strict: bool) -> binary::Run {
    let mut cmd = preflight();
    cmd.args([
        "check",
        "--no-shipped",
        "--checks",
        EXIT,
        "--root",
        ROOT,
        "--only",
        selector,
        "--format",
        "json",
    ])
    .env("PREFLIGHT_FIXTURE_SET", "1");
    if strict {
        cmd.arg("--strict");
    }
    run(&mut cmd)
}

#[test]
fn exit_0_when_ready() {
    let _shared = crate::common::shared();
    let out = exit_case("pass", false);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert_eq!(report(&out).verdict, Verdict::Ready);
}

#[test]
fn exit_1_when_a_check_fails() {
    let _shared = crate::common::shared();
    let out = exit_case("fail", false);
    assert_eq!(out.code, 1);
    assert_eq!(report(&out).verdict, Verdict::NotReady);
}

#[test]
fn warnings_pass_unless_strict() {
    let _shared = crate::common::shared();
    assert_eq!(exit_case("warn", false).code, 0);
    let strict = exit_case("warn", true);
    assert_eq!(strict.code, 1);
    assert!(report(&strict).strict);
}

#[test]
fn exit_3_when_a_required_check_cannot_be_evaluated() {
    let _shared = crate::common::shared();
    let out = exit_case("error", false);
    assert_eq!(out.code, 3);
    let r = report(&out);
    assert_eq!(r.verdict, Verdict::Incomplete);
    assert_eq!(status(&r, "unreadable"), "error");
}

#[test]
fn unevaluated_warn_checks_count_only_under_strict() {
    let _shared = crate::common::shared();
    assert_eq!(exit_case("error_warn", false).code, 0);
    assert_eq!(exit_case("error_warn", true).code, 3);
}

#[test]
fn exit_2_for_an_invalid_checklist_or_invocation() {
    let _shared = crate::common::shared();
    let bad = run(preflight().args([
        "check",
        "--no-shipped",
        "--checks",
        "fixtures/checklists/invalid/unknown-kind.yaml",
    ]));
    assert_eq!(bad.code, 2);
    let flag = run(preflight().args(["check", "--format", "yaml"]));
    assert_eq!(flag.code, 2);
    let root = run(preflight().args(["check", "--root", "/nonexistent/root"]));
    assert_eq!(root.code, 2);
    assert!(
        root.stderr
            .contains("--root /nonexistent/root: not a directory"),
        "{}",
        root.stderr
    );
}

#[test]
fn fail_beats_error_in_the_verdict() {
    let _shared = crate::common::shared();
    let out = run(preflight().args([
        "check",
        "--no-shipped",
        "--checks",
        EXIT,
        "--root",
        ROOT,
        "--only",
        "fail",
        "--only",
        "error",
    ]));
    assert_eq!(out.code, 1);
}

/// The slow checklist with its rendezvous directory filled in.
fn slow_checklist(dir: &std::path::Path) -> std::path::PathBuf {
    let template =
        std::fs::read_to_string(binary::repo().join("fixtures/checklists/valid/slow.yaml"))
            .unwrap();
    let path = dir.join("slow.yaml");
    std::fs::write(
        &path,
        template.replace("${DIR}", &dir.display().to_string()),
    )
    .unwrap();
    path
}

#[test]
fn checks_run_concurrently_and_report_in_checklist_order() {
    let _shared = crate::common::shared();
    // Each check waits for the other's file: both pass only if they overlap.
    // waits_for_b must also finish after waits_for_a has started, yet it is
    // reported first.
    let dir = tempfile::tempdir().unwrap();
    let list = slow_checklist(dir.path());
    let out = run(preflight()
        .args([
            "check",
            "--no-shipped",
            "--format",
            "json",
            "--only",
            "rendezvous",
            "--checks",
        ])
        .arg(&list));
    assert_eq!(out.code, 0, "{}", out.stdout);
    let r = report(&out);
    let ids: Vec<&str> = r.checks.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["waits_for_b", "waits_for_a"]);
}

#[test]
fn a_check_that_overruns_its_timeout_fails() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let list = slow_checklist(dir.path());
    let out = run(preflight()
        .args([
            "check",
            "--no-shipped",
            "--format",
            "json",
            "--only",
            "overrun",
            "--checks",
        ])
        .arg(&list));
    assert_eq!(out.code, 1);
    let r = report(&out);
    let overrun = result(&r, "overruns");
    assert_eq!(overrun.status, Status::Fail);
    assert_eq!(overrun.message, "timed out after 300ms");
    // A warn-severity check that overruns its own timeout warns.
    let soft = result(&r, "overruns_softly");
    assert_eq!(soft.status, Status::Warn);
    assert_eq!(soft.message, "timed out after 300ms");
    // The others still finish and report.
    assert_eq!(status(&r, "quick"), "pass");
}

#[test]
fn the_run_deadline_ends_checks_still_running() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("long.yaml");
    std::fs::write(
        &list,
        "checks:\n  - id: long\n    kind: command\n    argv: [sleep, \"30\"]\n    timeout: 60s\n",
    )
    .unwrap();
    let out = run(preflight()
        .args([
            "check",
            "--no-shipped",
            "--format",
            "json",
            "--timeout",
            "500ms",
            "--checks",
        ])
        .arg(&list));
    // Not evaluated, not failed: incomplete (exit 3).
    assert_eq!(out.code, 3);
    let r = report(&out);
    let long = result(&r, "long");
    assert_eq!(long.status, Status::Error);
    assert!(
        long.message
            .contains("the checklist's deadline (500ms) passed"),
        "{long:#?}"
    );
}

#[test]
fn only_and_skip_select_by_id_and_tag() {
    let _shared = crate::common::shared();
    let ids = |args: &[&str]| check_ids(std::path::Path::new(MIXED), args);
    assert_eq!(
        ids(&["--only", "kernel"]),
        ["kernel.port_range", "kernel.backlog", "missing.sysctl"]
    );
    assert_eq!(
        ids(&["--only", "kernel", "--skip", "missing.sysctl"]),
        ["kernel.port_range", "kernel.backlog"]
    );
    assert_eq!(
        ids(&["--only", "shell.true", "--only", "env.job_token"]),
        ["env.job_token", "shell.true"]
    );
    assert_eq!(
        ids(&["--skip", "kernel", "--skip", "env"]),
        ["hosts.no_loopback_alias", "shell.true"]
    );
}

#[test]
fn a_selector_matching_nothing_is_an_error() {
    let _shared = crate::common::shared();
    let out = run(preflight().args([
        "check",
        "--no-shipped",
        "--checks",
        MIXED,
        "--only",
        "kernal",
    ]));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr
            .contains("--only `kernal` matches no check id or tag (did you mean `kernel`?)"),
        "{}",
        out.stderr
    );
}

#[test]
fn an_added_check_replaces_the_shipped_one_with_its_id() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("site.yaml");
    std::fs::write(
        &list,
        "checks:\n  - id: kernel.somaxconn\n    kind: file\n    path: /site/shm\n    hint: site-specific\n",
    )
    .unwrap();
    let out = run(preflight()
        .args([
            "check",
            "--format",
            "json",
            "--only",
            "kernel.somaxconn",
            "--checks",
        ])
        .arg(&list));
    assert_eq!(out.code, 1, "{}", out.stdout);
    let r = report(&out);
    assert_eq!(r.checks.len(), 1);
    let shm = result(&r, "kernel.somaxconn");
    assert_eq!(
        shm.kind, "file",
        "the site's definition, not the shipped one"
    );
    assert_eq!(shm.message, "/site/shm does not exist");
    assert_eq!(shm.hint.as_deref(), Some("site-specific"));
    assert!(shm.source.ends_with("site.yaml:2:5"));
}

#[test]
fn the_same_id_in_two_added_files_is_an_error() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    for name in ["a.yaml", "b.yaml"] {
        std::fs::write(
            dir.path().join(name),
            "checks:\n  - id: twice\n    kind: env\n    name: X\n",
        )
        .unwrap();
    }
    let out = run(preflight()
        .args(["check", "--no-shipped", "--checks"])
        .arg(dir.path()));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr
            .contains("b.yaml:2:5: duplicate check id `twice`: already defined at"),
        "{}",
        out.stderr
    );
}

#[test]
fn output_file_gets_the_report_and_stdout_the_verdict() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.json");
    let out = run(preflight()
        .args([
            "check",
            "--no-shipped",
            "--checks",
            EXIT,
            "--only",
            "pass",
            "--format",
            "json",
            "--output",
        ])
        .arg(&file)
        .env("PREFLIGHT_FIXTURE_SET", "1"));
    assert_eq!(out.code, 0);
    assert!(out.stdout.starts_with("READY  1 pass"), "{}", out.stdout);
    let r = common::report(&std::fs::read_to_string(&file).unwrap(), &out.stderr);
    assert_eq!(r.verdict, Verdict::Ready);
    // Nothing left behind but the report.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["report.json"]);
}

#[test]
fn an_unwritable_output_is_a_usage_error() {
    let _shared = crate::common::shared();
    let out = run(preflight().args([
        "check",
        "--no-shipped",
        "--checks",
        EXIT,
        "--only",
        "pass",
        "--output",
        "/nonexistent/dir/r.json",
    ]));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr
            .contains("cannot write the report to /nonexistent/dir/r.json"),
        "{}",
        out.stderr
    );
}

/// `--only` runs an opt-in check alone; `--with` runs it beside the rest
/// (what the Slurm health check does with DCGM's quick diagnostic), and a
/// `--with` that names nothing is an error as a mistyped `--only` is.
#[test]
fn opt_in_checks_run_only_when_only_or_with_names_them() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("opt.yaml");
    std::fs::write(
        &path,
        "checks:\n  - id: everyday\n    kind: env\n    name: PATH\n  - id: slow.probe\n    kind: env\n    name: PATH\n    opt_in: true\n    tags: [slow]\n",
    )
    .unwrap();
    let ids = |args: &[&str]| check_ids(&path, args);
    assert_eq!(ids(&[]), ["everyday"]);
    assert_eq!(ids(&["--only", "slow"]), ["slow.probe"]);
    assert_eq!(
        ids(&["--only", "slow.probe", "--only", "everyday"]),
        ["everyday", "slow.probe"]
    );
    assert_eq!(ids(&["--with", "slow"]), ["everyday", "slow.probe"]);
    // --skip wins over --with as it does over --only.
    assert_eq!(
        ids(&["--with", "slow", "--skip", "slow.probe"]),
        ["everyday"]
    );
    let mut cmd = preflight();
    cmd.args(["check", "--no-shipped", "--checks"])
        .arg(&path)
        .args(["--root", ROOT, "--with", "slo"]);
    let out = run(&mut cmd);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("--with `slo` matches no check id or tag"),
        "{}",
        out.stderr
    );
    // `list` shows it, with how to run it.
    let mut cmd = preflight();
    cmd.args(["list", "--no-shipped", "--checks"])
        .arg(&path)
        .args(["--root", ROOT]);
    let out = run(&mut cmd);
    assert!(
        out.stdout
            .contains("opt-in: runs only with --only or --with slow"),
        "{}",
        out.stdout
    );
}

/// The ids `check` reports for `checklist` alone over the minimal root.
fn check_ids(checklist: &std::path::Path, args: &[&str]) -> Vec<String> {
    let mut cmd = preflight();
    cmd.args(["check", "--no-shipped", "--checks"])
        .arg(checklist)
        .args(["--root", ROOT, "--format", "json"])
        .args(args);
    report(&run(&mut cmd))
        .checks
        .iter()
        .map(|c| c.id.clone())
        .collect()
}
