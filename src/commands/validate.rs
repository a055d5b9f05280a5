//! `preflight validate FILE...`: lint checklists without running them. The
//! files are checked as one set, as `--checks` would load them.

use std::path::PathBuf;

use clap::Args;

use super::{Failure, expand_paths, load_added};
use crate::exit::ExitCode;
use crate::report::output::write_stdout;

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Checklist files or directories.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Print only errors.
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn validate(args: &ValidateArgs) -> Result<ExitCode, Failure> {
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
