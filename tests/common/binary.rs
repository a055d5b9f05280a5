//! Running the real binary from integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The binary with an empty environment: each test says what the launcher
/// would have set, so the developer's own variables never leak in.
pub fn preflight() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_preflight"));
    // A UTF-8 locale, as an operator's terminal has: without one the
    // report is ASCII (tests/plain/cli.rs holds both).
    cmd.current_dir(repo())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LANG", "C.UTF-8");
    cmd
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(cmd: &mut Command) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run preflight");
    Run {
        code: status.code().expect("preflight exited by a signal"),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// The run's stdout as a report, read with the product's own types.
pub fn report(run: &Run) -> super::Report {
    super::report(&run.stdout, &run.stderr)
}

/// The run's stdout as untyped JSON: for output that is no report and has
/// no schema type (`list`'s entries); a report is read with `report`.
pub fn json(run: &Run) -> serde_json::Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\n{}", run.stdout, run.stderr))
}

/// Compares with tests/snapshots/NAME, or rewrites it when
/// UPDATE_SNAPSHOTS=1.
pub fn assert_snapshot(name: &str, actual: &str) {
    let path = repo().join("tests/snapshots").join(name);
    // Only `UPDATE_SNAPSHOTS=1` rewrites: `=0` (or any other value) compares.
    if std::env::var("UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, actual).expect("write snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_SNAPSHOTS=1 to create it)",
            path.display()
        )
    });
    assert_eq!(
        expected,
        actual,
        "snapshot {} differs (UPDATE_SNAPSHOTS=1 rewrites it)",
        path.display()
    );
}

pub fn fixture(path: &str) -> String {
    repo().join("fixtures").join(path).display().to_string()
}

pub fn relative(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}
