//! The distributed jobs on the node: every process whose environment
//! names its rank and world size (torchrun's RANK/WORLD_SIZE, Slurm's,
//! Open MPI's, PMI's), grouped by job (torchrun's run id, the Slurm job
//! and step, else the job's store address). A process that inherited its
//! parent rank's environment (a data loader worker, a subprocess) is that
//! rank's child, not another rank. Processes whose environment this user
//! cannot read (another user's job, as an ordinary user) are not seen.

use std::collections::BTreeMap;
use std::path::Path;

use preflight_facts::launch::{rank_vars, size_vars};
use preflight_facts::procs;

/// Which jobs to keep: all, the one with this process, or the one with
/// this id (a Slurm job id or a torchrun run id).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub pid: Option<u32>,
    pub job: Option<String>,
    /// Only processes in this process's network namespace: a node whose
    /// jobs run in namespaces of their own (containers), asked from
    /// inside the job's.
    pub own_netns: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RankProcess {
    pub rank: u32,
    pub pid: u32,
    pub local_world: Option<u32>,
    /// TORCH_WORKER_SERVER_SOCKET, where the rank was given one: the
    /// path, or the start of the path, of its torch worker server.
    pub worker_socket: Option<String>,
    /// Where torch writes the rank's Flight Recorder dump, less the rank
    /// (TORCH_FR_DUMP_TEMP_FILE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE, else
    /// torch's default).
    pub dump_prefix: String,
    /// TORCH_NCCL_DEBUG_INFO_PIPE_FILE: where the rank's NCCL process group
    /// takes a request for a dump (`<it><rank>.pipe`).
    pub dump_pipe: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// In words: `torchrun run 4f2a…`.
    pub name: String,
    /// Its ids: the torchrun run id, the Slurm job id.
    pub ids: Vec<String>,
    pub world: u32,
    /// MASTER_ADDR:MASTER_PORT where set.
    pub store: Option<(String, u16)>,
    pub ranks: Vec<RankProcess>,
    /// Every process of the job, the ranks' children included.
    pub pids: Vec<u32>,
    /// Where torch keeps its keys in the store: under torchrun's agent
    /// store, `/worker/attempt_N` (TORCHELASTIC_USE_AGENT_STORE,
    /// TORCHELASTIC_RESTART_COUNT).
    pub agent_attempt: Option<u32>,
    /// TORCH_NCCL_DESYNC_DEBUG is on: each rank's NCCL process group
    /// writes its last collective started and ended to the store.
    pub desync_debug: bool,
    /// NCCL_RAS_ADDR, where a rank was given one.
    pub ras_addr: Option<String>,
}

/// One process's environment, `NAME=value` pairs; `None` when unreadable.
fn environ(proc_pid: &Path) -> Option<BTreeMap<String, String>> {
    let raw = std::fs::read(proc_pid.join("environ")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = std::str::from_utf8(kv).ok()?;
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.to_string()))
            })
            .collect(),
    )
}

fn first(env: &BTreeMap<String, String>, names: &[&str]) -> Option<u32> {
    names
        .iter()
        .find_map(|n| env.get(*n).and_then(|v| v.trim().parse().ok()))
}

/// A Slurm batch script and what it starts outside a step (srun itself,
/// a watchdog) carry SLURM_PROCID and SLURM_NTASKS but no step: they are
/// not ranks. A task of a step has SLURM_STEP_ID; a rank given its own
/// RANK (torch under srun) is one whatever Slurm says.
fn is_batch_script(env: &BTreeMap<String, String>) -> bool {
    let own_rank = rank_vars()
        .iter()
        .any(|v| !v.starts_with("SLURM_") && env.contains_key(*v));
    !own_rank && env.contains_key("SLURM_PROCID") && !env.contains_key("SLURM_STEP_ID")
}

/// The launchers' rank variables, Slurm's last: mpirun (or Intel MPI's
/// Hydra) started from a batch script or through srun gives each rank its
/// own, while SLURM_PROCID there is the batch task's or the node's.
fn ranks_first() -> Vec<&'static str> {
    let mut v = rank_vars();
    v.sort_by_key(|n| n.starts_with("SLURM_"));
    v
}

fn sizes_first() -> Vec<&'static str> {
    let mut v = size_vars();
    v.sort_by_key(|n| n.starts_with("SLURM_"));
    v
}

/// The jobs under `proc_dir`, ranks in order.
pub fn jobs(proc_dir: &Path, filter: &Filter) -> Vec<Job> {
    let me = std::process::id();
    let own_ns = std::fs::read_link(proc_dir.join("self/ns/net")).ok();
    let Ok(entries) = std::fs::read_dir(proc_dir) else {
        return Vec::new();
    };
    let mut by_key: BTreeMap<String, Job> = BTreeMap::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if filter.own_netns && std::fs::read_link(e.path().join("ns/net")).ok() != own_ns {
            continue;
        }
        let Some(env) = environ(&e.path()) else {
            continue;
        };
        let (Some(rank), Some(world)) = (first(&env, &ranks_first()), first(&env, &sizes_first()))
        else {
            continue;
        };
        if is_batch_script(&env) {
            continue;
        }
        if world == 0 || rank >= world {
            continue;
        }
        let get = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned();
        let store = get("MASTER_ADDR").zip(get("MASTER_PORT").and_then(|p| p.parse().ok()));
        let agent_attempt =
            (get("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True")).then(|| {
                get("TORCHELASTIC_RESTART_COUNT")
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0)
            });
        // torchrun's static rendezvous names every run "none".
        let run = get("TORCHELASTIC_RUN_ID").filter(|r| r != "none");
        let slurm = get("SLURM_JOB_ID");
        let mut ids: Vec<String> = run.iter().chain(slurm.iter()).cloned().collect();
        ids.dedup();
        let (key, name) = if let Some(r) = &run {
            (format!("torchrun:{r}"), format!("torchrun run {r}"))
        } else if let Some(j) = &slurm {
            let step = get("SLURM_STEP_ID").unwrap_or_default();
            (format!("slurm:{j}.{step}"), format!("slurm job {j}"))
        } else if let Some((a, p)) = &store {
            // torchrun's static rendezvous names every run "none": the
            // ranks of one torchrun (and their children, who inherit it)
            // share its log directory, `.../<run>_<random>/attempt_N/`
            // above each rank's error file, so two jobs that reused a
            // port (one whose agent is gone) stay apart.
            let agent = get("TORCHELASTIC_ERROR_FILE")
                .and_then(|f| {
                    let p = Path::new(&f);
                    Some(p.parent()?.parent()?.display().to_string())
                })
                .map(|d| format!(":agent:{d}"))
                .unwrap_or_default();
            (format!("store:{a}:{p}{agent}"), format!("master {a}:{p}"))
        } else {
            let parent = procs::parent(&e.path()).unwrap_or(0);
            (format!("parent:{parent}"), format!("ranks of pid {parent}"))
        };
        let local_world = first(
            &env,
            &[
                "LOCAL_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                "MPI_LOCALNRANKS",
            ],
        );
        let job = by_key.entry(key).or_insert_with(|| Job {
            name,
            ids,
            world,
            store,
            ranks: Vec::new(),
            pids: Vec::new(),
            agent_attempt,
            desync_debug: get("TORCH_NCCL_DESYNC_DEBUG")
                .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")),
            ras_addr: get("NCCL_RAS_ADDR"),
        });
        job.world = job.world.max(world);
        job.pids.push(pid);
        job.ranks.push(RankProcess {
            rank,
            pid,
            local_world,
            worker_socket: get("TORCH_WORKER_SERVER_SOCKET"),
            dump_prefix: get("TORCH_FR_DUMP_TEMP_FILE")
                .or_else(|| get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"))
                .unwrap_or_else(|| preflight_facts::flight_recorder::DEFAULT_DUMP_PREFIX.into()),
            dump_pipe: get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"),
        });
    }
    let mut out: Vec<Job> = by_key.into_values().collect();
    for job in &mut out {
        // A process whose ancestor claims the same rank is that rank's
        // child (it inherited the environment), not the rank.
        let claimed: Vec<(u32, u32)> = job.ranks.iter().map(|r| (r.rank, r.pid)).collect();
        job.ranks.retain(|r| {
            !procs::ancestors(proc_dir, r.pid)
                .iter()
                .any(|a| claimed.contains(&(r.rank, *a)))
        });
        job.ranks.sort_by_key(|r| (r.rank, r.pid));
    }
    out.retain(|j| {
        filter.pid.is_none_or(|p| j.pids.contains(&p))
            && filter
                .job
                .as_ref()
                .is_none_or(|id| j.ids.iter().any(|x| x == id))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_batch_script_is_no_rank_and_a_steps_task_is() {
        // As Slurm 22.05 sets them: the batch script, then a task of step 0.
        let batch = env(&[
            ("SLURM_JOB_ID", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
        ]);
        assert!(is_batch_script(&batch));
        let mut task = batch.clone();
        task.insert("SLURM_STEP_ID".into(), "0".into());
        assert!(!is_batch_script(&task));
        let mut torch = batch.clone();
        torch.insert("RANK".into(), "0".into());
        assert!(!is_batch_script(&torch));
        assert!(!is_batch_script(&env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2")
        ])));
    }

    #[test]
    fn mpiruns_rank_wins_over_the_slurm_task_it_runs_in() {
        let e = env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_ID", "0"),
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
        ]);
        assert_eq!(first(&e, &ranks_first()), Some(5));
        assert_eq!(first(&e, &sizes_first()), Some(8));
    }
}
