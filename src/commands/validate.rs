//! `preflight validate FILE...`: lint checklists without running them. The
//! files are checked as one set, as `--checks` would load them.
//! `preflight validate --site [DIR]`: the site configuration the `slurm`
//! modes read (settings.yaml and checks.d/), including that every mode's
//! `only` and `skip` name a check or tag that exists.

use std::path::{Path, PathBuf};

use clap::Args;

use super::site::Settings;
use super::{ChecklistArgs, Failure, all_checks, expand_paths, load_added, select};
use crate::exit::ExitCode;
use crate::report::output::write_stdout;

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Checklist files or directories.
    #[arg(required_unless_present = "site", value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Validate the site configuration (settings.yaml and checks.d/*.yaml)
    /// that `preflight slurm` reads.
    #[arg(long)]
    pub site: bool,
    /// With --site: the configuration directory (default:
    /// PREFLIGHT_CONFIG_DIR, else /etc/preflight).
    #[arg(long, value_name = "DIR", requires = "site")]
    pub config_dir: Option<PathBuf>,
    /// Print only errors.
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn validate(args: &ValidateArgs) -> Result<ExitCode, Failure> {
    if args.site {
        return site(
            &Settings::dir_from_env(args.config_dir.as_deref()),
            args.quiet,
        );
    }
    let files = expand_paths(&args.files)?;
    if files.is_empty() {
        return Err(Failure::Usage(
            "no *.yaml or *.yml files to validate".into(),
        ));
    }
    let checks = load_added(&files)?;
    crate::checklist::assemble(Vec::new(), checks)
        .map_err(Failure::Checklist)
        .and_then(|checks| {
            if !args.quiet {
                let text = format!(
                    "ok: {}, {}\n",
                    crate::values::count(files.len(), "file"),
                    crate::values::count(checks.len(), "check")
                );
                write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
            }
            Ok(ExitCode::Ready)
        })
}

/// The site configuration as the `slurm` modes will read it.
fn site(dir: &Path, quiet: bool) -> Result<ExitCode, Failure> {
    let settings = Settings::load(dir)?;
    let checks_dir = settings.checks_dir();
    let files = if checks_dir.is_dir() {
        expand_paths(std::slice::from_ref(&checks_dir))?
    } else {
        Vec::new()
    };
    let shipped = ChecklistArgs::shipped_with(files.clone());
    all_checks(&shipped)?;
    let mut problems = Vec::new();
    for (name, mode) in [
        ("healthcheck", &settings.healthcheck),
        ("prolog", &settings.prolog),
        ("epilog", &settings.epilog),
    ] {
        let selection = ChecklistArgs {
            only: mode.only.clone(),
            skip: mode.skip.clone(),
            with: mode.with.clone(),
            ..shipped.clone()
        };
        match select(all_checks(&shipped)?, &selection) {
            Ok(c) if c.is_empty() => {
                problems.push(format!("{name}: `only` and `skip` leave no check to run"))
            }
            Ok(_) => {}
            Err(e) => problems.push(format!(
                "{name}: {}",
                e.to_string().trim_start_matches("error: ")
            )),
        }
    }
    if !problems.is_empty() {
        return Err(Failure::Usage(format!(
            "{}: {}",
            settings.source,
            problems.join("; ")
        )));
    }
    if !quiet {
        let text = format!(
            "ok: {} ({}), {} in {}\n",
            dir.display(),
            settings.source,
            crate::values::count(files.len(), "site checklist file"),
            checks_dir.display()
        );
        write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
    }
    Ok(ExitCode::Ready)
}
