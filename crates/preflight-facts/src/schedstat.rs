//! A thread's scheduler accounting, from `/proc/thread-self/schedstat`:
//! the time it ran on a CPU and the time it waited, runnable, for one.
//! The kernel counts a task of a cgroup held to its CPU quota as waiting
//! too, so a rank starved by its neighbours and one throttled by its
//! cgroup both show here.

use std::time::Duration;

/// One reading of a thread's accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sched {
    pub ran: Duration,
    pub waited: Duration,
}

/// The calling thread's accounting; `None` where the kernel keeps none
/// (no schedstats, another system).
pub fn this_thread() -> Option<Sched> {
    parse(&std::fs::read_to_string("/proc/thread-self/schedstat").ok()?)
}

/// `RAN_NS WAITED_NS TIMESLICES`.
pub fn parse(text: &str) -> Option<Sched> {
    let mut it = text.split_ascii_whitespace();
    let ran = it.next()?.parse().ok()?;
    let waited = it.next()?.parse().ok()?;
    Some(Sched {
        ran: Duration::from_nanos(ran),
        waited: Duration::from_nanos(waited),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_three_fields() {
        let s = parse("26523489 1998747602 28\n").unwrap();
        assert_eq!(s.ran, Duration::from_nanos(26_523_489));
        assert_eq!(s.waited, Duration::from_nanos(1_998_747_602));
        assert_eq!(parse(""), None);
        assert_eq!(parse("12 x 3"), None);
        // This thread has one, where the kernel keeps them.
        if std::path::Path::new("/proc/thread-self/schedstat").exists() {
            assert!(this_thread().is_some());
        }
    }
}
