//! What the NVIDIA kernel module publishes about itself and its GPUs:
//! /proc/driver/nvidia/version, /sys/module/nvidia/version and one
//! /proc/driver/nvidia/gpus/BUS/information file per GPU it registered.

use std::path::Path;

use super::pci::normalize_bus_id;

/// A GPU as the NVIDIA driver registered it.
#[derive(Debug, Clone, Default)]
pub struct DriverGpu {
    pub bus_id: String,
    pub model: Option<String>,
    pub uuid: Option<String>,
    /// N of /dev/nvidiaN.
    pub minor: Option<u32>,
}

/// The `Key: value` lines of an `information` file.
fn parse_information(bus_dir_name: &str, text: &str) -> DriverGpu {
    let mut gpu = DriverGpu {
        bus_id: normalize_bus_id(bus_dir_name),
        ..DriverGpu::default()
    };
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "Model" => gpu.model = Some(value.to_string()),
            "GPU UUID" => gpu.uuid = Some(value.to_string()),
            "Device Minor" => gpu.minor = value.parse().ok(),
            _ => {}
        }
    }
    gpu
}

/// Every GPU under /proc/driver/nvidia/gpus, by bus id; none when the
/// driver is not loaded.
pub fn driver_gpus(dir: &Path) -> Vec<DriverGpu> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut gpus: Vec<DriverGpu> = entries
        .filter_map(Result::ok)
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(e.path().join("information")).unwrap_or_default();
            parse_information(&name, &text)
        })
        .collect();
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    gpus
}

/// Where the loaded module states its version: the driver's own report
/// (what user space is told), and the module's sysfs entry.
pub const PROC_VERSION: &str = "/proc/driver/nvidia/version";
pub const MODULE_VERSION: &str = "/sys/module/nvidia/version";

/// The kernel driver's version from what those two files said: /proc's,
/// else /sys/module's. The `driver` check and the cluster comparison both
/// take it from here, so a node's driver version reads the same in both.
pub fn kernel_version(proc: Option<String>, module: Option<String>) -> Option<String> {
    proc.or(module)
}

/// The version in /proc/driver/nvidia/version's first line, for both the
/// proprietary ("Kernel Module  535.129.03  Thu Oct 19 ...") and the open
/// ("Open Kernel Module for x86_64  550.54.15  Release Build ...") module.
pub fn proc_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|t| is_version(t))
        .map(String::from)
}

fn is_version(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// Orders dotted versions numerically: 535.129.03 > 535.104.12.
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let parse = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(a).cmp(&parse(b))
}

pub fn valid_version(text: &str) -> bool {
    is_version(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_both_module_flavours() {
        assert_eq!(
            proc_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\nGCC version:  gcc version 11.4.0\n"
            )
            .as_deref(),
            Some("535.129.03")
        );
        assert_eq!(
            proc_version(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)  Tue Mar  5 19:50:47 UTC 2024\n"
            )
            .as_deref(),
            Some("550.54.15")
        );
        assert_eq!(proc_version("garbage"), None);
    }

    #[test]
    fn versions_compare_numerically() {
        use std::cmp::Ordering::*;
        assert_eq!(compare_versions("535.129.03", "535.104.12"), Greater);
        assert_eq!(compare_versions("535.54", "535.104"), Less);
        assert_eq!(compare_versions("550", "550.0"), Less);
    }

    #[test]
    fn information_file() {
        let gpu = parse_information(
            "0000:18:00.0",
            "Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-5a9b\nDevice Minor: \t 3\nBus Location: \t 0000:18:00.0\n",
        );
        assert_eq!(gpu.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(gpu.uuid.as_deref(), Some("GPU-5a9b"));
        assert_eq!(gpu.minor, Some(3));
    }
}
