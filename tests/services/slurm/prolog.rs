//! The prolog in real Slurm: a firewalled node, a master whose traffic is
//! blocked or that nobody reaches, a filter between two nodes, strangers on
//! the probe and rendezvous ports; which node is drained and which job held.

use super::*;

/// The prolog's settings where the node's own firewall check is part of
/// the evidence: the cluster stage with the `firewall` tag selected.
const FIREWALL_SITE: &str = "report_dir: {dir}/reports/%n\n\
                             prolog:\n  cluster: true\n  only: [cluster, site, firewall]\n  \
                             ports: 29400-29409\n  probe_ports: 29450-29459\n  timeout: 10s\n";

/// Waits until `culprit` is drained by preflight (its reason, returned),
/// and checks that no other node is drained or has a reason.
fn drained_alone(s: &Slurm, job: &str, culprit: &str) -> String {
    assert!(
        wait_until(LIMIT, || s.state(culprit) == "drain"),
        "{culprit} was not drained: {}\n{}",
        s.sinfo(),
        job_state(s, job)
    );
    for healthy in ["h1", "h2", "h3"].into_iter().filter(|n| *n != culprit) {
        assert!(!s.state(healthy).starts_with("drain"), "{}", s.sinfo());
        assert_eq!(s.reason(healthy), "none", "{}", s.sinfo());
    }
    let reason = s.reason(culprit);
    assert!(reason.starts_with("preflight: "), "{reason}");
    reason
}

#[test]
fn the_prolog_drains_only_the_firewalled_node_and_the_job_starts_once_it_is_fixed() {
    let _s = serial();
    let settings = "report_dir: {dir}/reports/%n\n\
                    prolog:\n  cluster: true\n  only: [cluster, site]\n  ports: 29400-29409\n  \
                    probe_ports: 29450-29459\n  timeout: 10s\n";
    let Some(s) = with_prolog(settings) else {
        return;
    };
    let d = s.dir.path().to_path_buf();

    // Healthy: the prolog passes on every node and the job runs.
    let job = sbatch(&s, &d, "ran-healthy");
    assert!(
        wait_until(LIMIT, || d.join("ran-healthy").exists()),
        "the job did not run: {} {}\n{}",
        job_state(&s, &job),
        s.sinfo(),
        s.log("ctld")
    );
    let report = master_report(&d, &job);
    assert_eq!(report.verdict, Verdict::Ready, "{report}");
    assert_eq!(report.cluster().nodes.len(), 3);
    assert!(
        report.cluster().token.starts_with("PREFLIGHT_TOKEN"),
        "the site key's secret: {report}"
    );

    // h2's firewall drops the probe ports: only h2 is drained, naming
    // the unreachable port, and the job's script does not run.
    drop_tcp(&s, 1, "29450:29459");
    let job = sbatch(&s, &d, "ran-faulty");
    let reason = drained_alone(&s, &job, "h2");
    assert!(
        reason.starts_with("preflight: cluster.reachability:"),
        "{reason}"
    );
    assert!(
        reason.contains("h2 drops incoming connections (a firewall DROP rule?)"),
        "{reason}"
    );
    assert!(
        wait_until(LIMIT, || job_state(&s, &job).starts_with("PENDING")),
        "{}",
        job_state(&s, &job)
    );
    // Pending again after its prolog failed: the script, which comes after
    // the prolog, never began (its file would be there by now), and a
    // pending job cannot begin it. No wait makes this truer.
    assert!(
        !d.join("ran-faulty").exists(),
        "the job ran on a faulty allocation"
    );
    // Its owner sees why in the job's comment.
    let shown =
        String::from_utf8_lossy(&s.run("scontrol", &["show", "job", &job]).stdout).into_owned();
    assert!(
        shown.contains("Comment=preflight: not ready: h2 drained (cluster.reachability:"),
        "{shown}"
    );

    // Fixed and resumed: the job runs.
    s.net.iptables(1, &["-F", "INPUT"]);
    s.scontrol(&["update", "nodename=h2", "state=resume"]);
    let _ = s.run("scontrol", &["release", &job]);
    // Slurm holds a requeued job back for about two minutes (BeginTime).
    s.scontrol(&["update", &format!("jobid={job}"), "starttime=now"]);
    assert!(
        wait_until(LIMIT, || d.join("ran-faulty").exists()),
        "the job did not run once h2 was fixed: {}\n{}",
        job_state(&s, &job),
        s.sinfo()
    );
}

/// Three nodes, the master h1 cannot open connections out (an output
/// chain drops new TCP on eth0 but Slurm's own): both peers agree, so
/// the prolog drains h1 alone.
#[test]
fn the_prolog_drains_the_master_whose_outgoing_traffic_is_blocked_and_no_other() {
    let _s = serial();
    let settings = "report_dir: {dir}/reports/%n\n\
                    prolog:\n  cluster: true\n  only: [cluster, site]\n  ports: 29400-29409\n  \
                    probe_ports: 29450-29459\n  timeout: 10s\n";
    let Some(s) = with_prolog(settings) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    drop_new_probes(&s, 0, "output");
    let job = sbatch(&s, &d, "ran");
    let reason = drained_alone(&s, &job, "h1");
    assert!(
        reason.starts_with("preflight: cluster.reachability"),
        "{reason}"
    );
    assert!(
        wait_until(LIMIT, || job_state(&s, &job).starts_with("PENDING")),
        "{}",
        job_state(&s, &job)
    );
    assert!(
        !d.join("ran").exists(),
        "the job ran on a faulty allocation"
    );
}

/// A two-node job whose second node drops incoming connections to the
/// probe ports: only h1 fails to reach h2, so the probes alone cannot say
/// which of the two is at fault; h2's own firewall check, which quotes
/// the rule, decides. h2 is drained, the master is not.
#[test]
fn in_a_two_node_job_the_node_whose_own_firewall_drops_the_probes_is_drained() {
    let _s = serial();
    let Some(s) = with_prolog(FIREWALL_SITE) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    drop_new_probes(&s, 1, "input");
    let job = sbatch_on(&s, &d, "ran", &["-N2", "-w", "h1,h2"]);
    let reason = drained_alone(&s, &job, "h2");
    assert!(
        reason.starts_with("preflight: cluster.reachability: h2 drops incoming connections"),
        "{reason}"
    );
    assert!(reason.contains("its own firewall check found"), "{reason}");
    let report = master_report(&d, &job);
    let culprits: Vec<&str> = report
        .cluster()
        .culprits
        .iter()
        .map(|c| c.node.as_str())
        .collect();
    assert_eq!(culprits, ["h2"], "{report}");
    assert!(
        !d.join("ran").exists(),
        "the job ran on a faulty allocation"
    );
}

/// A stranger (nobody) on node `i` holds `ports` (every address) before
/// the job starts: listening, accepting nobody.
fn squat(s: &Slurm, i: usize, ports: &[u16]) {
    let list = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let script = format!(
        "import socket, sys, time\nheld = []\nfor p in [{list}]:\n    s = socket.socket()\n    s.bind(('0.0.0.0', p))\n    s.listen(64)\n    held.append(s)\nprint('holding', flush=True)\ntime.sleep(600)\n"
    );
    s.net.spawn(
        i,
        &["runuser", "-u", "nobody", "--", "python3", "-c", &script],
        true,
    );
}

/// The prolog's settings for the squatting tests: the cluster stage,
/// fixed rendezvous and probe ranges, as a site would set them.
const SQUATTED_SITE: &str = "report_dir: {dir}/reports/%n\n\
                             prolog:\n  cluster: true\n  only: [cluster, site]\n  \
                             ports: 29400-29409\n  probe_ports: 29450-29459\n  timeout: 15s\n";

/// A stranger binds every port of h2's probe range before the job: the
/// job still runs, nobody is drained, and rank 0's report and the job's
/// comment name the stranger's hold.
#[test]
fn a_stranger_holding_the_probe_ports_drains_nobody_and_the_job_runs() {
    let _s = serial();
    let Some(s) = with_prolog(SQUATTED_SITE) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    squat(&s, 1, &(29450..=29459).collect::<Vec<u16>>());
    let job = sbatch_lasting(&s, &d, "ran");
    let o = s.run("scontrol", &["release", &job]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        wait_until(LIMIT, || d.join("ran").exists()),
        "the job did not run: {}\n{}",
        job_state(&s, &job),
        s.sinfo()
    );
    for n in ["h1", "h2", "h3"] {
        assert!(!s.state(n).starts_with("drain"), "{}", s.sinfo());
    }
    let report = master_report(&d, &job);
    assert_eq!(report.verdict, Verdict::Ready, "{report}");
    let warnings = report.cluster().warnings.join("\n");
    assert!(
        warnings.contains("h2: every port of the probe range 29450-29459 is taken (by pid ")
            && warnings.contains("(user nobody)"),
        "{report}"
    );
    // The job's owner reads who held them in its comment.
    let comment = job_comment(&s, &job);
    assert!(
        comment.contains("strangers hold a probe range") && comment.contains("(user nobody)"),
        "{comment}"
    );
}

/// The port the prolog picks for `job`: the site key's HMAC of the job
/// id, hashed under a label (`auth::job_secret`, `auth::secret_pick`),
/// into the site's range 29400-29409. Computed here as only a holder of
/// the site key could; a stranger, who reads the job id in `squeue` but
/// not the key, cannot.
fn prolog_port(s: &Slurm, job: &str) -> u16 {
    let key = s.dir.path().join("etc/site.key");
    let code = format!(
        "import hashlib, hmac\n\
         key = open('{}').read().strip().encode()\n\
         secret = hmac.new(key, b'preflight slurm job:' + b'{job}', hashlib.sha256).hexdigest()\n\
         pick = int.from_bytes(hashlib.sha256(('preflight pick|rendezvous port|' + secret).encode()).digest()[:8], 'big')\n\
         print(29400 + pick % 10)\n",
        key.display()
    );
    let o = std::process::Command::new("python3")
        .args(["-c", &code])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// The rendezvous port is picked by the job's secret, which no user can
/// compute; someone who knows it anyway (the test, from the site key)
/// binds it on the master before the prolog runs: rank 0 serves on the
/// next port of the range, the ranks find it by its proof, and the job
/// runs; nobody is drained, nothing is held.
#[test]
fn a_stranger_holding_the_rendezvous_port_does_not_stop_the_job() {
    let _s = serial();
    let Some(s) = with_prolog(SQUATTED_SITE) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    let job = sbatch_on(&s, &d, "ran", &["-N3", "--hold"]);
    let port = prolog_port(&s, &job);
    squat(&s, 0, &[port]);
    let o = s.run("scontrol", &["release", &job]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        wait_until(LIMIT, || d.join("ran").exists()),
        "the job did not run: {}\n{}",
        job_state(&s, &job),
        s.sinfo()
    );
    for n in ["h1", "h2", "h3"] {
        assert!(!s.state(n).starts_with("drain"), "{}", s.sinfo());
    }
    let report = master_report(&d, &job);
    assert_eq!(report.verdict, Verdict::Ready, "{report}");
    let warnings = report.cluster().warnings.join("\n");
    assert!(
        warnings.contains(&format!("MASTER_PORT {port} on "))
            && warnings.contains("was taken: rank 0 serves on")
            && warnings.contains("(user nobody)"),
        "{report}"
    );
}

/// A filter between h1 and h2 (on the bridge, on neither node) drops
/// h1's probes to h2: h3 reaches h2, h2 reaches h1, and no node's own
/// checks find a rule. Nobody can be blamed: the link is named, the job
/// is held, and no node is drained.
#[test]
fn a_filter_between_two_nodes_holds_the_job_and_drains_no_node() {
    let _s = serial();
    let Some(s) = with_prolog(FIREWALL_SITE) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    s.net.filter_between(0, 1, "29450-29459");
    let job = sbatch(&s, &d, "ran");
    assert!(
        wait_until(LIMIT, || is_held(&job_state(&s, &job))),
        "the job was not held: {}\n{}",
        job_state(&s, &job),
        s.sinfo()
    );
    for n in ["h1", "h2", "h3"] {
        assert!(!s.state(n).starts_with("drain"), "{}", s.sinfo());
    }
    assert!(
        !d.join("ran").exists(),
        "the job ran on an allocation that is not ready"
    );
    let shown =
        String::from_utf8_lossy(&s.run("scontrol", &["show", "job", &job]).stdout).into_owned();
    assert!(
        shown.contains("Comment=preflight: cluster.reachability: h1 to h2 fails"),
        "{shown}"
    );
}

#[test]
fn a_master_nobody_can_reach_holds_the_job_back_and_drains_no_node() {
    let _s = serial();
    let settings = "report_dir: {dir}/reports/%n\n\
                    prolog:\n  cluster: true\n  only: [cluster, site]\n  ports: 29400-29409\n  \
                    timeout: 6s\n";
    let Some(s) = with_prolog(settings) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    // The first node (the master) drops the rendezvous ports: the others
    // never arrive, and whether they are dead or cut off cannot be told.
    drop_tcp(&s, 0, "29400:29409");
    let job = sbatch(&s, &d, "ran");
    assert!(
        wait_until(LIMIT, || is_held(&job_state(&s, &job))),
        "the job was not held: {}\n{}",
        job_state(&s, &job),
        s.sinfo()
    );
    assert!(
        !d.join("ran").exists(),
        "the job ran on an allocation that is not ready"
    );
    for n in ["h1", "h2", "h3"] {
        assert!(!s.state(n).starts_with("drain"), "{}", s.sinfo());
    }
    let shown =
        String::from_utf8_lossy(&s.run("scontrol", &["show", "job", &job]).stdout).into_owned();
    assert!(
        shown.contains("Comment=preflight: cluster.barrier:"),
        "{shown}"
    );
}

/// A stranger (user nobody) binds every port of the rendezvous range on
/// rank 0's node before the prolog: rank 0 cannot serve at all. The job
/// runs anyway, unchecked, its comment naming the holder; no node is
/// drained. With `on_squat: hold` the same job is held, and says why.
#[test]
fn a_stranger_holding_the_whole_rendezvous_range_holds_no_job_unless_the_site_says_so() {
    let _s = serial();
    for hold in [false, true] {
        let site = if hold {
            SQUATTED_SITE.replace("  timeout: 15s\n", "  timeout: 15s\n  on_squat: hold\n")
        } else {
            SQUATTED_SITE.to_string()
        };
        let Some(s) = with_prolog(&site) else {
            return;
        };
        let d = s.dir.path().to_path_buf();
        squat(&s, 0, &(29400..=29409).collect::<Vec<u16>>());
        let job = sbatch_lasting(&s, &d, "ran");
        let o = s.run("scontrol", &["release", &job]);
        assert!(o.status.success(), "{}", text(&o));
        if hold {
            assert!(
                wait_until(LIMIT, || is_held(&job_state(&s, &job))),
                "not held: {}",
                job_state(&s, &job)
            );
            assert!(!d.join("ran").exists());
        } else {
            assert!(
                wait_until(LIMIT, || d.join("ran").exists()),
                "the job did not run: {}\n{}",
                job_state(&s, &job),
                s.sinfo()
            );
        }
        let comment = job_comment(&s, &job);
        assert!(
            comment.contains("strangers hold the rendezvous")
                && comment.contains("(user nobody)")
                && comment.contains(if hold { "on_squat: hold" } else { "preflight:" }),
            "{comment}"
        );
        for n in ["h1", "h2", "h3"] {
            assert!(!s.state(n).starts_with("drain"), "{}", s.sinfo());
        }
        if !hold {
            let warnings = master_report(&d, &job).cluster().warnings.join("\n");
            assert!(
                warnings.contains("the job runs without preflight's gate"),
                "{warnings}"
            );
        }
    }
}
