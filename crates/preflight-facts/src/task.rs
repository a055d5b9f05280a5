//! What a process is doing, from `/proc/PID`: its state, the kernel
//! function its main thread sleeps in (`wchan`), the system call it is in
//! (`syscall`: readable by the process's own user and root), and the CPU
//! time it has used. Read only: nothing here stops or signals it.

use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// `R` running, `S` sleeping, `D` in uninterruptible wait, `T`
    /// stopped, `t` traced, `Z` exited and not reaped.
    pub state: char,
    /// Where its main thread sleeps in the kernel (`futex_do_wait`,
    /// `hrtimer_nanosleep`), when it does and the kernel says.
    pub wchan: Option<String>,
    /// The system call its main thread is in; `None` when running in user
    /// space or not readable.
    pub syscall: Option<i64>,
    /// User and system CPU time of every thread, clock ticks.
    pub cpu_ticks: u64,
    pub threads: u32,
}

/// The task of the process at `proc_pid` (`/proc/PID`); `None` when it is
/// gone.
pub fn read(proc_pid: &Path) -> Option<Task> {
    let stat = std::fs::read_to_string(proc_pid.join("stat")).ok()?;
    let (state, cpu_ticks, threads) = parse_stat(&stat)?;
    let wchan = std::fs::read_to_string(proc_pid.join("wchan"))
        .ok()
        .map(|w| w.trim().to_string())
        .filter(|w| !w.is_empty() && w != "0");
    let syscall = std::fs::read_to_string(proc_pid.join("syscall"))
        .ok()
        .and_then(|s| parse_syscall(&s));
    Some(Task {
        state,
        wchan,
        syscall,
        cpu_ticks,
        threads,
    })
}

/// State, utime + stime, and threads from `/proc/PID/stat`, whose second
/// field (the command, in parentheses) may hold anything.
pub fn parse_stat(text: &str) -> Option<(char, u64, u32)> {
    let rest = text.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state (0), ..., utime (11), stime (12), ...,
    // num_threads (17).
    let state = f.first()?.chars().next()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let threads: u32 = f.get(17)?.parse().ok()?;
    Some((state, utime.saturating_add(stime), threads))
}

/// The call number from `/proc/PID/syscall`: `NR args...`, `running`, or
/// `-1 sp pc` (blocked outside a call).
pub fn parse_syscall(text: &str) -> Option<i64> {
    let first = text.split_whitespace().next()?;
    first.parse::<i64>().ok().filter(|n| *n >= 0)
}

/// What a system call number means on this architecture, for the calls a
/// waiting rank is found in.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    let known: &[(i64, &str)] = &[
        (0, "read"),
        (7, "poll"),
        (23, "select"),
        (35, "nanosleep"),
        (43, "accept"),
        (45, "recvfrom"),
        (47, "recvmsg"),
        (61, "wait4"),
        (202, "futex"),
        (230, "clock_nanosleep"),
        (232, "epoll_wait"),
        (270, "pselect6"),
        (271, "ppoll"),
        (281, "epoll_pwait"),
        (288, "accept4"),
    ];
    #[cfg(target_arch = "aarch64")]
    let known: &[(i64, &str)] = &[
        (63, "read"),
        (73, "ppoll"),
        (98, "futex"),
        (101, "nanosleep"),
        (115, "clock_nanosleep"),
        (202, "accept"),
        (207, "recvfrom"),
        (212, "recvmsg"),
        (22, "epoll_pwait"),
        (242, "accept4"),
        (260, "wait4"),
    ];
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let known: &[(i64, &str)] = &[];
    known.iter().find(|(n, _)| *n == nr).map(|(_, name)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stat_past_a_command_with_spaces_and_parens() {
        let stat = "4242 (py thon) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 57 13 0 0 20 0 9 0 123 456 789";
        assert_eq!(parse_stat(stat), Some(('S', 70, 9)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(
            parse_syscall("202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f12"),
            Some(202)
        );
        assert_eq!(parse_syscall("running"), None);
        assert_eq!(parse_syscall("-1 0x7ffd 0x7f12"), None);
        // This process, live.
        let me = read(Path::new("/proc/self")).unwrap();
        assert!(me.threads >= 1);
    }
}
