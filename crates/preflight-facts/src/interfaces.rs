//! Network interfaces: link state from sysfs (/sys/class/net under
//! `--root`, so fixture trees work) and IP addresses from the kernel
//! (getifaddrs). sysfs rather than an interface crate such as pnet: sysfs
//! gives the operational state and carrier (not just IFF_UP), the speed,
//! and the full hardware address (20 bytes on IPoIB, where pnet keeps 6).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

#[derive(Debug, Clone, Default)]
pub struct Interface {
    pub name: String,
    /// `up`, `down`, `dormant`, `lowerlayerdown`, or `unknown` (loopback and
    /// many virtual devices, which have no carrier notion).
    pub operstate: String,
    /// Link detected; `None` when the device does not say (it is down).
    pub carrier: Option<bool>,
    pub mtu: Option<u32>,
    /// Negotiated speed in Mbit/s; `None` for virtual links and down ports.
    pub speed_mbps: Option<u64>,
    /// `ether`, `infiniband`, `loopback`, or the ARPHRD number.
    pub link_type: String,
    /// Colon-separated, full length.
    pub hw_address: Option<String>,
    pub addresses: Vec<IpAddr>,
}

impl Interface {
    pub fn is_loopback(&self) -> bool {
        self.link_type == "loopback" || self.name == "lo"
    }

    /// Usable for traffic: operationally up (or `unknown`, which loopback
    /// and tunnels report while working) with no missing carrier.
    pub fn is_up(&self) -> bool {
        let state_ok = matches!(self.operstate.as_str(), "up" | "unknown");
        state_ok && self.carrier != Some(false)
    }

    /// One line for reports: `eth0 (up, carrier, mtu 1500, 25000 Mb/s)`.
    pub fn describe(&self) -> String {
        let mut parts = vec![self.operstate.clone()];
        match self.carrier {
            Some(true) => parts.push("carrier".into()),
            Some(false) => parts.push("no carrier".into()),
            None => {}
        }
        if let Some(mtu) = self.mtu {
            parts.push(format!("mtu {mtu}"));
        }
        if let Some(speed) = self.speed_mbps {
            parts.push(format!("{speed} Mb/s"));
        }
        if self.link_type == "infiniband"
            && let Some(hw) = &self.hw_address
        {
            parts.push(format!("IPoIB {hw}"));
        }
        format!("{} ({})", self.name, parts.join(", "))
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn link_type(arphrd: Option<&str>) -> String {
    match arphrd {
        Some("1") => "ether".into(),
        Some("32") => "infiniband".into(),
        Some("772") => "loopback".into(),
        Some(other) => other.to_string(),
        None => "unknown".into(),
    }
}

/// Reads one interface's directory under /sys/class/net.
fn from_sysfs(dir: &Path, name: &str) -> Interface {
    let attr = |a: &str| read_trimmed(&dir.join(a));
    Interface {
        name: name.to_string(),
        operstate: attr("operstate").unwrap_or_else(|| "unknown".into()),
        // Reading carrier of a down device fails with EINVAL: no answer.
        carrier: attr("carrier").and_then(|c| match c.as_str() {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        }),
        mtu: attr("mtu").and_then(|m| m.parse().ok()),
        // Virtual links report -1 (or fail to read) for speed.
        speed_mbps: attr("speed")
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|&s| s > 0)
            .map(|s| s as u64),
        link_type: link_type(attr("type").as_deref()),
        hw_address: attr("address").filter(|a| !a.is_empty()),
        addresses: Vec::new(),
    }
}

/// The interface that holds this address, if any.
pub fn interface_of(ip: IpAddr) -> Option<String> {
    kernel_addresses()
        .into_iter()
        .find(|(_, addrs)| addrs.contains(&ip))
        .map(|(name, _)| name)
}

/// The kernel's addresses per interface name. Empty when getifaddrs fails:
/// a check that needs addresses then says it found none.
fn kernel_addresses() -> BTreeMap<String, Vec<IpAddr>> {
    let mut map: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    let Ok(list) = nix::ifaddrs::getifaddrs() else {
        return map;
    };
    for entry in list {
        let Some(address) = entry.address else {
            map.entry(entry.interface_name).or_default();
            continue;
        };
        let ip = if let Some(v4) = address.as_sockaddr_in() {
            Some(IpAddr::V4(v4.ip()))
        } else {
            address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
        };
        let addresses = map.entry(entry.interface_name).or_default();
        if let Some(ip) = ip
            && !addresses.contains(&ip)
        {
            addresses.push(ip);
        }
    }
    map
}

/// Every interface, by name. `sysfs` is /sys/class/net under `--root`;
/// `real_root` says whether that is this machine's, in which case the
/// kernel's own list fills in addresses (and interfaces sysfs lacks, as in
/// some containers).
pub fn scan(sysfs: &Path, real_root: bool) -> Vec<Interface> {
    let mut by_name: BTreeMap<String, Interface> = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(sysfs) {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let dir = entry.path();
            if dir.join("operstate").exists() || dir.join("mtu").exists() {
                by_name.insert(name.clone(), from_sysfs(&dir, &name));
            }
        }
    }
    if real_root {
        for (name, addresses) in kernel_addresses() {
            let interface = by_name.entry(name.clone()).or_insert_with(|| Interface {
                name,
                operstate: "unknown".into(),
                link_type: "unknown".into(),
                ..Interface::default()
            });
            interface.addresses = addresses;
        }
    }
    by_name.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_fixture_tree_with_full_ipoib_address() {
        let dir = tempfile::tempdir().unwrap();
        let ib = dir.path().join("ib0");
        std::fs::create_dir_all(&ib).unwrap();
        let hw = "00:00:10:49:fe:80:00:00:00:00:00:00:50:6b:4b:03:00:c3:6a:2e";
        for (attr, value) in [
            ("operstate", "up\n"),
            ("carrier", "1\n"),
            ("mtu", "2044\n"),
            ("speed", "200000\n"),
            ("type", "32\n"),
            ("address", hw),
        ] {
            std::fs::write(ib.join(attr), value).unwrap();
        }
        let list = scan(dir.path(), false);
        assert_eq!(list.len(), 1);
        let i = &list[0];
        assert_eq!(i.link_type, "infiniband");
        assert_eq!(i.hw_address.as_deref(), Some(hw));
        assert!(i.is_up());
        assert_eq!(
            i.describe(),
            format!("ib0 (up, carrier, mtu 2044, 200000 Mb/s, IPoIB {hw})")
        );
    }

    #[test]
    fn the_real_loopback_has_its_address() {
        let list = scan(Path::new("/sys/class/net"), true);
        let lo = list.iter().find(|i| i.name == "lo").expect("lo exists");
        assert!(lo.is_loopback());
        assert!(lo.addresses.contains(&IpAddr::from([127, 0, 0, 1])));
    }
}
