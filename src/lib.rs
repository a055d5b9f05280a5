//! preflight: is every node and backend ready for the distributed job?
//!
//! This crate is the command line, the top floor: `cli` (the command tree
//! and its dispatch), `commands` (one file per command: its arguments made
//! into settings, and the call that does the work) and `fuzzing` (the fuzz
//! targets' entry points, the `fuzzing` feature only). Every floor below is
//! a crate the compiler holds to its own dependencies (docs/design.md
//! draws them): `preflight_run` (a run's settings and its pipeline), the
//! stages (`preflight_engine`, `_cluster`, `_collective`, `_diagnose`,
//! `_webhook`), `preflight_checklist` and `preflight_report`,
//! `preflight_kinds`, `preflight_result`, and the ground
//! (`preflight_facts`, `preflight_ground`).

// The modules stay private to the library: the compiler's dead-code
// analysis then covers them, as it did for the binary alone.
// The fuzz targets reach the parsers through `fuzzing`.
//
// Hardware probes read sysfs and load NVML through safe wrappers only;
// `unsafe` lives in the -sys crates (Cargo.toml's lints refuse it here).

pub mod cli;
mod commands;
/// Entry points for the fuzz targets in `fuzz/` (the `fuzzing` feature).
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
/// The JSON report's own types, as `--format json` writes them and
/// `preflight report` reads them back (and the merged report and
/// `diagnose`'s output), for programs that read reports (the integration
/// tests among them) instead of indexing untyped JSON.
pub mod schema {
    pub use preflight_result::cluster::ClusterReport;
    pub use preflight_result::collective::{BackendReport, CollectiveReport, SecondPass};
    pub use preflight_result::diagnosis::{ClusterDiagnosis, Diagnosis};
    pub use preflight_result::merged::{MergedNode, MergedReport};
    pub use preflight_result::report::{Interrupted, Node, Report, Timings};
    pub use preflight_result::{CheckResult, Severity, Status, Summary, Verdict};
}
