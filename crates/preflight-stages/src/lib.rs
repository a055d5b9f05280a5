//! The stages of a run, and the other things preflight does to a job
//! (floor 4; docs/design.md): `engine` (the checklist, concurrent checks
//! under the run's deadline), `cluster` (the rendezvous, the comparison
//! of nodes, reachability), `collective` (real collectives per backend,
//! over the cluster stage's store and handshake), `diagnose` (a running
//! job's ranks, and the one that holds the others up), `webhook`
//! (Kubernetes' admission: the gate added to a pod), and `test_hooks`
//! (fault switches, the `test-hooks` feature only). Each stage returns its
//! result; the command renders it, so nothing here names
//! `preflight_report`. The stages keep apart, but for `collective`'s use
//! of `cluster`'s store, handshake and test rendezvous
//! (tests/plain/architecture.rs holds this).

pub mod cluster;
pub mod collective;
pub mod diagnose;
pub mod engine;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
pub mod webhook;
