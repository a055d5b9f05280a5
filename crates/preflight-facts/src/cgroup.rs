//! This process's cgroup limits: CPU quota and memory limit, from cgroup
//! v2 (cpu.max, memory.max) or v1 (cpu.cfs_quota_us, memory.limit_in_bytes).
//! The effective limit is the tightest along the path to the root.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// CPUs' worth of quota (quota / period); `None`: unlimited.
    pub cpus: Option<f64>,
    /// Bytes; `None`: unlimited.
    pub memory: Option<u64>,
    pub version: &'static str,
}

/// v1 writes "unlimited" as a huge page-aligned number.
const V1_UNLIMITED: u64 = 1 << 62;

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn min_opt<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y < x { y } else { x }),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The directories from a cgroup's own up to the mount point.
fn chain(mount: &Path, relative: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut rel = PathBuf::from(relative.trim_start_matches('/'));
    loop {
        dirs.push(mount.join(&rel));
        if !rel.pop() {
            break;
        }
    }
    dirs
}

fn v2_cpus(text: &str) -> Option<f64> {
    let mut parts = text.split_whitespace();
    let quota = parts.next()?;
    let period: f64 = parts
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(100_000.0);
    if quota == "max" {
        return None;
    }
    quota.parse::<f64>().ok().map(|q| q / period)
}

/// `cgroup_file` is /proc/self/cgroup; `sys_cgroup` is /sys/fs/cgroup;
/// both already resolved under the root.
pub fn limits(cgroup_file: &Path, sys_cgroup: &Path) -> Result<Limits, String> {
    let text = std::fs::read_to_string(cgroup_file)
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let mut v2_path = None;
    let mut v1: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            v2_path = Some(path.to_string());
        } else {
            for c in controllers.split(',') {
                v1.push((c.to_string(), path.to_string()));
            }
        }
    }
    let v1_path = |name: &str| v1.iter().find(|(c, _)| c == name).map(|(_, p)| p.clone());
    if let (Some(cpu), Some(mem)) = (v1_path("cpu"), v1_path("memory")) {
        let mut limits = Limits {
            version: "v1",
            ..Limits::default()
        };
        for dir in chain(&sys_cgroup.join("cpu"), &cpu) {
            let quota = read(&dir.join("cpu.cfs_quota_us")).and_then(|q| q.parse::<i64>().ok());
            let period = read(&dir.join("cpu.cfs_period_us")).and_then(|p| p.parse::<f64>().ok());
            if let (Some(q), Some(p)) = (quota, period)
                && q > 0
                && p > 0.0
            {
                limits.cpus = min_opt(limits.cpus, Some(q as f64 / p));
            }
        }
        for dir in chain(&sys_cgroup.join("memory"), &mem) {
            let bytes =
                read(&dir.join("memory.limit_in_bytes")).and_then(|b| b.parse::<u64>().ok());
            limits.memory = min_opt(limits.memory, bytes.filter(|b| *b < V1_UNLIMITED));
        }
        return Ok(limits);
    }
    let path = v2_path.ok_or("no cgroup v2 entry (0::/...) in /proc/self/cgroup")?;
    let mut limits = Limits {
        version: "v2",
        ..Limits::default()
    };
    for dir in chain(sys_cgroup, &path) {
        if let Some(t) = read(&dir.join("cpu.max")) {
            limits.cpus = min_opt(limits.cpus, v2_cpus(&t));
        }
        if let Some(t) = read(&dir.join("memory.max")) {
            limits.memory = min_opt(limits.memory, t.parse().ok());
        }
    }
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_max() {
        assert_eq!(v2_cpus("max 100000"), None);
        assert_eq!(v2_cpus("400000 100000"), Some(4.0));
    }

    #[test]
    fn chain_reaches_the_mount() {
        let c = chain(Path::new("/sys/fs/cgroup"), "/a/b");
        assert_eq!(
            c,
            vec![
                PathBuf::from("/sys/fs/cgroup/a/b"),
                PathBuf::from("/sys/fs/cgroup/a"),
                PathBuf::from("/sys/fs/cgroup")
            ]
        );
    }
}
