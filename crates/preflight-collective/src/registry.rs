//! The library backends, each named once. A new library backend is its
//! module (which defines its `LIBRARY` entry), its -sys crate, its name in
//! `facts::Backend`, and one line here; the command line, the worker, the
//! supervisor and the checks find it here.

use super::library::LibraryBackend;

pub const LIBRARIES: &[&LibraryBackend] = &[&super::nccl::LIBRARY, &super::oneccl::LIBRARY];

pub fn library(name: &str) -> Option<&'static LibraryBackend> {
    LIBRARIES.iter().copied().find(|l| l.name == name)
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
                preflight_facts::Backend::ALL
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
