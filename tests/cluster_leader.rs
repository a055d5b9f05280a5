//! Hierarchical check-in with real processes on loopback: where the launch
//! says the node layout (LOCAL_RANK, LOCAL_WORLD_SIZE), a node's ranks
//! check in through its leader (local rank 0) and rank 0 holds one
//! connection per node; a leader killed after checking its node in is
//! named, with every rank it carried, and its ranks say what happened.

#[path = "common/cluster.rs"]
mod cluster;
mod common;

use std::time::{Duration, Instant};

use cluster::{Proc, free_port, local, run_args};

const TOKEN: &str = "ea284c4b872943a65e72ddce215c1055";

/// A node check for the tests that lose a leader: it passes wherever it
/// is evaluated.
fn node_check() -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(
        &mut f,
        b"checks:\n  - id: t.node\n    kind: file\n    path: /\n",
    )
    .unwrap();
    f
}

/// Rank `r` of a job of `world` ranks, `per_node` on each node.
fn rank(port: u16, r: u32, world: u32, per_node: u32, timeout: &str) -> Proc {
    rank_with(port, r, world, per_node, timeout, &[])
}

/// `rank`, with checklist files besides the cluster checks.
fn rank_with(
    port: u16,
    r: u32,
    world: u32,
    per_node: u32,
    timeout: &str,
    extra: &[&std::path::Path],
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
    local(
        &format!("rank {r}"),
        &args,
        &[
            ("RANK", rank.as_str()),
            ("WORLD_SIZE", world_s.as_str()),
            ("LOCAL_RANK", local_rank.as_str()),
            ("LOCAL_WORLD_SIZE", local_world.as_str()),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", port_s.as_str()),
            ("PREFLIGHT_TOKEN", TOKEN),
        ],
    )
}

#[test]
fn two_nodes_of_three_check_in_through_their_leaders() {
    let port = free_port();
    let procs: Vec<Proc> = (0..6).map(|r| rank(port, r, 6, 3, "20s")).collect();
    let out: Vec<_> = procs
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(40)))
        .collect();
    for o in &out {
        assert_eq!(o.code, 0, "{}: {}\n{}", o.label, o.stdout, o.stderr);
    }
    let report = out[0].json();
    let barrier = &report["cluster"]["barrier"];
    assert_eq!(barrier["complete"], true, "{report:#}");
    // Six ranks, two connections: each node's leader carried its node.
    assert_eq!(barrier["connections"], 2, "{report:#}");
    for o in &out[1..] {
        assert_eq!(o.json()["cluster"]["verdict"], "ready", "{}", o.label);
    }
}

/// The sockets named `@preflight-leader/...` that process `pid` holds: its
/// listener, and one per rank that connected to it.
fn leader_sockets(pid: u32) -> usize {
    let mine = cluster::socket_inodes(pid);
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 8
                && f[7].starts_with("@preflight-leader/")
                && mine.contains(&f[6].to_string())
        })
        .count()
}

/// Node 1's leader (rank 3) dies after checking in itself and rank 4; rank
/// 5 never starts. Rank 0 names ranks 3 and 4 as lost on their host and
/// rank 5 as missing; rank 4 says its leader failed; all exit 1 within the
/// deadline.
#[test]
fn a_leader_killed_after_check_in_is_named_with_its_ranks() {
    let port = free_port();
    let checks = node_check();
    let procs: Vec<Proc> = (0..5)
        .map(|r| rank_with(port, r, 6, 3, "8s", &[checks.path()]))
        .collect();
    // The leader holds its listener and rank 4's connection: rank 4 is
    // checking in through it.
    let leader = procs[3].pid;
    let start = Instant::now();
    while leader_sockets(leader) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "rank 4 never connected to its leader"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    cluster::wait_checked_in(leader, port);
    procs[3].kill();
    let out: Vec<_> = procs
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(30)))
        .collect();
    for (r, o) in out.iter().enumerate() {
        if r != 3 {
            assert_eq!(o.code, 1, "{}: {}\n{}", o.label, o.stdout, o.stderr);
        }
    }
    let report = out[0].json();
    let c = &report["cluster"];
    let lost: Vec<u64> = c["barrier"]["lost"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(lost, [3, 4], "{report:#}");
    assert_eq!(c["barrier"]["missing_ranks"], "5", "{report:#}");
    let host = c["barrier"]["lost"][0]["node"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!host.is_empty());
    let barrier = c["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == "cluster.barrier")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        barrier.contains(&format!(
            "ranks 3-4 on {host} checked in, then went away before the verdict"
        )),
        "{barrier}"
    );
    // Rank 4 heard it from its leader's side, and says so.
    let r4 = out[4].json();
    let msg = r4["cluster"]["checks"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains(
            "this node's leader (local rank 0), which checks its ranks in with rank 0, failed"
        ),
        "{msg}"
    );
    // Its node's check was its leader's to evaluate: not evaluated, and
    // said, never a silent pass.
    let node = r4["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "t.node")
        .unwrap();
    assert_eq!(node["status"], "error", "{node:#}");
    assert!(
        node["message"]
            .as_str()
            .unwrap()
            .contains("went away before it shared its findings"),
        "{node:#}"
    );
}

/// A follower whose leader never starts checks in with rank 0 on its own:
/// rank 0 names the leader missing, not the whole node.
#[test]
fn ranks_whose_leader_never_starts_check_in_directly() {
    let port = free_port();
    let checks = node_check();
    let procs: Vec<Proc> = [0, 1, 2, 4, 5]
        .iter()
        .map(|r| rank_with(port, *r, 6, 3, "8s", &[checks.path()]))
        .collect();
    let out: Vec<_> = procs
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(30)))
        .collect();
    for o in &out {
        assert_eq!(o.code, 1, "{}: {}\n{}", o.label, o.stdout, o.stderr);
    }
    // Ranks 4 and 5 found no leader: each evaluated its node's check
    // itself, and said why.
    for o in &out[3..] {
        assert!(
            o.stderr
                .contains("this node's leader (local rank 0) did not answer on its local socket"),
            "{}: {}",
            o.label,
            o.stderr
        );
        let c = o.json()["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "t.node")
            .unwrap()
            .clone();
        assert_eq!(c["status"], "pass", "{}: {c:#}", o.label);
        assert!(c.get("shared").is_none(), "{}: {c:#}", o.label);
    }
    let report = out[0].json();
    let b = &report["cluster"]["barrier"];
    assert_eq!(b["missing_ranks"], "3", "{report:#}");
    assert_eq!(b["missing_count"], 1, "{report:#}");
    // Ranks 4 and 5 came on their own connections.
    assert_eq!(b["connections"], 3, "{report:#}");
}

/// A node's checks run once per node: its leader evaluates them and hands
/// its findings to the node's other ranks, which evaluate only their own
/// (`scope: rank`). Every rank's report still shows the whole checklist,
/// the node's findings marked as shared, a node failure on each.
#[test]
fn a_nodes_checks_run_once_and_every_rank_reports_them() {
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
    let mut args = run_args("20s");
    args.extend(["--checks".into(), checks.display().to_string()]);
    let procs: Vec<Proc> = (0..4)
        .map(|r| {
            let (rs, ps) = (r.to_string(), port.to_string());
            local(
                &format!("rank {r}"),
                &args,
                &[
                    ("RANK", rs.as_str()),
                    ("WORLD_SIZE", "4"),
                    ("LOCAL_RANK", rs.as_str()),
                    ("LOCAL_WORLD_SIZE", "4"),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", ps.as_str()),
                    ("PREFLIGHT_TOKEN", TOKEN),
                ],
            )
        })
        .collect();
    let out: Vec<_> = procs
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(40)))
        .collect();
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
        let report = o.json();
        let check = |id: &str| {
            report["checks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["id"] == id)
                .unwrap_or_else(|| panic!("{} has no {id}: {report:#}", o.label))
                .clone()
        };
        let shared = r != 0;
        for (id, status) in [("t.node_count", "pass"), ("t.node_fault", "fail")] {
            let c = check(id);
            assert_eq!(c["status"], status, "{}: {c:#}", o.label);
            assert_eq!(
                c["shared"].as_bool().unwrap_or(false),
                shared,
                "{}: {c:#}",
                o.label
            );
        }
        for id in ["t.rank_count", "t.rank_env"] {
            let c = check(id);
            assert_eq!(c["status"], "pass", "{}: {c:#}", o.label);
            assert!(c.get("shared").is_none(), "{}: {c:#}", o.label);
        }
    }
}

/// A node's leader judges the job secret for its node's ranks; a secret
/// too easy to guess is still refused on every rank (exit 2): the leader
/// refuses it, and a rank that finds no leader to prove it to judges it
/// itself.
#[test]
fn a_weak_secret_is_refused_on_every_local_rank() {
    let port = free_port().to_string();
    let procs: Vec<Proc> = (0..2)
        .map(|r| {
            let rs = r.to_string();
            local(
                &format!("rank {r}"),
                &run_args("10s"),
                &[
                    ("RANK", rs.as_str()),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_RANK", rs.as_str()),
                    ("LOCAL_WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", port.as_str()),
                    ("PREFLIGHT_TOKEN", "correcthorsebatterystaple"),
                ],
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
