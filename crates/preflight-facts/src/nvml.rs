//! NVML, loaded at run time with `nvml-wrapper`: libnvidia-ml.so.1 comes
//! with the driver, so a node without it simply has no NVML, and that is an
//! error value here, never a failure to start.

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};

use super::gpu_status::{GpuReport, GpuStatus, Process};
use super::pci::normalize_bus_id;

/// NVML, or why there is none here.
pub fn open() -> Result<Nvml, String> {
    Nvml::init().map_err(|e| format!("NVML is not available: {e}"))
}

/// Calls `read` on every GPU NVML knows, in NVML's order, with its index
/// and bus id. `Err`: a GPU NVML cannot open, or what `read` says.
pub fn each_gpu<T>(
    nvml: &Nvml,
    mut read: impl FnMut(u32, String, &Device) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML cannot count GPUs: {e}"))?;
    let mut out = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| format!("NVML cannot open GPU {index}: {e}"))?;
        let bus_id = device
            .pci_info()
            .map(|p| normalize_bus_id(&p.bus_id))
            .map_err(|e| format!("NVML cannot read GPU {index}'s bus id: {e}"))?;
        out.push(read(index, bus_id, &device)?);
    }
    Ok(out)
}

pub fn report() -> Result<GpuReport, String> {
    let nvml = open()?;
    let mut gpus = each_gpu(&nvml, |index, bus_id, device| {
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
        Ok(GpuStatus {
            bus_id,
            uuid: device.uuid().ok(),
            serial: device.serial().ok(),
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
            index: Some(index),
            mig_enabled: device.mig_mode().ok().map(|m| m.current == MIG_ENABLE),
            clock_events: device.current_throttle_reasons().ok().map(clock_events),
            reset_required: field_flag(device, FI_RESET_STATUS),
            drain_and_reset: field_flag(device, FI_DRAIN_AND_RESET_STATUS),
            recovery_action: field_value(device, FI_GPU_RECOVERY_ACTION)
                .and_then(recovery_action_name)
                .map(String::from),
        })
    })?;
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    Ok(GpuReport {
        source: "NVML".into(),
        driver_version: nvml.sys_driver_version().ok(),
        gpus,
    })
}

/// NVML's field ids (nvml.h) for the reset status nvidia-smi shows as
/// `gpu_reset_status` (deprecated from R570), and the recovery action
/// that replaces it (R565 and later). Older drivers say not supported.
const FI_RESET_STATUS: u32 = 226;
const FI_DRAIN_AND_RESET_STATUS: u32 = 227;
const FI_GPU_RECOVERY_ACTION: u32 = 230;

/// `nvmlDeviceGpuRecoveryAction_t`, in nvidia-smi's words.
fn recovery_action_name(value: u64) -> Option<&'static str> {
    Some(match value {
        0 => "None",
        1 => "Reset",
        2 => "Reboot",
        3 => "Drain P2P",
        4 => "Drain and Reset",
        _ => return None,
    })
}
/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLE: u32 = 1;

/// A whole-number field value; `None` where this driver or GPU has no
/// such field.
fn field_value(device: &Device, id: u32) -> Option<u64> {
    let sample = device
        .field_values_for(&[FieldId(id)])
        .ok()?
        .into_iter()
        .next()?
        .ok()?;
    match sample.value.ok()? {
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(_) => None,
    }
}

fn field_flag(device: &Device, id: u32) -> Option<bool> {
    field_value(device, id).map(|v| v != 0)
}

/// NVML's reason bits by the short names nvidia-smi's XML uses.
fn clock_events(reasons: ThrottleReasons) -> Vec<String> {
    [
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            "display_clocks_setting",
        ),
    ]
    .into_iter()
    .filter(|(bit, _)| reasons.contains(*bit))
    .map(|(_, name)| name.to_string())
    .collect()
}

/// The clock event reasons of every GPU, by bus id, read now: one sample
/// of a throttle check.
pub fn clock_events_now() -> Result<Vec<(u32, String, Vec<String>)>, String> {
    each_gpu(&open()?, |index, bus, device| {
        let reasons = device
            .current_throttle_reasons()
            .map_err(|e| format!("NVML cannot read GPU {index}'s clock event reasons: {e}"))?;
        Ok((index, bus, clock_events(reasons)))
    })
}

#[cfg(test)]
mod tests {
    /// Without the NVIDIA driver (this project's machines), NVML is an
    /// error value with a reason, not a panic or an abort.
    #[test]
    fn absent_nvml_is_an_error_value() {
        if std::path::Path::new("/proc/driver/nvidia").exists() {
            preflight_ground::testing::test_skip(
                "the NVIDIA driver is loaded here: NVML is not absent",
            );
            return;
        }
        let e = super::report().unwrap_err();
        assert!(e.starts_with("NVML is not available"), "{e}");
    }
}
