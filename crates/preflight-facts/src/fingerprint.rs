//! What a kept pass depends on (`checklist::kept`): this boot, the kernel,
//! the accelerator drivers and firmware, the devices by bus id and serial,
//! and the count of hardware events the kernel has logged since boot. Any
//! change discards every kept pass. All of it read under the facts' root,
//! so a fixture tree has its own.

use sha2::{Digest, Sha256};

use super::Facts;
use preflight_ground::values::hex;

/// PCI classes of the devices a slow check tests: display and 3D
/// controllers (GPUs), processing accelerators (Gaudi, some XPUs).
const DEVICE_CLASSES: &[&str] = &["0x0300", "0x0302", "0x1200"];

/// Kernel log lines that are hardware events: a new one means the node
/// changed under the kept passes.
const HARDWARE_EVENTS: &[&str] = &[
    "NVRM: Xid",
    "Hardware Error",
    "mce:",
    "AER:",
    "amdgpu: GPU reset",
];

fn read(facts: &Facts, path: &str) -> String {
    std::fs::read_to_string(facts.host_path(path))
        .map(|t| t.trim().to_string())
        .unwrap_or_default()
}

/// The node's state, one `name: value` line each, in a stable order.
pub fn lines(facts: &Facts) -> Vec<String> {
    let mut out = vec![
        format!("boot: {}", read(facts, "/proc/sys/kernel/random/boot_id")),
        format!("kernel: {}", read(facts, "/proc/sys/kernel/osrelease")),
    ];
    for module in ["nvidia", "amdgpu", "habanalabs", "i915", "xe"] {
        let v = read(facts, &format!("/sys/module/{module}/version"));
        if !v.is_empty() {
            out.push(format!("driver {module}: {v}"));
        }
    }
    // NVIDIA's per-GPU information: model, serial-like UUID, VBIOS.
    let gpus = facts.host_path("/proc/driver/nvidia/gpus");
    let mut infos: Vec<(String, String)> = std::fs::read_dir(&gpus)
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let text =
                        std::fs::read_to_string(e.path().join("information")).unwrap_or_default();
                    let kept: Vec<&str> = text
                        .lines()
                        .filter(|l| {
                            ["Model:", "GPU UUID:", "Video BIOS:", "Bus Location:"]
                                .iter()
                                .any(|k| l.trim_start().starts_with(k))
                        })
                        .map(str::trim)
                        .collect();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        kept.join("; "),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    infos.sort();
    out.extend(infos.into_iter().map(|(bus, i)| format!("gpu {bus}: {i}")));
    // Every accelerator on the PCI bus, by address, id and revision.
    let pci = facts.host_path("/sys/bus/pci/devices");
    let mut devices: Vec<String> = std::fs::read_dir(&pci)
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let p = e.path();
                    let class = std::fs::read_to_string(p.join("class")).ok()?;
                    let class = class.trim();
                    if !DEVICE_CLASSES.iter().any(|c| class.starts_with(c)) {
                        return None;
                    }
                    let field = |f: &str| {
                        std::fs::read_to_string(p.join(f))
                            .map(|t| t.trim().to_string())
                            .unwrap_or_default()
                    };
                    Some(format!(
                        "device {}: {} {} {} rev {}",
                        e.file_name().to_string_lossy(),
                        class,
                        field("vendor"),
                        field("device"),
                        field("revision")
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    devices.sort();
    out.extend(devices);
    let log = super::kmsg::read_kmsg(&facts.host_path("/dev/kmsg")).unwrap_or_default();
    let events = log
        .lines()
        .filter(|l| HARDWARE_EVENTS.iter().any(|e| l.contains(e)))
        .count();
    out.push(format!("hardware events since boot: {events}"));
    out
}

/// The fingerprint: a hash of `lines`.
pub fn of(facts: &Facts) -> String {
    let mut h = Sha256::new();
    for l in lines(facts) {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    hex(&h.finalize()[..12])
}
