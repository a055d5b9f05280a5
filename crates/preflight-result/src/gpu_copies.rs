//! What `gpu_bandwidth` measured, GPU by GPU, in the report: the figures
//! `baseline capture --from` takes a profile's copy floors from.

use serde::{Deserialize, Serialize};

/// One GPU's best copy rates, GB/s (10^9 B/s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuCopy {
    /// CUDA's device ordinal.
    pub index: u32,
    pub bus_id: String,
    pub h2d_gbps: f64,
    pub d2h_gbps: f64,
    pub d2d_gbps: f64,
    /// With every GPU of the node copying at once (`all_at_once`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub together_h2d_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub together_d2h_gbps: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuCopies {
    pub gpus: Vec<GpuCopy>,
}
