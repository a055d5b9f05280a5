//! Each rank watched over a window: a look every 100 ms at its task
//! (state, where it sleeps in the kernel, its system call), the bytes it
//! moved through read and write calls (`/proc/PID/io`), and its TCP
//! sockets' queues. The window ends early once every rank has moved
//! bytes: a job that moves is seen to move in a few looks, and only one
//! that stands still is watched to the end. Every process is watched
//! over the same window: the cost does not grow with the window times
//! the ranks.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use preflight_facts::process_io::{self, IoCounters};
use preflight_facts::task::{self, Task, syscall_name};
use preflight_facts::tcp_sockets::{self, TcpSocket};

/// /proc's CPU times are in clock ticks of USER_HZ, which Linux fixes at
/// 100 on every architecture.
const TICKS_PER_SEC: u64 = 100;
/// Between two looks.
const LOOK_EVERY: Duration = Duration::from_millis(100);
/// The least of the window watched before it may end early: a few looks,
/// so that a job's movement is its own and not one lucky write.
const LEAST: Duration = Duration::from_millis(300);

/// Kernel functions a blocked wait sleeps in: a lock or condition
/// variable (futex), a poll, a socket's receive or accept.
const WAITS: &[&str] = &[
    "futex",
    "epoll",
    "ep_poll",
    "poll",
    "select",
    "sk_wait",
    "inet_csk",
    "unix_stream",
    "wait_woken",
    "tcp_recv",
    "pipe_read",
    "do_wait",
];
const WAIT_CALLS: &[&str] = &[
    "futex",
    "epoll_wait",
    "epoll_pwait",
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "read",
    "recvfrom",
    "recvmsg",
    "accept",
    "accept4",
    "wait4",
];

/// What one look found the main thread doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Asleep in a wait: a lock, a poll, a socket.
    Wait,
    /// In nanosleep: time.sleep or the like, in its own code.
    Sleep,
    /// On a CPU, or ready to be.
    Run,
    /// Anything else (an uninterruptible wait, stopped, gone).
    Other,
}

pub fn look(t: &Task) -> Look {
    let wchan = t.wchan.as_deref().unwrap_or("");
    let call = t.syscall.and_then(syscall_name).unwrap_or("");
    match t.state {
        'R' => Look::Run,
        'S' if wchan.contains("nanosleep") || call.contains("nanosleep") => Look::Sleep,
        'S' if WAITS.iter().any(|x| wchan.contains(x)) || WAIT_CALLS.contains(&call) => Look::Wait,
        'S' => Look::Wait,
        _ => Look::Other,
    }
}

#[derive(Debug, Clone, Default)]
pub struct Watched {
    /// The task at the end of the window; `None`: gone (exited and
    /// reaped).
    pub task: Option<Task>,
    /// CPU time used over the window, ms.
    pub cpu_ms: u64,
    /// Bytes moved through read and write calls over the window; `None`
    /// where `/proc/PID/io` is not this user's to read.
    pub io_bytes: Option<u64>,
    /// Bytes by which its sockets' queues changed between looks.
    pub queue_bytes: u64,
    /// Looks taken, and how many found it in each state.
    pub looks: u32,
    pub waits: u32,
    pub sleeps: u32,
    pub runs: u32,
    /// Looks that found it runnable without a tick of CPU gained since the
    /// look before: waiting for a CPU (a busy node), not running its code.
    pub ready: u32,
    /// Its sockets at the end, empty when its descriptors could not be
    /// read.
    pub sockets: Vec<TcpSocket>,
    /// Whether its descriptors could be read (its user, or root).
    pub sockets_read: bool,
}

impl Watched {
    /// Bytes it moved through its calls or its sockets over the window.
    pub fn moved_bytes(&self) -> u64 {
        self.io_bytes.unwrap_or(0) + self.queue_bytes
    }
}

/// How the window went.
#[derive(Debug, Clone)]
pub struct Window {
    pub watched: BTreeMap<u32, Watched>,
    /// How long it was watched.
    pub elapsed: Duration,
}

struct Start {
    cpu: Option<u64>,
    /// Its CPU ticks at the look before.
    last_cpu: Option<u64>,
    io: Option<IoCounters>,
    queues: BTreeMap<u64, (u64, u64)>,
}

fn queues(sockets: &[TcpSocket]) -> BTreeMap<u64, (u64, u64)> {
    sockets
        .iter()
        .filter(|s| s.state == "established")
        .map(|s| (s.inode, (s.unsent, s.unread)))
        .collect()
}

/// Each of `pids` watched for `window` at most (see the module's comment).
pub fn observe(proc_dir: &Path, pids: &[u32], window: Duration) -> Window {
    let began = Instant::now();
    let mut starts: BTreeMap<u32, Start> = BTreeMap::new();
    let mut out: BTreeMap<u32, Watched> = BTreeMap::new();
    for &pid in pids {
        let dir = proc_dir.join(pid.to_string());
        let task = task::read(&dir);
        let sockets = tcp_sockets::of_process(&dir);
        starts.insert(
            pid,
            Start {
                cpu: task.as_ref().map(|t| t.cpu_ticks),
                last_cpu: task.as_ref().map(|t| t.cpu_ticks),
                io: process_io::read(&dir),
                queues: queues(&sockets),
            },
        );
        out.insert(
            pid,
            Watched {
                sockets_read: std::fs::read_dir(dir.join("fd")).is_ok(),
                sockets,
                ..Watched::default()
            },
        );
    }
    if pids.is_empty() {
        return Window {
            watched: out,
            elapsed: Duration::ZERO,
        };
    }
    loop {
        let left = window.saturating_sub(began.elapsed());
        std::thread::sleep(LOOK_EVERY.min(left));
        for &pid in pids {
            let dir = proc_dir.join(pid.to_string());
            let (Some(w), Some(start)) = (out.get_mut(&pid), starts.get_mut(&pid)) else {
                continue;
            };
            let task = task::read(&dir);
            w.looks += 1;
            let now_cpu = task.as_ref().map(|t| t.cpu_ticks);
            let gained = matches!((start.last_cpu, now_cpu), (Some(a), Some(b)) if b > a);
            start.last_cpu = now_cpu.or(start.last_cpu);
            match task.as_ref().map(look) {
                Some(Look::Wait) => w.waits += 1,
                Some(Look::Sleep) => w.sleeps += 1,
                Some(Look::Run) if gained => w.runs += 1,
                Some(Look::Run) => w.ready += 1,
                _ => {}
            }
            if let (Some(a), Some(b)) = (start.cpu, task.as_ref()) {
                w.cpu_ms = b.cpu_ticks.saturating_sub(a) * 1000 / TICKS_PER_SEC;
            }
            w.io_bytes = match (start.io, process_io::read(&dir)) {
                (Some(a), Some(b)) => Some(b.bytes_since(&a)),
                _ => w.io_bytes,
            };
            let sockets = tcp_sockets::of_process(&dir);
            let now = queues(&sockets);
            for (inode, (unsent, unread)) in &now {
                if let Some((u0, r0)) = start.queues.get(inode) {
                    w.queue_bytes += unsent.abs_diff(*u0) + unread.abs_diff(*r0);
                }
            }
            start.queues = now;
            if task.is_some() {
                w.sockets = sockets;
            }
            w.task = task;
        }
        let elapsed = began.elapsed();
        let all_moved = out.values().all(|w| w.moved_bytes() > 0);
        if elapsed >= window || (all_moved && elapsed >= LEAST.min(window)) {
            return Window {
                watched: out,
                elapsed,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: char, wchan: &str) -> Task {
        Task {
            state,
            wchan: Some(wchan.into()),
            syscall: None,
            cpu_ticks: 0,
            threads: 8,
        }
    }

    #[test]
    fn each_look_is_a_wait_a_sleep_a_run_or_else() {
        assert_eq!(look(&task('S', "futex_do_wait")), Look::Wait);
        assert_eq!(look(&task('S', "ep_poll")), Look::Wait);
        assert_eq!(look(&task('S', "hrtimer_nanosleep")), Look::Sleep);
        assert_eq!(look(&task('R', "")), Look::Run);
        assert_eq!(look(&task('D', "nv_wait")), Look::Other);
        assert_eq!(look(&task('T', "do_signal_stop")), Look::Other);
    }

    /// This test's own process, watched while it writes: its bytes are
    /// seen, and the window ends early, as soon as it has moved and the
    /// least of the window has passed.
    #[test]
    fn a_process_that_writes_is_seen_to_move_and_the_window_ends_early() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let pid = std::process::id();
        let stop = Arc::new(AtomicBool::new(false));
        let writing = Arc::clone(&stop);
        let writer = std::thread::spawn(move || {
            let f = tempfile::tempfile().unwrap();
            while !writing.load(Ordering::Relaxed) {
                let _ = std::io::Write::write_all(&mut &f, &[0u8; 4096]);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let w = observe(Path::new("/proc"), &[pid], Duration::from_secs(10));
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(w.watched[&pid].moved_bytes() > 0, "{w:?}");
        assert!(w.elapsed >= LEAST, "{:?}", w.elapsed);
        assert!(w.elapsed < Duration::from_secs(5), "{:?}", w.elapsed);
    }
}
