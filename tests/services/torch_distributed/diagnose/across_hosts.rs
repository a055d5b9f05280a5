//! Diagnose across namespace hosts under torchrun, on each torch: a path
//! that fails after init, a rank asleep on another node found over ssh,
//! and a diagnosis asked of only some of the job's nodes, which says what
//! it could not see and exits 3.

use super::*;

/// Every process whose command line names `needle` (a path of this
/// test's own), killed: the ranks a namespace host's torchrun started.
fn kill_every(needle: &str) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains(needle) && pid != std::process::id() as i32 {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// (d) Two namespace hosts, two ranks each, under torchrun: after init,
/// the path between them drops every packet both ways, as a failed link
/// or switch port does (each host drops what arrives from the other; what
/// a host sends still leaves it). Every rank waits in its all_reduce.
/// Which side had data in flight when the path failed is the ring's
/// business, so diagnose runs on both hosts: on the host whose ranks hold
/// the unacknowledged data it names the path to the other host, and its
/// connect there times out; no rank is blamed.
fn path_dropped_after_init(torch: &Torch) {
    let _serial = serial();
    let Some(net) = common::netns::Cluster::new(2) else {
        return;
    };
    let files = cluster::host_files(&net, None);
    let dir = common::tempdir_with_mode(0o777);
    // After 20 all_reduces: init is done, every connection made.
    let job = torchrun_on_hosts(
        torch,
        &net,
        &files,
        dir.path(),
        2,
        &[("JOB_MODE", "healthy")],
    );
    let pid = job.pid;
    net.iptables(1, &["-A", "INPUT", "-s", &net.addr(0), "-j", "DROP"]);
    net.iptables(0, &["-A", "INPUT", "-s", &net.addr(1), "-j", "DROP"]);
    let start = Instant::now();
    let (host, d) = 'found: loop {
        for host in 0..2 {
            let out = net.exec(
                host,
                &[
                    common::BIN,
                    "diagnose",
                    "--format",
                    "json",
                    "--pid",
                    &pid.to_string(),
                    "--py-spy",
                    "off",
                    "--nccl-ras",
                    "off",
                ],
            );
            let d: Diagnosis = diagnosis(&out);
            let probed_here = d
                .jobs
                .first()
                .is_some_and(|j| j.paths.iter().any(|p| p.contains("a connect from here")));
            if out.status.code() == Some(1) && probed_here {
                break 'found (host, d);
            }
            assert!(start.elapsed() < Duration::from_secs(40), "{d:#?}");
        }
    };
    let j = &d.jobs[0];
    println!("host {host}: {:?}", j.paths);
    let other = net.addr(1 - host);
    let probed: Vec<&String> = j
        .paths
        .iter()
        .filter(|p| p.contains("a connect from here"))
        .collect();
    for p in &probed {
        assert!(p.contains(&format!("to {other}:")), "{d:#?}");
        assert!(p.contains("sent and never acknowledged"), "{p}");
        assert!(
            p.contains(&format!("a connect from here to {other}:")),
            "{p}"
        );
        assert!(p.contains("timed_out"), "{p}");
    }
    // No rank is blamed for the path's fault.
    assert!(j.culprits.is_empty(), "{d:#?}");
    drop(job);
}

on_each_torch!(
    a_path_dropped_after_init_is_named,
    super::path_dropped_after_init
);

/// A torch job under torchrun on both of `net`'s hosts (`per_node` ranks
/// each, `vars` added to the job's environment), in `dir` (writable by
/// anyone); every rank killed when the guard drops. Returns once the job
/// has written its marker, with the marking rank's pid.
struct HostsJob {
    _procs: Vec<cluster::Proc>,
    script: String,
    pid: u32,
}

impl Drop for HostsJob {
    fn drop(&mut self) {
        kill_every(&self.script);
    }
}

fn torchrun_on_hosts(
    torch: &Torch,
    net: &common::netns::Cluster,
    files: &cluster::HostFiles,
    dir: &Path,
    per_node: u32,
    vars: &[(&str, &str)],
) -> HostsJob {
    let script = dir.join("job.py");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/services/torch_distributed/job.py"),
        &script,
    )
    .unwrap();
    let script = script.display().to_string();
    let marker = dir.join("marker");
    let marker_text = marker.display().to_string();
    let master = net.addr(0);
    let procs = (0..2)
        .map(|k| {
            let argv: Vec<String> = [
                torch.torchrun.to_str().expect("a torchrun path in UTF-8"),
                "--nnodes",
                "2",
                "--node_rank",
                &k.to_string(),
                "--nproc_per_node",
                &per_node.to_string(),
                "--master_addr",
                &master,
                "--master_port",
                "29500",
                "--redirects",
                "1",
                "--tee",
                "1",
                "--log_dir",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain([
                dir.join(format!("logs{k}")).display().to_string(),
                script.clone(),
            ])
            .collect();
            let mut env = vec![
                ("HOME", "/tmp"),
                ("LANG", "C.UTF-8"),
                ("GLOO_SOCKET_IFNAME", "eth0"),
                ("OMP_NUM_THREADS", "1"),
                ("JOB_SECONDS", "120"),
                ("JOB_MARKER", marker_text.as_str()),
            ];
            env.extend_from_slice(vars);
            cluster::on_host_cmd(net, files, k, &argv, &env)
        })
        .collect();
    // The guard first: a job that never marks is still killed.
    let mut job = HostsJob {
        _procs: procs,
        script,
        pid: 0,
    };
    let start = Instant::now();
    while !marker.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the job never reached its mark"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    job.pid = marker_pid_at(&marker);
    job
}

fn marker_pid_at(marker: &Path) -> u32 {
    std::fs::read_to_string(marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// sshd on each namespace host (its own hostname), root's key; the key.
fn sshd_on(
    net: &common::netns::Cluster,
    files: &cluster::HostFiles,
    dir: &Path,
) -> Option<PathBuf> {
    if !Path::new("/usr/sbin/sshd").exists() {
        common::skip_unless_required("no /usr/sbin/sshd (apt: openssh-server)");
        return None;
    }
    for key in ["id", "hostkey"] {
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(key))
            .output()
            .expect("ssh-keygen (apt: openssh-client)");
        assert!(out.status.success(), "{out:?}");
    }
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    for h in 0..net.hosts.len() {
        let conf = dir.join(format!("sshd{h}.conf"));
        std::fs::write(
            &conf,
            format!(
                "ListenAddress {}:22\nHostKey {}\nPidFile none\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nAuthorizedKeysFile {}\nStrictModes no\nUsePAM no\nUseDNS no\n",
                net.addr(h),
                dir.join("hostkey").display(),
                dir.join("authorized_keys").display()
            ),
        )
        .unwrap();
        let argv: Vec<String> = ["/usr/sbin/sshd", "-D", "-e", "-f"]
            .iter()
            .map(|s| s.to_string())
            .chain([conf.display().to_string()])
            .collect();
        std::mem::forget(cluster::on_host_cmd(
            net,
            files,
            h,
            &argv,
            &[("LANG", "C.UTF-8")],
        ));
        let addr: std::net::SocketAddr = format!("{}:22", net.addr(h)).parse().unwrap();
        let start = Instant::now();
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "sshd on h{h} did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Some(dir.join("id"))
}

/// Across nodes, in one command: two namespace hosts, one rank each; rank
/// 1 (host 1) stops before an all_reduce. Host 0 alone sees only a rank
/// that waits (the one it waits for is elsewhere); host 1 alone, a rank
/// asleep that nobody here waits for. diagnose --hosts, over ssh to both
/// and to a host that does not answer, names rank 1 on h1, and says the
/// host it could not ask. Asked of host 0 alone, it calls rank 1
/// elsewhere, never absent, and exits 3 with the nodes to add.
fn rank_asleep_on_another_node(torch: &Torch) {
    let _serial = serial();
    let Some(net) = common::netns::Cluster::new(2) else {
        return;
    };
    let files = cluster::host_files(&net, None);
    let dir = common::tempdir_with_mode(0o777);
    let Some(key) = sshd_on(&net, &files, dir.path()) else {
        return;
    };
    let _job = torchrun_on_hosts(
        torch,
        &net,
        &files,
        dir.path(),
        1,
        &[("JOB_MODE", "stop"), ("JOB_RANK", "1")],
    );
    let silent = net.unused_addr();
    let hosts = format!("{},{},{silent}", net.addr(0), net.addr(1));
    let key = key.display().to_string();
    let across = |hosts: &str| {
        net.exec(
            0,
            &[
                common::BIN,
                "diagnose",
                "--format",
                "json",
                "--hosts",
                hosts,
                "--this-namespace",
                "--py-spy",
                "off",
                "--nccl-ras",
                "off",
                "--remote-preflight",
                common::BIN,
                "--ssh-option=-i",
                &format!("--ssh-option={key}"),
                "--ssh-option=-o",
                "--ssh-option=StrictHostKeyChecking=no",
                "--ssh-option=-o",
                "--ssh-option=UserKnownHostsFile=/dev/null",
                "--ssh-option=-o",
                "--ssh-option=LogLevel=ERROR",
            ],
        )
    };
    let start = Instant::now();
    let d = loop {
        let out = across(&hosts);
        let d: preflight::schema::ClusterDiagnosis = diagnosis(&out);
        if out.status.code() == Some(1) {
            break d;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{d:#?}");
    };
    let c = &d.culprits;
    assert_eq!(c.len(), 1, "{d:#?}");
    assert_eq!(c[0].rank, 1, "{d:#?}");
    assert_eq!(c[0].node, "h1", "{d:#?}");
    let reason = c[0].reason.as_str();
    assert!(reason.starts_with("asleep in its own code"), "{reason}");
    assert_eq!(c[0].evidence, "rank", "{d:#?}");
    assert!(
        reason.ends_with("while rank 0 waits, on 2 nodes"),
        "{reason}"
    );
    // Each node alone could not tell.
    let verdicts: Vec<&str> = d.nodes.iter().map(|n| n.verdict.as_str()).collect();
    assert_eq!(verdicts, ["unknown", "progressing"], "{d:#?}");
    assert_eq!(d.unreachable[0].host, silent, "{d:#?}");
    assert_eq!(d.verdict, "held", "{d:#?}");
    // Host 0 alone: rank 1 runs elsewhere, not absent; the verdict needs
    // the other node, and says so.
    let out = across(&net.addr(0));
    let d: preflight::schema::ClusterDiagnosis = diagnosis(&out);
    assert_eq!(out.status.code(), Some(3), "{d:#?}");
    assert_eq!(d.verdict, "unknown", "{d:#?}");
    assert!(d.culprits.is_empty(), "{d:#?}");
    assert!(
        d.elsewhere.len() == 1 && d.elsewhere[0].contains("rank 1 runs on nodes not asked"),
        "{d:#?}"
    );
    assert!(d.summary.contains("add them to --hosts"), "{d:#?}");
}

on_each_torch!(
    across_nodes_the_rank_asleep_on_another_node_is_named,
    super::rank_asleep_on_another_node
);
