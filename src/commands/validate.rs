//! `preflight validate FILE...`: lint checklists without running them. The
//! files are checked as one set, as `--checks` would load them.
//! `preflight validate --site [DIR]`: the site configuration the `slurm`
//! modes read (settings.yaml and checks.d/), including that every mode's
//! `only` and `skip` name a check or tag that exists.

use std::path::{Path, PathBuf};

use clap::Args;

use super::Failure;
use preflight_ground::exit::ExitCode;
use preflight_report::output::write_stdout;
use preflight_run::selection::{expand_paths, load_added};
use preflight_run::site::Settings;

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
    // Valid, but most likely not what its author meant.
    for file in &files {
        let name = format!("{}:", file.display());
        if !checks.iter().any(|c| c.source.starts_with(&name)) {
            eprintln!(
                "warning: {}: no checks (an empty file, or `checks:` with no list under it)",
                file.display()
            );
        }
    }
    preflight_checklist::assemble(Vec::new(), checks)
        .map_err(Failure::Checklist)
        .and_then(|checks| {
            if !args.quiet {
                let text = format!(
                    "ok: {}, {}\n",
                    preflight_ground::values::count(files.len(), "file"),
                    preflight_ground::values::count(checks.len(), "check")
                );
                write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
            }
            Ok(ExitCode::Ready)
        })
}

/// The site configuration as the `slurm` modes will read it
/// (`site::validate`): its warnings on stderr, and a line on stdout.
fn site(dir: &Path, quiet: bool) -> Result<ExitCode, Failure> {
    let valid = preflight_run::site::validate(dir)?;
    for w in &valid.warnings {
        eprintln!("warning: {w}");
    }
    if !quiet {
        let text = format!(
            "ok: {} ({}), {} in {}{}\n",
            dir.display(),
            valid.source,
            preflight_ground::values::count(valid.files, "site checklist file"),
            valid.checks_dir.display(),
            valid
                .profile
                .map(|p| format!(", node profile {}", p.display()))
                .unwrap_or_default()
        );
        write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
    }
    Ok(ExitCode::Ready)
}
