//! The results no checklist defines, which `run` and `bench` print all
//! the same (the rendezvous, the barrier, each collective backend, the
//! stragglers): what `list` and `explain` say of them.

use super::Severity;

pub struct BuiltIn {
    pub id: String,
    /// What produces it, where a checklist entry would name its kind.
    pub kind: &'static str,
    pub area: &'static str,
    pub severity: Severity,
    pub verifies: String,
    pub why: &'static str,
    pub hint: String,
    /// The commands that print it.
    pub commands: &'static str,
}
