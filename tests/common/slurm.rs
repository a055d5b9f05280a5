//! A real Slurm cluster for tests: munged with a private key and socket,
//! slurmctld in the root namespace (its own UTS namespace, hostname
//! `ctl`, on the bridge address), and one slurmd per network namespace,
//! each with its own hostname (`h1`, `h2`, ...), as on real nodes. Started
//! in the foreground, owned by PID, killed in `Drop`; the namespaces go
//! with the `Cluster` underneath.
//!
//! Slurm 22.05 from Debian (slurmctld, slurmd, slurm-client, munge); the
//! shared reference `test-hosts.md` has the facts this relies on
//! (`nsenter --net`, not `ip netns exec`, for slurmd).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::netns::{Cluster, PATH};

pub struct Slurm {
    pub net: Cluster,
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    /// h1, h2, ...: node i runs in namespace i.
    pub nodes: Vec<String>,
    daemons: Vec<Child>,
}

/// Why Slurm cannot run here, if it cannot.
fn missing() -> Option<&'static str> {
    for tool in [
        "slurmctld",
        "slurmd",
        "scontrol",
        "srun",
        "sbatch",
        "munged",
    ] {
        let found = PATH.split(':').any(|d| Path::new(d).join(tool).exists());
        if !found {
            return Some(
                "Slurm is not installed (apt: slurmctld slurmd slurm-client munge; .ci/install installs them)",
            );
        }
    }
    None
}

/// `extra`: slurm.conf lines (Prolog=, HealthCheckProgram=, ...), with
/// `{dir}` standing for the cluster's directory.
pub struct Options<'a> {
    pub nodes: usize,
    pub extra: &'a [String],
    /// Runs before the daemons start (write wrappers, plant faults).
    pub before_start: &'a dyn Fn(&Path),
}

impl Slurm {
    pub fn start(opts: Options<'_>) -> Option<Slurm> {
        if let Some(why) = missing() {
            super::skip::skip(why);
            return None;
        }
        let net = Cluster::new(opts.nodes)?;
        let dir = tempfile::Builder::new()
            .prefix("pf-slurm-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        for sub in ["state", "spool", "log", "munge"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join("munge"), std::fs::Permissions::from_mode(0o700)).unwrap();
        let key: Vec<u8> = (0..128)
            .map(|i| (i * 37 + std::process::id() as usize) as u8)
            .collect();
        let key_file = d.join("munge/key");
        std::fs::write(&key_file, key).unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let nodes: Vec<String> = (1..=opts.nodes).map(|i| format!("h{i}")).collect();
        let ctld_port = super::unused_port("0.0.0.0");
        let bridge = format!("10.231.{}.254", net.subnet);
        let mut conf = format!(
            "ClusterName=pftest\nSlurmctldHost=ctl({bridge})\nSlurmctldPort={ctld_port}\nSlurmdPort=6818\n\
             SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n\
             AuthInfo=socket={d}/munge/sock\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nReturnToService=2\nMpiDefault=none\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\nSlurmctldPidFile={d}/ctld.pid\n\
             SlurmdPidFile={d}/spool/%n.pid\nSlurmctldLogFile={d}/log/ctld.log\nSlurmdLogFile={d}/log/%n.log\n\
             SlurmctldTimeout=30\nSlurmdTimeout=30\nMessageTimeout=10\nKillWait=2\nMinJobAge=2\n",
            d = d.display()
        );
        for line in opts.extra {
            conf.push_str(&line.replace("{dir}", &d.display().to_string()));
            conf.push('\n');
        }
        for (i, n) in nodes.iter().enumerate() {
            conf.push_str(&format!(
                "NodeName={n} NodeAddr={} CPUs=2 RealMemory=1000\n",
                net.addr(i)
            ));
        }
        conf.push_str(&format!(
            "PartitionName=debug Nodes={} Default=YES MaxTime=INFINITE State=UP\n",
            nodes.join(",")
        ));
        let conf_file = d.join("slurm.conf");
        std::fs::write(&conf_file, conf).unwrap();
        (opts.before_start)(d);
        let mut slurm = Slurm {
            net,
            conf: conf_file,
            nodes,
            daemons: Vec::new(),
            dir,
        };
        let d = slurm.dir.path().to_path_buf();
        let mut munged = Command::new("munged");
        munged
            .args(["-F", "-f"])
            .arg(format!("--socket={}/munge/sock", d.display()))
            .arg(format!("--key-file={}", key_file.display()))
            .arg(format!("--pid-file={}/munge/pid", d.display()))
            .arg(format!("--log-file={}/munge/log", d.display()))
            .arg(format!("--seed-file={}/munge/seed", d.display()));
        slurm.daemon(munged);
        super::wait_for("munged's socket", || d.join("munge/sock").exists());
        let conf = slurm.conf.display().to_string();
        let hosts = d.join("hosts");
        let mut text = format!("127.0.0.1 localhost\n{bridge} ctl\n");
        for (i, n) in slurm.nodes.iter().enumerate() {
            text.push_str(&format!("{} {n}\n", slurm.net.addr(i)));
        }
        std::fs::write(&hosts, text).unwrap();
        let mut ctld = Command::new("unshare");
        ctld.args([
            "--uts",
            "sh",
            "-c",
            "hostname ctl; exec slurmctld -D -i -f \"$0\"",
            &conf,
        ]);
        slurm.daemon(ctld);
        for (i, n) in slurm.nodes.clone().iter().enumerate() {
            std::fs::create_dir_all(d.join("spool").join(n)).unwrap();
            // Its own hostname and /etc/hosts (the cluster's names), as a
            // real node has: the programs slurmd starts inherit both.
            let mut c = slurm.as_node(i);
            c.args(["slurmd", "-D", "-f", &conf, "-N", n]);
            slurm.daemon(c);
        }
        let all = slurm.nodes.clone();
        let ok = super::wait_until(Duration::from_secs(60), || {
            all.iter().all(|n| {
                let s = slurm.state(n);
                s.starts_with("idle") || s.starts_with("drain")
            })
        });
        assert!(
            ok,
            "the Slurm nodes did not come up: {}\n{}",
            slurm.sinfo(),
            slurm.log("ctld")
        );
        Some(slurm)
    }

    /// A Slurm client command in the root namespace with this cluster's
    /// configuration.
    pub fn cmd(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(args)
            .env_clear()
            .env("PATH", PATH)
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null());
        c
    }

    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.cmd(program, args)
            .output()
            .expect("run a Slurm command")
    }

    /// The node's state as sinfo prints it (`idle`, `drain`, `alloc`...),
    /// without the `*~#!%$@^` suffixes.
    pub fn state(&self, node: &str) -> String {
        let out = self.run("sinfo", &["-h", "-N", "-n", node, "-o", "%t"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^'])
            .to_string()
    }

    /// The node's reason, without Slurm's ` [user@time]`.
    pub fn reason(&self, node: &str) -> String {
        let out = self.run("sinfo", &["-h", "-N", "-n", node, "-o", "%E"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    pub fn sinfo(&self) -> String {
        let out = self.run("sinfo", &["-N", "-o", "%N %t %E"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("log").join(format!("{name}.log")))
            .unwrap_or_default()
    }

    /// `scontrol ARGS`, asserting success.
    pub fn scontrol(&self, args: &[&str]) {
        let out = self.run("scontrol", args);
        assert!(
            out.status.success(),
            "scontrol {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `program` in node i's namespace with exactly `env` (plus
    /// PATH), as slurmd would run it there.
    pub fn on_node(&self, i: usize, program: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = self.as_node(i);
        c.arg(program).args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("run on a node")
    }

    /// A command run as node `i`: in its network namespace, with its own
    /// hostname and the cluster's /etc/hosts, exactly `PATH` in its
    /// environment; the program and its arguments follow.
    fn as_node(&self, i: usize) -> Command {
        let ns = format!("/run/netns/{}", self.net.hosts[i].ns);
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={ns}"))
            .args([
                "unshare",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "mount --bind \"$1\" /etc/hosts && hostname \"$0\" && shift && exec \"$@\"",
            ])
            .arg(&self.nodes[i])
            .arg(self.dir.path().join("hosts"))
            .env_clear()
            .env("PATH", PATH)
            .stdin(Stdio::null());
        c
    }

    /// Starts a daemon in the foreground, owned (killed in `Drop`).
    fn daemon(&mut self, mut c: Command) {
        c.env_clear()
            .env("PATH", PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.daemons.push(c.spawn().expect("start a Slurm daemon"));
    }

    /// Waits until every node is `state` (sinfo's short form).
    pub fn wait_state(&self, node: &str, want: &str, limit: Duration) -> bool {
        super::wait_until(limit, || self.state(node) == want)
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // slurmd first: it would re-register with a controller about to go.
        for c in self.daemons.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
