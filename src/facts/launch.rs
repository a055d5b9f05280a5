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

/// First variable of the list that is set, parsed as an integer.
fn first(env: &BTreeMap<String, String>, names: &[&str]) -> Option<u64> {
    names
        .iter()
        .find_map(|name| env.get(*name).and_then(|v| v.trim().parse().ok()))
}

impl Launch {
    pub fn from_env(env: &BTreeMap<String, String>) -> Launch {
        Launch {
            rank: first(
                env,
                &[
                    "RANK",
                    "SLURM_PROCID",
                    "OMPI_COMM_WORLD_RANK",
                    "PMI_RANK",
                    "PMIX_RANK",
                ],
            ),
            world_size: first(
                env,
                &[
                    "WORLD_SIZE",
                    "SLURM_NTASKS",
                    "OMPI_COMM_WORLD_SIZE",
                    "PMI_SIZE",
                ],
            ),
            local_world_size: first(
                env,
                &[
                    "LOCAL_WORLD_SIZE",
                    "SLURM_NTASKS_PER_NODE",
                    "OMPI_COMM_WORLD_LOCAL_SIZE",
                ],
            ),
            local_rank: first(
                env,
                &[
                    "LOCAL_RANK",
                    "SLURM_LOCALID",
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                    "MPI_LOCALRANKID",
                ],
            ),
            nnodes: first(
                env,
                &[
                    "NNODES",
                    "PET_NNODES",
                    "SLURM_NNODES",
                    "SLURM_JOB_NUM_NODES",
                ],
            ),
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
