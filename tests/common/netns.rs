//! Real test hosts: network namespaces on a private bridge, one /24 per
//! test. Each `Cluster` owns its bridge, namespaces, veth pairs, firewall
//! rules (which live in the namespaces) and the processes it started, and
//! removes all of them in `Drop`, also when the test panics.
//!
//! When the machine cannot do this (not root, no iproute2), `Cluster::new`
//! prints why and returns `None`; with PREFLIGHT_REQUIRE_NETNS=1 (CI) it
//! panics instead, so CI never silently skips these tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The PATH every command in a namespace gets: tests clear the environment.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub struct Host {
    /// The namespace's name.
    pub ns: String,
    pub addr: Ipv4Addr,
    /// The interface inside the namespace.
    pub iface: &'static str,
}

pub struct Cluster {
    pub bridge: String,
    /// The third octet of 10.231.X.0/24.
    pub subnet: u8,
    pub hosts: Vec<Host>,
    children: Mutex<Vec<Child>>,
    lock_file: String,
}

/// Why this machine cannot build namespaces, if it cannot.
fn unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root: network namespaces need root".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => {}
        _ => return Some("`ip` (iproute2) is not installed".into()),
    }
    // Root in a container may still lack CAP_NET_ADMIN: try one namespace.
    // Tests of one binary probe in parallel threads: one name each.
    static PROBES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = format!("ptprobe{}x{n}", std::process::id());
    let added = Command::new("ip")
        .args(["netns", "add", &probe])
        .output()
        .ok()?;
    if !added.status.success() {
        return Some(format!(
            "cannot create a network namespace: {}",
            String::from_utf8_lossy(&added.stderr).trim()
        ));
    }
    let _ = Command::new("ip").args(["netns", "del", &probe]).output();
    None
}

/// Returns `None` after printing the reason, or panics when CI requires
/// the namespace tests to run.
pub fn skip_or_panic(reason: &str) {
    super::skip::skip(reason);
}

fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .env("PATH", PATH)
        .output()
        .expect("run ip")
}

fn must(args: &[&str]) {
    let out = ip(args);
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// A 10.231.X.0/24 that no route or address on this machine uses and no
/// other live test process holds (a lock file with its pid).
fn claim_subnet() -> (u8, String) {
    let pid = std::process::id();
    let used = String::from_utf8_lossy(&ip(&["-4", "route", "show", "table", "all"]).stdout)
        .to_string()
        + &String::from_utf8_lossy(&ip(&["-4", "addr"]).stdout);
    let start = (pid.wrapping_mul(7) + COUNTER.fetch_add(1, Ordering::SeqCst) * 13) % 250;
    for step in 0..250 {
        let x = ((start + step) % 250 + 1) as u8;
        if used.contains(&format!("10.231.{x}.")) {
            continue;
        }
        let lock = format!("/tmp/preflight-netns-10.231.{x}.lock");
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
            {
                Ok(_) => {
                    std::fs::write(&lock, pid.to_string()).expect("write lock");
                    return (x, lock);
                }
                Err(_) => {
                    // A lock left by a test process that died is stale.
                    let owner = std::fs::read_to_string(&lock)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    match owner {
                        Some(p) if pid_alive(p) => break,
                        _ => {
                            let _ = std::fs::remove_file(&lock);
                        }
                    }
                }
            }
        }
    }
    panic!("no free 10.231.X.0/24 for a test network");
}

impl Cluster {
    /// A bridge and `n` namespaces, host i at 10.231.X.(i+1) on its eth0,
    /// the bridge at 10.231.X.254. `None` when the machine cannot.
    pub fn new(n: usize) -> Option<Cluster> {
        if let Some(reason) = unavailable() {
            skip_or_panic(&reason);
            return None;
        }
        let (subnet, lock_file) = claim_subnet();
        let tag = format!(
            "{:x}{:x}",
            std::process::id() & 0xffff,
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let mut cluster = Cluster {
            bridge: format!("pfb{tag}"),
            subnet,
            hosts: Vec::new(),
            children: Mutex::new(Vec::new()),
            lock_file,
        };
        // From here on, Drop cleans up whatever was created.
        must(&["link", "add", &cluster.bridge, "type", "bridge"]);
        must(&[
            "addr",
            "add",
            &format!("10.231.{subnet}.254/24"),
            "dev",
            &cluster.bridge,
        ]);
        must(&["link", "set", &cluster.bridge, "up"]);
        for i in 0..n {
            let ns = format!("pfn{tag}-{i}");
            let veth = format!("pfv{tag}{i}");
            let addr = Ipv4Addr::new(10, 231, subnet, i as u8 + 1);
            must(&["netns", "add", &ns]);
            cluster.hosts.push(Host {
                ns: ns.clone(),
                addr,
                iface: "eth0",
            });
            must(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            must(&["link", "set", &veth, "master", &cluster.bridge, "up"]);
            must(&["-n", &ns, "link", "set", "lo", "up"]);
            must(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ]);
            must(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        Some(cluster)
    }

    pub fn addr(&self, host: usize) -> String {
        self.hosts[host].addr.to_string()
    }

    /// Host `host`'s IPv6 address, once `add_ipv6` has run.
    pub fn addr6(&self, host: usize) -> String {
        format!("fd00:231:{:x}::{:x}", self.subnet, host + 1)
    }

    /// Gives every host an IPv6 address in fd00:231:X::/64 on its eth0
    /// (no duplicate detection, so it is usable at once).
    pub fn add_ipv6(&self) {
        for h in 0..self.hosts.len() {
            let addr = format!("{}/64", self.addr6(h));
            self.must(
                h,
                &["ip", "-6", "addr", "add", &addr, "dev", "eth0", "nodad"],
            );
        }
    }

    /// An address in this test's subnet that no host has.
    pub fn unused_addr(&self) -> String {
        format!("10.231.{}.200", self.subnet)
    }

    fn in_ns(&self, host: usize, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[host].ns])
            .args(args)
            .env_clear()
            .env("PATH", PATH);
        c
    }

    /// Runs a command inside host `host`'s namespace.
    pub fn exec(&self, host: usize, args: &[&str]) -> Output {
        self.in_ns(host, args).output().expect("ip netns exec")
    }

    /// Like `exec`, asserting success.
    pub fn must(&self, host: usize, args: &[&str]) -> String {
        let out = self.exec(host, args);
        assert!(
            out.status.success(),
            "in {}: {}: {}",
            self.hosts[host].ns,
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// An iptables rule inside the namespace, e.g. `["-A", "INPUT", ...]`.
    pub fn iptables(&self, host: usize, args: &[&str]) {
        let mut all = vec!["iptables", "-w"];
        all.extend_from_slice(args);
        self.must(host, &all);
    }

    /// An nft command inside the namespace, e.g. `["add", "table", "inet", "t"]`.
    pub fn nft(&self, host: usize, args: &[&str]) {
        let mut all = vec!["nft"];
        all.extend_from_slice(args);
        self.must(host, &all);
    }

    /// A rule (`tcp dport 29500 drop`, ...) in the base chain for `hook`
    /// (`input`, `output`) of table `inet f`, both made when missing.
    pub fn nft_rule(&self, host: usize, hook: &str, rule: &[&str]) {
        let chain = format!("{{ type filter hook {hook} priority 0; policy accept; }}");
        self.nft(host, &["add", "table", "inet", "f"]);
        self.nft(host, &["add", "chain", "inet", "f", hook, &chain]);
        let mut all = vec!["add", "rule", "inet", "f", hook];
        all.extend_from_slice(rule);
        self.nft(host, &all);
    }

    /// The bridge between the hosts drops TCP from host `from` to host
    /// `to` for ports `dports` (`29450-29459`): a filter on the path, on
    /// neither host, as a switch ACL or a router's would be. The rule
    /// names only this cluster's veths, in a table of its own (deleted at
    /// teardown).
    pub fn filter_between(&self, from: usize, to: usize, dports: &str) {
        let table = self.bridge_table();
        let tag = self.bridge.trim_start_matches("pfb");
        let (iif, oif) = (format!("pfv{tag}{from}"), format!("pfv{tag}{to}"));
        for args in [
            vec!["add", "table", "bridge", table.as_str()],
            vec![
                "add",
                "chain",
                "bridge",
                &table,
                "forward",
                "{ type filter hook forward priority 0; policy accept; }",
            ],
            vec![
                "add", "rule", "bridge", &table, "forward", "iifname", &iif, "oifname", &oif,
                "tcp", "dport", dports, "drop",
            ],
        ] {
            let o = Command::new("nft")
                .args(&args)
                .env("PATH", PATH)
                .output()
                .expect("nft");
            assert!(
                o.status.success(),
                "nft {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }

    fn bridge_table(&self) -> String {
        format!("pft{}", self.bridge.trim_start_matches("pfb"))
    }

    /// Starts a long-running command in the namespace; it is killed (by
    /// PID) at teardown. Waits until it prints a first line, if `ready`.
    pub fn spawn(&self, host: usize, args: &[&str], ready: bool) -> u32 {
        let mut child = self
            .in_ns(host, args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn in namespace");
        let pid = child.id();
        let stdout = child.stdout.take();
        self.children.lock().unwrap().push(child);
        if ready {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                if let Some(out) = stdout {
                    let mut reader = BufReader::new(out);
                    let _ = reader.read_line(&mut line);
                    let _ = tx.send(line);
                    // Keep draining so the process never blocks on a pipe.
                    let mut sink = String::new();
                    while reader.read_line(&mut sink).unwrap_or(0) > 0 {
                        sink.clear();
                    }
                }
            });
            rx.recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("{} did not get ready", args.join(" ")));
        }
        pid
    }

    /// A TCP listener on `port` in the namespace, started as
    /// `python3 -c CODE EXTRA...` so that EXTRA shows in its command line.
    pub fn listen(&self, host: usize, port: u16, extra: &[&str]) -> u32 {
        let code = format!(
            "import socket,sys,time\n\
             s=socket.socket()\n\
             s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('0.0.0.0',{port}))\n\
             s.listen(16)\n\
             print('ready',flush=True)\n\
             while True:\n\
             \x20 c,_=s.accept()\n\
             \x20 c.close()\n"
        );
        let mut args = vec!["python3", "-c", code.as_str()];
        args.extend_from_slice(extra);
        self.spawn(host, &args, true)
    }

    /// Kills one process this cluster started.
    pub fn kill(&self, pid: u32) {
        let mut children = self.children.lock().unwrap();
        if let Some(i) = children.iter().position(|c| c.id() == pid) {
            let mut c = children.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs the preflight binary inside the namespace with exactly `env`
    /// (plus PATH) and returns its exit code and JSON report.
    pub fn preflight(
        &self,
        host: usize,
        binary: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (i32, super::Report) {
        let mut c = self.in_ns(host, &[binary]);
        c.args(args).args(["--format", "json"]);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().expect("run preflight in namespace");
        let report = super::report(
            &String::from_utf8_lossy(&out.stdout),
            &String::from_utf8_lossy(&out.stderr),
        );
        (out.status.code().unwrap_or(-1), report)
    }

    /// Starts preflight in the namespace without waiting, for multi-host
    /// scenarios; the process is killed at teardown if still running.
    pub fn spawn_preflight(
        &self,
        host: usize,
        binary: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Child {
        let mut c = self.in_ns(host, &[binary]);
        c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        c.spawn().expect("spawn preflight in namespace")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Ok(mut children) = self.children.lock() {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            children.clear();
        }
        // What those processes started in turn (an sshd's sessions, a
        // daemon's workers) lives on in the namespace: every process in a
        // namespace this test made is this test's.
        for h in &self.hosts {
            let pids = ip(&["netns", "pids", &h.ns]);
            for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    let _ = Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .env("PATH", PATH)
                        .output();
                }
            }
        }
        // Deleting a namespace removes its veth end (and the peer), its
        // rules and its sysctls.
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.ns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
        let _ = Command::new("nft")
            .args(["delete", "table", "bridge", &self.bridge_table()])
            .env("PATH", PATH)
            .stderr(Stdio::null())
            .output();
        let _ = std::fs::remove_file(&self.lock_file);
    }
}
