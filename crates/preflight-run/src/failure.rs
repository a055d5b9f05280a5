//! Why a command could not do its job, and the exit code that says so.

use std::fmt;

use preflight_checklist::ChecklistErrors;
use preflight_ground::exit::ExitCode;

/// Why a command could not do its job: exit 2, or 3 for a run that could
/// not start what it needs.
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

#[cfg(test)]
mod tests {
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
