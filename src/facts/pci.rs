//! PCI devices from /sys/bus/pci/devices: enough to know which accelerator
//! vendors a node has. The device inventory builds on this.

use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Vendor {
    Nvidia,
    Amd,
    Intel,
    Habana,
}

impl Vendor {
    pub fn name(self) -> &'static str {
        match self {
            Vendor::Nvidia => "NVIDIA",
            Vendor::Amd => "AMD",
            Vendor::Intel => "Intel",
            Vendor::Habana => "Habana",
        }
    }
}

#[derive(Debug, Clone)]
pub struct PciDevice {
    /// Bus id, e.g. `0000:18:00.0`.
    pub address: String,
    pub vendor: u16,
    /// 24-bit class code, e.g. 0x030200 for a 3D controller.
    pub class: u32,
    /// Bound driver, from the `driver` symlink.
    pub driver: Option<String>,
}

impl PciDevice {
    fn base_class(&self) -> u8 {
        (self.class >> 16) as u8
    }

    /// Which accelerator vendor this device counts as, if any: display
    /// controllers (0x03) and processing accelerators (0x12) of the vendors
    /// we know. NVSwitch bridges and GPU audio functions are not GPUs. Intel
    /// display controllers count only with a GPU driver bound, so a server
    /// board's integrated graphics does not make a node an XPU node.
    pub fn accelerator_vendor(&self) -> Option<Vendor> {
        let gpu_class = matches!(self.base_class(), 0x03 | 0x12);
        match self.vendor {
            0x10de if gpu_class => Some(Vendor::Nvidia),
            0x1002 if gpu_class => Some(Vendor::Amd),
            0x1da3 => Some(Vendor::Habana),
            0x8086 if gpu_class && matches!(self.driver.as_deref(), Some("i915") | Some("xe")) => {
                Some(Vendor::Intel)
            }
            _ => None,
        }
    }
}

fn read_hex(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

/// Every readable device; a directory that is not a PCI device is ignored,
/// and a missing /sys/bus/pci (containers, fixtures of other kinds) is an
/// empty list.
pub fn scan(dir: &Path) -> Vec<PciDevice> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut devices: Vec<PciDevice> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let path = entry.path();
            let vendor = read_hex(&path.join("vendor"))? as u16;
            let class = read_hex(&path.join("class")).unwrap_or(0);
            let driver = std::fs::read_link(path.join("driver"))
                .ok()
                .and_then(|target| target.file_name()?.to_str().map(String::from));
            Some(PciDevice {
                address: entry.file_name().to_string_lossy().into_owned(),
                vendor,
                class,
                driver,
            })
        })
        .collect();
    devices.sort_by(|a, b| a.address.cmp(&b.address));
    devices
}
