//! What the job's launcher told this process about its place in the job.
//! The cluster stage resolves this fully (flags, hostlists, node mode); the
//! checklist needs only rank 0 and whether the job spans nodes.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Default)]
pub struct Launch {
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
    pub local_world_size: Option<u64>,
    pub nnodes: Option<u64>,
    /// This process's index among the ranks on this node.
    pub local_rank: Option<u64>,
}

/// One launcher's view of the job: the variables it sets for each rank.
#[derive(Debug)]
pub struct Launcher {
    pub name: &'static str,
    pub rank: &'static str,
    pub size: &'static str,
    pub local_rank: Option<&'static str>,
    pub local_size: Option<&'static str>,
}

/// The launchers we know, in order of precedence: the first that sets a
/// value wins. The `launch_env` check compares them with each other.
pub const LAUNCHERS: &[Launcher] = &[
    Launcher {
        name: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: Some("LOCAL_RANK"),
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
    Launcher {
        name: "Slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: Some("SLURM_LOCALID"),
        local_size: None,
    },
    Launcher {
        name: "Open MPI",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Launcher {
        name: "PMI",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: None,
        local_size: None,
    },
];

/// Node counts, as the launchers name them.
pub const NNODES_VARS: &[&str] = &[
    "NNODES",
    "PET_NNODES",
    "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
];

/// Variables that give this process's rank, in order of precedence. PMIx
/// sets a rank but no size; it comes last.
pub fn rank_vars() -> Vec<&'static str> {
    LAUNCHERS
        .iter()
        .map(|l| l.rank)
        .chain(["PMIX_RANK"])
        .collect()
}

pub fn size_vars() -> Vec<&'static str> {
    LAUNCHERS.iter().map(|l| l.size).collect()
}

/// Intel MPI (Hydra) sets a local rank only.
pub fn local_rank_vars() -> Vec<&'static str> {
    LAUNCHERS
        .iter()
        .filter_map(|l| l.local_rank)
        .chain(["MPI_LOCALRANKID"])
        .collect()
}

/// Slurm's tasks per node may read "2(x3)"; readers take the count first.
pub fn local_size_vars() -> Vec<&'static str> {
    LAUNCHERS
        .iter()
        .filter_map(|l| l.local_size)
        .chain(["SLURM_NTASKS_PER_NODE"])
        .collect()
}

/// First variable of the list that is set, parsed as an integer.
fn first<'a>(
    env: &BTreeMap<String, String>,
    names: impl IntoIterator<Item = &'a str>,
) -> Option<u64> {
    names
        .into_iter()
        .find_map(|name| env.get(name).and_then(|v| v.trim().parse().ok()))
}

impl Launch {
    pub fn from_env(env: &BTreeMap<String, String>) -> Launch {
        Launch {
            rank: first(env, rank_vars()),
            world_size: first(env, size_vars()),
            local_world_size: first(env, local_size_vars()),
            local_rank: first(env, local_rank_vars()),
            nnodes: first(env, NNODES_VARS.iter().copied()),
        }
    }

    /// Rank 0, or a lone process that no launcher started.
    pub fn is_master(&self) -> bool {
        self.rank.unwrap_or(0) == 0
    }

    pub fn multi_node(&self) -> bool {
        if let Some(n) = self.nnodes {
            return n > 1;
        }
        match (self.world_size, self.local_world_size) {
            (Some(world), Some(local)) => world > local,
            _ => false,
        }
    }
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
    fn torchrun_single_node() {
        let l = Launch::from_env(&env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_WORLD_SIZE", "8"),
        ]));
        assert!(!l.is_master());
        assert!(!l.multi_node());
    }

    #[test]
    fn slurm_multi_node() {
        let l = Launch::from_env(&env(&[("SLURM_PROCID", "0"), ("SLURM_NNODES", "4")]));
        assert!(l.is_master());
        assert!(l.multi_node());
    }

    #[test]
    fn nothing_set_is_a_lone_master() {
        let l = Launch::from_env(&BTreeMap::new());
        assert!(l.is_master());
        assert!(!l.multi_node());
    }
}
