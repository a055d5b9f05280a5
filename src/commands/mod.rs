//! The subcommands, and what they share: assembling the checklist from the
//! shipped files, `--checks` paths and `--only`/`--skip`.

mod baseline;
mod completions;
mod diagnose;
mod emit;
mod explain;
pub mod format;
mod list;
pub mod manual;
mod node;
pub mod post;
#[cfg(feature = "rank-sim")]
pub mod rank_sim;
mod report;
mod run;
pub mod site;
mod slurm;
mod token;
mod validate;
mod waiting;
mod webhook;

use clap::Args;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use baseline::{BaselineArgs, baseline};
pub use completions::{Shell, completions};
pub use diagnose::{DiagnoseArgs, diagnose};
pub use explain::{ExplainArgs, explain};
pub use list::{ListArgs, list};
pub use manual::man_pages;
pub use report::{ReportArgs, report};
pub use run::args::{hide_ignored, unused_flags};
pub use run::{RunArgs, Stage, run};
pub use slurm::{SlurmArgs, slurm};
pub use token::token;
pub use validate::{ValidateArgs, validate};
pub use webhook::{WebhookArgs, webhook};

use crate::checklist::{self, Check, ChecklistError, ChecklistErrors};
use crate::exit::ExitCode;
use crate::facts::Backend;
use crate::facts::Facts;
use crate::report::style::ColorChoice;

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
    /// Whether `--only` or `--with` names this check: an opt-in check
    /// runs only then.
    pub fn named(&self, c: &Check) -> bool {
        self.only.iter().chain(&self.with).any(|s| c.selected_by(s))
    }

    /// The shipped checklist plus `checks`, nothing selected: as a
    /// command that takes no checklist flags (the `slurm` modes) starts.
    pub fn shipped_with(checks: Vec<PathBuf>) -> ChecklistArgs {
        ChecklistArgs {
            checks,
            no_shipped: false,
            only: Vec::new(),
            skip: Vec::new(),
            with: Vec::new(),
            root: PathBuf::from("/"),
            backends: BackendList(Backend::ALL.to_vec(), false),
            init_method: None,
        }
    }
}

/// The backends selected; `explicit` when named rather than `auto`: a
/// backend named on the command line is required (missing: not ready),
/// while `auto` skips the ones a node lacks.
#[derive(Debug, Clone)]
pub struct BackendList(pub Vec<Backend>, pub bool);

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

/// Why a command could not do its job; every case is exit code 2.
#[derive(Debug)]
pub enum Failure {
    /// A usage or configuration error: exit 2.
    Usage(String),
    Checklist(ChecklistErrors),
    /// The run could not start what it needs (its async runtime, its own
    /// program to start the ranks): nothing was evaluated, so the verdict
    /// is incomplete, exit 3, never a usage error.
    Runtime(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(m) | Failure::Runtime(m) => write!(f, "error: {m}"),
            Failure::Checklist(e) => write!(f, "{e}"),
        }
    }
}

impl Failure {
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Failure::Usage(_) | Failure::Checklist(_) => ExitCode::Usage,
            Failure::Runtime(_) => ExitCode::Incomplete,
        }
    }
}

impl From<ChecklistErrors> for Failure {
    fn from(e: ChecklistErrors) -> Failure {
        Failure::Checklist(e)
    }
}

/// The YAML files a `--checks` path stands for: the file itself, or a
/// directory's *.yaml and *.yml files in name order.
pub fn expand_paths(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Failure> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path)
            .map_err(|e| Failure::Usage(format!("checklist path {}: {e}", path.display())))?;
        if meta.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| {
                    Failure::Usage(format!("checklist directory {}: {e}", path.display()))
                })?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| is_yaml(p))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

/// Loads every file, collecting all errors before giving up.
pub fn load_added(files: &[PathBuf]) -> Result<Vec<Check>, ChecklistErrors> {
    let mut checks = Vec::new();
    let mut errors: Vec<ChecklistError> = Vec::new();
    for file in files {
        match checklist::load_file(file) {
            Ok(mut loaded) => checks.append(&mut loaded),
            Err(ChecklistErrors(mut e)) => errors.append(&mut e),
        }
    }
    if errors.is_empty() {
        Ok(checks)
    } else {
        Err(ChecklistErrors(errors))
    }
}

/// The results `run` and `bench` print that no checklist defines.
pub fn built_in_results() -> Vec<crate::result::built_in::BuiltIn> {
    let mut out = crate::cluster::built_in_results();
    out.extend(crate::collective::checks::built_in_results());
    out
}

/// Why `check` on this node would not run `check`, or `None` when it
/// would: `list` and `explain` say the same.
pub fn not_here(c: &Check, args: &ChecklistArgs, facts: &Facts) -> Option<String> {
    if c.opt_in && !args.named(c) {
        Some(format!(
            "opt-in: runs only with --only or --with {}",
            c.tags.first().unwrap_or(&c.id)
        ))
    } else if c.evaluator() != crate::checklist::Evaluator::Node {
        // `check` never runs it; `run` does, across the nodes.
        Some("preflight run only: it compares nodes (check meets none)".to_string())
    } else {
        c.when.unmet(facts)
    }
}

/// Every check this invocation knows, before `--only`/`--skip`.
pub fn all_checks(args: &ChecklistArgs) -> Result<Vec<Check>, Failure> {
    let files = expand_paths(&args.checks)?;
    let shipped = if args.no_shipped {
        Vec::new()
    } else {
        let mut checks = Vec::new();
        for source in checklist::shipped() {
            checks.append(&mut checklist::load_text(&source.name, &source.text)?);
        }
        checks
    };
    let added = load_added(&files)?;
    Ok(checklist::assemble(shipped, added)?)
}

/// The checks selected by `--only` and `--skip`. A selector that names no
/// check is an error: a typo must not silently run nothing.
pub fn select(checks: Vec<Check>, args: &ChecklistArgs) -> Result<Vec<Arc<Check>>, Failure> {
    let named = |c: &Check| args.named(c);
    Ok(select_all(checks, args)?
        .into_iter()
        .filter(|c| !c.opt_in || named(c))
        .collect())
}

/// As `select`, keeping opt-in checks that `--only` does not name (`list`
/// shows them, saying how to run them).
pub fn select_all(checks: Vec<Check>, args: &ChecklistArgs) -> Result<Vec<Arc<Check>>, Failure> {
    for selector in args.only.iter().chain(&args.skip).chain(&args.with) {
        if !checks.iter().any(|c| c.selected_by(selector)) {
            let flag = if args.only.contains(selector) {
                "--only"
            } else if args.skip.contains(selector) {
                "--skip"
            } else {
                "--with"
            };
            let mut message = format!("{flag} `{selector}` matches no check id or tag");
            let names: Vec<&str> = checks
                .iter()
                .flat_map(|c| {
                    std::iter::once(c.id.as_str()).chain(c.tags.iter().map(String::as_str))
                })
                .collect();
            if let Some(s) = crate::suggest::did_you_mean(selector, names) {
                message.push_str(&format!(" (did you mean `{s}`?)"));
            }
            return Err(Failure::Usage(message));
        }
    }
    Ok(checks
        .into_iter()
        .filter(|c| args.only.is_empty() || args.only.iter().any(|s| c.selected_by(s)))
        .filter(|c| !args.skip.iter().any(|s| c.selected_by(s)))
        .map(Arc::new)
        .collect())
}

/// This node's facts, with the job's environment: `env` where a command
/// makes one (a Slurm prolog gives the stages their identity so), else
/// this process's.
pub fn facts(
    args: &ChecklistArgs,
    env: Option<std::collections::BTreeMap<String, String>>,
) -> Result<Facts, Failure> {
    if !args.root.is_dir() {
        return Err(Failure::Usage(format!(
            "--root {}: not a directory",
            args.root.display()
        )));
    }
    let backends = args.backends.0.clone();
    let facts = match env {
        Some(env) => Facts::new(args.root.clone(), env, backends),
        None => Facts::from_process(args.root.clone(), backends),
    };
    Ok(facts.with_init_method(args.init_method.clone()))
}

/// `--color`: the choice is the report's; its spelling on the command line
/// is this layer's.
impl clap::ValueEnum for ColorChoice {
    fn value_variants<'a>() -> &'a [Self] {
        &[ColorChoice::Auto, ColorChoice::Always, ColorChoice::Never]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(match self {
            ColorChoice::Auto => "auto",
            ColorChoice::Always => "always",
            ColorChoice::Never => "never",
        }))
    }
}

#[cfg(test)]
mod failure_tests {
    use super::*;

    /// Exit 2 is for usage and configuration alone: a run that could not
    /// start what it needs evaluated nothing, and says incomplete.
    #[test]
    fn only_usage_and_configuration_exit_2() {
        assert_eq!(Failure::Usage("x".into()).exit_code(), ExitCode::Usage);
        assert_eq!(
            Failure::Runtime("cannot start the async runtime".into()).exit_code(),
            ExitCode::Incomplete
        );
        assert_eq!(
            Failure::Runtime("r".into()).to_string(),
            "error: r",
            "said as an error, like the others"
        );
    }
}
