//! The prolog's cluster stage: the job's allocation meets before the job
//! starts. A prolog sees SLURM_NODELIST (not the SLURM_JOB_NODELIST of a
//! job step), SLURM_JOB_ID and SLURMD_NODENAME; from them every node
//! derives the same world without talking: its rank is its position in
//! the expanded nodelist, the master is the first node (at its NodeAddr),
//! the port is picked from the site's range by the job's secret (rank 0
//! moves on within the range when something holds it), and the secret
//! is the site key's HMAC of the job id, which every prolog (root) can
//! compute and no user can.

use std::collections::BTreeMap;

use super::reason::{Action, reason};
use super::scontrol::Slurm;
use crate::site::{OnSquat, Settings};
use preflight_cluster::auth::job_secret;
use preflight_cluster::hostlist;
use preflight_result::cluster::ClusterReport;
use preflight_result::{Status, Verdict};

/// The variables the stages read to place this node in the job.
pub fn environment(
    settings: &Settings,
    slurm: &Slurm,
    env: &BTreeMap<String, String>,
    own: &str,
) -> Result<BTreeMap<String, String>, String> {
    let get = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned();
    let list = get("SLURM_NODELIST")
        .or_else(|| get("SLURM_JOB_NODELIST"))
        .ok_or("the prolog's cluster stage needs SLURM_NODELIST (set by slurmd for a prolog)")?;
    let nodes = hostlist::expand(&list).map_err(|e| format!("SLURM_NODELIST: {e}"))?;
    let rank = nodes.iter().position(|n| n == own).ok_or_else(|| {
        format!("this node ({own}, SLURMD_NODENAME) is not in SLURM_NODELIST={list}")
    })?;
    let job = get("SLURM_JOB_ID").ok_or("the prolog's cluster stage needs SLURM_JOB_ID")?;
    // A job id that is not one is a broken prolog environment, said as such.
    job.split(['_', '.'])
        .next()
        .and_then(|j| j.parse::<u64>().ok())
        .ok_or_else(|| format!("SLURM_JOB_ID={job} is not a job number"))?;
    let range = settings.prolog_ports;
    let span = u64::from(range.last - range.first) + 1;
    let master = slurm.node_addr(&nodes[0])?;
    let secret = job_secret(&settings.site_key_file, &job)?;
    // Picked by the job's secret, not by its number: anyone reads job ids
    // in `squeue`, and a port known in advance is one a stranger binds
    // first.
    let pick = preflight_cluster::auth::secret_pick(&secret, "rendezvous port");
    let port = range.first + (pick % span) as u16;
    let mut out = env.clone();
    for (k, v) in [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", nodes.len().to_string()),
        ("LOCAL_RANK", "0".into()),
        ("LOCAL_WORLD_SIZE", "1".into()),
        ("GROUP_RANK", rank.to_string()),
        ("MASTER_ADDR", master),
        ("MASTER_PORT", port.to_string()),
        // Anyone can compute the port from the job id and bind it first:
        // rank 0 then moves on within the range, and the ranks find it
        // there by its proof of the job secret.
        (
            preflight_cluster::identity::MASTER_PORTS_VAR,
            range.to_string(),
        ),
        ("SLURM_JOB_NODELIST", list.clone()),
        ("PREFLIGHT_TOKEN", secret),
    ] {
        out.insert(k.into(), v);
    }
    if let Some(p) = settings.prolog_probe_ports {
        out.insert(
            preflight_cluster::identity::PROBE_PORTS_VAR.into(),
            p.to_string(),
        );
    }
    // The job's own token settings must not override the site's.
    out.remove("PREFLIGHT_TOKEN_FILE");
    Ok(out)
}

/// What the verdict means for this node: drain it when it is named as a
/// culprit. Otherwise, when the allocation is not ready, rank 0 (the
/// first node, where a batch script starts once its own prolog ends)
/// takes the job off the allocation before it starts: requeued where
/// culprits drain themselves (the scheduler places it elsewhere), requeued
/// and held where no node can be named (a node that never arrived, a
/// deadline), so it does not start into a hang; nothing is drained then.
/// Rank 0 could not serve at all because other programs hold every port
/// it may take (`cluster.rendezvous` failed with the holders found, and
/// nothing else): strangers' doing, not the node's nor the job's.
fn squatted(c: &ClusterReport) -> Option<String> {
    let failed: Vec<_> = c
        .checks
        .iter()
        .filter(|x| matches!(x.status, Status::Fail | Status::Error))
        .collect();
    match failed.as_slice() {
        [only] if only.id == "cluster.rendezvous" && !only.about.holders.is_empty() => {
            Some(only.message.clone())
        }
        _ => None,
    }
}

pub fn cluster_action(c: &ClusterReport, rank: u32, prefix: &str, on_squat: OnSquat) -> Action {
    if rank == 0
        && c.verdict != Verdict::Ready
        && let Some(why) = squatted(c)
    {
        let said = format!("strangers hold the rendezvous, the job was not checked: {why}");
        return match on_squat {
            OnSquat::Run => Action::RunNoted(reason(prefix, &format!("unchecked: {said}"), 0)),
            OnSquat::Hold => Action::StopJob {
                reason: reason(prefix, &format!("on_squat: hold: {said}"), 0),
                hold: true,
            },
        };
    }
    if let Some(culprit) = c.culprits.iter().find(|x| x.ranks.contains(&rank)) {
        let first = culprit
            .reasons
            .first()
            .cloned()
            .unwrap_or_else(|| "named by the allocation's verdict".into());
        return Action::Drain(reason(
            prefix,
            &first,
            culprit.reasons.len().saturating_sub(1),
        ));
    }
    // Ready, though strangers held a node's probe range (its listener
    // took another port): the job runs, its comment names them.
    let taken = c
        .warnings
        .iter()
        .find(|w| w.contains(preflight_cluster::PROBE_RANGE_TAKEN));
    match (c.verdict, rank, taken) {
        (Verdict::Ready, 0, Some(w)) => Action::RunNoted(reason(
            prefix,
            &format!("checked, ready; strangers hold a probe range: {w}"),
            0,
        )),
        (Verdict::Ready, _, _) => Action::Keep("ready".into()),
        (_, 0, _) => {
            let why = match c.culprits.as_slice() {
                [] => c
                    .checks
                    .iter()
                    .find(|x| matches!(x.status, Status::Fail | Status::Error))
                    .map(|x| format!("{}: {}", x.id, x.message))
                    .unwrap_or_else(|| "the allocation is not ready".into()),
                named => format!(
                    "not ready: {} drained ({})",
                    named
                        .iter()
                        .map(|x| x.node.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    named[0]
                        .reasons
                        .first()
                        .map(String::as_str)
                        .unwrap_or_default()
                ),
            };
            Action::StopJob {
                reason: reason(prefix, &why, 0),
                hold: c.culprits.is_empty(),
            }
        }
        _ => Action::Keep("not this node's fault (rank 0 acts for the job)".into()),
    }
}
