//! Exit codes, defined once. Schedulers and health-check hooks gate on them.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// Every check passed (warnings allowed unless `--strict`).
    Ready = 0,
    /// A check failed (or warned, under `--strict`).
    NotReady = 1,
    /// Bad invocation or invalid configuration (a checklist, the settings,
    /// a variable), and only that.
    Usage = 2,
    /// Nothing failed, but a required check could not be evaluated, or the
    /// run could not start what it needs.
    Incomplete = 3,
}

impl ExitCode {
    pub fn code(self) -> i32 {
        self as i32
    }
}
