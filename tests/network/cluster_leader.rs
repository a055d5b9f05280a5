//! Hierarchical check-in with real processes on loopback: where the launch
//! says the node layout (LOCAL_RANK, LOCAL_WORLD_SIZE), a node's ranks
//! check in through its leader (local rank 0) and rank 0 holds one
//! connection per node; a leader killed after checking its node in is
//! named, with every rank it carried, and its ranks say what happened.

use crate::common;
use crate::common::cluster;

use std::time::{Duration, Instant};

use cluster::{Proc, free_port, local, run_args};

const TOKEN: &str = "ea284c4b872943a65e72ddce215c1055";

/// A checklist file of `text`, removed with the test.
fn checks_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

/// A node check for the tests that lose a leader: it passes wherever it
/// is evaluated.
fn node_check() -> tempfile::NamedTempFile {
    checks_file("checks:\n  - id: t.node\n    kind: file\n    path: /\n")
}

/// Every rank's outcome, each within `limit`.
fn finish_all(procs: Vec<Proc>, limit: Duration) -> Vec<cluster::Outcome> {
    procs.into_iter().map(|p| p.finish(limit)).collect()
}

/// A rank that found no leader to share with: it evaluated its node's
/// check itself, not shared, and said `why` on stderr.
fn evaluated_alone(o: &cluster::Outcome, why: &str) {
    assert!(o.stderr.contains(why), "{}: {}", o.label, o.stderr);
    let c = check_of(o, "t.node");
    assert_eq!(c.status.name(), "pass", "{}: {c:#?}", o.label);
    assert!(!c.shared, "{}: {c:#?}", o.label);
}

/// The line of check `id` in a rank's JSON report.
fn check_of(o: &cluster::Outcome, id: &str) -> common::CheckResult {
    common::result(&o.report(), id).clone()
}

/// Rank `r` of a job of `world` ranks, `per_node` on each node, with
/// checklist files besides the cluster checks.
fn rank_with(
    port: u16,
    r: u32,
    world: u32,
    per_node: u32,
    timeout: &str,
    extra: &[&std::path::Path],
) -> Proc {
    rank_as(port, r, world, per_node, timeout, extra, &[])
}

/// `rank_with`, with `more` variables besides (or instead of) the job's.
fn rank_as(
    port: u16,
    r: u32,
    world: u32,
    per_node: u32,
    timeout: &str,
    extra: &[&std::path::Path],
    more: &[(&str, &str)],
) -> Proc {
    let mut args = run_args(timeout);
    for path in extra {
        args.extend(["--checks".into(), path.display().to_string()]);
    }
    let (rank, world_s, local_rank, local_world, port_s) = (
        r.to_string(),
        world.to_string(),
        (r % per_node).to_string(),
        per_node.to_string(),
        port.to_string(),
    );
    let mut env = vec![
        ("RANK", rank.as_str()),
        ("WORLD_SIZE", world_s.as_str()),
        ("LOCAL_RANK", local_rank.as_str()),
        ("LOCAL_WORLD_SIZE", local_world.as_str()),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", port_s.as_str()),
        ("PREFLIGHT_TOKEN", TOKEN),
    ];
    // Later settings win.
    env.extend_from_slice(more);
    local(&format!("rank {r}"), &args, &env)
}

#[test]
fn two_nodes_of_three_check_in_through_their_leaders() {
    let _shared = crate::common::shared();
    let port = free_port();
    let procs: Vec<Proc> = (0..6)
        .map(|r| rank_with(port, r, 6, 3, "20s", &[]))
        .collect();
    let out = finish_all(procs, Duration::from_secs(40));
    for o in &out {
        assert_eq!(o.code, 0, "{}: {}\n{}", o.label, o.stdout, o.stderr);
    }
    let report = out[0].report();
    let barrier = &report.cluster().barrier;
    assert!(barrier.complete, "{report:#}");
    // Six ranks, two connections: each node's leader carried its node.
    assert_eq!(barrier.connections, 2, "{report:#}");
    for o in &out[1..] {
        assert_eq!(
            o.report().cluster().verdict,
            common::Verdict::Ready,
            "{}",
            o.label
        );
    }
}

/// Node 1's leader (rank 3) dies after checking in itself and rank 4; rank
/// 5 never starts. Rank 0 names ranks 3 and 4 as lost on their host and
/// rank 5 as missing; rank 4 says its leader failed; all exit 1 within the
/// deadline.
#[test]
fn a_leader_killed_after_check_in_is_named_with_its_ranks() {
    let _shared = crate::common::shared();
    let port = free_port();
    let checks = node_check();
    let dir = tempfile::tempdir().unwrap();
    let sent = dir.path().join("sent4");
    let sent_s = sent.display().to_string();
    let procs: Vec<Proc> = (0..5)
        .map(|r| {
            let more: &[(&str, &str)] = if r == 4 {
                &[("PREFLIGHT_TEST_CHECKIN_MARKER", sent_s.as_str())]
            } else {
                &[]
            };
            rank_as(port, r, 6, 3, "8s", &[checks.path()], more)
        })
        .collect();
    // Rank 4 has checked in with its leader, and the leader (then its
    // relay of rank 4) with rank 0.
    let leader = procs[3].pid;
    let start = Instant::now();
    while !sent.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "rank 4 never checked in with its leader"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    cluster::wait_checked_in(leader, port);
    procs[3].kill();
    let out = finish_all(procs, Duration::from_secs(30));
    for (r, o) in out.iter().enumerate() {
        if r != 3 {
            assert_eq!(o.code, 1, "{}: {}\n{}", o.label, o.stdout, o.stderr);
        }
    }
    let report = out[0].report();
    let c = report.cluster();
    let lost: Vec<u32> = c.barrier.lost.iter().map(|l| l.rank).collect();
    assert_eq!(lost, [3, 4], "{report:#}");
    assert_eq!(c.barrier.missing_ranks, "5", "{report:#}");
    let host = c.barrier.lost[0].node.clone();
    assert!(!host.is_empty());
    let barrier = c
        .checks
        .iter()
        .find(|x| x.id == "cluster.barrier")
        .unwrap()
        .message
        .clone();
    assert!(
        barrier.contains(&format!(
            "ranks 3-4 on {host} checked in, then went away before the verdict"
        )),
        "{barrier}"
    );
    // Rank 4 heard it from its leader's side, and says so.
    let r4 = out[4].report();
    let msg = &r4.cluster().checks[0].message;
    assert!(
        msg.contains(
            "this node's leader (local rank 0), which checks its ranks in with rank 0, failed"
        ),
        "{msg}"
    );
    // Its node's check was its leader's to evaluate: not evaluated, and
    // said, never a silent pass.
    let node = check_of(&out[4], "t.node");
    assert_eq!(node.status.name(), "error", "{node:#?}");
    assert!(
        node.message
            .contains("went away before it shared its findings"),
        "{node:#?}"
    );
}

/// A follower whose leader never starts checks in with rank 0 on its own:
/// rank 0 names the leader missing, not the whole node.
#[test]
fn ranks_whose_leader_never_starts_check_in_directly() {
    let _shared = crate::common::shared();
    let port = free_port();
    let checks = node_check();
    let procs: Vec<Proc> = [0, 1, 2, 4, 5]
        .iter()
        .map(|r| rank_with(port, *r, 6, 3, "8s", &[checks.path()]))
        .collect();
    let out = finish_all(procs, Duration::from_secs(30));
    for o in &out {
        assert_eq!(o.code, 1, "{}: {}\n{}", o.label, o.stdout, o.stderr);
    }
    // Ranks 4 and 5 found no leader: each evaluated its node's check
    // itself, and said why.
    for o in &out[3..] {
        evaluated_alone(
            o,
            "this node's leader (local rank 0) did not answer on its local socket",
        );
    }
    let report = out[0].report();
    let b = &report.cluster().barrier;
    assert_eq!(b.missing_ranks, "3", "{report:#}");
    assert_eq!(b.missing_count, 1, "{report:#}");
    // Ranks 4 and 5 came on their own connections.
    assert_eq!(b.connections, 3, "{report:#}");
}

/// A node's checks run once per node: its leader evaluates them and hands
/// its findings to the node's other ranks, which evaluate only their own
/// (`scope: rank`). Every rank's report still shows the whole checklist,
/// the node's findings marked as shared, a node failure on each.
#[test]
fn a_nodes_checks_run_once_and_every_rank_reports_them() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let (node_log, rank_log) = (dir.path().join("node.log"), dir.path().join("rank.log"));
    let checks = dir.path().join("checks.yaml");
    std::fs::write(
        &checks,
        format!(
            "checks:
  - id: t.node_count
    kind: command
    argv: [/bin/sh, -c, 'echo $$ >> {node}']
  - id: t.rank_count
    kind: command
    scope: rank
    argv: [/bin/sh, -c, 'echo $$ >> {rank}']
  - id: t.node_fault
    kind: file
    path: {missing}
  - id: t.rank_env
    kind: env
    name: LOCAL_RANK
    set: true
",
            node = node_log.display(),
            rank = rank_log.display(),
            missing = dir.path().join("absent").display(),
        ),
    )
    .unwrap();
    let port = free_port();
    let procs: Vec<Proc> = (0..4)
        .map(|r| rank_with(port, r, 4, 4, "20s", &[checks.as_path()]))
        .collect();
    let out = finish_all(procs, Duration::from_secs(40));
    let lines = |p: &std::path::Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert_eq!(lines(&node_log), 1, "the node's check ran once on the node");
    assert_eq!(lines(&rank_log), 4, "the rank's check ran on every rank");
    for (r, o) in out.iter().enumerate() {
        assert_eq!(o.code, 1, "{}: {}\n{}", o.label, o.stdout, o.stderr);
        let check = |id: &str| check_of(o, id);
        let shared = r != 0;
        for (id, status) in [("t.node_count", "pass"), ("t.node_fault", "fail")] {
            let c = check(id);
            assert_eq!(c.status.name(), status, "{}: {c:#?}", o.label);
            assert_eq!(c.shared, shared, "{}: {c:#?}", o.label);
        }
        for id in ["t.rank_count", "t.rank_env"] {
            let c = check(id);
            assert_eq!(c.status.name(), "pass", "{}: {c:#?}", o.label);
            assert!(!c.shared, "{}: {c:#?}", o.label);
        }
    }
}

/// A node's leader judges the job secret for its node's ranks; a secret
/// too easy to guess is still refused on every rank (exit 2): the leader
/// refuses it, and a rank that finds no leader to prove it to judges it
/// itself.
#[test]
fn a_weak_secret_is_refused_on_every_local_rank() {
    let _shared = crate::common::shared();
    let port = free_port();
    let procs: Vec<Proc> = (0..2)
        .map(|r| {
            rank_as(
                port,
                r,
                2,
                2,
                "10s",
                &[],
                &[("PREFLIGHT_TOKEN", "correcthorsebatterystaple")],
            )
        })
        .collect();
    for p in procs {
        let o = p.finish(Duration::from_secs(30));
        assert_eq!(o.code, 2, "{}: {}\n{}", o.label, o.stdout, o.stderr);
        assert!(
            o.stderr.contains("PREFLIGHT_TOKEN is too easy to guess"),
            "{}: {}",
            o.label,
            o.stderr
        );
    }
}

/// A node check whose condition can differ between the node's ranks
/// (`when: {master: false}`) is evaluated by each rank, never taken from
/// the leader: rank 0, the node's leader, skips it, and ranks 1-3 run it.
#[test]
fn a_check_whose_condition_differs_by_rank_is_each_ranks_own() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ran.log");
    let checks = dir.path().join("checks.yaml");
    std::fs::write(
        &checks,
        format!(
            "checks:\n  - id: t.not_master\n    kind: command\n    argv: [/bin/sh, -c, 'echo $$ >> {}']\n    when:\n      master: false\n",
            log.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let procs: Vec<Proc> = (0..4)
        .map(|r| rank_with(port, r, 4, 4, "20s", &[checks.as_path()]))
        .collect();
    let out = finish_all(procs, Duration::from_secs(40));
    let ran = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(ran.lines().count(), 3, "ranks 1-3 ran it: {ran}");
    for (r, o) in out.iter().enumerate() {
        assert_eq!(o.code, 0, "{}: {}\n{}", o.label, o.stdout, o.stderr);
        let c = check_of(o, "t.not_master");
        assert_eq!(
            c.status.name(),
            if r == 0 { "skip" } else { "pass" },
            "{}: {c:#?}",
            o.label
        );
        assert!(!c.shared, "{}: {c:#?}", o.label);
    }
}

/// A stranger (another user) who binds the node leader's socket name
/// before the job is sent nothing, not even a proof of the secret: the
/// leader cannot listen, the node's other ranks see whose socket it is,
/// evaluate the node's checks themselves, say why, and the job is ready.
#[test]
fn a_stranger_on_the_leaders_socket_is_sent_nothing_and_holds_nobody() {
    let _shared = crate::common::shared();
    if !nix::unistd::geteuid().is_root() {
        common::skip_unless_required("binding as another user needs root");
        return;
    }
    let dir = common::tempdir_with_mode(0o777);
    let heard = dir.path().join("heard");
    let port = free_port();
    let name = format!("preflight-leader/127.0.0.1/{port}/0");
    // It takes every connection and keeps what it is sent.
    let script = format!(
        "import socket, sys, time\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.bind('\\0{name}')\n\
         s.listen(64)\n\
         print('bound', flush=True)\n\
         got = b''\n\
         s.settimeout(25)\n\
         try:\n\
         \x20   while True:\n\
         \x20       c, _ = s.accept()\n\
         \x20       c.settimeout(0.5)\n\
         \x20       try:\n\
         \x20           got += c.recv(4096)\n\
         \x20       except OSError:\n\
         \x20           pass\n\
         \x20       open('{heard}', 'wb').write(got)\n\
         except OSError:\n\
         \x20   pass\n",
        heard = heard.display()
    );
    let mut stranger = common::python_as_nobody(&script);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(stranger.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "bound");
    let checks = node_check();
    let procs: Vec<Proc> = (0..4)
        .map(|r| rank_with(port, r, 4, 4, "20s", &[checks.path()]))
        .collect();
    let out = finish_all(procs, Duration::from_secs(40));
    let _ = stranger.kill();
    let _ = stranger.wait();
    let got = std::fs::read(&heard).unwrap_or_default();
    assert!(got.is_empty(), "the stranger was sent {} bytes", got.len());
    for o in &out {
        assert_eq!(o.code, 0, "{}: {}\n{}", o.label, o.stdout, o.stderr);
    }
    for o in &out[1..] {
        evaluated_alone(
            o,
            "a process of another user holds this node's leader socket",
        );
    }
}

/// Node 1's leader (rank 3) dies during its own checklist, with ranks 4
/// and 5 connected to it and waiting: they check in with rank 0 on their
/// own, so rank 0 names the leader missing and not its node, and the node
/// checks the leader was to share are said not evaluated.
#[test]
fn a_leader_that_dies_before_relaying_leaves_its_ranks_to_check_in_themselves() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow.yaml");
    std::fs::write(
        &slow,
        "checks:\n  - id: t.slow\n    kind: command\n    argv: [/bin/sleep, '30']\n    timeout: 40s\n",
    )
    .unwrap();
    let checks = node_check();
    let port = free_port();
    // Ranks 4 and 5 mark when they have sent their check-in to the leader.
    let marker = |r: u32| dir.path().join(format!("sent{r}"));
    let (m4, m5) = (
        marker(4).display().to_string(),
        marker(5).display().to_string(),
    );
    let procs: Vec<Proc> = (0..6)
        .map(|r| match r {
            3 => rank_with(port, r, 6, 3, "8s", &[checks.path(), slow.as_path()]),
            4 | 5 => rank_as(
                port,
                r,
                6,
                3,
                "8s",
                &[checks.path()],
                &[(
                    "PREFLIGHT_TEST_CHECKIN_MARKER",
                    if r == 4 { m4.as_str() } else { m5.as_str() },
                )],
            ),
            _ => rank_with(port, r, 6, 3, "8s", &[checks.path()]),
        })
        .collect();
    // Both proved the secret to their leader and checked in with it; the
    // leader is still in its own checklist.
    let start = Instant::now();
    while !(marker(4).exists() && marker(5).exists()) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "ranks 4 and 5 never checked in with their leader"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    procs[3].kill();
    let out = finish_all(procs, Duration::from_secs(30));
    let report = out[0].report();
    assert_eq!(report.cluster().barrier.missing_ranks, "3", "{report:#}");
    for o in &out[4..] {
        assert_eq!(o.code, 1, "{}: {}\n{}", o.label, o.stdout, o.stderr);
        assert!(
            o.stderr.contains("went away before checking this rank in"),
            "{}: {}",
            o.label,
            o.stderr
        );
        let c = check_of(o, "t.node");
        assert_eq!(c.status.name(), "error", "{}: {c:#?}", o.label);
    }
}
