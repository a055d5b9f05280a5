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

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use common::slurm::{Options, Slurm};
use common::wait_until;
use common::{BIN, CheckResult, Report, Status, Verdict};

use crate::common::serial;

mod prolog;

mod in_job;

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
    common::executable(
        dir,
        name,
        &format!(
            "#!/bin/sh\nexport PREFLIGHT={BIN} PREFLIGHT_CONFIG_DIR={}\nexec sh {CONTRIB}/{name} {args}\n",
            etc.display()
        ),
    )
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
    let report = read_report(&d.join("reports/h2/healthcheck.json"));
    assert_eq!(report.verdict, Verdict::NotReady, "{report}");

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
    let _shared = crate::common::shared();
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
    let _shared = crate::common::shared();
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
    let report = common::report(
        &std::fs::read_to_string(dir.path().join("reports/healthcheck.json"))
            .unwrap_or_else(|e| panic!("no report ({e}): {}", text(&o))),
        &text(&o),
    );
    let check = &report.checks[0];
    assert_eq!(check.id, "site.nft", "{report}");
    assert_eq!(check.status, Status::Pass, "{report}");
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

/// A report file preflight wrote, read with the product's own types.
fn read_report(file: &Path) -> Report {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    common::report(&text, &file.display().to_string())
}

/// The first node's (rank 0's) prolog report of `job`.
fn master_report(d: &Path, job: &str) -> Report {
    read_report(&d.join(format!("reports/h1/prolog-{job}.json")))
}

#[test]
fn validate_site_checks_the_settings_the_checks_d_and_every_modes_selection() {
    let _shared = crate::common::shared();
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
/// each (PREFLIGHT_BENCH_RUNS and PREFLIGHT_BENCH_JOBS, which bench/slurm.sh
/// sets from RUNS and JOBS). NHC_DIR: an NHC source tree (its scripts run
/// from it).
#[test]
#[ignore]
fn bench_healthcheck_beside_nhc_and_the_prologs_cost() {
    let _s = serial();
    let count = |name: &str, default: usize| match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("{name}: not a count (1 or more): {v:?}")),
    };
    let runs = count("PREFLIGHT_BENCH_RUNS", 20);
    let jobs = count("PREFLIGHT_BENCH_JOBS", 10);
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
            let report = read_report(&d.join("reports/h1/healthcheck.json"));
            println!(
                "preflight slurm healthcheck (shipped checklist without `slow`, {} checks, ready): median {:.1} ms of {runs}",
                report.checks.len(),
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
        for i in 0..jobs {
            let marker = d.join(format!("first-line-{i}"));
            let t = std::time::Instant::now();
            let job = sbatch(&s, &d, &format!("first-line-{i}"));
            if !wait_until(LIMIT, || marker.exists()) {
                let mut why = String::new();
                for n in ["h1", "h2", "h3"] {
                    let f = d.join(format!("reports/{n}/prolog-{job}.json"));
                    // What a report there says, if there is one.
                    let r: Option<preflight::schema::Report> =
                        serde_json::from_str(&std::fs::read_to_string(&f).unwrap_or_default()).ok();
                    for c in r.iter().flat_map(|r| &r.checks) {
                        if !matches!(c.status, Status::Pass | Status::Skip) {
                            why.push_str(&format!(
                                "{n}: {} {} {}\n",
                                c.id,
                                c.status.name(),
                                c.message
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
                took.push(read_report(&e.path()).duration_ms as f64);
            }
            println!(
                "the prolog on the first node (its report's duration: checklist, rendezvous, verdict): median {:.0} ms of {}",
                median_ms(took.clone()),
                took.len()
            );
        }
        println!(
            "sbatch -N3 to the job's first line, prolog {}: median {:.0} ms of {jobs}",
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
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let fake = common::executable(
        dir.path(),
        "scontrol",
        "#!/bin/sh\necho 'slurm_update error: Invalid node name specified' >&2\nexit 1\n",
    );
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
    let timer = common::report_of(&o);
    assert_eq!(runs(), 1);
    let slow_took = common::result(&timer, "site.slow").duration;
    let slow_ms = slow_took.as_secs_f64() * 1e3;
    assert!(slow_took >= Duration::from_secs(2), "{timer}");

    // The next job's prolog reuses the pass.
    let job = sbatch_on(&s, &d, "ran", &["-w", "h1"]);
    assert!(
        wait_until(LIMIT, || d.join("ran").exists()),
        "the job did not run: {}",
        job_state(&s, &job)
    );
    let prolog = read_report(&d.join(format!("reports/h1/prolog-{job}.json")));
    let slow = |r: &Report| -> CheckResult { common::result(r, "site.slow").clone() };
    assert!(slow(&prolog).cached, "{prolog}");
    assert_eq!(runs(), 1);
    eprintln!(
        "the timer's run: {} ms (site.slow {slow_ms} ms); the prolog reusing it: {} ms",
        timer.duration_ms, prolog.duration_ms
    );
    assert!(
        Duration::from_millis(prolog.duration_ms) < slow_took,
        "{prolog}"
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
    let health = || -> Report {
        let o = s.on_node(0, "sh", &[&hc], &env);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
        read_report(&d.join("reports/h1/healthcheck.json"))
    };
    assert!(slow(&health()).cached);
    std::fs::remove_dir_all(d.join("state/h1/kept")).unwrap();
    let r = health();
    assert_eq!(slow(&r).status, Status::Skip, "{r}");
    assert!(slow(&r).message.contains("a job holds this node"), "{r}");
    assert_eq!(runs(), 1, "a slow check ran under the job");
}
