//! Firewalls and silent peers across namespace hosts: probes dropped or
//! rejected, a stopped rank that is no firewall, a taken probe range, and
//! blame for an inbound drop, an outbound block and a filter in between.

use super::*;

#[test]
fn a_host_whose_firewall_drops_probes_is_named_in_the_matrix() {
    let _shared = crate::common::shared();
    let Some(job) = job(3, None) else { return };
    // New connections into host 2 dropped: it connects out to the master
    // and checks in, but its peers cannot reach its probe listener.
    job.cluster.iptables(
        2,
        &[
            "-A", "INPUT", "-i", "eth0", "-p", "tcp", "--syn", "-j", "DROP",
        ],
    );
    let out = job.all("15s", &[]);
    all_exit(&out, 1);
    // 1.2 s in docs/faults.md; --timeout is 15 s.
    cluster::verdicts_within(&out, Duration::from_secs(8));
    let msg = out[0].message("cluster.reachability");
    assert!(msg.contains("h2 drops incoming connections"), "{msg}");
    // Every rank learns the one node to act on, structurally.
    for o in &out {
        let report = o.report();
        let culprits = &report.cluster().culprits;
        assert_eq!(culprits.len(), 1, "{culprits:#?}");
        assert_eq!(culprits[0].node, "h2", "{culprits:#?}");
        assert_eq!(culprits[0].ranks, [2], "{culprits:#?}");
    }
}

#[test]
fn a_host_whose_firewall_rejects_the_probe_port_is_named_as_refusing() {
    let _shared = crate::common::shared();
    let Some(job) = job(3, None) else { return };
    // The rendezvous port is open everywhere; host 2 REJECTs the probe
    // port: its peers get refused (told apart from a DROP's timeout).
    job.cluster.iptables(
        2,
        &[
            "-A", "INPUT", "-i", "eth0", "-p", "tcp", "--dport", "29601", "-j", "REJECT",
        ],
    );
    let ports: &[(&str, &str)] = &[("PREFLIGHT_PROBE_PORTS", "29601-29610")];
    let out = job.all("15s", &[(0, ports), (1, ports), (2, ports)]);
    all_exit(&out, 1);
    let msg = out[0].message("cluster.reachability");
    assert!(
        msg.contains("h2 refuses incoming connections (a firewall REJECT rule?): every peer failed to reach it (refused) while it reached 2 of 2"),
        "{msg}"
    );
    assert!(!msg.contains("h0 ") && !msg.contains("h1 "), "{msg}");
    let report = out[0].report();
    let c = report.cluster();
    let probes = &c.reachability.probes;
    for p in probes {
        let want = if p.to == 2 { "refused" } else { "ok" };
        assert_eq!(p.status, want, "{probes:#?}");
    }
    assert_eq!(
        c.nodes[2].probe_addr,
        Some(format!("{}:29601", job.cluster.addr(2)))
    );
    // Every rank leaves with rank 0's verdict and findings, and the row
    // and column of the matrix that are its own node's (rank 0 keeps the
    // whole; how it draws it for people is tested in crates/preflight-report/src/cluster.rs).
    let names = &c.reachability.nodes;
    for o in &out[1..] {
        let report = o.report();
        let r = report.cluster();
        assert_eq!(r.verdict, Verdict::NotReady, "{}", o.label);
        assert_eq!(
            r.reachability.findings, c.reachability.findings,
            "{}",
            o.label
        );
        let own = names.iter().position(|n| *n == r.nodes[0].name).unwrap();
        let mine: Vec<_> = probes
            .iter()
            .filter(|p| p.from == own || p.to == own)
            .collect();
        let got: Vec<_> = r.reachability.probes.iter().collect();
        assert_eq!(got, mine, "{}", o.label);
    }
}

/// Host 2's rank is stopped (SIGSTOP) once its check-in has gone out,
/// before the last rank arrives: its kernel still accepts its peers'
/// probes, and nothing answers them. That is a process stopped or
/// starved, said as such: no firewall, nobody drained, a warning.
#[test]
fn a_stopped_rank_does_not_answer_and_is_no_firewall() {
    let _shared = crate::common::shared();
    let Some(job) = job(3, None) else { return };
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("h2-checked-in");
    let marker_text = marker.display().to_string();
    let off: &[(&str, &str)] = &[];
    // The cluster stage alone: a stopped rank would hold up a collective.
    let mut argv = run_args("15s");
    argv.extend(["--collective".to_string(), "off".to_string()]);
    let args = |rank: u32, extra: &[(&str, &str)]| {
        let mut env = launcher_env(&job.cluster, rank, 3);
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        on_host(&job.cluster, &job.files, rank as usize, &argv, &pairs(&env))
    };
    let h0 = args(0, off);
    let h2 = args(2, &[("PREFLIGHT_TEST_CHECKIN_MARKER", &marker_text)]);
    common::wait_for("h2 checks in", || marker.exists());
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &h2.pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {}", h2.pid);
    };
    signal("-STOP");
    let h1 = args(1, off);
    let out: Vec<Outcome> = [h0, h1].into_iter().map(|p| p.finish(MARGIN)).collect();
    signal("-CONT");
    let _ = h2.finish(MARGIN);
    for o in &out {
        let msg = o.message("cluster.reachability");
        println!("{}: {msg}", o.label);
        assert!(msg.starts_with("warn"), "{}: {msg}", o.label);
        assert!(
            msg.contains("h2 accepts connections but does not answer (stopped or starved?)"),
            "{msg}"
        );
        assert!(msg.contains("not a firewall"), "{msg}");
        assert!(!msg.contains("drops") && !msg.contains("DROP"), "{msg}");
        let named = culprit_names(o);
        assert!(!named.iter().any(|n| n == "h0" || n == "h1"), "{named:?}");
    }
    let report = out[0].report();
    let probes = &report.cluster().reachability.probes;
    for p in probes {
        let want = if p.to == 2 { "no_answer" } else { "ok" };
        if p.from != 2 {
            assert_eq!(p.status, want, "{probes:#?}");
        }
    }
}

/// Another program holds host 1's only probe port (anyone can bind a
/// fixed port before a job): host 1 probes from an ephemeral port, which
/// its check-in announces; the job is ready, and rank 0's report says who
/// holds the range.
#[test]
fn a_host_whose_probe_port_range_is_taken_probes_elsewhere_and_says_who_holds_it() {
    let _shared = crate::common::shared();
    let Some(job) = job(3, None) else { return };
    let holder = job.cluster.listen(1, 29601, &[]);
    let ports: &[(&str, &str)] = &[("PREFLIGHT_PROBE_PORTS", "29601")];
    let out = job.all("15s", &[(0, ports), (1, ports), (2, ports)]);
    all_exit(&out, 0);
    let report = out[0].report();
    let c = report.cluster();
    assert!(
        c.warnings.iter().any(|w| w.contains(&format!(
            "h1: every port of the probe range 29601 is taken (by pid {holder} (user root) "
        ))),
        "{report}"
    );
    let addr = c.nodes[1].probe_addr.as_deref().unwrap();
    assert!(!addr.ends_with(":29601"), "{addr}");
    for p in &c.reachability.probes {
        assert_eq!(p.status, "ok", "{p:?}");
    }
}

/// `run` with the cluster checks and the node's own firewall check (its
/// evidence), no collective stage: the verdict is what is judged.
fn with_firewall_check(timeout: &str) -> Vec<String> {
    let mut args = run_args(timeout);
    args.extend(
        [
            "--checks",
            concat!(env!("CARGO_MANIFEST_DIR"), "/checks/network.yaml"),
            "--only",
            "cluster",
            "--only",
            "net.firewall",
            "--collective",
            "off",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args
}

fn culprit_names(o: &Outcome) -> Vec<String> {
    o.report()
        .cluster()
        .culprits
        .iter()
        .map(|c| c.node.clone())
        .collect()
}

/// Two hosts, B (h1) drops new inbound TCP on 1024-65535 with nft: A
/// cannot reach B, B reaches A. B's own firewall check quotes the rule,
/// so B is the culprit, and the healthy master is not.
#[test]
fn two_hosts_with_an_inbound_drop_on_one_blame_only_that_one() {
    let _shared = crate::common::shared();
    let Some(job) = job(2, None) else { return };
    let c = &job.cluster;
    c.nft_rule(
        1,
        "input",
        &["ct", "state", "new", "tcp", "dport", "1024-65535", "drop"],
    );
    let procs: Vec<Proc> = (0..2)
        .map(|h| {
            let env = launcher_env(c, h, 2);
            on_host(
                c,
                &job.files,
                h as usize,
                &with_firewall_check("15s"),
                &pairs(&env),
            )
        })
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 1);
    for o in &out {
        assert_eq!(culprit_names(o), ["h1"], "{}", o.stdout);
    }
    let msg = out[0].message("cluster.reachability");
    assert!(
        msg.contains("h1 drops incoming connections")
            && msg.contains("its own firewall check found a blocking rule"),
        "{msg}"
    );
    assert!(!msg.contains("h0 reaches none"), "{msg}");
}

/// Three hosts, A (h0, the master) cannot open connections out (an
/// output chain drops `ct state new` on eth0): both peers agree, so A is
/// the culprit and nobody else.
#[test]
fn three_hosts_with_one_hosts_outbound_blocked_blame_that_host() {
    let _shared = crate::common::shared();
    let Some(job) = job(3, None) else { return };
    let c = &job.cluster;
    c.nft_rule(
        0,
        "output",
        &[
            "oifname",
            "eth0",
            "ct",
            "state",
            "new",
            "tcp",
            "dport",
            "1024-65535",
            "drop",
        ],
    );
    let args = {
        let mut a = run_args("15s");
        a.extend(["--collective", "off"].iter().map(|s| s.to_string()));
        a
    };
    let procs: Vec<Proc> = (0..3)
        .map(|h| {
            let env = launcher_env(c, h, 3);
            on_host(c, &job.files, h as usize, &args, &pairs(&env))
        })
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 1);
    for o in &out {
        assert_eq!(culprit_names(o), ["h0"], "{}", o.stdout);
    }
    let msg = out[0].message("cluster.reachability");
    assert!(msg.contains("h0 reaches none of its peers"), "{msg}");
}

/// A (h0) and B (h2) on two subnets with a router (host 1) between them
/// whose FORWARD chain drops new connections from A to B: A cannot reach
/// B, B reaches A, and neither has a rule. The link is named; nobody is
/// blamed, so nobody would be drained.
#[test]
fn a_filter_between_two_hosts_names_the_link_and_blames_nobody() {
    let _shared = crate::common::shared();
    let Some(mut cluster) = Cluster::new(2) else {
        return;
    };
    let x = cluster.subnet;
    let other = format!("10.232.{x}.");
    let routes = std::process::Command::new("ip")
        .args(["-4", "addr"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&routes.stdout).contains(&other),
        "{other}0/24 is in use on this machine"
    );
    // Host 2 (B) behind host 1 (the router), on 10.232.X.0/24.
    let b_ns = format!("{}-b", cluster.hosts[1].ns);
    let b_addr: std::net::Ipv4Addr = format!("10.232.{x}.1").parse().unwrap();
    let ip = |args: &[&str]| {
        let o = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    ip(&["netns", "add", &b_ns]);
    cluster.hosts.push(common::netns::Host {
        ns: b_ns.clone(),
        addr: b_addr,
        iface: "eth0",
    });
    let r_ns = cluster.hosts[1].ns.clone();
    let r_link = format!("pfr{x}b{}", std::process::id() % 10000);
    ip(&[
        "-n", &r_ns, "link", "add", &r_link, "type", "veth", "peer", "name", "eth0", "netns", &b_ns,
    ]);
    ip(&[
        "-n",
        &r_ns,
        "addr",
        "add",
        &format!("10.232.{x}.254/24"),
        "dev",
        &r_link,
    ]);
    ip(&["-n", &r_ns, "link", "set", &r_link, "up"]);
    ip(&["-n", &b_ns, "link", "set", "lo", "up"]);
    ip(&[
        "-n",
        &b_ns,
        "addr",
        "add",
        &format!("{b_addr}/24"),
        "dev",
        "eth0",
    ]);
    ip(&["-n", &b_ns, "link", "set", "eth0", "up"]);
    ip(&[
        "-n",
        &b_ns,
        "route",
        "add",
        "default",
        "via",
        &format!("10.232.{x}.254"),
    ]);
    ip(&[
        "-n",
        &cluster.hosts[0].ns,
        "route",
        "add",
        &format!("10.232.{x}.0/24"),
        "via",
        &cluster.addr(1),
    ]);
    cluster.must(1, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let a = cluster.addr(0);
    cluster.iptables(
        1,
        &[
            "-A",
            "FORWARD",
            "-s",
            &a,
            "-d",
            &b_addr.to_string(),
            "-p",
            "tcp",
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-j",
            "DROP",
        ],
    );
    let files = cluster::host_files_named(&cluster, &[(0, "h0"), (2, "h2")]);
    let procs: Vec<Proc> = [(0usize, 0u32), (2, 1)]
        .iter()
        .map(|&(host, rank)| {
            let env = [
                ("RANK", rank.to_string()),
                ("WORLD_SIZE", "2".to_string()),
                ("LOCAL_RANK", "0".to_string()),
                ("LOCAL_WORLD_SIZE", "1".to_string()),
                ("MASTER_ADDR", a.clone()),
                ("MASTER_PORT", "29500".to_string()),
                (
                    "PREFLIGHT_TOKEN",
                    "649ed7307185c7eed188c8184b9e00a0".to_string(),
                ),
            ];
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            cluster::on_host(&cluster, &files, host, &with_firewall_check("15s"), &env)
        })
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 1);
    for o in &out {
        assert_eq!(culprit_names(o), Vec::<String>::new(), "{}", o.stdout);
        assert_eq!(o.status("net.firewall"), "pass", "{}", o.stdout);
    }
    let findings = out[0].report().cluster().reachability.findings.clone();
    assert_eq!(
        findings,
        [
            "h0 to h2 fails (timed_out): h2's inbound or h0's outbound is filtered, or something between them is (h2 reaches h0; neither node's own checks found a rule)"
        ],
        "{}",
        out[0].stdout
    );
}
