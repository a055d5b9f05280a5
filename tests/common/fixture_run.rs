//! The real binary run over a fixture tree (fixtures/NAME/root) with the
//! fixture's environment and nothing else, its JSON report read back.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

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
    pub report: Value,
    pub code: i32,
}

impl Run {
    pub fn check(&self, id: &str) -> &Value {
        self.report["checks"]
            .as_array()
            .expect("checks array")
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no check {id} in {:#}", self.report))
    }

    pub fn status(&self, id: &str) -> &str {
        self.check(id)["status"].as_str().unwrap()
    }

    pub fn message(&self, id: &str) -> &str {
        self.check(id)["message"].as_str().unwrap()
    }

    pub fn measured(&self, id: &str) -> &str {
        self.check(id)["measured"].as_str().unwrap_or("")
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Run {
        report,
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
        report: serde_json::from_slice(&out.stdout).unwrap(),
        code: out.status.code().unwrap(),
    }
}

pub fn run(name: &str, checklist: &str) -> Run {
    run_with(name, checklist, &[], false)
}

pub fn run_env(name: &str, checklist: &str, env: &[(&str, &str)]) -> Run {
    run_with(name, checklist, env, false)
}
