//! `preflight explain ID`: everything an operator needs to trust or fix a
//! check: what it verifies, how it is configured, why, and the fix.

use clap::Args;

use super::ChecklistArgs;

use super::Failure;
use preflight_checklist::explain;
use preflight_ground::exit::ExitCode;
use preflight_kinds as kinds;
use preflight_report::output::write_stdout;
use preflight_run::selection::{all_checks, built_in_results, facts, not_here};

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The check's id (see `preflight list`), or a kind's name.
    pub id: String,
    #[command(flatten)]
    pub checklist: ChecklistArgs,
}

pub fn explain(args: &ExplainArgs) -> Result<ExitCode, Failure> {
    let checklist = args.checklist.settings();
    let checks = all_checks(&checklist)?;
    let built = built_in_results();
    let text = if let Some(check) = checks.iter().find(|c| c.id == args.id) {
        let here = facts(&checklist, None)?.pipe(|f| not_here(check, &checklist, &f));
        explain::check(check, here)
    } else if let Some(b) = built.iter().find(|b| b.id == args.id) {
        explain::built_in(b)
    } else if let Some(kind) = kinds::lookup(&args.id) {
        explain::kind(kind)
    } else {
        let ids: Vec<&str> = checks
            .iter()
            .map(|c| c.id.as_str())
            .chain(built.iter().map(|b| b.id.as_str()))
            .chain(kinds::names())
            .collect();
        let mut message = format!("no check or kind named `{}`", args.id);
        if let Some(s) = preflight_ground::suggest::did_you_mean(&args.id, ids) {
            message.push_str(&format!(" (did you mean `{s}`?)"));
        }
        message.push_str("; `preflight list` shows every check");
        return Err(Failure::Usage(message));
    };
    write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
    Ok(ExitCode::Ready)
}

trait Pipe: Sized {
    fn pipe<T>(self, f: impl FnOnce(Self) -> T) -> T {
        f(self)
    }
}
impl<T> Pipe for T {}
