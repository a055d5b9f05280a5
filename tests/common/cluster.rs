//! Cluster-stage helpers shared by the loopback and namespace tests: start
//! ranks as real processes, collect every rank's exit code and report with
//! a bound on how long each may take, and give namespace hosts their own
//! hostname and /etc/hosts (a UTS and a mount namespace inside the network
//! namespace), wrapping the netns harness rather than changing it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::netns::Cluster;

pub use super::BIN;

pub fn checks() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("checks/cluster.yaml")
        .display()
        .to_string()
}

/// `run` with only the cluster checks, JSON out.
pub fn run_args(timeout: &str) -> Vec<String> {
    [
        "run",
        "--no-shipped",
        "--checks",
        &checks(),
        "--timeout",
        timeout,
        "--format",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub struct Outcome {
    pub label: String,
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Outcome {
    /// The rank's JSON report, read with the product's own types.
    pub fn report(&self) -> crate::common::Report {
        crate::common::report(&self.stdout, &format!("{}: {}", self.label, self.stderr))
    }

    /// The status and message of check `id`, from the merged checks list.
    pub fn message(&self, id: &str) -> String {
        let c = crate::common::result(&self.report(), id).clone();
        format!("{} {}", c.status.name(), c.message)
    }

    /// The hint of check `id`, from the merged checks list.
    pub fn hint(&self, id: &str) -> String {
        let report = self.report();
        crate::common::result(&report, id)
            .hint
            .clone()
            .unwrap_or_else(|| panic!("{}: no hint for {id} in {report}", self.label))
    }

    pub fn status(&self, id: &str) -> String {
        crate::common::status(&self.report(), id).to_string()
    }
}

/// A started rank; killed at drop if it is still running.
pub struct Proc {
    pub label: String,
    pub pid: u32,
    started: Instant,
    done: bool,
    rx: mpsc::Receiver<std::io::Result<std::process::Output>>,
}

impl Proc {
    pub fn new(label: &str, child: Child) -> Proc {
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        Proc {
            label: label.to_string(),
            pid,
            started: Instant::now(),
            done: false,
            rx,
        }
    }

    /// When it was started: where its outcome's `elapsed` counts from.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Waits at most `limit` from its start; a process still running then
    /// is a test failure (it waited without a deadline).
    pub fn finish(mut self, limit: Duration) -> Outcome {
        let left = limit.saturating_sub(self.started.elapsed());
        let result = self.rx.recv_timeout(left);
        // Reaped: its pid may belong to another process from now on.
        self.done = result.is_ok();
        match result {
            Ok(Ok(out)) => {
                // The fault matrix's time column (docs/faults.md) comes
                // from these lines: `cargo test -- --nocapture`.
                println!(
                    "{}: exit {:?} after {:.2?}",
                    self.label,
                    out.status.code(),
                    self.started.elapsed()
                );
                Outcome {
                    label: self.label.clone(),
                    code: out.status.code().unwrap_or(-1),
                    stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                    stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                    elapsed: self.started.elapsed(),
                }
            }
            Ok(Err(e)) => panic!("{}: {e}", self.label),
            Err(_) => panic!(
                "{} still running after {limit:?}: something waited without a deadline",
                self.label
            ),
        }
    }

    /// SIGKILL, while it is still running (not yet reaped).
    pub fn kill(&self) {
        if self.done {
            return;
        }
        let _ = Command::new("kill")
            .args(["-9", &self.pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.done && self.rx.try_recv().is_err() {
            self.kill();
        }
    }
}

/// A rank on loopback with exactly `env` (plus PATH).
pub fn local(label: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
    local_under(&[], label, args, env)
}

/// A rank on loopback started through `wrapper` (a command and its
/// arguments, e.g. `unshare --pid --fork`), which then runs preflight.
pub fn local_under(wrapper: &[&str], label: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
    let mut c = match wrapper.split_first() {
        Some((cmd, rest)) => {
            let mut c = Command::new(cmd);
            c.args(rest).arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        // The human report in UTF-8, as on an operator's terminal.
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // tools/coverage.sh: where an instrumented build writes its counters.
    if let Some(v) = std::env::var_os("LLVM_PROFILE_FILE") {
        c.env("LLVM_PROFILE_FILE", v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    Proc::new(label, c.spawn().expect("start preflight"))
}

pub fn free_port() -> u16 {
    crate::common::unused_port("127.0.0.1")
}

/// Per-host /etc/hosts files: host i is `h{i}` at its namespace address,
/// unless `override_addr` says otherwise for one host.
pub struct HostFiles {
    _dir: tempfile::TempDir,
    pub paths: Vec<PathBuf>,
}

pub fn host_files(cluster: &Cluster, override_addr: Option<(usize, &str)>) -> HostFiles {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut paths = Vec::new();
    for me in 0..cluster.hosts.len() {
        let mut text = String::from("127.0.0.1 localhost\n");
        for h in 0..cluster.hosts.len() {
            let addr = match override_addr {
                Some((o, a)) if o == h && h == me => a.to_string(),
                _ => cluster.addr(h),
            };
            text.push_str(&format!("{addr} h{h}\n"));
        }
        let p = dir.path().join(format!("hosts{me}"));
        std::fs::write(&p, text).expect("write hosts");
        paths.push(p);
    }
    HostFiles { _dir: dir, paths }
}

/// One /etc/hosts for every host: `names` gives each named host's name
/// (its address is the host's own), the rest are left out.
pub fn host_files_named(cluster: &Cluster, names: &[(usize, &str)]) -> HostFiles {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut text = String::from("127.0.0.1 localhost\n");
    for (h, name) in names {
        text.push_str(&format!("{} {name}\n", cluster.hosts[*h].addr));
    }
    let paths = (0..cluster.hosts.len())
        .map(|me| {
            let p = dir.path().join(format!("hosts{me}"));
            std::fs::write(&p, &text).expect("write hosts");
            p
        })
        .collect();
    HostFiles { _dir: dir, paths }
}

/// preflight on namespace host `host`, with hostname `h{host}` and its own
/// /etc/hosts, as a real process with exactly `env` (and a UTF-8 LANG
/// unless `env` names one, for the human report).
pub fn on_host(
    cluster: &Cluster,
    files: &HostFiles,
    host: usize,
    args: &[String],
    env: &[(&str, &str)],
) -> Proc {
    let mut argv = vec![BIN.to_string()];
    argv.extend(args.iter().cloned());
    on_host_cmd(cluster, files, host, &argv, env)
}

/// Any command on namespace host `host` (a launcher that starts
/// preflight, `setpriv` to run it as another user), with hostname
/// `h{host}`, its own /etc/hosts and exactly `env`.
pub fn on_host_cmd(
    cluster: &Cluster,
    files: &HostFiles,
    host: usize,
    argv: &[String],
    env: &[(&str, &str)],
) -> Proc {
    on_host_named(cluster, files, host, &format!("h{host}"), argv, env)
}

/// As `on_host_cmd`, with the host's name given (a pod's: its own name).
pub fn on_host_named(
    cluster: &Cluster,
    files: &HostFiles,
    host: usize,
    hostname: &str,
    argv: &[String],
    env: &[(&str, &str)],
) -> Proc {
    let script = "hostname \"$1\" && mount --bind \"$2\" /etc/hosts && shift 2 && exec \"$@\"";
    let hosts = files.paths[host].display().to_string();
    let mut all: Vec<&str> = vec![
        "--uts", "--mount", "sh", "-c", script, "sh", hostname, &hosts,
    ];
    all.extend(argv.iter().map(String::as_str));
    let mut env = env.to_vec();
    if !env.iter().any(|(k, _)| *k == "LANG") {
        env.push(("LANG", "C.UTF-8"));
    }
    let child = cluster.spawn_preflight(host, "unshare", &all, &env);
    Proc::new(hostname, child)
}

/// The launcher's variables for rank `rank` of `world`, master on host 0.
pub fn launcher_env(cluster: &Cluster, rank: u32, world: u32) -> Vec<(String, String)> {
    vec![
        ("RANK".into(), rank.to_string()),
        ("WORLD_SIZE".into(), world.to_string()),
        ("LOCAL_RANK".into(), "0".into()),
        ("LOCAL_WORLD_SIZE".into(), "1".into()),
        ("MASTER_ADDR".into(), cluster.addr(0)),
        ("MASTER_PORT".into(), "29500".into()),
        (
            "SLURM_JOB_NODELIST".into(),
            format!("h[0-{}]", cluster.hosts.len() - 1),
        ),
        (
            "PREFLIGHT_TOKEN".into(),
            "649ed7307185c7eed188c8184b9e00a0".into(),
        ),
        ("GLOO_SOCKET_IFNAME".into(), "eth0".into()),
    ]
}

pub fn pairs(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect()
}

/// Rows of a process's view of /proc/net/tcp and tcp6: (local port,
/// remote port, state, tx_queue, inode).
fn tcp_rows(pid: u32) -> Vec<(u16, u16, String, u64, String)> {
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 {
                continue;
            }
            let port = |a: &str| {
                a.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                    .unwrap_or(0)
            };
            let tx = f[4]
                .split(':')
                .next()
                .and_then(|q| u64::from_str_radix(q, 16).ok())
                .unwrap_or(0);
            out.push((
                port(f[1]),
                port(f[2]),
                f[3].to_string(),
                tx,
                f[9].to_string(),
            ));
        }
    }
    out
}

/// Waits until some socket listens on `port` in `pid`'s network namespace:
/// the event a test waits for instead of sleeping.
pub fn wait_listening(pid: u32, port: u16) {
    let start = Instant::now();
    while !tcp_rows(pid)
        .iter()
        .any(|(local, _, state, _, _)| *local == port && state == "0A")
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "nothing listens on port {port} after 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The inodes of the sockets process `pid` holds.
pub fn socket_inodes(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    l.strip_prefix("socket:[")
                        .and_then(|x| x.strip_suffix(']'))
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until process `pid` holds an established connection to `port`
/// with nothing left to send, and keeps it so for ten looks in a row: a
/// rank that has checked in and waits for the verdict.
pub fn wait_checked_in(pid: u32, port: u16) {
    let inodes = || socket_inodes(pid);
    let settled = || {
        let mine = inodes();
        tcp_rows(pid).iter().any(|(_, remote, state, tx, inode)| {
            *remote == port && state == "01" && *tx == 0 && mine.contains(inode)
        })
    };
    let start = Instant::now();
    let mut quiet = 0;
    while quiet < 10 {
        quiet = if settled() { quiet + 1 } else { 0 };
        // A process that has ended will not settle: say so at once (its
        // report says why), rather than after 30 s of looking.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ended = state
            .rsplit_once(") ")
            .is_none_or(|(_, rest)| rest.starts_with('Z'));
        assert!(
            !ended,
            "pid {pid} ended before it settled on a connection to port {port}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "pid {pid} never settled on a connection to port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` holds an established connection on which neither
/// end is `master_port`: the collective stage's mesh, so the rank is past
/// the rendezvous and inside the stage.
pub fn in_mesh(pid: u32, master_port: u16) -> bool {
    let mine = socket_inodes(pid);
    tcp_rows(pid)
        .iter()
        .any(|(local, remote, state, _, inode)| {
            state == "01" && *local != master_port && *remote != master_port && mine.contains(inode)
        })
}

/// A fault-matrix row's promise (docs/faults.md): every rank's verdict
/// came within `bound` of its start: generous on a loaded machine, yet far
/// below the test's own deadline, so a promise broken (a verdict at the
/// deadline instead of at once) fails.
pub fn verdicts_within(out: &[Outcome], bound: Duration) {
    for o in out {
        assert!(
            o.elapsed < bound,
            "{}: verdict after {:?}, promised within {bound:?}",
            o.label,
            o.elapsed
        );
    }
}
