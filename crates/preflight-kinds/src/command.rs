//! `command`: runs a program (argv, never through a shell) under the check's
//! timeout and compares its exit code and output with expectations.

use std::process::Stdio;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{IfMissing, KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use preflight_facts::Facts;
use preflight_ground::values::Pattern;
use preflight_result::Finding;

/// Output kept per stream for matching; the rest is read and dropped so the
/// program never blocks on a full pipe.
const KEEP_BYTES: usize = 256 * 1024;
/// Lines and characters of output quoted in a report.
const EXCERPT_LINES: usize = 8;
const EXCERPT_CHARS: usize = 600;

pub const KIND: KindInfo = KindInfo {
    name: "command",
    scope: crate::Scope::Node,
    area: "system",
    summary: "Runs a program directly (no shell) and checks its exit code and output. Skipped under --root: it would run on this machine, not the tree.",
    params: &[
        ParamDoc {
            name: "argv",
            ty: "list of strings",
            default: None,
            doc: "The program and its arguments. No shell is involved: write [sh, -c, \"...\"] to want one.",
        },
        ParamDoc {
            name: "exit_code",
            ty: "integer",
            default: Some("0"),
            doc: "The exit code that passes.",
        },
        ParamDoc {
            name: "stdout_matches",
            ty: "regex",
            default: Some("unset"),
            doc: "Standard output must match (^ and $ match at line ends).",
        },
        ParamDoc {
            name: "stdout_not_matches",
            ty: "regex",
            default: Some("unset"),
            doc: "Standard output must not match.",
        },
        ParamDoc {
            name: "if_missing",
            ty: "error|fail|skip",
            default: Some("error"),
            doc: "What to report when the program is not installed.",
        },
    ],
    hint_vars: &["exit_code", "stdout", "stderr", "program"],
    parse: parse_params::<CommandCheck>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CommandCheck {
    argv: Vec<String>,
    #[serde(default)]
    exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stdout_matches: Option<Pattern>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stdout_not_matches: Option<Pattern>,
    #[serde(default)]
    if_missing: IfMissing,
}

impl Params for CommandCheck {
    fn validate(&self) -> Result<(), String> {
        match self.argv.first() {
            None => Err("`argv` must name a program: it is empty".into()),
            Some(p) if p.is_empty() => Err("`argv` starts with an empty program name".into()),
            Some(_) => Ok(()),
        }
    }
}

pub(super) async fn read_capped(stream: impl AsyncRead + Unpin) -> Vec<u8> {
    read_up_to(stream, KEEP_BYTES).await
}

/// Reads a stream to its end, keeping its first `keep` bytes.
async fn read_up_to(mut stream: impl AsyncRead + Unpin, keep: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = keep.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

/// The last lines of some output, short enough for a report line.
pub fn excerpt(text: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let start = lines.len().saturating_sub(EXCERPT_LINES);
    let mut tail = lines[start..].join("\n");
    let mut cut = start > 0;
    if tail.chars().count() > EXCERPT_CHARS {
        tail = tail
            .chars()
            .rev()
            .take(EXCERPT_CHARS)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        cut = true;
    }
    if cut { format!("…{tail}") } else { tail }
}

/// What a program did: its exit and its output, each stream kept up to
/// the size asked for (the rest read and dropped).
pub struct Ran {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

pub enum RunError {
    /// The program is not installed (not on PATH).
    NotFound,
    Failed(String),
}

/// Runs a program directly (no shell), stdin closed. Dropping the future
/// (the check's timeout) kills it, so a hung tool does not outlive its
/// check.
pub async fn run_program(argv: &[String], keep: usize) -> Result<Ran, RunError> {
    let program = &argv[0];
    let child = tokio::process::Command::new(program)
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(RunError::NotFound),
        Err(e) => return Err(RunError::Failed(format!("cannot run {program}: {e}"))),
    };
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(RunError::Failed(format!(
            "cannot capture the output of {program}"
        )));
    };
    let (out, err, status) = tokio::join!(
        read_up_to(stdout, keep),
        read_up_to(stderr, keep.min(KEEP_BYTES)),
        child.wait()
    );
    let status = status.map_err(|e| RunError::Failed(format!("cannot wait for {program}: {e}")))?;
    Ok(Ran {
        status,
        stdout: String::from_utf8_lossy(&out).into_owned(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
    })
}

impl CommandCheck {
    async fn run(&self) -> Finding {
        let program = &self.argv[0];
        let Ran {
            status,
            stdout,
            stderr,
        } = match run_program(&self.argv, KEEP_BYTES).await {
            Ok(ran) => ran,
            Err(RunError::NotFound) => {
                return self
                    .if_missing
                    .finding(format!("{program} is not installed (not found on PATH)"));
            }
            Err(RunError::Failed(e)) => return Finding::error(e),
        };
        let code = status.code();
        let measured = match code {
            Some(c) => format!("exit {c}"),
            None => {
                use std::os::unix::process::ExitStatusExt;
                format!("killed by signal {}", status.signal().unwrap_or(0))
            }
        };
        let with_vars = |f: Finding| {
            f.measured(measured.clone())
                .var(
                    "exit_code",
                    code.map_or("none".to_string(), |c| c.to_string()),
                )
                .var("stdout", excerpt(&stdout))
                .var("stderr", excerpt(&stderr))
                .var("program", program.clone())
        };
        if code != Some(self.exit_code) {
            let output = if stderr.trim().is_empty() {
                &stdout
            } else {
                &stderr
            };
            let mut message = format!(
                "{program} ended with {measured}, expected exit {}",
                self.exit_code
            );
            if !output.trim().is_empty() {
                message.push_str(&format!(": {}", excerpt(output)));
            }
            return with_vars(Finding::fail(message).expected(format!("exit {}", self.exit_code)));
        }
        if let Some(p) = &self.stdout_matches
            && p.find(&stdout).is_none()
        {
            return with_vars(
                Finding::fail(format!(
                    "output of {program} does not match /{}/: {}",
                    p.as_str(),
                    excerpt(&stdout)
                ))
                .expected(format!("output matching /{}/", p.as_str())),
            );
        }
        if let Some(p) = &self.stdout_not_matches
            && let Some(found) = p.find_line(&stdout)
        {
            return with_vars(
                Finding::fail(format!("output of {program} contains `{found}`"))
                    .expected(format!("output not matching /{}/", p.as_str())),
            );
        }
        with_vars(Finding::pass(format!(
            "{program} exited {}",
            self.exit_code
        )))
    }
}

impl Probe for CommandCheck {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            // A program of this machine says nothing about a fixture tree.
            if facts.root != std::path::Path::new("/") {
                return Finding::skip(format!(
                    "runs a program of this machine; skipped under --root {}",
                    facts.root.display()
                ));
            }
            self.run().await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_keeps_the_tail() {
        let text: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let e = excerpt(&text);
        assert!(e.starts_with('…'));
        assert!(e.ends_with("line 20"));
        assert!(!e.contains("line 12\n"));
        assert_eq!(excerpt("ok\n"), "ok");
    }
}
