//! Where libnccl.so.2 (or librccl.so.1) and libcuda.so.1 are looked for, and
//! the record of what was tried.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// NCCL sonames in the order tried: NVIDIA's first, then AMD's RCCL, which
/// exports the same API under the same symbol names.
pub const NCCL_SONAMES: [&str; 2] = ["libnccl.so.2", "librccl.so.1"];

/// Where pip-installed PyTorch keeps NCCL, under each site-packages dir.
pub const SITE_PACKAGES_NCCL: &str = "nvidia/nccl/lib/libnccl.so.2";

use loader_sys::env_path;
pub use loader_sys::{Attempt, Candidate, LoadReport, Source};

/// How to find NCCL. [`NcclSearch::from_env`] gives the documented order;
/// tests build it field by field instead of mutating the environment.
#[derive(Debug, Clone)]
pub struct NcclSearch {
    /// Tried first; when it fails the search stops: an operator who names a
    /// library wants that one, not a silent substitute.
    pub explicit: Option<PathBuf>,
    /// `PREFLIGHT_NCCL_LIB`, same rule.
    pub env_path: Option<PathBuf>,
    /// Ask the system loader for [`NCCL_SONAMES`].
    pub loader: bool,
    /// Interpreter asked for its site-packages dirs (None: don't ask).
    pub python: Option<OsString>,
    /// How long the interpreter may take; a broken Python must not stall
    /// the probe.
    pub python_deadline: Duration,
    /// Site-packages dirs searched after the interpreter's own, in order.
    pub site_dirs: Vec<PathBuf>,
}

impl Default for NcclSearch {
    fn default() -> Self {
        NcclSearch {
            explicit: None,
            env_path: None,
            loader: false,
            python: None,
            python_deadline: Duration::from_secs(5),
            site_dirs: Vec::new(),
        }
    }
}

impl NcclSearch {
    /// The documented order: `explicit`, `PREFLIGHT_NCCL_LIB`, the loader
    /// (libnccl.so.2, librccl.so.1), then `nvidia/nccl/lib/libnccl.so.2`
    /// under the site-packages dirs that `python3` reports (5 s deadline)
    /// and the common ones (/usr/local/lib/python3*/dist-packages,
    /// /usr/lib/python3/dist-packages, ~/.local/lib/python3*/site-packages).
    pub fn from_env(explicit: Option<&Path>) -> NcclSearch {
        NcclSearch {
            explicit: explicit.map(Path::to_path_buf),
            env_path: env_path("PREFLIGHT_NCCL_LIB"),
            loader: true,
            python: Some("python3".into()),
            python_deadline: Duration::from_secs(5),
            site_dirs: common_site_dirs(),
        }
    }

    /// Candidates in order, with whether a failure ends the search. Asking
    /// Python happens here, lazily, only when the earlier ones were
    /// exhausted: `open` calls this in stages.
    pub(crate) fn early(&self) -> Vec<Candidate> {
        if let Some(p) = &self.explicit {
            return vec![Candidate::named(Source::Explicit, p)];
        }
        if let Some(p) = &self.env_path {
            return vec![Candidate::named(Source::EnvVar("PREFLIGHT_NCCL_LIB"), p)];
        }
        if self.loader {
            return NCCL_SONAMES
                .iter()
                .map(|s| Candidate::one_of(Source::Loader, *s))
                .collect();
        }
        Vec::new()
    }

    /// Site-packages candidates that exist (a missing dir is not worth a
    /// line in the report), the interpreter's dirs first.
    pub(crate) fn site_candidates(&self, report: &mut LoadReport) -> Vec<Candidate> {
        if self.explicit.is_some() || self.env_path.is_some() {
            return Vec::new();
        }
        let mut dirs = Vec::new();
        if let Some(py) = &self.python {
            match python_site_dirs(py, self.python_deadline) {
                Ok(found) => dirs.extend(found),
                Err(why) => report.notes.push(why),
            }
        }
        dirs.extend(self.site_dirs.iter().cloned());
        let mut out: Vec<Candidate> = Vec::new();
        for d in dirs {
            let p = d.join(SITE_PACKAGES_NCCL);
            let s = p.display().to_string();
            if p.exists() && !out.iter().any(|c| c.path == s) {
                out.push(Candidate::one_of(Source::SitePackages, s));
            }
        }
        if out.is_empty() {
            report.notes.push(format!(
                "no {SITE_PACKAGES_NCCL} under any python site-packages"
            ));
        }
        out
    }
}

/// How to find the CUDA driver library.
#[derive(Debug, Clone, Default)]
pub struct CudaSearch {
    pub explicit: Option<PathBuf>,
    /// `PREFLIGHT_CUDA_LIB`.
    pub env_path: Option<PathBuf>,
    pub loader: bool,
    /// Driver directories tried after the loader.
    pub dirs: Vec<PathBuf>,
}

impl CudaSearch {
    /// `explicit`, `PREFLIGHT_CUDA_LIB`, the loader (`libcuda.so.1`), then
    /// the directories drivers install into when ld.so.cache is stale.
    pub fn from_env(explicit: Option<&Path>) -> CudaSearch {
        CudaSearch {
            explicit: explicit.map(Path::to_path_buf),
            env_path: env_path("PREFLIGHT_CUDA_LIB"),
            loader: true,
            dirs: [
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64",
                "/usr/lib/aarch64-linux-gnu",
                "/usr/lib/wsl/lib",
            ]
            .into_iter()
            .map(PathBuf::from)
            .collect(),
        }
    }

    pub(crate) fn candidates(&self) -> Vec<Candidate> {
        if let Some(p) = &self.explicit {
            return vec![Candidate::named(Source::Explicit, p)];
        }
        if let Some(p) = &self.env_path {
            return vec![Candidate::named(Source::EnvVar("PREFLIGHT_CUDA_LIB"), p)];
        }
        let mut out = Vec::new();
        if self.loader {
            out.push(Candidate::one_of(Source::Loader, "libcuda.so.1"));
        }
        for d in &self.dirs {
            let p = d.join("libcuda.so.1");
            if p.exists() {
                out.push(Candidate::one_of(
                    Source::CommonDir,
                    p.display().to_string(),
                ));
            }
        }
        out
    }
}

/// Site-packages dirs that exist without asking an interpreter: a node may
/// have torch installed for a Python that is not `python3` on PATH.
pub fn common_site_dirs() -> Vec<PathBuf> {
    let mut parents = vec![PathBuf::from("/usr/local/lib"), PathBuf::from("/usr/lib")];
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        parents.push(PathBuf::from(home).join(".local/lib"));
    }
    parents.iter().flat_map(|p| python_dirs_under(p)).collect()
}

/// Site-packages dirs found by reading files alone, a superset of what
/// `python3` would report in the usual layouts: the common dirs,
/// PYTHONPATH, PYTHONUSERBASE, VIRTUAL_ENV and CONDA_PREFIX, the prefix of
/// each `python3` on PATH (the link's own directory, which a venv's is,
/// and its target's), and the dirs that `.pth` files in all of these name.
/// No interpreter is started: a node without NCCL learns so in
/// microseconds.
pub fn site_dirs_by_files() -> Vec<PathBuf> {
    site_dirs_with(&|k| std::env::var_os(k))
}

/// `site_dirs_by_files` with the environment `env` gives.
fn site_dirs_with(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty());
    let mut dirs: Vec<PathBuf> = [PathBuf::from("/usr/local/lib"), PathBuf::from("/usr/lib")]
        .into_iter()
        .chain(var("HOME").map(|h| PathBuf::from(h).join(".local/lib")))
        .flat_map(|p| python_dirs_under(&p))
        .collect();
    if let Some(pp) = var("PYTHONPATH") {
        dirs.extend(std::env::split_paths(&pp).filter(|p| p.is_absolute()));
    }
    let mut prefixes: Vec<PathBuf> = ["PYTHONUSERBASE", "VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|k| var(k).map(PathBuf::from))
        .collect();
    if let Some(path) = var("PATH") {
        for dir in std::env::split_paths(&path) {
            let py = dir.join("python3");
            if !py.exists() {
                continue;
            }
            prefixes.extend(dir.parent().map(Path::to_path_buf));
            if let Some(prefix) = std::fs::canonicalize(&py)
                .ok()
                .and_then(|r| r.parent().and_then(Path::parent).map(Path::to_path_buf))
            {
                prefixes.push(prefix);
            }
        }
    }
    for prefix in prefixes {
        for lib in ["lib", "lib64"] {
            dirs.extend(python_dirs_under(&prefix.join(lib)));
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let named = pth_dirs(&d);
        for x in std::iter::once(d).chain(named) {
            if !out.contains(&x) {
                out.push(x);
            }
        }
    }
    out
}

/// `parent/python3*/{site,dist}-packages` that exist, sorted.
fn python_dirs_under(parent: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
        })
        .collect();
    names.sort();
    let mut out = Vec::new();
    for p in names {
        for sub in ["site-packages", "dist-packages"] {
            let d = p.join(sub);
            if d.is_dir() {
                out.push(d);
            }
        }
    }
    out
}

/// The directories that `dir`'s `.pth` files add to Python's path, as
/// `site` reads them: one per line, relative to `dir`, `#` comments and
/// `import` lines skipped. Bounded: a .pth file is one line per package.
fn pth_dirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "pth") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        for line in text.lines().take(1000) {
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') || line.starts_with("import") {
                continue;
            }
            let d = dir.join(line);
            if d.is_dir() {
                out.push(d);
            }
        }
    }
    out
}

/// Asks the interpreter for site.getsitepackages(), the user site and
/// sys.path (which carries PYTHONPATH and virtualenvs), under a deadline.
pub fn python_site_dirs(python: &OsString, deadline: Duration) -> Result<Vec<PathBuf>, String> {
    const SCRIPT: &str = "import site,sys\n\
        d=[]\n\
        try: d+=site.getsitepackages()\n\
        except Exception: pass\n\
        try: d.append(site.getusersitepackages())\n\
        except Exception: pass\n\
        d+=sys.path\n\
        print('\\n'.join(x for x in d if x))";
    let name = Path::new(python).display().to_string();
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{name} not run for site-packages: {e}"))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(Some(status)) => {
                return Err(format!("{name} for site-packages exited with {status}"));
            }
            Ok(None) if start.elapsed() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{name} for site-packages did not answer within {deadline:?}"
                ));
            }
            Err(e) => return Err(format!("{name} for site-packages: {e}")),
        }
    }
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    Ok(out
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_dirs_are_found_by_files_as_python_lays_them_out() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let mk = |p: &str| {
            let d = root.join(p);
            std::fs::create_dir_all(&d).unwrap();
            d
        };
        // A venv: bin/python3 links to an interpreter elsewhere.
        let venv_site = mk("venv/lib/python3.11/site-packages");
        let real_site = mk("usr/lib/python3.11/site-packages");
        mk("venv/bin");
        mk("usr/bin");
        std::fs::write(root.join("usr/bin/python3"), b"").unwrap();
        std::os::unix::fs::symlink(root.join("usr/bin/python3"), root.join("venv/bin/python3"))
            .unwrap();
        // A conda env, PYTHONPATH, the user site, and a .pth in the venv.
        let conda_site = mk("conda/lib64/python3.12/dist-packages");
        let on_path = mk("pp");
        let user_site = mk("home/.local/lib/python3.11/site-packages");
        let pth_target = mk("editable/src");
        std::fs::write(
            venv_site.join("x.pth"),
            format!(
                "# a comment\nimport os\n{}\n../../../../missing\n",
                pth_target.display()
            ),
        )
        .unwrap();
        let env = |k: &str| -> Option<OsString> {
            match k {
                "PATH" => Some(format!("/nonexistent:{}", root.join("venv/bin").display()).into()),
                "PYTHONPATH" => Some(format!("{}:relative", on_path.display()).into()),
                "CONDA_PREFIX" => Some(root.join("conda").into()),
                "HOME" => Some(root.join("home").into()),
                _ => None,
            }
        };
        let got = site_dirs_with(&env);
        for want in [
            &venv_site,
            &real_site,
            &conda_site,
            &on_path,
            &user_site,
            &pth_target,
        ] {
            assert!(got.contains(want), "{} not in {got:#?}", want.display());
        }
        assert!(
            !got.iter()
                .any(|d| d.ends_with("missing") || d.ends_with("relative"))
        );
        let mut unique = got.clone();
        unique.dedup();
        assert_eq!(unique.len(), got.len());
    }

    #[test]
    fn explicit_then_env_stop_the_search() {
        let s = NcclSearch {
            explicit: Some("/a".into()),
            env_path: Some("/b".into()),
            loader: true,
            ..Default::default()
        };
        assert_eq!(
            s.early(),
            vec![Candidate::named(Source::Explicit, Path::new("/a"))]
        );
        let s = NcclSearch {
            env_path: Some("/b".into()),
            loader: true,
            ..Default::default()
        };
        assert_eq!(
            s.early(),
            vec![Candidate::named(
                Source::EnvVar("PREFLIGHT_NCCL_LIB"),
                Path::new("/b")
            )]
        );
    }

    #[test]
    fn loader_tries_nccl_before_rccl() {
        let s = NcclSearch {
            loader: true,
            ..Default::default()
        };
        let names: Vec<String> = s.early().into_iter().map(|c| c.path).collect();
        assert_eq!(names, ["libnccl.so.2", "librccl.so.1"]);
    }

    #[test]
    fn a_missing_interpreter_is_a_note_not_a_failure() {
        let s = NcclSearch {
            python: Some("/nonexistent/python3".into()),
            ..Default::default()
        };
        let mut report = LoadReport::default();
        assert!(s.site_candidates(&mut report).is_empty());
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.contains("/nonexistent/python3 not run")),
            "{report}"
        );
    }

    #[test]
    fn a_hanging_interpreter_is_cut_at_the_deadline() {
        let dir = std::env::temp_dir().join(format!("nccl-sys-slowpy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let py = dir.join("python3");
        std::fs::write(&py, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&py)
            .status()
            .unwrap();
        // Cut at the deadline, it "did not answer"; an interpreter waited
        // out would have exited with no output, a different error.
        let err =
            python_site_dirs(&py.clone().into_os_string(), Duration::from_millis(300)).unwrap_err();
        assert!(err.contains("did not answer"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
