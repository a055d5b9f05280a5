//! preflight: is every node and backend ready for the distributed job?
//!
//! The layers, from the top; a module imports only from the floors below
//! its own (`tests/plain/architecture.rs` holds this):
//!
//! 1. `cli`: the command tree and its dispatch; `fuzzing`, the fuzz
//!    targets' entry points (the `fuzzing` feature only).
//! 2. `commands`: the command line, one file per command: its arguments
//!    made into settings, and the call that does the work.
//! 3. `run`: a run's settings as plain values, and the pipeline `run`,
//!    `check`, `bench` and the Slurm modes take a node through.
//! 4. `preflight_stages`: `engine` (the checklist), `cluster` (rendezvous,
//!    comparison, reachability), `collective` (real collectives per
//!    backend), `diagnose` (a running job's ranks, and the one that holds
//!    the others up), `webhook` (Kubernetes' admission: the gate added to
//!    a pod), and `test_hooks` (fault switches, in test builds only).
//! 5. `preflight_checklist` (loading, applicability, hints, which stage
//!    evaluates a check) and `preflight_report` (rendering: human, JSON,
//!    JUnit, the cluster and collective views).
//! 6. `preflight_kinds`: every check kind, over facts and stage results.
//! 7. `preflight_result`: what every layer shares: findings, check
//!    results, verdicts and the stages' results.
//! 8. Ground: `preflight_facts` (the node's facts) and `preflight_ground`
//!    (values, yaml, exit, suggest, interrupt).
//!
//! Floors 4 to 8 are crates (crates/preflight-*): the compiler holds them
//! to their own dependencies. The floors within this crate and within the
//! stages' crate, and this crate's use of the others, are held by
//! tests/plain/architecture.rs.

// The layers of this crate stay private to the library: the compiler's
// dead-code analysis then covers them, as it did for the binary alone.
// The fuzz targets reach the parsers through `fuzzing`.
//
// Hardware probes read sysfs and load NVML through safe wrappers only;
// `unsafe` lives in the -sys crates (Cargo.toml's lints refuse it here).

pub mod cli;
mod commands;
/// Entry points for the fuzz targets in `fuzz/` (the `fuzzing` feature).
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod run;
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

/// The rank simulator's entry point (`preflight-rank-sim`, a test and
/// benchmark tool): built only with the `rank-sim` feature.
#[cfg(feature = "rank-sim")]
pub fn rank_sim_main() -> i32 {
    commands::rank_sim::main()
}
