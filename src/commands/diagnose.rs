//! `preflight diagnose`: which rank holds a running job up, on this node,
//! read from /proc without touching the job (see `crate::diagnose`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::Failure;
use crate::exit::ExitCode;
use crate::report::output::Destination;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiagnoseFormat {
    Human,
    Json,
    /// node_exporter's textfile collector (write it with --output).
    Prometheus,
}

#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// Only the job this process belongs to.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only the job with this id: a Slurm job id or a TORCHELASTIC_RUN_ID.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
    /// How long each rank's CPU time is watched.
    #[arg(long, value_name = "DURATION", default_value = "300ms", value_parser = parse_sample)]
    pub sample: Duration,
    /// py-spy for each rank's Python stack (`pip install py-spy`):
    /// `auto` (the first on PATH), `off`, or its path.
    #[arg(long, value_name = "auto|off|PATH", default_value = "auto")]
    pub py_spy: String,
    /// NCCL's RAS port (NCCL 2.24+): `auto` (a rank's NCCL_RAS_ADDR, else
    /// localhost:28028, where something listens), `off`, or HOST:PORT.
    #[arg(long, value_name = "auto|off|HOST:PORT", default_value = "auto")]
    pub nccl_ras: String,
    #[arg(long, value_enum, default_value = "human")]
    pub format: DiagnoseFormat,
    /// Write to FILE (atomically) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

fn parse_sample(text: &str) -> Result<Duration, String> {
    let d = crate::values::Span::parse(text)?.0;
    if d < Duration::from_millis(50) || d > Duration::from_secs(10) {
        return Err("between 50ms and 10s".into());
    }
    Ok(d)
}

/// Exit 0 when nothing holds a job up, 1 when a rank is named, 3 when the
/// evidence names none (or no job was found).
pub fn diagnose(args: &DiagnoseArgs) -> Result<ExitCode, Failure> {
    let filter = crate::diagnose::Filter {
        pid: args.pid,
        job: args.job.clone(),
    };
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let py_spy = crate::facts::py_spy::locate(&args.py_spy, std::env::var("PATH").ok().as_deref());
    let d = crate::diagnose::diagnose(
        std::path::Path::new("/proc"),
        &node,
        &filter,
        args.sample,
        py_spy,
        &match args.nccl_ras.as_str() {
            "auto" => crate::diagnose::Ras::Auto,
            "off" => crate::diagnose::Ras::Off,
            at => crate::diagnose::Ras::At(at.to_string()),
        },
    );
    let text = match args.format {
        DiagnoseFormat::Human => crate::report::diagnosis::human(&d),
        DiagnoseFormat::Prometheus => crate::report::diagnosis::prometheus(&d),
        DiagnoseFormat::Json => {
            let mut t = serde_json::to_string_pretty(&d)
                .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
            t.push('\n');
            t
        }
    };
    let destination = match &args.output {
        Some(p) => Destination::File(p.clone()),
        None => Destination::Stdout,
    };
    crate::report::write_report(&destination, &text).map_err(|e| {
        let place = args
            .output
            .as_ref()
            .map_or("stdout".to_string(), |p| p.display().to_string());
        Failure::Usage(format!("cannot write the diagnosis to {place}: {e}"))
    })?;
    Ok(match d.verdict.as_str() {
        "held" => ExitCode::NotReady,
        "progressing" => ExitCode::Ready,
        _ => ExitCode::Incomplete,
    })
}
