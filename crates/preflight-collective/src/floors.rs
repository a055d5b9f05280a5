//! `collective.floors`: the collective stage's figures against the
//! measured floors of this node's profile: bus bandwidth per backend,
//! operation and size (the job's figure: below, every rank fails), and
//! this node's pairs with other nodes (below with every node: this node
//! fails; with some: a warning naming them, as a slow link drains no
//! node). A floor the run did not measure (a backend absent, a size the
//! sweep did not reach) cannot be judged, and says why.

use preflight_facts::profile::Profile;
use preflight_ground::values::format_bytes;
use preflight_result::collective::CollectiveReport;
use preflight_result::{CheckResult, Status};

pub const FLOORS: &str = "collective.floors";
pub const FLOORS_HINT: &str = "Compare the node with a healthy one of its kind (`preflight bench` on both), and the profile's floors with what `preflight baseline capture --from` measured; a floor set from another cluster or library version may not hold here.";

/// Most pairs named in one message.
const PAIRS_SHOWN: usize = 8;

/// The floors of `profile`, where it has any, against the stage's report,
/// as rank `me` holds them: the bus bandwidth (the job's, every rank's),
/// and the pairs of `me`'s node; `hosts` gives each rank's node (a pair on
/// one node is no network pair).
pub fn judge(
    r: &CollectiveReport,
    profile: &Profile,
    hosts: &[String],
    me: u32,
) -> Option<CheckResult> {
    // A profile with only copy floors (`gpu_bandwidth` holds them) sets
    // nothing for the stage.
    let floors = profile
        .expect
        .floors
        .as_ref()
        .filter(|f| !f.busbw.is_empty() || f.pair_gbps.is_some())?;
    let named = profile.named();
    let mut below = Vec::new();
    let mut unmeasured = Vec::new();
    let mut met = Vec::new();
    for f in &floors.busbw {
        let what = format!("{} {} {}", f.backend, f.op, format_bytes(f.size.0));
        let backend = r
            .backends
            .iter()
            .find(|b| b.name == f.backend && b.available);
        let row = backend.and_then(|b| {
            b.sweep
                .iter()
                .find(|row| row.op.name() == f.op && row.bytes as u64 == f.size.0)
        });
        match (backend, row) {
            (None, _) => unmeasured.push(format!("{what}: the {} backend did not run", f.backend)),
            (Some(_), None) => unmeasured.push(format!(
                "{what}: not measured (the sweep did not reach it: --collective full, --max-size)"
            )),
            (Some(_), Some(row)) if row.busbw < f.gbps => below.push(format!(
                "{what}: busbw {:.3} GB/s, below the floor {:.3} GB/s",
                row.busbw, f.gbps
            )),
            (Some(_), Some(row)) => met.push(format!(
                "{what} {:.3} GB/s (floor {:.3})",
                row.busbw, f.gbps
            )),
        }
    }
    // This node's pairs with other nodes (each node pair's best rate):
    // below the floor with every other node, the node is slow; with some,
    // the paths to those are (a warning, as the second pass's slow links:
    // no node to drain).
    let mut with_some = false;
    if let Some(floor) = floors.pair_gbps {
        let node = |r: u32| crate::isolate::node(hosts, r);
        let here = node(me);
        let mine: Vec<_> = crate::isolate::node_pairs(&r.pairs, hosts, r.world_size)
            .into_iter()
            .filter(|p| node(p.a) == here || node(p.b) == here)
            .collect();
        let other = |p: &preflight_result::collective::PairRate| {
            if node(p.a) == here {
                node(p.b)
            } else {
                node(p.a)
            }
        };
        if mine.is_empty() {
            unmeasured.push(format!(
                "pairs: no pair of {here} with another node was measured"
            ));
        }
        let mut slow: Vec<_> = mine.iter().filter(|p| p.gbps < floor).collect();
        slow.sort_by(|a, b| a.gbps.total_cmp(&b.gbps));
        if !slow.is_empty() {
            let mut said: Vec<String> = slow
                .iter()
                .take(PAIRS_SHOWN)
                .map(|p| format!("{} {:.3}", other(p), p.gbps))
                .collect();
            if slow.len() > PAIRS_SHOWN {
                said.push(format!("and {} more", slow.len() - PAIRS_SHOWN));
            }
            let text = format!(
                "{here} below the pair floor {floor:.3} GB/s with {} of {} nodes: {} GB/s",
                slow.len(),
                mine.len(),
                said.join(", ")
            );
            if slow.len() == mine.len() {
                below.push(text);
            } else {
                with_some = true;
                met.push(text);
            }
        } else if !mine.is_empty() {
            met.push(format!(
                "{here} ≥ {floor:.3} GB/s with {} nodes",
                mine.len()
            ));
        }
    }
    let (status, message) = if !below.is_empty() {
        let mut all = below;
        all.extend(unmeasured);
        (Status::Fail, format!("against {named}: {}", all.join("; ")))
    } else if !unmeasured.is_empty() {
        (
            Status::Error,
            format!("against {named}: {}", unmeasured.join("; ")),
        )
    } else if with_some {
        (Status::Warn, format!("against {named}: {}", met.join("; ")))
    } else {
        (
            Status::Pass,
            format!("every floor of {named} met: {}", met.join(", ")),
        )
    };
    Some(CheckResult::built_in(
        FLOORS,
        "collective",
        "collective",
        status,
        message,
        (status != Status::Pass).then(|| FLOORS_HINT.to_string()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use preflight_result::collective::{BackendReport, Dtype, Op, PairRate, Row};

    fn report(busbw_us: f64, pairs: Vec<PairRate>) -> CollectiveReport {
        let row = Row::new(Op::Allreduce, 1 << 20, Dtype::F32, busbw_us, 4);
        CollectiveReport {
            pairs,
            ..CollectiveReport::of(
                "short",
                4,
                vec![BackendReport::available("tcp", "pass", vec![row])],
            )
        }
    }

    fn profile(floors: &str) -> Profile {
        preflight_facts::profile::parse(
            "site.yaml",
            &format!("profile: site\nmatch: {{vendor: nvidia, device_ids: [\"0x2330\"], count: 8}}\nexpect:\n  floors: {floors}\n"),
        )
        .unwrap()
    }

    #[test]
    fn each_floor_is_held_and_what_was_not_measured_says_why() {
        let hosts: Vec<String> = ["h0", "h0", "h1", "h2"].map(String::from).to_vec();
        let p = |a, b, gbps| PairRate { a, b, gbps };
        let pairs = vec![p(0, 1, 0.01), p(0, 2, 1.0), p(1, 3, 0.2), p(2, 3, 0.3)];
        // 1 MiB in 1,000 µs: algbw 1.049 GB/s, busbw × 1.5 on 4 ranks.
        let r = report(1000.0, pairs);
        let floors = |pair: f64| {
            profile(&format!(
                "{{busbw: [{{backend: tcp, op: allreduce, size: 1MiB, gbps: 1.5}}], pair_gbps: {pair}}}"
            ))
        };
        // h0's pairs: with h1 1.0, with h2 0.2 (its two ranks' pair on h0
        // is no network pair); h2's: with h0 0.2, with h1 0.3.
        let c = judge(&r, &floors(0.5), &hosts, 0).unwrap();
        assert_eq!(c.status, Status::Warn, "{}", c.message);
        assert!(
            c.message
                .contains("h0 below the pair floor 0.500 GB/s with 1 of 2 nodes: h2 0.200 GB/s"),
            "{}",
            c.message
        );
        let c = judge(&r, &floors(0.5), &hosts, 3).unwrap();
        assert_eq!(c.status, Status::Fail, "{}", c.message);
        assert_eq!(
            c.message,
            "against profile site (site.yaml): h2 below the pair floor 0.500 GB/s with 2 of 2 nodes: h0 0.200, h1 0.300 GB/s"
        );
        let c = judge(&r, &floors(0.1), &hosts, 0).unwrap();
        assert_eq!(c.status, Status::Pass, "{}", c.message);
        assert!(
            c.message.contains(
                "tcp allreduce 1 MiB 1.573 GB/s (floor 1.500), h0 ≥ 0.100 GB/s with 2 nodes"
            ),
            "{}",
            c.message
        );
        let high = profile("{busbw: [{backend: tcp, op: allreduce, size: 1MiB, gbps: 2}]}");
        let c = judge(&r, &high, &hosts, 0).unwrap();
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.message
                .contains("tcp allreduce 1 MiB: busbw 1.573 GB/s, below the floor 2.000 GB/s"),
            "{}",
            c.message
        );
        let absent = profile(
            "{busbw: [{backend: nccl, op: allreduce, size: 1MiB, gbps: 2}, {backend: tcp, op: allgather, size: 64MiB, gbps: 1}]}",
        );
        let c = judge(&r, &absent, &hosts, 0).unwrap();
        assert_eq!(c.status, Status::Error);
        assert!(
            c.message
                .contains("nccl allreduce 1 MiB: the nccl backend did not run"),
            "{}",
            c.message
        );
        assert!(
            c.message.contains("tcp allgather 64 MiB: not measured"),
            "{}",
            c.message
        );
        // No floors: nothing to say.
        let none = preflight_facts::profile::parse(
            "p.yaml",
            "profile: p\nmatch: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8}\nexpect: {nvlink: {links: 18}}\n",
        )
        .unwrap();
        assert!(judge(&r, &none, &hosts, 0).is_none());
    }
}
