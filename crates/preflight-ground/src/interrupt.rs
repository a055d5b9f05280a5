//! SIGTERM, SIGINT and SIGHUP: what Slurm sends a prolog at its limit,
//! what Kubernetes sends a pod, what Ctrl-C and a closed terminal send.
//!
//! The first of them marks the run interrupted: every stage watches for it
//! (`wait`) and ends at once, keeping what it had found, and the command
//! writes a report whose verdict is `incomplete` (exit 3) naming the signal
//! and the phase. Every process this one started, and theirs, is killed
//! (`kill_descendants`): this process is their subreaper, so even one that
//! left its parent comes back to be killed. Should the orderly end not be
//! over within `HARD_LIMIT`, or a second signal come, the process kills its
//! descendants and exits at once.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// From the first signal to the process's end, whatever the stages do.
const HARD_LIMIT: Duration = Duration::from_millis(1800);

/// The exit code when the orderly end did not finish in time: the run is
/// `incomplete`, as its report would have said.
const INCOMPLETE: i32 = 3;

/// A signal that cut the run short, and where the run was then.
#[derive(Debug, Clone)]
pub struct Interruption {
    /// `SIGTERM`, `SIGINT` or `SIGHUP`.
    pub signal: &'static str,
    /// The phase the process was in (`enter`).
    pub phase: String,
}

struct State {
    tx: watch::Sender<Option<Interruption>>,
    phase: Mutex<String>,
}

static STATE: OnceLock<State> = OnceLock::new();

fn state() -> &'static State {
    STATE.get_or_init(|| State {
        tx: watch::Sender::new(None),
        phase: Mutex::new("startup".into()),
    })
}

/// Takes over the three signals for the rest of the process's life, and
/// makes this process the subreaper of its descendants. Returns once the
/// handlers are in place, so that no signal after it is missed; a process
/// that calls it twice keeps the first watcher.
pub fn install() -> std::io::Result<()> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    // Best effort: without it, a grandchild whose parent died first is
    // init's, out of reach; the rest still works.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("preflight-signals".into())
        .spawn(move || watch_signals(ready_tx))?;
    ready_rx
        .recv()
        .map_err(|_| std::io::Error::other("the signal watcher did not start"))??;
    let _ = INSTALLED.set(());
    Ok(())
}

fn watch_signals(ready: std::sync::mpsc::Sender<std::io::Result<()>>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    runtime.block_on(async move {
        let streams = (|| {
            Ok::<_, std::io::Error>((
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
                signal(SignalKind::hangup())?,
            ))
        })();
        let (mut term, mut int, mut hup) = match streams {
            Ok(s) => s,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        loop {
            let sig = tokio::select! {
                _ = term.recv() => Signal::SIGTERM,
                _ = int.recv() => Signal::SIGINT,
                _ = hup.recv() => Signal::SIGHUP,
            };
            arrived(sig);
        }
    });
}

fn arrived(sig: Signal) {
    let st = state();
    if st.tx.borrow().is_some() {
        kill_descendants();
        eprintln!("preflight: {sig} again: exiting now, without a report");
        std::process::exit(128 + sig as i32);
    }
    let phase = st.phase.lock().map(|p| p.clone()).unwrap_or_default();
    st.tx.send_replace(Some(Interruption {
        signal: sig.as_str(),
        phase,
    }));
    let _ = std::thread::Builder::new()
        .name("preflight-hard-limit".into())
        .spawn(move || {
            std::thread::sleep(HARD_LIMIT);
            kill_descendants();
            eprintln!(
                "preflight: interrupted by {sig}, and the report could not be finished within {} ms: exiting without it",
                HARD_LIMIT.as_millis()
            );
            std::process::exit(INCOMPLETE);
        });
}

/// Marks the phase the process is entering, for the report of an
/// interruption: `checks`, `rendezvous`, `collective (nccl)`, ...
pub fn enter(phase: impl Into<String>) {
    if let Ok(mut p) = state().phase.lock() {
        *p = phase.into();
    }
}

/// The interruption, once a signal has come.
pub fn get() -> Option<Interruption> {
    state().tx.borrow().clone()
}

/// Completes when a signal comes (at once if one has); never, in a process
/// that did not `install`.
pub async fn wait() -> Interruption {
    let mut rx = state().tx.subscribe();
    let got = rx
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|v| v.clone());
    match got {
        Some(i) => i,
        // The sender lives in a static: it is never dropped.
        None => std::future::pending().await,
    }
}

/// SIGKILL to every living descendant of this process (children first
/// found, then their children), in rounds until none is left: the orphans
/// of a killed child come back to this process, their subreaper.
pub fn kill_descendants() {
    let me = std::process::id();
    for _ in 0..20 {
        let table = process_table();
        let victims = descendants(me, &table);
        if victims.is_empty() {
            return;
        }
        for pid in victims {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One line of /proc/PID/stat: the process's parent and whether it is a
/// zombie (dead already, only waiting to be reaped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pid: u32,
    ppid: u32,
    zombie: bool,
}

fn process_table() -> Vec<Entry> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            parse_stat(pid, &text)
        })
        .collect()
}

/// `PID (COMM) STATE PPID ...`; COMM may hold spaces and parentheses, so
/// the fields start after the last `)`.
pub fn parse_stat(pid: u32, text: &str) -> Option<Entry> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some(Entry {
        pid,
        ppid,
        zombie: state == "Z" || state == "X",
    })
}

/// The living processes below `root` in the table.
fn descendants(root: u32, table: &[Entry]) -> Vec<u32> {
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for e in table.iter().filter(|e| e.ppid == parent && e.pid != root) {
            if !found.contains(&e.pid) && !frontier.contains(&e.pid) {
                frontier.push(e.pid);
                if !e.zombie {
                    found.push(e.pid);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let e = parse_stat(42, "42 (a) b (c)) S 7 42 42 0 -1").unwrap();
        assert_eq!(
            e,
            Entry {
                pid: 42,
                ppid: 7,
                zombie: false
            }
        );
        assert!(parse_stat(9, "9 (x) Z 1 0").unwrap().zombie);
        assert_eq!(parse_stat(9, "9 (x"), None);
        assert_eq!(parse_stat(9, "9 (x) S notanumber"), None);
    }

    #[test]
    fn descendants_are_found_through_every_generation_and_zombies_left_out() {
        let e = |pid, ppid, zombie| Entry { pid, ppid, zombie };
        let table = [
            e(1, 0, false),
            e(10, 1, false),
            e(11, 10, false),
            e(12, 11, false),
            e(13, 10, true),
            e(14, 13, false),
            e(20, 1, false),
        ];
        let mut d = descendants(10, &table);
        d.sort();
        assert_eq!(d, vec![11, 12, 14]);
        assert!(descendants(12, &table).is_empty());
    }

    #[test]
    fn the_phase_is_kept_for_the_report() {
        enter("rendezvous");
        assert_eq!(state().phase.lock().unwrap().as_str(), "rendezvous");
        assert!(get().is_none());
    }
}
