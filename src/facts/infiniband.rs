//! RDMA adapters (HCAs) and their ports from /sys/class/infiniband, for the
//! checks that validate NCCL_IB_* settings against the hardware.

use std::path::Path;

#[derive(Debug, Clone)]
pub struct IbPort {
    pub number: u32,
    /// The state's name: ACTIVE, DOWN, INIT, ARMED.
    pub state: String,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: String,
    /// The GID table: `None` for an unpopulated (all-zero) entry.
    pub gids: Vec<Option<String>>,
}

impl IbPort {
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

#[derive(Debug, Clone)]
pub struct Hca {
    pub name: String,
    pub ports: Vec<IbPort>,
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn numbered_entries(dir: &Path) -> Vec<u32> {
    let mut numbers: Vec<u32> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    numbers.sort_unstable();
    numbers
}

fn port(dir: &Path, number: u32) -> IbPort {
    // `state` reads "4: ACTIVE"; keep the name.
    let state = read_trimmed(&dir.join("state"))
        .map(|s| s.rsplit(':').next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|| "UNKNOWN".into());
    let gid_dir = dir.join("gids");
    let count = numbered_entries(&gid_dir)
        .last()
        .map_or(0, |&n| n as usize + 1);
    let gids = (0..count)
        .map(|i| {
            read_trimmed(&gid_dir.join(i.to_string()))
                .filter(|g| g.chars().any(|c| c != '0' && c != ':'))
        })
        .collect();
    IbPort {
        number,
        state,
        link_layer: read_trimmed(&dir.join("link_layer")).unwrap_or_default(),
        gids,
    }
}

/// Every HCA under `dir` (/sys/class/infiniband under `--root`); none when
/// the directory is missing, as on nodes without RDMA.
pub fn scan(dir: &Path) -> Vec<Hca> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut hcas: Vec<Hca> = entries
        .filter_map(Result::ok)
        .map(|entry| {
            let path = entry.path();
            let ports_dir = path.join("ports");
            Hca {
                name: entry.file_name().to_string_lossy().into_owned(),
                ports: numbered_entries(&ports_dir)
                    .into_iter()
                    .map(|n| port(&ports_dir.join(n.to_string()), n))
                    .collect(),
            }
        })
        .collect();
    hcas.sort_by(|a, b| a.name.cmp(&b.name));
    hcas
}
