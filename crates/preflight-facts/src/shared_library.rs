//! Where the dynamic loader would find a shared library by its soname,
//! answered by reading files (LD_LIBRARY_PATH, /etc/ld.so.cache, the
//! system directories) instead of loading it: a node that lacks a
//! collective library learns so without starting a worker process.
//!
//! The answer may err on one side only. A library this lookup finds may
//! still fail to load (wrong architecture, a missing dependency), and the
//! worker that loads it says why; a library it does not find is one the
//! loader would not find either, because every place glibc's loader
//! searches for a bare soname is read here (the binary carries no RPATH or
//! RUNPATH).

use std::path::{Path, PathBuf};

/// Where the lookup found the library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    LdLibraryPath,
    LdSoCache,
    SystemDir,
}

/// The loader's cache, as ldconfig writes it.
pub const LD_SO_CACHE: &str = "/etc/ld.so.cache";

/// Directories glibc searches after the cache, whatever the distribution
/// (Debian's multiarch ones, Red Hat's lib64, the plain ones).
#[cfg(target_arch = "x86_64")]
pub const SYSTEM_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];
#[cfg(target_arch = "aarch64")]
pub const SYSTEM_DIRS: &[&str] = &[
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const SYSTEM_DIRS: &[&str] = &["/lib64", "/usr/lib64", "/lib", "/usr/lib"];

/// The places a lookup reads. Paths are the node's, read under `root`
/// (`--root` for a fixture tree, `/` on a live node).
#[derive(Debug, Clone)]
pub struct Places {
    pub root: PathBuf,
    pub ld_library_path: Option<String>,
    pub cache: PathBuf,
    pub system_dirs: Vec<PathBuf>,
}

impl Places {
    /// This process's: what a worker it starts would inherit.
    pub fn of_this_process() -> Places {
        Places::on_node(Path::new("/"), std::env::var("LD_LIBRARY_PATH").ok())
    }

    /// The node under `root`, with the job's LD_LIBRARY_PATH.
    pub fn on_node(root: &Path, ld_library_path: Option<String>) -> Places {
        Places {
            root: root.to_path_buf(),
            ld_library_path,
            cache: PathBuf::from(LD_SO_CACHE),
            system_dirs: SYSTEM_DIRS.iter().map(PathBuf::from).collect(),
        }
    }

    /// `p` as this process reads it: under the root for a fixture tree;
    /// on the live node a relative LD_LIBRARY_PATH entry (an empty one is
    /// `.`) is the working directory's, as the loader reads it.
    fn under_root(&self, p: &Path) -> PathBuf {
        if p.is_relative() && self.root == Path::new("/") {
            return p.to_path_buf();
        }
        self.root.join(p.strip_prefix("/").unwrap_or(p))
    }

    /// The first file the loader would map for `soname`, in its order, as
    /// the node names it.
    pub fn find(&self, soname: &str) -> Option<(PathBuf, Via)> {
        let exists = |p: &Path| self.under_root(p).exists();
        for dir in self.ld_library_path.iter().flat_map(|p| search_path(p)) {
            if let Some(p) = in_dir(&dir, soname, &exists) {
                return Some((p, Via::LdLibraryPath));
            }
        }
        if let Ok(bytes) = std::fs::read(self.under_root(&self.cache)) {
            let hit = cache_entries(&bytes)
                .into_iter()
                .find(|(key, path)| key == soname && exists(Path::new(path)));
            if let Some((_, path)) = hit {
                return Some((PathBuf::from(path), Via::LdSoCache));
            }
        }
        self.system_dirs
            .iter()
            .find_map(|d| in_dir(d, soname, &exists))
            .map(|p| (p, Via::SystemDir))
    }

    /// "LD_LIBRARY_PATH, /etc/ld.so.cache or /lib64, ...": where `find`
    /// looked, for a sentence saying a library is not there.
    pub fn describe(&self) -> String {
        let dirs: Vec<String> = self
            .system_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let lib_path = if self
            .ld_library_path
            .as_deref()
            .is_some_and(|p| !p.is_empty())
        {
            "LD_LIBRARY_PATH, "
        } else {
            ""
        };
        format!("{lib_path}{} or {}", self.cache.display(), dirs.join(", "))
    }
}

/// LD_LIBRARY_PATH's directories: `:` or `;` separated, an empty entry
/// being the working directory, as the loader reads it.
fn search_path(value: &str) -> Vec<PathBuf> {
    if value.is_empty() {
        return Vec::new();
    }
    value
        .split([':', ';'])
        .map(|d| {
            if d.is_empty() {
                PathBuf::from(".")
            } else {
                PathBuf::from(d)
            }
        })
        .collect()
}

/// `dir/soname`, or the same name in one of the dir's glibc-hwcaps
/// subdirectories, which the loader prefers on a CPU that has them.
fn in_dir(dir: &Path, soname: &str, exists: &dyn Fn(&Path) -> bool) -> Option<PathBuf> {
    let hwcaps = dir.join("glibc-hwcaps");
    for level in [
        "x86-64-v4",
        "x86-64-v3",
        "x86-64-v2",
        "power10",
        "power9",
        "z16",
        "z15",
    ] {
        let p = hwcaps.join(level).join(soname);
        if exists(&p) {
            return Some(p);
        }
    }
    Some(dir.join(soname)).filter(|p| exists(p))
}

/// The new format's header, which follows the old one in caches written
/// for compatibility (glibc before 2.32 writes both).
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// magic+version 20, nlibs 4, len_strings 4, flags 1, padding 3,
/// extension_offset 4, unused 12.
const NEW_HEADER: usize = 48;
/// flags 4, key 4, value 4, osversion 4, hwcap 8.
const NEW_ENTRY: usize = 24;
/// The ELF libc6 type in an entry's flags; the rest are a.out leftovers.
const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_ELF_LIBC6: i32 = 0x0003;

/// (soname, path) for each libc6 entry of an ld.so.cache image; anything
/// malformed ends the list where it is (a cache is root's file, but a
/// truncated one must not crash a check).
pub fn cache_entries(bytes: &[u8]) -> Vec<(String, String)> {
    let Some(base) = bytes.windows(NEW_MAGIC.len()).position(|w| w == NEW_MAGIC) else {
        return Vec::new();
    };
    let cache = &bytes[base..];
    let u32_at = |off: usize| -> Option<u32> {
        cache
            .get(off..off + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    // Strings are offsets from the new header's start, NUL-terminated.
    let string_at = |off: u32| -> Option<String> {
        let rest = cache.get(off as usize..)?;
        let end = rest.iter().position(|b| *b == 0)?;
        std::str::from_utf8(&rest[..end]).ok().map(str::to_string)
    };
    let Some(nlibs) = u32_at(NEW_MAGIC.len()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for i in 0..nlibs as usize {
        let at = NEW_HEADER + i * NEW_ENTRY;
        let (Some(flags), Some(key), Some(value)) = (u32_at(at), u32_at(at + 4), u32_at(at + 8))
        else {
            break;
        };
        if flags as i32 & FLAG_TYPE_MASK != FLAG_ELF_LIBC6 {
            continue;
        }
        if let (Some(k), Some(v)) = (string_at(key), string_at(value)) {
            out.push((k, v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ld.so.cache image in the new format with `entries`, strings
    /// after the table, offsets from the header as glibc writes them;
    /// `compat` puts an old-format section in front, as RHEL 8 does.
    fn image(entries: &[(&str, &str)], compat: bool) -> Vec<u8> {
        let mut strings = Vec::new();
        let table = NEW_HEADER + entries.len() * NEW_ENTRY;
        let mut offs = Vec::new();
        for (k, v) in entries {
            let ko = table + strings.len();
            strings.extend_from_slice(k.as_bytes());
            strings.push(0);
            let vo = table + strings.len();
            strings.extend_from_slice(v.as_bytes());
            strings.push(0);
            offs.push((ko as u32, vo as u32));
        }
        let mut new = Vec::new();
        new.extend_from_slice(NEW_MAGIC);
        new.extend_from_slice(&(entries.len() as u32).to_ne_bytes());
        new.extend_from_slice(&(strings.len() as u32).to_ne_bytes());
        new.extend_from_slice(&[0u8; 4]);
        new.extend_from_slice(&[0u8; 16]);
        assert_eq!(new.len(), NEW_HEADER);
        for (k, v) in offs {
            new.extend_from_slice(&0x0303i32.to_ne_bytes());
            new.extend_from_slice(&k.to_ne_bytes());
            new.extend_from_slice(&v.to_ne_bytes());
            new.extend_from_slice(&[0u8; 12]);
        }
        new.extend_from_slice(&strings);
        if !compat {
            return new;
        }
        let mut old = b"ld.so-1.7.0\0".to_vec();
        old.extend_from_slice(&0u32.to_ne_bytes());
        while !old.len().is_multiple_of(8) {
            old.push(0);
        }
        old.extend_from_slice(&new);
        old
    }

    #[test]
    fn reads_both_layouts_glibc_writes() {
        let e = [
            ("libccl.so.2", "/opt/ccl/lib/libccl.so.2"),
            ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
        ];
        for compat in [false, true] {
            let got = cache_entries(&image(&e, compat));
            assert_eq!(
                got,
                e.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_truncated_or_foreign_cache_gives_what_it_can_and_never_panics() {
        let full = image(
            &[("liba.so.1", "/x/liba.so.1"), ("libb.so.1", "/x/libb.so.1")],
            false,
        );
        for cut in 0..full.len() {
            let got = cache_entries(&full[..cut]);
            assert!(got.len() <= 2);
        }
        assert!(cache_entries(b"not a cache").is_empty());
        assert_eq!(cache_entries(&full).len(), 2);
    }

    #[test]
    fn this_machines_cache_has_libc() {
        let Ok(bytes) = std::fs::read(LD_SO_CACHE) else {
            preflight_ground::testing::test_skip(&format!("no {LD_SO_CACHE} here"));
            return;
        };
        // Every glibc system's cache lists libc itself.
        assert!(
            cache_entries(&bytes).iter().any(|(k, _)| k == "libc.so.6"),
            "no libc.so.6 in {LD_SO_CACHE}"
        );
    }

    #[test]
    fn order_is_ld_library_path_then_cache_then_system_dirs() {
        let d = tempfile::tempdir().unwrap();
        let mk = |sub: &str| {
            let dir = d.path().join(sub);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("libx.so.1"), b"").unwrap();
            dir
        };
        let (env, cached, sys) = (mk("env"), mk("cached"), mk("sys"));
        let cache = d.path().join("ld.so.cache");
        let cached_lib = cached.join("libx.so.1").display().to_string();
        std::fs::write(&cache, image(&[("libx.so.1", &cached_lib)], false)).unwrap();
        let mut p = Places {
            root: PathBuf::from("/"),
            ld_library_path: Some(format!("/nonexistent:{}", env.display())),
            cache,
            system_dirs: vec![sys.clone()],
        };
        assert_eq!(
            p.find("libx.so.1"),
            Some((env.join("libx.so.1"), Via::LdLibraryPath))
        );
        p.ld_library_path = None;
        assert_eq!(
            p.find("libx.so.1"),
            Some((cached.join("libx.so.1"), Via::LdSoCache))
        );
        std::fs::remove_file(cached.join("libx.so.1")).unwrap();
        // A stale cache entry is not a library.
        assert_eq!(
            p.find("libx.so.1"),
            Some((sys.join("libx.so.1"), Via::SystemDir))
        );
        assert_eq!(p.find("liby.so.1"), None);
        let hw = env.join("glibc-hwcaps/x86-64-v3");
        std::fs::create_dir_all(&hw).unwrap();
        std::fs::write(hw.join("libz.so.1"), b"").unwrap();
        p.ld_library_path = Some(env.display().to_string());
        assert_eq!(
            p.find("libz.so.1"),
            Some((hw.join("libz.so.1"), Via::LdLibraryPath))
        );
        assert!(
            p.describe().starts_with("LD_LIBRARY_PATH, "),
            "{}",
            p.describe()
        );
    }

    #[test]
    fn a_relative_ld_library_path_entry_is_the_working_directorys() {
        let cwd = std::env::current_dir().unwrap();
        let d = tempfile::tempdir_in(&cwd).unwrap();
        std::fs::write(d.path().join("librel.so.1"), b"").unwrap();
        let rel = d.path().strip_prefix(&cwd).unwrap().display().to_string();
        let p = Places::on_node(Path::new("/"), Some(format!("/nonexistent:{rel}")));
        assert_eq!(
            p.find("librel.so.1"),
            Some((PathBuf::from(&rel).join("librel.so.1"), Via::LdLibraryPath))
        );
    }

    #[test]
    fn a_fixture_root_is_read_as_the_node() {
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("opt/vendor/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libq.so.1"), b"").unwrap();
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        std::fs::write(
            d.path().join("etc/ld.so.cache"),
            image(&[("libq.so.1", "/opt/vendor/lib/libq.so.1")], true),
        )
        .unwrap();
        let p = Places::on_node(d.path(), None);
        assert_eq!(
            p.find("libq.so.1"),
            Some((PathBuf::from("/opt/vendor/lib/libq.so.1"), Via::LdSoCache))
        );
        let p = Places::on_node(d.path(), Some("/opt/vendor/lib".into()));
        assert_eq!(
            p.find("libq.so.1"),
            Some((
                PathBuf::from("/opt/vendor/lib/libq.so.1"),
                Via::LdLibraryPath
            ))
        );
        // The live machine's copy is not the fixture's.
        assert_eq!(Places::on_node(d.path(), None).find("libc.so.6"), None);
    }
}
