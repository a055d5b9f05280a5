//! One verdict across the job's nodes, from each node's diagnosis. A job
//! whose ranks moved bytes on any node is progressing. Otherwise what a
//! node named stands; and with every node's ranks taken together, a rank
//! that is not waiting while every other rank of the job, on every node,
//! waits is named. A rank no node has is absent only when every node of
//! the job was asked (the nodes' ranks add up to the world); else it runs
//! on a node not asked, said as such, and a verdict that would need that
//! node is unknown, naming the ranks to look for there. A node that
//! could not be asked is said, and nothing is inferred for its ranks.

use std::collections::{BTreeMap, BTreeSet};

use preflight_result::diagnosis::{
    CLUSTER_SCHEMA, ClusterDiagnosis, Culprit, Diagnosis, RankState, Unreachable,
};

#[derive(Default)]
struct JobAcross {
    world: u32,
    ranks: Vec<(String, RankState)>,
    /// Each node's own count of the job's ranks there, where it knew it.
    expected: Vec<Option<u32>>,
    /// Culprits the nodes named for this job.
    culprits: Vec<Culprit>,
    paths: Vec<String>,
    moved: Vec<String>,
}

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
    let mut jobs: BTreeMap<String, JobAcross> = BTreeMap::new();
    for d in &nodes {
        for j in &d.jobs {
            let e = jobs.entry(j.job.clone()).or_default();
            e.world = e.world.max(j.world_size);
            e.ranks
                .extend(j.ranks.iter().map(|r| (d.node.clone(), r.clone())));
            e.expected.push(j.expected_here);
            e.culprits.extend(j.culprits.iter().cloned());
            e.paths
                .extend(j.paths.iter().map(|p| format!("{}: {p}", d.node)));
            e.moved
                .extend(j.moved.iter().map(|m| format!("{}: {m}", d.node)));
        }
        for c in d.nccl_ras.iter().flat_map(|r| r.culprits.iter()) {
            add(c, &mut culprits);
        }
    }
    let mut summary = Vec::new();
    let mut elsewhere_said = Vec::new();
    for (job, j) in &jobs {
        if !j.moved.is_empty() {
            summary.push(format!("{job}: the job moves ({})", j.moved.join("; ")));
            continue;
        }
        for c in &j.culprits {
            add(c, &mut culprits);
        }
        paths.extend(j.paths.iter().cloned());
        let seen: BTreeSet<u32> = j.ranks.iter().map(|(_, r)| r.rank).collect();
        let counted: Option<u32> = j.expected.iter().copied().sum();
        let every_node =
            seen.len() as u32 == j.world || (unreachable.is_empty() && counted == Some(j.world));
        let unseen: Vec<u32> = (0..j.world).filter(|r| !seen.contains(r)).collect();
        let waiting: Vec<u32> = j
            .ranks
            .iter()
            .filter(|(_, r)| r.state == "waiting")
            .map(|(_, r)| r.rank)
            .collect();
        let odd: Vec<&(String, RankState)> = j
            .ranks
            .iter()
            .filter(|(_, r)| !matches!(r.state.as_str(), "waiting" | "idle" | "moving"))
            .collect();
        let absent: Vec<u32> = if every_node {
            unseen.clone()
        } else {
            Vec::new()
        };
        if !every_node && !unseen.is_empty() {
            elsewhere_said.push(format!(
                "{job}: {} {} on nodes not asked: nothing is said of {}",
                super::rank_list(&unseen),
                if unseen.len() == 1 { "runs" } else { "run" },
                if unseen.len() == 1 { "it" } else { "them" }
            ));
        }
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
            preflight_ground::values::count(
                j.ranks
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<BTreeSet<_>>()
                    .len(),
                "node"
            )
        );
        summary.push(format!("{job}: {others}"));
        for (node, r) in odd {
            let (evidence, next_step) = super::judge::next_step(r, !r.stack.is_empty());
            add(
                &Culprit {
                    rank: r.rank,
                    node: node.clone(),
                    pid: Some(r.pid),
                    reason: format!("{} while {others}", r.doing),
                    evidence: evidence.into(),
                    next_step,
                    stack: r.stack.clone(),
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
                    evidence: "rank".into(),
                    next_step: "read the job's output for why it ended or never started; drain its node only if the node killed it".into(),
                    stack: Vec::new(),
                },
                &mut culprits,
            );
        }
    }
    let verdict = if !culprits.is_empty() || !paths.is_empty() {
        "held"
    } else if !unreachable.is_empty() || !elsewhere_said.is_empty() {
        "unknown"
    } else if nodes.iter().all(|d| d.verdict == "no_job") {
        "no_job"
    } else if nodes
        .iter()
        .all(|d| matches!(d.verdict.as_str(), "progressing" | "no_job"))
        || jobs.values().all(|j| !j.moved.is_empty())
    {
        "progressing"
    } else {
        "unknown"
    };
    if verdict == "unknown" && !elsewhere_said.is_empty() {
        summary.push(
            "the verdict needs the nodes not asked: add them to --hosts (or use --slurm)".into(),
        );
    }
    if !unreachable.is_empty() {
        summary.push(format!(
            "{} not asked: nothing is said of the ranks there",
            preflight_ground::values::count(unreachable.len(), "node")
        ));
    }
    ClusterDiagnosis {
        schema: CLUSTER_SCHEMA.into(),
        nodes,
        unreachable,
        elsewhere: elsewhere_said,
        culprits,
        paths,
        summary: summary.join("; "),
        verdict: verdict.into(),
    }
}
