//! Ansible: `playbooks/` run by real ansible-core (a virtual environment
//! that `.ci/run` makes, PREFLIGHT_ANSIBLE_VENV, default
//! /opt/preflight-ansible) over real sshd in network-namespace hosts. Each
//! host has its own hostname, /etc/hosts and "disk": sshd runs in a UTS and
//! mount namespace where a per-host directory is bound over the remote
//! directory the playbooks install into, so what one host writes the others
//! do not see, as on real machines.

use crate::common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::netns::{Cluster, PATH};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_preflight");
/// Far beyond any play here; only a hang reaches it.
const PLAY_LIMIT: Duration = Duration::from_secs(300);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn venv() -> PathBuf {
    std::env::var_os("PREFLIGHT_ANSIBLE_VENV")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/opt/preflight-ansible"), PathBuf::from)
}

/// ansible-core's tools, or `None` after saying why they are missing.
fn tools() -> Option<PathBuf> {
    let bin = venv().join("bin");
    if bin.join("ansible-playbook").exists() {
        return Some(bin);
    }
    common::skip::skip(&format!(
        "no ansible-core at {} (PREFLIGHT_ANSIBLE_VENV; .ci/run installs it)",
        bin.display()
    ));
    None
}

/// What one run of a play or tool left: exit code and output.
struct Ran {
    code: i32,
    out: String,
}

impl Ran {
    /// The recap line of `host`: ok, changed, unreachable, failed, ...
    fn recap(&self, host: &str) -> std::collections::HashMap<String, u32> {
        let line = self
            .out
            .lines()
            .skip_while(|l| !l.starts_with("PLAY RECAP"))
            .find(|l| l.split_whitespace().next() == Some(host))
            .unwrap_or_else(|| panic!("no recap for {host}:\n{}", self.out));
        line.split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(0)))
            .collect()
    }

    fn failed(&self, host: &str) -> u32 {
        self.recap(host)["failed"]
    }

    /// The text Ansible printed for `host`'s failed task.
    fn fatal(&self, host: &str) -> String {
        let start = format!("fatal: [{host}]: FAILED!");
        let at = self
            .out
            .find(&start)
            .unwrap_or_else(|| panic!("{host} did not fail:\n{}", self.out));
        let rest = &self.out[at..];
        let end = rest[start.len()..]
            .find("\nfatal: [")
            .or_else(|| rest.find("\nPLAY RECAP"))
            .map_or(rest.len(), |e| e + start.len());
        rest[..end].to_string()
    }
}

/// Runs a command with a deadline, killing it past the limit.
fn bounded(mut c: Command) -> Ran {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > PLAY_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{c:?} still running after {PLAY_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = out.join().unwrap() + &err.join().unwrap();
    Ran {
        code: status.code().unwrap_or(-1),
        out,
    }
}

/// Three (or n) hosts with sshd, an inventory, and a place for reports.
struct Site {
    cluster: Cluster,
    dir: tempfile::TempDir,
    tools: PathBuf,
}

impl Site {
    fn new(n: usize) -> Option<Site> {
        let tools = tools()?;
        if !Path::new("/usr/sbin/sshd").exists() {
            common::skip::skip("no /usr/sbin/sshd (apt: openssh-server)");
            return None;
        }
        let cluster = Cluster::new(n)?;
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        for sub in ["home", "remote", "reports", "site"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        for key in ["id", "hostkey"] {
            let out = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(d.join(key))
                .output()
                .expect("ssh-keygen (apt: openssh-client)");
            assert!(out.status.success(), "{out:?}");
        }
        std::fs::copy(d.join("id.pub"), d.join("authorized_keys")).unwrap();
        let mut inventory = String::from("[nodes]\n");
        for h in 0..n {
            let disk = d.join(format!("disk{h}"));
            std::fs::create_dir(&disk).unwrap();
            let mut hosts = String::from("127.0.0.1 localhost\n");
            for o in 0..n {
                hosts.push_str(&format!("{} h{o}\n", cluster.addr(o)));
            }
            std::fs::write(d.join(format!("hosts{h}")), hosts).unwrap();
            let conf = d.join(format!("sshd{h}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "ListenAddress {addr}:22\nHostKey {key}\nPidFile none\n\
                     PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                     AuthorizedKeysFile {auth}\nStrictModes no\nUsePAM no\nUseDNS no\n\
                     Subsystem sftp internal-sftp\n",
                    addr = cluster.addr(h),
                    key = d.join("hostkey").display(),
                    auth = d.join("authorized_keys").display(),
                ),
            )
            .unwrap();
            let script = "hostname \"$1\" && mount --bind \"$2\" /etc/hosts && \
                          mount --bind \"$3\" \"$4\" && shift 4 && exec \"$@\"";
            let hostname = format!("h{h}");
            let hosts_file = d.join(format!("hosts{h}")).display().to_string();
            let disk = disk.display().to_string();
            let remote = d.join("remote").display().to_string();
            let conf = conf.display().to_string();
            let log = d.join(format!("sshd{h}.log")).display().to_string();
            std::fs::create_dir_all("/run/sshd").unwrap();
            cluster.spawn(
                h,
                &[
                    "unshare",
                    "--uts",
                    "--mount",
                    "sh",
                    "-c",
                    script,
                    "sh",
                    &hostname,
                    &hosts_file,
                    &disk,
                    &remote,
                    "/usr/sbin/sshd",
                    "-D",
                    "-E",
                    &log,
                    "-f",
                    &conf,
                ],
                false,
            );
            inventory.push_str(&format!("h{h} ansible_host={}\n", cluster.addr(h)));
        }
        inventory.push_str(&format!(
            "\n[nodes:vars]\nansible_user=root\nansible_ssh_private_key_file={}\n\
             ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR'\n\
             ansible_python_interpreter=/usr/bin/python3\n",
            d.join("id").display()
        ));
        std::fs::write(d.join("inventory"), inventory).unwrap();
        for h in 0..n {
            let addr: SocketAddr = format!("{}:22", cluster.addr(h)).parse().unwrap();
            let start = Instant::now();
            while TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err() {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "sshd on h{h} did not start"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Some(Site {
            cluster,
            dir,
            tools,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Host `h`'s own copy of the remote directory.
    fn disk(&self, h: usize) -> PathBuf {
        self.path(&format!("disk{h}"))
    }

    fn ansible(&self, tool: &str) -> Command {
        let mut c = Command::new(self.tools.join(tool));
        c.current_dir(self.dir.path())
            .env_clear()
            .env("PATH", format!("{}:{PATH}", self.tools.display()))
            .env("HOME", self.path("home"))
            .env("ANSIBLE_NOCOLOR", "1")
            .env("ANSIBLE_HOST_KEY_CHECKING", "False")
            .env("ANSIBLE_LOCALHOST_WARNING", "False")
            // As most sites set it: a module runs in one ssh session, not
            // four (a temporary directory, the copy, chmod, the run). The
            // six plays here took 98 s side by side without it, 82 s with.
            .env("ANSIBLE_PIPELINING", "True");
        c
    }

    /// The variables every play here gets: this build's binary, the
    /// per-host remote directory, the report directory.
    fn vars(&self, extra: Value) -> Value {
        let mut v = json!({
            "preflight_binary": BIN,
            "preflight_remote_dir": self.path("remote"),
            "preflight_report_dir": self.path("reports"),
            "preflight_timeout": 40,
        });
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    }

    fn play(&self, playbook: &str, extra: Value, args: &[&str]) -> Ran {
        let vars = self.path("vars.json");
        std::fs::write(&vars, self.vars(extra).to_string()).unwrap();
        let mut c = self.ansible("ansible-playbook");
        c.arg("-i")
            .arg(self.path("inventory"))
            .arg(repo().join("playbooks").join(playbook))
            .arg("-e")
            .arg(format!("@{}", vars.display()))
            .args(args);
        bounded(c)
    }

    fn site_check(&self, name: &str, yaml: &str) -> String {
        let p = self.path("site").join(name);
        std::fs::write(&p, yaml).unwrap();
        p.display().to_string()
    }

    fn report(&self, host: &str) -> common::Report {
        let p = self.path("reports").join(format!("{host}.json"));
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        common::report(&text, &p.display().to_string())
    }

    /// The play's own summary.json (written by the playbook, not by
    /// preflight: no schema type), untyped.
    fn summary(&self) -> Value {
        let text = std::fs::read_to_string(self.path("reports").join("summary.json"))
            .expect("summary.json");
        serde_json::from_str(&text).unwrap()
    }
}

/// A site check that fails where the listen backlog is small: a per-host
/// kernel setting (net.core is per network namespace).
const BACKLOG_CHECK: &str = "checks:\n  - id: site.somaxconn\n    kind: kernel_param\n    name: net.core.somaxconn\n    min: 1024\n    tags: [site]\n";

/// The shipped checks that read this machine rather than the host under
/// test, or that need a launcher: left out so that a healthy test host
/// is ready whatever machine runs the test.
fn skip_machine_checks() -> Value {
    json!([
        "memory",
        "time.sync",
        "disk.tmp",
        "cpu.governor",
        "cpu.cgroup",
        "limits.nofile"
    ])
}

#[test]
fn validate_fails_only_the_host_with_a_planted_fault_and_gathers_every_report() {
    let _shared = crate::common::shared();
    let Some(site) = Site::new(3) else { return };
    site.cluster
        .must(1, &["sysctl", "-w", "net.core.somaxconn=128"]);
    let check = site.site_check("backlog.yaml", BACKLOG_CHECK);
    let ran = site.play(
        "validate.yml",
        json!({"preflight_site_checks": [check], "preflight_skip": skip_machine_checks()}),
        &[],
    );
    // ansible-playbook exits 2 when a host failed; the others went on.
    assert_eq!(ran.code, 2, "{}", ran.out);
    assert_eq!(ran.failed("h1"), 1, "{}", ran.out);
    for h in ["h0", "h2"] {
        assert_eq!(ran.failed(h), 0, "{}", ran.out);
        assert_eq!(ran.recap(h)["unreachable"], 0, "{}", ran.out);
    }
    let fatal = ran.fatal("h1");
    assert!(
        fatal.contains("site.somaxconn: net.core.somaxconn is 128"),
        "{fatal}"
    );
    // One JSON report per host on the controller, each from its own host.
    for (h, verdict) in [("h0", "ready"), ("h1", "not_ready"), ("h2", "ready")] {
        let r = site.report(h);
        assert_eq!(r.verdict.name(), verdict, "{h}: {r}");
        assert_eq!(r.node.hostname, h, "{r}");
    }
    let s = site.summary();
    assert_eq!(s["not_ready"], json!(["h1"]), "{s:#}");
    assert_eq!(s["ready"], json!(["h0", "h2"]), "{s:#}");
    let p = &s["problems"][0];
    assert_eq!(p["id"], "site.somaxconn", "{s:#}");
    assert_eq!(p["hosts"], json!(["h1"]), "{s:#}");
    assert!(ran.out.contains("not_ready (1): h1"), "{}", ran.out);
    // The cluster page beside the reports (`preflight report`), though
    // its exit code said "not ready".
    let page = std::fs::read_to_string(site.path("reports").join("cluster.html"))
        .unwrap_or_else(|e| panic!("no cluster.html: {e}\n{}", ran.out));
    for h in ["h0", "h1", "h2"] {
        assert!(
            page.contains(&format!("data-node=\"{h}\"")),
            "{h} has no row"
        );
    }
    assert!(
        page.contains("class=\"cell s-fail\" tabindex=\"0\" data-check=\"site.somaxconn\""),
        "h1's failure is not in the matrix"
    );
}

#[test]
fn a_firewall_dropping_the_rendezvous_ports_fails_that_host_and_gates_the_next_step() {
    let _shared = crate::common::shared();
    let Some(site) = Site::new(3) else { return };
    site.cluster.iptables(
        2,
        &[
            "-A",
            "INPUT",
            "-i",
            "eth0",
            "-p",
            "tcp",
            "--dport",
            "29500:29510",
            "-j",
            "DROP",
        ],
    );
    // gate.yml: validate.yml, then a step on the ready hosts only.
    let ran = site.play(
        "gate.yml",
        json!({"preflight_skip": skip_machine_checks()}),
        &[],
    );
    assert_eq!(ran.code, 2, "{}", ran.out);
    assert_eq!(ran.failed("h2"), 1, "{}", ran.out);
    assert_eq!(ran.failed("h0") + ran.failed("h1"), 0, "{}", ran.out);
    let fatal = ran.fatal("h2");
    assert!(fatal.contains("net.firewall: "), "{fatal}");
    assert!(fatal.contains("29500"), "{fatal}");
    assert_eq!(site.summary()["not_ready"], json!(["h2"]));
    assert_eq!(site.report("h2").verdict, common::Verdict::NotReady);
    // The next step ran where preflight passed, and only there.
    assert!(site.disk(0).join("ready").exists());
    assert!(site.disk(1).join("ready").exists());
    assert!(!site.disk(2).join("ready").exists());
}

/// Every file under `dir` with its modification time and size.
fn listing(dir: &Path) -> Vec<(PathBuf, std::time::SystemTime, u64)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                todo.push(e.path());
            }
            out.push((e.path(), m.modified().unwrap(), m.len()));
        }
    }
    out.sort();
    out
}

#[test]
fn check_mode_runs_and_changes_nothing() {
    let _shared = crate::common::shared();
    let Some(site) = Site::new(3) else { return };
    let vars = json!({"preflight_skip": skip_machine_checks()});
    // Fresh hosts: nothing is installed, so nothing can run; nothing is written.
    let ran = site.play("validate.yml", vars.clone(), &["--check"]);
    assert_eq!(ran.code, 0, "{}", ran.out);
    for h in 0..3 {
        assert_eq!(listing(&site.disk(h)), vec![], "h{h} was changed");
    }
    assert_eq!(listing(&site.path("reports")), vec![]);
    // Installed hosts: check mode runs preflight and still writes nothing.
    let ran = site.play("validate.yml", vars.clone(), &[]);
    assert_eq!(ran.code, 0, "{}", ran.out);
    let before: Vec<_> = (0..3).map(|h| listing(&site.disk(h))).collect();
    let reports = listing(&site.path("reports"));
    site.cluster.iptables(
        1,
        &[
            "-A", "INPUT", "-i", "eth0", "-p", "tcp", "--dport", "29500", "-j", "REJECT",
        ],
    );
    // A site checklist that the play would copy first is left out, with a
    // warning, rather than failing the dry run.
    let check = site.site_check("backlog.yaml", BACKLOG_CHECK);
    let mut more = vars.clone();
    more["preflight_site_checks"] = json!([check]);
    let ran = site.play("validate.yml", more, &["--check"]);
    // It ran: the new fault is found on h1, in check mode.
    assert_eq!(ran.failed("h1"), 1, "{}", ran.out);
    assert_eq!(ran.failed("h0") + ran.failed("h2"), 0, "{}", ran.out);
    assert!(ran.fatal("h1").contains("net.firewall"), "{}", ran.out);
    assert!(
        ran.out.contains("is not installed yet; run without it"),
        "{}",
        ran.out
    );
    for (h, listed) in before.iter().enumerate() {
        assert_eq!(&listing(&site.disk(h)), listed, "h{h} was changed");
    }
    assert_eq!(listing(&site.path("reports")), reports);
}

#[test]
fn cluster_play_is_ready_when_healthy_and_fails_only_the_host_whose_ports_are_dropped() {
    let _shared = crate::common::shared();
    let Some(site) = Site::new(3) else { return };
    let vars = json!({
        "preflight_no_shipped": true,
        "preflight_site_checks": [repo().join("checks/cluster.yaml"), repo().join("checks/network.yaml")],
        "preflight_skip": ["net.master_port_free"],
        "preflight_nproc_per_node": "1",
        "preflight_timeout": 30,
    });
    let ran = site.play("cluster.yml", vars.clone(), &[]);
    assert_eq!(ran.code, 0, "{}", ran.out);
    for h in 0..3 {
        let r = cluster_report(&site, h);
        assert_eq!(r.cluster().verdict, common::Verdict::Ready, "h{h}: {r}");
        assert_eq!(r.cluster().world_size, 3);
        assert_eq!(
            r.node.rank,
            Some(h as u32),
            "h{h}'s node rank from its place in the play"
        );
    }
    // h1 drops the rendezvous and probe ports from other hosts.
    site.cluster.iptables(
        1,
        &[
            "-A",
            "INPUT",
            "-i",
            "eth0",
            "-p",
            "tcp",
            "-m",
            "multiport",
            "--dports",
            "29500:29510,29600:29699",
            "-j",
            "DROP",
        ],
    );
    let ran = site.play("cluster.yml", vars, &[]);
    assert_eq!(ran.code, 2, "{}", ran.out);
    assert_eq!(ran.failed("h1"), 1, "{}", ran.out);
    assert_eq!(ran.failed("h0") + ran.failed("h2"), 0, "{}", ran.out);
    let fatal = ran.fatal("h1");
    assert!(fatal.contains("this host is at fault"), "{fatal}");
    assert!(fatal.contains("h1 drops incoming connections"), "{fatal}");
    // Every host's result names h1.
    for h in 0..3 {
        let r = cluster_report(&site, h);
        let c = r.cluster();
        assert_eq!(c.verdict, common::Verdict::NotReady, "h{h}: {r}");
        assert_eq!(c.culprits.len(), 1, "{c:#?}");
        assert_eq!(c.culprits[0].node, "h1", "{c:#?}");
    }
    assert_eq!(
        ran.out.matches("cluster not_ready; at fault: h1").count(),
        2,
        "h0 and h2 show the verdict:\n{}",
        ran.out
    );
    // The run reports the play left on each host, gathered as an operator
    // would and merged by `preflight report`: one cluster view, h1 the
    // one culprit.
    let gathered = tempfile::tempdir().unwrap();
    for h in 0..3 {
        std::fs::copy(
            site.disk(h).join("cluster-report.json"),
            gathered.path().join(format!("h{h}.json")),
        )
        .unwrap();
    }
    let merged = Command::new(env!("CARGO_BIN_EXE_preflight"))
        .args(["report", "--format", "json"])
        .arg(gathered.path())
        .output()
        .unwrap();
    assert_eq!(
        merged.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&merged.stderr)
    );
    let m = common::merged(
        &String::from_utf8_lossy(&merged.stdout),
        &String::from_utf8_lossy(&merged.stderr),
    );
    assert_eq!(m.counts.nodes, 3, "{m}");
    assert_eq!(
        m.cluster.as_ref().expect("a cluster view").world_size,
        3,
        "{m}"
    );
    let culprits: Vec<&str> = m.culprits.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(culprits, ["h1"], "{m}");
}

/// The run report the cluster play left on host `h`.
fn cluster_report(site: &Site, h: usize) -> common::Report {
    let p = site.disk(h).join("cluster-report.json");
    common::report(
        &std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
        &p.display().to_string(),
    )
}

/// The module alone, on the controller (`ansible -c local`): whether the
/// task failed (ansible's exit code 2), and its result as JSON (`--tree`):
/// Ansible's result, no report, so untyped (its `report` is read typed).
fn module(tools: &Path, args: Value) -> (bool, Value) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new(tools.join("ansible"));
    c.current_dir(dir.path())
        .env_clear()
        .env("PATH", format!("{}:{PATH}", tools.display()))
        .env("HOME", dir.path())
        .env("ANSIBLE_NOCOLOR", "1")
        .env("ANSIBLE_LOCALHOST_WARNING", "False")
        .args(["-i", "localhost,", "-c", "local", "-M"])
        .arg(repo().join("playbooks/library"))
        .args(["localhost", "-m", "preflight", "-e"])
        .arg("ansible_python_interpreter=/usr/bin/python3")
        .arg("-a")
        .arg(args.to_string())
        .arg("-t")
        .arg(dir.path().join("tree"));
    let ran = bounded(c);
    let text = std::fs::read_to_string(dir.path().join("tree/localhost"))
        .unwrap_or_else(|e| panic!("no result ({e}): {}", ran.out));
    assert!(ran.code == 0 || ran.code == 2, "{}", ran.out);
    (ran.code == 2, serde_json::from_str(&text).unwrap())
}

#[test]
fn the_module_fails_with_the_binarys_own_error() {
    let _shared = crate::common::shared();
    let Some(tools) = tools() else { return };
    let dir = tempfile::tempdir().unwrap();
    // No binary.
    let missing = dir.path().join("nowhere/preflight");
    let (failed, r) = module(&tools, json!({"binary": missing}));
    assert!(failed, "{r:#}");
    let msg = r["msg"].as_str().unwrap();
    assert!(msg.contains("nowhere/preflight: no such file"), "{msg}");
    // An invalid checklist: exit 2, with the file, line and column.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "checks:\n  - id: x\n    kind: no_such_kind\n").unwrap();
    let (failed, r) = module(
        &tools,
        json!({"binary": BIN, "checks": [bad], "no_shipped": true}),
    );
    assert!(failed, "{r:#}");
    assert_eq!(r["exit_code"], 2, "{r:#}");
    let msg = r["msg"].as_str().unwrap();
    assert!(msg.contains("exit 2"), "{msg}");
    assert!(msg.contains(&format!("{}:3:", bad.display())), "{msg}");
    // A crash: killed by a signal, with what it printed.
    let crash = common::executable(
        dir.path(),
        "crash",
        "#!/bin/sh\necho 'about to crash' >&2\nkill -SEGV $$\n",
    );
    let (failed, r) = module(&tools, json!({"binary": crash}));
    assert!(failed, "{r:#}");
    let msg = r["msg"].as_str().unwrap();
    assert!(msg.contains("crashed: killed by SIGSEGV"), "{msg}");
    assert!(msg.contains("about to crash"), "{msg}");
    // Ready: the report as data, never changed.
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "checks:\n  - id: site.tmp\n    kind: file\n    path: /tmp\n",
    )
    .unwrap();
    let (failed, r) = module(
        &tools,
        json!({"binary": BIN, "checks": [good], "no_shipped": true}),
    );
    assert!(!failed, "{r:#}");
    assert_eq!(r["changed"], false);
    assert_eq!(r["verdict"], "ready");
    let report: preflight::schema::Report =
        serde_json::from_value(r["report"].clone()).expect("the module's report");
    assert_eq!(report.schema, "preflight.report/v1");
    // Incomplete (exit 3): fails by default, warns when told to.
    let unreadable = dir.path().join("incomplete.yaml");
    std::fs::write(
        &unreadable,
        "checks:\n  - id: site.param\n    kind: kernel_param\n    name: net.core.no_such_param\n    min: 1\n",
    )
    .unwrap();
    let args = json!({"binary": BIN, "checks": [unreadable], "no_shipped": true});
    let (failed, r) = module(&tools, args.clone());
    assert!(failed, "{r:#}");
    assert_eq!(r["exit_code"], 3);
    let msg = r["msg"].as_str().unwrap();
    assert!(msg.starts_with("incomplete"), "{msg}");
    assert!(
        msg.contains("site.param: net.core.no_such_param does not exist"),
        "{msg}"
    );
    let mut warn = args;
    warn["incomplete"] = json!("warn");
    let (failed, r) = module(&tools, warn);
    assert!(!failed, "{r:#}");
    assert_eq!(r["verdict"], "incomplete");
    assert!(
        r["msg"].as_str().unwrap().starts_with("incomplete"),
        "{r:#}"
    );
    assert_eq!(r["problems"][0]["status"], "error");
}

#[test]
fn playbooks_pass_ansible_lint_and_the_module_documents_itself() {
    let _shared = crate::common::shared();
    let Some(tools) = tools() else { return };
    let home = tempfile::tempdir().unwrap();
    let env = |c: &mut Command| {
        c.current_dir(repo())
            .env_clear()
            .env("PATH", format!("{}:{PATH}", tools.display()))
            .env("HOME", home.path())
            .env("ANSIBLE_NOCOLOR", "1");
    };
    let mut doc = Command::new(tools.join("ansible-doc"));
    env(&mut doc);
    doc.args(["-M", "playbooks/library", "preflight"]);
    let ran = bounded(doc);
    assert_eq!(ran.code, 0, "{}", ran.out);
    for part in [
        "OPTIONS",
        "incomplete",
        "EXAMPLES",
        "RETURN VALUES",
        "culprits",
    ] {
        assert!(
            ran.out.contains(part),
            "ansible-doc lacks {part}:\n{}",
            ran.out
        );
    }
    assert!(!ran.out.contains("WARNING"), "{}", ran.out);
    // The modules run on the managed hosts' Python, 3.8 or later: its
    // grammar, and nothing but the standard library and Ansible's own.
    for module in ["preflight.py", "preflight_summary.py"] {
        let path = repo().join("playbooks/library").join(module);
        let code = format!(
            "import ast, sys\n\
             tree = ast.parse(open({p:?}).read(), feature_version=(3, 8))\n\
             names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]\n\
             names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module != '__future__']\n\
             outside = [m for m in names if m.split('.')[0] not in sys.stdlib_module_names and not m.startswith('ansible.module_utils')]\n\
             sys.exit('imports outside the standard library: %s' % outside if outside else 0)\n",
            p = path.display().to_string()
        );
        let out = Command::new("/usr/bin/python3")
            .args(["-c", &code])
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{module}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut lint = Command::new(tools.join("ansible-lint"));
    env(&mut lint);
    lint.args(["--offline", "playbooks/"]);
    let ran = bounded(lint);
    assert_eq!(ran.code, 0, "ansible-lint:\n{}", ran.out);
}
