//! Who am I: this process's place in the job.
//!
//! Each field is taken from the first source that sets it, in this order:
//!
//! 1. command-line flags (`--nnodes`, `--node-rank`, `--nproc-per-node`,
//!    `--master-addr`, `--master-port`);
//! 2. torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
//!    MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID;
//! 3. Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE,
//!    SLURM_NODEID, SLURM_NNODES, SLURM_JOB_NODELIST (the master is its first
//!    host when MASTER_ADDR is unset), SLURM_STEP_TASKS_PER_NODE /
//!    SLURM_TASKS_PER_NODE (`2(x3),1`: which node each rank runs on),
//!    SLURM_JOB_ID;
//! 4. OpenMPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE;
//! 5. PMI/PMIx: PMI_RANK, PMI_SIZE, PMIX_RANK.
//!
//! Any node-mode flag makes this process a node agent that starts its local
//! ranks itself, as torchrun does. Without flags and without any rank
//! variable, it is a node agent of a one-node job whose ranks meet on
//! loopback.

use preflight_facts::launch;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::hostlist;
use preflight_kinds::ports::PortRange;

pub use preflight_kinds::ports::PROBE_PORTS_VAR;

/// A range around MASTER_PORT where rank 0 may serve when MASTER_PORT is
/// taken, and where the ranks look for it (the Slurm prolog sets it: its
/// port is derived from the job id, which anyone can read, and bind
/// first).
pub const MASTER_PORTS_VAR: &str = "PREFLIGHT_MASTER_PORTS";

/// At most this many ports are tried, MASTER_PORT first: each costs every
/// rank a connection attempt per round.
pub const MAX_MASTER_PORTS: usize = 16;

pub const DEFAULT_PORT: u16 = 29500;
/// Far above any real job; a typo beyond it is an error, not a barrier
/// that waits for millions of ranks.
pub const MAX_WORLD: u32 = 1 << 20;

/// Set in a Kubernetes gang's gate: a pod whose environment names no job
/// is an error there, not a job of one.
pub const REQUIRE_GANG_VAR: &str = "PREFLIGHT_REQUIRE_GANG";

/// Set by a node agent in its children's environment: "you are a rank,
/// read your identity from the variables I gave you".
pub const CHILD_MARKER: &str = "PREFLIGHT_NODE_CHILD";

/// The cluster flags of `preflight run`.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub nnodes: Option<u32>,
    pub node_rank: Option<u32>,
    /// `None`: not given; `Some(None)`: `auto`.
    pub nproc_per_node: Option<Option<u32>>,
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
    /// `--probe-ports`: where the reachability probe listener may listen.
    pub probe_ports: Option<PortRange>,
}

impl Flags {
    fn node_mode(&self) -> bool {
        self.nnodes.is_some() || self.node_rank.is_some() || self.nproc_per_node.is_some()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Identity {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    pub local_world_size: u32,
    pub node_rank: u32,
    pub nnodes: Option<u32>,
    pub master_addr: String,
    /// 0 only inside a one-node job whose agent picks a free port.
    pub master_port: u16,
    pub job_id: Option<String>,
    /// Which launcher's variables gave the rank: flags, torchrun, slurm,
    /// openmpi, pmi, node (a preflight node agent), or none.
    pub source: String,
    /// Slurm's expanded nodelist, to say where a missing rank was expected.
    pub nodelist: Vec<String>,
    /// The ports the reachability probe listener may take (`--probe-ports`,
    /// else PREFLIGHT_PROBE_PORTS); `None`: an ephemeral port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_ports: Option<PortRange>,
    /// PREFLIGHT_MASTER_PORTS: where rank 0 may move when MASTER_PORT is
    /// taken; it holds MASTER_PORT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_ports: Option<PortRange>,
    /// Slurm's ranks per node, in nodelist order (SLURM_STEP_TASKS_PER_NODE,
    /// else SLURM_TASKS_PER_NODE, expanded): where each rank runs when
    /// nodes hold different numbers of tasks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks_per_node: Vec<u32>,
}

/// What this process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// One rank of the job.
    Rank(Identity),
    /// A node agent: starts `nproc` local ranks; node rank 0 also serves.
    Node(NodePlan),
}

pub use preflight_facts::pod::NodePlan;

type Env = BTreeMap<String, String>;

/// The first variable of `names` that is set and parses, with its name.
fn first<T: std::str::FromStr>(env: &Env, names: &[&'static str]) -> Option<(T, &'static str)> {
    names.iter().find_map(|name| {
        let value = env.get(*name)?;
        // SLURM_NTASKS_PER_NODE may read "2(x3)": the count comes first.
        let head = value.trim().split('(').next().unwrap_or_default();
        head.parse().ok().map(|v| (v, *name))
    })
}

fn text(env: &Env, names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| env.get(*n).map(|v| v.trim().to_string()))
        .filter(|v| !v.is_empty())
}

/// OMPI_COMM_WORLD_NODE_RANK is not here: it is a process's rank among the
/// processes on its node, not the node's index.
const NODE_RANK: &[&str] = &["GROUP_RANK", "SLURM_NODEID", "PET_NODE_RANK"];
const NNODES: &[&str] = &["SLURM_NNODES", "SLURM_JOB_NUM_NODES"];

/// The job's id and the variable it came from: SLURM_JOB_ID, else
/// TORCHELASTIC_RUN_ID unless it is torchrun's placeholder `none` (every
/// torchrun without --rdzv-id has it, so it tells no job apart). The job
/// token (`auth`) is derived from the same.
pub fn job_id(env: &Env) -> Option<(&'static str, String)> {
    ["SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"]
        .into_iter()
        .find_map(|var| Some((var, text(env, &[var])?)))
        .filter(|(var, id)| !(*var == "TORCHELASTIC_RUN_ID" && id == "none"))
        .or_else(|| preflight_facts::pod::job_id(env))
}

fn source_of(var: &str) -> &'static str {
    if var.starts_with("SLURM_") {
        "slurm"
    } else if var.starts_with("OMPI_") {
        "openmpi"
    } else if var.starts_with("PMI") {
        "pmi"
    } else {
        "torchrun"
    }
}

/// Slurm's nodelist, else an MPI launcher's hostfile (an MPIJob's).
fn nodelist(env: &Env) -> Result<Vec<String>, String> {
    match text(env, &["SLURM_JOB_NODELIST", "SLURM_NODELIST"]) {
        Some(list) => hostlist::expand(&list).map_err(|e| format!("SLURM_JOB_NODELIST: {e}")),
        None => match preflight_facts::pod::mpi_hostfile(env) {
            Some(found) => found.map(|(hosts, _)| hosts),
            None => Ok(Vec::new()),
        },
    }
}

const TASKS_PER_NODE: &[&str] = &["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"];

fn tasks_per_node(env: &Env) -> Result<Vec<u32>, String> {
    for name in TASKS_PER_NODE {
        if let Some(v) = text(env, &[name]) {
            return hostlist::counts(&v).map_err(|e| format!("{name}={e}"));
        }
    }
    // An MPI hostfile's slots: mpirun fills each host's in order.
    if text(env, &["SLURM_JOB_NODELIST", "SLURM_NODELIST"]).is_none()
        && let Some(found) = preflight_facts::pod::mpi_hostfile(env)
    {
        return found.map(|(_, slots)| slots);
    }
    Ok(Vec::new())
}

fn master_addr(flags: &Flags, env: &Env, nodes: &[String]) -> String {
    flags
        .master_addr
        .clone()
        .or_else(|| text(env, &["MASTER_ADDR"]))
        .or_else(|| nodes.first().cloned())
        .unwrap_or_else(|| "127.0.0.1".to_string())
}

fn master_port(flags: &Flags, env: &Env, default: u16) -> Result<u16, String> {
    if let Some(p) = flags.master_port {
        return Ok(p);
    }
    match env.get("MASTER_PORT") {
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("MASTER_PORT=`{v}` is not a port number")),
        None => Ok(default),
    }
}

/// PREFLIGHT_MASTER_PORTS, which must hold `master_port`.
fn master_ports(env: &Env, master_port: u16) -> Result<Option<PortRange>, String> {
    let Some(v) = text(env, &[MASTER_PORTS_VAR]) else {
        return Ok(None);
    };
    let range = PortRange::parse(&v).map_err(|e| format!("{MASTER_PORTS_VAR}=`{v}`: {e}"))?;
    if !range.ports().any(|p| p == master_port) {
        return Err(format!(
            "{MASTER_PORTS_VAR}=`{v}` does not hold MASTER_PORT {master_port}"
        ));
    }
    Ok(Some(range))
}

/// The ports rank 0 tries, in order, and the ranks look at: MASTER_PORT,
/// then the ports after it in the range, wrapping, `MAX_MASTER_PORTS` in
/// all at most.
pub fn rendezvous_ports(master_port: u16, range: Option<PortRange>) -> Vec<u16> {
    let Some(range) = range else {
        return vec![master_port];
    };
    let after = range.ports().skip_while(|&p| p != master_port);
    let before = range.ports().take_while(|&p| p != master_port);
    after.chain(before).take(MAX_MASTER_PORTS).collect()
}

fn probe_ports(flags: &Flags, env: &Env) -> Result<Option<PortRange>, String> {
    if let Some(r) = flags.probe_ports {
        return Ok(Some(r));
    }
    match text(env, &[PROBE_PORTS_VAR]) {
        Some(v) => PortRange::parse(&v)
            .map(Some)
            .map_err(|e| format!("{PROBE_PORTS_VAR}=`{v}`: {e}")),
        None => Ok(None),
    }
}

pub fn resolve(flags: &Flags, env: &Env) -> Result<Role, String> {
    let nodes = nodelist(env)?;
    // A node agent's children get its command line, so the flag counts for
    // them too.
    let probe_ports = probe_ports(flags, env)?;
    let job_id = job_id(env).map(|(_, id)| id);
    let child = env.get(CHILD_MARKER).is_some_and(|v| v == "1");
    // A node agent's children take what the agent resolved (the port it
    // actually bound, for one) from the environment it gave them.
    let none = Flags::default();
    let flags = if child { &none } else { flags };
    if flags.node_mode() && !child {
        let nnodes = flags
            .nnodes
            .or_else(|| first(env, NNODES).map(|(v, _)| v))
            .unwrap_or(1);
        let node_rank = match flags
            .node_rank
            .or_else(|| first(env, NODE_RANK).map(|(v, _)| v))
        {
            Some(k) => k,
            // Every node would call itself node 0 and serve as master.
            None if nnodes > 1 => {
                return Err(format!(
                    "--nnodes {nnodes} needs --node-rank (or GROUP_RANK / SLURM_NODEID) to tell the nodes apart"
                ));
            }
            None => 0,
        };
        if nnodes == 0 || nnodes > MAX_WORLD {
            return Err(format!("--nnodes must be 1 to {MAX_WORLD}"));
        }
        if node_rank >= nnodes {
            return Err(format!(
                "--node-rank {node_rank} is out of range for --nnodes {nnodes}"
            ));
        }
        let single = nnodes == 1;
        return Ok(Role::Node(NodePlan {
            nnodes,
            node_rank,
            nproc: flags.nproc_per_node.flatten(),
            master_addr: master_addr(flags, env, &nodes),
            master_port: master_port(flags, env, if single { 0 } else { DEFAULT_PORT })?,
            job_id,
            nodelist: nodes,
            notes: Vec::new(),
        }));
    }
    // A Kubernetes pod of a job operator's: a node of the job.
    if !child && let Some(found) = preflight_facts::pod::discover(env) {
        let job = found?;
        let p = job.plan;
        return Ok(Role::Node(NodePlan {
            nproc: flags.nproc_per_node.flatten().or(p.nproc),
            master_addr: flags.master_addr.clone().unwrap_or(p.master_addr),
            master_port: flags.master_port.unwrap_or(p.master_port),
            job_id: job_id.or(p.job_id),
            notes: job
                .notes
                .iter()
                .map(|n| format!("{}: {n}", job.operator))
                .collect(),
            ..p
        }));
    }
    let Some((rank, rank_var)) = first::<u32>(env, &launch::rank_vars()) else {
        if let Some(name) = launch::rank_vars()
            .into_iter()
            .find(|n| env.contains_key(*n))
        {
            return Err(format!(
                "{name}=`{}` is not a rank number",
                env.get(name).map(String::as_str).unwrap_or_default()
            ));
        }
        // A launcher that says how many ranks there are but not which one
        // this is: never read as a world of one (a job of 4 would pass as
        // ready on every node). Slurm's batch step sets SLURM_NTASKS
        // without a task of its own, so it is not held to this.
        if let Some(l) = launch::LAUNCHERS
            .iter()
            .filter(|l| l.name != "Slurm")
            .find(|l| env.contains_key(l.size))
        {
            return Err(format!(
                "{}={} is set but {} is not: {} gives every process both; set {} (0 to {}) or unset {}",
                l.size,
                env.get(l.size).map(String::as_str).unwrap_or_default(),
                l.rank,
                l.name,
                l.rank,
                first::<u32>(env, &[l.size]).map_or("WORLD_SIZE-1".to_string(), |(n, _)| n
                    .saturating_sub(1)
                    .to_string()),
                l.size,
            ));
        }
        // A gang's gate (the webhook's init container) that finds no
        // operator's contract: an error, never a world of one that passes.
        if env.get(REQUIRE_GANG_VAR).is_some_and(|v| v == "1") && !flags.node_mode() {
            return Err(format!(
                "{REQUIRE_GANG_VAR}=1 but this pod's environment names no job: none of Kubeflow's PET_NNODES/PET_NODE_RANK, LeaderWorkerSet's LWS_LEADER_ADDRESS, Volcano's VC_TASK_INDEX, JobSet's JOBSET_NAME with JOB_COMPLETION_INDEX, nor a launcher's RANK/WORLD_SIZE: give the init container the job container's environment (docs/kubernetes.md)"
            ));
        }
        // Nothing set: a one-node job of this machine's ranks.
        return Ok(Role::Node(NodePlan {
            nnodes: 1,
            node_rank: 0,
            nproc: flags.nproc_per_node.flatten(),
            master_addr: flags
                .master_addr
                .clone()
                .unwrap_or_else(|| "127.0.0.1".into()),
            master_port: master_port(flags, env, 0)?,
            job_id,
            nodelist: nodes,
            notes: Vec::new(),
        }));
    };
    let world_size = first(env, &launch::size_vars())
        .map(|(v, _)| v)
        .unwrap_or(1);
    if world_size == 0 || world_size > MAX_WORLD {
        return Err(format!(
            "world size {world_size} is out of range (1 to {MAX_WORLD})"
        ));
    }
    let tasks_per_node = tasks_per_node(env)?;
    let node_var = first::<u32>(env, NODE_RANK).map(|(v, _)| v);
    // Without a local size, Slurm's count for this node (uneven nodes).
    let local_world_size = first(env, &launch::local_size_vars())
        .map(|(v, _)| v)
        .or_else(|| tasks_per_node.get(node_var? as usize).copied())
        .unwrap_or(1);
    let local_rank = first(env, &launch::local_rank_vars())
        .map(|(v, _)| v)
        .unwrap_or(0);
    let node_rank = node_var.unwrap_or(rank / local_world_size.max(1));
    let source = if child { "node" } else { source_of(rank_var) };
    let port = master_port(flags, env, DEFAULT_PORT)?;
    Ok(Role::Rank(Identity {
        rank,
        world_size,
        local_rank,
        local_world_size,
        node_rank,
        nnodes: first(env, NNODES).map(|(v, _)| v),
        master_addr: master_addr(flags, env, &nodes),
        master_port: port,
        job_id,
        source: source.to_string(),
        nodelist: nodes,
        probe_ports,
        master_ports: master_ports(env, port)?,
        tasks_per_node,
    }))
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

    fn rank(flags: &Flags, pairs: &[(&str, &str)]) -> Identity {
        match resolve(flags, &env(pairs)).unwrap() {
            Role::Rank(id) => id,
            other => panic!("expected a rank, got {other:?}"),
        }
    }

    #[test]
    fn torchrun_beats_slurm_beats_openmpi_beats_pmi() {
        let all = [
            ("RANK", "1"),
            ("SLURM_PROCID", "2"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("PMI_RANK", "4"),
        ];
        assert_eq!(rank(&Flags::default(), &all).rank, 1);
        assert_eq!(rank(&Flags::default(), &all[1..]).rank, 2);
        assert_eq!(rank(&Flags::default(), &all[2..]).rank, 3);
        let id = rank(&Flags::default(), &all[3..]);
        assert_eq!((id.rank, id.source.as_str()), (4, "pmi"));
        assert_eq!(rank(&Flags::default(), &[("PMIX_RANK", "5")]).rank, 5);
    }

    #[test]
    fn slurm_nodelist_gives_the_master_when_master_addr_is_unset() {
        let vars = [
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_NTASKS_PER_NODE", "2(x4)"),
            ("SLURM_JOB_NODELIST", "gpu[001-004]"),
            ("SLURM_JOB_ID", "77"),
        ];
        let id = rank(&Flags::default(), &vars);
        assert_eq!(id.master_addr, "gpu001");
        assert_eq!(id.master_port, DEFAULT_PORT);
        assert_eq!(id.local_world_size, 2);
        assert_eq!(id.node_rank, 2);
        assert_eq!(id.job_id.as_deref(), Some("77"));
        assert_eq!(id.nodelist.len(), 4);
        let mut with_master = vars.to_vec();
        with_master.push(("MASTER_ADDR", "10.0.0.9"));
        assert_eq!(
            rank(&Flags::default(), &with_master).master_addr,
            "10.0.0.9"
        );
    }

    #[test]
    fn slurm_tasks_per_node_are_expanded() {
        let vars = [
            ("SLURM_PROCID", "6"),
            ("SLURM_NTASKS", "7"),
            ("SLURM_NODEID", "3"),
            ("SLURM_TASKS_PER_NODE", "2(x3),1"),
            ("SLURM_JOB_NODELIST", "gpu[001-004]"),
        ];
        let id = rank(&Flags::default(), &vars);
        assert_eq!(id.tasks_per_node, vec![2, 2, 2, 1]);
        // This node's count is the local world size.
        assert_eq!((id.node_rank, id.local_world_size), (3, 1));
        // The step's counts win over the job's.
        let mut step = vars.to_vec();
        step.push(("SLURM_STEP_TASKS_PER_NODE", "3,4"));
        assert_eq!(rank(&Flags::default(), &step).tasks_per_node, vec![3, 4]);
        let mut bad = vars.to_vec();
        bad[3] = ("SLURM_TASKS_PER_NODE", "2(x)");
        let e = resolve(&Flags::default(), &env(&bad)).unwrap_err();
        assert!(e.starts_with("SLURM_TASKS_PER_NODE=`2(x)`"), "{e}");
    }

    #[test]
    fn the_job_id_is_slurms_else_torchruns_unless_its_placeholder() {
        let id = |pairs: &[(&str, &str)]| job_id(&env(pairs));
        let both = [("TORCHELASTIC_RUN_ID", "r1"), ("SLURM_JOB_ID", "77")];
        assert_eq!(id(&both), Some(("SLURM_JOB_ID", "77".into())));
        assert_eq!(id(&both[..1]), Some(("TORCHELASTIC_RUN_ID", "r1".into())));
        assert_eq!(id(&[("TORCHELASTIC_RUN_ID", "none")]), None);
        assert_eq!(id(&[("SLURM_JOB_ID", " ")]), None);
        assert_eq!(
            rank(
                &Flags::default(),
                &[("RANK", "0"), ("TORCHELASTIC_RUN_ID", "none")]
            )
            .job_id,
            None
        );
    }

    #[test]
    fn flags_beat_the_environment() {
        let flags = Flags {
            master_addr: Some("flaghost".into()),
            master_port: Some(1234),
            ..Flags::default()
        };
        let id = rank(
            &flags,
            &[
                ("RANK", "0"),
                ("MASTER_ADDR", "envhost"),
                ("MASTER_PORT", "99"),
            ],
        );
        assert_eq!(
            (id.master_addr.as_str(), id.master_port),
            ("flaghost", 1234)
        );
    }

    #[test]
    fn node_mode_flags_make_an_agent() {
        let flags = Flags {
            nnodes: Some(4),
            node_rank: Some(2),
            nproc_per_node: Some(Some(2)),
            master_addr: Some("h0".into()),
            master_port: None,
            probe_ports: None,
        };
        let Role::Node(plan) = resolve(&flags, &env(&[("RANK", "9")])).unwrap() else {
            panic!("node mode");
        };
        assert_eq!((plan.nnodes, plan.node_rank, plan.nproc), (4, 2, Some(2)));
        assert_eq!(plan.master_port, DEFAULT_PORT);
        // The agent's children read their identity from the environment.
        let child = rank(&flags, &[("RANK", "5"), (CHILD_MARKER, "1")]);
        assert_eq!((child.rank, child.source.as_str()), (5, "node"));
    }

    #[test]
    fn nothing_set_is_a_one_node_job_on_loopback() {
        let Role::Node(plan) = resolve(&Flags::default(), &Env::new()).unwrap() else {
            panic!("node mode");
        };
        assert_eq!(plan.nnodes, 1);
        assert_eq!(plan.master_addr, "127.0.0.1");
        assert_eq!(plan.master_port, 0);
    }

    #[test]
    fn rank_0_may_move_within_the_master_range_from_master_port_on() {
        let range = PortRange::parse("29400-29409").unwrap();
        assert_eq!(rendezvous_ports(29500, None), vec![29500]);
        assert_eq!(
            rendezvous_ports(29407, Some(range)),
            vec![
                29407, 29408, 29409, 29400, 29401, 29402, 29403, 29404, 29405, 29406
            ]
        );
        let wide = PortRange::parse("20000-29999").unwrap();
        let ports = rendezvous_ports(29999, Some(wide));
        assert_eq!(ports.len(), MAX_MASTER_PORTS);
        assert_eq!(&ports[..3], &[29999, 20000, 20001]);
        let id = rank(
            &Flags::default(),
            &[
                ("RANK", "0"),
                ("MASTER_PORT", "29403"),
                (MASTER_PORTS_VAR, "29400-29409"),
            ],
        );
        assert_eq!(id.master_ports, Some(range));
        let outside = resolve(
            &Flags::default(),
            &env(&[
                ("RANK", "0"),
                ("MASTER_PORT", "29500"),
                (MASTER_PORTS_VAR, "29400-29409"),
            ]),
        );
        assert_eq!(
            outside.unwrap_err(),
            "PREFLIGHT_MASTER_PORTS=`29400-29409` does not hold MASTER_PORT 29500"
        );
    }

    #[test]
    fn probe_ports_come_from_the_flag_else_the_variable() {
        let range = PortRange::parse("29600-29699").unwrap();
        assert_eq!(rank(&Flags::default(), &[("RANK", "0")]).probe_ports, None);
        let id = rank(
            &Flags::default(),
            &[("RANK", "0"), (PROBE_PORTS_VAR, "29600-29699")],
        );
        assert_eq!(id.probe_ports, Some(range));
        let flags = Flags {
            probe_ports: Some(PortRange::parse("30000-30001").unwrap()),
            ..Flags::default()
        };
        let id = rank(&flags, &[("RANK", "0"), (PROBE_PORTS_VAR, "29600-29699")]);
        assert_eq!(id.probe_ports.map(|r| r.first), Some(30000));
        // A node agent's children get the agent's command line.
        let child = rank(&flags, &[("RANK", "1"), (CHILD_MARKER, "1")]);
        assert_eq!(child.probe_ports.map(|r| r.first), Some(30000));
        let e = resolve(
            &Flags::default(),
            &env(&[("RANK", "0"), (PROBE_PORTS_VAR, "29699-29600")]),
        )
        .unwrap_err();
        assert!(e.starts_with("PREFLIGHT_PROBE_PORTS=`29699-29600`"), "{e}");
    }

    #[test]
    fn bad_values_are_errors() {
        assert!(resolve(&Flags::default(), &env(&[("RANK", "x")])).is_err());
        assert!(
            resolve(
                &Flags::default(),
                &env(&[("RANK", "0"), ("WORLD_SIZE", "0")])
            )
            .is_err()
        );
        assert!(
            resolve(
                &Flags::default(),
                &env(&[("RANK", "0"), ("WORLD_SIZE", "99999999")])
            )
            .is_err()
        );
        assert!(
            resolve(
                &Flags::default(),
                &env(&[("RANK", "0"), ("MASTER_PORT", "http")])
            )
            .is_err()
        );
        let flags = Flags {
            nnodes: Some(2),
            node_rank: Some(2),
            ..Flags::default()
        };
        assert!(resolve(&flags, &Env::new()).is_err());
        // Several nodes and nothing to tell them apart: each would be node 0.
        let flags = Flags {
            nnodes: Some(2),
            ..Flags::default()
        };
        let e = resolve(&flags, &env(&[("OMPI_COMM_WORLD_NODE_RANK", "1")])).unwrap_err();
        assert!(e.contains("needs --node-rank"), "{e}");
    }

    #[test]
    fn a_gangs_gate_with_no_contract_is_an_error_not_a_world_of_one() {
        let e = resolve(&Flags::default(), &env(&[(REQUIRE_GANG_VAR, "1")])).unwrap_err();
        assert!(
            e.contains("names no job") && e.contains("PET_NNODES"),
            "{e}"
        );
        let Role::Node(plan) = resolve(
            &Flags::default(),
            &env(&[
                (REQUIRE_GANG_VAR, "1"),
                ("LWS_LEADER_ADDRESS", "l-0.l.ns"),
                ("LWS_GROUP_SIZE", "2"),
                ("LWS_WORKER_INDEX", "1"),
            ]),
        )
        .unwrap() else {
            panic!("a pod of a LeaderWorkerSet is a node of its job")
        };
        assert_eq!((plan.nnodes, plan.node_rank), (2, 1));
    }

    #[test]
    fn a_world_size_without_a_rank_is_an_error_not_a_world_of_one() {
        let e = resolve(&Flags::default(), &env(&[("WORLD_SIZE", "4")])).unwrap_err();
        assert_eq!(
            e,
            "WORLD_SIZE=4 is set but RANK is not: torchrun gives every process both; set RANK (0 to 3) or unset WORLD_SIZE"
        );
        let e = resolve(&Flags::default(), &env(&[("OMPI_COMM_WORLD_SIZE", "8")])).unwrap_err();
        assert!(
            e.starts_with("OMPI_COMM_WORLD_SIZE=8 is set but OMPI_COMM_WORLD_RANK is not"),
            "{e}"
        );
        // Slurm's batch step: a task count, no task of its own.
        assert!(resolve(&Flags::default(), &env(&[("SLURM_NTASKS", "4")])).is_ok());
        // Nothing set: this machine's own one-node job.
        assert!(matches!(
            resolve(&Flags::default(), &env(&[])),
            Ok(Role::Node(_))
        ));
    }
}
