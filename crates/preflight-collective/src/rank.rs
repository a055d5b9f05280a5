//! One rank's part of the stage: where it sits (its `RankInfo`) and what
//! it found per backend (`RankResult`), which rank 0 assembles.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::sweep::{Failure, Hooks};
use super::{Op, OpError};
use preflight_result::collective::{CpuWait, PairRate, RankLink, Row};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankResult {
    pub rank: u32,
    /// "hostname (address)".
    pub host: String,
    pub backends: Vec<RankBackend>,
    pub pairs: Vec<PairRate>,
    pub pair_error: Option<OpError>,
    /// This rank's part of the pairwise round's second pass.
    #[serde(default)]
    pub second: Option<super::isolate::Part>,
    /// The TCP backend's interface, link speed and transports.
    #[serde(default)]
    pub link: Option<RankLink>,
    /// Set when this rank's host runs more ranks than it has CPUs (`300
    /// ranks on 2 CPUs`): pair rates between ranks there measure the
    /// scheduler, not the node.
    #[serde(default)]
    pub oversubscribed: Option<String>,
    /// How long this rank waited for a CPU during the pairwise round.
    #[serde(default)]
    pub cpu: Option<CpuWait>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankBackend {
    pub name: String,
    pub available: bool,
    pub reason: String,
    /// The library a worker loaded, and its version.
    #[serde(default)]
    pub found: Option<Found>,
    /// Library settings this rank added to the worker's environment.
    #[serde(default)]
    pub env_set: Vec<String>,
    pub init_ms: Option<u64>,
    pub init_error: Option<String>,
    /// The job's variables the init failure is about (GLOO_SOCKET_IFNAME
    /// naming no interface), for the cause rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_about: Vec<String>,
    /// Init was still waiting at its deadline: the rank waited on others,
    /// it did not fail by itself.
    #[serde(default)]
    pub init_stalled: bool,
    pub verified: Vec<Op>,
    pub rows: Vec<Row>,
    pub failure: Option<Failure>,
    /// What the backend said about itself (warning?, text): the transport
    /// chosen, a fallback and why.
    #[serde(default)]
    pub notes: Vec<(bool, String)>,
    /// The worker's last output lines, kept when something went wrong.
    #[serde(default)]
    pub log: Vec<String>,
    /// The run's deadline ended the probe, the plan or init.
    #[serde(default)]
    pub out_of_time: bool,
    /// Rank 0 said a signal interrupted it, while this backend waited on
    /// the library: this rank's own knowledge, never sent.
    #[serde(skip)]
    pub told: Option<Box<preflight_result::report::Interrupted>>,
}

impl RankBackend {
    pub fn new(name: &str, available: bool, reason: String) -> RankBackend {
        RankBackend {
            name: name.into(),
            available,
            reason,
            found: None,
            env_set: Vec::new(),
            init_ms: None,
            init_error: None,
            init_about: Vec::new(),
            init_stalled: false,
            verified: Vec::new(),
            rows: Vec::new(),
            failure: None,
            notes: Vec::new(),
            log: Vec::new(),
            out_of_time: false,
            told: None,
        }
    }

    /// Whether the run's deadline, not a fault, ended this backend.
    pub fn ran_out_of_time(&self) -> bool {
        self.out_of_time
            || matches!(
                self.failure.as_ref().and_then(|f| f.error.as_ref()),
                Some(OpError::RunDeadline { .. })
            )
    }
}

pub struct RankInfo<'a> {
    pub rank: u32,
    pub world: u32,
    pub local_rank: u32,
    pub local_world: u32,
    pub libraries: Libraries,
    pub host: String,
    /// The address this rank reached the master from: the route's choice.
    pub route_ip: String,
    pub gloo_ifname: Option<String>,
    /// PREFLIGHT_COLL_SAME_HOST: how same-host pairs talk (`direct`,
    /// `unix` or `tcp`).
    pub same_host: Option<String>,
    /// The node's interface facts, for the TCP backend's link speed.
    pub interfaces: Vec<preflight_facts::Interface>,
    /// `--root`: where a library worker reads the node's /sys (the
    /// InfiniBand ports NCCL's network choice is judged against).
    pub root: PathBuf,
    pub hooks: Hooks,
    /// Each rank's node as the cluster report names it, for ranks whose
    /// own result never arrives.
    pub hosts: Vec<String>,
    pub conn: &'a mut preflight_cluster::store::Channel,
    /// The job's token: the TCP mesh's connections prove it.
    pub token: preflight_cluster::auth::Token,
    /// Told each timed step this rank passes (backend, row): progress for
    /// a person watching rank 0's terminal.
    pub on_row: Option<OnRow<'a>>,
}

/// Told a backend's name and a step's row as rank 0 measures it.
pub type OnRow<'a> = &'a dyn Fn(&str, &preflight_result::collective::Row);

/// The library a probe found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Found {
    /// The file loaded.
    pub path: String,
    pub version: String,
}

/// The library files named on the command line, by backend name.
#[derive(Debug, Clone, Default)]
pub struct Libraries(pub Vec<(&'static str, PathBuf)>);

impl Libraries {
    pub fn get(&self, name: &str) -> Option<PathBuf> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| p.clone())
    }
}
