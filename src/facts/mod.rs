//! Facts about this node that several checks need, gathered at most once per
//! run and only when a check asks for them.

mod infiniband;
mod interfaces;
mod launch;
mod pci;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use infiniband::Hca;
pub use interfaces::Interface;
pub use launch::Launch;
pub use pci::{PciDevice, Vendor};

use crate::checklist::when::Backend;

pub struct Facts {
    /// Where /sys, /proc, /dev and /etc are read from (`--root`).
    pub root: PathBuf,
    /// The environment the job's launcher gave this process.
    env: BTreeMap<String, String>,
    /// Collective backends the operator asked for (`--backends`).
    pub backends: Vec<Backend>,
    hostname: OnceLock<String>,
    pci: OnceLock<Vec<PciDevice>>,
    launch: OnceLock<Launch>,
    interfaces: OnceLock<Vec<Interface>>,
    hcas: OnceLock<Vec<Hca>>,
}

impl Facts {
    pub fn new(root: PathBuf, env: BTreeMap<String, String>, backends: Vec<Backend>) -> Facts {
        Facts {
            root,
            env,
            backends,
            hostname: OnceLock::new(),
            pci: OnceLock::new(),
            launch: OnceLock::new(),
            interfaces: OnceLock::new(),
            hcas: OnceLock::new(),
        }
    }

    /// Facts about the real process: its environment, read once.
    pub fn from_process(root: PathBuf, backends: Vec<Backend>) -> Facts {
        let env = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        Facts::new(root, env, backends)
    }

    /// A path on the node, resolved under `--root`.
    pub fn host_path(&self, path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref();
        match path.strip_prefix("/") {
            Ok(relative) => self.root.join(relative),
            Err(_) => self.root.join(path),
        }
    }

    pub fn env(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(String::as_str)
    }

    /// Names of the set variables, sorted.
    pub fn env_names(&self) -> impl Iterator<Item = &str> {
        self.env.keys().map(String::as_str)
    }

    /// The node's hostname: from /etc/hostname under a fixture root, else
    /// from the kernel.
    pub fn hostname(&self) -> &str {
        self.hostname.get_or_init(|| {
            let sources: &[&str] = if self.root == Path::new("/") {
                &["/proc/sys/kernel/hostname", "/etc/hostname"]
            } else {
                &["/etc/hostname", "/proc/sys/kernel/hostname"]
            };
            sources
                .iter()
                .filter_map(|p| std::fs::read_to_string(self.host_path(p)).ok())
                .map(|s| s.trim().to_string())
                .find(|s| !s.is_empty())
                .unwrap_or_else(|| "unknown".to_string())
        })
    }

    pub fn pci_devices(&self) -> &[PciDevice] {
        self.pci
            .get_or_init(|| pci::scan(&self.host_path("/sys/bus/pci/devices")))
    }

    /// Vendors of the accelerators present, each once, in a stable order.
    pub fn accelerator_vendors(&self) -> Vec<Vendor> {
        let mut vendors: Vec<Vendor> = self
            .pci_devices()
            .iter()
            .filter_map(PciDevice::accelerator_vendor)
            .collect();
        vendors.sort();
        vendors.dedup();
        vendors
    }

    pub fn launch(&self) -> &Launch {
        self.launch.get_or_init(|| Launch::from_env(&self.env))
    }

    /// Network interfaces, from sysfs under `--root` and, on the real root,
    /// the kernel's addresses.
    pub fn interfaces(&self) -> &[Interface] {
        self.interfaces.get_or_init(|| {
            interfaces::scan(
                &self.host_path("/sys/class/net"),
                self.root == Path::new("/"),
            )
        })
    }

    /// RDMA adapters from /sys/class/infiniband under `--root`.
    pub fn hcas(&self) -> &[Hca] {
        self.hcas
            .get_or_init(|| infiniband::scan(&self.host_path("/sys/class/infiniband")))
    }

    /// The kernel's ephemeral port range (net.ipv4.ip_local_port_range).
    pub fn ephemeral_ports(&self) -> Option<(u16, u16)> {
        let text =
            std::fs::read_to_string(self.host_path("/proc/sys/net/ipv4/ip_local_port_range"))
                .ok()?;
        let mut parts = text.split_whitespace().map(|p| p.parse::<u16>().ok());
        Some((parts.next()??, parts.next()??))
    }
}
