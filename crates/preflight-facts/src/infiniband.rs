//! RDMA devices from /sys/class/infiniband: each HCA's ports with their
//! state, rate, link layer, GID table and error counters, as the kernel's
//! ib_core publishes them.

use std::collections::BTreeMap;
use std::path::Path;

use super::pci::link_name;

#[derive(Debug, Clone, Default)]
pub struct Port {
    pub number: u32,
    /// "ACTIVE", "DOWN", "INIT", ... (the name after "4: ").
    pub state: String,
    /// "LinkUp", "Polling", "Disabled", ...
    pub phys_state: String,
    /// Gb/s, from "400 Gb/sec (4X NDR)".
    pub rate: Option<f64>,
    pub rate_text: String,
    /// "InfiniBand" or "Ethernet" (RoCE).
    pub link_layer: String,
    pub counters: BTreeMap<String, u64>,
    /// The GID table: `None` for an unpopulated (all-zero) entry.
    pub gids: Vec<Option<String>>,
}

impl Port {
    pub fn is_active(&self) -> bool {
        self.state == "ACTIVE"
    }

    /// `RoCE` or `InfiniBand`, for messages.
    pub fn kind(&self) -> &'static str {
        if self.link_layer.eq_ignore_ascii_case("ethernet") {
            "RoCE"
        } else {
            "InfiniBand"
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Hca {
    pub name: String,
    /// Bus id of the PCI function behind it, when sysfs links one.
    pub pci: Option<String>,
    pub ports: Vec<Port>,
}

/// The state files say "4: ACTIVE"; the number is the IB spec's code.
fn state_name(text: &str) -> String {
    let text = text.trim();
    text.split_once(':')
        .map_or(text, |(_, name)| name.trim())
        .to_string()
}

pub fn parse_rate(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn read_port(dir: &Path, number: u32) -> Port {
    let rate_text = read(&dir.join("rate"));
    let mut counters = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(dir.join("counters")) {
        for e in entries.filter_map(Result::ok) {
            if let Ok(v) = read(&e.path()).parse::<u64>() {
                counters.insert(e.file_name().to_string_lossy().into_owned(), v);
            }
        }
    }
    let gid_dir = dir.join("gids");
    let gid_count = std::fs::read_dir(&gid_dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<usize>().ok())
                .max()
                .map_or(0, |n| n + 1)
        })
        .unwrap_or(0);
    let gids = (0..gid_count)
        .map(|i| {
            let gid = read(&gid_dir.join(i.to_string()));
            is_populated(&gid).then_some(gid)
        })
        .collect();
    Port {
        number,
        gids,
        state: state_name(&read(&dir.join("state"))),
        phys_state: state_name(&read(&dir.join("phys_state"))),
        rate: parse_rate(&rate_text),
        rate_text,
        link_layer: read(&dir.join("link_layer")),
        counters,
    }
}

/// Every HCA and port, sorted by name and number; empty without RDMA.
pub fn scan(class_dir: &Path) -> Vec<Hca> {
    let Ok(entries) = std::fs::read_dir(class_dir) else {
        return Vec::new();
    };
    let mut hcas: Vec<Hca> = entries
        .filter_map(Result::ok)
        .map(|e| {
            let path = e.path();
            let mut ports: Vec<Port> = std::fs::read_dir(path.join("ports"))
                .map(|rd| {
                    rd.filter_map(Result::ok)
                        .filter_map(|p| {
                            let n = p.file_name().to_str()?.parse().ok()?;
                            Some(read_port(&p.path(), n))
                        })
                        .collect()
                })
                .unwrap_or_default();
            ports.sort_by_key(|p| p.number);
            Hca {
                name: e.file_name().to_string_lossy().into_owned(),
                pci: link_name(&path.join("device")),
                ports,
            }
        })
        .collect();
    hcas.sort_by_key(|h| natural_key(&h.name));
    hcas
}

/// mlx5_2 before mlx5_10.
fn natural_key(name: &str) -> (String, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = name.split_at(name.len() - digits);
    (head.to_string(), tail.parse().unwrap_or(0))
}

/// An all-zero GID is an empty slot of the table.
fn is_populated(gid: &str) -> bool {
    !gid.is_empty() && gid.chars().any(|c| c.is_ascii_hexdigit() && c != '0')
}

/// The GID at an index and its type ("RoCE v2", "IB/RoCE v1"); `None` for
/// a GID slot that is absent or all zeros (unpopulated).
pub fn gid(class_dir: &Path, hca: &str, port: u32, index: u32) -> (Option<String>, Option<String>) {
    let dir = class_dir.join(hca).join("ports").join(port.to_string());
    let gid = read(&dir.join("gids").join(index.to_string()));
    let populated = is_populated(&gid);
    let ty = read(&dir.join("gid_attrs/types").join(index.to_string()));
    (populated.then_some(gid), (!ty.is_empty()).then_some(ty))
}

/// One element of NCCL_IB_HCA: an HCA name and optional port.
#[derive(Debug, Clone, PartialEq)]
pub struct HcaSpec {
    pub name: String,
    pub port: Option<u32>,
    /// The port as written, kept to report one that is not a number.
    pub port_text: Option<String>,
}

/// NCCL_IB_HCA as NCCL reads it: `^` excludes, `=` asks for exact names;
/// otherwise each name is a prefix (`mlx5` matches every mlx5_N, and
/// `mlx5_1` matches mlx5_10 too).
#[derive(Debug, Clone, PartialEq)]
pub struct HcaFilter {
    pub exclude: bool,
    pub exact: bool,
    pub specs: Vec<HcaSpec>,
}

impl HcaFilter {
    pub fn parse(value: &str) -> HcaFilter {
        let mut rest = value.trim();
        let exclude = rest.starts_with('^');
        rest = rest.trim_start_matches('^');
        let exact = rest.starts_with('=');
        rest = rest.trim_start_matches('=');
        let specs = rest
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s.split_once(':') {
                Some((name, port)) => HcaSpec {
                    name: name.to_string(),
                    port: port.parse().ok(),
                    port_text: Some(port.to_string()),
                },
                None => HcaSpec {
                    name: s.to_string(),
                    port: None,
                    port_text: None,
                },
            })
            .collect();
        HcaFilter {
            exclude,
            exact,
            specs,
        }
    }

    /// Whether a spec's name covers this HCA: exact, or as a prefix.
    pub fn names(&self, spec: &HcaSpec, hca: &str) -> bool {
        if self.exact {
            hca == spec.name
        } else {
            hca.starts_with(&spec.name)
        }
    }

    pub fn spec_matches(&self, spec: &HcaSpec, hca: &str, port: u32) -> bool {
        self.names(spec, hca) && spec.port.is_none_or(|p| p == port)
    }

    /// Whether NCCL would use this HCA port.
    pub fn selects(&self, hca: &str, port: u32) -> bool {
        let listed = self.specs.iter().any(|s| self.spec_matches(s, hca, port));
        listed != self.exclude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_ib_hca_forms() {
        let f = HcaFilter::parse("mlx5_0:1,mlx5_1");
        assert!(f.selects("mlx5_0", 1));
        assert!(!f.selects("mlx5_0", 2));
        assert!(f.selects("mlx5_10", 1), "prefix match, as NCCL does");
        assert!(!f.selects("mlx5_2", 1));
        let f = HcaFilter::parse("=mlx5_1");
        assert!(!f.selects("mlx5_10", 1));
        let f = HcaFilter::parse("^mlx5_3");
        assert!(!f.selects("mlx5_3", 1));
        assert!(f.selects("mlx5_4", 1));
    }

    #[test]
    fn states_and_rates() {
        assert_eq!(state_name("4: ACTIVE\n"), "ACTIVE");
        assert_eq!(state_name("2: Polling"), "Polling");
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)"), Some(400.0));
        assert_eq!(parse_rate("25 Gb/sec (1X EDR)"), Some(25.0));
        assert_eq!(natural_key("mlx5_10"), ("mlx5_".to_string(), 10));
    }
}
