//! NVML, loaded at run time with `nvml-wrapper`: libnvidia-ml.so.1 comes
//! with the driver, so a node without it simply has no NVML, and that is an
//! error value here, never a failure to start.

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::UsedGpuMemory;

use super::gpu_status::{GpuReport, GpuStatus, Process};
use super::pci::normalize_bus_id;

pub fn report() -> Result<GpuReport, String> {
    let nvml = Nvml::init().map_err(|e| format!("NVML is not available: {e}"))?;
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML cannot count GPUs: {e}"))?;
    let mut gpus = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| format!("NVML cannot open GPU {index}: {e}"))?;
        let bus_id = device
            .pci_info()
            .map(|p| normalize_bus_id(&p.bus_id))
            .map_err(|e| format!("NVML cannot read GPU {index}'s bus id: {e}"))?;
        let memory = device.memory_info().ok();
        let processes = device
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .map(|p| Process {
                pid: p.pid.to_string(),
                name: String::new(),
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
        gpus.push(GpuStatus {
            bus_id,
            uuid: device.uuid().ok(),
            persistence: device.is_in_persistent_mode().ok(),
            used_bytes: memory.as_ref().map(|m| m.used),
            free_bytes: memory.as_ref().map(|m| m.free),
            ecc_uncorrectable: device
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok(),
            retirement_pending: device.are_pages_pending_retired().ok(),
            // nvml-wrapper has no remapped-rows call; nvidia-smi reports them.
            remap_pending: None,
            remap_failure: None,
            fabric_state: None,
            fabric_status: None,
            processes,
        });
    }
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    Ok(GpuReport {
        source: "NVML".into(),
        driver_version: nvml.sys_driver_version().ok(),
        gpus,
    })
}

#[cfg(test)]
mod tests {
    /// Without the NVIDIA driver (this project's machines), NVML is an
    /// error value with a reason, not a panic or an abort.
    #[test]
    fn absent_nvml_is_an_error_value() {
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            crate::facts::test_skip("the NVIDIA driver is loaded here: NVML is not absent");
            return;
        }
        let e = super::report().unwrap_err();
        assert!(e.starts_with("NVML is not available"), "{e}");
    }
}
