//! One verdict across the job's nodes, from each node's diagnosis: what a
//! node named stands; and with every node's ranks taken together, a rank
//! that is not waiting while every other rank of the job, on every node,
//! waits is named, as is a rank no node has (when every node answered).
//! A node that could not be asked is said, and nothing is inferred for
//! the ranks it would have run.

use std::collections::BTreeMap;

use crate::result::diagnosis::{
    CLUSTER_SCHEMA, ClusterDiagnosis, Culprit, Diagnosis, RankState, Unreachable,
};

pub fn merge(nodes: Vec<Diagnosis>, unreachable: Vec<Unreachable>) -> ClusterDiagnosis {
    let mut culprits: Vec<Culprit> = Vec::new();
    let mut paths: Vec<String> = Vec::new();
    let add = |c: &Culprit, culprits: &mut Vec<Culprit>| {
        if !culprits
            .iter()
            .any(|x| x.rank == c.rank && x.node == c.node && x.pid == c.pid)
        {
            culprits.push(c.clone());
        }
    };
    // Each job's ranks, from every node: (node, rank state), and its world.
    let mut jobs: BTreeMap<String, (u32, Vec<(String, RankState)>)> = BTreeMap::new();
    for d in &nodes {
        for j in &d.jobs {
            for c in &j.culprits {
                add(c, &mut culprits);
            }
            paths.extend(j.paths.iter().map(|p| format!("{}: {p}", d.node)));
            let e = jobs
                .entry(j.job.clone())
                .or_insert((j.world_size, Vec::new()));
            e.0 = e.0.max(j.world_size);
            e.1.extend(j.ranks.iter().map(|r| (d.node.clone(), r.clone())));
        }
        for c in d.nccl_ras.iter().flat_map(|r| r.culprits.iter()) {
            add(c, &mut culprits);
        }
    }
    let mut summary = Vec::new();
    for (job, (world, ranks)) in &jobs {
        let waiting: Vec<u32> = ranks
            .iter()
            .filter(|(_, r)| r.state == "waiting")
            .map(|(_, r)| r.rank)
            .collect();
        let odd: Vec<&(String, RankState)> = ranks
            .iter()
            .filter(|(_, r)| r.state != "waiting" && r.state != "idle")
            .collect();
        let seen: Vec<u32> = ranks.iter().map(|(_, r)| r.rank).collect();
        let absent: Vec<u32> = if unreachable.is_empty() {
            (0..*world).filter(|r| !seen.contains(r)).collect()
        } else {
            Vec::new()
        };
        if waiting.is_empty() || (odd.is_empty() && absent.is_empty()) {
            continue;
        }
        let others = format!(
            "{} {} on {}",
            super::rank_list(&waiting),
            if waiting.len() == 1 {
                "waits,"
            } else {
                "wait,"
            },
            crate::values::count(
                ranks
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<std::collections::BTreeSet<_>>()
                    .len(),
                "node"
            )
        );
        summary.push(format!("{job}: {others}"));
        for (node, r) in odd {
            add(
                &Culprit {
                    rank: r.rank,
                    node: node.clone(),
                    pid: Some(r.pid),
                    reason: format!("{} while {others}", r.doing),
                },
                &mut culprits,
            );
        }
        for r in absent {
            add(
                &Culprit {
                    rank: r,
                    node: "?".into(),
                    pid: None,
                    reason: format!(
                        "absent: no node of the job runs rank {r} (it exited, or never started), while {others}"
                    ),
                },
                &mut culprits,
            );
        }
    }
    let verdict = if !culprits.is_empty() || !paths.is_empty() {
        "held"
    } else if !unreachable.is_empty() {
        "unknown"
    } else if nodes.iter().all(|d| d.verdict == "no_job") {
        "no_job"
    } else if nodes
        .iter()
        .all(|d| matches!(d.verdict.as_str(), "progressing" | "no_job"))
    {
        "progressing"
    } else {
        "unknown"
    };
    if !unreachable.is_empty() {
        summary.push(format!(
            "{} not asked: nothing is said of the ranks there",
            crate::values::count(unreachable.len(), "node")
        ));
    }
    ClusterDiagnosis {
        schema: CLUSTER_SCHEMA.into(),
        nodes,
        unreachable,
        culprits,
        paths,
        summary: summary.join("; "),
        verdict: verdict.into(),
    }
}
