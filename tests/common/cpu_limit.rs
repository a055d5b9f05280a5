//! A CPU limit for test processes: a cgroup of this test's own, held to a
//! share of one CPU (cgroup v2's cpu.max, or v1's CFS quota), removed when
//! dropped. The kernel throttles every process moved into it, as a
//! scheduler starves a rank on a busy node.

use std::path::PathBuf;

pub struct CpuLimit {
    dir: PathBuf,
    /// Where to move processes: cgroup.procs (v2) or tasks' cgroup.procs (v1).
    procs: PathBuf,
}

impl CpuLimit {
    /// A cgroup held to `percent` of one CPU; `None` (with the reason
    /// printed) where this machine has no CPU controller to use.
    pub fn new(percent: u32) -> Option<CpuLimit> {
        let name = format!("preflight-test-{}-{}", std::process::id(), unique());
        let period = 100_000u32;
        let quota = (period / 100 * percent).max(1000);
        let v2 = PathBuf::from("/sys/fs/cgroup");
        let v1 = PathBuf::from("/sys/fs/cgroup/cpu");
        let made = if std::fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "cpu"))
        {
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+cpu");
            let dir = v2.join(&name);
            std::fs::create_dir(&dir)
                .and_then(|()| std::fs::write(dir.join("cpu.max"), format!("{quota} {period}")))
                .map(|()| dir)
        } else if v1.join("cpu.cfs_quota_us").exists() {
            let dir = v1.join(&name);
            std::fs::create_dir(&dir)
                .and_then(|()| std::fs::write(dir.join("cpu.cfs_period_us"), period.to_string()))
                .and_then(|()| std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()))
                .map(|()| dir)
        } else {
            Err(std::io::Error::other(
                "no cgroup CPU controller (v2 cpu.max or v1 cpu)",
            ))
        };
        match made {
            Ok(dir) => Some(CpuLimit {
                procs: dir.join("cgroup.procs"),
                dir,
            }),
            Err(e) => {
                super::netns::skip_or_panic(&format!("cannot limit a process's CPU: {e}"));
                None
            }
        }
    }

    /// Moves process `pid` (every thread of it, and what it starts later)
    /// into the cgroup.
    pub fn hold(&self, pid: u32) {
        std::fs::write(&self.procs, pid.to_string())
            .unwrap_or_else(|e| panic!("{}: {pid}: {e}", self.procs.display()));
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        // A cgroup with processes cannot be removed: they are gone by now,
        // or moved back to the root first.
        if let Ok(pids) = std::fs::read_to_string(&self.procs) {
            let root = self.dir.parent().map(|p| p.join("cgroup.procs"));
            for pid in pids.lines() {
                if let Some(root) = &root {
                    let _ = std::fs::write(root, pid);
                }
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
