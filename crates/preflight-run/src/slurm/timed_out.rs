//! The epilog of a job that ran out of time. By then every rank is gone,
//! so the evidence is what a watchdog in the job saved before the end
//! (`preflight diagnose --slurm --output FILE`, at the warning signal
//! `sbatch --signal` sends). The batch host's epilog reads it, and drains
//! each of the job's nodes where it names a rank that held the job up on
//! evidence against the node (a GPU driver's wait, a peer NCCL's RAS
//! finds dead), with that rank and why in the reason. A rank held in the
//! job's own code (asleep, spinning, blocked, a mismatched collective)
//! is logged with what to do, and drains nothing: draining a healthy
//! node for a software fault takes it from every other job. No file, a
//! job that ended otherwise, a verdict that names no rank: nothing is
//! drained.
//!
//! The file is the job's user's: it is read only when it is a plain file
//! the user (or root) owns, bounded in size, and it can drain no node
//! outside the job's own allocation.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::scontrol::{self, JobState, Slurm};
use preflight_result::diagnosis::{CLUSTER_SCHEMA, ClusterDiagnosis, Culprit, Diagnosis, SCHEMA};

/// A diagnosis of a thousand nodes' culprits is well under this; parsed
/// whole by root on a compute node, it stays small.
const MAX_FILE: u64 = 4 << 20;
/// Culprits acted on at most: a diagnosis naming more is a job whose
/// every node waited, or a forged file.
const MOST_CULPRITS: usize = 64;

/// What the epilog learnt and did; each line for its log.
#[derive(Debug, Default)]
pub struct Outcome {
    pub lines: Vec<String>,
    /// This node was drained on the diagnosis.
    pub drained_self: bool,
    /// A drain the diagnosis asked for did not happen.
    pub failed: bool,
}

/// `%j` the job id, `%w` its working directory, `%n` this node.
fn path(pattern: &str, job: &str, env: &dyn Fn(&str) -> Option<String>, own: &str) -> PathBuf {
    PathBuf::from(
        pattern
            .replace("%j", job)
            .replace("%w", &env("SLURM_JOB_WORK_DIR").unwrap_or_default())
            .replace("%n", own),
    )
}

/// The culprits the saved file names, or why it is not taken.
fn read_culprits(
    file: &std::path::Path,
    owner: Option<u32>,
) -> Result<Option<Vec<Culprit>>, String> {
    use preflight_facts::guarded_file::{self, Refused};
    let judged = guarded_file::read(file, MAX_FILE, |meta| {
        if meta.uid() != 0 && Some(meta.uid()) != owner {
            return Err(format!(
                "{}: owned by uid {}, neither the job's user nor root",
                file.display(),
                meta.uid()
            ));
        }
        Ok(())
    });
    let text = match judged {
        Ok(Ok(t)) => t,
        Ok(Err(why)) => return Err(why),
        Err(Refused::Missing) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", file.display())),
    };
    // Its schema first, then the typed document: no tree of the whole.
    #[derive(serde::Deserialize)]
    struct Head {
        schema: Option<String>,
    }
    let not = |e: serde_json::Error| format!("{}: not a diagnosis: {e}", file.display());
    let head: Head = serde_json::from_slice(&text).map_err(not)?;
    let mut culprits = match head.schema.as_deref() {
        Some(CLUSTER_SCHEMA) => {
            let c: ClusterDiagnosis = serde_json::from_slice(&text).map_err(not)?;
            if c.verdict == "held" {
                c.culprits
            } else {
                Vec::new()
            }
        }
        Some(SCHEMA) => {
            let d: Diagnosis = serde_json::from_slice(&text).map_err(not)?;
            if d.verdict == "held" {
                d.jobs.into_iter().flat_map(|j| j.culprits).collect()
            } else {
                Vec::new()
            }
        }
        other => {
            return Err(format!(
                "{}: a {} document, not a diagnosis",
                file.display(),
                other.unwrap_or("schemaless")
            ));
        }
    };
    culprits.truncate(MOST_CULPRITS);
    Ok(Some(culprits))
}

/// The short name: a node's hostname may be its FQDN, Slurm's name not.
fn short(n: &str) -> &str {
    n.split('.').next().unwrap_or(n)
}

/// Reads the saved diagnosis of a job that ran out of time and drains the
/// nodes it names, on the batch host only (where the watchdog ran).
pub fn act(
    pattern: Option<&str>,
    slurm: &Slurm,
    env: &dyn Fn(&str) -> Option<String>,
    own: &str,
    prefix: &str,
) -> Outcome {
    let mut out = Outcome::default();
    let (Some(pattern), Some(job)) = (pattern, env("SLURM_JOB_ID").filter(|j| !j.is_empty()))
    else {
        return out;
    };
    let state: JobState = match slurm.job(&job) {
        Ok(s) => s,
        Err(e) => {
            // Not known to have run out of time: nothing to act on, and
            // no reason for an Epilog error on this node.
            out.lines
                .push(format!("the job's saved diagnosis not read: {e}"));
            return out;
        }
    };
    let acting = state
        .batch_host
        .as_deref()
        .or(state.nodes.first().map(String::as_str));
    if !state.timed_out() || acting.map(short) != Some(short(own)) {
        return out;
    }
    let owner = env("SLURM_JOB_UID")
        .and_then(|u| u.parse().ok())
        .or(state.user_id);
    if pattern.contains("%w") && env("SLURM_JOB_WORK_DIR").is_none_or(|w| w.is_empty()) {
        out.lines.push(format!(
            "job {job} ran out of time; its working directory is unknown (no SLURM_JOB_WORK_DIR), so {pattern} names no file"
        ));
        return out;
    }
    let file = path(pattern, &job, env, own);
    let culprits = match read_culprits(&file, owner) {
        Ok(Some(c)) => c,
        Ok(None) => {
            out.lines.push(format!(
                "job {job} ran out of time; no diagnosis saved at {} (docs/diagnose.md: a watchdog saves one)",
                file.display()
            ));
            return out;
        }
        Err(e) => {
            out.lines.push(format!(
                "job {job} ran out of time; its diagnosis not taken: {e}"
            ));
            return out;
        }
    };
    if culprits.is_empty() {
        out.lines.push(format!(
            "job {job} ran out of time; its diagnosis ({}) names no rank: no node drained",
            file.display()
        ));
    }
    // The job's nodes: scontrol's NodeList shrinks while the job
    // completes (a node whose epilog ended first leaves it), so the
    // allocation slurmd hands every epilog (SLURM_NODELIST) is read too.
    let mut job_nodes = state.nodes.clone();
    if let Some(list) = env("SLURM_NODELIST")
        .filter(|l| !l.is_empty())
        .or_else(|| env("SLURM_JOB_NODELIST").filter(|l| !l.is_empty()))
        && let Ok(all) = preflight_cluster::hostlist::expand(&list)
    {
        for n in all {
            if !job_nodes.contains(&n) {
                job_nodes.push(n);
            }
        }
    }
    // Evidence against the job's code drains nothing: said, with what
    // to do.
    let (culprits, software): (Vec<Culprit>, Vec<Culprit>) =
        culprits.into_iter().partition(|c| c.evidence == "node");
    for c in &software {
        let pid = c.pid.map(|p| format!(" pid {p}")).unwrap_or_default();
        out.lines.push(scontrol::one_line(
            &format!(
                "job {job} timed out held up by rank {}{pid} on {}: not a node fault, so no node drained; next: {}; why: {}",
                c.rank, c.node, c.next_step, c.reason
            ),
            1000,
        ));
    }
    // One drain per node, with its first culprit; the rest counted.
    let nodes: std::collections::BTreeMap<&str, &String> =
        job_nodes.iter().map(|n| (short(n), n)).collect();
    let mut by_node: Vec<(String, Vec<&Culprit>)> = Vec::new();
    let mut outside: Vec<&str> = Vec::new();
    for c in &culprits {
        let Some(node) = nodes.get(short(&c.node)).copied() else {
            outside.push(&c.node);
            continue;
        };
        match by_node.iter_mut().find(|(n, _)| n == node) {
            Some((_, cs)) => cs.push(c),
            None => by_node.push((node.clone(), vec![c])),
        }
    }
    if !outside.is_empty() {
        out.lines.push(format!(
            "job {job}: {} named on nodes not of the job ({}): not drained",
            preflight_ground::values::count(outside.len(), "rank"),
            outside
                .iter()
                .take(8)
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    for (node, cs) in by_node {
        let first = cs[0];
        let more = match cs.len() - 1 {
            0 => String::new(),
            n => format!(" (+{n} more)"),
        };
        let pid = first.pid.map(|p| format!(" pid {p}")).unwrap_or_default();
        let reason = scontrol::one_line(
            &format!(
                "{prefix} job {job} timed out held up by rank {}{pid}: {}{more}",
                first.rank, first.reason
            ),
            400,
        );
        match slurm.node(&node) {
            Ok(n) if n.out_of_service() => {
                out.lines.push(format!(
                    "{node} left {} ({}); the diagnosis says: {reason}",
                    n.state,
                    n.reason.unwrap_or_default()
                ));
                continue;
            }
            Err(e) => {
                out.lines.push(e);
                out.failed = true;
                continue;
            }
            Ok(_) => {}
        }
        match slurm.drain(&node, &reason) {
            Ok(()) => {
                out.drained_self |= short(&node) == short(own);
                out.lines.push(format!("{node} drained: {reason}"));
            }
            Err(e) => {
                out.lines.push(e);
                out.failed = true;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_pattern_takes_the_job_its_directory_and_the_node() {
        let env = |k: &str| (k == "SLURM_JOB_WORK_DIR").then(|| "/home/a/run".to_string());
        assert_eq!(
            path("%w/preflight-diagnose-%j.json", "77", &env, "h2"),
            PathBuf::from("/home/a/run/preflight-diagnose-77.json")
        );
        assert_eq!(
            path("/shared/%n/%j.json", "77", &env, "h2"),
            PathBuf::from("/shared/h2/77.json")
        );
    }

    #[test]
    fn a_file_of_another_user_a_link_or_no_diagnosis_is_not_taken() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("d.json");
        let me = nix::unistd::getuid().as_raw();
        // No file: nothing to take, and no error.
        assert!(read_culprits(&f, Some(me)).unwrap().is_none());
        std::fs::write(&f, "{\"schema\": \"preflight.report/v1\"}").unwrap();
        assert!(
            read_culprits(&f, Some(me))
                .unwrap_err()
                .contains("not a diagnosis")
        );
        let link = d.path().join("link.json");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(read_culprits(&link, Some(me)).is_err());
        if me != 0 {
            assert!(
                read_culprits(&f, Some(me + 1))
                    .unwrap_err()
                    .contains("owned by uid")
            );
        }
        let held = serde_json::json!({
            "schema": CLUSTER_SCHEMA, "verdict": "held", "summary": "", "paths": [],
            "nodes": [], "unreachable": [],
            "culprits": [{"rank": 1, "node": "h2.cluster", "pid": 7, "reason": "sleeping",
                          "evidence": "rank", "next_step": "read its stack"}],
        });
        std::fs::write(&f, held.to_string()).unwrap();
        let c = read_culprits(&f, Some(me)).unwrap().unwrap();
        assert_eq!((c[0].rank, short(&c[0].node)), (1, "h2"));
        let mut unknown = held.clone();
        unknown["verdict"] = "unknown".into();
        std::fs::write(&f, unknown.to_string()).unwrap();
        assert!(read_culprits(&f, Some(me)).unwrap().unwrap().is_empty());
    }
}
