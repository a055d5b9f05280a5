//! What a library backend says about itself, once: its name, the flag
//! that points at its library, what to do when a node lacks it, the
//! settings its worker gets where the job left them unset, and the
//! worker's entry. Each backend's module defines its `LIBRARY`; the
//! registry (`registry::LIBRARIES`) lists them.

use std::path::Path;
use std::time::Duration;

use super::job::{Job, Link};
use super::rank::RankInfo;

/// What a library backend's settings depend on.
pub struct EnvInput<'a, 'b> {
    pub info: &'a RankInfo<'b>,
    pub init_timeout: Duration,
    /// The worker's private directory.
    pub scratch: &'a Path,
}

pub struct LibraryBackend {
    /// As `--backends` and `when: {backend: ...}` name it.
    pub name: &'static str,
    /// The command-line flag, without its dashes, that names the library
    /// file instead of the search.
    pub flag: &'static str,
    /// The flag's help: the search it replaces.
    pub flag_help: &'static str,
    /// What a node lacking the backend should do.
    pub install_hint: &'static str,
    /// Library settings the worker gets where the job left them unset.
    pub env: fn(&EnvInput<'_, '_>) -> Vec<(String, String)>,
    /// Why the backend is certainly missing on this node, found by file
    /// lookups alone, in the words its worker's probe would use; `None`
    /// where only loading the library tells (a worker is started then).
    /// The argument is the library the operator named with `flag`.
    pub absent: fn(Option<&Path>) -> Option<String>,
    /// The worker's entry: probe the library, exchange the id, init, and
    /// exercise the backend, reporting over `link`.
    pub work: fn(&Job, &mut Link) -> Result<(), String>,
}
