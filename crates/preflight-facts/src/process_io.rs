//! The bytes a process has moved through read and write calls, from
//! `/proc/PID/io` (readable by its own user and root, as its environment
//! is). Gloo writes its collectives' data with writev, and those bytes
//! count here; send/recv (NCCL's socket transport, torch's store client)
//! do not, which keeps a store's heartbeat out of a job's progress.

use std::path::Path;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Bytes passed to read-like calls.
    pub rchar: u64,
    /// Bytes passed to write-like calls.
    pub wchar: u64,
    /// Read-like calls made.
    pub syscr: u64,
    /// Write-like calls made.
    pub syscw: u64,
}

impl IoCounters {
    /// Bytes moved either way since `before`.
    pub fn bytes_since(&self, before: &IoCounters) -> u64 {
        self.rchar.saturating_sub(before.rchar) + self.wchar.saturating_sub(before.wchar)
    }
}

/// The counters of the process at `proc_pid`; `None` when gone or not
/// this user's.
pub fn read(proc_pid: &Path) -> Option<IoCounters> {
    parse(&std::fs::read_to_string(proc_pid.join("io")).ok()?)
}

pub fn parse(text: &str) -> Option<IoCounters> {
    let mut c = IoCounters::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let Ok(v) = v.trim().parse::<u64>() else {
            continue;
        };
        let slot = match k.trim() {
            "rchar" => &mut c.rchar,
            "wchar" => &mut c.wchar,
            "syscr" => &mut c.syscr,
            "syscw" => &mut c.syscw,
            _ => continue,
        };
        *slot = v;
        seen += 1;
    }
    (seen == 4).then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_four_counters_and_refuses_a_partial_file() {
        let text = "rchar: 10\nwchar: 2618800\nsyscr: 1\nsyscw: 11977\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n";
        let c = parse(text).unwrap();
        assert_eq!(
            (c.rchar, c.wchar, c.syscr, c.syscw),
            (10, 2618800, 1, 11977)
        );
        let before = IoCounters {
            rchar: 4,
            wchar: 2618000,
            ..c
        };
        assert_eq!(c.bytes_since(&before), 806);
        assert_eq!(parse("rchar: 1\nwchar: 2\n"), None);
        assert!(read(Path::new("/proc/self")).is_some());
    }
}
