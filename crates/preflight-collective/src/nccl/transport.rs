//! The network NCCL chose, read back from its own INFO lines, and whether
//! a socket fallback on a node with active InfiniBand/RoCE ports deserves a
//! warning.
//!
//! NCCL says which network it took only in its log; there is no API for
//! it. The lines this reads, as NCCL 2.4 to 2.27 print them (the format
//! strings are in libnccl.so.2 itself: "NET/IB : Using%s %s; OOB %s:%s",
//! "%s : Using%s" with " [%d]%s:%s" per interface, "Using network %s",
//! "NET/IB : No device found.", "%s set by environment to %s",
//! "NCCL_IB_HCA set to %s"; the samples in the tests are from logs posted
//! in NVIDIA/nccl issues 226, 259, 676, 941, 952, 1053, 1126, 1925,
//! NVIDIA/nccl-tests 185, 188, 373 and ROCm/rccl 419):
//!
//! ```text
//! host:929:929 [2] NCCL INFO NET/IB : Using [0]mlx5_3:1/IB [1]mlx5_2:1/IB ; OOB ib0:11.5.5.50<0>
//! host:929:929 [2] NCCL INFO Using network IB
//! host:101542:101542 [0] NCCL INFO NET/IB : No device found.
//! host:101542:101542 [0] NCCL INFO NET/Socket : Using [0]eno1:172.18.40.41<0>
//! host:101542:101542 [0] NCCL INFO Using network Socket
//! ```
//!
//! "Using network X" (2.6 and later) is the choice; older versions print
//! only the `NET/… : Using` lines, IB's when IB was taken. A plugin's name
//! (IBext, IBext_v8, AWS Libfabric) stands for itself.

use preflight_facts::infiniband::{Hca, HcaFilter};

/// What NCCL's log says about its network.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetLog {
    /// From "Using network X".
    pub chosen: Option<String>,
    /// From "NET/IB : Using …": `mlx5_0:1/IB`, `mlx5_10:1/RoCE`.
    pub ib_devices: Option<Vec<String>>,
    /// The out-of-band interface of that line: `ib0:11.5.5.50`.
    pub ib_oob: Option<String>,
    /// From "NET/Socket : Using …": `eno1 (172.18.40.41)`.
    pub socket_interfaces: Option<Vec<String>>,
    /// Lines in which NCCL says why IB could not be used.
    pub ib_trouble: Vec<String>,
    /// NCCL_IB_DISABLE, NCCL_NET, NCCL_IB_HCA, NCCL_NET_PLUGIN as NCCL
    /// read them ("X set by environment to Y", "NCCL_IB_HCA set to Y").
    pub env: Vec<(String, String)>,
    /// Whether any NCCL INFO line was seen at all.
    pub any_info: bool,
}

/// The network as NCCL took it.
#[derive(Debug, Clone, PartialEq)]
pub enum Network {
    Ib,
    Socket,
    /// A net plugin (IBext, AWS Libfabric, …).
    Plugin(String),
}

const ENV_NAMES: [&str; 4] = [
    "NCCL_IB_DISABLE",
    "NCCL_NET",
    "NCCL_IB_HCA",
    "NCCL_NET_PLUGIN",
];

impl NetLog {
    pub fn parse(text: &str) -> NetLog {
        let mut log = NetLog::default();
        for line in text.lines() {
            let Some((level, msg)) = message(line) else {
                continue;
            };
            if level == "INFO" {
                log.any_info = true;
            }
            log.take(level, msg.trim());
        }
        log
    }

    fn take(&mut self, level: &str, msg: &str) {
        if let Some(name) = msg.strip_prefix("Using network ") {
            self.chosen = Some(name.trim().to_string());
        } else if let Some(rest) = msg.strip_prefix("NET/IB : Using") {
            let (devs, oob) = rest.split_once("; OOB ").unwrap_or((rest, ""));
            self.ib_devices = Some(ib_devices(devs));
            let oob = oob.trim().trim_end_matches("<0>");
            self.ib_oob = (!oob.is_empty()).then(|| oob.to_string());
        } else if let Some(rest) = msg.strip_prefix("NET/Socket : Using") {
            self.socket_interfaces = Some(socket_interfaces(rest));
        } else if let Some(v) = msg.strip_prefix("NCCL_IB_HCA set to ") {
            self.set_env("NCCL_IB_HCA", v);
        } else if let Some((name, v)) = msg.split_once(" set by environment to ") {
            if ENV_NAMES.contains(&name.trim()) {
                self.set_env(name.trim(), v.trim().trim_end_matches('.'));
            }
        } else if says_why_not_ib(level, msg) && !self.ib_trouble.iter().any(|t| t == msg) {
            self.ib_trouble.push(msg.to_string());
        }
    }

    fn set_env(&mut self, name: &str, value: &str) {
        let value = value.trim().to_string();
        match self.env.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => self.env.push((name.to_string(), value)),
        }
    }

    fn env_value(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The network NCCL took, when the log says.
    pub fn network(&self) -> Option<Network> {
        if let Some(name) = &self.chosen {
            return Some(match name.as_str() {
                "IB" => Network::Ib,
                "Socket" => Network::Socket,
                other => Network::Plugin(other.to_string()),
            });
        }
        // Before "Using network" existed, NCCL printed NET/IB's line only
        // when it took IB, and NET/Socket's whenever it initialised sockets.
        if self.ib_devices.is_some() {
            Some(Network::Ib)
        } else if self.socket_interfaces.is_some() {
            Some(Network::Socket)
        } else {
            None
        }
    }
}

/// `(level, message)` of an NCCL log line: "host:pid:tid [dev] NCCL INFO
/// msg", or "host:pid:tid [dev] file.cc:123 NCCL WARN msg".
fn message(line: &str) -> Option<(&str, &str)> {
    for level in ["INFO", "WARN"] {
        let tag = format!("NCCL {level} ");
        if let Some(at) = line.find(&tag) {
            return Some((level, &line[at + tag.len()..]));
        }
    }
    None
}

/// `[0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]`, or the merged form
/// `[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE}`: the `name:port/kind`s.
fn ib_devices(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, ',' | '{' | '}' | '='))
        .map(strip_index)
        .filter(|t| t.contains(':') && t.contains('/'))
        .map(str::to_string)
        .collect()
}

/// `[0]eno1:172.18.40.41<0> [1]veth0:fe80::1%veth0<0>` → `eno1 (172.18.40.41)`.
fn socket_interfaces(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(strip_index)
        .filter_map(|t| {
            let (name, addr) = t.split_once(':')?;
            let addr = addr.trim_end_matches("<0>");
            let addr = addr.split_once('%').map_or(addr, |(a, _)| a);
            Some(format!("{name} ({addr})"))
        })
        .collect()
}

fn strip_index(token: &str) -> &str {
    match token.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(token, |(_, t)| t),
        None => token,
    }
}

/// NCCL's own words for IB being unusable: its IB transport finding no
/// device or failing to open one, or libibverbs missing. ("Failed to open
/// mlx5dv symbols" only turns optional features off.)
fn says_why_not_ib(level: &str, msg: &str) -> bool {
    let ib = msg.starts_with("NET/IB") && !msg.contains("mlx5dv");
    (ib && [
        "No device found",
        "No IP interface found",
        "Unable to",
        "Failed",
        "incompatible",
    ]
    .iter()
    .any(|w| msg.contains(w)))
        || (msg.contains("libibverbs") && (level == "WARN" || msg.contains("Failed")))
}

/// An active RDMA port on this node, as /sys/class/infiniband shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivePort {
    pub hca: String,
    pub port: u32,
    /// "InfiniBand" or "RoCE".
    pub kind: &'static str,
}

pub fn active_ports(hcas: &[Hca]) -> Vec<ActivePort> {
    hcas.iter()
        .flat_map(|h| {
            h.ports
                .iter()
                .filter(|p| p.is_active())
                .map(|p| ActivePort {
                    hca: h.name.clone(),
                    port: p.number,
                    kind: p.kind(),
                })
        })
        .collect()
}

/// Where the INFO lines came from, for the words of a note.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Read from this file.
    File(String),
    /// The job set NCCL_DEBUG to something below INFO.
    Quiet(String),
    /// The job set NCCL_DEBUG=INFO without NCCL_DEBUG_FILE: the lines went
    /// to stdout, which is the backend's log.
    Stdout,
}

/// A note for the report: `(warning, text)`.
pub type Note = (bool, String);

/// What to say about the network: which one NCCL took, and a warning when
/// it took sockets although the node has active RDMA ports. `env` is the
/// job's environment, for the reasons NCCL's log leaves out.
pub fn assess(
    log: &NetLog,
    source: &Source,
    ports: &[ActivePort],
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<Note> {
    let network = log.network();
    let Some(network) = network else {
        let why = match source {
            Source::Quiet(level) => format!(
                "NCCL_DEBUG={level} (set by the job) keeps NCCL's INFO lines off, so the network \
                 it chose is not known"
            ),
            Source::Stdout => "NCCL_DEBUG set by the job without NCCL_DEBUG_FILE sends NCCL's \
                 INFO lines to the backend's log, so the network it chose was not checked"
                .to_string(),
            Source::File(path) => {
                let subsys = env("NCCL_DEBUG_SUBSYS")
                    .map(|s| format!(" (NCCL_DEBUG_SUBSYS={s})"))
                    .unwrap_or_default();
                format!("NCCL did not say which network it chose: no NET line in {path}{subsys}")
            }
        };
        return vec![(false, why)];
    };
    let mut notes = vec![(false, chosen_words(log, &network))];
    if network == Network::Socket && !ports.is_empty() {
        let listed: Vec<String> = ports
            .iter()
            .map(|p| format!("{}:{} {}", p.hca, p.port, p.kind))
            .collect();
        notes.push((
            true,
            format!(
                "NCCL fell back to sockets although this node has active RDMA ports ({}): {}",
                listed.join(", "),
                why_not_ib(log, ports, env)
            ),
        ));
    }
    notes
}

fn chosen_words(log: &NetLog, network: &Network) -> String {
    let ib = || {
        let devs = log.ib_devices.as_deref().unwrap_or_default();
        let mut s = if devs.is_empty() {
            String::new()
        } else {
            format!(" over {}", devs.join(", "))
        };
        if let Some(oob) = &log.ib_oob {
            s.push_str(&format!(" (OOB {oob})"));
        }
        s
    };
    match network {
        Network::Ib => format!("NCCL uses NET/IB{} between nodes", ib()),
        Network::Socket => {
            let ifs = log.socket_interfaces.as_deref().unwrap_or_default();
            if ifs.is_empty() {
                "NCCL uses NET/Socket between nodes".to_string()
            } else {
                format!("NCCL uses NET/Socket over {} between nodes", ifs.join(", "))
            }
        }
        Network::Plugin(name) => format!("NCCL uses the net plugin {name}{} between nodes", ib()),
    }
}

/// NCCL's reason first, then what the environment shows.
fn why_not_ib(log: &NetLog, ports: &[ActivePort], env: &dyn Fn(&str) -> Option<String>) -> String {
    let var = |name: &str| {
        log.env_value(name)
            .map(str::to_string)
            .or_else(|| env(name))
    };
    let mut why: Vec<String> = Vec::new();
    if let Some(v) = var("NCCL_IB_DISABLE").filter(|v| v.trim() != "0" && !v.trim().is_empty()) {
        why.push(format!("NCCL_IB_DISABLE={v} turns IB off"));
    }
    if let Some(v) = var("NCCL_NET").filter(|v| !v.trim().eq_ignore_ascii_case("IB")) {
        why.push(format!("NCCL_NET={v} asks for that network"));
    }
    if let Some(v) = var("NCCL_IB_HCA") {
        let filter = HcaFilter::parse(&v);
        if !ports.iter().any(|p| filter.selects(&p.hca, p.port)) {
            why.push(format!("NCCL_IB_HCA={v} selects none of the active ports"));
        }
    }
    for t in &log.ib_trouble {
        why.push(format!("NCCL says \"{t}\""));
    }
    if why.is_empty() {
        "NCCL did not say why IB was not used".to_string()
    } else {
        why.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(hca: &str, n: u32) -> ActivePort {
        ActivePort {
            hca: hca.into(),
            port: n,
            kind: "InfiniBand",
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn file() -> Source {
        Source::File("/tmp/x/nccl.h.1.log".into())
    }

    // ROCm/rccl#419: four HCAs, the old form without "Using network".
    const IB_OLD: &str = "\
e05r3n09:929:929 [2] NCCL INFO Bootstrap : Using ib0:11.5.5.50<0>
e05r3n09:929:929 [2] NCCL INFO NET/Plugin : No plugin found (librccl-net.so), using internal implementation
e05r3n09:929:929 [2] NCCL INFO NET/IB : Using [0]mlx5_3:1/IB [1]mlx5_2:1/IB [2]mlx5_1:1/IB [3]mlx5_0:1/IB ; OOB ib0:11.5.5.50<0>
e05r3n09:929:929 [2] NCCL INFO Using network IB
";

    // NVIDIA/nccl-tests#185 (2.19.3): RoCE with relaxed ordering.
    const ROCE: &str = "\
dgxh100-4:460770:460770 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation
dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:11.1.128.136<0>
dgxh100-4:460770:460842 [0] NCCL INFO Using non-device net plugin version 0
dgxh100-4:460770:460842 [0] NCCL INFO Using network IB
";

    // NVIDIA/nccl#1126 (2.10.3): no HCA, sockets over loopback.
    const NO_DEVICE: &str = "\
zkti:702444:702444 [0] NCCL INFO Bootstrap : Using lo:127.0.0.1<0>
zkti:702444:702444 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
zkti:702444:702444 [0] NCCL INFO NET/IB : No device found.
zkti:702444:702444 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>
zkti:702444:702444 [0] NCCL INFO Using network Socket
";

    // NVIDIA/nccl-tests#188: NCCL_IB_DISABLE=1 on an IB node.
    const DISABLED: &str = "\
user:852750:852802 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
user:852750:852802 [0] NCCL INFO NET/Socket : Using [0]ibs85f0:192.168.1.14<0> [1]ib0:192.168.1.15<0>
user:852750:852802 [0] NCCL INFO Using network Socket
";

    #[test]
    fn ib_with_hcas_and_oob() {
        let log = NetLog::parse(IB_OLD);
        assert_eq!(log.network(), Some(Network::Ib));
        assert_eq!(
            log.ib_devices.as_deref().unwrap(),
            ["mlx5_3:1/IB", "mlx5_2:1/IB", "mlx5_1:1/IB", "mlx5_0:1/IB"]
        );
        assert_eq!(log.ib_oob.as_deref(), Some("ib0:11.5.5.50"));
        let notes = assess(&log, &file(), &[port("mlx5_0", 1)], &no_env);
        assert_eq!(
            notes,
            vec![(
                false,
                "NCCL uses NET/IB over mlx5_3:1/IB, mlx5_2:1/IB, mlx5_1:1/IB, mlx5_0:1/IB \
                 (OOB ib0:11.5.5.50) between nodes"
                    .to_string()
            )]
        );
    }

    #[test]
    fn roce_and_relaxed_ordering_tag() {
        let log = NetLog::parse(ROCE);
        assert_eq!(
            log.ib_devices.as_deref().unwrap(),
            ["mlx5_10:1/RoCE", "mlx5_11:1/RoCE"]
        );
        assert_eq!(log.ib_oob.as_deref(), Some("enp220s0np0:11.1.128.136"));
        assert!(log.ib_trouble.is_empty(), "{:?}", log.ib_trouble);
    }

    #[test]
    fn merged_nics_form() {
        // NVIDIA/nccl-tests#373 (IBext_v8 plugin, NIC fusion).
        let text = "bigo:1884:2298 [0] NCCL INFO NET/IB : Using [0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE} [1]={[2] mlx5_0:1/RoCE, [3] mlx5_1:1/RoCE} [RO]; OOB bond0.526:169.136.106.9<0>
bigo:1884:2298 [0] NCCL INFO Using network IBext_v8
";
        let log = NetLog::parse(text);
        assert_eq!(
            log.ib_devices.as_deref().unwrap(),
            [
                "mlx5_2:1/RoCE",
                "mlx5_3:1/RoCE",
                "mlx5_0:1/RoCE",
                "mlx5_1:1/RoCE"
            ]
        );
        assert_eq!(log.network(), Some(Network::Plugin("IBext_v8".into())));
        let notes = assess(&log, &file(), &[port("mlx5_0", 1)], &no_env);
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0]
                .1
                .starts_with("NCCL uses the net plugin IBext_v8 over mlx5_2:1/RoCE")
        );
    }

    #[test]
    fn socket_without_rdma_ports_is_no_warning() {
        let log = NetLog::parse(NO_DEVICE);
        assert_eq!(log.network(), Some(Network::Socket));
        assert_eq!(
            log.socket_interfaces.as_deref().unwrap(),
            ["lo (127.0.0.1)"]
        );
        let notes = assess(&log, &file(), &[], &no_env);
        assert_eq!(
            notes,
            vec![(
                false,
                "NCCL uses NET/Socket over lo (127.0.0.1) between nodes".to_string()
            )]
        );
    }

    #[test]
    fn socket_fallback_with_active_ports_warns_with_nccls_reason() {
        let log = NetLog::parse(NO_DEVICE);
        assert_eq!(log.ib_trouble, ["NET/IB : No device found."]);
        let notes = assess(&log, &file(), &[port("mlx5_0", 1)], &no_env);
        assert_eq!(notes.len(), 2);
        assert_eq!(
            notes[1],
            (
                true,
                "NCCL fell back to sockets although this node has active RDMA ports \
                 (mlx5_0:1 InfiniBand): NCCL says \"NET/IB : No device found.\""
                    .to_string()
            )
        );
    }

    #[test]
    fn ib_disable_from_the_log() {
        let log = NetLog::parse(DISABLED);
        assert_eq!(log.env, [("NCCL_IB_DISABLE".into(), "1".into())]);
        assert_eq!(
            log.socket_interfaces.as_deref().unwrap(),
            ["ibs85f0 (192.168.1.14)", "ib0 (192.168.1.15)"]
        );
        let notes = assess(&log, &file(), &[port("mlx5_0", 1)], &no_env);
        assert!(notes[1].0);
        assert!(
            notes[1].1.ends_with(": NCCL_IB_DISABLE=1 turns IB off"),
            "{}",
            notes[1].1
        );
    }

    #[test]
    fn ib_disable_set_to_zero_is_no_reason() {
        // NVIDIA/nccl#1925: IB left on explicitly.
        let text = "n:2620971:2620971 [3] NCCL INFO NCCL_IB_DISABLE set by environment to 0.
n:2620971:2620971 [3] NCCL INFO NCCL_IB_HCA set to mlx5_0
n:2620971:2620971 [3] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB eth0:172.25.30.42<0>
n:2620971:2620971 [3] NCCL INFO Initialized NET plugin IB
n:2620971:2620971 [3] NCCL INFO Assigned NET plugin IB to comm
n:2620971:2620971 [3] NCCL INFO Using network IB
";
        let log = NetLog::parse(text);
        assert_eq!(log.network(), Some(Network::Ib));
        assert_eq!(log.env_value("NCCL_IB_HCA"), Some("mlx5_0"));
        assert_eq!(log.ib_devices.as_deref().unwrap(), ["mlx5_0:1/IB"]);
    }

    #[test]
    fn hca_filter_that_selects_nothing_is_named() {
        // NCCL prints "No device found." after NCCL_IB_HCA filtered every
        // HCA out; the filter is the reason worth reading.
        let text = "h:1:1 [0] NCCL INFO NCCL_IB_HCA set to mlx5_9
h:1:2 [0] NCCL INFO NET/IB : No device found.
h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>
h:1:2 [0] NCCL INFO Using network Socket
";
        let log = NetLog::parse(text);
        let notes = assess(
            &log,
            &file(),
            &[port("mlx5_0", 1), port("mlx5_1", 1)],
            &no_env,
        );
        assert_eq!(
            notes[1].1,
            "NCCL fell back to sockets although this node has active RDMA ports \
             (mlx5_0:1 InfiniBand, mlx5_1:1 InfiniBand): NCCL_IB_HCA=mlx5_9 selects none of \
             the active ports; NCCL says \"NET/IB : No device found.\""
        );
        // A filter that keeps an active port is not the reason.
        let kept = NetLog::parse(&text.replace("mlx5_9", "mlx5_1"));
        let notes = assess(&kept, &file(), &[port("mlx5_1", 1)], &no_env);
        assert!(!notes[1].1.contains("selects none"), "{}", notes[1].1);
    }

    #[test]
    fn nccl_net_socket_from_the_environment() {
        let text = "h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>
h:1:2 [0] NCCL INFO Using network Socket
";
        let log = NetLog::parse(text);
        let env = |k: &str| (k == "NCCL_NET").then(|| "Socket".to_string());
        let notes = assess(&log, &file(), &[port("mlx5_0", 1)], &env);
        assert!(
            notes[1]
                .1
                .ends_with(": NCCL_NET=Socket asks for that network")
        );
        let notes = assess(&log, &file(), &[port("mlx5_0", 1)], &no_env);
        assert!(
            notes[1]
                .1
                .ends_with(": NCCL did not say why IB was not used")
        );
    }

    #[test]
    fn missing_libibverbs_is_a_reason() {
        // NVIDIA/nccl#259 (2.4.8): a WARN line from misc/ibvwrap.cc, and
        // the socket line without "Using network".
        let text =
            "h0913n-ubuntu:12877:12877 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).

h0913n-ubuntu:12877:12877 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
h0913n-ubuntu:12877:12877 [0] NCCL INFO NET/Socket : Using [0]enp0s31f6:192.168.97.149<0>
";
        let log = NetLog::parse(text);
        assert_eq!(log.network(), Some(Network::Socket));
        assert_eq!(log.ib_trouble, ["Failed to open libibverbs.so[.1]"]);
    }

    #[test]
    fn old_logs_print_socket_first_then_ib() {
        // Mellanox/nv_peer_memory#56 (2.4.7): NET/Socket's line came before
        // NET/IB's, and IB was taken.
        let text = "master_node:20:289 [0] NCCL INFO NET/Socket : Using [0]ib0:192.168.11.1<0>
master_node:20:289 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).
master_node:20:289 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 0.
master_node:20:289 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>
";
        assert_eq!(NetLog::parse(text).network(), Some(Network::Ib));
    }

    #[test]
    fn silence_is_said_in_words() {
        let log = NetLog::parse("NCCL version 2.21.5+cuda12.4\n");
        assert!(!log.any_info);
        let quiet = assess(&log, &Source::Quiet("WARN".into()), &[], &no_env);
        assert_eq!(quiet.len(), 1);
        assert!(!quiet[0].0);
        assert!(quiet[0].1.starts_with("NCCL_DEBUG=WARN (set by the job)"));
        let env = |k: &str| (k == "NCCL_DEBUG_SUBSYS").then(|| "COLL".to_string());
        let silent = assess(&log, &file(), &[], &env);
        assert!(
            silent[0].1.ends_with("(NCCL_DEBUG_SUBSYS=COLL)"),
            "{}",
            silent[0].1
        );
        let stdout = assess(&log, &Source::Stdout, &[port("mlx5_0", 1)], &no_env);
        assert!(stdout[0].1.contains("backend's log"));
    }

    #[test]
    fn active_ports_come_from_the_sysfs_scan() {
        use preflight_facts::infiniband::Port;
        let hcas = vec![
            Hca {
                name: "mlx5_0".into(),
                pci: None,
                ports: vec![Port {
                    number: 1,
                    state: "ACTIVE".into(),
                    link_layer: "InfiniBand".into(),
                    ..Port::default()
                }],
            },
            Hca {
                name: "mlx5_1".into(),
                pci: None,
                ports: vec![Port {
                    number: 1,
                    state: "DOWN".into(),
                    link_layer: "Ethernet".into(),
                    ..Port::default()
                }],
            },
        ];
        assert_eq!(active_ports(&hcas), vec![port("mlx5_0", 1)]);
    }
}
