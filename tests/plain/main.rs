//! The binary over fixture trees, nothing else needed: the command line,
//! checklists, reports, profiles, hardware and vendor trees, the project's
//! own house rules (architecture, README, release, skips).
//!
//! One test binary of four (tests/README.md); its modules share tests/common.

#[path = "../common/mod.rs"]
mod common;

mod architecture;
mod bench_scripts;
mod checklist_errors;
mod cli;
mod engine;
mod env_checks;
mod faults;
mod gpu_depth;
mod hardware;
mod http;
mod profiles;
mod rank_sim;
mod readme;
mod release;
mod report;
mod skips;
mod vendor_depth;
