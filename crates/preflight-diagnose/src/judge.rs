//! The verdict on one job, from what it did over the watch window. A job
//! that moved bytes (through its ranks' read and write calls or their
//! sockets' queues) is progressing, however slowly: a collective that
//! completes moves its data. Only a job that stood still through the
//! whole window is judged held, and then a rank is named only on
//! evidence: every other rank of the job here waits (asleep on a lock, a
//! poll or a socket, or in a torch.distributed call as py-spy shows it,
//! whatever CPU it burns there) while it does something else (sleeps or
//! runs in its own code, blocks on a lock outside any collective, calls a
//! different collective from the others, is stopped, has exited), or it
//! is absent from a job whose every node is here. Where every rank waits
//! and none is absent, the rank they wait for is elsewhere, and nothing
//! is named. Each culprit says what to do, and whether the evidence is
//! against the node (drain it) or the job's own code (do not).

use std::collections::BTreeMap;

use super::find::Job;
use super::flight::Flight;
use super::observe::Watched;
use super::{Stacks, rank_list};
use preflight_facts::py_spy::PyFrame;
use preflight_facts::task::syscall_name;
use preflight_result::diagnosis::{Culprit, JobDiagnosis, RankState, StoreRead};

/// CPU over the window at or above which a rank that moved nothing and
/// waits in no collective counts as running: a tenth of a CPU, 30 ms at
/// least. CPU burnt inside a wait (a poll loop, NCCL's proxy) is no
/// progress: a rank py-spy finds in a collective waits whatever it burns.
fn busy_ms(window_ms: u64) -> u64 {
    30u64.max(window_ms / 10)
}

/// The kernel's name for where a thread sleeps, in an operator's words.
pub fn kernel_words(wchan: &str, call: &str) -> &'static str {
    let w = if wchan.is_empty() { call } else { wchan };
    if w.contains("nanosleep") {
        "asleep (time.sleep or the like)"
    } else if w.contains("futex") {
        "on a lock or a condition"
    } else if w.contains("poll") || w.contains("select") {
        "polling its connections"
    } else if [
        "sk_wait",
        "tcp_recv",
        "inet_csk",
        "recv",
        "accept",
        "wait_woken",
    ]
    .iter()
    .any(|x| w.contains(x))
    {
        "on a socket"
    } else if w.contains("unix_stream") {
        "on a local socket"
    } else if w.contains("pipe_read") || w == "read" {
        "reading a pipe or a file"
    } else if w.contains("do_wait") || w == "wait4" {
        "for a child process"
    } else if w.is_empty() {
        "in its own code"
    } else {
        "in the kernel"
    }
}

/// A GPU driver's wait, from where a task sleeps uninterruptibly.
fn gpu_driver_wait(wchan: &str) -> bool {
    ["nv", "uvm", "os_", "amdgpu", "kfd", "habana", "xe_", "i915"]
        .iter()
        .any(|p| wchan.starts_with(p))
}

/// A rank's state over the window and what it was doing, in words.
fn classify(w: Option<&Watched>, call: Option<&str>, window_ms: u64) -> (&'static str, String) {
    let Some(t) = w.and_then(|w| w.task.as_ref()) else {
        return ("exited", "exited (its process is gone)".into());
    };
    let w = w.expect("a task comes with its watch");
    let cpu = w.cpu_ms;
    let wchan = t.wchan.clone().unwrap_or_default();
    let sys = t.syscall.and_then(syscall_name).unwrap_or("");
    let collective = call.filter(|c| !c.contains(".py:"));
    let own_code = call.filter(|c| c.contains(".py:"));
    let most = |n: u32| w.looks > 0 && n * 2 > w.looks;
    match t.state {
        'Z' | 'X' => return ("exited", "exited, not yet reaped by its launcher".into()),
        'T' | 't' => {
            return ("stopped", "stopped (SIGSTOP, or held by a debugger)".into());
        }
        _ => {}
    }
    if w.moved_bytes() > 0 {
        return (
            "moving",
            format!(
                "moved {} in {window_ms} ms ({cpu} ms of CPU)",
                preflight_ground::values::format_bytes(w.moved_bytes())
            ),
        );
    }
    if t.state == 'D' {
        let whose = if gpu_driver_wait(&wchan) {
            "the GPU driver"
        } else {
            "a driver or a disk"
        };
        return (
            "in_kernel",
            format!("in an uninterruptible wait in the kernel ({whose}, `{wchan}`)"),
        );
    }
    if let Some(c) = collective {
        let spin = if cpu >= busy_ms(window_ms) {
            format!(", spinning ({cpu} ms of CPU)")
        } else {
            String::new()
        };
        return (
            "waiting",
            format!("waiting in {c}, no byte moved in {window_ms} ms{spin}"),
        );
    }
    let at = own_code.map(|c| format!(" at {c}")).unwrap_or_default();
    if most(w.sleeps) {
        return (
            "sleeping",
            format!("asleep in its own code (time.sleep or the like){at}"),
        );
    }
    // A sleep in a loop on a busy node: between its sleeps it waits for a
    // CPU without gaining a tick, which is no more running than sleeping.
    if w.sleeps > 0 && most(w.sleeps + w.ready) && cpu < busy_ms(window_ms) {
        return (
            "sleeping",
            format!(
                "asleep in its own code (time.sleep or the like){at}, waiting for a CPU between its sleeps ({cpu} ms of CPU in {window_ms} ms)"
            ),
        );
    }
    if cpu >= busy_ms(window_ms) || most(w.runs) {
        return (
            "running",
            format!("running its own code{at} ({cpu} ms of CPU in {window_ms} ms, no byte moved)"),
        );
    }
    if most(w.waits) {
        if own_code.is_some() {
            return (
                "blocked",
                format!(
                    "blocked {}{at}, in its own code and in no collective",
                    kernel_words(&wchan, sys)
                ),
            );
        }
        return (
            "waiting",
            format!(
                "waiting {}, no byte moved and no CPU used in {window_ms} ms",
                kernel_words(&wchan, sys)
            ),
        );
    }
    (
        "idle",
        format!(
            "idle {} ({cpu} ms of CPU in {window_ms} ms)",
            kernel_words(&wchan, sys)
        ),
    )
}

/// What to do about a rank named for its state, and whether the evidence
/// is against its node (`node`) or the job (`rank`).
pub(super) fn next_step(r: &RankState, has_stack: bool) -> (&'static str, String) {
    let stack = if has_stack {
        "read its stack (below)"
    } else {
        "read its stack (`py-spy dump --pid PID`, or run diagnose with py-spy installed)"
    };
    let stack = stack.replace("PID", &r.pid.to_string());
    match r.state.as_str() {
        "stopped" => (
            "rank",
            format!(
                "resume it (`kill -CONT {}`) or detach the debugger that holds it; the node is not at fault",
                r.pid
            ),
        ),
        "exited" => (
            "rank",
            "read its output (torchrun's --log_dir, or the job's log) for why it ended; drain the node only if the node killed it (the OOM killer or a GPU error in its kernel log)".into(),
        ),
        "in_kernel" if r.wchan.as_deref().is_some_and(gpu_driver_wait) => (
            "node",
            "drain the node: its GPU driver holds the rank in an uninterruptible wait (read the node's kernel log for an Xid)".into(),
        ),
        "in_kernel" => (
            "rank",
            "read the node's kernel log for the driver or file system it waits on; drain the node if that wait never ends".into(),
        ),
        _ => (
            "rank",
            format!("a fault in the job's own code, not the node's: {stack}; draining the node would not help"),
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
                        preflight_kinds::tcp_connect::classify(&e).name(),
                        e
                    ),
                };
                format!(
                    "{connect}; {}",
                    preflight_kinds::ping::quote(&peer.ip().to_string())
                )
            };
            let times = match retransmits {
                1 => "once".to_string(),
                n => format!("{n} times"),
            };
            format!(
                "the path from {} to {peer} drops the job's data: {} sent and never acknowledged, retransmitted {times}; {probe}",
                rank_list(&from),
                preflight_ground::values::format_bytes(unsent)
            )
        })
        .collect()
}

/// A connect to a peer the evidence points at.
const PROBE: std::time::Duration = std::time::Duration::from_secs(1);

/// The judgement of `job` from what each of its ranks did over the window.
pub fn judge(
    job: &Job,
    watched: &BTreeMap<u32, Watched>,
    stacks: &Stacks,
    store_read: Option<StoreRead>,
    flight: Flight,
    node: &str,
    window_ms: u64,
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
            let stack = stacks.get(&r.pid);
            let call = stack
                .and_then(|s| s.as_ref().ok())
                .and_then(|f| call(f))
                .or_else(|| flight.calls.get(&r.rank).cloned());
            let (state, doing) = classify(w, call.as_deref(), window_ms);
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
                moved_bytes: w.map_or(0, Watched::moved_bytes),
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
    let moving: Vec<&RankState> = ranks.iter().filter(|r| r.state == "moving").collect();
    let mut moved: Vec<String> = if moving.is_empty() {
        Vec::new()
    } else {
        let bytes: u64 = moving.iter().map(|r| r.moved_bytes).sum();
        let ids: Vec<u32> = moving.iter().map(|r| r.rank).collect();
        vec![format!(
            "{} moved {} through their connections and calls in {window_ms} ms",
            rank_list(&ids),
            preflight_ground::values::format_bytes(bytes)
        )]
    };
    moved.extend(flight.moved_words());
    let waiting: Vec<&RankState> = ranks.iter().filter(|r| r.state == "waiting").collect();
    let waiting_ranks: Vec<u32> = waiting.iter().map(|r| r.rank).collect();
    let phase = phase(&waiting, ranks.len() + missing.len(), store.as_deref());
    let paths = dropping_paths(job, watched, &ranks);
    // The odd ones out: in their own code, stopped, gone; and the ranks
    // whose collective is not the one the others wait in.
    // Each with its reason, and whether that reason stands alone (a
    // mismatch says what the others call) or is told against the others'
    // wait.
    let mut odd: Vec<(&RankState, String, bool)> = ranks
        .iter()
        .filter(|r| !matches!(r.state.as_str(), "waiting" | "idle" | "moving"))
        .map(|r| (r, r.doing.clone(), false))
        .collect();
    odd.extend(
        mismatched(&waiting)
            .into_iter()
            .map(|(r, why)| (r, why, true)),
    );
    // What the Flight Recorders add: to a rank already named, its
    // reason; else the rank, named for it.
    for (rank, why, mismatch) in &flight.odd {
        if let Some(o) = odd.iter_mut().find(|(r, _, _)| r.rank == *rank) {
            o.1.push_str(&format!("; {why}"));
        } else if let Some(r) = ranks.iter().find(|r| r.rank == *rank) {
            let doing = if *mismatch {
                why.clone()
            } else {
                format!("{}; {why}", r.doing)
            };
            odd.push((r, doing, *mismatch));
        }
    }
    let waiters: Vec<u32> = waiting_ranks
        .iter()
        .copied()
        .filter(|w| !odd.iter().any(|(r, _, _)| r.rank == *w))
        .collect();
    let mut culprits = Vec::new();
    let summary;
    let verdict;
    if !moved.is_empty() {
        let still: Vec<u32> = ranks
            .iter()
            .filter(|r| r.state != "moving" && !flight.moved.iter().any(|(m, _)| *m == r.rank))
            .map(|r| r.rank)
            .collect();
        summary = if still.is_empty() {
            format!("the job moves: {}", moved.join("; "))
        } else {
            format!(
                "the job moves: {}; {} moved nothing in that time",
                moved.join("; "),
                rank_list(&still)
            )
        };
        verdict = "progressing";
    } else if !waiters.is_empty() && (!odd.is_empty() || !missing.is_empty()) {
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
            rank_list(&waiters),
            if waiters.len() == 1 { "waits" } else { "wait" }
        );
        for (r, doing, alone) in &odd {
            let mut why = if *alone {
                doing.clone()
            } else {
                format!("{doing} while {others}")
            };
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
                    preflight_ground::values::format_bytes(r.unread_bytes)
                ));
            }
            let (evidence, next) = if *alone {
                (
                    "rank",
                    format!(
                        "a fault in the job's own code, not the node's: every rank must call the same collectives in the same order; fix the call{}",
                        own_frame(&r.stack)
                            .map(|f| format!(" at {f}"))
                            .unwrap_or_default()
                    ),
                )
            } else {
                next_step(r, !r.stack.is_empty())
            };
            culprits.push(Culprit {
                rank: r.rank,
                node: node.into(),
                pid: Some(r.pid),
                reason: why,
                evidence: evidence.into(),
                next_step: next,
                stack: r.stack.clone(),
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
                evidence: "rank".into(),
                next_step: "read the job's output for why it ended or never started (torchrun's --log_dir); drain the node only if the node killed it (the OOM killer or a GPU error in its kernel log)".into(),
                stack: Vec::new(),
            });
        }
        summary = others;
        verdict = "held";
    } else if waiting.is_empty() && missing.is_empty() {
        summary = if ranks.is_empty() {
            "no rank of it runs here".to_string()
        } else {
            format!(
                "no rank waits on another ({} here; nothing moved in {window_ms} ms)",
                ranks.len()
            )
        };
        verdict = "progressing";
    } else {
        summary = if elsewhere > 0 {
            format!(
                "{} {} {phase}: the rank they wait for is not on this node ({elsewhere} of {} ranks run elsewhere): run diagnose there, or across the job's nodes (--hosts, --slurm)",
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
                "{}: every rank here waits, and a path they send on drops their data (below): fix the path, or drain the node at its end",
                rank_list(&waiting_ranks)
            ),
        )
    } else {
        (verdict, summary)
    };
    JobDiagnosis {
        flight: flight.reads,
        torch: None,
        moved,
        expected_here: here,
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

/// Waiting ranks in a different collective from the rest: where py-spy
/// shows each waiting rank's call and they differ, those outside the
/// largest group (every group, where no group is the largest), each with
/// what the others call.
fn mismatched<'a>(waiting: &[&'a RankState]) -> Vec<(&'a RankState, String)> {
    let mut by_call: BTreeMap<&str, Vec<&'a RankState>> = BTreeMap::new();
    for r in waiting {
        if let Some(c) = r.call.as_deref().filter(|c| !c.contains(".py:")) {
            by_call.entry(c).or_default().push(r);
        }
    }
    if by_call.len() < 2 {
        return Vec::new();
    }
    let largest = by_call.values().map(Vec::len).max().unwrap_or(0);
    let leaders: Vec<&str> = by_call
        .iter()
        .filter(|(_, rs)| rs.len() == largest)
        .map(|(c, _)| *c)
        .collect();
    let majority = (leaders.len() == 1).then(|| leaders[0]);
    let mut out = Vec::new();
    for (c, rs) in &by_call {
        if Some(*c) == majority {
            continue;
        }
        let others: Vec<String> = by_call
            .iter()
            .filter(|(o, _)| o != &c)
            .map(|(o, rs)| {
                let ids: Vec<u32> = rs.iter().map(|r| r.rank).collect();
                format!(
                    "{} {} {o}",
                    rank_list(&ids),
                    if ids.len() == 1 { "calls" } else { "call" }
                )
            })
            .collect();
        for r in rs {
            let at = own_frame(&r.stack)
                .map(|f| format!(" (at {f})"))
                .unwrap_or_default();
            out.push((
                *r,
                format!(
                    "a mismatched collective: it calls {c}{at} while {}",
                    others.join(" and ")
                ),
            ));
        }
    }
    out
}

/// The innermost frame of the job's own code in a stack as the report
/// keeps it (`fn (file:line)`): `job.py:93`.
fn own_frame(stack: &[String]) -> Option<String> {
    stack
        .iter()
        .filter_map(|f| f.rsplit_once(" (")?.1.strip_suffix(')'))
        .find(|at| !at.contains("torch/") && !at.contains("-packages/"))
        .map(String::from)
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
    use preflight_facts::task::Task;

    fn watched(state: char, wchan: &str, cpu_ms: u64, looks: [u32; 3], moved: u64) -> Watched {
        Watched {
            task: Some(Task {
                state,
                wchan: Some(wchan.into()),
                syscall: None,
                cpu_ticks: 0,
                threads: 8,
            }),
            cpu_ms,
            io_bytes: Some(moved),
            looks: looks.iter().sum(),
            waits: looks[0],
            sleeps: looks[1],
            runs: looks[2],
            sockets_read: true,
            ..Watched::default()
        }
    }

    #[test]
    fn bytes_moved_are_progress_and_cpu_in_a_wait_is_not() {
        let w = watched('S', "futex_do_wait", 0, [20, 0, 0], 4096);
        assert_eq!(classify(Some(&w), None, 2000).0, "moving");
        let w = watched('S', "futex_do_wait", 10, [20, 0, 0], 0);
        assert_eq!(classify(Some(&w), None, 2000).0, "waiting");
        // Spinning in a collective, nothing moved: waiting all the same.
        let w = watched('R', "", 1900, [0, 0, 20], 0);
        assert_eq!(classify(Some(&w), Some("all_reduce"), 2000).0, "waiting");
        // The same spin in its own code holds the others up.
        assert_eq!(
            classify(Some(&w), Some("job.py:12 in main"), 2000).0,
            "running"
        );
        assert_eq!(classify(Some(&w), None, 2000).0, "running");
    }

    #[test]
    fn a_sleep_or_a_lock_in_its_own_code_is_no_wait_in_a_collective() {
        let w = watched('S', "hrtimer_nanosleep", 0, [2, 18, 0], 0);
        assert_eq!(classify(Some(&w), None, 2000).0, "sleeping");
        let w = watched('S', "futex_do_wait", 0, [20, 0, 0], 0);
        let (state, doing) = classify(Some(&w), Some("job.py:40 in hold"), 2000);
        assert_eq!(state, "blocked");
        assert!(
            doing.contains("on a lock") && !doing.contains("futex"),
            "{doing}"
        );
        let w = watched('T', "do_signal_stop", 0, [0, 0, 0], 0);
        assert_eq!(classify(Some(&w), None, 2000).0, "stopped");
        let w = watched('D', "nv_wait_for_completion", 0, [0, 0, 0], 0);
        let (state, doing) = classify(Some(&w), None, 2000);
        assert_eq!(state, "in_kernel");
        assert!(doing.contains("GPU driver"), "{doing}");
    }

    /// CI's case: a rank sleeping 0.2 s at a time on a node of busy loops
    /// and ten diagnoses at once. Between its sleeps it sits runnable
    /// without a CPU; the looks split between sleeping and waiting for a
    /// CPU, neither half alone, and it gained no CPU. It is asleep in its
    /// own code, not idle; a rank that gains CPU as it runs is running.
    #[test]
    fn a_sleep_loop_on_a_busy_node_is_asleep_not_idle() {
        let mut w = watched('R', "", 0, [2, 10, 0], 0);
        w.ready = 11;
        w.looks += 11;
        let (state, doing) = classify(Some(&w), None, 2300);
        assert_eq!(state, "sleeping", "{doing}");
        assert!(doing.contains("waiting for a CPU"), "{doing}");
        // Without the sleeps, runnable and never on a CPU is not a sleep.
        let mut starved = watched('R', "", 0, [2, 0, 0], 0);
        starved.ready = 21;
        starved.looks += 21;
        assert_ne!(classify(Some(&starved), None, 2300).0, "sleeping");
        // A sleep loop that burns a CPU between its sleeps is running.
        let mut busy = watched('R', "", 2000, [0, 10, 0], 0);
        busy.ready = 11;
        busy.looks += 11;
        assert_eq!(classify(Some(&busy), None, 2300).0, "running");
    }

    #[test]
    fn kernel_names_are_put_in_words() {
        assert_eq!(
            kernel_words("futex_do_wait", ""),
            "on a lock or a condition"
        );
        assert_eq!(kernel_words("", "epoll_wait"), "polling its connections");
        assert_eq!(
            kernel_words("hrtimer_nanosleep", ""),
            "asleep (time.sleep or the like)"
        );
        assert_eq!(kernel_words("sk_wait_data", ""), "on a socket");
    }

    fn rank(rank: u32, call: &str) -> RankState {
        RankState {
            rank,
            pid: 100 + rank,
            state: "waiting".into(),
            doing: String::new(),
            wchan: None,
            syscall: None,
            cpu_ms: 0,
            moved_bytes: 0,
            store_connected: None,
            peer_connections: 0,
            unread_bytes: 0,
            unsent_bytes: 0,
            call: Some(call.into()),
            stack: Vec::new(),
            in_store: None,
            stack_error: None,
        }
    }

    #[test]
    fn the_odd_collective_is_named_and_a_tie_names_both_sides() {
        let rs = [
            rank(0, "all_reduce"),
            rank(1, "all_gather"),
            rank(2, "all_reduce"),
            rank(3, "all_reduce"),
        ];
        let refs: Vec<&RankState> = rs.iter().collect();
        let odd = mismatched(&refs);
        assert_eq!(odd.len(), 1);
        assert_eq!(odd[0].0.rank, 1);
        assert!(
            odd[0]
                .1
                .contains("calls all_gather while ranks 0,2-3 call all_reduce")
                || odd[0].1.contains("all_gather while ranks"),
            "{}",
            odd[0].1
        );
        let tie: Vec<&RankState> = rs[..2].iter().collect();
        assert_eq!(mismatched(&tie).len(), 2);
        let same: Vec<&RankState> = [&rs[0], &rs[2]].into_iter().collect();
        assert!(mismatched(&same).is_empty());
    }
}
