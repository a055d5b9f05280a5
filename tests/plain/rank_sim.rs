//! The rendezvous at 2,048 ranks: one real rank 0 (`preflight run`) and
//! the other ranks played by `preflight-rank-sim`, speaking the real
//! protocol from 256 simulated nodes, each with its own loopback address
//! and a real probe listener. Healthy, then one fault at a time: every
//! rank that lives leaves with rank 0's verdict, and the culprit is named.

use std::path::PathBuf;
use std::process::Command;

use crate::common::{self, Report};

const WORLD: &str = "2048";
const LAYOUT: &str = "nodes:256";

struct Sim {
    code: i32,
    out: String,
    report: Report,
}

fn simulate(extra: &[&str]) -> Sim {
    simulate_in(LAYOUT, extra)
}

fn simulate_in(layout: &str, extra: &[&str]) -> Sim {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("rank0.json");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/h100-ib-healthy/root");
    let out = Command::new(env!("CARGO_BIN_EXE_preflight-rank-sim"))
        .args(["--preflight", env!("CARGO_BIN_EXE_preflight")])
        .args(["--world", WORLD, "--layout", layout, "--timeout", "30s"])
        .arg("--root")
        .arg(&root)
        .arg("--report")
        .arg(&report)
        .args(extra)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let report = std::fs::read_to_string(&report)
        .map(|t| common::report(&t, &text))
        .unwrap_or_else(|e| panic!("rank 0 wrote no report ({e})\n{text}"));
    Sim {
        code: out.status.code().unwrap_or(-1),
        out: text,
        report,
    }
}

fn culprit_nodes(report: &Report) -> Vec<&str> {
    report
        .cluster()
        .culprits
        .iter()
        .map(|c| c.node.as_str())
        .collect()
}

#[test]
fn two_thousand_healthy_ranks_get_one_ready_verdict() {
    let _serial = crate::common::serial();
    let sim = simulate(&[]);
    assert_eq!(sim.code, 0, "{}", sim.out);
    assert!(sim.out.contains("rank 0: pid"), "{}", sim.out);
    assert!(sim.out.contains(", exit 0, verdict ready"), "{}", sim.out);
    assert!(
        sim.out.contains("ranks: 2047 × ready (exit 0)"),
        "{}",
        sim.out
    );
    assert!(
        sim.out
            .contains("ranks=2048 layout=nodes:256 nodes=256 checkin_ms="),
        "{}",
        sim.out
    );
    let cluster = sim.report.cluster();
    assert_eq!(cluster.node_count, 256, "{}", sim.out);
    assert_eq!(cluster.nodes.len(), 256);
    assert!(culprit_nodes(&sim.report).is_empty());
    // 256 nodes: the sampled matrix, every node probed and probing.
    assert_eq!(cluster.reachability.mode, "ring + hypercube");
    // Every node checked in as the GPU node of the fixture it reads.
    let devices = cluster
        .checks
        .iter()
        .find(|c| c.id == "cluster.devices")
        .unwrap();
    assert_eq!(
        devices.message, "8 devices on each of 256 nodes",
        "{devices:#?}"
    );
    // Hierarchical: one connection per node (rank 0's node's ranks came
    // through rank 0's own relay, over its local socket).
    assert_eq!(cluster.barrier.connections, 256, "{}", sim.out);
}

/// Without a known layout every rank checks in on its own connection, and
/// the verdict is the same.
#[test]
fn two_thousand_ranks_without_a_layout_check_in_one_by_one() {
    let _serial = crate::common::serial();
    let sim = simulate_in("flat", &[]);
    assert_eq!(sim.code, 0, "{}", sim.out);
    assert!(
        sim.out.contains("ranks: 2047 × ready (exit 0)"),
        "{}",
        sim.out
    );
    let cluster = sim.report.cluster();
    assert_eq!(cluster.barrier.connections, 2048, "{}", sim.out);
    assert_eq!(cluster.node_count, 256, "{}", sim.out);
}

/// A node that dies after checking in: its ranks are lost, named with
/// their host, and every other rank exits 1 with rank 0's verdict.
#[test]
fn a_node_that_dies_after_check_in_is_named_and_every_rank_agrees() {
    let _serial = crate::common::serial();
    let sim = simulate(&["--kill-node", "77"]);
    assert_eq!(sim.code, 0, "one verdict for the job\n{}", sim.out);
    assert!(sim.out.contains("exit 1, verdict not_ready"), "{}", sim.out);
    assert!(
        sim.out.contains("ranks: 2039 × not_ready (exit 1)"),
        "{}",
        sim.out
    );
    assert!(
        sim.out
            .contains("ranks: 8 × no verdict: killed after check-in"),
        "{}",
        sim.out
    );
    let lost = &sim.report.cluster().barrier.lost;
    assert_eq!(lost.len(), 8, "{lost:?}");
    for l in lost {
        assert_eq!(l.node, "sim00077", "{l:?}");
        assert!((77 * 8..78 * 8).contains(&l.rank), "{l:?}");
    }
    assert_eq!(culprit_nodes(&sim.report), ["sim00077"], "{}", sim.out);
}

/// Two processes claiming one rank: both named, and the verdict is not
/// ready on every rank.
#[test]
fn two_ranks_claiming_one_rank_are_named() {
    let _serial = crate::common::serial();
    let sim = simulate(&["--duplicate", "1500"]);
    assert_eq!(sim.code, 0, "{}", sim.out);
    assert!(
        sim.out.contains("ranks: 2048 × not_ready (exit 1)"),
        "the second claimant hears the verdict too\n{}",
        sim.out
    );
    let dups = &sim.report.cluster().barrier.duplicates;
    assert_eq!(dups.len(), 1, "{dups:?}");
    assert_eq!(dups[0].rank, 1500);
    assert_eq!(dups[0].claimants.len(), 2, "{:?}", dups[0]);
}

/// A node whose probe listener drops every connection: reachability
/// names it, every rank agrees.
#[test]
fn a_node_that_drops_its_probes_is_named_in_reachability() {
    let _serial = crate::common::serial();
    let sim = simulate(&["--deaf-node", "200"]);
    assert_eq!(sim.code, 0, "{}", sim.out);
    assert!(
        sim.out.contains("ranks: 2047 × not_ready (exit 1)"),
        "{}",
        sim.out
    );
    // The findings as one text, as the check below reads them.
    let findings = sim.report.cluster().reachability.findings.join("\n");
    assert!(findings.contains("sim00200"), "{findings}");
    assert_eq!(culprit_nodes(&sim.report), ["sim00200"], "{}", sim.out);
}

/// The simulated nodes played by several processes (each has its own
/// descriptors: how 16,384 nodes are played on a machine that allows
/// 20,000 per process): the same one verdict, every rank's outcome
/// gathered, and rank 0's report says where its time went.
#[test]
fn nodes_played_by_several_processes_get_one_verdict() {
    let _serial = crate::common::serial();
    let sim = simulate(&["--shards", "3"]);
    assert_eq!(sim.code, 0, "{}", sim.out);
    assert!(sim.out.contains("(3 process(es))"), "{}", sim.out);
    assert!(
        sim.out.contains("ranks: 2047 × ready (exit 0)"),
        "{}",
        sim.out
    );
    assert!(sim.out.contains("one verdict: every rank"), "{}", sim.out);
    // Each phase is there, in ms: the type reads no phases with one
    // missing.
    let cluster = sim.report.cluster();
    assert!(cluster.phases.is_some(), "no phases: {}", sim.report);
    // Every node probed and was probed: the shards' listeners are where
    // the plan says.
    let probes = &cluster.reachability.probes;
    assert!(probes.len() > 256 * 8, "{}", probes.len());
    assert!(
        probes.iter().all(|p| p.status == "ok"),
        "{:?}",
        probes.iter().find(|p| p.status != "ok")
    );
}
