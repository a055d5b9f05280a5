//! Which torch a process runs, read from the process without touching it:
//! the torch package its memory maps name (`/proc/PID/maps`: a wheel's
//! `torch/lib/libtorch*.so`, or the `torch/_C.*.so` extension every
//! torch loads, which is how Debian's shows, its libtorch being a system
//! library), and `torch/version.py` in that package, read through the
//! process's own root (`/proc/PID/root`, so a container's torch is its
//! own). Nothing is guessed: a process whose maps name no torch, or whose
//! package has no readable version, has none here.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchInstall {
    /// `2.15.0+cu132`, `1.13.1`.
    pub version: String,
    /// The package's directory, as the process sees it.
    pub package: PathBuf,
}

impl TorchInstall {
    /// (major, minor) of the version: `2.15.0+cu132` is (2, 15).
    pub fn major_minor(&self) -> Option<(u32, u32)> {
        major_minor(&self.version)
    }
}

pub fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The torch package directory a maps file names: the directory of a
/// mapped `torch/_C.*.so`, or the one above `lib/` of a mapped
/// `torch/lib/libtorch*.so`.
pub fn package_in_maps(maps: &str) -> Option<PathBuf> {
    maps.lines().find_map(|l| {
        let path = l.split_whitespace().nth(5)?;
        let (dir, file) = path.rsplit_once('/')?;
        if !file.contains(".so") {
            return None;
        }
        let package = if file.starts_with("_C.") {
            dir
        } else if file.starts_with("libtorch") {
            dir.strip_suffix("/lib")?
        } else {
            return None;
        };
        package.ends_with("/torch").then(|| PathBuf::from(package))
    })
}

/// `__version__` from a torch/version.py.
pub fn version_in(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("__version__")?.trim_start();
        // Typed, in some releases: `__version__: str = '2.4.1'`.
        let rest = match rest.strip_prefix(':') {
            Some(typed) => typed.split_once('=')?.1,
            None => rest.strip_prefix('=')?,
        }
        .trim();
        // `'2.15.0+cu132'`, `"1.13.1"`, possibly typed (`: str =`).
        let q = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        let inner = &rest[1..];
        let v = &inner[..inner.find(q)?];
        (!v.is_empty() && v.len() < 64).then(|| v.to_string())
    })
}

/// The torch of the process at `proc_pid` (`/proc/PID`).
pub fn of_process(proc_pid: &Path) -> Option<TorchInstall> {
    let maps = std::fs::read_to_string(proc_pid.join("maps")).ok()?;
    let package = package_in_maps(&maps)?;
    let inside = proc_pid
        .join("root")
        .join(package.strip_prefix("/").unwrap_or(&package))
        .join("version.py");
    let text = std::fs::read_to_string(inside).ok()?;
    Some(TorchInstall {
        version: version_in(&text)?,
        package,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_package_and_version_as_each_torch_lays_them_out() {
        let maps = "7f00-7f10 r--p 00000000 fd:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
7f20-7f30 r-xp 00000000 fd:01 43 /opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so\n";
        assert_eq!(
            package_in_maps(maps),
            Some(PathBuf::from(
                "/opt/venv/lib/python3.11/site-packages/torch"
            ))
        );
        // Debian's: libtorch is a system library; the extension is not.
        let debian = "7f10-7f18 r-xp 00000000 fd:01 41 /usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13.0\n\
7f20-7f30 r-xp 00000000 fd:01 43 /usr/lib/python3/dist-packages/torch/_C.cpython-311-x86_64-linux-gnu.so\n";
        assert_eq!(
            package_in_maps(debian),
            Some(PathBuf::from("/usr/lib/python3/dist-packages/torch"))
        );
        assert_eq!(
            package_in_maps("7f-8f r-xp 0 fd:01 1 /opt/libtorchx/lib/libtorch.so\n"),
            None
        );
        assert_eq!(package_in_maps("7f-8f rw-p 0 00:00 0 \n"), None);
        let v = "version = '1.13.1'\n__version__ = '2.15.0+cu132'\ndebug = False\n";
        assert_eq!(version_in(v).as_deref(), Some("2.15.0+cu132"));
        assert_eq!(
            version_in("__version__: str = \"2.4.1\"\n").as_deref(),
            Some("2.4.1")
        );
        assert_eq!(version_in("__version__ = get()\n"), None);
        assert_eq!(major_minor("2.15.0+cu132"), Some((2, 15)));
        assert_eq!(major_minor("1.13.1"), Some((1, 13)));
        assert_eq!(major_minor("nonsense"), None);
    }
}
