//! `preflight slurm healthcheck|prolog|epilog` on the command line; the
//! modes themselves are `run::slurm`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::Failure;
use preflight_ground::exit::ExitCode;
use preflight_run::slurm::SlurmMode;

#[derive(Debug, Args)]
pub struct SlurmArgs {
    #[command(subcommand)]
    pub mode: ModeArg,
    /// The site configuration directory (default: PREFLIGHT_CONFIG_DIR,
    /// else /etc/preflight).
    #[arg(long, value_name = "DIR", global = true)]
    pub config_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum ModeArg {
    /// For HealthCheckProgram: this node's checklist (the quick tier by
    /// default); drains the node when it is not ready, resumes it when
    /// preflight drained it and it is ready again.
    Healthcheck,
    /// For Prolog: this node's checklist and, with `--cluster` (or the
    /// setting), the cluster stage across the job's allocation before the
    /// job starts; only a node named as the culprit drains itself and
    /// exits non-zero.
    Prolog {
        /// Meet the allocation's other nodes (rendezvous, comparisons,
        /// reachability).
        #[arg(long)]
        cluster: bool,
    },
    /// For Epilog: the checks for what a job leaves behind (tag
    /// `epilog`); drains the node when one fails.
    Epilog,
}

pub fn slurm(args: &SlurmArgs) -> Result<ExitCode, Failure> {
    let mode = match args.mode {
        ModeArg::Healthcheck => SlurmMode::Healthcheck,
        ModeArg::Prolog { cluster } => SlurmMode::Prolog { cluster },
        ModeArg::Epilog => SlurmMode::Epilog,
    };
    preflight_run::slurm::slurm(mode, args.config_dir.as_deref())
}
