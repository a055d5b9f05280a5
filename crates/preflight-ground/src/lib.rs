//! The ground floor of preflight: plain values every other crate may use,
//! with no knowledge of nodes, checks or reports. `values` (durations,
//! sizes, patterns and their text), `yaml` (the YAML tree with locations,
//! and its serde deserializer), `exit` (exit codes, in one table),
//! `suggest` ("did you mean"), `interrupt` (the signals that end a run),
//! `test_hooks` (the fault switches, in the tests' builds only) and
//! `testing` (the rule unit tests skip by, in test builds only).

pub mod exit;
pub mod interrupt;
pub mod suggest;
#[cfg(any(test, feature = "test-hooks"))]
pub mod test_hooks;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod values;
pub mod yaml;
