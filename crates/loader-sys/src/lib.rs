//! What every library crate of preflight's (nccl-sys, oneccl-sys, and the
//! next: RCCL under its own name, HCCL) does the same way before it calls
//! anything: look for the library in a documented order (a path the
//! operator named, a variable, the system loader, the vendor's layouts),
//! open it resident, and keep every attempt, so that "not found" says
//! where it looked and a library that loads names the file it is.
//!
//! Each crate says only where to look (its `Candidate`s) and what to do
//! with the library once open.

// The workspace refuses `unsafe` (Cargo.toml's lints); this crate is
// where it lives, each block saying why it is sound.
#![allow(unsafe_code)]

use std::fmt;
use std::path::{Path, PathBuf};

/// Where a candidate came from: the report names it, so that an operator
/// knows which setting to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The caller's explicit path (a CLI flag such as `--nccl-lib`).
    Explicit,
    /// A variable naming the file (`PREFLIGHT_NCCL_LIB`).
    EnvVar(&'static str),
    /// The dynamic loader by soname (LD_LIBRARY_PATH, ld.so.cache, RUNPATH).
    Loader,
    /// Under a vendor's root variable (`$CCL_ROOT/lib`).
    Root(&'static str),
    /// A Python site-packages directory (`nvidia/nccl/lib/`).
    SitePackages,
    /// A well-known driver directory.
    CommonDir,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Explicit => f.write_str("explicit path"),
            Source::EnvVar(v) | Source::Root(v) => f.write_str(v),
            Source::Loader => f.write_str("system loader"),
            Source::SitePackages => f.write_str("python site-packages"),
            Source::CommonDir => f.write_str("driver directory"),
        }
    }
}

/// One place to try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub source: Source,
    /// A path, or a bare soname handed to the loader.
    pub path: String,
    /// A failure here ends the search: an operator who names a library
    /// wants that one, not a silent substitute.
    pub final_if_failed: bool,
}

impl Candidate {
    /// A library the operator named (by flag or variable): the only one
    /// tried.
    pub fn named(source: Source, path: &Path) -> Candidate {
        Candidate {
            source,
            path: path.display().to_string(),
            final_if_failed: true,
        }
    }

    /// One place among several.
    pub fn one_of(source: Source, path: impl Into<String>) -> Candidate {
        Candidate {
            source,
            path: path.into(),
            final_if_failed: false,
        }
    }
}

/// One library the search tried to open.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub source: Source,
    /// A path, or a bare soname handed to the loader.
    pub candidate: String,
    /// `None` when it opened; otherwise why not (the loader's own message).
    pub failure: Option<String>,
}

/// Everything the search tried, in order, plus notes (that the Python
/// interpreter could not be asked, say).
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub attempts: Vec<Attempt>,
    pub notes: Vec<String>,
}

impl LoadReport {
    /// The attempt that opened, if any.
    pub fn loaded(&self) -> Option<&Attempt> {
        self.attempts.iter().find(|a| a.failure.is_none())
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.attempts.is_empty() {
            f.write_str("nothing tried")?;
        }
        for (i, a) in self.attempts.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match &a.failure {
                None => write!(f, "{} ({}): loaded", a.candidate, a.source)?,
                Some(why) => write!(f, "{} ({}): {}", a.candidate, a.source, why)?,
            }
        }
        for n in &self.notes {
            write!(f, "; {n}")?;
        }
        Ok(())
    }
}

/// A variable that names a file, when set and not empty.
pub fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// dlopen with RTLD_NODELETE: the collective libraries and the CUDA
/// runtime start threads and register exit handlers, so unmapping them
/// when a library handle is dropped crashes the process later (seen as a
/// SIGSEGV at test exit). The library stays mapped for the life of the
/// process, as a linked one would.
///
/// # Safety
/// As `libloading::Library::new`: the library's initialisers run.
pub unsafe fn open_resident(path: &str) -> Result<libloading::Library, libloading::Error> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    const RTLD_NODELETE: std::os::raw::c_int = 0x1000;
    // SAFETY: forwarded to the caller.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) }.map(Into::into)
}

/// Opens the first candidate that loads, recording every attempt, and
/// the file it is.
///
/// # Safety
/// As `open_resident`, for each candidate: the caller trusts the
/// initialisers of whatever library the candidates name.
pub unsafe fn open_first(
    candidates: Vec<Candidate>,
    report: &mut LoadReport,
) -> Option<(libloading::Library, String)> {
    for c in candidates {
        // SAFETY: forwarded to the caller.
        match unsafe { open_resident(&c.path) } {
            Ok(lib) => {
                let path = loaded_path(&c.path);
                report.attempts.push(Attempt {
                    source: c.source,
                    candidate: c.path,
                    failure: None,
                });
                return Some((lib, path));
            }
            Err(e) => {
                report.attempts.push(Attempt {
                    source: c.source,
                    candidate: c.path,
                    failure: Some(loader_message(&e)),
                });
                if c.final_if_failed {
                    return None;
                }
            }
        }
    }
    None
}

/// dlerror()'s text, which names the missing file or dependency:
/// libloading's own Display is only "dlopen failed".
fn loader_message(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(src) => src.to_string(),
        None => e.to_string(),
    }
}

/// A bare soname is reported as the file the loader picked, from
/// /proc/self/maps: the report should name a file an operator can check.
pub fn loaded_path(candidate: &str) -> String {
    if candidate.contains('/') {
        return candidate.to_string();
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return candidate.to_string();
    };
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        // libnccl.so.2 is often a symlink to libnccl.so.2.21.5: maps names
        // the target.
        .find(|p| {
            Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(candidate))
        })
        .map_or_else(|| candidate.to_string(), str::to_string)
}

/// The text of a C string a library returned, empty for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the duration of the
/// call.
pub unsafe fn c_text(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: per this function's contract.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(candidates: Vec<Candidate>) -> (Option<String>, LoadReport) {
        let mut report = LoadReport::default();
        // SAFETY: the C library, already loaded in this process, and
        // paths that do not exist.
        let found = unsafe { open_first(candidates, &mut report) };
        (found.map(|(_, path)| path), report)
    }

    #[test]
    fn a_named_library_that_fails_ends_the_search() {
        let (found, report) = open(vec![
            Candidate::named(
                Source::EnvVar("PREFLIGHT_X_LIB"),
                Path::new("/nonexistent/libx.so"),
            ),
            Candidate::one_of(Source::Loader, "libc.so.6"),
        ]);
        assert_eq!(found, None);
        assert_eq!(report.attempts.len(), 1);
        let text = report.to_string();
        assert!(
            text.starts_with("/nonexistent/libx.so (PREFLIGHT_X_LIB): ")
                && text.contains("No such file"),
            "{text}"
        );
    }

    #[test]
    fn the_first_that_loads_is_named_by_its_file() {
        let (found, report) = open(vec![
            Candidate::one_of(Source::Root("X_ROOT"), "/nonexistent/lib/libx.so"),
            Candidate::one_of(Source::Loader, "libc.so.6"),
        ]);
        let path = found.expect("libc loads");
        assert!(path.starts_with('/') && path.contains("libc"), "{path}");
        assert_eq!(
            report.loaded().map(|a| a.candidate.as_str()),
            Some("libc.so.6")
        );
        let text = report.to_string();
        assert!(
            text.contains("/nonexistent/lib/libx.so (X_ROOT): ")
                && text.ends_with("libc.so.6 (system loader): loaded"),
            "{text}"
        );
    }

    #[test]
    fn an_empty_search_says_nothing_was_tried() {
        let mut report = LoadReport::default();
        assert_eq!(report.to_string(), "nothing tried");
        report.notes.push("python3 not asked".into());
        assert_eq!(report.to_string(), "nothing tried; python3 not asked");
    }

    #[test]
    fn c_text_reads_null_as_empty() {
        // SAFETY: NULL, and a literal's NUL-terminated bytes.
        let (none, some) = unsafe { (c_text(std::ptr::null()), c_text(c"ok".as_ptr())) };
        assert_eq!((none.as_str(), some.as_str()), ("", "ok"));
    }
}
