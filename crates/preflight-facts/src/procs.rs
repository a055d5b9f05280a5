//! Which programs run on the node, from /proc under the root: how checks
//! see daemons (chronyd, nv-fabricmanager) without a service manager, who
//! owns what, and whose child a process is.

use std::path::Path;

/// The command names of every process, each once, sorted.
pub fn running(proc_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(proc_dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The parent of the process whose /proc directory is `proc_pid`, from its
/// `stat` (after the command name, which is in parentheses and may hold
/// anything); `None` when it is gone or unreadable.
pub fn parent(proc_pid: &Path) -> Option<u32> {
    let stat = std::fs::read_to_string(proc_pid.join("stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The effective uid of the process whose /proc directory is `proc_pid`,
/// from its `status` (the owner of /proc/PID is root for a process that is
/// not dumpable).
pub fn uid(proc_pid: &Path) -> Option<u32> {
    let status = std::fs::read_to_string(proc_pid.join("status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// When the process whose /proc directory is `proc_pid` began: its
/// `stat`'s start time (clock ticks after boot, at the kernel's fixed 100
/// a second) after the boot time in `/proc/stat` beside it.
pub fn started(proc_pid: &Path) -> Option<std::time::SystemTime> {
    let stat = std::fs::read_to_string(proc_pid.join("stat")).ok()?;
    let ticks: u64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    let boot: u64 = std::fs::read_to_string(proc_pid.parent()?.join("stat"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(boot * 1000 + ticks * 10))
}

/// The ancestors of process `pid`, its parent first, up to (not counting)
/// pid 1 or the first parent this user cannot see (a container's PID
/// namespace ends the chain at 0). Bounded: a corrupt or hostile /proc
/// cannot make it loop.
pub fn ancestors(proc_dir: &Path, pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut at = pid;
    while out.len() < 64 {
        match parent(&proc_dir.join(at.to_string())) {
            Some(p) if p > 1 && p != pid && !out.contains(&p) => {
                out.push(p);
                at = p;
            }
            _ => break,
        }
    }
    out
}

/// (pid, command name) of every process whose real uid is `uid`, by pid.
pub fn owned_by(proc_dir: &Path, uid: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir(proc_dir) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, String)> = entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .parse::<u32>()
                .ok()
                .map(|p| (p, e.path()))
        })
        .filter_map(|(pid, dir)| {
            // A process that ended while we read is simply not there.
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            let real: u32 = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            let name = status
                .lines()
                .find_map(|l| l.strip_prefix("Name:"))
                .map(|n| n.trim().to_string())
                .unwrap_or_default();
            (real == uid).then_some((pid, name))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_real_uid_of_each_process() {
        let d = tempfile::tempdir().unwrap();
        for (pid, uid, name) in [(10, 1000, "python3"), (11, 0, "sshd"), (12, 1000, "sleep")] {
            let p = d.path().join(pid.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(
                p.join("status"),
                format!("Name:\t{name}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
            )
            .unwrap();
        }
        std::fs::create_dir_all(d.path().join("self")).unwrap();
        assert_eq!(
            owned_by(d.path(), 1000),
            vec![(10, "python3".into()), (12, "sleep".into())]
        );
        assert!(owned_by(d.path(), 7).is_empty());
    }

    #[test]
    fn ancestors_stop_at_init_and_never_loop() {
        let d = tempfile::tempdir().unwrap();
        for (pid, ppid) in [(30, 20), (20, 10), (10, 1), (7, 8), (8, 7)] {
            let p = d.path().join(pid.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("stat"), format!("{pid} (x) S {ppid} 0 0")).unwrap();
        }
        assert_eq!(ancestors(d.path(), 30), vec![20, 10]);
        assert_eq!(ancestors(d.path(), 7), vec![8]);
        let parent = std::os::unix::process::parent_id();
        if parent > 1 {
            assert!(ancestors(Path::new("/proc"), std::process::id()).contains(&parent));
        }
    }

    #[test]
    fn the_parent_is_read_past_a_command_name_with_parentheses() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("stat"), "42 (a) b (c)) S 7 42 42 0").unwrap();
        assert_eq!(parent(d.path()), Some(7));
        assert_eq!(parent(&d.path().join("gone")), None);
        assert_eq!(
            parent(Path::new("/proc/self")),
            Some(std::os::unix::process::parent_id())
        );
    }
}
