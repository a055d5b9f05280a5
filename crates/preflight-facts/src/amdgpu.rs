//! AMD GPU health from the files amdgpu exposes per device: VRAM totals
//! (mem_info_vram_total, mem_info_vram_used, bytes) and RAS error counts
//! (ras/umc_err_count: "ue: N" and "ce: N" lines), in the shape of the
//! NVIDIA report so the same checks judge both.

use std::path::Path;

use super::gpu_status::{GpuReport, GpuStatus};

fn read(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

fn number(path: &Path, shown: &str) -> Result<Option<u64>, String> {
    match read(path)? {
        None => Ok(None),
        Some(t) => t
            .parse()
            .map(Some)
            .map_err(|_| format!("{shown}: `{t}` is not a byte count")),
    }
}

/// One GPU; `dir` is its /sys/bus/pci/devices entry under the root and
/// `shown` the same path as the node sees it, for messages.
pub fn status(bus_id: &str, dir: &Path, shown: &str) -> Result<GpuStatus, String> {
    let total = number(
        &dir.join("mem_info_vram_total"),
        &format!("{shown}/mem_info_vram_total"),
    )?;
    let used = number(
        &dir.join("mem_info_vram_used"),
        &format!("{shown}/mem_info_vram_used"),
    )?;
    let ecc = match read(&dir.join("ras/umc_err_count"))? {
        None => None,
        Some(text) => {
            let ue = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("ue:"))
                .ok_or_else(|| format!("{shown}/ras/umc_err_count has no `ue:` line"))?;
            Some(
                ue.trim()
                    .parse()
                    .map_err(|_| format!("{shown}/ras/umc_err_count: `ue:{ue}` is not a count"))?,
            )
        }
    };
    Ok(GpuStatus {
        bus_id: bus_id.to_string(),
        // ROCR_VISIBLE_DEVICES names GPUs as GPU-<unique_id>.
        uuid: read(&dir.join("unique_id"))?.map(|id| format!("GPU-{id}")),
        used_bytes: used,
        free_bytes: total.zip(used).map(|(t, u)| t.saturating_sub(u)),
        ecc_uncorrectable: ecc,
        ..GpuStatus::default()
    })
}

pub fn report(gpus: &[(String, std::path::PathBuf)]) -> Result<GpuReport, String> {
    let mut out = Vec::new();
    for (bus, dir) in gpus {
        out.push(status(bus, dir, &format!("/sys/bus/pci/devices/{bus}"))?);
    }
    Ok(GpuReport {
        source: "amdgpu sysfs".into(),
        driver_version: None,
        gpus: out,
    })
}
