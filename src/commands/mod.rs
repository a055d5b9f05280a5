//! The subcommands, and what they share: assembling the checklist from the
//! shipped files, `--checks` paths and `--only`/`--skip`.

mod baseline;
mod completions;
mod diagnose;
mod explain;
pub mod format;
mod list;
pub mod manual;
mod report;
mod run_args;
mod slurm;
mod token;
mod validate;
mod webhook;

use clap::Args;

use std::path::PathBuf;

pub use baseline::{BaselineArgs, baseline};
pub use completions::{Shell, completions};
pub use diagnose::{DiagnoseArgs, diagnose};
pub use explain::{ExplainArgs, explain};
pub use list::{ListArgs, list};
pub use manual::man_pages;
pub use report::{ReportArgs, report};
pub use run_args::{RunArgs, hide_ignored, run, unused_flags};
pub use slurm::{SlurmArgs, slurm};
pub use token::token;
pub use validate::{ValidateArgs, validate};
pub use webhook::{WebhookArgs, webhook};

use preflight_facts::Backend;
use preflight_report::style::ColorChoice;
pub use preflight_run::Failure;
pub use preflight_run::settings::Stage;
use preflight_run::settings::{BackendList, ChecklistSettings};

/// Which checks: the shipped checklist, added files, and selection.
#[derive(Debug, Args, Clone)]
pub struct ChecklistArgs {
    /// Add the checks of this YAML file, or of every *.yaml and *.yml in
    /// this directory; a check with a shipped check's id replaces it.
    /// Repeatable.
    #[arg(long = "checks", value_name = "PATH")]
    pub checks: Vec<PathBuf>,
    /// Leave out the shipped checklist: run only the --checks files.
    #[arg(long)]
    pub no_shipped: bool,
    /// Run only checks with this id or tag. Repeatable.
    #[arg(long = "only", value_name = "ID|TAG")]
    pub only: Vec<String>,
    /// Leave out checks with this id or tag. Repeatable; wins over --only.
    #[arg(long = "skip", value_name = "ID|TAG")]
    pub skip: Vec<String>,
    /// Also run the opt-in checks with this id or tag, beside the rest
    /// (--only would run them alone). Repeatable.
    #[arg(long = "with", value_name = "ID|TAG")]
    pub with: Vec<String>,
    /// Read /sys, /proc, /dev and /etc under this directory instead of /
    /// (fixture trees); `command` checks skip, since they would run
    /// programs of this machine, not the tree's.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Collective backends the job will use, for checks that apply to one
    /// backend (`when: {backend: nccl}`): comma-separated tcp, nccl,
    /// oneccl, or auto for all.
    #[arg(long, value_name = "LIST", default_value = "auto", value_parser = parse_backends)]
    pub backends: BackendList,
    /// The init method the job passes to init_process_group (e.g.
    /// tcp://10.0.0.1:29500): launch_env fails when its host or port differs
    /// from MASTER_ADDR/MASTER_PORT.
    #[arg(long, value_name = "URL")]
    pub init_method: Option<String>,
}

impl ChecklistArgs {
    pub fn settings(&self) -> ChecklistSettings {
        ChecklistSettings {
            checks: self.checks.clone(),
            no_shipped: self.no_shipped,
            only: self.only.clone(),
            skip: self.skip.clone(),
            with: self.with.clone(),
            root: self.root.clone(),
            backends: self.backends.clone(),
            init_method: self.init_method.clone(),
        }
    }
}

fn parse_backends(text: &str) -> Result<BackendList, String> {
    if text.trim() == "auto" {
        return Ok(BackendList(Backend::ALL.to_vec(), false));
    }
    let mut list = Vec::new();
    for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let backend = Backend::ALL
            .into_iter()
            .find(|b| b.name() == name)
            .ok_or_else(|| format!("unknown backend `{name}`; valid: tcp, nccl, oneccl, auto"))?;
        if !list.contains(&backend) {
            list.push(backend);
        }
    }
    if list.is_empty() {
        return Err("name at least one backend, or auto".into());
    }
    Ok(BackendList(list, true))
}

/// `--color`: the choice is the report's (`ColorChoice`); its spelling
/// on the command line is this layer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Color {
    Auto,
    Always,
    Never,
}

impl From<Color> for ColorChoice {
    fn from(c: Color) -> ColorChoice {
        match c {
            Color::Auto => ColorChoice::Auto,
            Color::Always => ColorChoice::Always,
            Color::Never => ColorChoice::Never,
        }
    }
}
