//! The verdict on one job: what each rank does, and which ranks hold the
//! others up. A rank is named only on evidence: every other rank of the
//! job here waits (asleep in the kernel on a lock, a poll or a socket,
//! using no CPU through the sample) while it does something else (sleeps
//! in user code, runs, is stopped, has exited), or it is absent from a
//! job that runs wholly on this node. Where every rank waits and none is
//! absent, the rank they wait for is elsewhere, and nothing is named.

use std::collections::BTreeMap;

use super::find::Job;
use super::observe::Watched;
use super::{Stacks, rank_list};
use crate::facts::py_spy::PyFrame;
use crate::facts::task::syscall_name;
use crate::result::diagnosis::{Culprit, JobDiagnosis, RankState, StoreRead};

/// CPU in the sample at or above which a rank counts as running: 30 ms,
/// or a tenth of a CPU over a longer sample.
const BUSY_MS: u64 = 30;
/// CPU in the sample up to which a rank asleep in a wait counts as
/// waiting: 20 ms, or a twentieth of a CPU over a longer sample. CPU time
/// comes in clock ticks of 10 ms, and a rank that waits still has helper
/// threads (Gloo's loop, torch's watchdog) that wake now and then; on a
/// busy host a tick or two lands on them in any sample. A rank that only
/// began to wait during the sample used more.
const IDLE_MS: u64 = 20;

fn busy_ms(sample_ms: u64) -> u64 {
    BUSY_MS.max(sample_ms / 10)
}

fn idle_ms(sample_ms: u64) -> u64 {
    IDLE_MS.max(sample_ms / 20)
}

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

fn classify(w: Option<&Watched>, sample_ms: u64) -> (&'static str, String) {
    let Some(t) = w.and_then(|w| w.task.as_ref()) else {
        return ("exited", "exited (its process is gone)".into());
    };
    let cpu = w.map_or(0, |w| w.cpu_ms);
    let wchan = t.wchan.clone().unwrap_or_default();
    let call = t.syscall.and_then(syscall_name).unwrap_or("");
    let at = if !wchan.is_empty() {
        wchan.clone()
    } else if !call.is_empty() {
        call.to_string()
    } else {
        "user space".to_string()
    };
    match t.state {
        'Z' | 'X' => ("exited", "exited, not yet reaped by its launcher".into()),
        'T' | 't' => ("stopped", "stopped (SIGSTOP, or held by a debugger)".into()),
        'D' => (
            "in_kernel",
            format!("in an uninterruptible wait in the kernel ({at}): a driver or a disk"),
        ),
        _ if cpu >= busy_ms(sample_ms) => (
            "running",
            format!("running ({cpu} ms of CPU in {sample_ms} ms)"),
        ),
        _ if wchan.contains("nanosleep") || call.contains("nanosleep") => (
            "sleeping",
            format!("sleeping in its own code ({at}: time.sleep or the like)"),
        ),
        _ if cpu <= idle_ms(sample_ms)
            && (WAITS.iter().any(|x| wchan.contains(x)) || WAIT_CALLS.contains(&call)) =>
        {
            ("waiting", format!("waiting in {at}, no CPU used"))
        }
        _ => (
            "idle",
            format!("idle in {at} ({cpu} ms of CPU in {sample_ms} ms)"),
        ),
    }
}

/// Connections of waiting ranks whose data the peer never acknowledges:
/// sent, not acknowledged, and retransmitted by the kernel. A peer that
/// does not read shows a zero-window probe instead, and is left to the
/// rank evidence; this is the path (or the peer's host) dropping it. Each
/// peer once, with a connect from here to it, as preflight's tcp_connect
/// check makes one.
fn dropping_paths(job: &Job, watched: &BTreeMap<u32, Watched>, ranks: &[RankState]) -> Vec<String> {
    // A connect from here tests a rank's path only from its own network
    // namespace (a container's ranks have theirs).
    let own_ns = std::fs::read_link("/proc/self/ns/net").ok();
    let here = |pid: u32| {
        own_ns.is_some() && std::fs::read_link(format!("/proc/{pid}/ns/net")).ok() == own_ns
    };
    let mut by_peer: BTreeMap<std::net::SocketAddr, (Vec<u32>, u64, u32, bool)> = BTreeMap::new();
    for r in ranks.iter().filter(|r| r.state == "waiting") {
        let Some(pid) = job.ranks.iter().find(|p| p.rank == r.rank).map(|p| p.pid) else {
            continue;
        };
        for s in watched
            .get(&pid)
            .map(|w| w.sockets.as_slice())
            .unwrap_or_default()
        {
            if s.state == "established" && s.unsent > 0 && s.timer == 1 && s.retransmits > 0 {
                let e = by_peer.entry(s.remote).or_default();
                if !e.0.contains(&r.rank) {
                    e.0.push(r.rank);
                }
                e.1 += s.unsent;
                e.2 = e.2.max(s.retransmits);
                e.3 |= here(pid);
            }
        }
    }
    by_peer
        .into_iter()
        .map(|(peer, (from, unsent, retransmits, local))| {
            let probe = if !local {
                "not probed from here (the ranks are in another network namespace)".to_string()
            } else {
                let connect = match std::net::TcpStream::connect_timeout(&peer, PROBE) {
                    Ok(_) => format!("a connect from here to {peer} succeeds"),
                    Err(e) => format!(
                        "a connect from here to {peer}: {} ({})",
                        crate::kinds::tcp_connect::classify(&e).name(),
                        e
                    ),
                };
                format!(
                    "{connect}; {}",
                    crate::kinds::ping::quote(&peer.ip().to_string())
                )
            };
            let times = match retransmits {
                1 => "once".to_string(),
                n => format!("{n} times"),
            };
            format!(
                "the path from {} to {peer} drops the job's data: {} sent and never acknowledged, retransmitted {times}; {probe}",
                rank_list(&from),
                crate::values::format_bytes(unsent)
            )
        })
        .collect()
}

/// A connect to a peer the evidence points at.
const PROBE: std::time::Duration = std::time::Duration::from_secs(1);

/// The judgement of `job` from what each of its ranks was seen doing.
pub fn judge(
    job: &Job,
    watched: &BTreeMap<u32, Watched>,
    stacks: &Stacks,
    store_read: Option<StoreRead>,
    node: &str,
    sample_ms: u64,
) -> JobDiagnosis {
    let in_store = |rank: u32| {
        store_read
            .as_ref()
            .filter(|s| s.error.is_none())
            .map(|s| s.arrived.contains(&rank))
    };
    let store = job.store.as_ref().map(|(a, p)| format!("{a}:{p}"));
    let store_port = job.store.as_ref().map(|(_, p)| *p);
    // Every local address of the job's ranks: a connection to one of them
    // is a connection to a peer.
    let locals: Vec<(u32, std::net::SocketAddr)> = job
        .ranks
        .iter()
        .flat_map(|r| {
            watched
                .get(&r.pid)
                .into_iter()
                .flat_map(|w| w.sockets.iter().map(|s| (r.pid, s.local)))
        })
        .collect();
    let ranks: Vec<RankState> = job
        .ranks
        .iter()
        .map(|r| {
            let w = watched.get(&r.pid);
            let (state, mut doing) = classify(w, sample_ms);
            let stack = stacks.get(&r.pid);
            let call = stack.and_then(|s| s.as_ref().ok()).and_then(|f| call(f));
            if let Some(c) = call.as_ref().filter(|c| c.contains(".py:")) {
                doing.push_str(&format!(", at {c}"));
            }
            let sockets = w.map(|w| w.sockets.as_slice()).unwrap_or_default();
            let established = sockets.iter().filter(|s| s.state == "established");
            let store_connected = match (w, store_port) {
                (Some(w), Some(port)) if w.sockets_read => Some(sockets.iter().any(|s| {
                    (s.state == "established" && s.remote.port() == port)
                        || (s.state == "listen" && s.local.port() == port)
                })),
                _ => None,
            };
            RankState {
                rank: r.rank,
                pid: r.pid,
                state: state.into(),
                doing,
                wchan: w.and_then(|w| w.task.as_ref()?.wchan.clone()),
                syscall: w
                    .and_then(|w| w.task.as_ref()?.syscall)
                    .map(|n| syscall_name(n).map_or(n.to_string(), String::from)),
                cpu_ms: w.map_or(0, |w| w.cpu_ms),
                store_connected,
                peer_connections: established
                    .clone()
                    .filter(|s| locals.iter().any(|(p, a)| *p != r.pid && *a == s.remote))
                    .count() as u32,
                unread_bytes: sockets.iter().map(|s| s.unread).sum(),
                unsent_bytes: sockets.iter().map(|s| s.unsent).sum(),
                in_store: in_store(r.rank),
                call,
                stack: stack
                    .and_then(|s| s.as_ref().ok())
                    .map(|f| {
                        f.iter()
                            .take(32)
                            .map(|f| format!("{} ({}:{})", f.function, f.file, f.line))
                            .collect()
                    })
                    .unwrap_or_default(),
                stack_error: stack.and_then(|s| s.as_ref().err().cloned()),
            }
        })
        .collect();
    let here = job.ranks.first().and_then(|r| r.local_world);
    let found: Vec<u32> = ranks.iter().map(|r| r.rank).collect();
    // A job wholly on this node: every rank should be here.
    let whole = here == Some(job.world) || found.len() as u32 == job.world;
    let missing: Vec<u32> = if whole {
        (0..job.world).filter(|r| !found.contains(r)).collect()
    } else {
        Vec::new()
    };
    let elsewhere = if whole {
        0
    } else {
        job.world.saturating_sub(here.unwrap_or(found.len() as u32))
    };
    let waiting: Vec<&RankState> = ranks.iter().filter(|r| r.state == "waiting").collect();
    // A rank idle in the kernel with a little CPU (one that is only now
    // coming to wait) is neither evidence nor a waiter.
    let odd: Vec<&RankState> = ranks
        .iter()
        .filter(|r| r.state != "waiting" && r.state != "idle")
        .collect();
    let waiting_ranks: Vec<u32> = waiting.iter().map(|r| r.rank).collect();
    let phase = phase(&waiting, ranks.len() + missing.len(), store.as_deref());
    let paths = dropping_paths(job, watched, &ranks);
    let mut culprits = Vec::new();
    let summary;
    let verdict;
    if !waiting.is_empty() && (!odd.is_empty() || !missing.is_empty()) {
        let arrival = store_read
            .as_ref()
            .filter(|s| s.error.is_none() && phase.contains("connected to the store"))
            .map(|s| {
                format!(
                    "; {} of {} ranks reached init_process_group (their address is in the store)",
                    s.arrived.len(),
                    job.world
                )
            })
            .unwrap_or_default();
        let others = format!(
            "{} {} {phase}{arrival}",
            rank_list(&waiting_ranks),
            if waiting.len() == 1 { "waits" } else { "wait" }
        );
        for r in &odd {
            let mut why = format!("{} while {others}", r.doing);
            let others_on_store = waiting.iter().all(|w| w.store_connected == Some(true));
            if others_on_store && r.store_connected == Some(false) {
                why.push_str(&format!(
                    "; it is not connected to the job's store ({})",
                    store.as_deref().unwrap_or("MASTER_ADDR:MASTER_PORT")
                ));
            }
            let others_in_store = waiting.iter().all(|w| w.in_store == Some(true));
            if others_in_store && r.in_store == Some(false) {
                why.push_str(
                    "; it has not published its address in the store, as the others have (it never reached init_process_group)",
                );
            }
            if r.unread_bytes > 0 {
                why.push_str(&format!(
                    "; {} of its peers' data wait unread in its sockets",
                    crate::values::format_bytes(r.unread_bytes)
                ));
            }
            culprits.push(Culprit {
                rank: r.rank,
                node: node.into(),
                pid: Some(r.pid),
                reason: why,
            });
        }
        for &m in &missing {
            culprits.push(Culprit {
                rank: m,
                node: node.into(),
                pid: None,
                reason: format!(
                    "absent: no process of rank {m} on this node (it exited, or never started), while {others}{}",
                    if in_store(m) == Some(false) {
                        "; it never published its address in the store"
                    } else {
                        ""
                    }
                ),
            });
        }
        summary = others;
        verdict = "held";
    } else if waiting.is_empty() && missing.is_empty() {
        summary = if ranks.iter().all(|r| r.state == "running") {
            format!("every rank is running ({} here)", ranks.len())
        } else {
            format!("no rank waits on another ({} here)", ranks.len())
        };
        verdict = "progressing";
    } else {
        summary = if elsewhere > 0 {
            format!(
                "{} {} {phase}: the rank they wait for is not on this node ({elsewhere} of {} ranks run elsewhere): run diagnose there",
                rank_list(&waiting_ranks),
                if waiting.len() == 1 { "waits" } else { "wait" },
                job.world
            )
        } else {
            format!(
                "every rank waits {phase}, and none is absent: nothing here tells which one the others wait for"
            )
        };
        verdict = "unknown";
    }
    let (verdict, summary) = if verdict == "unknown" && !paths.is_empty() {
        (
            "held",
            format!(
                "{}: every rank here waits, and a path they send on drops their data (below)",
                rank_list(&waiting_ranks)
            ),
        )
    } else {
        (verdict, summary)
    };
    JobDiagnosis {
        paths,
        job: job.name.clone(),
        world_size: job.world,
        store,
        ranks,
        missing,
        elsewhere,
        culprits,
        store_read,
        summary,
        verdict: verdict.into(),
    }
}

/// The torch.distributed calls a rank waits in, as py-spy names them.
const CALLS: &[&str] = &[
    "init_process_group",
    "new_group",
    "barrier",
    "monitored_barrier",
    "all_reduce",
    "all_reduce_coalesced",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "broadcast_object_list",
    "destroy_process_group",
    "wait",
];

/// Where a stack is: the innermost torch.distributed call it is in, else
/// the innermost frame of its own code (`job.py:12 in <module>`).
fn call(frames: &[PyFrame]) -> Option<String> {
    if let Some(f) = frames
        .iter()
        .find(|f| f.file.contains("torch/distributed/") && CALLS.contains(&f.function.as_str()))
    {
        return Some(f.function.clone());
    }
    frames
        .iter()
        .find(|f| !f.file.contains("-packages/") && !f.file.starts_with("/usr/lib/python"))
        .or(frames.first())
        .map(|f| format!("{}:{} in {}", f.file, f.line, f.function))
}

/// Where the waiting ranks are, from their connections: connected to
/// every other rank here is after init (a collective or a barrier);
/// connected to the store, the mesh not complete, is init
/// (`init_process_group`, waiting for the ranks that have not come).
fn phase(waiting: &[&RankState], here: usize, store: Option<&str>) -> String {
    if waiting.is_empty() {
        return String::new();
    }
    let shared = waiting[0]
        .call
        .as_ref()
        .filter(|c| !c.contains(".py:") && waiting.iter().all(|r| r.call.as_ref() == Some(c)));
    let on_store = waiting
        .iter()
        .filter(|r| r.store_connected == Some(true))
        .count();
    let meshed = waiting
        .iter()
        .filter(|r| r.peer_connections as usize + 1 >= here)
        .count();
    if here > 1 && meshed == waiting.len() {
        match shared {
            Some(c) => format!("in {c} (after init: connected to every other rank here)"),
            None => "after init (connected to every other rank here): in a collective or a barrier"
                .into(),
        }
    } else if on_store == waiting.len() {
        format!(
            "in {} (connected to the store {}, not yet to every other rank)",
            shared.map_or("init", String::as_str),
            store.unwrap_or("")
        )
    } else {
        match shared {
            Some(c) => format!("in {c}"),
            None => "(no CPU used)".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::task::Task;

    fn watched(state: char, wchan: &str, cpu_ms: u64) -> Watched {
        Watched {
            task: Some(Task {
                state,
                wchan: Some(wchan.into()),
                syscall: None,
                cpu_ticks: 0,
                threads: 8,
            }),
            cpu_ms,
            sockets: Vec::new(),
            sockets_read: true,
        }
    }

    #[test]
    fn a_tick_or_two_on_a_helper_thread_is_still_a_wait() {
        for cpu in [0, 10, 20] {
            let w = watched('S', "futex_do_wait", cpu);
            assert_eq!(classify(Some(&w), 300).0, "waiting", "{cpu} ms");
        }
        let w = watched('S', "futex_do_wait", 40);
        assert_eq!(classify(Some(&w), 300).0, "running");
        let w = watched('S', "futex_do_wait", 25);
        assert_eq!(classify(Some(&w), 300).0, "idle");
    }

    #[test]
    fn the_bounds_grow_with_a_longer_sample() {
        let w = watched('S', "ep_poll", 40);
        assert_eq!(classify(Some(&w), 1000).0, "waiting");
        let w = watched('S', "ep_poll", 90);
        assert_eq!(classify(Some(&w), 1000).0, "idle");
        let w = watched('S', "ep_poll", 100);
        assert_eq!(classify(Some(&w), 1000).0, "running");
    }

    #[test]
    fn a_sleep_in_user_code_is_no_wait() {
        let w = watched('S', "hrtimer_nanosleep", 0);
        assert_eq!(classify(Some(&w), 300).0, "sleeping");
        let w = watched('T', "do_signal_stop", 0);
        assert_eq!(classify(Some(&w), 300).0, "stopped");
    }
}
