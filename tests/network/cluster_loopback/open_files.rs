//! Rank 0's open-files limit: one connection a rank, so a hard limit
//! below the world is said, with its fix, however the connections come.

use super::*;

/// A job of `world` ranks on loopback at `port`, the collective stage off,
/// within `timeout`; rank 0 under `prlimit limit`, with `rank0` added to
/// its arguments. Each rank's outcome, in rank order.
fn job_with_rank_0_limited(
    world: u32,
    port: &str,
    timeout: &str,
    limit: &str,
    rank0: &[String],
) -> Vec<Outcome> {
    let mut args = run_args(timeout);
    args.extend(["--collective".to_string(), "off".to_string()]);
    let w = world.to_string();
    let procs: Vec<_> = (0..world)
        .map(|r| {
            let rank = r.to_string();
            let mut args = args.clone();
            let wrapper: &[&str] = if r == 0 {
                args.extend(rank0.iter().cloned());
                &["prlimit", limit]
            } else {
                &[]
            };
            local_under(wrapper, &format!("rank{r}"), &args, &env(&rank, &w, port))
        })
        .collect();
    procs
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(60)))
        .collect()
}

/// Rank 0 holds a connection per rank. Started with a soft open-files
/// limit below the world (32 for 48 ranks, the hard limit left as it is),
/// it raises the soft limit to the hard one and serves every rank. With the
/// hard limit at 32 as well it cannot: the report says so, with the fix.
#[test]
fn rank_0_raises_its_open_files_limit_and_names_one_too_low() {
    let _shared = crate::common::shared();
    let world = 48u32;
    for (limit, ready) in [("--nofile=32:", true), ("--nofile=32:32", false)] {
        let port = cluster::free_port().to_string();
        let timeout = if ready { "30s" } else { "6s" };
        let out = job_with_rank_0_limited(world, &port, timeout, limit, &[]);
        let report = out[0].report();
        let warnings = report.cluster().warnings.join("\n");
        if ready {
            all_exit(&out, 0);
            assert!(report.cluster().barrier.complete);
            assert!(!warnings.contains("open-files"), "{warnings}");
        } else {
            assert_eq!(out[0].code, 1, "{}", out[0].stderr);
            assert!(
                warnings.contains("open-files"),
                "{warnings}\n{}\n{:#?}",
                out[0].stderr,
                report.cluster()
            );
            assert!(warnings.contains("hard 32"), "{warnings}");
            assert!(warnings.contains("48 ranks need about 112"), "{warnings}");
            assert!(warnings.contains("raise the hard limit"), "{warnings}");
        }
    }
}

/// Rank 0 at a hard open-files limit of 32 whose own check-in comes last:
/// a check of its holds its checklist until 30 of the other ranks are
/// connected to its port (`ss`), its descriptors all taken by then. Its own
/// check-in never reaches its server; its report is still its server's
/// verdict, rank 0 missing from it, with the open-files warning and its own
/// check-in's failure, not "cannot reach the master" of itself (as CI's
/// load once ordered it).
#[test]
fn rank_0_whose_own_check_in_finds_no_descriptor_reports_its_servers_verdict() {
    let _shared = crate::common::shared();
    let world = 48u32;
    let port = cluster::free_port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let last = dir.path().join("last.yaml");
    let wait = format!(
        "until [ \"$(ss -Htn state established '( sport = :{port} )' | wc -l)\" -ge 30 ]; do sleep 0.05; done"
    );
    std::fs::write(
        &last,
        format!(
            "checks:\n  - id: test.others_first\n    kind: command\n    area: test\n    argv: [sh, -c, {wait:?}]\n    timeout: 15s\n"
        ),
    )
    .unwrap();
    let others_first = ["--checks".to_string(), last.display().to_string()];
    let out = job_with_rank_0_limited(world, &port, "15s", "--nofile=32:32", &others_first);
    let report = out[0].report();
    assert_eq!(out[0].code, 1, "{}", out[0].stderr);
    // Its wait ended with 30 others connected, or could not start: the
    // others' connections had taken the descriptors its pipes need (a
    // load that runs them ahead of rank 0's checklist). Either way rank
    // 0's own check-in comes after its descriptors are gone.
    let checks = common::result(&report, "test.others_first");
    assert!(
        checks.status == Status::Pass || checks.message.contains("os error 24"),
        "{checks:?}"
    );
    let warnings = report.cluster().warnings.join("\n");
    assert!(
        warnings.contains("open-files"),
        "{warnings}\n{:#?}",
        report.cluster()
    );
    assert!(
        warnings.contains("rank 0's own check-in did not complete"),
        "{warnings}"
    );
    let c = report.cluster();
    assert!(c.node_count > 0 && !c.barrier.complete, "{c:#?}");
    assert_eq!(c.barrier.missing.first().map(|m| m.rank), Some(0), "{c:#?}");
    assert_eq!(c.verdict, Verdict::NotReady, "{c:#?}");
}
