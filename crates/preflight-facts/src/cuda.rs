//! The CUDA driver, as the checks that copy to and from GPUs reach it
//! (`gpu_bandwidth`, `gpu_memory_test`): libcuda.so.1 from
//! `PREFLIGHT_CUDA_LIB`, else the system's. A fixture tree (`--root`) has
//! no GPU to copy to: there the driver is used only where
//! `PREFLIGHT_CUDA_LIB` names one.

use std::sync::{Mutex, MutexGuard, TryLockError};

use nccl_sys::Cuda;

use super::pci::normalize_bus_id;
use super::{Facts, Vendor};

pub const LIB_VAR: &str = "PREFLIGHT_CUDA_LIB";

/// Why a copy check has no driver to use.
#[derive(Debug, Clone, PartialEq)]
pub enum NoDriver {
    /// Nothing here to copy on (no NVIDIA GPU, or a fixture tree that
    /// names no driver): why, for a skip.
    Nothing(String),
    /// NVIDIA GPUs on the bus that the driver does not reach: why.
    Unusable(String),
}

/// The driver, initialised, with at least one device, for a check that
/// would find `nothing` on a fixture tree naming no driver ("no GPU to
/// copy to"); else why there is none to use.
pub fn open(facts: &Facts, nothing: &str) -> Result<(Cuda, usize), NoDriver> {
    if !facts
        .accelerators()
        .iter()
        .any(|a| a.vendor == Vendor::Nvidia)
    {
        return Err(NoDriver::Nothing("no NVIDIA GPU on the PCI bus".into()));
    }
    let named = std::env::var_os(LIB_VAR).is_some_and(|v| !v.is_empty());
    if !facts.is_live() && !named {
        return Err(NoDriver::Nothing(format!(
            "a fixture tree has {nothing} ({LIB_VAR} names a CUDA driver to use with one)"
        )));
    }
    let cuda = Cuda::open(None).map_err(|e| NoDriver::Unusable(e.to_string()))?;
    let count = cuda.init().map_err(|e| {
        NoDriver::Unusable(format!(
            "the CUDA driver ({}) cannot start: {e}",
            cuda.path()
        ))
    })?;
    if count == 0 {
        return Err(NoDriver::Unusable(format!(
            "the CUDA driver ({}) sees no GPU, though the PCI bus has NVIDIA GPUs (CUDA_VISIBLE_DEVICES, or a driver that did not bind)",
            cuda.path()
        )));
    }
    Ok((cuda, count))
}

/// The node's copy engines, one check at a time: a bandwidth figure taken
/// while the memory test copies would be what that test leaves.
static COPY_ENGINES: Mutex<()> = Mutex::new(());

/// Waits for the copy engines.
pub fn copy_engines() -> MutexGuard<'static, ()> {
    COPY_ENGINES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The copy engines if no other check holds them now.
pub fn copy_engines_now() -> Option<MutexGuard<'static, ()>> {
    match COPY_ENGINES.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// One GPU as a copy check names it: CUDA's index, its PCI address and,
/// where NVML or a recorded nvidia-smi says it, the board's serial.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuName {
    pub index: usize,
    pub bus_id: String,
    pub serial: Option<String>,
}

impl GpuName {
    pub fn new(index: usize, bus_id: &str) -> GpuName {
        GpuName {
            index,
            bus_id: normalize_bus_id(bus_id),
            serial: None,
        }
    }
}

impl std::fmt::Display for GpuName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.serial {
            Some(s) => write!(f, "GPU {} ({}, serial {s})", self.index, self.bus_id),
            None => write!(f, "GPU {} ({})", self.index, self.bus_id),
        }
    }
}
