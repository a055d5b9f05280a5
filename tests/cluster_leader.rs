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

/// Rank `r` of a job of `world` ranks, `per_node` on each node.
fn rank(port: u16, r: u32, world: u32, per_node: u32, timeout: &str) -> Proc {
    let (rank, world_s, local_rank, local_world, port_s) = (
        r.to_string(),
        world.to_string(),
        (r % per_node).to_string(),
        per_node.to_string(),
        port.to_string(),
    );
    local(
        &format!("rank {r}"),
        &run_args(timeout),
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
    let procs: Vec<Proc> = (0..5).map(|r| rank(port, r, 6, 3, "8s")).collect();
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
}

/// A follower whose leader never starts checks in with rank 0 on its own:
/// rank 0 names the leader missing, not the whole node.
#[test]
fn ranks_whose_leader_never_starts_check_in_directly() {
    let port = free_port();
    let procs: Vec<Proc> = [0, 1, 2, 4, 5]
        .iter()
        .map(|r| rank(port, *r, 6, 3, "8s"))
        .collect();
    let out: Vec<_> = procs
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(30)))
        .collect();
    for o in &out {
        assert_eq!(o.code, 1, "{}: {}\n{}", o.label, o.stdout, o.stderr);
    }
    let report = out[0].json();
    let b = &report["cluster"]["barrier"];
    assert_eq!(b["missing_ranks"], "3", "{report:#}");
    assert_eq!(b["missing_count"], 1, "{report:#}");
    // Ranks 4 and 5 came on their own connections.
    assert_eq!(b["connections"], 3, "{report:#}");
}
