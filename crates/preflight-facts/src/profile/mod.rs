//! Node profiles: what a node of a kind must have, for when a golden file
//! is what the operator wants (preflight otherwise compares nodes with
//! each other). A profile is YAML in the checklists' dialect, with located
//! errors:
//!
//! ```yaml
//! profile: hgx-h100-8
//! description: HGX H100 8-GPU, SXM5 80 GB
//! match: {vendor: nvidia, device_ids: ["0x2330"], count: 8}
//! expect:
//!   accelerators: {count: 8, device_ids: ["0x2330"]}
//!   pcie: {gen: 5, width: 16}
//!   nvlink: {links: 18}
//!   rdma: {ports: 8, rate: 400, link_layer: InfiniBand}
//!   memory: {min_total: 1.8TiB}
//!   driver: {family: "550"}
//!   firmware: {rdma: "28.39", vbios: "96.00"}
//!   floors: {busbw: [{backend: nccl, op: allreduce, size: 1GiB, gbps: 360}], pair_gbps: 40, h2d_gbps: 40, d2h_gbps: 40}
//! ```
//!
//! Which profile applies is decided from the node's accelerators (vendor,
//! PCI device id and count) and, where a profile says so, the cloud's
//! instance type (cloud-init's instance metadata, else the DMI product
//! name), the DMI product name and whether the node is a VM; never from
//! the host name. A node that matches none is compared with its peers as
//! before. The floors are measured, not read: `collective.floors` holds
//! the collective stage to them.

mod inventory;
mod shipped;

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::Vendor;
use preflight_ground::values::Bytes;
use preflight_ground::yaml::{self, YamlError};

pub use inventory::{Inventory, capture};
pub use shipped::shipped;

/// One profile, as read.
#[derive(Debug, Clone)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// The file it was read from, or `shipped`.
    pub origin: String,
    pub matcher: Match,
    pub expect: Expect,
}

#[derive(Debug, Clone)]
pub struct Match {
    pub vendor: Vendor,
    pub device_ids: Vec<u16>,
    pub count: usize,
    /// A part of /sys/class/dmi/id/product_name (the cloud's instance
    /// type, the server's model).
    pub dmi_product: Option<String>,
    /// Whether the node must be a virtual machine (`false`: bare metal,
    /// as the data-sheet figures of a board are), else either.
    pub virtual_machine: Option<bool>,
    /// The cloud's instance type, exactly (any case): as its instance
    /// metadata file says (cloud-init's instance-data.json), else, on a
    /// node without one, the DMI product name (where the cloud writes it).
    pub instance_type: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    #[serde(default)]
    pub accelerators: Option<Accelerators>,
    #[serde(default)]
    pub pcie: Option<Pcie>,
    #[serde(default)]
    pub nvlink: Option<Links>,
    #[serde(default)]
    pub xgmi: Option<Links>,
    #[serde(default)]
    pub rdma: Option<Rdma>,
    #[serde(default)]
    pub scale_out: Option<ScaleOut>,
    #[serde(default)]
    pub memory: Option<Memory>,
    #[serde(default)]
    pub driver: Option<Driver>,
    #[serde(default)]
    pub firmware: Option<Firmware>,
    #[serde(default)]
    pub floors: Option<Floors>,
}

/// Measured floors: what the collective stage must reach on nodes of this
/// kind (`preflight baseline capture --from REPORT...` writes them from a
/// healthy run). Judged by `collective.floors` in `preflight run`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Floors {
    /// Bus bandwidth per backend, operation and size.
    #[serde(default)]
    pub busbw: Vec<BusbwFloor>,
    /// Every pair of the pairwise round between two nodes, GB/s each way.
    #[serde(default)]
    pub pair_gbps: Option<f64>,
    /// Every GPU's host-to-device copy rate, GB/s (`gpu_bandwidth`).
    #[serde(default)]
    pub h2d_gbps: Option<f64>,
    /// Every GPU's device-to-host copy rate, GB/s (`gpu_bandwidth`).
    #[serde(default)]
    pub d2h_gbps: Option<f64>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BusbwFloor {
    pub backend: String,
    pub op: String,
    pub size: Bytes,
    /// GB/s (10^9 B/s), nccl-tests' busbw.
    pub gbps: f64,
}

/// The operations a sweep measures (and a floor may name).
pub const SWEPT_OPS: [&str; 3] = ["allreduce", "allgather", "broadcast"];

/// The accelerator driver's version family: `550` holds 550.90.07 and
/// 550.54.15, not 535.x or 5501.x.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Driver {
    pub family: String,
}

/// Firmware families: every RDMA adapter's (`fw_ver`, e.g. `28.39`), every
/// NVIDIA GPU's video BIOS (e.g. `96.00`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Firmware {
    #[serde(default)]
    pub rdma: Option<String>,
    #[serde(default)]
    pub vbios: Option<String>,
}

/// Whether `version` is of `family`: the same, or it followed by a dot
/// (or a dash: 2.0.0-15, a build after the version).
pub fn in_family(version: &str, family: &str) -> bool {
    let v = version.trim().to_ascii_lowercase();
    let f = family.trim().trim_end_matches('.').to_ascii_lowercase();
    v == f
        || v.strip_prefix(&f)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Accelerators {
    pub count: usize,
    #[serde(default)]
    pub device_ids: Vec<String>,
}

/// Every accelerator's PCIe link.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Pcie {
    #[serde(rename = "gen")]
    pub generation: u8,
    pub width: u32,
}

impl Pcie {
    /// The generation's rate, GT/s.
    pub fn gts(&self) -> f64 {
        inventory::GENERATIONS
            .iter()
            .find(|(g, _)| *g == self.generation)
            .map_or(0.0, |(_, s)| *s)
    }
}

/// Links each GPU must have up (NVLink, XGMI).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Links {
    pub links: usize,
}

/// The RDMA ports (InfiniBand or RoCE) that must be active.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Rdma {
    pub ports: usize,
    /// Gb/s, as the port's rate says.
    pub rate: f64,
    #[serde(default)]
    pub link_layer: Option<String>,
}

/// A Gaudi's scale-out ports (Linux interfaces), Gb/s.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScaleOut {
    pub gbps: u32,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    pub min_total: Bytes,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    vendor: String,
    device_ids: Vec<String>,
    count: usize,
    #[serde(default)]
    dmi_product: Option<String>,
    #[serde(default)]
    virtual_machine: Option<bool>,
    #[serde(default)]
    instance_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    profile: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(rename = "match")]
    matcher: RawMatch,
    #[serde(default)]
    expect: Expect,
}

/// A PCI device id as profiles write it: `0x2330` (or `2330`).
pub fn device_id(text: &str) -> Result<u16, String> {
    let t = text.trim();
    let hex = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u16::from_str_radix(hex, 16)
        .map_err(|_| format!("`{text}` is not a PCI device id (four hex digits, e.g. 0x2330)"))
}

fn vendor(text: &str) -> Result<Vendor, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "nvidia" => Ok(Vendor::Nvidia),
        "amd" => Ok(Vendor::Amd),
        "intel" => Ok(Vendor::Intel),
        "habana" | "gaudi" => Ok(Vendor::Habana),
        other => Err(format!(
            "unknown vendor `{other}`: nvidia, amd, intel or habana"
        )),
    }
}

/// A profile's error, where it is: `FILE:LINE:COLUMN: PATH: message`, as
/// the checklists' errors read.
#[derive(Debug, Clone)]
pub struct ProfileError {
    pub file: String,
    pub location: Option<yaml::Location>,
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(at) = self.location {
            write!(f, ":{}:{}", at.line, at.column)?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

fn located(origin: &str, e: YamlError) -> ProfileError {
    ProfileError {
        file: origin.to_string(),
        location: e.location,
        path: e.path(),
        message: e.message,
    }
}

fn unlocated(origin: &str, message: String) -> ProfileError {
    ProfileError {
        file: origin.to_string(),
        location: None,
        path: String::new(),
        message,
    }
}

/// Reads one profile; every error names the file, line and column.
pub fn parse(origin: &str, text: &str) -> Result<Profile, Vec<ProfileError>> {
    let node = yaml::parse_document(text).map_err(|e| vec![located(origin, e)])?;
    let (raw, errors) = yaml::from_node_all::<Raw>(&node);
    let mut errors: Vec<ProfileError> = errors.into_iter().map(|e| located(origin, e)).collect();
    let Some(raw) = raw else {
        if errors.is_empty() {
            errors.push(unlocated(
                origin,
                "not a profile (profile, match, expect)".into(),
            ));
        }
        return Err(errors);
    };
    // Values serde cannot judge, located at their keys.
    let find = |path: &[&str]| {
        let mut n = &node;
        for key in path {
            match yaml::mapping_entries(n).and_then(|entries| {
                entries
                    .into_iter()
                    .find(|(k, _)| yaml::scalar_text(k).as_deref() == Some(*key))
            }) {
                Some((_, v)) => n = v,
                None => break,
            }
        }
        n
    };
    let at = |path: &[&str], message: String| located(origin, YamlError::at(message, find(path)));
    let at_item = |path: &[&str], i: usize, message: String| {
        let list = find(path);
        let item = yaml::sequence_items(list)
            .and_then(|items| items.get(i).copied())
            .unwrap_or(list);
        located(origin, YamlError::at(message, item))
    };
    let vendor = vendor(&raw.matcher.vendor).map_err(|e| at(&["match", "vendor"], e));
    let mut ids = Vec::new();
    for (i, id) in raw.matcher.device_ids.iter().enumerate() {
        match device_id(id) {
            Ok(d) => ids.push(d),
            Err(e) => errors.push(at_item(&["match", "device_ids"], i, e)),
        }
    }
    if ids.is_empty() && errors.is_empty() {
        errors.push(at(
            &["match", "device_ids"],
            "name at least one PCI device id".into(),
        ));
    }
    if let Some(a) = &raw.expect.accelerators {
        for id in &a.device_ids {
            if let Err(e) = device_id(id) {
                errors.push(at(&["expect", "accelerators", "device_ids"], e));
            }
        }
    }
    if let Some(p) = &raw.expect.pcie
        && !(1..=6).contains(&p.generation)
    {
        errors.push(at(
            &["expect", "pcie", "gen"],
            format!("PCIe generation {} does not exist (1 to 6)", p.generation),
        ));
    }
    if raw.matcher.count == 0 {
        errors.push(at(&["match", "count"], "count must be at least 1".into()));
    }
    let e = &raw.expect;
    if *e == Expect::default() {
        errors.push(at(
            &["expect"],
            "the profile expects nothing: name at least one of accelerators, pcie, nvlink, xgmi, rdma, scale_out, memory, driver, firmware, floors".into(),
        ));
    }
    for (zero, path, what) in [
        (
            e.accelerators.as_ref().is_some_and(|a| a.count == 0),
            &["expect", "accelerators", "count"][..],
            "count",
        ),
        (
            e.pcie.is_some_and(|p| p.width == 0),
            &["expect", "pcie", "width"][..],
            "width",
        ),
        (
            e.nvlink.is_some_and(|l| l.links == 0),
            &["expect", "nvlink", "links"][..],
            "links",
        ),
        (
            e.xgmi.is_some_and(|l| l.links == 0),
            &["expect", "xgmi", "links"][..],
            "links",
        ),
        (
            e.rdma
                .as_ref()
                .is_some_and(|r| r.ports == 0 || r.rate <= 0.0),
            &["expect", "rdma"][..],
            "ports and rate",
        ),
        (
            e.scale_out.is_some_and(|s| s.gbps == 0),
            &["expect", "scale_out", "gbps"][..],
            "gbps",
        ),
    ] {
        if zero {
            errors.push(at(path, format!("{what} must be above 0")));
        }
    }
    for (family, path) in [
        (
            e.driver.as_ref().map(|d| &d.family),
            &["expect", "driver", "family"][..],
        ),
        (
            e.firmware.as_ref().and_then(|f| f.rdma.as_ref()),
            &["expect", "firmware", "rdma"][..],
        ),
        (
            e.firmware.as_ref().and_then(|f| f.vbios.as_ref()),
            &["expect", "firmware", "vbios"][..],
        ),
    ] {
        if family.is_some_and(|f| f.trim().is_empty()) {
            errors.push(at(
                path,
                "an empty family holds every version: name one (e.g. 550)".into(),
            ));
        }
    }
    if let Some(f) = &e.floors {
        if *f == Floors::default() {
            errors.push(at(
                &["expect", "floors"],
                "name busbw, pair_gbps, h2d_gbps or d2h_gbps".into(),
            ));
        }
        for (i, b) in f.busbw.iter().enumerate() {
            let bad = if !SWEPT_OPS.contains(&b.op.as_str()) {
                Some(format!("op `{}`: one of {}", b.op, SWEPT_OPS.join(", ")))
            } else if !(b.gbps.is_finite() && b.gbps > 0.0) {
                Some("gbps must be above 0".to_string())
            } else if b.backend.trim().is_empty() {
                Some("name the backend (tcp, nccl, oneccl)".to_string())
            } else if b.size.0 == 0 {
                Some("size must be above 0".to_string())
            } else {
                None
            };
            if let Some(m) = bad {
                errors.push(at_item(&["expect", "floors", "busbw"], i, m));
            }
        }
        for (name, value) in [
            ("pair_gbps", f.pair_gbps),
            ("h2d_gbps", f.h2d_gbps),
            ("d2h_gbps", f.d2h_gbps),
        ] {
            if value.is_some_and(|g| !(g.is_finite() && g > 0.0)) {
                errors.push(at(
                    &["expect", "floors", name],
                    format!("{name} must be above 0"),
                ));
            }
        }
    }
    if e.firmware
        .as_ref()
        .is_some_and(|f| *f == Firmware::default())
    {
        errors.push(at(
            &["expect", "firmware"],
            "name rdma, vbios or both".into(),
        ));
    }
    if raw.profile.trim().is_empty() {
        errors.push(at(&["profile"], "the profile needs a name".into()));
    }
    let vendor = match vendor {
        Ok(v) => v,
        Err(e) => {
            errors.push(e);
            return Err(errors);
        }
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Profile {
        name: raw.profile.trim().to_string(),
        description: raw.description.unwrap_or_default(),
        origin: origin.to_string(),
        matcher: Match {
            vendor,
            device_ids: ids,
            count: raw.matcher.count,
            dmi_product: raw.matcher.dmi_product,
            instance_type: raw.matcher.instance_type,
            virtual_machine: raw.matcher.virtual_machine,
        },
        expect: raw.expect,
    })
}

/// Reads a profile file (`check --profile`, `baseline diff`).
pub fn load(path: &Path) -> Result<Profile, Vec<ProfileError>> {
    let shown = path.display().to_string();
    let text = crate::read_bounded(path, 1024 * 1024)
        .map_err(|e| vec![unlocated(&shown, format!("cannot read the profile: {e}"))])?;
    parse(&shown, &text)
}

impl Profile {
    /// How well this profile fits the node: `None` when it does not
    /// apply; otherwise lower is better (0: the count matches exactly; a
    /// node with one accelerator fewer than the profile counts still gets
    /// it, and fails against it).
    pub fn fit(&self, node: &Inventory) -> Option<usize> {
        if self
            .matcher
            .virtual_machine
            .is_some_and(|vm| vm != node.virtual_machine)
        {
            return None;
        }
        if let Some(want) = &self.matcher.dmi_product {
            let have = node.dmi_product.as_deref().unwrap_or("");
            if !have
                .to_ascii_lowercase()
                .contains(&want.to_ascii_lowercase())
            {
                return None;
            }
        }
        if let Some(want) = &self.matcher.instance_type {
            // The metadata's word first: DMI's only where there is none.
            let have = node.instance_type.as_ref().or(node.dmi_product.as_ref());
            if !have.is_some_and(|h| h.trim().eq_ignore_ascii_case(want.trim())) {
                return None;
            }
        }
        let count = node
            .accelerators
            .iter()
            .filter(|a| {
                a.vendor == self.matcher.vendor && self.matcher.device_ids.contains(&a.device)
            })
            .count();
        // One fewer still fits (a GPU lost from the bus fails the profile
        // rather than losing it); a board of half the size does not.
        if count == 0 || count > self.matcher.count || count + 1 < self.matcher.count {
            return None;
        }
        Some(self.matcher.count - count)
    }

    /// `profile NAME` (a shipped one), `profile NAME (FILE)`, for
    /// messages.
    pub fn named(&self) -> String {
        if self.origin.starts_with("shipped:") {
            format!("profile {}", self.name)
        } else {
            format!("profile {} ({})", self.name, self.origin)
        }
    }
}

/// The profile that applies to the node: the one given (`--profile`)
/// outright (a node it does not fit fails it, each difference named),
/// else the best-fitting shipped one.
pub fn select(node: &Inventory, given: Option<&Given>) -> Option<Arc<Profile>> {
    let best = |candidates: &[Arc<Profile>]| {
        candidates
            .iter()
            .filter_map(|p| p.fit(node).map(|f| (f, p)))
            .min_by_key(|(f, _)| *f)
            .map(|(_, p)| Arc::clone(p))
    };
    match given {
        Some(Given::Outright(p)) => Some(Arc::clone(p)),
        Some(Given::Candidates(site)) => best(site).or_else(|| best(shipped())),
        None => best(shipped()),
    }
}

/// The profiles the operator gave: one file, held to outright, or a
/// directory of them, the one the node's facts match chosen (before the
/// shipped ones).
#[derive(Debug, Clone)]
pub enum Given {
    Outright(Arc<Profile>),
    Candidates(Vec<Arc<Profile>>),
}

/// `--profile PATH`: a file (applied outright) or a directory whose
/// `*.yaml` files are the site's profiles, in name order (where two fit a
/// node alike, the first by name applies); every error of every file,
/// located.
pub fn load_given(path: &Path) -> Result<Given, Vec<ProfileError>> {
    if !path.is_dir() {
        return load(path).map(|p| Given::Outright(Arc::new(p)));
    }
    let shown = path.display().to_string();
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(path)
        .map_err(|e| vec![unlocated(&shown, format!("cannot read the directory: {e}"))])?
        .filter_map(|e| e.ok().map(|e| e.path()))
        // A profile is a regular file named *.yaml; an editor's hidden
        // lock or backup file, a directory or a dangling link is not one.
        .filter(|p| {
            p.is_file()
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                && p.extension().is_some_and(|x| {
                    x.eq_ignore_ascii_case("yaml") || x.eq_ignore_ascii_case("yml")
                })
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(vec![unlocated(
            &shown,
            "no profile in the directory (*.yaml)".into(),
        )]);
    }
    let mut profiles = Vec::new();
    let mut errors = Vec::new();
    for f in &files {
        match load(f) {
            Ok(p) => profiles.push(Arc::new(p)),
            Err(mut e) => errors.append(&mut e),
        }
    }
    if errors.is_empty() {
        Ok(Given::Candidates(profiles))
    } else {
        Err(errors)
    }
}

/// What the node has that the profile does not expect, each difference
/// naming the device, port or count. `speed`: compare the PCIe links'
/// generation too (off where GPUs lower their link speed when idle).
/// NVLink, XGMI and the scale-out rate are the kinds' to judge
/// (`nvidia.nvlink`, `amd.xgmi`, `habana.nic_ports` read them from here).
pub fn diff(profile: &Profile, node: &Inventory, speed: bool) -> Vec<String> {
    inventory::diff(profile, node, speed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile's errors as the operator reads them.
    fn errors(text: &str) -> Vec<String> {
        parse("p.yaml", text)
            .unwrap_err()
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    /// A profile that says nothing of the accelerators in `expect` still
    /// holds the node to the count it matched on: a node one short gets
    /// the profile and fails it.
    #[test]
    fn the_count_matched_on_holds_without_an_expectation() {
        let p = parse(
            "floors.yaml",
            "profile: f\nmatch: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8}\nexpect:\n  floors: {pair_gbps: 40}\n",
        )
        .unwrap();
        let node = |n: usize| Inventory {
            accelerators: (0..n)
                .map(|i| inventory::Accelerator {
                    vendor: Vendor::Nvidia,
                    device: 0x2330,
                    address: format!("0000:{i:02x}:00.0"),
                    usable: true,
                    product: None,
                    current: (Some(32.0), Some(16)),
                    max: (Some(32.0), Some(16)),
                })
                .collect(),
            ..Inventory::default()
        };
        assert_eq!(p.fit(&node(7)), Some(1));
        assert_eq!(
            diff(&p, &node(7), true),
            vec!["7 NVIDIA accelerators of the profile's kind on the PCI bus, the profile has 8"]
        );
        assert!(diff(&p, &node(8), true).is_empty());
    }

    #[test]
    fn a_family_holds_its_versions_only() {
        for (v, f, yes) in [
            ("550.90.07", "550", true),
            ("550", "550", true),
            ("5501.2", "550", false),
            ("535.104.05", "550", false),
            ("28.39.1002", "28.39", true),
            ("28.391.2", "28.39", false),
            ("1.18.0-524", "1.18.0", true),
            ("550.90.07", "550.", true),
            ("96.00.99.00.0A", "96.00.99.00.0a", true),
        ] {
            assert_eq!(in_family(v, f), yes, "{v} in {f}");
        }
    }

    #[test]
    fn errors_name_their_place() {
        let bad = "profile: x\nmatch: {vendor: nvidea, device_ids: [\"0xZZ\"], count: 8}\nexpect:\n  pcie: {gen: 9, width: 16}\n  nvlnk: {links: 18}\n";
        let e = errors(bad);
        assert!(
            e.iter()
                .any(|e| e.starts_with("p.yaml:5:3") && e.contains("nvlnk")),
            "{e:?}"
        );
        let bad = "profile: x\nmatch: {vendor: nvidea, device_ids: [\"0xZZ\"], count: 8}\nexpect:\n  pcie: {gen: 9, width: 16}\n";
        let e = errors(bad);
        assert!(
            e.iter()
                .any(|e| e.starts_with("p.yaml:2:") && e.contains("`0xZZ`")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|e| e.contains("unknown vendor `nvidea`")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|e| e.starts_with("p.yaml:4:") && e.contains("generation 9")),
            "{e:?}"
        );
        let empty = errors(
            "profile: x\nmatch: {vendor: amd, device_ids: [\"0x74a1\", \"0xQQ\"], count: 8}\nexpect: {pcie: {gen: 5, width: 0}}\n",
        );
        assert!(
            empty
                .iter()
                .any(|e| e.starts_with("p.yaml:2:45:") && e.contains("`0xQQ`")),
            "{empty:?}"
        );
        assert!(
            empty.iter().any(|e| e.contains("width must be above 0")),
            "{empty:?}"
        );
        let nothing =
            errors("profile: x\nmatch: {vendor: amd, device_ids: [\"0x74a1\"], count: 8}\n");
        assert!(
            nothing[0].contains("the profile expects nothing"),
            "{nothing:?}"
        );
        let ok = parse(
            "p.yaml",
            "profile: x\nmatch: {vendor: amd, device_ids: [\"0x74a1\"], count: 8}\nexpect: {xgmi: {links: 7}}\n",
        )
        .unwrap();
        assert_eq!(ok.matcher.device_ids, vec![0x74a1]);
        assert_eq!(ok.expect.xgmi, Some(Links { links: 7 }));
    }

    fn node(count: usize, dmi: Option<&str>, vm: bool) -> Inventory {
        Inventory {
            host: "n".into(),
            accelerators: (0..count)
                .map(|i| inventory::Accelerator {
                    vendor: Vendor::Nvidia,
                    device: 0x2330,
                    address: format!("0000:{i:02x}:00.0"),
                    usable: true,
                    product: None,
                    current: (Some(32.0), Some(16)),
                    max: (Some(32.0), Some(16)),
                })
                .collect(),
            dmi_product: dmi.map(str::to_string),
            virtual_machine: vm,
            ..Inventory::default()
        }
    }

    /// The count fits exactly or from below (a node that lost a GPU still
    /// gets its profile, and fails it), never from above; a DMI product
    /// and bare metal are required where a profile says so.
    #[test]
    fn which_nodes_a_profile_fits() {
        let p = parse(
            "p",
            "profile: cloud-gpu8x-h100\nmatch: {vendor: nvidia, device_ids: [\"0x2330\"], count: 8, dmi_product: GPU8X.H100, virtual_machine: true}\nexpect: {nvlink: {links: 12}}\n",
        )
        .unwrap();
        assert_eq!(
            p.fit(&node(8, Some("ExampleCloud GPU8X.H100"), true)),
            Some(0)
        );
        assert_eq!(
            p.fit(&node(7, Some("ExampleCloud GPU8X.H100"), true)),
            Some(1)
        );
        assert_eq!(p.fit(&node(9, Some("ExampleCloud GPU8X.H100"), true)), None);
        assert_eq!(p.fit(&node(8, Some("ExampleCloud GPU8X.A100"), true)), None);
        assert_eq!(p.fit(&node(8, None, true)), None);
        assert_eq!(
            p.fit(&node(8, Some("ExampleCloud GPU8X.H100"), false)),
            None
        );
        // A 4-GPU board is not the 8-GPU one.
        assert_eq!(p.fit(&node(4, Some("ExampleCloud GPU8X.H100"), true)), None);
        // The shipped board profile is for bare metal only.
        assert_eq!(
            select(&node(8, None, false), None)
                .map(|p| p.name.clone())
                .as_deref(),
            Some("hgx-h100-8")
        );
        assert!(select(&node(8, None, true), None).is_none());
    }
}
