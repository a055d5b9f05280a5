//! `torch_distributed`: the framework probe. Runs a small Python script
//! (script.py, embedded) with the node's Python and torch, in
//! the job's own environment, that starts torch.distributed the way a job
//! does: the backend torch would pick for this node's device, a device_id
//! where frameworks pass one, a Gloo CPU group, an allreduce and a barrier.
//! It catches what only the framework layer shows: a torch without the
//! backend, the XPU device_id/Gloo clash, a taken port, Gloo choosing a
//! loopback address.
//!
//! The rendezvous is, by default, a world of one process on 127.0.0.1 and
//! a port the kernel hands out, so the check runs on every rank beside the
//! job's and preflight's own rendezvous without touching either;
//! `rendezvous: job` uses the job's MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE
//! instead, and then every rank must run it at the same time.
//!
//! The interpreter runs in a process group of its own, killed whole at the
//! deadline (and when the check's own timeout drops the probe), so a hung
//! init never outlives the check.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

mod failure_text;
mod output;

use failure_text::{Context, explain, first_line};
use output::Report;

use super::command::{excerpt, read_capped};
use super::{IfMissing, KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use preflight_facts::Facts;
use preflight_ground::values::{Span, format_duration};
use preflight_result::Finding;

const SCRIPT: &str = include_str!("script.py");
/// Marks the script's own lines on stdout: oneCCL and others print there too.
/// The variable that names the interpreter when the check does not.
pub const PYTHON_VAR: &str = "PREFLIGHT_PYTHON";
/// Variables `rendezvous: job` needs.
const JOB_VARS: [&str; 4] = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"];

pub const KIND: KindInfo = KindInfo {
    name: "torch_distributed",
    scope: crate::Scope::Node,
    area: "framework",
    summary: "Starts torch.distributed as a job does (backend for this node's device, device_id, a Gloo CPU group, allreduce, barrier) with the node's Python, under a deadline; known failures come with their fix. Needs Python with torch; skipped under --root.",
    params: &[
        ParamDoc {
            name: "python",
            ty: "string",
            default: Some("$PREFLIGHT_PYTHON, else python3"),
            doc: "The interpreter the job uses (a path, or a name looked up on PATH), e.g. /opt/venv/bin/python.",
        },
        ParamDoc {
            name: "backend",
            ty: "auto|gloo|nccl|xccl|ccl|hccl|mpi|ucc",
            default: Some("auto"),
            doc: "auto: what torch uses for the node's device (nccl for CUDA/ROCm, xccl for XPU, or oneCCL's `ccl` where torch has no xccl, hccl for Gaudi, gloo for CPU). Name one to force it.",
        },
        ParamDoc {
            name: "device_id",
            ty: "auto|pass|omit",
            default: Some("auto"),
            doc: "Whether init_process_group gets device_id=torch.device(type, LOCAL_RANK). auto and pass: on accelerators, where this torch takes it (as SGLang and vLLM do); omit: never.",
        },
        ParamDoc {
            name: "rendezvous",
            ty: "local|job",
            default: Some("local"),
            doc: "local: a one-process world on 127.0.0.1 and a free port (safe beside any other rendezvous). job: init_method env:// with the job's MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; every rank must run the check at once. Skipped when those are unset.",
        },
        ParamDoc {
            name: "deadline",
            ty: "duration",
            default: Some("40s"),
            doc: "The script's own limit; the interpreter's process group is killed then. Keep it below the check's `timeout` so the report names the step that hung. torch's timeouts are set a little shorter.",
        },
        ParamDoc {
            name: "if_missing",
            ty: "error|fail|skip",
            default: Some("skip"),
            doc: "What to report when the interpreter or torch is not installed.",
        },
    ],
    hint_vars: &["advice", "torch", "backend", "python", "step", "port"],
    parse: parse_params::<TorchDistributed>,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum BackendParam {
    Auto,
    Gloo,
    Nccl,
    Xccl,
    Ccl,
    Hccl,
    Mpi,
    Ucc,
}

impl BackendParam {
    fn name(self) -> &'static str {
        match self {
            BackendParam::Auto => "auto",
            BackendParam::Gloo => "gloo",
            BackendParam::Nccl => "nccl",
            BackendParam::Xccl => "xccl",
            BackendParam::Ccl => "ccl",
            BackendParam::Hccl => "hccl",
            BackendParam::Mpi => "mpi",
            BackendParam::Ucc => "ucc",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum DeviceId {
    #[default]
    Auto,
    Pass,
    Omit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum Rendezvous {
    #[default]
    Local,
    Job,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TorchDistributed {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    python: Option<String>,
    #[serde(default = "auto_backend")]
    backend: BackendParam,
    #[serde(default)]
    device_id: DeviceId,
    #[serde(default)]
    rendezvous: Rendezvous,
    #[serde(default = "default_deadline")]
    deadline: Span,
    #[serde(default = "skip_missing")]
    if_missing: IfMissing,
}

fn auto_backend() -> BackendParam {
    BackendParam::Auto
}

fn default_deadline() -> Span {
    Span(Duration::from_secs(40))
}

fn skip_missing() -> IfMissing {
    IfMissing::Skip
}

impl Params for TorchDistributed {
    fn validate(&self) -> Result<(), String> {
        if self.deadline.0 < Duration::from_secs(1) {
            return Err(format!(
                "`deadline` must be at least 1s (it is {}): importing torch alone takes longer",
                self.deadline
            ));
        }
        if self.python.as_deref().is_some_and(|p| p.trim().is_empty()) {
            return Err("`python` is empty: name an interpreter or leave it out".into());
        }
        Ok(())
    }
}

/// Kills the interpreter's whole process group when dropped: at the
/// deadline, after a normal exit (a helper it left behind must not keep
/// the pipes open), and when the engine's timeout drops the probe.
struct GroupKiller(Option<Pid>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH (the group is already gone) is the normal case.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

impl TorchDistributed {
    fn interpreter(&self, facts: &Facts) -> String {
        self.python
            .clone()
            .or_else(|| {
                facts
                    .env(PYTHON_VAR)
                    .filter(|v| !v.trim().is_empty())
                    .map(String::from)
            })
            .unwrap_or_else(|| "python3".into())
    }

    /// torch's own timeouts end a little before ours, so that its message
    /// (which step, which address) reaches the report.
    fn torch_timeout(&self) -> Duration {
        let d = self.deadline.0;
        d.saturating_sub((d / 4).min(Duration::from_secs(5)))
    }

    /// The local world's port is picked here and bound by torch a moment
    /// later: another process can take it in between (on a busy node, an
    /// ephemeral port of some connection). That is a race of ours, not a
    /// finding about the node: another pick, up to three. A port the job
    /// named (`rendezvous: job`) is never retried.
    async fn run(&self, facts: &Facts) -> Finding {
        let mut picks = 0;
        loop {
            picks += 1;
            let finding = self.run_once(facts).await;
            // The diagnosis named the port it could not bind.
            let raced = self.rendezvous == Rendezvous::Local
                && finding.status == preflight_result::Status::Fail
                && finding
                    .vars
                    .iter()
                    .any(|(k, v)| *k == "port" && v.parse::<u16>().is_ok());
            if !raced || picks == 3 {
                return finding;
            }
        }
    }

    async fn run_once(&self, facts: &Facts) -> Finding {
        let python = self.interpreter(facts);
        let master = match self.rendezvous {
            Rendezvous::Local => None,
            Rendezvous::Job => {
                if let Some(var) = JOB_VARS.iter().find(|v| facts.env(v).is_none()) {
                    return Finding::skip(format!(
                        "rendezvous: job needs the launcher's variables, and {var} is not set"
                    ));
                }
                Some(format!(
                    "{}:{}",
                    facts.env("MASTER_ADDR").unwrap_or(""),
                    facts.env("MASTER_PORT").unwrap_or("")
                ))
            }
        };
        let port = match self.rendezvous {
            Rendezvous::Local => match free_port() {
                Ok(p) => p,
                Err(e) => {
                    return Finding::error(format!("cannot get a free port on 127.0.0.1: {e}"));
                }
            },
            Rendezvous::Job => facts
                .env("MASTER_PORT")
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or(0),
        };
        let config = serde_json::json!({
            "backend": self.backend.name(),
            "device_id": match self.device_id {
                DeviceId::Auto => "auto",
                DeviceId::Pass => "true",
                DeviceId::Omit => "false",
            },
            "rendezvous": match self.rendezvous {
                Rendezvous::Local => "local",
                Rendezvous::Job => "job",
            },
            "port": port,
            "timeout_s": self.torch_timeout().as_secs_f64(),
        });
        let spawned = tokio::process::Command::new(&python)
            .arg("-c")
            .arg(SCRIPT)
            .arg(config.to_string())
            // The job's environment as preflight sees it; the working
            // directory is neutral so that no local `torch/` shadows the
            // installed one.
            .env_clear()
            .envs(facts.env_vars())
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return self
                    .if_missing
                    .finding(format!(
                        "{python} not found (set `python:` on the check, or {PYTHON_VAR})"
                    ))
                    .measured("no python")
                    .var("python", python.clone())
                    .var("advice", format!("Install Python with torch, or point {PYTHON_VAR} at the job's interpreter."));
            }
            Err(e) => return Finding::error(format!("cannot run {python}: {e}")),
        };
        let killer = GroupKiller(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .map(Pid::from_raw),
        );
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Finding::error(format!("cannot capture the output of {python}"));
        };
        let out_task = tokio::spawn(read_capped(stdout));
        let err_task = tokio::spawn(read_capped(stderr));
        let status = tokio::time::timeout(self.deadline.0, child.wait()).await;
        // Whatever happened, nothing of the group outlives this point.
        drop(killer);
        let status = match status {
            Ok(Ok(status)) => Some(status),
            Ok(Err(e)) => return Finding::error(format!("cannot wait for {python}: {e}")),
            Err(_) => {
                let _ = child.kill().await;
                None
            }
        };
        // The group is dead, so the pipes close; the bound is for a
        // process that left the group (setsid) and kept them open.
        let grace = Duration::from_secs(2);
        let stdout = tokio::time::timeout(grace, out_task)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let stderr = tokio::time::timeout(grace, err_task)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let stdout = String::from_utf8_lossy(&stdout);
        let stderr = String::from_utf8_lossy(&stderr);
        let report = Report::parse(&stdout);
        let ctx = Context {
            rendezvous: self.rendezvous,
            port,
            master: master.as_deref(),
            deadline: self.deadline.0,
        };
        self.judge(&python, &report, status, &stderr, &ctx, facts)
    }

    fn judge(
        &self,
        python: &str,
        report: &Report,
        status: Option<std::process::ExitStatus>,
        stderr: &str,
        ctx: &Context,
        facts: &Facts,
    ) -> Finding {
        let python_shown = match (&report.python, &report.python_version) {
            (Some(p), Some(v)) => format!("{p} (Python {v})"),
            _ => python.to_string(),
        };
        let step = report.step.clone().unwrap_or_else(|| "start".into());
        let with_vars = |f: Finding, advice: &str, port: Option<u16>| {
            f.measured(report.measured())
                .var("advice", advice.to_string())
                .var("torch", report.torch.clone().unwrap_or_else(|| "?".into()))
                .var(
                    "backend",
                    report
                        .backend
                        .clone()
                        .unwrap_or_else(|| self.backend.name().into()),
                )
                .var("python", python_shown.clone())
                .var("step", step.clone())
                .var("port", port.map_or("none".to_string(), |p| p.to_string()))
        };
        if let Some(module) = &report.missing {
            let finding = self
                .if_missing
                .finding(format!("{module} is not installed for {python_shown}"))
                .measured(format!("no {module}"));
            return finding
                .var("advice", format!("Install torch for {python_shown}, or point {PYTHON_VAR} (or `python:`) at the job's interpreter."))
                .var("python", python_shown.clone())
                .var("torch", "none")
                .var("backend", self.backend.name())
                .var("step", "import")
                .var("port", "none");
        }
        let Some(status) = status else {
            let hung = format!(
                "no answer after {}: stopped in {step}",
                format_duration(ctx.deadline)
            );
            let advice = match step.as_str() {
                "init_process_group" | "new_group" => {
                    "The rendezvous or the backend's communicator creation hung: in a job this is the hang before the first collective. Check the other checks' findings on ports, routes and the firewall; for NCCL, NCCL_DEBUG=INFO shows where it stops."
                }
                "allreduce" | "barrier" => {
                    "The first collective hung: the backend's transport did not connect (for NCCL/oneCCL, an interface or RDMA device that does not reach the peers)."
                }
                "import" | "start" | "device" => {
                    "Importing torch or initialising the device took longer than the deadline: a slow shared file system, or a wedged driver (see the accelerators checks). Raise `deadline` and the check's `timeout` if imports are just slow here."
                }
                _ => "Raise `deadline` if this node is merely slow.",
            };
            let mut message = hung;
            if let Some(line) = stderr.lines().rev().find(|l| !l.trim().is_empty()) {
                message.push_str(&format!(" (last output: {})", first_line(line)));
            }
            return with_vars(
                Finding::fail(message)
                    .expected(format!("done within {}", format_duration(ctx.deadline))),
                advice,
                None,
            );
        };
        if report.done && status.success() {
            let world = report.world_size.unwrap_or(1);
            let rdv = match ctx.rendezvous {
                Rendezvous::Local => format!("one-process world on 127.0.0.1:{}", ctx.port),
                Rendezvous::Job => format!(
                    "world of {world} through {}",
                    ctx.master.unwrap_or("the job's rendezvous")
                ),
            };
            let mut message = format!(
                "init_process_group({}), a Gloo CPU group, allreduce and barrier passed ({rdv})",
                report.backend.as_deref().unwrap_or("?")
            );
            if report.device.as_deref().is_some_and(|d| d != "cpu")
                && self.device_id != DeviceId::Omit
                && report.takes_device_id == Some(false)
            {
                message.push_str("; this torch's init_process_group takes no device_id");
            }
            return with_vars(Finding::pass(message), "", None);
        }
        let Some((kind, text)) = &report.error else {
            let code = status
                .code()
                .map_or("a signal".to_string(), |c| format!("exit {c}"));
            let tail = excerpt(stderr);
            let message = if report.python.is_none() {
                format!("{python} ended with {code} before the probe started: {tail}")
            } else {
                format!("{python_shown} ended with {code} in {step}: {tail}")
            };
            return with_vars(
                Finding::error(message),
                "Run the interpreter by hand in the job's environment to see why it stops.",
                None,
            );
        };
        let mut d = explain(kind, text, ctx);
        if step == "import" {
            d.advice = format!(
                "torch is installed for {python_shown} but does not import: a missing shared library (LD_LIBRARY_PATH, the CUDA/oneAPI runtime the wheel expects) or a broken install. Run `{python} -c 'import torch'` in the job's environment and reinstall torch if needed."
            );
        }
        let mut held = None;
        if let Some(port) = d.port
            && let Ok(list) = super::port_holder::holders(facts, port)
            && let Some(h) = list.first()
        {
            d.summary.push_str(&format!(", held by {}", h.describe()));
            held = Some(h.pid);
        }
        with_vars(
            Finding::fail(format!("{step} failed: {}", d.summary))
                .expected("init, Gloo group, allreduce and barrier succeed")
                .held_by(held),
            &d.advice,
            d.port,
        )
    }
}

/// A port nobody holds now, for the one-process world.
fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

impl Probe for TorchDistributed {
    /// `rendezvous: job` meets the job's whole world: every rank runs it.
    fn every_rank(&self) -> bool {
        self.rendezvous == Rendezvous::Job
    }

    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            // The interpreter and torch of this machine say nothing about a
            // fixture tree.
            if facts.root != std::path::Path::new("/") {
                return Finding::skip(format!(
                    "runs this machine's Python; skipped under --root {}",
                    facts.root.display()
                ));
            }
            self.run(&facts).await
        })
    }
}
