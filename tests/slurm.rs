//! `preflight slurm` on a real Slurm 22.05 cluster built by the test
//! (munged, slurmctld, one slurmd per network namespace with its own
//! hostname; see tests/common/slurm.rs): the health check slurmd runs
//! drains the faulty node with a reason naming the check and resumes it
//! once fixed, never an admin's drain; `incomplete` follows the setting
//! and a hanging check leaves no process behind; the prolog's cluster
//! stage drains only the node whose firewall drops the probes, and the
//! job's script never runs on that allocation; srun gating.
//!
//! The wrappers slurmd runs are contrib/slurm's, started through a
//! two-line script that tells them where the binary and the settings are
//! (slurmd gives them no environment to carry that).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use common::BIN;
use common::slurm::{Options, Slurm, wait_until};

/// One Slurm cluster at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const CONTRIB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/contrib/slurm");
const LIMIT: Duration = Duration::from_secs(60);

/// The site configuration: settings.yaml and checks.d/site.yaml with a
/// check that fails on a node whose fault file exists, and one that hangs
/// where its hang file exists.
fn site(dir: &Path, settings: &str) -> PathBuf {
    let etc = dir.join("etc");
    std::fs::create_dir_all(etc.join("checks.d")).unwrap();
    std::fs::create_dir_all(dir.join("faults")).unwrap();
    std::fs::write(
        etc.join("settings.yaml"),
        settings.replace("{dir}", &dir.display().to_string()),
    )
    .unwrap();
    let faults = dir.join("faults").display().to_string();
    std::fs::write(
        etc.join("checks.d/site.yaml"),
        format!(
            "checks:\n\
             \x20 - id: site.fault_file\n    kind: command\n    tags: [site]\n\
             \x20   argv: [sh, -c, 'test ! -e {faults}/$SLURMD_NODENAME']\n\
             \x20   hint: remove the planted fault\n\
             \x20 - id: site.hang\n    kind: command\n    tags: [site]\n    timeout: 60s\n\
             \x20   argv: [sh, -c, 'if test -e {faults}/hang-$SLURMD_NODENAME; then exec sleep 300; fi']\n"
        ),
    )
    .unwrap();
    let key = etc.join("site.key");
    std::fs::write(&key, "ec26e9aef7eb8a3378e3accc3c82a2fb\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    etc
}

/// `dir/NAME`: contrib/slurm/NAME started with the binary and settings.
fn wrapper(dir: &Path, name: &str, etc: &Path, args: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nexport PREFLIGHT={BIN} PREFLIGHT_CONFIG_DIR={}\nexec sh {CONTRIB}/{name} {args}\n",
            etc.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Node `i`'s firewall drops incoming TCP to `ports` (`first:last`).
fn drop_tcp(s: &Slurm, i: usize, ports: &str) {
    s.net.iptables(
        i,
        &[
            "-A", "INPUT", "-i", "eth0", "-p", "tcp", "--dport", ports, "-j", "DROP",
        ],
    );
}

/// Node `i`'s nft drops new TCP on eth0 to the probe ports (29450-29459)
/// in `hook`: `input` (its peers cannot reach it) or `output` (it reaches
/// none of them).
fn drop_new_probes(s: &Slurm, i: usize, hook: &str) {
    let iface = if hook == "output" {
        "oifname"
    } else {
        "iifname"
    };
    s.net.nft_rule(
        i,
        hook,
        &[
            iface,
            "eth0",
            "ct",
            "state",
            "new",
            "tcp",
            "dport",
            "29450-29459",
            "drop",
        ],
    );
}

/// A 3-node cluster whose prolog is contrib's, with `settings`.
fn with_prolog(settings: &str) -> Option<Slurm> {
    let before = |d: &Path| {
        let etc = site(d, settings);
        wrapper(d, "preflight-prolog", &etc, "");
    };
    let extra = [
        "Prolog={dir}/preflight-prolog".to_string(),
        "PrologFlags=Alloc".to_string(),
    ];
    Slurm::start(Options {
        nodes: 3,
        extra: &extra,
        before_start: &before,
    })
}

fn text(o: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Processes of node `i`'s namespace whose command line contains `what`.
fn processes_in(s: &Slurm, i: usize, what: &str) -> Vec<String> {
    let pids = std::process::Command::new("ip")
        .args(["netns", "pids", &s.net.hosts[i].ns])
        .output()
        .unwrap();
    String::from_utf8_lossy(&pids.stdout)
        .split_whitespace()
        .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(what))
        .collect()
}

#[test]
fn the_health_check_drains_the_faulty_node_resumes_it_and_never_an_admins_drain() {
    let _s = serial();
    let settings = "report_dir: {dir}/reports/%n\nhealthcheck:\n  only: [site]\n  timeout: 2s\n";
    let prepared = Mutex::new(None::<PathBuf>);
    let before = |d: &Path| {
        let etc = site(d, settings);
        wrapper(d, "preflight-healthcheck", &etc, "");
        // slurmd runs the health check as it starts: h3 is faulty then.
        std::fs::write(d.join("faults/h3"), "").unwrap();
        *prepared.lock().unwrap() = Some(etc);
    };
    let extra = [
        "HealthCheckProgram={dir}/preflight-healthcheck".to_string(),
        "HealthCheckInterval=3600".to_string(),
        "HealthCheckNodeState=ANY".to_string(),
    ];
    let Some(s) = Slurm::start(Options {
        nodes: 3,
        extra: &extra,
        before_start: &before,
    }) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    let etc = prepared.lock().unwrap().clone().unwrap();
    let hc = d.join("preflight-healthcheck").display().to_string();

    // Run by slurmd itself, with its empty environment: scontrol and
    // slurm.conf were found without SLURM_CONF.
    assert!(
        wait_until(LIMIT, || s
            .reason("h3")
            .starts_with("preflight: site.fault_file:")),
        "h3 was not drained by the health check slurmd ran:\n{}\n{}",
        s.sinfo(),
        s.log("h3")
    );
    assert_eq!(s.state("h1"), "idle", "{}", s.sinfo());
    assert!(d.join("reports/h3/healthcheck.json").exists());

    // By hand, as an operator runs it (SLURMD_NODENAME, and SLURM_CONF
    // since no slurmd is its parent and this slurm.conf is not in
    // /etc/slurm).
    let conf = s.conf.display().to_string();
    let node = |n: &'static str| [("SLURMD_NODENAME", n), ("SLURM_CONF", conf.as_str())];
    std::fs::write(d.join("faults/h2"), "").unwrap();
    let o = s.on_node(1, &hc, &[], &node("h2"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(s.state("h2"), "drain", "{}", s.sinfo());
    let reason = s.reason("h2");
    assert!(
        reason.starts_with("preflight: site.fault_file: sh ended with exit 1"),
        "{reason}"
    );
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.join("reports/h2/healthcheck.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["verdict"], "not_ready", "{report:#}");

    // Fixed: resumed, because the reason is preflight's.
    std::fs::remove_file(d.join("faults/h2")).unwrap();
    let o = s.on_node(1, &hc, &[], &node("h2"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("resumed"),
        "{}",
        text(&o)
    );
    assert!(s.wait_state("h2", "idle", LIMIT), "{}", s.sinfo());

    // An admin's drain stays through a passing health check.
    s.scontrol(&["update", "nodename=h1", "state=drain", "reason=maintenance"]);
    let o = s.on_node(0, &hc, &[], &node("h1"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(s.state("h1"), "drain", "{}", s.sinfo());
    assert_eq!(s.reason("h1"), "maintenance");

    // A check that hangs: the health check still ends, as incomplete, and
    // with `incomplete: ignore` (the default) the node stays in service;
    // no `sleep 300` is left behind.
    std::fs::write(d.join("faults/hang-h2"), "").unwrap();
    let o = s.on_node(1, &hc, &[], &node("h2"));
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("INCOMPLETE"),
        "{}",
        text(&o)
    );
    assert_eq!(s.state("h2"), "idle", "{}", s.sinfo());
    assert!(processes_in(&s, 1, "sleep 300").is_empty());
    // With `incomplete: drain`, the same run drains it, naming the check.
    std::fs::write(
        etc.join("settings.yaml"),
        format!("{settings}  incomplete: drain\n").replace("{dir}", &d.display().to_string()),
    )
    .unwrap();
    let o = s.on_node(1, &hc, &[], &node("h2"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        s.reason("h2")
            .starts_with("preflight: site.hang: could not be evaluated"),
        "{}",
        s.sinfo()
    );
    assert!(processes_in(&s, 1, "sleep 300").is_empty());
}

#[test]
fn a_settings_error_names_the_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("settings.yaml"),
        "healthcheck:\n  timeout: 45\n",
    )
    .unwrap();
    let o = std::process::Command::new(BIN)
        .args(["slurm", "healthcheck"])
        .env_clear()
        .env("PREFLIGHT_CONFIG_DIR", dir.path())
        .env("SLURMD_NODENAME", "h1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("settings.yaml:2:") && err.contains("healthcheck.timeout"),
        "{err}"
    );
}

/// slurmd starts Prolog, Epilog and HealthCheckProgram with no PATH at
/// all; a program started that way still finds the system's tools (nft
/// is in /usr/sbin, which the C library's fallback search path lacks),
/// or every check that runs one skips and the node's evidence is lost.
#[test]
fn a_program_slurmd_starts_without_path_still_finds_the_systems_tools() {
    if !Path::new("/usr/sbin/nft").exists() {
        common::netns::skip_or_panic("nft is not installed in /usr/sbin");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    std::fs::create_dir_all(dir.path().join("checks.d")).unwrap();
    std::fs::write(
        dir.path().join("settings.yaml"),
        format!("report_dir: {d}/reports\nscontrol: /bin/true\nhealthcheck:\n  only: [site]\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("checks.d/site.yaml"),
        "checks:\n  - {id: site.nft, kind: command, tags: [site], argv: [nft, --version]}\n",
    )
    .unwrap();
    let o = std::process::Command::new(BIN)
        .args(["slurm", "healthcheck"])
        .env_clear()
        .env("PREFLIGHT_CONFIG_DIR", dir.path())
        .env("SLURMD_NODENAME", "h1")
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("reports/healthcheck.json"))
            .unwrap_or_else(|e| panic!("no report ({e}): {}", text(&o))),
    )
    .unwrap();
    let check = &report["checks"][0];
    assert_eq!(check["id"], "site.nft", "{report:#}");
    assert_eq!(check["status"], "pass", "{report:#}");
}

/// `squeue`'s state and reason for a job, e.g. `PENDING JobHeldAdmin`.
fn job_state(s: &Slurm, job: &str) -> String {
    let o = s.run("squeue", &["-h", "-j", job, "-o", "%T %r"]);
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Held, in either of squeue's words: `job requeued in held state` while
/// the requeue settles, `JobHeldAdmin` after.
fn is_held(state: &str) -> bool {
    state.to_ascii_lowercase().contains("held")
}

/// A batch job on all three nodes that touches `marker` when it runs.
fn sbatch(s: &Slurm, d: &Path, marker: &str) -> String {
    sbatch_on(s, d, marker, &["-N3"])
}

fn sbatch_on(s: &Slurm, d: &Path, marker: &str, shape: &[&str]) -> String {
    let dir = d.display().to_string();
    let touch = format!("touch {}", d.join(marker).display());
    let mut args = vec!["--parsable"];
    args.extend_from_slice(shape);
    args.extend(["--chdir", &dir, "-o", "/dev/null", "--wrap", &touch]);
    let o = s.run("sbatch", &args);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The first node's (rank 0's) prolog report of `job`.
fn master_report(d: &Path, job: &str) -> serde_json::Value {
    let file = d.join(format!("reports/h1/prolog-{job}.json"));
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_json::from_str(&text).unwrap()
}

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
    assert_eq!(report["verdict"], "ready", "{report:#}");
    assert_eq!(report["cluster"]["nodes"].as_array().map(Vec::len), Some(3));
    assert!(
        report["cluster"]["token"]
            .as_str()
            .unwrap()
            .starts_with("PREFLIGHT_TOKEN"),
        "the site key's secret: {report:#}"
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
    let culprits: Vec<&str> = report["cluster"]["culprits"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["node"].as_str())
        .collect();
    assert_eq!(culprits, ["h2"], "{report:#}");
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
    assert_eq!(report["verdict"], "ready", "{report:#}");
    let warnings = report["cluster"]["warnings"].to_string();
    assert!(
        warnings.contains("h2: every port of the probe range 29450-29459 is taken (by pid ")
            && warnings.contains("(user nobody)"),
        "{report:#}"
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
    assert_eq!(report["verdict"], "ready", "{report:#}");
    let warnings = report["cluster"]["warnings"].to_string();
    assert!(
        warnings.contains(&format!("MASTER_PORT {port} on "))
            && warnings.contains("was taken: rank 0 serves on")
            && warnings.contains("(user nobody)"),
        "{report:#}"
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

/// `srun` of `preflight run` with this cluster's settings: every task's
/// report in DIR/out-TASK, srun's own exit code.
fn srun_preflight(s: &Slurm, d: &Path, tag: &str, shape: &[&str]) -> (i32, Vec<serde_json::Value>) {
    let checks = concat!(env!("CARGO_MANIFEST_DIR"), "/checks/cluster.yaml");
    let out = d.join(format!("{tag}-%t"));
    let mut args: Vec<String> = ["-N3", "--kill-on-bad-exit=1", "-o"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(out.display().to_string());
    args.extend(shape.iter().map(|s| s.to_string()));
    args.extend(
        [
            BIN,
            "run",
            "--no-shipped",
            "--checks",
            checks,
            "--timeout",
            "20s",
            "--format",
            "json",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = s
        .cmd("srun", &argv)
        .env("PREFLIGHT_PROBE_PORTS", "29450-29459")
        .env("PREFLIGHT_TOKEN", "ec26e9aef7eb8a3378e3accc3c82a2fb")
        .output()
        .unwrap();
    let mut reports = Vec::new();
    for t in 0.. {
        let Ok(text) = std::fs::read_to_string(d.join(format!("{tag}-{t}"))) else {
            break;
        };
        reports
            .push(serde_json::from_str(&text).unwrap_or_else(|e| panic!("task {t}: {e}: {text}")));
    }
    (o.status.code().unwrap_or(-1), reports)
}

#[test]
fn srun_gates_on_preflight_run_per_node_and_per_gpu_and_the_sbatch_example_stops_short() {
    let _s = serial();
    let Some(s) = Slurm::start(Options {
        nodes: 3,
        extra: &[],
        before_start: &|_| {},
    }) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    for (tag, shape, tasks) in [
        ("node", &[][..], 3),
        ("gpu", &["--ntasks-per-node=2"][..], 6),
    ] {
        let (code, reports) = srun_preflight(&s, &d, tag, shape);
        assert_eq!(reports.len(), tasks, "{tag}");
        for r in &reports {
            assert_eq!(r["verdict"], "ready", "{tag}: {r:#}");
            assert_eq!(r["cluster"]["world_size"], tasks, "{tag}: {r:#}");
        }
        assert_eq!(code, 0, "{tag}");
    }

    // The README's srun line as printed (`preflight` the binary), in a
    // batch job on the three nodes: every task READY, exit 0.
    let readme = std::process::Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tools/readme-commands.sh"
    ))
    .arg("Run it under torchrun, srun or mpirun")
    .output()
    .unwrap();
    let line = String::from_utf8_lossy(&readme.stdout)
        .lines()
        .find(|l| l.starts_with("srun "))
        .expect("the README's srun line")
        .split_whitespace()
        .map(|w| if w == "preflight" { BIN } else { w })
        .collect::<Vec<_>>()
        .join(" ");
    let out = d.join("readme-srun.out");
    let o = s
        .cmd(
            "sbatch",
            &[
                "--parsable",
                "-N3",
                "--chdir",
                &d.display().to_string(),
                "-o",
                &out.display().to_string(),
                "--wrap",
                &format!("{line}; echo srun-exit=$?"),
            ],
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let job = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let gone = |job: &str| s.run("squeue", &["-h", "-j", job]).stdout.is_empty();
    assert!(wait_until(LIMIT, || gone(&job)), "{}", job_state(&s, &job));
    let printed = std::fs::read_to_string(&out).unwrap_or_default();
    let verdicts: Vec<&str> = printed
        .lines()
        .filter(|l| {
            ["READY  ", "NOT READY  ", "INCOMPLETE  "]
                .iter()
                .any(|v| l.starts_with(v))
        })
        .collect();
    assert_eq!(verdicts.len(), 3, "{line}:\n{printed}");
    assert!(
        verdicts.iter().all(|v| v.starts_with("READY  ")),
        "{printed}"
    );
    assert!(printed.contains("srun-exit=0"), "{printed}");

    // h2 drops the probe ports: every task exits 1 naming h2.
    drop_tcp(&s, 1, "29450:29459");
    let (code, reports) = srun_preflight(&s, &d, "faulty", &[]);
    assert_eq!(code, 1);
    assert_eq!(reports.len(), 3);
    for r in &reports {
        assert_eq!(r["verdict"], "not_ready", "{r:#}");
        let culprits: Vec<&str> = r["cluster"]["culprits"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["node"].as_str())
            .collect();
        assert_eq!(culprits, ["h2"], "{r:#}");
    }

    // The sbatch example with h2 still firewalled: the training step
    // does not run; fixed, it does.
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/contrib/slurm/sbatch-example.sh"
    );
    let submit = |marker: &str| -> String {
        let o = s
            .cmd(
                "sbatch",
                &[
                    "--parsable",
                    "-N3",
                    "--chdir",
                    &d.display().to_string(),
                    "-o",
                    &d.join(format!("{marker}.out")).display().to_string(),
                    example,
                ],
            )
            .env("PREFLIGHT", BIN)
            .env(
                "PREFLIGHT_ARGS",
                format!(
                    "--no-shipped --checks {}/checks/cluster.yaml",
                    env!("CARGO_MANIFEST_DIR")
                ),
            )
            .env("PREFLIGHT_PROBE_PORTS", "29450-29459")
            .env("TRAIN", format!("touch {}", d.join(marker).display()))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let job = submit("trained-faulty");
    assert!(wait_until(LIMIT, || gone(&job)), "{}", job_state(&s, &job));
    let out = std::fs::read_to_string(d.join("trained-faulty.out")).unwrap_or_default();
    assert!(
        !d.join("trained-faulty").exists(),
        "the training ran: {out}"
    );
    assert!(out.contains("the allocation is not ready"), "{out}");
    s.net.iptables(1, &["-F", "INPUT"]);
    let job = submit("trained");
    assert!(wait_until(LIMIT, || gone(&job)), "{}", job_state(&s, &job));
    let out = std::fs::read_to_string(d.join("trained.out")).unwrap_or_default();
    assert!(
        d.join("trained").exists(),
        "the training did not run: {out}"
    );
}

#[test]
fn the_epilog_drains_a_node_where_the_jobs_user_left_a_process() {
    let _s = serial();
    let settings = "report_dir: {dir}/reports/%n\n\
                    epilog:\n  only: [epilog, slurm.leftover_processes]\n";
    let before = |d: &Path| {
        let etc = site(d, settings);
        wrapper(d, "preflight-epilog", &etc, "");
    };
    let extra = ["Epilog={dir}/preflight-epilog".to_string()];
    let Some(s) = Slurm::start(Options {
        nodes: 2,
        extra: &extra,
        before_start: &before,
    }) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    let run_as_nobody = |node: &str, script: &str| {
        let o = s.run(
            "sbatch",
            &[
                "--parsable",
                "--uid=nobody",
                "-w",
                node,
                "--chdir",
                "/",
                "-o",
                "/dev/null",
                "--wrap",
                script,
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    // A clean job: the epilog passes and the node stays in service.
    let job = run_as_nobody("h1", "true");
    let report = d.join(format!("reports/h1/epilog-{job}.json"));
    assert!(
        wait_until(LIMIT, || report.exists()),
        "no epilog report: {}\n{}",
        s.sinfo(),
        s.log("h1")
    );
    assert!(!s.state("h1").starts_with("drain"), "{}", s.sinfo());

    // A job whose child escaped it (a new session, reparented to init).
    let job = run_as_nobody(
        "h2",
        "setsid sleep 300 < /dev/null > /dev/null 2>&1 & sleep 1",
    );
    assert!(
        wait_until(LIMIT, || s.state("h2") == "drain"),
        "h2 was not drained: {}\n{}",
        s.sinfo(),
        s.log("h2")
    );
    let reason = s.reason("h2");
    assert!(
        reason.starts_with(
            "preflight: slurm.leftover_processes: 1 process of uid 65534 left after the job:"
        ) && reason.ends_with(" sleep"),
        "{reason}"
    );
    assert!(d.join(format!("reports/h2/epilog-{job}.json")).exists());
    assert_eq!(processes_in(&s, 1, "sleep 300").len(), 1);
}

#[test]
fn validate_site_checks_the_settings_the_checks_d_and_every_modes_selection() {
    let dir = tempfile::tempdir().unwrap();
    let etc = site(dir.path(), "healthcheck:\n  only: [site]\n");
    let validate = |extra: &[(&str, &str)]| {
        let mut c = std::process::Command::new(BIN);
        c.args(["validate", "--site", "--config-dir"])
            .arg(&etc)
            .env_clear();
        for (k, v) in extra {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let o = validate(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("1 site checklist file"),
        "{}",
        text(&o)
    );

    std::fs::write(etc.join("settings.yaml"), "epilog:\n  only: [sitee]\n").unwrap();
    let o = validate(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("epilog: --only `sitee` matches no check id or tag (did you mean `site`?)"),
        "{err}"
    );

    std::fs::write(etc.join("settings.yaml"), "").unwrap();
    std::fs::write(
        etc.join("checks.d/bad.yaml"),
        "checks:\n  - id: x\n    kind: nope\n",
    )
    .unwrap();
    let o = validate(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.yaml:3:") && err.contains("nope"), "{err}");

    // Ranges a local user can bind whole, or the kernel hands out, are
    // said (exit 0: a site may have its reasons).
    std::fs::remove_file(etc.join("checks.d/bad.yaml")).unwrap();
    std::fs::write(
        etc.join("settings.yaml"),
        "prolog:\n  ports: 29400-29409\n  probe_ports: 40000-40999\n",
    )
    .unwrap();
    let o = validate(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning: prolog.ports 29400-29409 holds 10 ports: any local user can bind them all before a job; the job then runs unchecked (on_squat: run)"),
        "{err}"
    );
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
    let low: u16 = ephemeral
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    if low <= 40999 {
        assert!(
            err.contains("prolog.probe_ports 40000-40999 is inside the kernel's ephemeral range"),
            "{err}"
        );
    }
}

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Benchmark, not a test (`bench/slurm.sh` runs it with the release
/// build): `preflight slurm healthcheck` against LBNL NHC's shipped
/// nhc.conf on the same node, 20 runs each; sbatch to the job's first
/// line with and without the prolog's cluster stage, 3 nodes, 10 jobs
/// each. NHC_DIR: an NHC source tree (its scripts run from it).
#[test]
#[ignore]
fn bench_healthcheck_beside_nhc_and_the_prologs_cost() {
    let _s = serial();
    let runs = 20;
    let nhc_dir = std::env::var("NHC_DIR").ok().map(PathBuf::from);
    for cluster in [false, true] {
        let settings = format!(
            "report_dir: {{dir}}/reports/%n\nprolog:\n  cluster: {cluster}\n  ports: 29400-29409\n"
        );
        let before = |d: &Path| {
            let etc = site(d, &settings);
            wrapper(d, "preflight-healthcheck", &etc, "");
            wrapper(d, "preflight-prolog", &etc, "");
        };
        let mut extra = vec!["PrologFlags=Alloc".to_string()];
        if cluster {
            extra.push("Prolog={dir}/preflight-prolog".into());
        }
        let Some(s) = Slurm::start(Options {
            nodes: 3,
            extra: &extra,
            before_start: &before,
        }) else {
            return;
        };
        let d = s.dir.path().to_path_buf();
        let conf = s.conf.display().to_string();
        if !cluster {
            let hc = d.join("preflight-healthcheck").display().to_string();
            let env = [("SLURMD_NODENAME", "h1"), ("SLURM_CONF", conf.as_str())];
            let mut times = Vec::new();
            for _ in 0..runs {
                let t = std::time::Instant::now();
                let o = s.on_node(0, &hc, &[], &env);
                times.push(t.elapsed().as_secs_f64() * 1000.0);
                assert_eq!(o.status.code(), Some(0), "{}", text(&o));
            }
            let report: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(d.join("reports/h1/healthcheck.json")).unwrap(),
            )
            .unwrap();
            println!(
                "preflight slurm healthcheck (shipped checklist without `slow`, {} checks, ready): median {:.1} ms of {runs}",
                report["checks"].as_array().map_or(0, Vec::len),
                median_ms(times)
            );
            if let Some(nhc) = &nhc_dir {
                let cfg = d.join("nhc.conf");
                let shipped = std::fs::read_to_string(nhc.join("nhc.conf")).unwrap();
                // No sshd in a test host: its slurmd instead.
                std::fs::write(&cfg, shipped.replace("-S sshd", "-S slurmd")).unwrap();
                let confdir = d.join("nhc.d");
                std::fs::create_dir_all(&confdir).unwrap();
                let _ = std::os::unix::fs::symlink(nhc.join("scripts"), confdir.join("scripts"));
                let args = [
                    "-c".to_string(),
                    cfg.display().to_string(),
                    "-D".into(),
                    confdir.display().to_string(),
                    "-l".into(),
                    d.join("nhc.log").display().to_string(),
                    "-t".into(),
                    "30".into(),
                    format!("HELPERDIR={}/helpers", nhc.display()),
                    "NHC_RM=slurm".into(),
                ];
                let argv: Vec<&str> = args.iter().map(String::as_str).collect();
                let prog = nhc.join("nhc").display().to_string();
                let mut times = Vec::new();
                for _ in 0..runs {
                    let t = std::time::Instant::now();
                    let o = s.on_node(0, &prog, &argv, &env);
                    times.push(t.elapsed().as_secs_f64() * 1000.0);
                    assert_eq!(
                        o.status.code(),
                        Some(0),
                        "{}\n{}",
                        text(&o),
                        std::fs::read_to_string(d.join("nhc.log")).unwrap_or_default()
                    );
                }
                let checks = shipped
                    .lines()
                    .filter(|l| l.trim_start().starts_with("* ||"))
                    .count();
                println!(
                    "LBNL NHC ({} shipped nhc.conf lines, NHC_RM=slurm, ready): median {:.1} ms of {runs}",
                    checks,
                    median_ms(times)
                );
            }
        }
        let mut times = Vec::new();
        for i in 0..10 {
            let marker = d.join(format!("first-line-{i}"));
            let t = std::time::Instant::now();
            let job = sbatch(&s, &d, &format!("first-line-{i}"));
            if !wait_until(LIMIT, || marker.exists()) {
                let mut why = String::new();
                for n in ["h1", "h2", "h3"] {
                    let f = d.join(format!("reports/{n}/prolog-{job}.json"));
                    let r: serde_json::Value =
                        serde_json::from_str(&std::fs::read_to_string(&f).unwrap_or_default())
                            .unwrap_or_default();
                    for c in r["checks"].as_array().into_iter().flatten() {
                        if c["status"] != "pass" && c["status"] != "skip" {
                            why.push_str(&format!(
                                "{n}: {} {} {}\n",
                                c["id"], c["status"], c["message"]
                            ));
                        }
                    }
                }
                panic!(
                    "job {job} did not start: {}\n{}\n{why}",
                    job_state(&s, &job),
                    s.sinfo()
                );
            }
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        if cluster {
            let mut took = Vec::new();
            for e in std::fs::read_dir(d.join("reports/h1")).unwrap().flatten() {
                let r: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
                if let Some(ms) = r["duration_ms"].as_f64() {
                    took.push(ms);
                }
            }
            println!(
                "the prolog on the first node (its report's duration: checklist, rendezvous, verdict): median {:.0} ms of {}",
                median_ms(took.clone()),
                took.len()
            );
        }
        println!(
            "sbatch -N3 to the job's first line, prolog {}: median {:.0} ms of 10",
            if cluster {
                "with --cluster (node checks + the allocation's cluster stage)"
            } else {
                "off"
            },
            median_ms(times)
        );
    }
}

/// A drain Slurm refused is said, with what scontrol said, and exit 2:
/// it must not look like a drain that happened.
#[test]
fn a_failing_scontrol_is_reported_not_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("scontrol");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'slurm_update error: Invalid node name specified' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let etc = site(
        dir.path(),
        &format!(
            "report_dir: {{dir}}/reports\nscontrol: {}\nhealthcheck:\n  only: [site]\n",
            fake.display()
        ),
    );
    std::fs::write(dir.path().join("faults/h9"), "").unwrap();
    let o = std::process::Command::new(BIN)
        .args(["slurm", "healthcheck"])
        .env_clear()
        .env("PREFLIGHT_CONFIG_DIR", &etc)
        .env("SLURMD_NODENAME", "h9")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("NOT READY") && out.contains("drain failed"),
        "{out}"
    );
    assert!(
        out.contains("  fail site.fault_file: sh ended with exit 1"),
        "{out}"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("scontrol update nodename=h9 state=drain")
            && err.contains("Invalid node name specified"),
        "{err}"
    );
    // Said once: the failure's words on stderr, not again on stdout.
    assert!(!out.contains("Invalid node name specified"), "{out}");
    assert_eq!(
        err.matches("Invalid node name specified").count(),
        1,
        "{err}"
    );
}

/// The sbatch example's watchdog (contrib/slurm/sbatch-example.sh), with
/// a minute's limit and no gate step: at the
/// warning signal before the time limit, the job's every node diagnosed
/// in steps of the job itself, saved where the epilog looks.
/// `--this-namespace`: here every node shares one process table.
const WATCHDOG_JOB: &str = r#"#!/bin/bash
#SBATCH --time=1
#SBATCH --signal=B:USR1@45
watchdog() {
    # A one-minute limit may warn before torch is up on a busy machine:
    # the test's watchdog looks once rank 1 holds (the hang it is about).
    while [ ! -e "$JOB_MARKER" ]; do sleep 0.2; done
    "$PREFLIGHT" diagnose --slurm --this-namespace --py-spy off \
        --remote-preflight "$PREFLIGHT" --format json \
        --output "$workdir/preflight-diagnose-$SLURM_JOB_ID.json"
    echo $? > "$workdir/watchdog-exit"
}
workdir=$PWD  # the job's working directory (--chdir): where the epilog looks
trap watchdog USR1
export MASTER_ADDR=h1 MASTER_PORT=29511 GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1
export JOB_MODE=stop JOB_RANK=1 JOB_SECONDS=300 HOME=/tmp
srun --ntasks-per-node=1 bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec /usr/bin/python3 "$0"' "$JOB" &
train=$!
while wait "$train"; status=$?; kill -0 "$train" 2>/dev/null; do :; done
exit "$status"
"#;

#[test]
fn a_watchdog_names_the_stuck_rank_across_the_allocation_and_the_timeouts_epilog_drains_its_node() {
    let torch = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import torch.distributed"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !torch {
        common::skip_unless_required("python3-torch is not installed");
        return;
    }
    let _s = serial();
    let settings = "report_dir: {dir}/reports/%n\nepilog:\n  only: [epilog]\n";
    let before = |d: &Path| {
        let etc = site(d, settings);
        // What each epilog said, kept for the test's messages.
        wrapper(
            d,
            "preflight-epilog",
            &etc,
            &format!(">> {}/epilog-$SLURMD_NODENAME.log 2>&1", d.display()),
        );
        std::fs::write(d.join("job.sh"), WATCHDOG_JOB).unwrap();
    };
    let extra = ["Epilog={dir}/preflight-epilog".to_string()];
    let Some(s) = Slurm::start(Options {
        nodes: 2,
        extra: &extra,
        before_start: &before,
    }) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    let job_py = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/diagnose/job.py");
    let o = s
        .cmd("sbatch", &["--parsable", "-N2", "--chdir"])
        .arg(&d)
        .args(["-o", "job.out"])
        .arg(d.join("job.sh"))
        .env("PREFLIGHT", BIN)
        .env("JOB", job_py)
        .env("JOB_MARKER", d.join("held"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let job = String::from_utf8_lossy(&o.stdout).trim().to_string();
    // The limit is a minute; slurmctld looks every 30 s: the warning
    // within 60 s, the end within 90 s, the epilog at once.
    let saved = d.join(format!("preflight-diagnose-{job}.json"));
    assert!(
        wait_until(Duration::from_secs(120), || d
            .join("watchdog-exit")
            .exists()),
        "the watchdog did not run: {}\n{}",
        job_state(&s, &job),
        std::fs::read_to_string(d.join("job.out")).unwrap_or_default()
    );
    let out = std::fs::read_to_string(d.join("job.out")).unwrap_or_default();
    assert!(d.join("held").exists(), "rank 1 never held: {out}");
    let exit = std::fs::read_to_string(d.join("watchdog-exit")).unwrap();
    let diagnosis: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(exit.trim(), "1", "{diagnosis:#}\n{out}");
    assert_eq!(diagnosis["verdict"], "held", "{diagnosis:#}");
    assert_eq!(
        diagnosis["nodes"].as_array().map(Vec::len),
        Some(2),
        "both nodes asked, in steps of the job: {diagnosis:#}"
    );
    let culprits = diagnosis["culprits"].as_array().unwrap();
    assert!(
        culprits.len() == 1 && culprits[0]["rank"] == 1 && culprits[0]["node"] == "h2",
        "{diagnosis:#}"
    );
    // The job runs out of time; h1's epilog (the batch host's) drains h2
    // on the saved evidence, and h1, whose rank waited, stays.
    assert!(
        wait_until(Duration::from_secs(180), || s.state("h2") == "drain"),
        "h2 was not drained: {}\n{}\nh1's epilog: {}",
        s.sinfo(),
        job_state(&s, &job),
        std::fs::read_to_string(d.join("epilog-h1.log")).unwrap_or_default()
    );
    let reason = s.reason("h2");
    assert!(
        reason.starts_with(&format!(
            "preflight: job {job} timed out held up by rank 1 pid "
        )),
        "{reason}"
    );
    assert!(
        wait_until(LIMIT, || d
            .join(format!("reports/h1/epilog-{job}.json"))
            .exists()),
        "h1's epilog did not run"
    );
    assert!(!s.state("h1").starts_with("drain"), "{}", s.sinfo());
    assert_eq!(s.reason("h1"), "none", "{}", s.sinfo());
}

/// A batch job on all three nodes that touches `marker` and then runs a
/// while (its comment stays readable), held until released.
fn sbatch_lasting(s: &Slurm, d: &Path, marker: &str) -> String {
    let dir = d.display().to_string();
    let script = format!("touch {}; sleep 60", d.join(marker).display());
    let o = s.run(
        "sbatch",
        &[
            "--parsable",
            "-N3",
            "--hold",
            "--chdir",
            &dir,
            "-o",
            "/dev/null",
            "--wrap",
            &script,
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn job_comment(s: &Slurm, job: &str) -> String {
    let o = s.run("squeue", &["-h", "-j", job, "-o", "%k"]);
    String::from_utf8_lossy(&o.stdout).trim().to_string()
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
            let warnings = master_report(&d, &job)["cluster"]["warnings"].to_string();
            assert!(
                warnings.contains("the job runs without preflight's gate"),
                "{warnings}"
            );
        }
    }
}

/// The slow tier at the quick tier's cost: the periodic timer's command
/// keeps a slow check's pass, and the next job's prolog reuses it; the
/// health check while a job holds the node reuses it too, and with none
/// kept skips the check rather than run it under the job.
#[test]
fn the_timer_keeps_a_slow_pass_the_prolog_reuses_and_a_busy_health_check_never_runs_it() {
    let _s = serial();
    let settings = "report_dir: {dir}/reports/%n\nstate_dir: {dir}/state/%n\n\
                    healthcheck:\n  only: [site]\n  skip: []\n  timeout: 20s\n\
                    prolog:\n  only: [site]\n  skip: []\n  timeout: 20s\n";
    let before = |d: &Path| {
        let etc = site(d, settings);
        std::fs::write(
            etc.join("checks.d/slow.yaml"),
            format!(
                "checks:\n  - id: site.slow\n    kind: command\n    cache: 1h\n    tags: [site, slow]\n    timeout: 20s\n\
                 \x20   argv: [sh, -c, 'echo run >> {}/slow-$(hostname); sleep 2']\n",
                d.display()
            ),
        )
        .unwrap();
        wrapper(d, "preflight-prolog", &etc, "");
        wrapper(d, "preflight-healthcheck", &etc, "");
    };
    let extra = [
        "Prolog={dir}/preflight-prolog".to_string(),
        "PrologFlags=Alloc".to_string(),
    ];
    let Some(s) = Slurm::start(Options {
        nodes: 1,
        extra: &extra,
        before_start: &before,
    }) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    let runs = || {
        std::fs::read_to_string(d.join("slow-h1"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    // The timer's command (contrib/systemd), as root on the node.
    let etc = d.join("etc");
    let state = d.join("state/h1").display().to_string();
    let o = s.on_node(
        0,
        BIN,
        &[
            "check",
            "--checks",
            &etc.join("checks.d").display().to_string(),
            "--only",
            "site",
            "--state-dir",
            &state,
            "--format",
            "json",
        ],
        // The site's own checks name the node by it (test scaffolding).
        &[("SLURMD_NODENAME", "h1")],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let timer: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(runs(), 1);
    let slow_ms = timer["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "site.slow")
        .unwrap()["duration_ms"]
        .as_f64()
        .unwrap();
    assert!(slow_ms >= 2000.0, "{timer:#}");

    // The next job's prolog reuses the pass.
    let job = sbatch_on(&s, &d, "ran", &["-w", "h1"]);
    assert!(
        wait_until(LIMIT, || d.join("ran").exists()),
        "the job did not run: {}",
        job_state(&s, &job)
    );
    let prolog: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(d.join(format!("reports/h1/prolog-{job}.json"))).unwrap(),
    )
    .unwrap();
    let slow = |r: &serde_json::Value| -> serde_json::Value {
        r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "site.slow")
            .cloned()
            .unwrap_or_else(|| panic!("no site.slow in {r:#}"))
    };
    assert_eq!(slow(&prolog)["cached"], true, "{prolog:#}");
    assert_eq!(runs(), 1);
    eprintln!(
        "the timer's run: {} ms (site.slow {slow_ms} ms); the prolog reusing it: {} ms",
        timer["duration_ms"], prolog["duration_ms"]
    );
    assert!(
        prolog["duration_ms"].as_f64().unwrap() < slow_ms,
        "{prolog:#}"
    );

    // A job holds the node: the health check reuses the pass, and with
    // none kept it skips the check rather than run it under the job.
    let hold = d.join("hold");
    let o = s.run(
        "sbatch",
        &[
            "--parsable",
            "-w",
            "h1",
            "-o",
            "/dev/null",
            "--wrap",
            &format!("touch {}; sleep 60", hold.display()),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(wait_until(LIMIT, || hold.exists()), "{}", s.sinfo());
    let hc = d.join("preflight-healthcheck").display().to_string();
    let conf = s.conf.display().to_string();
    let env = [("SLURMD_NODENAME", "h1"), ("SLURM_CONF", conf.as_str())];
    let health = || -> serde_json::Value {
        let o = s.on_node(0, "sh", &[&hc], &env);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
        serde_json::from_str(
            &std::fs::read_to_string(d.join("reports/h1/healthcheck.json")).unwrap(),
        )
        .unwrap()
    };
    assert_eq!(slow(&health())["cached"], true);
    std::fs::remove_dir_all(d.join("state/h1/kept")).unwrap();
    let r = health();
    assert_eq!(slow(&r)["status"], "skip", "{r:#}");
    assert!(
        slow(&r)["message"]
            .as_str()
            .unwrap()
            .contains("a job holds this node"),
        "{r:#}"
    );
    assert_eq!(runs(), 1, "a slow check ran under the job");
}
