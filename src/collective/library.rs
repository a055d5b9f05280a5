//! The library backends, each named once: its name, the flag and variable
//! that point at its library, what to do when a node lacks it, the
//! settings its worker gets where the job left them unset, and the
//! worker's entry. A new library backend is its module (which defines its
//! `LIBRARY` entry), its -sys crate, its name in `facts::Backend`, and one
//! line in `LIBRARIES`; the command line, the worker, the supervisor and
//! the checks find it here.

use std::path::{Path, PathBuf};
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
    /// The worker's entry: probe the library, exchange the id, init, and
    /// exercise the backend, reporting over `link`.
    pub work: fn(&Job, &mut Link) -> Result<(), String>,
}

pub const LIBRARIES: &[&LibraryBackend] = &[&super::nccl::LIBRARY, &super::oneccl::LIBRARY];

pub fn library(name: &str) -> Option<&'static LibraryBackend> {
    LIBRARIES.iter().copied().find(|l| l.name == name)
}

/// The library files named on the command line, by backend name.
#[derive(Debug, Clone, Default)]
pub struct Libraries(pub Vec<(&'static str, PathBuf)>);

impl Libraries {
    pub fn get(&self, name: &str) -> Option<PathBuf> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| p.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_library_backend_is_named_once_and_known() {
        let mut names: Vec<&str> = LIBRARIES.iter().map(|l| l.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), LIBRARIES.len());
        for l in LIBRARIES {
            assert!(
                crate::facts::Backend::ALL
                    .iter()
                    .any(|b| b.name() == l.name),
                "{} is not a facts::Backend",
                l.name
            );
            assert_eq!(l.flag, format!("{}-lib", l.name));
            assert!(!l.install_hint.is_empty() && !l.flag_help.is_empty());
        }
        assert!(library("nccl").is_some() && library("tcp").is_none());
    }
}
