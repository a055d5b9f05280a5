//! `time_sync`: the kernel clock is disciplined (adjtimex: STA_UNSYNC
//! clear, maxerror and esterror small) and a time daemon runs.
//!
//! On the real machine the state comes from adjtimex(2) itself, through
//! the `adjtimex-sys` crate (this crate has no `unsafe`); where a sandbox
//! refuses the call, from what else asks the kernel: `adjtimex --print`,
//! `timedatectl show` (systemd derives NTPSynchronized from STA_UNSYNC) or
//! `chronyc tracking` (Leap status). Under `--root`, a recording of any of
//! them via `clock_state`, or /run/systemd/timesync/synchronized, which
//! systemd-timesyncd creates once it has set the clock.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params, problems_finding};
use preflight_facts::Facts;
use preflight_ground::values::{Span, format_duration};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "time_sync",
    scope: crate::Scope::Node,
    area: "time",
    summary: "The kernel clock is synchronised (adjtimex status, maxerror, esterror) and chronyd, ntpd or systemd-timesyncd is running.",
    params: &[
        ParamDoc {
            name: "max_error",
            ty: "duration",
            default: Some("unset"),
            doc: "The kernel's maximum error estimate (adjtimex maxerror) must be at most this, e.g. 100ms. Needs adjtimex output.",
        },
        ParamDoc {
            name: "daemon",
            ty: "bool",
            default: Some("true"),
            doc: "A time daemon (chronyd, ntpd, systemd-timesyncd, ptp4l) must be running.",
        },
        ParamDoc {
            name: "clock_state",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `adjtimex --print`, `timedatectl show` or `chronyc tracking` output to read instead of running them (relative to the working directory).",
        },
    ],
    hint_vars: &["daemons"],
    parse: parse_params::<TimeSync>,
};

/// STA_UNSYNC in adjtimex's status: the clock is not synchronised.
const STA_UNSYNC: u64 = 0x0040;

/// Daemon command names as /proc/PID/comm shows them (15 characters at
/// most: systemd-timesyncd is "systemd-timesyn").
const DAEMONS: &[&str] = &[
    "chronyd",
    "ntpd",
    "systemd-timesyn",
    "ptp4l",
    "phc2sys",
    "openntpd",
];

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TimeSync {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_error: Option<Span>,
    #[serde(default = "yes")]
    daemon: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    clock_state: Option<PathBuf>,
}

impl Params for TimeSync {}

/// What the kernel says about its clock.
#[derive(Debug, Default, PartialEq)]
pub struct ClockState {
    pub source: String,
    pub synchronized: Option<bool>,
    /// Microseconds.
    pub maxerror: Option<u64>,
    pub esterror: Option<u64>,
}

/// Parses `adjtimex --print` ("status: 8193", "maxerror: 16000000") and
/// `timedatectl show` ("NTPSynchronized=yes") alike.
pub fn parse_clock_state(source: &str, text: &str) -> ClockState {
    let mut state = ClockState {
        source: source.to_string(),
        ..ClockState::default()
    };
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':').or_else(|| line.split_once('=')) else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "status" => {
                state.synchronized = value.parse::<u64>().ok().map(|s| s & STA_UNSYNC == 0);
            }
            "maxerror" => state.maxerror = value.parse().ok(),
            "esterror" => state.esterror = value.parse().ok(),
            "NTPSynchronized" => state.synchronized = Some(value == "yes"),
            // chronyc tracking: chrony's own view, which it also pushes
            // into the kernel (STA_UNSYNC) when it syncs the clock.
            "Leap status" => state.synchronized = Some(value != "Not synchronised"),
            _ => {}
        }
    }
    state
}

async fn run(program: &str, args: &[&str]) -> Option<String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

impl TimeSync {
    async fn clock_state(&self, facts: &Facts) -> Result<Option<ClockState>, String> {
        if let Some(path) = &self.clock_state {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            return Ok(Some(parse_clock_state(&path.display().to_string(), &text)));
        }
        if facts.is_live() {
            // A sandbox may refuse the call; the tools below may still know.
            if let Ok(kernel) = adjtimex_sys::read() {
                return Ok(Some(ClockState {
                    source: "adjtimex(2)".into(),
                    synchronized: Some(kernel.synchronized()),
                    maxerror: u64::try_from(kernel.maxerror_us).ok(),
                    esterror: u64::try_from(kernel.esterror_us).ok(),
                }));
            }
            if let Some(text) = run("adjtimex", &["--print"]).await {
                return Ok(Some(parse_clock_state("adjtimex --print", &text)));
            }
            if let Some(text) = run("timedatectl", &["show"]).await {
                let state = parse_clock_state("timedatectl show", &text);
                if state.synchronized.is_some() {
                    return Ok(Some(state));
                }
            }
            if let Some(text) = run("chronyc", &["-n", "tracking"]).await {
                let state = parse_clock_state("chronyc tracking", &text);
                if state.synchronized.is_some() {
                    return Ok(Some(state));
                }
            }
        }
        let flag = "/run/systemd/timesync/synchronized";
        if facts.host_path(flag).exists() {
            return Ok(Some(ClockState {
                source: flag.into(),
                synchronized: Some(true),
                ..ClockState::default()
            }));
        }
        Ok(None)
    }

    fn judge(&self, facts: &Facts, state: Option<ClockState>) -> Finding {
        let mut problems = Vec::new();
        let mut notes = Vec::new();
        let running: Vec<&str> = DAEMONS
            .iter()
            .copied()
            .filter(|d| facts.processes().iter().any(|p| p == d))
            .collect();
        if self.daemon {
            if running.is_empty() {
                problems.push(
                    "no time daemon is running (chronyd, ntpd, systemd-timesyncd, ptp4l)".into(),
                );
            } else {
                notes.push(format!("{} running", running.join(", ")));
            }
        }
        match &state {
            Some(s) => {
                if s.synchronized == Some(false) {
                    problems.push(format!(
                        "the kernel clock is not synchronised (STA_UNSYNC set, from {})",
                        s.source
                    ));
                } else if s.synchronized == Some(true) {
                    notes.push(format!("clock synchronised ({})", s.source));
                }
                if let (Some(max), Some(err)) = (self.max_error, s.maxerror) {
                    let err_d = std::time::Duration::from_micros(err);
                    if err_d > max.0 {
                        problems.push(format!(
                            "the kernel's maximum clock error is {} (estimated {}), expected at most {max}",
                            format_duration(err_d),
                            s.esterror
                                .map(|e| format_duration(std::time::Duration::from_micros(e)))
                                .unwrap_or_else(|| "unknown".into())
                        ));
                    }
                }
            }
            None => notes.push(
                "kernel clock state unknown (no adjtimex, timedatectl or timesyncd flag)".into(),
            ),
        }
        let daemons = if running.is_empty() {
            "none".to_string()
        } else {
            running.join(", ")
        };
        let measured = match state.as_ref().and_then(|s| s.synchronized) {
            Some(true) => "synchronised",
            Some(false) => "unsynchronised",
            None => "unknown",
        };
        let finding = if problems.is_empty() {
            Finding::pass(notes.join("; "))
        } else {
            problems_finding(&problems)
        };
        finding.measured(measured).var("daemons", daemons)
    }
}

impl Probe for TimeSync {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            match self.clock_state(&facts).await {
                Ok(state) => tokio::task::spawn_blocking(move || self.judge(&facts, state))
                    .await
                    .unwrap_or_else(|e| Finding::error(format!("probe crashed: {e}"))),
                Err(e) => Finding::error(e),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjtimex_and_timedatectl_outputs() {
        let s = parse_clock_state(
            "a",
            "         mode: 0\n     maxerror: 16000000\n     esterror: 16000000\n       status: 64\n",
        );
        assert_eq!(s.synchronized, Some(false));
        assert_eq!(s.maxerror, Some(16_000_000));
        let s = parse_clock_state("a", "status: 8193\nmaxerror: 2500\n");
        assert_eq!(s.synchronized, Some(true));
        let s = parse_clock_state("t", "Timezone=UTC\nNTPSynchronized=no\n");
        assert_eq!(s.synchronized, Some(false));
        let s = parse_clock_state(
            "c",
            "Reference ID    : C0A80101 (192.168.1.1)\nStratum         : 3\nLeap status     : Not synchronised\n",
        );
        assert_eq!(s.synchronized, Some(false));
        let s = parse_clock_state("c", "Leap status     : Normal\n");
        assert_eq!(s.synchronized, Some(true));
    }
}
