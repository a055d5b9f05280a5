//! The accelerator inventory: each accelerator as three views that must
//! agree (the PCI bus, the vendor's driver, the device nodes a program
//! opens). A GPU that is on the bus but missing from a later view is the
//! classic "8 GPUs installed, 7 usable".

use std::path::Path;

use super::Facts;
use super::nvidia::{self, DriverGpu};
use super::pci::{PciDevice, Vendor};

#[derive(Debug, Clone)]
pub struct DevNode {
    pub path: String,
    pub present: bool,
}

#[derive(Debug, Clone)]
pub struct Accelerator {
    pub vendor: Vendor,
    pub pci: PciDevice,
    /// Bound to the vendor's driver and, for NVIDIA, registered under
    /// /proc/driver/nvidia/gpus.
    pub in_driver: bool,
    pub uuid: Option<String>,
    pub model: Option<String>,
    /// The per-device nodes the driver created for it (none known when it
    /// is not in the driver).
    pub nodes: Vec<DevNode>,
    /// Tiles (Intel GPU Max has two per card, drm/cardN/gt/gtM), each a
    /// device of its own to Level Zero in its default FLAT hierarchy.
    pub tiles: usize,
}

impl Accelerator {
    /// `0000:52:00.0 (not bound to a driver)` style reasons for reports.
    pub fn driver_problem(&self) -> Option<String> {
        if self.in_driver {
            return None;
        }
        Some(match &self.pci.driver {
            None => "not bound to any driver".to_string(),
            Some(d) if self.vendor.drivers().contains(&d.as_str()) => {
                format!("bound to {d} but not registered by it")
            }
            Some(d) => format!("bound to {d}, not {}", self.vendor.drivers().join(" or ")),
        })
    }
}

fn node(facts: &Facts, path: String) -> DevNode {
    let present = facts.host_path(&path).exists();
    DevNode { path, present }
}

/// Entries of a sysfs directory whose names start with `prefix`, sorted.
fn entries(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

pub fn scan(facts: &Facts) -> Vec<Accelerator> {
    let driver_gpus: Vec<DriverGpu> =
        nvidia::driver_gpus(&facts.host_path("/proc/driver/nvidia/gpus"));
    let mut found = Vec::new();
    for pci in facts.pci_devices() {
        let Some(vendor) = pci.accelerator_vendor() else {
            continue;
        };
        let bound = pci
            .driver
            .as_deref()
            .is_some_and(|d| vendor.drivers().contains(&d));
        let sys = facts.host_path(format!("/sys/bus/pci/devices/{}", pci.address));
        let mut acc = Accelerator {
            vendor,
            pci: pci.clone(),
            in_driver: bound,
            uuid: None,
            model: None,
            nodes: Vec::new(),
            tiles: 1,
        };
        match vendor {
            Vendor::Nvidia => {
                let registered = driver_gpus.iter().find(|g| g.bus_id == pci.address);
                acc.in_driver = bound && registered.is_some();
                if let Some(g) = registered {
                    acc.uuid = g.uuid.clone();
                    acc.model = g.model.clone();
                    if let Some(minor) = g.minor {
                        acc.nodes.push(node(facts, format!("/dev/nvidia{minor}")));
                    }
                }
            }
            Vendor::Amd | Vendor::Intel if bound => {
                if vendor == Vendor::Amd {
                    // ROCR_VISIBLE_DEVICES names GPUs as GPU-<unique_id>.
                    acc.uuid = std::fs::read_to_string(sys.join("unique_id"))
                        .ok()
                        .map(|id| format!("GPU-{}", id.trim()));
                }
                for name in entries(&sys.join("drm"), "renderD") {
                    acc.nodes.push(node(facts, format!("/dev/dri/{name}")));
                }
                if vendor == Vendor::Intel {
                    // i915 lists a card's tiles as drm/cardN/gt/gtM; xe as
                    // tileM directories of the PCI device.
                    let i915: usize = entries(&sys.join("drm"), "card")
                        .iter()
                        .map(|card| entries(&sys.join("drm").join(card).join("gt"), "gt").len())
                        .sum();
                    let xe = entries(&sys, "tile").len();
                    acc.tiles = i915.max(xe).max(1);
                }
            }
            Vendor::Habana if bound => {
                for name in entries(&sys.join("accel"), "accel") {
                    acc.nodes.push(node(facts, format!("/dev/accel/{name}")));
                }
                for name in entries(&sys.join("habanalabs"), "hl") {
                    acc.nodes.push(node(facts, format!("/dev/{name}")));
                }
            }
            _ => {}
        }
        found.push(acc);
    }
    found
}
