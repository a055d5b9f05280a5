//! The real binary run over a fixture tree (fixtures/NAME/root) with the
//! fixture's environment and nothing else, its JSON report read back.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub use super::BIN;

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// The fixture's `env` file: KEY=VALUE lines.
pub fn fixture_env(name: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(fixture(name).join("env")).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub struct Run {
    pub report: super::Report,
    pub code: i32,
}

impl Run {
    pub fn check(&self, id: &str) -> &super::CheckResult {
        super::result(&self.report, id)
    }

    pub fn status(&self, id: &str) -> &str {
        super::status(&self.report, id)
    }

    pub fn message(&self, id: &str) -> &str {
        super::message(&self.report, id)
    }

    pub fn measured(&self, id: &str) -> &str {
        super::measured(&self.report, id)
    }

    pub fn hint(&self, id: &str) -> &str {
        super::hint(&self.report, id)
    }
}

/// Runs `preflight check` over a fixture with a checklist in which
/// `{fixture}` stands for the fixture's directory.
pub fn run_with(name: &str, checklist: &str, extra_env: &[(&str, &str)], shipped: bool) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("checks.yaml");
    let text = checklist.replace("{fixture}", &fixture(name).display().to_string());
    std::fs::write(&file, text).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .envs(fixture_env(name))
        .envs(extra_env.iter().copied())
        .arg("check")
        .arg("--root")
        .arg(fixture(name).join("root"))
        .args(["--format", "json"]);
    if !shipped {
        cmd.arg("--no-shipped").arg("--checks").arg(&file);
    }
    let out = cmd.output().expect("run preflight");
    Run {
        report: super::report_of(&out),
        code: out.status.code().unwrap_or(-1),
    }
}

/// The binary over a temporary root the test built, with only `env`.
pub fn run_on_root(root: &Path, checklist: &Path, env: &[(&str, &str)]) -> Run {
    let out = Command::new(BIN)
        .env_clear()
        .envs(env.iter().copied())
        .args(["check", "--no-shipped", "--format", "json", "--checks"])
        .arg(checklist)
        .arg("--root")
        .arg(root)
        .output()
        .unwrap();
    Run {
        report: super::report_of(&out),
        code: out.status.code().unwrap(),
    }
}

pub fn run(name: &str, checklist: &str) -> Run {
    run_with(name, checklist, &[], false)
}

pub fn run_env(name: &str, checklist: &str, env: &[(&str, &str)]) -> Run {
    run_with(name, checklist, env, false)
}
