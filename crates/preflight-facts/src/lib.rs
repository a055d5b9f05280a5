//! Facts about this node that several checks need, gathered at most once per
//! run and only when a check asks for them.

pub mod accel;
pub mod amdgpu;
mod backend;
pub mod cgroup;
pub mod cuda;
pub mod fingerprint;
pub mod flight_recorder;
pub mod gpu_status;
pub mod guarded_file;
pub mod http;
pub mod infiniband;
mod interfaces;
pub mod kmsg;
pub mod launch;
pub mod limits;
pub mod meminfo;
pub mod nccl_ras;
pub mod nvidia;
pub mod nvml;
pub mod pci;
pub mod pod;
pub mod ports;
pub mod process_io;
pub mod procs;
pub mod profile;
pub mod py_spy;
pub mod resolve;
pub mod schedstat;
pub mod shared_library;
pub mod task;
pub mod tcp_sockets;
pub mod tcp_store;
pub mod torch_install;
pub mod visible;
pub mod xid;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

pub use accel::Accelerator;
pub use gpu_status::GpuReport;
pub use infiniband::Hca;
pub use interfaces::{Interface, interface_of};
pub use launch::{LAUNCHERS, Launch, Launcher, NNODES_VARS};
pub use pci::{PciDevice, Vendor};

pub use backend::Backend;

pub struct Facts {
    /// Where /sys, /proc, /dev and /etc are read from (`--root`).
    pub root: PathBuf,
    /// The environment the job's launcher gave this process.
    env: BTreeMap<String, String>,
    /// Collective backends the operator asked for (`--backends`).
    pub backends: Vec<Backend>,
    /// The init method the job passes to init_process_group
    /// (`--init-method`), to compare with MASTER_ADDR/MASTER_PORT.
    pub init_method: Option<String>,
    hostname: OnceLock<String>,
    pci: OnceLock<Vec<PciDevice>>,
    launch: OnceLock<Launch>,
    accelerators: OnceLock<Vec<Accelerator>>,
    hcas: OnceLock<Vec<Hca>>,
    processes: OnceLock<Vec<String>>,
    /// NVML or live nvidia-smi, asked once however many checks need it.
    live_gpus: tokio::sync::OnceCell<Result<GpuReport, String>>,
    interfaces: OnceLock<Vec<Interface>>,
    /// The profile the operator gave (`--profile`), over the shipped ones.
    given_profile: Option<profile::Given>,
    profile: OnceLock<Option<Arc<profile::Profile>>>,
    /// Which ports could be bound: one probe per port per run.
    pub ports: ports::PortProbes,
    /// When the run must end (the engine's deadline): a kind whose work
    /// has a budget (the memory test, DCGM) never plans past it.
    run_deadline: std::sync::Mutex<Option<std::time::Instant>>,
}

/// This process's environment, the variables that are text.
pub fn process_env() -> std::collections::BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// A recorded tool output, read whole unless it is larger than `max`
/// bytes (a wrong path to a huge file must not fill memory).
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(max + 1).read_to_string(&mut text)?;
    if text.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "larger than {max} bytes: not a recorded output"
        )));
    }
    Ok(text)
}

impl Facts {
    pub fn new(root: PathBuf, env: BTreeMap<String, String>, backends: Vec<Backend>) -> Facts {
        Facts {
            root,
            env,
            backends,
            init_method: None,
            hostname: OnceLock::new(),
            pci: OnceLock::new(),
            launch: OnceLock::new(),
            accelerators: OnceLock::new(),
            hcas: OnceLock::new(),
            processes: OnceLock::new(),
            live_gpus: tokio::sync::OnceCell::new(),
            interfaces: OnceLock::new(),
            given_profile: None,
            profile: OnceLock::new(),
            ports: ports::PortProbes::default(),
            run_deadline: std::sync::Mutex::new(None),
        }
    }

    /// The engine says when the run ends, before any check starts.
    pub fn set_run_deadline(&self, at: std::time::Instant) {
        *self.run_deadline.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
    }

    /// The time the run has left for a check's work, less `margin` to
    /// report in; `None` where no engine set a deadline (a kind's own
    /// tests).
    pub fn time_left(&self, margin: std::time::Duration) -> Option<std::time::Duration> {
        let at = (*self.run_deadline.lock().unwrap_or_else(|p| p.into_inner()))?;
        Some(
            at.saturating_duration_since(std::time::Instant::now())
                .saturating_sub(margin),
        )
    }

    pub fn with_init_method(mut self, init_method: Option<String>) -> Facts {
        self.init_method = init_method;
        self
    }

    /// The profile to hold this node to, whatever the shipped ones say,
    /// or the site's profiles to choose it from.
    pub fn with_profile(mut self, profile: Option<profile::Given>) -> Facts {
        self.given_profile = profile;
        self
    }

    /// The profile that applies to this node: the one given, else the
    /// shipped one its accelerators match; none where none does (the node
    /// is then compared with its peers only).
    pub fn profile(&self) -> Option<&Arc<profile::Profile>> {
        self.profile
            .get_or_init(|| {
                profile::select(&profile::Inventory::of(self), self.given_profile.as_ref())
            })
            .as_ref()
    }

    /// Facts about the real process: its environment, read once.
    pub fn from_process(root: PathBuf, backends: Vec<Backend>) -> Facts {
        Facts::new(root, process_env(), backends)
    }

    /// A user's name from the root's /etc/passwd, else the number.
    pub fn user_name(&self, uid: u32) -> String {
        std::fs::read_to_string(self.host_path("/etc/passwd"))
            .ok()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    let mut f = l.split(':');
                    let name = f.next()?;
                    (f.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_string())
                })
            })
            .unwrap_or_else(|| format!("uid {uid}"))
    }

    /// A path on the node, resolved under `--root`.
    pub fn host_path(&self, path: impl AsRef<Path>) -> PathBuf {
        let path = path.as_ref();
        match path.strip_prefix("/") {
            Ok(relative) => self.root.join(relative),
            Err(_) => self.root.join(path),
        }
    }

    /// Every variable of the job's environment, for the cluster stage's
    /// identity resolution and launch-variable fingerprint.
    pub fn env_vars(&self) -> &BTreeMap<String, String> {
        &self.env
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

    /// Whether this run reads the real machine rather than a fixture tree:
    /// only then may checks ask live sources (NVML, nvidia-smi, /dev/kmsg,
    /// this process's own limits).
    pub fn is_live(&self) -> bool {
        self.root == Path::new("/")
    }

    pub fn accelerators(&self) -> &[Accelerator] {
        self.accelerators.get_or_init(|| accel::scan(self))
    }

    /// Command names of the running processes (/proc/*/comm).
    pub fn processes(&self) -> &[String] {
        self.processes
            .get_or_init(|| procs::running(&self.host_path("/proc")))
    }

    /// Whether a kernel module is loaded: /sys/module/NAME, or a line of
    /// /proc/modules (fixture trees carry one or the other).
    pub fn module_loaded(&self, name: &str) -> bool {
        if self.host_path(format!("/sys/module/{name}")).is_dir() {
            return true;
        }
        std::fs::read_to_string(self.host_path("/proc/modules"))
            .is_ok_and(|t| t.lines().any(|l| l.split_whitespace().next() == Some(name)))
    }

    pub fn hcas(&self) -> &[Hca] {
        self.hcas
            .get_or_init(|| infiniband::scan(&self.host_path("/sys/class/infiniband")))
    }

    /// NVIDIA GPU health from NVML, else from running `nvidia-smi -q -x`;
    /// on the real machine only.
    pub async fn live_gpu_report(&self) -> &Result<GpuReport, String> {
        self.live_gpus
            .get_or_init(|| async {
                let nvml = tokio::task::spawn_blocking(nvml::report)
                    .await
                    .unwrap_or_else(|e| Err(format!("NVML crashed: {e}")));
                let nvml_error = match nvml {
                    Ok(report) => return Ok(report),
                    Err(e) => e,
                };
                match gpu_status::run_nvidia_smi(&["-q", "-x"]).await {
                    Ok(report) => Ok(report),
                    Err(e) => Err(format!("{nvml_error}; {e}")),
                }
            })
            .await
    }

    /// The GPU health report a check reads: a recorded `nvidia-smi -q -x`
    /// file when the checklist names one (relative to the working
    /// directory), else the live sources on the real machine, else none
    /// (a fixture tree without a recording).
    pub async fn gpu_report(&self, recorded: Option<&Path>) -> Option<Result<GpuReport, String>> {
        if let Some(path) = recorded {
            let path = path.to_path_buf();
            let read = tokio::task::spawn_blocking(move || {
                let shown = path.display().to_string();
                // A recording of several samples (`nvidia-smi -q -x -l 1`):
                // the state is the latest one's.
                std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read {shown}: {e}"))
                    .and_then(|text| gpu_status::parse_xml_samples(&shown, &text))
                    .and_then(|mut samples| {
                        samples.pop().ok_or_else(|| format!("{shown}: no document"))
                    })
            });
            return Some(
                read.await
                    .unwrap_or_else(|e| Err(format!("reading the recording crashed: {e}"))),
            );
        }
        if self.is_live() {
            return Some(self.live_gpu_report().await.clone());
        }
        None
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

    /// The kernel's ephemeral port range (net.ipv4.ip_local_port_range).
    pub fn ephemeral_ports(&self) -> Option<(u16, u16)> {
        let text =
            std::fs::read_to_string(self.host_path("/proc/sys/net/ipv4/ip_local_port_range"))
                .ok()?;
        let mut parts = text.split_whitespace().map(|p| p.parse::<u16>().ok());
        Some((parts.next()??, parts.next()??))
    }
}
