//! PCI devices from /sys/bus/pci/devices: the node's device inventory
//! (vendor, device id, class, bound driver, NUMA node, PCIe link), and which
//! accelerator vendors the node has.

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

    /// What this vendor's accelerator is called: a Gaudi is no GPU.
    pub fn device(self) -> &'static str {
        match self {
            Vendor::Habana => "Gaudi accelerator",
            _ => "GPU",
        }
    }

    /// The kernel drivers that make this vendor's accelerators usable.
    pub fn drivers(self) -> &'static [&'static str] {
        match self {
            Vendor::Nvidia => &["nvidia"],
            Vendor::Amd => &["amdgpu"],
            Vendor::Intel => &["i915", "xe"],
            Vendor::Habana => &["habanalabs"],
        }
    }
}

/// The PCIe link as the device trained it and as it could train.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Link {
    /// GT/s; `None` when the file is absent or says "Unknown".
    pub current_speed: Option<f64>,
    pub max_speed: Option<f64>,
    pub current_width: Option<u32>,
    pub max_width: Option<u32>,
    /// Link attributes that exist but do not parse, as `name: `text``.
    pub malformed: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct PciDevice {
    /// Bus id, e.g. `0000:18:00.0`.
    pub address: String,
    pub vendor: u16,
    pub device: u16,
    /// 24-bit class code, e.g. 0x030200 for a 3D controller.
    pub class: u32,
    /// Bound driver, from the `driver` symlink.
    pub driver: Option<String>,
    /// `None` on single-socket machines, where the kernel writes -1.
    pub numa_node: Option<u32>,
    pub link: Link,
    /// An SR-IOV virtual function: its link is its parent's.
    pub virtual_function: bool,
    /// The link of the port above it (a switch's downstream port, a root
    /// port), where sysfs shows one: a link is no faster than its slower
    /// end.
    pub upstream: Option<Link>,
}

/// Intel data-center GPUs by device id: Max (Ponte Vecchio) and Flex. They
/// count as accelerators even with no driver bound, so a node whose GPUs
/// lost their driver is still seen as an XPU node (and fails, not skips).
fn intel_datacenter_gpu(device: u16) -> bool {
    matches!(device, 0x0bd0..=0x0bdb | 0x56c0 | 0x56c1)
}

impl PciDevice {
    fn base_class(&self) -> u8 {
        (self.class >> 16) as u8
    }

    /// Network (0x02xx, Ethernet and InfiniBand) controllers.
    pub fn is_nic(&self) -> bool {
        self.base_class() == 0x02
    }

    /// Which accelerator vendor this device counts as, if any: display
    /// controllers (0x03) and processing accelerators (0x12) of the vendors
    /// we know. NVSwitch bridges and GPU audio functions are not GPUs. Intel
    /// display controllers count only with a GPU driver bound (or as a known
    /// data-center GPU), so a server board's integrated graphics does not
    /// make a node an XPU node.
    pub fn accelerator_vendor(&self) -> Option<Vendor> {
        let gpu_class = matches!(self.base_class(), 0x03 | 0x12);
        match self.vendor {
            0x10de if gpu_class => Some(Vendor::Nvidia),
            0x1002 if gpu_class => Some(Vendor::Amd),
            0x1da3 => Some(Vendor::Habana),
            0x8086
                if gpu_class
                    && (matches!(self.driver.as_deref(), Some("i915") | Some("xe"))
                        || intel_datacenter_gpu(self.device)) =>
            {
                Some(Vendor::Intel)
            }
            _ => None,
        }
    }

    /// NVSwitch: an NVIDIA bridge (class 0x0680) on HGX boards.
    pub fn is_nvswitch(&self) -> bool {
        self.vendor == 0x10de && self.class >> 8 == 0x0680
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn read_hex(path: &Path) -> Option<u32> {
    let text = read_trimmed(path)?;
    u32::from_str_radix(text.trim_start_matches("0x"), 16).ok()
}

/// `32.0 GT/s PCIe` (kernels since 5.x), `8 GT/s`, `2.5 GT/s`; "Unknown"
/// when the link is down or the device does not say.
pub fn parse_speed(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// Formats GT/s as the kernel does, without trailing zeros.
/// What a link moves per direction, GB/s, after its line encoding:
/// 8b/10b up to 5 GT/s (Gen 1 and 2), 128b/130b to 32 GT/s (Gen 3 to 5),
/// FLIT mode's 242 of 256 bytes at 64 GT/s (Gen 6).
pub fn link_gbps(gts: f64, width: u32) -> f64 {
    let encoding = if gts <= 5.0 {
        0.8
    } else if gts <= 32.0 {
        128.0 / 130.0
    } else {
        242.0 / 256.0
    };
    gts * encoding / 8.0 * f64::from(width)
}

pub fn format_speed(gts: f64) -> String {
    let text = format!("{gts:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text).to_string();
    format!("{text} GT/s")
}

fn read_link(dir: &Path) -> Link {
    let mut malformed = Vec::new();
    let mut width = |name: &str| {
        let text = read_trimmed(&dir.join(name))?;
        let parsed = text.parse().ok();
        if parsed.is_none() {
            malformed.push(format!("{name}: `{text}`"));
        }
        parsed
    };
    let current_width = width("current_link_width");
    let max_width = width("max_link_width");
    let mut speed = |name: &str| {
        let text = read_trimmed(&dir.join(name))?;
        let parsed = parse_speed(&text);
        // "Unknown" is the kernel's own word for a link it cannot read.
        if parsed.is_none() && !text.starts_with("Unknown") {
            malformed.push(format!("{name}: `{text}`"));
        }
        parsed
    };
    Link {
        current_speed: speed("current_link_speed"),
        max_speed: speed("max_link_speed"),
        current_width,
        max_width,
        malformed,
    }
}

/// The last path component of a symlink's target: a bound driver's name.
pub fn link_name(path: &Path) -> Option<String> {
    std::fs::read_link(path)
        .ok()
        .and_then(|target| target.file_name()?.to_str().map(String::from))
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
            let device = read_hex(&path.join("device")).unwrap_or(0) as u16;
            let class = read_hex(&path.join("class")).unwrap_or(0);
            let numa_node = read_trimmed(&path.join("numa_node"))
                .and_then(|t| t.parse::<i64>().ok())
                .and_then(|n| u32::try_from(n).ok());
            Some(PciDevice {
                address: entry.file_name().to_string_lossy().into_owned(),
                vendor,
                device,
                class,
                driver: link_name(&path.join("driver")),
                numa_node,
                link: read_link(&path),
                virtual_function: path.join("physfn").exists(),
                upstream: upstream_link(&path),
            })
        })
        .collect();
    devices.sort_by(|a, b| a.address.cmp(&b.address));
    devices
}

/// The link attributes of the directory above a device's own (sysfs
/// nests a device under the port it hangs from), where that is a PCI
/// function with link attributes.
fn upstream_link(device: &Path) -> Option<Link> {
    let own = std::fs::canonicalize(device).ok()?;
    let parent = own.parent()?;
    let name = parent.file_name()?.to_string_lossy();
    if name.matches(':').count() != 2 || !name.contains('.') {
        return None;
    }
    let link = read_link(parent);
    (link.max_speed.is_some() || link.max_width.is_some()).then_some(link)
}

/// `00000000:1B:00.0` (nvidia-smi, NVML) or `0000:1b:00.0` (sysfs) to the
/// sysfs form, so ids from every source compare equal.
pub fn normalize_bus_id(text: &str) -> String {
    let text = text.trim().to_ascii_lowercase();
    let mut parts: Vec<&str> = text.split(':').collect();
    if parts.len() == 3 {
        let domain = parts[0].trim_start_matches('0');
        let domain = format!("{domain:0>4}");
        parts[0] = &domain;
        return parts.join(":");
    }
    if parts.len() == 2 {
        return format!("0000:{text}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalise() {
        assert_eq!(normalize_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
        assert_eq!(normalize_bus_id("0000:1b:00.0"), "0000:1b:00.0");
        assert_eq!(normalize_bus_id("1b:00.0"), "0000:1b:00.0");
        assert_eq!(normalize_bus_id("00010000:1B:00.0"), "10000:1b:00.0");
    }

    #[test]
    fn speeds_parse_in_every_kernel_format() {
        assert_eq!(parse_speed("32.0 GT/s PCIe"), Some(32.0));
        assert_eq!(parse_speed("8 GT/s"), Some(8.0));
        assert_eq!(parse_speed("Unknown"), None);
        assert_eq!(format_speed(2.5), "2.5 GT/s");
        assert_eq!(format_speed(16.0), "16 GT/s");
    }
}
