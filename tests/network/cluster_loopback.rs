//! The cluster stage with ranks as plain processes on loopback: runs on any
//! machine, no namespaces needed.

use crate::common;
use crate::common::cluster;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use cluster::{Outcome, local, local_under, run_args};
use common::{Status, Verdict};

mod open_files;
mod strangers;

/// A hang guard, longer than any run's own `--timeout` here: whether a
/// rank answered at once or at its deadline is told by what it says, never
/// by a stopwatch; the real figures are measured in bench/.
const MARGIN: Duration = Duration::from_secs(90);

fn env<'a>(rank: &'a str, world: &'a str, port: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("RANK", rank),
        ("WORLD_SIZE", world),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", port),
        ("PREFLIGHT_TOKEN", "ca66048772f99614f6a948e6699321a2"),
    ]
}

fn all_exit(outcomes: &[Outcome], code: i32) {
    for o in outcomes {
        assert_eq!(o.code, code, "{}: {}\n{}", o.label, o.stdout, o.stderr);
    }
}

#[test]
fn four_healthy_ranks_are_ready_everywhere() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let args = run_args("20s");
    let procs: Vec<_> = (0..4)
        .map(|r| {
            let rank = r.to_string();
            local(&format!("rank{r}"), &args, &env(&rank, "4", &port))
        })
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 0);
    let report = out[0].report();
    assert_eq!(report.verdict, Verdict::Ready);
    assert_eq!(report.cluster().world_size, 4);
    assert!(report.cluster().barrier.complete);
    assert!(report.cluster().token.starts_with("PREFLIGHT_TOKEN"));
    // Every rank got the same verdict from rank 0.
    for o in &out[1..] {
        assert_eq!(o.report().cluster().verdict, Verdict::Ready);
    }
}

#[test]
fn a_missing_rank_is_named_with_its_host_by_the_deadline() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    // Long enough that the three ranks that come check in on a loaded
    // machine too (this file's tests run side by side): only rank 3 is
    // missing at the deadline.
    let args = run_args("6s");
    let mut procs = Vec::new();
    for r in 0..3 {
        let rank = r.to_string();
        let mut e = env(&rank, "4", &port);
        e.push(("SLURM_JOB_NODELIST", "gpu[001-004]"));
        procs.push(local(&format!("rank{r}"), &args, &e));
    }
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 1);
    let msg = out[0].message("cluster.barrier");
    assert!(msg.starts_with("fail"), "{msg}");
    assert!(msg.contains("rank 3 (expected on gpu004)"), "{msg}");
    assert!(out[1].message("cluster.barrier").contains("rank 3"));
    // The barrier ended at its deadline, not before: rank 3 was waited for.
    let report = out[0].report();
    let barrier = &report.cluster().barrier;
    assert!(!barrier.complete, "{barrier:#?}");
    assert_eq!(barrier.missing_count, 1, "{barrier:#?}");
    assert!(barrier.waited_ms >= 5000, "{barrier:#?}");
}

#[test]
fn a_missing_rank_on_an_uneven_slurm_node_is_named_with_its_host() {
    let _shared = crate::common::shared();
    // SLURM_TASKS_PER_NODE=2,1: ranks 0-1 on gpu001, rank 2 on gpu002.
    let port = cluster::free_port().to_string();
    let args = run_args("2s");
    let procs: Vec<_> = (0..2)
        .map(|r| {
            let rank = r.to_string();
            let mut e = env(&rank, "3", &port);
            e.push(("SLURM_JOB_NODELIST", "gpu[001-002]"));
            e.push(("SLURM_TASKS_PER_NODE", "2,1"));
            local(&format!("rank{r}"), &args, &e)
        })
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 1);
    let msg = out[0].message("cluster.barrier");
    assert!(msg.contains("rank 2 (expected on gpu002)"), "{msg}");
}

#[test]
fn node_mode_on_one_machine_starts_its_ranks() {
    let _shared = crate::common::shared();
    let out = local(
        "agent",
        &[run_args("20s"), vec!["--nproc-per-node".into(), "3".into()]].concat(),
        &[("PREFLIGHT_TOKEN", "dba80ca4a869c99b3a875e067b4cd619")],
    )
    .finish(MARGIN);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report();
    assert_eq!(report.cluster().world_size, 3);
    assert_eq!(report.cluster().nodes[0].ranks, [0, 1, 2]);
}

#[test]
fn a_rank_without_a_master_says_refused_and_names_the_address() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let out = local("rank1", &run_args("1s"), &env("1", "2", &port)).finish(MARGIN);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let msg = out.message("cluster.rendezvous");
    assert!(msg.contains("connection refused"), "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
}

#[test]
fn two_processes_claiming_one_rank_are_both_named() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let args = run_args("3s");
    let r0 = local("rank0", &args, &env("0", "3", &port));
    let a = local("rank1a", &args, &env("1", "3", &port));
    let b = local("rank1b", &args, &env("1", "3", &port));
    // Rank 2 never starts, so the barrier stays open until its deadline and
    // both claimants have surely checked in: no race with a fast barrier.
    let out: Vec<Outcome> = [r0, a, b].into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 1);
    let msg = out[0].message("cluster.barrier");
    assert!(msg.contains("rank 1 claimed by 2 processes"), "{msg}");
}

#[test]
fn a_world_size_disagreement_is_named() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let args = run_args("3s");
    let r0 = local("rank0", &args, &env("0", "2", &port));
    let r1 = local("rank1", &args, &env("1", "3", &port));
    let out = [r0.finish(MARGIN), r1.finish(MARGIN)];
    all_exit(&out, 1);
    let msg = out[0].message("cluster.barrier");
    assert!(
        msg.contains("rank 1") && msg.contains("WORLD_SIZE=3, rank 0 says 2"),
        "{msg}"
    );
    // Neither sizes a collective stage by a world it does not share.
    for o in &out {
        assert!(o.report().collective.is_none(), "{}: {}", o.label, o.stdout);
    }
}

#[test]
fn check_never_does_a_rendezvous() {
    let _shared = crate::common::shared();
    // A rank 1 whose master port has a listener: `check` must never
    // connect to it (the listener is the witness, not a stopwatch).
    let witness = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    witness.set_nonblocking(true).unwrap();
    let port = witness.local_addr().unwrap().port().to_string();
    let mut a = run_args("60s");
    a[0] = "check".into();
    let out = local("check", &a, &env("1", "2", &port)).finish(MARGIN);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert_eq!(
        witness.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "check connected to the master port"
    );
    let report = out.report();
    assert!(report.cluster.is_none());
    // Nor does it list the checks across nodes: they are `run`'s.
    assert!(report.checks.is_empty(), "{report:#}");
}

#[test]
fn a_master_killed_during_the_rendezvous_is_reported_at_once() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let args = run_args("60s");
    let r0 = local("rank0", &args, &env("0", "3", &port));
    let r1 = local("rank1", &args, &env("1", "3", &port));
    // Rank 1 has checked in; rank 2 never comes, so the barrier is open.
    cluster::wait_checked_in(r1.pid, port.parse().unwrap());
    let killed = std::time::Instant::now();
    r0.kill();
    let out = r1.finish(MARGIN);
    // docs/faults.md: 0.40 s; the run's own deadline is 60 s.
    let told_in = killed.elapsed();
    println!("rank 1 told {told_in:?} after rank 0 was killed");
    assert!(told_in < Duration::from_secs(5), "{told_in:?}");
    assert_eq!(out.code, 1, "{}", out.stderr);
    let msg = out.message("cluster.rendezvous");
    assert!(
        msg.contains("the master went away before the verdict"),
        "{msg}"
    );
    // Not at its deadline: that would read "no verdict came from the
    // master before the deadline"; the closed connection is the answer.
}

#[test]
fn a_failing_local_check_makes_every_rank_not_ready_even_without_node_checks() {
    let _shared = crate::common::shared();
    // The node's own verdict counts whatever cluster checks are selected.
    let dir = tempfile::tempdir().unwrap();
    let failing = dir.path().join("fail.yaml");
    std::fs::write(
        &failing,
        "checks:\n  - id: site.must_fail\n    kind: env\n    name: PREFLIGHT_TEST_NOT_SET\n",
    )
    .unwrap();
    let port = cluster::free_port().to_string();
    let mut args = run_args("20s");
    args.extend(["--checks".to_string(), failing.display().to_string()]);
    args.extend(["--skip".to_string(), "cluster.node_checks".to_string()]);
    let procs: Vec<_> = (0..2)
        .map(|r| {
            let rank = r.to_string();
            local(&format!("rank{r}"), &args, &env(&rank, "2", &port))
        })
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 1);
    assert_eq!(out[0].report().verdict, Verdict::NotReady);
    assert_eq!(out[1].report().cluster().verdict, Verdict::NotReady);
}

#[test]
fn a_check_that_runs_to_the_deadline_does_not_cost_the_rendezvous() {
    let _shared = crate::common::shared();
    // The checklist gets a share of --timeout; the rest is the rendezvous's,
    // so a slow warn-severity check leaves the node ready, not unreachable.
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow.yaml");
    std::fs::write(
        &slow,
        "checks:\n  - id: site.slow\n    kind: command\n    argv: [sleep, \"60\"]\n    timeout: 60s\n    severity: warn\n",
    )
    .unwrap();
    let port = cluster::free_port().to_string();
    let mut args = run_args("4s");
    // The rendezvous, not a collective stage, is what the reserve must
    // hold: a stage in the last 2 s is cut short on a loaded machine.
    args.extend(
        [
            "--checks",
            &slow.display().to_string(),
            "--collective",
            "off",
        ]
        .map(String::from),
    );
    let procs: Vec<_> = (0..2)
        .map(|r| {
            let rank = r.to_string();
            local(&format!("rank{r}"), &args, &env(&rank, "2", &port))
        })
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 0);
    assert!(
        out[0]
            .message("cluster.barrier")
            .starts_with("pass all 2 ranks checked in")
    );
    // Cut off by the checklist's share of the deadline: not evaluated,
    // and a warn-severity check that was not evaluated leaves the node
    // ready.
    assert!(
        out[0]
            .message("site.slow")
            .starts_with("error not evaluated"),
        "{}",
        out[0].message("site.slow")
    );
}

fn fixture_root(name: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
        .join("root")
        .display()
        .to_string()
}

/// One rank per fixture root: each reads its own hardware and hostname
/// from its tree, so on loopback they are nodes of their own (a node is a
/// hostname and an address).
fn ranks_on_roots(
    roots: &[&str],
    extra_args: &[&str],
    extra_env: &[&[(&str, &str)]],
) -> Vec<Outcome> {
    let port = cluster::free_port().to_string();
    let world = roots.len().to_string();
    let procs: Vec<_> = roots
        .iter()
        .enumerate()
        .map(|(r, root)| {
            let mut args = run_args("20s");
            args.extend(["--root".to_string(), fixture_root(root)]);
            args.extend(extra_args.iter().map(|s| s.to_string()));
            let rank = r.to_string();
            let mut e = env(&rank, &world, &port);
            if let Some(more) = extra_env.get(r) {
                e.extend_from_slice(more);
            }
            local(&format!("rank{r}@{root}"), &args, &e)
        })
        .collect();
    procs.into_iter().map(|p| p.finish(MARGIN)).collect()
}

#[test]
fn a_node_with_another_device_count_is_named() {
    let _shared = crate::common::shared();
    let out = ranks_on_roots(&["h100-ib-healthy", "amd-mi300x", "roce-node"], &[], &[]);
    all_exit(&out, 1);
    let report = out[0].report();
    let nodes = &report.cluster().nodes;
    assert_eq!(nodes.len(), 3, "{nodes:#?}");
    let msg = out[0].message("cluster.devices");
    assert!(
        msg.starts_with("fail device count: 8 devices on gpu-h100-017, gpu-mi300x-002; 2 devices on gpu-roce-011 (odd: gpu-roce-011)"),
        "{msg}"
    );
    // Every rank got the same verdict.
    for o in &out[1..] {
        assert_eq!(o.message("cluster.devices"), msg, "{}", o.label);
    }
}

#[test]
fn a_node_whose_own_checks_fail_is_listed_by_name() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site.yaml");
    std::fs::write(
        &site,
        "checks:\n  - id: site.scratch\n    kind: env\n    name: PREFLIGHT_TEST_SCRATCH\n",
    )
    .unwrap();
    let site = site.display().to_string();
    let set: &[(&str, &str)] = &[("PREFLIGHT_TEST_SCRATCH", "/scratch")];
    // The variable is missing on the second node only.
    let out = ranks_on_roots(
        &["cpu-node", "amd-mi300x", "intel-max-xpu"],
        &["--checks", &site],
        &[set, &[], set],
    );
    all_exit(&out, 1);
    let msg = out[0].message("cluster.node_checks");
    assert!(
        msg.starts_with("fail gpu-mi300x-002: site.scratch (fail:"),
        "{msg}"
    );
    assert!(
        !msg.contains("cpu-vm-03") && !msg.contains("xpu-pvc-004"),
        "{msg}"
    );
    let report = out[2].report();
    assert_eq!(report.verdict, Verdict::NotReady);
    // The rank whose own checks passed is not ready because of the other.
    // Its verdict holds its own node only, and counts the others.
    let nodes = &report.cluster().nodes;
    assert_eq!(nodes.len(), 1, "{report:#}");
    assert_eq!(nodes[0].name, "xpu-pvc-004", "{report:#}");
    assert_eq!(nodes[0].local_verdict, "ready", "{report:#}");
    assert_eq!(report.cluster().node_count, 3, "{report:#}");
}

#[test]
fn a_bad_probe_port_range_is_a_usage_error() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let mut args = run_args("5s");
    args.extend(["--probe-ports".to_string(), "29699-29600".to_string()]);
    let out = local("flag", &args, &env("0", "1", &port)).finish(MARGIN);
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("runs backwards"), "{}", out.stderr);
    let mut e = env("0", "1", &port);
    e.push(("PREFLIGHT_PROBE_PORTS", "ssh"));
    let out = local("var", &run_args("5s"), &e).finish(MARGIN);
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("PREFLIGHT_PROBE_PORTS=`ssh`"),
        "{}",
        out.stderr
    );
}

#[test]
fn probe_listeners_take_the_next_free_port_of_the_range() {
    let _shared = crate::common::shared();
    // Two nodes on loopback (two fixture roots); the range's first port is
    // held by another program, so both listeners move on past it.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let first = held.local_addr().unwrap().port();
    let range = format!("{first}-{}", first.saturating_add(20));
    let out = ranks_on_roots(&["cpu-node", "amd-mi300x"], &["--probe-ports", &range], &[]);
    for o in &out {
        assert_eq!(o.status("cluster.reachability"), "pass", "{}", o.stdout);
    }
    let report = out[0].report();
    let mut ports: Vec<u16> = report
        .cluster()
        .nodes
        .iter()
        .map(|n| {
            let a = n.probe_addr.as_deref().expect("probe_addr");
            a.rsplit(':').next().unwrap().parse().unwrap()
        })
        .collect();
    ports.sort();
    assert!(
        ports[0] > first && ports[1] > ports[0] && ports[1] <= first + 20,
        "{ports:?} in {range}"
    );
    drop(held);
}

/// A rank whose own launch variables put it outside the world fails at
/// once, naming them; it used to retry the master until the deadline and
/// then say it could not reach it.
#[test]
fn a_rank_outside_the_world_fails_at_once_naming_its_variables() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let out = local("rank5", &run_args("60s"), &env("5", "4", &port)).finish(MARGIN);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let report = out.report();
    assert_eq!(
        common::message(&report, "cluster.rendezvous"),
        "rank 5 is not below the world size 4 (RANK=5, WORLD_SIZE=4): this process cannot take part in the job"
    );
    let hint = common::hint(&report, "cluster.rendezvous");
    assert!(
        hint.starts_with("Give every process a distinct rank from 0 to 3"),
        "{hint}"
    );
}

/// A rank that cannot reach rank 0 is the only one that knows its own
/// problems: its human output lists them, the failing rendezvous with its
/// hint among them, and ends with the verdict line (srun logs are read from
/// the tail).
#[test]
fn a_rank_that_cannot_reach_the_master_shows_its_own_problems() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let checks = dir.path().join("own.yaml");
    std::fs::write(
        &checks,
        "checks:\n  - {id: own.scratch, kind: file, path: /nonexistent/preflight-scratch, hint: \"Mount the scratch file system.\"}\n",
    )
    .unwrap();
    let port = cluster::free_port().to_string();
    let args: Vec<String> = [
        "run",
        "--no-shipped",
        "--checks",
        checks.to_str().unwrap(),
        "--timeout",
        "2s",
        "--color",
        "never",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = local("rank1", &args, &env("1", "2", &port)).finish(MARGIN);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let last = out
        .stdout
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(last.starts_with("NOT READY"), "{}", out.stdout);
    assert!(last.contains("rank 1 of 2"), "{}", out.stdout);
    assert!(last.contains("connection refused"), "{}", out.stdout);
    let problems = out.stdout.split_once("Problems\n").map(|(_, p)| p);
    let problems = problems.unwrap_or_else(|| panic!("no Problems section:\n{}", out.stdout));
    assert!(problems.contains("own.scratch: "), "{}", out.stdout);
    assert!(
        problems.contains("hint: Mount the scratch file system."),
        "{}",
        out.stdout
    );
    // The rank's own failing cluster check is listed too, with its hint.
    assert!(
        problems.contains("FAIL  cluster.rendezvous: "),
        "{}",
        out.stdout
    );
    assert!(
        problems.contains("hint: Compare MASTER_ADDR and MASTER_PORT"),
        "{}",
        out.stdout
    );
}

/// One cause, shown once, with the right remedy: a typo in the job's
/// GLOO_SOCKET_IFNAME fails env.lint; cluster.node_checks and the TCP
/// backend fail because of it and say so instead of posing as two more
/// problems, no node is blamed (a job's variable never drains a node),
/// and the verdict line names the cause.
#[test]
fn a_bad_job_variable_is_one_cause_and_drains_nothing() {
    let _shared = crate::common::shared();
    let args: Vec<String> = [
        "run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--timeout",
        "20s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let env = [("GLOO_SOCKET_IFNAME", "eth9")];
    let mut json_args = args.clone();
    json_args.extend([
        "--format".to_string(),
        "json".to_string(),
        "--backends".into(),
        "tcp".into(),
    ]);
    let o = local("node", &json_args, &env).finish(MARGIN);
    assert_eq!(o.code, 1, "{}\n{}", o.stdout, o.stderr);
    let report = o.report();
    let check = |id: &str| common::result(&report, id);
    // One result per variable at fault, named after it.
    let root = "env.lint:GLOO_SOCKET_IFNAME";
    assert_eq!(check(root).status, Status::Fail);
    assert!(check(root).caused_by.is_none());
    for consequence in ["cluster.node_checks", "collective.tcp"] {
        assert_eq!(check(consequence).status, Status::Fail, "{consequence}");
        assert_eq!(
            check(consequence).caused_by.as_deref(),
            Some(root),
            "{consequence}"
        );
    }
    let hint = common::hint(&report, "cluster.node_checks").to_string();
    assert!(!hint.contains("drain the"), "{hint}");
    assert!(report.cluster().culprits.is_empty());

    let mut human = args;
    human.extend(["--backends".to_string(), "tcp".into()]);
    let o = local("node", &human, &env).finish(MARGIN);
    let last = o
        .stdout
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert!(
        last.starts_with("NOT READY") && last.ends_with("· cause: env.lint:GLOO_SOCKET_IFNAME"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("collective.tcp: caused by env.lint"),
        "{}",
        o.stdout
    );
}

/// Rank 0's port held by another program: `run` says what `check` says
/// (the holder's pid and command), keeps the checklist's results, gives
/// the remedy for a port that cannot be bound, and shows the rendezvous
/// failure as a consequence of the port check, not a second problem.
#[test]
fn a_port_held_by_another_program_is_named_with_its_holder_in_run() {
    let _shared = crate::common::shared();
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port().to_string();
    let pid = std::process::id();
    let args: Vec<String> = [
        "run",
        "--only",
        "net.master_port_free",
        "--timeout",
        "20s",
        "--format",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = local("rank0", &args, &env("0", "1", &port)).finish(MARGIN);
    drop(holder);
    assert_eq!(out.code, 1, "{}{}", out.stdout, out.stderr);
    // 2.1 s in docs/faults.md; --timeout is 20 s.
    cluster::verdicts_within(std::slice::from_ref(&out), Duration::from_secs(10));
    let report = out.report();
    assert_eq!(
        common::status(&report, "net.master_port_free"),
        "fail",
        "{report:#}"
    );
    let rendezvous = common::result(&report, "cluster.rendezvous");
    let message = &rendezvous.message;
    assert!(message.contains(&format!("held by pid {pid}")), "{message}");
    let hint = common::hint(&report, "cluster.rendezvous");
    assert!(hint.contains(&format!("`kill {pid}`")), "{hint}");
    assert!(!hint.contains("firewall"), "{hint}");
    assert_eq!(
        rendezvous.caused_by.as_deref(),
        Some("net.master_port_free"),
        "{rendezvous:#?}"
    );
    assert!(report.duration_ms > 0, "{report:#}");
}

/// `run --format prometheus`: rank 0's metrics hold the cluster's size,
/// the verdict and the tool's info, and pass the real promtool where it is
/// installed. (A missing rank blames no node, so the culprit family is
/// empty here; crates/preflight-report/src/prometheus.rs fills it from a real run's report.)
#[test]
fn run_metrics_name_the_world_and_the_verdict() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let args: Vec<String> = run_args("6s")
        .into_iter()
        .map(|a| if a == "json" { "prometheus".into() } else { a })
        .collect();
    let mut procs = Vec::new();
    for r in 0..3 {
        let rank = r.to_string();
        let mut e = env(&rank, "4", &port);
        e.push(("SLURM_JOB_NODELIST", "gpu[001-004]"));
        procs.push(local(&format!("rank{r}"), &args, &e));
    }
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 1);
    let metrics = &out[0].stdout;
    for line in [
        "preflight_cluster_world_size 4",
        "preflight_verdict{verdict=\"not_ready\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in:\n{metrics}"
        );
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("preflight_info{version=\"") && l.contains("command=\"run\"")),
        "{metrics}"
    );
    if std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok()
    {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("run.prom");
        std::fs::write(&file, metrics).unwrap();
        let check = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&file).unwrap())
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    } else {
        common::skip::skip("promtool is not installed (apt: prometheus)");
    }
}

/// A human run as a log sees it (stderr no terminal): rank 0 says every
/// 10 s whom it waits for and how long is left, and a rank that cannot
/// reach rank 0 what it has tried so far. Their deadline (12 s) ends both.
#[test]
fn waiting_ranks_say_whom_they_wait_for_in_a_log() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let other = cluster::free_port().to_string();
    let human = |timeout: &str| -> Vec<String> {
        run_args(timeout)
            .into_iter()
            .map(|a| if a == "json" { "human".to_string() } else { a })
            .collect()
    };
    let master = local("rank0", &human("12s"), &env("0", "3", &port));
    let lonely = local("rank1", &human("12s"), &env("1", "2", &other));
    let master = master.finish(MARGIN);
    let lonely = lonely.finish(MARGIN);
    assert_eq!(master.code, 1, "{}", master.stderr);
    let said: Vec<&str> = master
        .stderr
        .lines()
        .filter(|l| l.starts_with("preflight: waiting: "))
        .collect();
    assert!(
        !said.is_empty(),
        "rank 0 said nothing while waiting:\n{}",
        master.stderr
    );
    assert!(
        said[0].starts_with("preflight: waiting: 1 of 3 ranks checked in; missing: rank 1 (expected on node rank 1), rank 2 (expected on node rank 2); ")
            && said[0].ends_with(" left"),
        "{}",
        said[0]
    );
    let tried: Vec<&str> = lonely
        .stderr
        .lines()
        .filter(|l| l.starts_with("preflight: waiting: "))
        .collect();
    assert!(!tried.is_empty(), "{}", lonely.stderr);
    assert!(
        tried[0].starts_with(&format!(
            "preflight: waiting: reaching rank 0 at 127.0.0.1:{other}: "
        )) && tried[0].contains(" attempts so far, the last: ")
            && tried[0].contains("refused"),
        "{}",
        tried[0]
    );
    // Not in a log's first seconds: one line per 10 s, never more.
    assert!(said.len() <= 2 && tried.len() <= 2, "{said:?} {tried:?}");
}

/// On a terminal the same, as a line rewritten in place, and cleared
/// before the report.
#[test]
fn waiting_rank_0_on_a_terminal_rewrites_one_line() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let command = format!(
        "{} run --no-shipped --checks {} --timeout 4s",
        env!("CARGO_BIN_EXE_preflight"),
        cluster::checks()
    );
    let tty = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TERM", "xterm")
        .env("LANG", "C.UTF-8")
        .envs(env("0", "2", &port))
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&tty.stdout).into_owned();
    let shown = text
        .matches("\r\x1b[Kwaiting: 1 of 2 ranks checked in; missing: rank 1")
        .count();
    assert!(shown >= 2, "{text:?}");
    // Cleared before the report goes on.
    let last = text.rfind("\r\x1b[Kwaiting: ").unwrap();
    assert!(
        text[last..].contains(" left\r\x1b[K"),
        "{:?}",
        &text[last..]
    );
}

/// Something on the port accepts the rank's connections and closes them
/// at once (a rank 0 that locked it out), then goes away: the rank's last
/// attempts are refused, but what it reports is the first failure it saw,
/// the real cause, with the last one beside it.
#[test]
fn the_first_failure_seen_is_kept_over_a_later_refusal() {
    let _shared = crate::common::shared();
    let closer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closer.local_addr().unwrap().port().to_string();
    let r1 = local("rank1", &run_args("3s"), &env("1", "2", &port));
    closer.set_nonblocking(true).unwrap();
    let start = std::time::Instant::now();
    let mut closed = 0;
    while closed < 3 {
        match closer.accept() {
            Ok((s, _)) => {
                drop(s);
                closed += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    start.elapsed() < Duration::from_secs(3),
                    "rank 1 never came"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("{e}"),
        }
    }
    drop(closer);
    let out = r1.finish(MARGIN);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let msg = out.message("cluster.rendezvous");
    assert!(
        msg.contains(&format!(
            "connected to port {port}, but the handshake failed"
        )) && msg.contains("(the first failure seen; the last attempt: "),
        "{msg}"
    );
}
