//! `torch_distributed`: the framework probe. Runs a small Python script
//! (torch_distributed.py, embedded) with the node's Python and torch, in
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
use serde_json::Value;

use super::command::{excerpt, read_capped};
use super::{IfMissing, KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use crate::facts::Facts;
use crate::result::Finding;
use crate::values::{Span, format_duration};

const SCRIPT: &str = include_str!("torch_distributed.py");
/// Marks the script's own lines on stdout: oneCCL and others print there too.
const MARK: &str = "PREFLIGHT-TORCH ";
/// The variable that names the interpreter when the check does not.
pub const PYTHON_VAR: &str = "PREFLIGHT_PYTHON";
/// Variables `rendezvous: job` needs.
const JOB_VARS: [&str; 4] = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"];

pub const KIND: KindInfo = KindInfo {
    name: "torch_distributed",
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

/// What the script reported, line by line.
#[derive(Debug, Default)]
struct Report {
    python: Option<String>,
    python_version: Option<String>,
    torch: Option<String>,
    backend: Option<String>,
    device: Option<String>,
    device_id: Option<String>,
    takes_device_id: Option<bool>,
    /// The last step the script announced.
    step: Option<String>,
    missing: Option<String>,
    error: Option<(String, String)>,
    done: bool,
    world_size: Option<u64>,
}

impl Report {
    fn parse(stdout: &str) -> Report {
        let mut r = Report::default();
        for line in stdout.lines() {
            let Some(json) = line.strip_prefix(MARK) else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(json) else {
                continue;
            };
            let text = |key: &str| v.get(key).and_then(Value::as_str).map(String::from);
            if let Some(step) = text("step") {
                if step == "done" {
                    r.done = v.get("ok").and_then(Value::as_bool).unwrap_or(false);
                    r.world_size = v.get("world_size").and_then(Value::as_u64);
                } else {
                    r.step = Some(step);
                }
            }
            r.python = text("python").or(r.python.take());
            r.python_version = text("python_version").or(r.python_version.take());
            r.torch = text("torch").or(r.torch.take());
            r.backend = text("backend").or(r.backend.take());
            r.device = text("device").or(r.device.take());
            r.device_id = text("device_id").or(r.device_id.take());
            if let Some(b) = v.get("takes_device_id").and_then(Value::as_bool) {
                r.takes_device_id = Some(b);
            }
            if let Some(m) = text("missing") {
                r.missing = Some(m);
            }
            if let Some(e) = text("error") {
                r.error = Some((text("type").unwrap_or_default(), e));
            }
        }
        r
    }

    /// "torch 2.5.1, nccl (cuda), device_id=cuda:0" as far as known.
    fn measured(&self) -> String {
        let mut parts = vec![match &self.torch {
            Some(v) => format!("torch {v}"),
            None => "torch (version unknown)".to_string(),
        }];
        if let Some(b) = &self.backend {
            parts.push(match &self.device {
                Some(d) => format!("{b} ({d})"),
                None => b.clone(),
            });
        }
        if let Some(id) = &self.device_id {
            parts.push(format!("device_id={id}"));
        }
        parts.join(", ")
    }
}

/// What went wrong, in the operator's terms, and what to do about it.
#[derive(Debug, PartialEq)]
struct Diagnosis {
    summary: String,
    advice: String,
    port: Option<u16>,
}

/// The rendezvous this run used, for messages.
struct Context<'a> {
    rendezvous: Rendezvous,
    port: u16,
    master: Option<&'a str>,
    deadline: Duration,
}

fn capture(re: &str, text: &str) -> Option<String> {
    regex::Regex::new(re)
        .ok()?
        .captures(text)?
        .get(1)
        .map(|m| m.as_str().to_string())
}

/// Maps torch's, Gloo's and the backends' failure texts to a diagnosis.
fn diagnose(kind: &str, text: &str, ctx: &Context) -> Diagnosis {
    let plain = |summary: String, advice: String| Diagnosis {
        summary,
        advice,
        port: None,
    };
    if let Some(device) = capture(r"No backend type associated with device type (\w+)", text) {
        return plain(
            format!("No backend type associated with device type {device}"),
            format!(
                "init_process_group was given device_id={device}:N, which binds every later group to that device; Gloo has no {device} support, so new_group(backend=\"gloo\") for the CPU group fails. Do not pass device_id to init_process_group on {device} (SGLang passes it only for CUDA/ROCm with NCCL), or create the Gloo group without the bound device, or move to a torch release where new_group(backend=\"gloo\") ignores it. `device_id: omit` on this check shows whether the rest works."
            ),
        );
    }
    if text.contains("Address already in use") || text.contains("errno: 98") {
        let port = capture(r":(\d+) \(errno: 98", text)
            .and_then(|p| p.parse().ok())
            .unwrap_or(ctx.port);
        let advice = match ctx.rendezvous {
            Rendezvous::Job => format!(
                "MASTER_PORT {port} is already taken on rank 0's node (TCPStore binds every address): a leftover rank of an earlier job, or another service. Find it with `ss -ltnp 'sport = :{port}'`, end it, or give the job another MASTER_PORT."
            ),
            Rendezvous::Local => format!(
                "port {port}, just handed out free by the kernel, was taken before torch bound it: something on this node is grabbing ports. See `ss -ltnp 'sport = :{port}'`."
            ),
        };
        return Diagnosis {
            summary: format!("port {port} is already in use"),
            advice,
            port: Some(port),
        };
    }
    if let Some(addr) = capture(r"connect \[?(127\.\d+\.\d+\.\d+)\]?", text) {
        return plain(
            format!("a peer tried to connect to loopback address {addr}"),
            format!(
                "Gloo announces the address of the host's name; here it resolves to {addr}, so other nodes are told to connect to themselves. Set GLOO_SOCKET_IFNAME to the interface the nodes share (and NCCL_SOCKET_IFNAME likewise), or fix /etc/hosts so the hostname maps to that interface's address, not 127.x."
            ),
        );
    }
    if let Some(iface) = capture(r"Unable to find address for:? ?(\S+)", text) {
        return plain(
            format!("Gloo found no address for interface {iface}"),
            format!(
                "GLOO_SOCKET_IFNAME (or the hostname Gloo falls back on) names `{iface}`, which is missing or has no IP address here: set it to an interface that is up (`ip -br addr`)."
            ),
        );
    }
    let unbuilt = [
        r"doesn't have (\w+) built in",
        r"Invalid backend: '(\w+)'",
        r"Unknown c10d backend type (\w+)",
        r"Backend (\w+) not available",
        r"(\w+) backend is not available",
        r"has no (\w+) backend",
    ];
    if let Some(backend) = unbuilt.iter().find_map(|re| capture(re, text)) {
        return plain(
            format!("this torch has no {backend} backend"),
            format!(
                "torch.distributed here was built without `{backend}` (or its plugin is not installed: oneccl_bindings_for_pytorch for `ccl`, habana_frameworks for `hccl`). Install the torch build for this node's device, or run the job with a backend it has (`gloo` for CPU)."
            ),
        );
    }
    let no_device = [
        "only supported with GPUs, no GPUs found",
        "Torch not compiled with CUDA enabled",
        "No CUDA GPUs are available",
        "Found no NVIDIA driver",
        "invalid device ordinal",
        "XPU device count is zero",
        "is_available() is False",
    ];
    if no_device.iter().any(|t| text.contains(*t)) {
        return plain(
            format!("no usable device: {}", first_line(text)),
            "The backend needs an accelerator this process cannot use: check the driver (see the accelerators checks), the visibility mask (CUDA_VISIBLE_DEVICES, ZE_AFFINITY_MASK) against LOCAL_RANK, or force `backend: gloo` on CPU nodes.".into(),
        );
    }
    let timed_out = kind.contains("Timeout")
        || kind == "DistStoreError"
        || text.contains("timed out")
        || text.contains("Timed out")
        || text.contains("Socket Timeout");
    if timed_out {
        let advice = match (ctx.rendezvous, ctx.master) {
            (Rendezvous::Job, Some(master)) => format!(
                "No answer from the rendezvous at {master} within {}: every rank must run this check at once (`preflight run` does), rank 0 must be up, and MASTER_PORT must be reachable (see net.master_route and net.firewall).",
                format_duration(ctx.deadline)
            ),
            _ => "torch's store on 127.0.0.1 did not answer in time: the node is overloaded, or a firewall rule drops loopback traffic (see net.firewall).".into(),
        };
        return plain(format!("timed out: {}", first_line(text)), advice);
    }
    if text.contains("Connection refused") {
        return plain(
            format!("connection refused: {}", first_line(text)),
            "Nothing listened where the rank connected: rank 0 is not up yet or died, MASTER_ADDR/MASTER_PORT differ between ranks (see launch.env), or a REJECT rule is in the way (net.firewall).".into(),
        );
    }
    plain(
        format!("{kind}: {}", first_line(text)),
        "Run the job's own start-up with TORCH_DISTRIBUTED_DEBUG=DETAIL (and NCCL_DEBUG=WARN or CCL_LOG_LEVEL=warn) to see more.".into(),
    )
}

/// torch's messages can run to many lines of C++ context; the first one
/// carries the point, cut to a report line.
fn first_line(text: &str) -> String {
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let mut out: String = line.chars().take(300).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
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
            let raced = self.rendezvous == Rendezvous::Local
                && finding.status == crate::result::Status::Fail
                && finding.message.contains("is already in use");
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
        let mut d = diagnose(kind, text, ctx);
        if step == "import" {
            d.advice = format!(
                "torch is installed for {python_shown} but does not import: a missing shared library (LD_LIBRARY_PATH, the CUDA/oneAPI runtime the wheel expects) or a broken install. Run `{python} -c 'import torch'` in the job's environment and reinstall torch if needed."
            );
        }
        if let Some(port) = d.port
            && let Ok(list) = super::port_holder::holders(facts, port)
            && let Some(h) = list.first()
        {
            d.summary.push_str(&format!(", held by {}", h.describe()));
        }
        with_vars(
            Finding::fail(format!("{step} failed: {}", d.summary))
                .expected("init, Gloo group, allreduce and barrier succeed"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(rendezvous: Rendezvous) -> Context<'static> {
        Context {
            rendezvous,
            port: 29500,
            master: Some("10.0.0.1:29500"),
            deadline: Duration::from_secs(40),
        }
    }

    #[test]
    fn known_failure_texts_map_to_their_fix() {
        let local = ctx(Rendezvous::Local);
        let job = ctx(Rendezvous::Job);
        // (exception type, text, mode, summary part, advice part)
        let table: &[(&str, &str, &Context, &str, &str)] = &[
            (
                "RuntimeError",
                "No backend type associated with device type xpu",
                &local,
                "device type xpu",
                "Do not pass device_id",
            ),
            (
                "RuntimeError",
                "The server socket has failed to listen on any local network address. The server socket has failed to bind to [::]:29544 (errno: 98 - Address already in use).",
                &job,
                "port 29544 is already in use",
                "ss -ltnp 'sport = :29544'",
            ),
            (
                "RuntimeError",
                "[/opt/gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:51731: Connection refused",
                &job,
                "loopback address 127.0.1.1",
                "GLOO_SOCKET_IFNAME",
            ),
            (
                "RuntimeError",
                "[enforce fail at ./gloo/transport/tcp/device.cc:80] ifa != nullptr. Unable to find address for: eth9",
                &local,
                "interface eth9",
                "GLOO_SOCKET_IFNAME",
            ),
            (
                "RuntimeError",
                "Distributed package doesn't have NCCL built in",
                &local,
                "no NCCL backend",
                "built without `NCCL`",
            ),
            (
                "ValueError",
                "Invalid backend: 'xccl'",
                &local,
                "no xccl backend",
                "oneccl_bindings_for_pytorch",
            ),
            (
                "RuntimeError",
                "ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
                &local,
                "no usable device",
                "visibility mask",
            ),
            (
                "TimeoutError",
                "The client socket has timed out after 5s while trying to connect to (10.0.0.1, 29500).",
                &job,
                "timed out",
                "every rank must run this check at once",
            ),
            (
                "RuntimeError",
                "Connection refused",
                &job,
                "connection refused",
                "launch.env",
            ),
            (
                "KeyError",
                "something new\nwith context",
                &local,
                "KeyError: something new",
                "TORCH_DISTRIBUTED_DEBUG=DETAIL",
            ),
        ];
        for (kind, text, c, summary, advice) in table {
            let d = diagnose(kind, text, c);
            assert!(d.summary.contains(summary), "{text}: {d:?}");
            assert!(d.advice.contains(advice), "{text}: {d:?}");
        }
        assert_eq!(
            diagnose("RuntimeError", "errno: 98 - Address already in use", &local).port,
            Some(29500)
        );
    }

    #[test]
    fn report_lines_are_read_past_foreign_output() {
        let out = "2026:11:22 oneCCL: some log line\n\
            PREFLIGHT-TORCH {\"step\": \"start\", \"python\": \"/usr/bin/python3\", \"python_version\": \"3.11.2\"}\n\
            PREFLIGHT-TORCH {\"step\": \"import\", \"torch\": \"2.5.1\"}\n\
            PREFLIGHT-TORCH {\"step\": \"device\", \"backend\": \"xccl\", \"device\": \"xpu\", \"device_id\": \"xpu:0\", \"takes_device_id\": true}\n\
            PREFLIGHT-TORCH {\"step\": \"new_group\"}\n\
            PREFLIGHT-TORCH {\"error\": \"No backend type associated with device type xpu\", \"type\": \"RuntimeError\", \"step\": \"new_group\"}\n";
        let r = Report::parse(out);
        assert_eq!(r.step.as_deref(), Some("new_group"));
        assert_eq!(r.measured(), "torch 2.5.1, xccl (xpu), device_id=xpu:0");
        assert_eq!(
            r.error,
            Some((
                "RuntimeError".into(),
                "No backend type associated with device type xpu".into()
            ))
        );
        assert!(!r.done);
    }
}
