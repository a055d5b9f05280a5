//! A rank's state over a short sample: its task at the start and at the
//! end (state, where it sleeps, its system call, the CPU time between)
//! and its TCP sockets. Every process is sampled over the same window,
//! once: the cost does not grow with the sample times the ranks.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::facts::task::{self, Task};
use crate::facts::tcp_sockets::{self, TcpSocket};

/// /proc's CPU times are in clock ticks of USER_HZ, which Linux fixes at
/// 100 on every architecture.
const TICKS_PER_SEC: u64 = 100;

#[derive(Debug, Clone)]
pub struct Watched {
    /// The task at the end of the sample; `None`: gone (exited and reaped).
    pub task: Option<Task>,
    /// CPU time used during the sample, ms.
    pub cpu_ms: u64,
    /// Its sockets, empty when its descriptors could not be read.
    pub sockets: Vec<TcpSocket>,
    /// Whether its descriptors could be read (its user, or root).
    pub sockets_read: bool,
}

/// Each of `pids` watched for `sample`.
pub fn observe(proc_dir: &Path, pids: &[u32], sample: Duration) -> BTreeMap<u32, Watched> {
    let before: BTreeMap<u32, Option<Task>> = pids
        .iter()
        .map(|p| (*p, task::read(&proc_dir.join(p.to_string()))))
        .collect();
    if !pids.is_empty() {
        std::thread::sleep(sample);
    }
    pids.iter()
        .map(|&pid| {
            let dir = proc_dir.join(pid.to_string());
            let task = task::read(&dir);
            let cpu_ms = match (before.get(&pid).and_then(Option::as_ref), &task) {
                (Some(a), Some(b)) => {
                    b.cpu_ticks.saturating_sub(a.cpu_ticks) * 1000 / TICKS_PER_SEC
                }
                _ => 0,
            };
            let sockets_read = std::fs::read_dir(dir.join("fd")).is_ok();
            let sockets = tcp_sockets::of_process(&dir);
            (
                pid,
                Watched {
                    task,
                    cpu_ms,
                    sockets,
                    sockets_read,
                },
            )
        })
        .collect()
}
