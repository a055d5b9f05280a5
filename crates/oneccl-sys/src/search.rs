//! Where libccl.so.2 is looked for, and the record of what was tried.

use std::fmt;
use std::path::{Path, PathBuf};

/// Sonames in the order they are tried. libccl.so.2 carries the C API (oneCCL
/// 2022.x); libccl.so.1 is tried last so that a node with only oneCCL 2021.x
/// (C++ API only) is reported as an unsupported version instead of "not found".
pub const SONAMES: [&str; 2] = ["libccl.so.2", "libccl.so.1"];

/// Where a candidate came from: the report names it so an operator knows
/// which setting to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The caller's explicit path (the CLI's `--oneccl-lib`).
    Explicit,
    /// `PREFLIGHT_ONECCL_LIB`.
    EnvVar,
    /// The dynamic loader by soname (LD_LIBRARY_PATH, ld.so.cache, RUNPATH).
    Loader,
    /// `$CCL_ROOT/lib` or `$CCL_ROOT/lib/intel64` (the oneAPI layout).
    CclRoot,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Explicit => "explicit path",
            Source::EnvVar => "PREFLIGHT_ONECCL_LIB",
            Source::Loader => "system loader",
            Source::CclRoot => "CCL_ROOT",
        })
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

/// Everything the search tried, in order, so that "not found" can say where
/// it looked.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub attempts: Vec<Attempt>,
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.attempts.is_empty() {
            return f.write_str("nothing tried");
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
        Ok(())
    }
}

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
        let non_empty = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Search {
            explicit: explicit.map(Path::to_path_buf),
            env_path: non_empty("PREFLIGHT_ONECCL_LIB"),
            loader: true,
            ccl_root: non_empty("CCL_ROOT"),
        }
    }

    /// Candidates in order; the bool says whether a failure ends the search.
    pub(crate) fn candidates(&self) -> Vec<(Source, String, bool)> {
        let mut out = Vec::new();
        if let Some(p) = &self.explicit {
            out.push((Source::Explicit, p.display().to_string(), true));
            return out;
        }
        if let Some(p) = &self.env_path {
            out.push((Source::EnvVar, p.display().to_string(), true));
            return out;
        }
        if self.loader {
            for s in SONAMES {
                out.push((Source::Loader, s.to_string(), false));
            }
        }
        if let Some(root) = &self.ccl_root {
            for dir in [root.join("lib"), root.join("lib").join("intel64")] {
                for s in SONAMES {
                    out.push((Source::CclRoot, dir.join(s).display().to_string(), false));
                }
            }
        }
        out
    }
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
        assert_eq!(c[0].0, Source::Explicit);
        assert!(c[0].2);
    }

    #[test]
    fn default_order_is_loader_then_ccl_root_lib_then_intel64() {
        let s = Search {
            loader: true,
            ccl_root: Some("/opt/ccl".into()),
            ..Search::default()
        };
        let names: Vec<String> = s.candidates().into_iter().map(|c| c.1).collect();
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
