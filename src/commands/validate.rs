//! `preflight validate FILE...`: lint checklists without running them. The
//! files are checked as one set, as `--checks` would load them.

use super::{Failure, expand_paths, load_added};
use crate::cli::ValidateArgs;
use crate::exit::ExitCode;
use crate::report::output::write_stdout;

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
                let text = format!("ok: {} files, {} checks\n", files.len(), checks.len());
                write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
            }
            Ok(ExitCode::Ready)
        })
}
