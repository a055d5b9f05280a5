//! A Kubernetes pod's place in its job, from what the job's operator gives
//! the pod (read from each operator's code; docs/kubernetes.md has the
//! contracts): each pod is a node of the job, and preflight runs in node
//! mode there, its ranks one per accelerator unless the operator says how
//! many. The pods' DNS names are the nodelist, so a pod that never came is
//! named by its name.
//!
//! - Kubeflow Trainer v2: PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE,
//!   PET_MASTER_ADDR (`<trainjob>-node-0-0.<trainjob>`), PET_MASTER_PORT;
//! - Kubeflow PyTorchJob (training-operator v1): the same PET_ variables
//!   beside MASTER_ADDR (`<job>-master-0`), MASTER_PORT, RANK (the pod's:
//!   0 for the master, a worker's index + 1) and WORLD_SIZE (pods ×
//!   nprocPerNode, or pods alone when that is `auto`);
//! - LeaderWorkerSet: LWS_LEADER_ADDRESS (`<lws>-<group>.<subdomain>.<ns>`),
//!   LWS_GROUP_SIZE, LWS_WORKER_INDEX (0 for the leader);
//! - Volcano: VC_TASK_INDEX, VC_<TASK>_HOSTS and VC_<TASK>_NUM (the svc
//!   plugin), and the pytorch plugin's MASTER_ADDR, MASTER_PORT, RANK and
//!   WORLD_SIZE, which count pods;
//! - JobSet, which sets no variable of its own: the Job controller's
//!   JOB_COMPLETION_INDEX, and the JobSet's labels through the downward
//!   API as JOBSET_NAME, JOBSET_REPLICATED_JOB, JOBSET_JOB_INDEX,
//!   JOBSET_REPLICAS (the webhook adds them; a pod spec can too), with
//!   JOBSET_PODS_PER_JOB (the Jobs' parallelism, which no label carries;
//!   else the gang's size over its Jobs, where the webhook read it from the
//!   scheduler's PodGroup as PREFLIGHT_GANG_SIZE) and JOBSET_SUBDOMAIN
//!   where it is not the JobSet's name.
//!
//! Only where no launcher started this process: under torchrun, srun or
//! mpirun inside a pod, preflight is that launcher's rank.

use std::collections::BTreeMap;

type Env = BTreeMap<String, String>;

/// A gang's size and where it was read, as the webhook gives them from
/// the scheduler's PodGroup (the webhook's PodGroup read): the size of a
/// job whose own variables leave it out.
pub const GANG_SIZE: &str = "PREFLIGHT_GANG_SIZE";
pub const GANG_FROM: &str = "PREFLIGHT_GANG_FROM";

/// The rendezvous port where an operator sets none (torchrun's default).
pub const DEFAULT_PORT: u16 = 29500;
/// As the cluster stage's: far above any real job.
const MAX_WORLD: u32 = 1 << 20;

/// A node's place in its job (a pod's, or a node agent's from flags or a
/// launcher): the job's nodes, this one's index, its ranks, where node 0
/// serves the rendezvous, and the nodes' names in index order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    pub nnodes: u32,
    pub node_rank: u32,
    /// `None`: one per local accelerator, else one.
    pub nproc: Option<u32>,
    pub master_addr: String,
    pub master_port: u16,
    pub job_id: Option<String>,
    pub nodelist: Vec<String>,
    /// Where the plan came from when a pod's operator gave it, and what
    /// preflight took where the contract is ambiguous (the report's notes).
    pub notes: Vec<String>,
}

/// A pod's job: the node plan, which operator's contract gave it, and
/// what preflight took where the contract is ambiguous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodJob {
    pub plan: NodePlan,
    pub operator: &'static str,
    pub notes: Vec<String>,
}

/// The variables of a launcher that started this very process: with any
/// of them, preflight is a rank, not a pod's node agent.
const LAUNCHED: &[&str] = &[
    "LOCAL_RANK",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
];

/// The variables each contract is known by, for `explain` and the lint.
pub const POD_VARS: &[&str] = &[
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "LWS_LEADER_ADDRESS",
    "LWS_GROUP_SIZE",
    "LWS_WORKER_INDEX",
    "VC_TASK_INDEX",
    "JOB_COMPLETION_INDEX",
    "JOBSET_NAME",
    "JOBSET_REPLICATED_JOB",
    "JOBSET_JOB_INDEX",
    "JOBSET_REPLICAS",
    "JOBSET_PODS_PER_JOB",
    "JOBSET_SUBDOMAIN",
    GANG_SIZE,
    GANG_FROM,
];

fn get<'a>(env: &'a Env, name: &str) -> Option<&'a str> {
    env.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
}

fn number(env: &Env, name: &str) -> Result<Option<u32>, String> {
    match get(env, name) {
        None => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}=`{v}` is not a whole number")),
    }
}

fn port(env: &Env, names: &[&str]) -> Result<Option<u16>, String> {
    for n in names {
        if let Some(v) = get(env, n) {
            return v
                .parse()
                .map(Some)
                .map_err(|_| format!("{n}=`{v}` is not a port number"));
        }
    }
    Ok(None)
}

/// `nnodes` and `node_rank` in range, as the operator gave them.
fn in_range(nnodes: u32, node_rank: u32, what: &str) -> Result<(), String> {
    if nnodes == 0 || nnodes > MAX_WORLD {
        return Err(format!(
            "{what}: {nnodes} pods is out of range (1 to {MAX_WORLD})"
        ));
    }
    if node_rank >= nnodes {
        return Err(format!(
            "{what}: this pod's index {node_rank} is out of range for {nnodes} pods"
        ));
    }
    Ok(())
}

/// The job's id, for its derived token and its reports: the same in every
/// pod of the job, and in no other job's pods, and the same for the ranks
/// a pod's node agent starts (they inherit the pod's environment).
pub fn job_id(env: &Env) -> Option<(&'static str, String)> {
    if let Some(a) = get(env, "LWS_LEADER_ADDRESS") {
        return Some(("LWS_LEADER_ADDRESS", format!("lws:{a}")));
    }
    if let Some(a) = get(env, "PET_MASTER_ADDR").filter(|_| env.contains_key("PET_NNODES")) {
        return Some(("PET_MASTER_ADDR", format!("kubeflow:{a}")));
    }
    if env.contains_key("VC_TASK_INDEX") {
        let hosts = volcano_tasks(env);
        if let Some((_, first)) = hosts.first() {
            return Some(("VC_TASK_INDEX", format!("volcano:{}", first.join(","))));
        }
    }
    if let (Some(js), Some(_)) = (get(env, "JOBSET_NAME"), get(env, "JOB_COMPLETION_INDEX")) {
        return Some(("JOBSET_NAME", format!("jobset:{js}")));
    }
    None
}

/// The pod's job when an operator's contract is in the environment;
/// `None` when none is (or a launcher started this process).
pub fn discover(env: &Env) -> Option<Result<PodJob, String>> {
    if LAUNCHED.iter().any(|v| env.contains_key(*v)) {
        return None;
    }
    if env.contains_key("LWS_LEADER_ADDRESS") {
        return Some(leader_worker_set(env));
    }
    if env.contains_key("PET_NNODES") && env.contains_key("PET_NODE_RANK") {
        return Some(kubeflow(env));
    }
    if env.contains_key("VC_TASK_INDEX") {
        return Some(volcano(env));
    }
    if env.contains_key("JOBSET_NAME") && env.contains_key("JOB_COMPLETION_INDEX") {
        return Some(jobset(env));
    }
    None
}

fn plan(
    nnodes: u32,
    node_rank: u32,
    nproc: Option<u32>,
    master: (String, u16),
    nodelist: Vec<String>,
    env: &Env,
) -> NodePlan {
    NodePlan {
        nnodes,
        node_rank,
        nproc,
        master_addr: master.0,
        master_port: master.1,
        job_id: job_id(env).map(|(_, id)| id),
        nodelist,
        notes: Vec::new(),
    }
}

/// LWS_LEADER_ADDRESS is `<lws>-<group>.<subdomain>.<namespace>`; worker
/// `i` is `<lws>-<group>-<i>` under the same subdomain.
fn leader_worker_set(env: &Env) -> Result<PodJob, String> {
    let leader = get(env, "LWS_LEADER_ADDRESS")
        .ok_or("LWS_LEADER_ADDRESS is empty")?
        .to_string();
    let size = number(env, "LWS_GROUP_SIZE")?
        .ok_or("LWS_LEADER_ADDRESS is set but LWS_GROUP_SIZE is not: LeaderWorkerSet sets both")?;
    let index = number(env, "LWS_WORKER_INDEX")?.ok_or(
        "LWS_LEADER_ADDRESS is set but LWS_WORKER_INDEX is not: LeaderWorkerSet sets both",
    )?;
    in_range(size, index, "LeaderWorkerSet")?;
    let (head, rest) = leader.split_once('.').unwrap_or((leader.as_str(), ""));
    let nodelist = (0..size)
        .map(|i| match (i, rest) {
            (0, _) => leader.clone(),
            (i, "") => format!("{head}-{i}"),
            (i, rest) => format!("{head}-{i}.{rest}"),
        })
        .collect();
    let p = port(env, &["MASTER_PORT"])?.unwrap_or(DEFAULT_PORT);
    Ok(PodJob {
        plan: plan(size, index, nproc(env)?, (leader, p), nodelist, env),
        operator: "LeaderWorkerSet",
        notes: vec![format!(
            "LWS_GROUP_SIZE={size} pods (the leader and its workers), this one LWS_WORKER_INDEX={index}; the leader's port: {}",
            if env.contains_key("MASTER_PORT") {
                format!("MASTER_PORT={p}")
            } else {
                format!("{p} (LeaderWorkerSet sets none; MASTER_PORT overrides)")
            }
        )],
    })
}

/// PET_NPROC_PER_NODE, or PREFLIGHT's own: a number, or `auto` (one rank
/// per accelerator, else one: preflight's node mode).
fn nproc(env: &Env) -> Result<Option<u32>, String> {
    match get(env, "PET_NPROC_PER_NODE") {
        None | Some("auto") | Some("gpu") | Some("cpu") => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("PET_NPROC_PER_NODE=`{v}` is neither a number nor `auto`")),
    }
}

/// Kubeflow Trainer v2 and PyTorchJob v1: PET_NNODES pods (elastic
/// `min:max` only where both are the same), PET_NODE_RANK this one.
fn kubeflow(env: &Env) -> Result<PodJob, String> {
    let nn = get(env, "PET_NNODES").unwrap_or("");
    let nnodes: u32 = match nn.split_once(':') {
        Some((lo, hi)) if lo == hi => lo.parse().ok(),
        Some(_) => {
            return Err(format!(
                "PET_NNODES=`{nn}`: an elastic job's pods come and go; preflight gates a fixed gang: give --nnodes N"
            ));
        }
        None => nn.parse().ok(),
    }
    .ok_or_else(|| format!("PET_NNODES=`{nn}` is not a number of pods"))?;
    let node_rank = number(env, "PET_NODE_RANK")?.ok_or(
        "PET_NNODES is set but PET_NODE_RANK is empty: the operator gives every pod its index",
    )?;
    let v1 = env.contains_key("WORLD_SIZE") || env.contains_key("RANK");
    let operator = if v1 {
        "Kubeflow PyTorchJob"
    } else {
        "Kubeflow Trainer"
    };
    in_range(nnodes, node_rank, operator)?;
    let master = get(env, "PET_MASTER_ADDR")
        .or_else(|| get(env, "MASTER_ADDR"))
        .ok_or_else(|| format!("{operator}: neither PET_MASTER_ADDR nor MASTER_ADDR is set"))?
        .to_string();
    let p = port(env, &["PET_MASTER_PORT", "MASTER_PORT"])?.unwrap_or(DEFAULT_PORT);
    let procs = nproc(env)?;
    let mut notes = vec![format!(
        "PET_NNODES={nnodes} pods, this one PET_NODE_RANK={node_rank}; {}",
        match procs {
            Some(n) => format!("PET_NPROC_PER_NODE={n} ranks each"),
            None => "PET_NPROC_PER_NODE auto: one rank per accelerator, else one".to_string(),
        }
    )];
    if let Some(w) = number(env, "WORLD_SIZE")? {
        let counts = match procs {
            Some(n) if Some(w) == nnodes.checked_mul(n) => {
                format!("WORLD_SIZE={w} counts processes ({nnodes} pods × {n})")
            }
            _ if w == nnodes => format!(
                "WORLD_SIZE={w} counts pods, not processes (PyTorchJob sets replicas × nprocPerNode, the replicas alone where that is `auto`): taken as {nnodes} pods from PET_NNODES"
            ),
            _ => {
                return Err(format!(
                    "WORLD_SIZE={w} is neither PET_NNODES={nnodes} pods nor their processes ({}): which does the job mean?",
                    procs.map_or("PET_NPROC_PER_NODE auto".to_string(), |n| format!(
                        "{} = {nnodes} × {n}",
                        u64::from(nnodes) * u64::from(n)
                    ))
                ));
            }
        };
        notes.push(counts);
    }
    // Trainer: `<tj>-node-0-0.<tj>`, pod i `<tj>-node-0-<i>.<tj>`;
    // PyTorchJob: `<job>-master-0`, pod i (i ≥ 1) `<job>-worker-<i-1>`.
    let nodelist = (0..nnodes).map(|i| pod_name(&master, i, v1)).collect();
    Ok(PodJob {
        plan: plan(nnodes, node_rank, procs, (master, p), nodelist, env),
        operator,
        notes,
    })
}

fn pod_name(master: &str, i: u32, v1: bool) -> String {
    let (head, rest) = master
        .split_once('.')
        .map_or((master, String::new()), |(h, r)| (h, format!(".{r}")));
    if v1 {
        match head.strip_suffix("-master-0") {
            Some(job) if i > 0 => format!("{job}-worker-{}{rest}", i - 1),
            _ if i == 0 => master.to_string(),
            _ => format!("pod {i}"),
        }
    } else {
        match head.strip_suffix("-0") {
            Some(base) => format!("{base}-{i}{rest}"),
            None if i == 0 => master.to_string(),
            None => format!("pod {i}"),
        }
    }
}

/// Each task's hosts from VC_<TASK>_HOSTS, the master task first, then
/// the others by name (the order of the pytorch plugin's ranks).
fn volcano_tasks(env: &Env) -> Vec<(String, Vec<String>)> {
    let mut tasks: Vec<(String, Vec<String>)> = env
        .iter()
        .filter_map(|(k, v)| {
            let task = k.strip_prefix("VC_")?.strip_suffix("_HOSTS")?;
            let hosts: Vec<String> = v
                .split(',')
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .collect();
            Some((task.to_string(), hosts))
        })
        .collect();
    tasks.sort_by_key(|(t, _)| (t != "MASTER", t.clone()));
    tasks
}

/// Volcano: with its pytorch plugin, RANK and WORLD_SIZE count pods;
/// without, the pod's task (from its hostname `<job>-<task>-<i>`) and
/// VC_TASK_INDEX place it among every task's hosts.
fn volcano(env: &Env) -> Result<PodJob, String> {
    let tasks = volcano_tasks(env);
    let all: Vec<String> = tasks.iter().flat_map(|(_, h)| h.clone()).collect();
    let index = number(env, "VC_TASK_INDEX")?.unwrap_or(0);
    let p = port(env, &["MASTER_PORT"])?;
    if let (Some(world), Some(rank)) = (number(env, "WORLD_SIZE")?, number(env, "RANK")?) {
        in_range(world, rank, "Volcano")?;
        let master = get(env, "MASTER_ADDR")
            .map(str::to_string)
            .or_else(|| all.first().cloned())
            .ok_or("Volcano: WORLD_SIZE and RANK are set but MASTER_ADDR is not")?;
        let nodelist = if all.len() == world as usize {
            all
        } else {
            Vec::new()
        };
        return Ok(PodJob {
            plan: plan(
                world,
                rank,
                nproc(env)?,
                (master, p.unwrap_or(DEFAULT_PORT)),
                nodelist,
                env,
            ),
            operator: "Volcano",
            notes: vec![format!(
                "WORLD_SIZE={world} counts pods, not processes (Volcano's pytorch plugin): taken as {world} pods, this one RANK={rank}, one rank per accelerator in each"
            )],
        });
    }
    if all.is_empty() {
        return Err(
            "Volcano: VC_TASK_INDEX is set but no VC_<TASK>_HOSTS (the job's svc plugin gives them)"
                .into(),
        );
    }
    let host = get(env, "HOSTNAME").unwrap_or("");
    let mut offset = 0u32;
    let mut mine = None;
    for (task, hosts) in &tasks {
        if hosts
            .iter()
            .any(|h| h.split('.').next() == Some(host) || h == host)
        {
            mine = Some((task.clone(), offset));
        }
        offset = offset.saturating_add(hosts.len() as u32);
    }
    let (task, offset) = mine.ok_or_else(|| {
        format!(
            "Volcano: this pod's HOSTNAME `{host}` is in no VC_<TASK>_HOSTS ({})",
            tasks
                .iter()
                .map(|(t, _)| format!("VC_{t}_HOSTS"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let nnodes = all.len() as u32;
    let node_rank = offset.saturating_add(index);
    in_range(nnodes, node_rank, "Volcano")?;
    Ok(PodJob {
        plan: plan(
            nnodes,
            node_rank,
            nproc(env)?,
            (all[0].clone(), p.unwrap_or(DEFAULT_PORT)),
            all,
            env,
        ),
        operator: "Volcano",
        notes: vec![format!(
            "{nnodes} pods in VC_*_HOSTS, this one task {task} index {index}; the first host serves the rendezvous"
        )],
    })
}

/// JobSet: pod `<js>-<rjob>-<job index>-<pod index>.<subdomain>`; the
/// gang is the pod's replicated job.
fn jobset(env: &Env) -> Result<PodJob, String> {
    let js = get(env, "JOBSET_NAME").ok_or("JOBSET_NAME is empty")?;
    let rjob = get(env, "JOBSET_REPLICATED_JOB").ok_or(
        "JobSet: JOBSET_REPLICATED_JOB is not set (the label jobset.sigs.k8s.io/replicatedjob-name, through the downward API)",
    )?;
    let job_index = number(env, "JOBSET_JOB_INDEX")?.ok_or(
        "JobSet: JOBSET_JOB_INDEX is not set (the label jobset.sigs.k8s.io/job-index, through the downward API)",
    )?;
    let replicas = number(env, "JOBSET_REPLICAS")?.ok_or(
        "JobSet: JOBSET_REPLICAS is not set (the label jobset.sigs.k8s.io/replicatedjob-replicas, through the downward API)",
    )?;
    let mut notes = Vec::new();
    let per_job = match number(env, "JOBSET_PODS_PER_JOB")? {
        Some(n) => n,
        None => match number(env, GANG_SIZE)? {
            // The gang its scheduler starts: every Job's pods.
            Some(gang) if replicas > 0 && gang % replicas == 0 => {
                notes.push(format!(
                    "JOBSET_PODS_PER_JOB from {}: a gang of {gang} pods over {replicas} Jobs",
                    get(env, GANG_FROM).unwrap_or("the PodGroup")
                ));
                gang / replicas
            }
            Some(gang) => {
                return Err(format!(
                    "JobSet: {}'s gang of {gang} pods is not JOBSET_REPLICAS={replicas} Jobs of equal size: set JOBSET_PODS_PER_JOB (the annotation preflight.dev/pods-per-job)",
                    get(env, GANG_FROM).unwrap_or("the PodGroup")
                ));
            }
            None => {
                return Err(
                    "JobSet: JOBSET_PODS_PER_JOB is not set: the Jobs' parallelism is on no label and no PodGroup gave the gang's size; set it in the pod spec (or the annotation preflight.dev/pods-per-job)"
                        .into(),
                );
            }
        },
    };
    let pod = number(env, "JOB_COMPLETION_INDEX")?.unwrap_or(0);
    if per_job == 0 || pod >= per_job {
        return Err(format!(
            "JobSet: JOB_COMPLETION_INDEX={pod} is out of range for JOBSET_PODS_PER_JOB={per_job}"
        ));
    }
    let nnodes = replicas.saturating_mul(per_job);
    let node_rank = job_index
        .checked_mul(per_job)
        .and_then(|n| n.checked_add(pod))
        .ok_or_else(|| format!("JobSet: JOBSET_JOB_INDEX={job_index} × JOBSET_PODS_PER_JOB={per_job} is out of range"))?;
    in_range(nnodes, node_rank, "JobSet")?;
    let sub = get(env, "JOBSET_SUBDOMAIN").unwrap_or(js);
    let nodelist: Vec<String> = (0..replicas)
        .flat_map(|j| (0..per_job).map(move |k| (j, k)))
        .map(|(j, k)| format!("{js}-{rjob}-{j}-{k}.{sub}"))
        .collect();
    let p = port(env, &["MASTER_PORT"])?.unwrap_or(DEFAULT_PORT);
    Ok(PodJob {
        plan: plan(
            nnodes,
            node_rank,
            nproc(env)?,
            (nodelist[0].clone(), p),
            nodelist,
            env,
        ),
        operator: "JobSet",
        notes: std::iter::once(format!(
            "{replicas} Jobs of {per_job} pods in replicated job {rjob}, this one job {job_index} pod {pod}"
        ))
        .chain(notes)
        .collect(),
    })
}

/// Where an MPI launcher's hostfile is named: MPIJob (Kubeflow's
/// mpi-operator, Trainer's MPI runtime) mounts it at /etc/mpi/hostfile
/// and names it so for Open MPI, Intel MPI and MPICH.
pub const HOSTFILE_VARS: &[&str] = &[
    "OMPI_MCA_orte_default_hostfile",
    "I_MPI_HYDRA_HOST_FILE",
    "HYDRA_HOST_FILE",
];

/// A hostfile's nodes, in order, and each one's slots.
pub type Hostfile = (Vec<String>, Vec<u32>);

/// A hostfile is a line a node: megabytes would be a mistake.
const MAX_HOSTFILE: u64 = 1 << 20;

/// The MPI hostfile's nodes and each one's slots (`host slots=N` for
/// Open MPI, `host:N` for Intel MPI and MPICH, `host` for one), in order:
/// where an MPIJob's ranks run, rank 0 on the first. `None` when no
/// hostfile is named.
pub fn mpi_hostfile(env: &Env) -> Option<Result<Hostfile, String>> {
    let (var, path) = HOSTFILE_VARS
        .iter()
        .find_map(|v| Some((*v, get(env, v)?)))?;
    // mpirun forwards the variable to every rank, and MPIJob mounts the
    // file on its launcher only: where it is not, there is no hostfile
    // (the ranks then need MASTER_ADDR, as under any mpirun).
    if !std::path::Path::new(path).exists() {
        return None;
    }
    let read = || -> Result<Hostfile, String> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_HOSTFILE).read_to_string(&mut text))
            .map_err(|e| format!("{var}={path}: {e}"))?;
        let mut hosts = Vec::new();
        let mut slots = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            let Some(first) = line.split_whitespace().next() else {
                continue;
            };
            let (host, count) = match first.split_once(':') {
                Some((h, c)) => (h, Some(c)),
                None => (
                    first,
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix("slots=")),
                ),
            };
            let count = match count {
                Some(c) => c.parse::<u32>().ok().filter(|c| *c > 0).ok_or_else(|| {
                    format!("{var}={path}:{}: `{c}` is not a number of slots", n + 1)
                })?,
                None => 1,
            };
            hosts.push(host.to_string());
            slots.push(count);
        }
        if hosts.is_empty() {
            return Err(format!("{var}={path}: no host in it"));
        }
        Ok((hosts, slots))
    };
    Some(read())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn found(pairs: &[(&str, &str)]) -> PodJob {
        discover(&env(pairs)).expect("a pod").expect("a plan")
    }

    #[test]
    fn kubeflow_trainer_pods_are_nodes_with_their_names() {
        let j = found(&[
            ("PET_NNODES", "3"),
            ("PET_NPROC_PER_NODE", "1"),
            ("PET_NODE_RANK", "2"),
            ("PET_MASTER_ADDR", "tj-node-0-0.tj"),
            ("PET_MASTER_PORT", "29500"),
        ]);
        assert_eq!(j.operator, "Kubeflow Trainer");
        assert_eq!(
            (j.plan.nnodes, j.plan.node_rank, j.plan.nproc),
            (3, 2, Some(1))
        );
        assert_eq!(
            j.plan.nodelist,
            ["tj-node-0-0.tj", "tj-node-0-1.tj", "tj-node-0-2.tj"]
        );
        assert_eq!(j.plan.job_id.as_deref(), Some("kubeflow:tj-node-0-0.tj"));
    }

    #[test]
    fn a_pytorchjob_world_that_counts_pods_is_said_and_taken_as_pods() {
        let base = [
            ("PET_NNODES", "3"),
            ("PET_NPROC_PER_NODE", "auto"),
            ("PET_NODE_RANK", "1"),
            ("PET_MASTER_ADDR", "pj-master-0"),
            ("PET_MASTER_PORT", "23456"),
            ("MASTER_ADDR", "pj-master-0"),
            ("MASTER_PORT", "23456"),
            ("RANK", "1"),
            ("WORLD_SIZE", "3"),
        ];
        let j = found(&base);
        assert_eq!(j.operator, "Kubeflow PyTorchJob");
        assert_eq!(
            (j.plan.nnodes, j.plan.node_rank, j.plan.nproc),
            (3, 1, None)
        );
        assert_eq!(j.plan.master_port, 23456);
        assert_eq!(
            j.plan.nodelist,
            ["pj-master-0", "pj-worker-0", "pj-worker-1"]
        );
        assert!(
            j.notes[1].contains("WORLD_SIZE=3 counts pods"),
            "{:?}",
            j.notes
        );
        let mut odd = base.to_vec();
        odd.retain(|(k, _)| *k != "WORLD_SIZE");
        odd.push(("WORLD_SIZE", "5"));
        assert!(
            discover(&env(&odd))
                .unwrap()
                .unwrap_err()
                .contains("WORLD_SIZE=5")
        );
        // torchrun inside the pod: its workers are ranks, not pods.
        let mut under = base.to_vec();
        under.push(("LOCAL_RANK", "0"));
        assert!(discover(&env(&under)).is_none());
    }

    #[test]
    fn leader_worker_set_names_its_workers_under_the_leaders_subdomain() {
        let j = found(&[
            ("LWS_LEADER_ADDRESS", "lws-0.lws.default"),
            ("LWS_GROUP_SIZE", "3"),
            ("LWS_WORKER_INDEX", "1"),
        ]);
        assert_eq!((j.plan.nnodes, j.plan.node_rank), (3, 1));
        assert_eq!(j.plan.master_addr, "lws-0.lws.default");
        assert_eq!(j.plan.master_port, DEFAULT_PORT);
        assert_eq!(
            j.plan.nodelist,
            [
                "lws-0.lws.default",
                "lws-0-1.lws.default",
                "lws-0-2.lws.default"
            ]
        );
        let e = discover(&env(&[
            ("LWS_LEADER_ADDRESS", "a"),
            ("LWS_GROUP_SIZE", "2"),
        ]))
        .unwrap()
        .unwrap_err();
        assert!(e.contains("LWS_WORKER_INDEX"), "{e}");
    }

    #[test]
    fn volcano_with_and_without_its_pytorch_plugin() {
        let hosts = [
            ("VC_MASTER_HOSTS", "vj-master-0.vj"),
            ("VC_MASTER_NUM", "1"),
            ("VC_WORKER_HOSTS", "vj-worker-0.vj,vj-worker-1.vj"),
            ("VC_WORKER_NUM", "2"),
        ];
        let mut plugin = hosts.to_vec();
        plugin.extend([
            ("VC_TASK_INDEX", "1"),
            ("MASTER_ADDR", "vj-master-0.vj"),
            ("MASTER_PORT", "23456"),
            ("WORLD_SIZE", "3"),
            ("RANK", "2"),
        ]);
        let j = found(&plugin);
        assert_eq!((j.plan.nnodes, j.plan.node_rank), (3, 2));
        assert!(j.notes[0].contains("counts pods"));
        assert_eq!(j.plan.nodelist[2], "vj-worker-1.vj");
        let mut bare = hosts.to_vec();
        bare.extend([("VC_TASK_INDEX", "0"), ("HOSTNAME", "vj-worker-0")]);
        let j = found(&bare);
        assert_eq!((j.plan.nnodes, j.plan.node_rank), (3, 1));
        assert_eq!(j.plan.master_addr, "vj-master-0.vj");
    }

    #[test]
    fn jobset_places_the_pod_by_job_and_completion_index() {
        let j = found(&[
            ("JOBSET_NAME", "js"),
            ("JOBSET_REPLICATED_JOB", "w"),
            ("JOBSET_JOB_INDEX", "1"),
            ("JOBSET_REPLICAS", "2"),
            ("JOBSET_PODS_PER_JOB", "2"),
            ("JOB_COMPLETION_INDEX", "1"),
        ]);
        assert_eq!((j.plan.nnodes, j.plan.node_rank), (4, 3));
        assert_eq!(j.plan.master_addr, "js-w-0-0.js");
        assert_eq!(j.plan.nodelist[3], "js-w-1-1.js");
        let e = discover(&env(&[
            ("JOBSET_NAME", "js"),
            ("JOB_COMPLETION_INDEX", "0"),
        ]))
        .unwrap()
        .unwrap_err();
        assert!(e.contains("JOBSET_REPLICATED_JOB"), "{e}");
    }

    #[test]
    fn a_jobsets_pods_per_job_come_from_its_podgroup_where_unset() {
        let base = [
            ("JOBSET_NAME", "js"),
            ("JOBSET_REPLICATED_JOB", "w"),
            ("JOBSET_JOB_INDEX", "1"),
            ("JOBSET_REPLICAS", "2"),
            ("JOB_COMPLETION_INDEX", "2"),
            (GANG_FROM, "Volcano PodGroup ml/js-pg"),
        ];
        let mut six = base.to_vec();
        six.push((GANG_SIZE, "6"));
        let j = found(&six);
        assert_eq!((j.plan.nnodes, j.plan.node_rank), (6, 5));
        assert_eq!(j.plan.nodelist[5], "js-w-1-2.js");
        assert!(
            j.notes.iter().any(|n| n
                == "JOBSET_PODS_PER_JOB from Volcano PodGroup ml/js-pg: a gang of 6 pods over 2 Jobs"),
            "{:?}",
            j.notes
        );
        // The job's own number wins.
        let mut own = six.clone();
        own.push(("JOBSET_PODS_PER_JOB", "4"));
        assert_eq!(found(&own).plan.nnodes, 8);
        let mut odd = base.to_vec();
        odd.push((GANG_SIZE, "5"));
        let e = discover(&env(&odd)).unwrap().unwrap_err();
        assert!(
            e.contains("gang of 5 pods is not JOBSET_REPLICAS=2 Jobs"),
            "{e}"
        );
        let e = discover(&env(&base)).unwrap().unwrap_err();
        assert!(e.contains("no PodGroup gave the gang's size"), "{e}");
    }

    #[test]
    fn an_mpi_hostfile_gives_the_nodes_and_their_slots_in_each_dialect() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("hostfile");
        std::fs::write(
            &f,
            "# MPIJob\nmj-worker-0.mj.default.svc slots=2\nmj-worker-1.mj.default.svc:4\n\nmj-worker-2\n",
        )
        .unwrap();
        let p = f.display().to_string();
        let (hosts, slots) = mpi_hostfile(&env(&[("OMPI_MCA_orte_default_hostfile", &p)]))
            .unwrap()
            .unwrap();
        assert_eq!(
            hosts,
            [
                "mj-worker-0.mj.default.svc",
                "mj-worker-1.mj.default.svc",
                "mj-worker-2"
            ]
        );
        assert_eq!(slots, [2, 4, 1]);
        std::fs::write(&f, "h1 slots=two\n").unwrap();
        let e = mpi_hostfile(&env(&[("I_MPI_HYDRA_HOST_FILE", &p)]))
            .unwrap()
            .unwrap_err();
        assert!(
            e.contains("I_MPI_HYDRA_HOST_FILE=") && e.contains(":1:"),
            "{e}"
        );
        assert!(mpi_hostfile(&env(&[])).is_none());
        // Forwarded by mpirun to a worker where the file is not mounted.
        assert!(
            mpi_hostfile(&env(&[(
                "OMPI_MCA_orte_default_hostfile",
                "/nonexistent/hostfile"
            )]))
            .is_none()
        );
    }

    #[test]
    fn an_elastic_range_is_no_gang_and_bad_numbers_name_their_variable() {
        let e = discover(&env(&[
            ("PET_NNODES", "1:4"),
            ("PET_NODE_RANK", "0"),
            ("PET_MASTER_ADDR", "m"),
        ]))
        .unwrap()
        .unwrap_err();
        assert!(
            e.contains("PET_NNODES=`1:4`") && e.contains("--nnodes"),
            "{e}"
        );
        let e = discover(&env(&[
            ("LWS_LEADER_ADDRESS", "l"),
            ("LWS_GROUP_SIZE", "three"),
            ("LWS_WORKER_INDEX", "0"),
        ]))
        .unwrap()
        .unwrap_err();
        assert!(e.contains("LWS_GROUP_SIZE=`three`"), "{e}");
        let e = discover(&env(&[
            ("JOBSET_NAME", "js"),
            ("JOBSET_REPLICATED_JOB", "w"),
            ("JOBSET_JOB_INDEX", "4294967295"),
            ("JOBSET_REPLICAS", "2"),
            ("JOBSET_PODS_PER_JOB", "2"),
            ("JOB_COMPLETION_INDEX", "1"),
        ]))
        .unwrap()
        .unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        assert!(discover(&env(&[("RANK", "0"), ("WORLD_SIZE", "2")])).is_none());
    }
}
