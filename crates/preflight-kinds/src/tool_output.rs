//! A vendor tool's output for a check: the recording the check names
//! (tests, replays of a node's own outputs) or, on the live node, the tool
//! run there. Under `--root` with no recording there is nothing to read,
//! and a tool that is not installed is a skip that says which package has
//! it; a tool that fails is an error with what it said.

use std::path::Path;

use super::command::{RunError, excerpt, run_program};
use preflight_facts::Facts;
use preflight_result::Finding;

/// The most a recording or a tool's output may hold.
pub const MAX_OUTPUT: usize = 16 * 1024 * 1024;

pub enum Output {
    /// The text, and where it came from (the recording's path, or the
    /// command line).
    Text {
        text: String,
        source: String,
    },
    Skip(String),
    Error(String),
}

/// Where a check gets one output of a vendor tool.
pub struct Tool<'a> {
    /// The command on the live node.
    pub argv: Vec<String>,
    /// The check's parameter that names a recording instead.
    pub param: &'static str,
    /// What installs the tool, for the skip that says it is missing.
    pub package: &'a str,
}

impl Tool<'_> {
    pub async fn output(&self, recorded: Option<&Path>, facts: &Facts) -> Output {
        if let Some(path) = recorded {
            let path = path.to_path_buf();
            let read = tokio::task::spawn_blocking(move || {
                preflight_facts::read_bounded(&path, MAX_OUTPUT as u64)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))
                    .map(|text| (text, path.display().to_string()))
            })
            .await
            .unwrap_or_else(|e| Err(format!("reading the recording crashed: {e}")));
            return match read {
                Ok((text, source)) => Output::Text { text, source },
                Err(e) => Output::Error(e),
            };
        }
        let shown = self.argv.join(" ");
        if !facts.is_live() {
            return Output::Skip(format!(
                "no recording under --root: set {} to a recorded `{shown}`",
                self.param
            ));
        }
        match run_program(&self.argv, MAX_OUTPUT).await {
            Ok(ran) if ran.status.success() || !ran.stdout.trim().is_empty() => Output::Text {
                text: ran.stdout,
                source: format!("`{shown}`"),
            },
            Ok(ran) => Output::Error(format!(
                "`{shown}` failed ({}): {}",
                ran.status,
                excerpt(if ran.stderr.trim().is_empty() {
                    &ran.stdout
                } else {
                    &ran.stderr
                })
            )),
            Err(RunError::NotFound) => Output::Skip(format!(
                "{} is not installed ({})",
                self.argv[0], self.package
            )),
            Err(RunError::Failed(e)) => Output::Error(e),
        }
    }
}

impl Output {
    /// The text and where it came from, or the finding that says why
    /// there is none.
    pub fn text(self) -> Result<(String, String), Finding> {
        match self {
            Output::Text { text, source } => Ok((text, source)),
            Output::Skip(reason) => Err(Finding::skip(reason)),
            Output::Error(e) => Err(Finding::error(e)),
        }
    }
}
