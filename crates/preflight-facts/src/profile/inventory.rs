//! What a node has, as far as a profile speaks of it (read from the facts
//! under `--root`), the differences from a profile, and a profile written
//! from a known-good node.

use std::collections::BTreeMap;

use super::{Profile, device_id};
use crate::{Facts, Vendor};

/// One accelerator on the PCI bus.
#[derive(Debug, Clone, PartialEq)]
pub struct Accelerator {
    pub vendor: Vendor,
    pub device: u16,
    pub address: String,
    /// Bound to its driver (and, for NVIDIA, registered by it).
    pub usable: bool,
    pub product: Option<String>,
    /// (GT/s, width) now and at most.
    pub current: (Option<f64>, Option<u32>),
    pub max: (Option<f64>, Option<u32>),
}

/// One RDMA port.
#[derive(Debug, Clone, PartialEq)]
pub struct RdmaPort {
    /// `mlx5_0:1`.
    pub name: String,
    pub active: bool,
    /// `Disabled`: turned off on purpose (an unused port), not down.
    pub phys_state: String,
    pub rate: Option<f64>,
    pub rate_text: String,
    pub link_layer: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    pub host: String,
    pub accelerators: Vec<Accelerator>,
    pub rdma: Vec<RdmaPort>,
    pub memory_total: Option<u64>,
    pub dmi_product: Option<String>,
    /// The cloud's instance type, from the instance metadata cloud-init
    /// writes on the node (`/run/cloud-init/instance-data.json`,
    /// `v1.instance_type`).
    pub instance_type: Option<String>,
    /// Each accelerator driver loaded: its vendor, module and version
    /// (`/sys/module/MODULE/version`).
    pub drivers: Vec<(Vendor, String, String)>,
    /// Each RDMA adapter's firmware (`fw_ver`).
    pub rdma_firmware: Vec<(String, String)>,
    /// Each NVIDIA GPU's video BIOS, by PCI address (the driver's
    /// /proc/driver/nvidia/gpus/ADDRESS/information).
    pub vbios: Vec<(String, String)>,
    /// The CPUs say they run under a hypervisor (a cloud VM).
    pub virtual_machine: bool,
}

impl Inventory {
    pub fn of(facts: &Facts) -> Inventory {
        let accelerators = facts
            .accelerators()
            .iter()
            .map(|a| Accelerator {
                vendor: a.vendor,
                device: a.pci.device,
                address: a.pci.address.clone(),
                usable: a.in_driver,
                product: a.model.clone(),
                current: (a.pci.link.current_speed, a.pci.link.current_width),
                max: (a.pci.link.max_speed, a.pci.link.max_width),
            })
            .collect();
        let rdma = facts
            .hcas()
            .iter()
            .flat_map(|h| {
                h.ports.iter().map(move |p| RdmaPort {
                    name: format!("{}:{}", h.name, p.number),
                    active: p.is_active(),
                    phys_state: p.phys_state.clone(),
                    rate: p.rate,
                    rate_text: p.rate_text.clone(),
                    link_layer: p.link_layer.clone(),
                })
            })
            .collect();
        // Bounded: a root's files are not trusted to be small.
        let read = |path: &str| crate::read_bounded(&facts.host_path(path), 8 * 1024 * 1024).ok();
        let small = |path: &str| {
            crate::read_bounded(&facts.host_path(path), 4096)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty() && !t.chars().any(char::is_control))
        };
        let drivers = [Vendor::Nvidia, Vendor::Amd, Vendor::Intel, Vendor::Habana]
            .into_iter()
            .flat_map(|v| v.drivers().iter().map(move |m| (v, *m)))
            .filter_map(|(v, m)| {
                Some((
                    v,
                    m.to_string(),
                    small(&format!("/sys/module/{m}/version"))?,
                ))
            })
            .collect();
        let rdma_firmware = facts
            .hcas()
            .iter()
            .filter_map(|h| {
                Some((
                    h.name.clone(),
                    small(&format!("/sys/class/infiniband/{}/fw_ver", h.name))?,
                ))
            })
            .collect();
        let vbios = facts
            .accelerators()
            .iter()
            .filter(|a| a.vendor == Vendor::Nvidia)
            .filter_map(|a| {
                let info = small_text(
                    facts,
                    &format!("/proc/driver/nvidia/gpus/{}/information", a.pci.address),
                )?;
                let v = info
                    .lines()
                    .find_map(|l| l.strip_prefix("Video BIOS:"))?
                    .trim()
                    .to_string();
                (!v.is_empty()).then(|| (a.pci.address.clone(), v))
            })
            .collect();
        Inventory {
            host: facts.hostname().to_string(),
            drivers,
            rdma_firmware,
            vbios,
            accelerators,
            rdma,
            memory_total: read("/proc/meminfo").and_then(|t| crate::meminfo::field(&t, "MemTotal")),
            dmi_product: read("/sys/class/dmi/id/product_name")
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()),
            instance_type: read(INSTANCE_DATA).and_then(|t| instance_type(&t)),
            // x86 CPUs say so in their flags; Xen and others in
            // /sys/hypervisor (aarch64 guests under KVM say neither).
            virtual_machine: read("/proc/cpuinfo").is_some_and(|t| {
                t.lines()
                    .filter(|l| l.starts_with("flags"))
                    .any(|l| l.split_whitespace().any(|f| f == "hypervisor"))
            }) || read("/sys/hypervisor/type")
                .is_some_and(|t| !t.trim().is_empty()),
        }
    }
}

fn small_text(facts: &Facts, path: &str) -> Option<String> {
    crate::read_bounded(&facts.host_path(path), 64 * 1024).ok()
}

/// Where cloud-init writes what the cloud's metadata service said of the
/// instance (AWS, Azure, GCP, OCI and others alike).
pub const INSTANCE_DATA: &str = "/run/cloud-init/instance-data.json";

/// `v1.instance_type` of cloud-init's instance data: a type name, not
/// empty, without control characters.
fn instance_type(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let t = v.get("v1")?.get("instance_type")?.as_str()?.trim();
    (!t.is_empty() && t.len() <= 128 && !t.chars().any(char::is_control)).then(|| t.to_string())
}

/// PCIe GT/s of each generation.
pub(super) const GENERATIONS: [(u8, f64); 6] = [
    (1, 2.5),
    (2, 5.0),
    (3, 8.0),
    (4, 16.0),
    (5, 32.0),
    (6, 64.0),
];

fn generation(speed: f64) -> Option<u8> {
    GENERATIONS
        .iter()
        .find(|(_, s)| (speed - s).abs() < 0.01)
        .map(|(g, _)| *g)
}

pub fn diff(profile: &Profile, node: &Inventory, speed: bool) -> Vec<String> {
    let mut out = Vec::new();
    let m = &profile.matcher;
    let ids: Vec<u16> = match &profile.expect.accelerators {
        Some(a) if !a.device_ids.is_empty() => a
            .device_ids
            .iter()
            .filter_map(|i| device_id(i).ok())
            .collect(),
        _ => m.device_ids.clone(),
    };
    let of_vendor: Vec<&Accelerator> = node
        .accelerators
        .iter()
        .filter(|a| a.vendor == m.vendor)
        .collect();
    let mine: Vec<&Accelerator> = of_vendor
        .iter()
        .copied()
        .filter(|a| ids.contains(&a.device))
        .collect();
    // The count the profile matched on holds where `expect` names none: a
    // node with one accelerator fewer still gets the profile, to fail it.
    let want_count = profile
        .expect
        .accelerators
        .as_ref()
        .map_or(m.count, |a| a.count);
    {
        for a in of_vendor.iter().filter(|a| !ids.contains(&a.device)) {
            out.push(format!(
                "{}: a {} device {:04x}, not one the profile names",
                a.address,
                a.vendor.name(),
                a.device
            ));
        }
        let usable = mine.iter().filter(|a| a.usable).count();
        if mine.len() != want_count {
            out.push(format!(
                "{} {} accelerators of the profile's kind on the PCI bus, the profile has {}",
                mine.len(),
                m.vendor.name(),
                want_count
            ));
        }
        for a in mine.iter().filter(|a| !a.usable) {
            out.push(format!(
                "{}: on the PCI bus but not usable (not bound to its driver)",
                a.address
            ));
        }
        if usable < want_count && mine.len() == want_count {
            out.push(format!("{usable} of {want_count} accelerators usable"));
        }
    }
    if let Some(p) = profile.expect.pcie {
        for a in &mine {
            let (current_speed, width) = a.current;
            let found = if speed {
                current_speed.and_then(generation)
            } else {
                None
            };
            if found.is_some_and(|g| g < p.generation) || width.is_some_and(|w| w < p.width) {
                out.push(format!(
                    "{}: PCIe {} x{} where the profile has Gen{} x{}",
                    a.address,
                    found.map_or("at an unknown speed".to_string(), |g| format!("Gen{g}")),
                    width.map_or("?".to_string(), |w| w.to_string()),
                    p.generation,
                    p.width
                ));
            }
        }
    }
    if let Some(r) = &profile.expect.rdma {
        // The ports of the profile's link layer (a node's storage or
        // management NICs on another are not the profile's); a port turned
        // off on purpose (Disabled) is no fault.
        let relevant: Vec<&RdmaPort> = node
            .rdma
            .iter()
            .filter(|p| {
                r.link_layer
                    .as_deref()
                    .is_none_or(|l| p.link_layer.eq_ignore_ascii_case(l))
            })
            .collect();
        let good = |p: &RdmaPort| p.active && p.rate.is_some_and(|x| x >= r.rate);
        let n = relevant.iter().filter(|p| good(p)).count();
        if n < r.ports {
            for p in relevant.iter().filter(|p| !good(p)) {
                if p.phys_state.eq_ignore_ascii_case("disabled") {
                    continue;
                }
                if !p.active {
                    out.push(format!("{}: not active ({})", p.name, p.rate_text));
                } else {
                    out.push(format!(
                        "{}: {} where the profile has {} Gb/s",
                        p.name, p.rate_text, r.rate
                    ));
                }
            }
            out.push(format!(
                "{n} {}RDMA ports active at {} Gb/s, the profile has {}",
                r.link_layer
                    .as_deref()
                    .map(|l| format!("{l} "))
                    .unwrap_or_default(),
                r.rate,
                r.ports
            ));
        }
    }
    if let Some(d) = &profile.expect.driver {
        let mine: Vec<&(Vendor, String, String)> = node
            .drivers
            .iter()
            .filter(|(v, _, _)| *v == m.vendor)
            .collect();
        if mine.is_empty() {
            out.push(format!(
                "the {} driver's version is unknown (no /sys/module/{}/version): the profile has the {} family",
                m.vendor.name(),
                m.vendor.drivers().join("/version or /sys/module/"),
                d.family
            ));
        }
        for (_, module, version) in mine
            .iter()
            .filter(|(_, _, v)| !super::in_family(v, &d.family))
        {
            out.push(format!(
                "driver {module} {version} where the profile has the {} family",
                d.family
            ));
        }
    }
    if let Some(f) = &profile.expect.firmware {
        let families = [
            (f.rdma.as_ref(), &node.rdma_firmware, "RDMA adapter"),
            (f.vbios.as_ref(), &node.vbios, "video BIOS"),
        ];
        for (family, found, what) in families {
            let Some(family) = family else { continue };
            if found.is_empty() {
                out.push(format!(
                    "no {what} firmware version found: the profile has the {family} family"
                ));
            }
            for (at, version) in found.iter().filter(|(_, v)| !super::in_family(v, family)) {
                out.push(format!(
                    "{at}: {what} firmware {version} where the profile has the {family} family"
                ));
            }
        }
    }
    match (profile.expect.memory, node.memory_total) {
        (Some(mem), Some(total)) if total < mem.min_total.0 => out.push(format!(
            "{} of memory where the profile has at least {}",
            preflight_ground::values::format_bytes(total),
            mem.min_total
        )),
        (Some(_), None) => {
            out.push("the memory total is unknown (no MemTotal in /proc/meminfo)".into())
        }
        _ => {}
    }
    out
}

/// Text as a YAML double-quoted scalar.
fn yaml_text(text: &str) -> String {
    let escaped: String = text
        .chars()
        .filter(|c| !c.is_control())
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c => vec![c],
        })
        .collect();
    format!("\"{escaped}\"")
}

/// A profile of this node, as it is now (a known-good node), in the
/// profiles' YAML: its accelerators by vendor (the most numerous), their
/// PCIe link, its active RDMA ports, its memory (at 95%).
pub fn capture(node: &Inventory, name: &str) -> Result<String, String> {
    let mut by_kind: BTreeMap<(Vendor, u16), Vec<&Accelerator>> = BTreeMap::new();
    for a in &node.accelerators {
        by_kind.entry((a.vendor, a.device)).or_default().push(a);
    }
    let Some(((vendor, device), accs)) = by_kind.into_iter().max_by_key(|(_, v)| v.len()) else {
        return Err(format!(
            "{}: no accelerator on the PCI bus: a profile is decided by the accelerators",
            node.host
        ));
    };
    let vendor_word = match vendor {
        Vendor::Nvidia => "nvidia",
        Vendor::Amd => "amd",
        Vendor::Intel => "intel",
        Vendor::Habana => "habana",
    };
    let mut text = format!(
        "# Captured by `preflight baseline capture` from {} (a known-good node).\nprofile: {}\ndescription: {}\nmatch: {{vendor: {vendor_word}, device_ids: [\"0x{device:04x}\"], count: {}, virtual_machine: {}{}}}\nexpect:\n  accelerators: {{count: {}, device_ids: [\"0x{device:04x}\"]}}\n",
        node.host.replace(['\n', '\r'], " "),
        yaml_text(name),
        yaml_text(&format!(
            "{} x {} {:04x}{}",
            accs.len(),
            vendor.name(),
            device,
            accs.iter()
                .find_map(|a| a.product.clone())
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        )),
        accs.len(),
        node.virtual_machine,
        // The cloud's instance type, where the node has one: the profile
        // then applies to that size only.
        match (&node.instance_type, &node.dmi_product) {
            (Some(t), _) => format!(", instance_type: {}", yaml_text(t)),
            (None, Some(d)) => format!(", dmi_product: {}", yaml_text(d)),
            (None, None) => String::new(),
        },
        accs.len()
    );
    // The lowest generation and the narrowest width, each on its own.
    let lowest = accs.iter().filter_map(|a| generation(a.current.0?)).min();
    let width = accs.iter().filter_map(|a| a.current.1).min();
    if let (Some(g), Some(w)) = (lowest, width) {
        text.push_str(&format!("  pcie: {{gen: {g}, width: {w}}}\n"));
    }
    // The active ports of the most common link layer (the compute fabric;
    // storage NICs on another layer are left out).
    let mut layers: BTreeMap<String, Vec<&RdmaPort>> = BTreeMap::new();
    for p in node.rdma.iter().filter(|p| p.active) {
        layers.entry(p.link_layer.clone()).or_default().push(p);
    }
    if let Some((layer, ports)) = layers.into_iter().max_by_key(|(_, v)| v.len())
        && let Some(rate) = ports
            .iter()
            .filter_map(|p| p.rate)
            .min_by(|a, b| a.total_cmp(b))
    {
        text.push_str(&format!(
            "  rdma: {{ports: {}, rate: {rate}, link_layer: {}}}\n",
            ports.len(),
            yaml_text(&layer)
        ));
    }
    // A node of the same kind differs by a few MiB the kernel keeps; a
    // lost DIMM of 24 is 4%.
    if let Some(total) = node.memory_total {
        let gib = (total as f64 * 0.97 / (1u64 << 30) as f64).floor() as u64;
        text.push_str(&format!("  memory: {{min_total: {gib}GiB}}\n"));
    }
    // Versions as families: the driver's major (550 of 550.90.07), the
    // firmware's first two parts (28.39 of 28.39.1002), where every device
    // agrees; a node with two families is no baseline for either.
    let family = |v: &str, parts: usize| {
        v.split(['.', '-'])
            .take(parts)
            .collect::<Vec<_>>()
            .join(".")
    };
    let agreed = |versions: Vec<String>| {
        let first = versions.first()?.clone();
        versions.iter().all(|v| *v == first).then_some(first)
    };
    if let Some(d) = agreed(
        node.drivers
            .iter()
            .filter(|(v, _, _)| *v == vendor)
            .map(|(_, _, version)| family(version, 1))
            .collect(),
    ) {
        text.push_str(&format!("  driver: {{family: {}}}\n", yaml_text(&d)));
    }
    let rdma = agreed(
        node.rdma_firmware
            .iter()
            .map(|(_, v)| family(v, 2))
            .collect(),
    );
    let vbios = agreed(node.vbios.iter().map(|(_, v)| family(v, 2)).collect());
    let firmware: Vec<String> = [("rdma", rdma), ("vbios", vbios)]
        .into_iter()
        .filter_map(|(k, v)| Some(format!("{k}: {}", yaml_text(&v?))))
        .collect();
    if !firmware.is_empty() {
        text.push_str(&format!("  firmware: {{{}}}\n", firmware.join(", ")));
    }
    // What the sysfs view cannot show is left to the operator: NVLink and
    // XGMI links, a Gaudi's scale-out rate.
    text.push_str("  # nvlink: {links: N}    xgmi: {links: N}    scale_out: {gbps: N}\n");
    Ok(text)
}
