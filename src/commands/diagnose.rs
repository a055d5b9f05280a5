//! `preflight diagnose`: which rank holds a running job up, on this node,
//! read from /proc without touching the job (see `preflight_diagnose`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::Failure;
use super::format::{self, Format};
use preflight_ground::exit::ExitCode;
use preflight_report::output::Destination;

#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// Only the job this process belongs to.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only the job with this id: a Slurm job id or a TORCHELASTIC_RUN_ID.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
    /// How long the job is watched for movement at most: bytes through
    /// its ranks' calls and connections. A job that moves ends the watch
    /// early; only one that stands still through all of it can be held.
    #[arg(long, alias = "sample", value_name = "DURATION", default_value = "2s", value_parser = parse_watch)]
    pub watch: Duration,
    /// py-spy for each rank's Python stack (`pip install py-spy`):
    /// `auto` (the first on PATH), `off`, or its path.
    #[arg(long, value_name = "auto|off|PATH", default_value = "auto")]
    pub py_spy: String,
    /// NCCL's RAS port (NCCL 2.24+): `auto` (a rank's NCCL_RAS_ADDR, else
    /// localhost:28028, where something listens), `off`, or HOST:PORT.
    #[arg(long, value_name = "auto|off|HOST:PORT", default_value = "auto")]
    pub nccl_ras: String,
    /// Ask each rank whose NCCL process group takes requests for a Flight
    /// Recorder dump (TORCH_NCCL_DEBUG_INFO_PIPE_FILE) for one, and wait
    /// for it (up to 8 s: NCCL's heartbeat thread polls its pipe); the job
    /// goes on.
    #[arg(long)]
    pub ask_dumps: bool,
    #[arg(long, value_parser = format::parser(format::DIAGNOSE), default_value = "human")]
    pub format: Format,
    /// Write to FILE (atomically) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Every node of the job, asked over ssh (`ssh HOST preflight diagnose
    /// ...`, all at once) and merged into one verdict: a comma-separated
    /// list, or @FILE of one host a line. This node is asked only when
    /// listed.
    #[arg(long, value_name = "HOST,...|@FILE")]
    pub hosts: Option<String>,
    /// Every node of a Slurm job (`--job ID`, else SLURM_JOB_ID), each
    /// asked in a step of the job itself (`srun --overlap --jobid ID`, no
    /// ssh needed) and merged into one verdict, as --hosts. For a
    /// watchdog in the batch script (see docs/diagnose.md).
    #[arg(long, conflicts_with_all = ["hosts", "pid"])]
    pub slurm: bool,
    /// An option for ssh, before the host (`--ssh-option=-i --ssh-option
    /// KEY`); repeatable. ssh always gets BatchMode=yes and
    /// ConnectTimeout=5.
    #[arg(long = "ssh-option", value_name = "WORD", allow_hyphen_values = true)]
    pub ssh_options: Vec<String>,
    /// Only the ranks in this process's network namespace: where a node's
    /// jobs run in namespaces of their own (containers), run it inside the
    /// job's.
    #[arg(long)]
    pub this_namespace: bool,
    /// preflight on the other nodes, for --hosts and --slurm.
    #[arg(long, value_name = "PATH", default_value = "preflight")]
    pub remote_preflight: String,
}

fn hosts(list: &str) -> Result<Vec<String>, Failure> {
    let text = match list.strip_prefix('@') {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| Failure::Usage(format!("--hosts @{file}: {e}")))?,
        None => list.replace(',', "\n"),
    };
    let hosts: Vec<String> = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    if hosts.is_empty() {
        return Err(Failure::Usage(format!("--hosts {list}: no host")));
    }
    if let Some(bad) = hosts
        .iter()
        .find(|h| h.starts_with('-') || h.contains(char::is_whitespace))
    {
        return Err(Failure::Usage(format!(
            "--hosts: `{bad}` is not a host name"
        )));
    }
    Ok(hosts)
}

/// The Slurm job's nodes and the job, for --slurm.
fn slurm_nodes(args: &DiagnoseArgs) -> Result<(Vec<String>, String), Failure> {
    let job = args
        .job
        .clone()
        .or_else(|| std::env::var("SLURM_JOB_ID").ok())
        .filter(|j| !j.is_empty())
        .ok_or_else(|| {
            Failure::Usage(
                "--slurm: which job? name it (--job ID), or run it in the job (SLURM_JOB_ID)"
                    .into(),
            )
        })?;
    let env = |k: &str| std::env::var(k).ok();
    let slurm = preflight_run::slurm::scontrol::Slurm::find(None, &env)
        .map_err(|e| Failure::Usage(format!("--slurm: {e}")))?;
    let state = slurm
        .job(&job)
        .map_err(|e| Failure::Usage(format!("--slurm: {e}")))?;
    if state.nodes.is_empty() {
        return Err(Failure::Usage(format!(
            "--slurm: job {job} has no nodes (it is {})",
            state.state
        )));
    }
    Ok((state.nodes, job))
}

/// Across the job's nodes: each asked over ssh or srun, one verdict.
fn across(args: &DiagnoseArgs) -> Result<ExitCode, Failure> {
    if args.pid.is_some() {
        return Err(Failure::Usage(
            "--pid names a process of this node: with --hosts, name the job (--job ID)".into(),
        ));
    }
    let (hosts, via, job) = match &args.hosts {
        Some(list) => (
            hosts(list)?,
            preflight_diagnose::Via::Ssh {
                options: args.ssh_options.clone(),
            },
            args.job.clone(),
        ),
        None => {
            let (nodes, job) = slurm_nodes(args)?;
            (
                nodes,
                preflight_diagnose::Via::Srun { job: job.clone() },
                Some(job),
            )
        }
    };
    if args.format == Format::Prometheus {
        return Err(Failure::Usage(
            "--format prometheus is one node's metrics: run it on each node, without --hosts or --slurm"
                .into(),
        ));
    }
    let ask = preflight_diagnose::Ask {
        py_spy: args.py_spy.clone(),
        nccl_ras: args.nccl_ras.clone(),
        watch: args.watch,
        ask_dumps: args.ask_dumps,
        job,
        this_namespace: args.this_namespace,
    };
    let over = preflight_diagnose::Remote {
        via,
        program: args.remote_preflight.clone(),
        within: ask.within(),
    };
    let (nodes, unreachable) = preflight_diagnose::ask_all(&over, &hosts, &ask.args());
    let c = preflight_diagnose::merge(nodes, unreachable);
    // Prometheus was refused above: one node's metrics each.
    let text = if args.format == Format::Json {
        let mut t =
            serde_json::to_string_pretty(&c).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        t.push('\n');
        t
    } else {
        preflight_report::diagnosis::human_across(&c)
    };
    write(args, &text)?;
    Ok(code(&c.verdict))
}

fn write(args: &DiagnoseArgs, text: &str) -> Result<(), Failure> {
    let destination = match &args.output {
        Some(p) => Destination::File(p.clone()),
        None => Destination::Stdout,
    };
    preflight_report::write_report(&destination, text).map_err(|e| {
        let place = args
            .output
            .as_ref()
            .map_or("stdout".to_string(), |p| p.display().to_string());
        Failure::Usage(format!("cannot write the diagnosis to {place}: {e}"))
    })
}

fn code(verdict: &str) -> ExitCode {
    match verdict {
        "held" => ExitCode::NotReady,
        "progressing" => ExitCode::Ready,
        _ => ExitCode::Incomplete,
    }
}

fn parse_watch(text: &str) -> Result<Duration, String> {
    let d = preflight_ground::values::Span::parse(text)?.0;
    if d < Duration::from_millis(100) || d > Duration::from_secs(60) {
        return Err("between 100ms and 60s".into());
    }
    Ok(d)
}

/// Exit 0 when nothing holds a job up, 1 when a rank is named, 3 when the
/// evidence names none (or no job was found).
pub fn diagnose(args: &DiagnoseArgs) -> Result<ExitCode, Failure> {
    if args.hosts.is_some() || args.slurm {
        return across(args);
    }
    let filter = preflight_diagnose::Filter {
        pid: args.pid,
        job: args.job.clone(),
        own_netns: args.this_namespace,
    };
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let py_spy =
        preflight_facts::py_spy::locate(&args.py_spy, std::env::var("PATH").ok().as_deref());
    let d = preflight_diagnose::diagnose(
        std::path::Path::new("/proc"),
        &node,
        &filter,
        args.watch,
        py_spy,
        &match args.nccl_ras.as_str() {
            "auto" => preflight_diagnose::Ras::Auto,
            "off" => preflight_diagnose::Ras::Off,
            at => preflight_diagnose::Ras::At(at.to_string()),
        },
        args.ask_dumps,
    );
    let text = match args.format {
        Format::Prometheus => preflight_report::diagnosis::prometheus(&d),
        Format::Json => {
            let mut t = serde_json::to_string_pretty(&d)
                .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
            t.push('\n');
            t
        }
        // Human; `--format` takes no other (`format::DIAGNOSE`).
        _ => preflight_report::diagnosis::human(&d),
    };
    write(args, &text)?;
    Ok(code(&d.verdict))
}
