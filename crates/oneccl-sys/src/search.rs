//! Where libccl.so.2 is looked for, and the record of what was tried.

use std::path::{Path, PathBuf};

/// Sonames in the order they are tried. libccl.so.2 carries the C API (oneCCL
/// 2022.x); libccl.so.1 is tried last so that a node with only oneCCL 2021.x
/// (C++ API only) is reported as an unsupported version instead of "not found".
pub const SONAMES: [&str; 2] = ["libccl.so.2", "libccl.so.1"];

pub use loader_sys::{Attempt, Candidate, LoadReport, Source};

/// The variable under whose `lib/` (and `lib/intel64/`) oneCCL is looked
/// for: oneAPI's `setvars.sh` sets it.
pub const CCL_ROOT: &str = "CCL_ROOT";

/// The search order. Built from the environment by [`Search::from_env`];
/// tests build it field by field so they never mutate the process environment.
#[derive(Debug, Clone, Default)]
pub struct Search {
    /// Tried first; when set and it fails, the search stops there: an
    /// operator who names a library wants that one, not a silent substitute.
    pub explicit: Option<PathBuf>,
    /// `PREFLIGHT_ONECCL_LIB`, with the same stop-on-failure rule.
    pub env_path: Option<PathBuf>,
    /// Ask the system loader for the sonames.
    pub loader: bool,
    /// `CCL_ROOT`, searched in `lib/` then `lib/intel64/`.
    pub ccl_root: Option<PathBuf>,
}

impl Search {
    /// The documented order: `explicit`, `PREFLIGHT_ONECCL_LIB`, the loader,
    /// `$CCL_ROOT/lib`, `$CCL_ROOT/lib/intel64`.
    pub fn from_env(explicit: Option<&Path>) -> Search {
        Search {
            explicit: explicit.map(Path::to_path_buf),
            env_path: loader_sys::env_path("PREFLIGHT_ONECCL_LIB"),
            loader: true,
            ccl_root: loader_sys::env_path(CCL_ROOT),
        }
    }

    /// Candidates in order.
    pub(crate) fn candidates(&self) -> Vec<Candidate> {
        if let Some(p) = &self.explicit {
            return vec![Candidate::named(Source::Explicit, p)];
        }
        if let Some(p) = &self.env_path {
            return vec![Candidate::named(Source::EnvVar("PREFLIGHT_ONECCL_LIB"), p)];
        }
        let mut out = Vec::new();
        if self.loader {
            for s in SONAMES {
                out.push(Candidate::one_of(Source::Loader, s));
            }
        }
        if let Some(root) = &self.ccl_root {
            for dir in root_dirs(root) {
                for s in SONAMES {
                    let path = dir.join(s).display().to_string();
                    out.push(Candidate::one_of(Source::Root(CCL_ROOT), path));
                }
            }
        }
        out
    }
}

/// Where oneAPI's layout keeps the library under `$CCL_ROOT`.
pub fn root_dirs(root: &Path) -> [PathBuf; 2] {
    [root.join("lib"), root.join("lib").join("intel64")]
}

/// Best-effort version of a oneCCL binary without calling into it: the
/// library embeds a build string such as "Gold-2021.16.2 2025-09-08T...".
/// Used only to name the version of a library we refuse (2021.x has no C API,
/// and its C++ `get_library_version` returns a struct we cannot call safely).
pub fn embedded_version(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    for tag in [&b"Gold-"[..], b"Beta-", b"Silver-", b"Bronze-", b"Alpha-"] {
        let mut from = 0;
        while let Some(pos) = find(&bytes[from..], tag) {
            let start = from + pos + tag.len();
            let end = bytes[start..]
                .iter()
                .position(|b| !(b.is_ascii_digit() || *b == b'.'))
                .map_or(bytes.len(), |n| start + n);
            let v = &bytes[start..end];
            if v.len() >= 6 && v.starts_with(b"20") && v.iter().filter(|b| **b == b'.').count() >= 1
            {
                return Some(String::from_utf8_lossy(v).trim_end_matches('.').to_string());
            }
            from = start;
        }
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_path_is_the_only_candidate() {
        let s = Search {
            explicit: Some("/x/libccl.so.2".into()),
            env_path: Some("/y".into()),
            loader: true,
            ccl_root: Some("/opt".into()),
        };
        let c = s.candidates();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].source, Source::Explicit);
        assert!(c[0].final_if_failed);
    }

    #[test]
    fn default_order_is_loader_then_ccl_root_lib_then_intel64() {
        let s = Search {
            loader: true,
            ccl_root: Some("/opt/ccl".into()),
            ..Search::default()
        };
        let names: Vec<String> = s.candidates().into_iter().map(|c| c.path).collect();
        assert_eq!(
            names,
            [
                "libccl.so.2",
                "libccl.so.1",
                "/opt/ccl/lib/libccl.so.2",
                "/opt/ccl/lib/libccl.so.1",
                "/opt/ccl/lib/intel64/libccl.so.2",
                "/opt/ccl/lib/intel64/libccl.so.1",
            ]
        );
    }

    #[test]
    fn embedded_version_reads_the_build_string() {
        let dir = std::env::temp_dir().join(format!("oneccl-sys-ver-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("libfake.so");
        std::fs::write(&f, b"\0\0junk Gold-2021.16.2 2025-09-08T 06:59:16Z\0").unwrap();
        assert_eq!(embedded_version(&f).as_deref(), Some("2021.16.2"));
        std::fs::write(&f, b"no version here Gold-x").unwrap();
        assert_eq!(embedded_version(&f), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
