//! What each rank tells the master about itself: identity, versions,
//! launch variables, devices, clock, its checklist's outcome, and where its
//! peers can reach it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::identity::Identity;
use preflight_facts::{Facts, nvidia};
use preflight_kinds::cluster::LAUNCH_PREFIXES;
use preflight_result::cluster::{Clock, Devices, FailedCheck};
use preflight_result::{CheckResult, Status};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckIn {
    pub identity: Identity,
    pub hostname: String,
    /// The address this rank reaches the master from: the one peers use.
    pub addr: String,
    pub pid: u32,
    pub tool_version: String,
    pub checklist_hash: String,
    /// This rank's own checklist verdict: ready, not_ready, incomplete.
    pub local_verdict: String,
    pub failed: Vec<FailedCheck>,
    pub versions: BTreeMap<String, String>,
    /// Launch variables (LAUNCH_PREFIXES), secrets redacted.
    pub env: BTreeMap<String, String>,
    pub devices: Devices,
    pub clock: Option<Clock>,
    /// What this node's hostname resolves to here (getaddrinfo).
    pub hostname_addrs: Vec<String>,
    /// Where the reachability probes of peers should connect.
    pub probe_addr: Option<String>,
    /// Why there is no probe listener (the probe port range exhausted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_error: Option<String>,
    /// The interface that holds `addr`.
    pub interface: Option<String>,
    /// The address rank 0 saw the connection come from: set by rank 0,
    /// never taken from the peer.
    #[serde(skip)]
    pub seen_from: Option<String>,
}

/// What one check-in may carry, far above an honest node's and small
/// enough that the verdict of a large world stays deliverable: a peer with
/// the token still cannot make rank 0 hold or send megabytes per rank.
const NAME: usize = 256;
const TEXT: usize = 512;
const ITEMS: usize = 64;
const KIND: usize = 32;
/// What the failed checks are about (`About`), all together: an honest
/// one names a variable, a pid or a host name or two, and few fail.
const ABOUT: usize = 32;
const ABOUT_NAME: usize = 64;
/// Node names in a nodelist: the largest worlds this tool is built for.
const NODES: usize = 100_000;

/// Cuts `text` to at most `max` bytes on a character boundary, marked.
pub(super) fn cut(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let dropped = text.len() - end;
        text.truncate(end);
        text.push_str(&format!("... ({dropped} more bytes)"));
    }
}

fn cut_map(map: &mut BTreeMap<String, String>) {
    let extra = map.len().saturating_sub(ITEMS);
    let mut kept: BTreeMap<String, String> = std::mem::take(map)
        .into_iter()
        .take(ITEMS)
        .map(|(mut k, mut v)| {
            cut(&mut k, NAME);
            cut(&mut v, TEXT);
            (k, v)
        })
        .collect();
    if extra > 0 {
        kept.insert("...".into(), format!("{extra} more not listed"));
    }
    *map = kept;
}

fn cut_list(list: &mut Vec<String>, items: usize) {
    list.truncate(items);
    for item in list.iter_mut() {
        cut(item, NAME);
    }
}

impl CheckIn {
    /// The check-in as rank 0 keeps it: every field a peer controls cut to
    /// its limit, and each cut says so.
    pub fn bounded(mut self) -> CheckIn {
        for text in [
            &mut self.hostname,
            &mut self.addr,
            &mut self.tool_version,
            &mut self.checklist_hash,
            &mut self.local_verdict,
            &mut self.identity.master_addr,
            &mut self.identity.source,
        ] {
            cut(text, NAME);
        }
        if let Some(id) = &mut self.identity.job_id {
            cut(id, NAME);
        }
        for text in [&mut self.probe_addr, &mut self.interface]
            .into_iter()
            .flatten()
        {
            cut(text, NAME);
        }
        if let Some(e) = &mut self.probe_error {
            cut(e, TEXT);
        }
        let extra = self.failed.len().saturating_sub(ITEMS);
        self.failed.truncate(ITEMS);
        let mut about_left = ABOUT;
        for f in &mut self.failed {
            cut(&mut f.id, NAME);
            cut(&mut f.area, NAME);
            // A kind's name is a short word; what is longer is a peer's.
            cut(&mut f.kind, KIND);
            cut(&mut f.message, TEXT);
            if let Some(h) = &mut f.hint {
                cut(h, TEXT);
            }
            let about = &mut f.about;
            about.holders.truncate(about_left);
            about_left -= about.holders.len();
            for list in [
                &mut about.variables,
                &mut about.restates,
                &mut about.loopback_hostnames,
            ] {
                list.truncate(about_left);
                about_left -= list.len();
                for item in list.iter_mut() {
                    cut(item, ABOUT_NAME);
                }
            }
        }
        if extra > 0 {
            self.failed.push(FailedCheck {
                id: "...".into(),
                status: Status::Fail,
                message: format!("{extra} more failed checks not listed"),
                hint: None,
                area: String::new(),
                kind: String::new(),
                about: Default::default(),
            });
        }
        cut_map(&mut self.versions);
        cut_map(&mut self.env);
        cut_list(&mut self.devices.models, ITEMS);
        cut_list(&mut self.hostname_addrs, ITEMS);
        cut_list(&mut self.identity.nodelist, NODES);
        self.identity.tasks_per_node.truncate(NODES);
        self
    }
}

pub fn failed_checks(results: &[CheckResult]) -> Vec<FailedCheck> {
    results
        .iter()
        .filter(|r| matches!(r.status, Status::Fail | Status::Warn | Status::Error))
        .map(|r| FailedCheck {
            id: r.id.clone(),
            status: r.status,
            message: r.message.clone(),
            hint: r.hint.clone(),
            area: r.area.clone(),
            kind: r.kind.clone(),
            about: r.about.clone(),
        })
        .collect()
}

/// Variables that legitimately differ between ranks or nodes: a rank's own
/// index, its devices, and the launcher's internal per-process runtime
/// (OpenMPI's ess/orte/pmix settings carry vpids, daemon URIs and session
/// directories). Comparing them across nodes would only be noise.
pub fn per_process(name: &str) -> bool {
    const LAUNCHER_INTERNAL: &[&str] = &[
        "OMPI_MCA_ess",
        "OMPI_MCA_orte_",
        "OMPI_MCA_pmix",
        "OMPI_MCA_initial_wdir",
        "OMPI_MCA_shmem_",
    ];
    name.ends_with("_VISIBLE_DEVICES")
        || name.ends_with("RANK")
        || name.contains("_VPID")
        || LAUNCHER_INTERNAL.iter().any(|p| name.starts_with(p))
}

pub fn launch_env(facts: &Facts, names: impl Iterator<Item = String>) -> BTreeMap<String, String> {
    names
        .filter(|n| LAUNCH_PREFIXES.iter().any(|p| n.starts_with(p)))
        .filter(|n| !per_process(n))
        .filter_map(|n| {
            let v = facts.env(&n)?.to_string();
            Some((n.clone(), preflight_kinds::redact(&n, &v)))
        })
        .collect()
}

pub fn devices(facts: &Facts) -> Devices {
    let accels = facts.accelerators();
    Devices {
        count: accels.len(),
        models: accels
            .iter()
            .map(|a| {
                a.model
                    .clone()
                    .unwrap_or_else(|| a.vendor.name().to_string())
            })
            .collect(),
    }
}

/// Versions as far as the node's files tell, without loading any library:
/// kernel, accelerator driver, CUDA, NCCL, oneCCL, libc. A missing one is
/// "not found" so that "installed on some nodes only" is a difference.
pub fn versions(facts: &Facts) -> BTreeMap<String, String> {
    let mut v = BTreeMap::new();
    let read = |p: &str| std::fs::read_to_string(facts.host_path(p)).ok();
    let kernel = read("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string());
    v.insert("kernel".into(), kernel.unwrap_or_else(not_found));
    let driver = nvidia::kernel_version(
        read(nvidia::PROC_VERSION).and_then(|t| nvidia::proc_version(&t)),
        read(nvidia::MODULE_VERSION).map(|s| s.trim().to_string()),
    )
    .or_else(|| read("/sys/module/amdgpu/version").map(|s| format!("amdgpu {}", s.trim())));
    v.insert("driver".into(), driver.unwrap_or_else(not_found));
    // CUDA's runtime, and each library backend's library (facts::Backend).
    let backends: Vec<(&str, &str)> = preflight_facts::Backend::ALL
        .into_iter()
        .filter_map(|b| Some((b.name(), b.library_prefix()?)))
        .collect();
    let prefixes: Vec<&str> = std::iter::once("libcudart.so.")
        .chain(backends.iter().map(|(_, p)| *p))
        .collect();
    let mut found = library_versions(facts, &prefixes).into_iter();
    let cudart = found.next().flatten();
    let cuda = read("/usr/local/cuda/version.json")
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|j| j["cuda"]["version"].as_str().map(String::from))
        .or(cudart);
    v.insert("cuda".into(), cuda.unwrap_or_else(not_found));
    for ((name, _), version) in backends.iter().zip(found) {
        v.insert((*name).into(), version.unwrap_or_else(not_found));
    }
    v.insert("libc".into(), libc_version(facts).unwrap_or_else(not_found));
    v
}

fn not_found() -> String {
    "not found".into()
}

const LIB_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/cuda/lib64",
    "/opt/intel/oneapi/ccl/latest/lib",
];

/// For each prefix, the longest versioned file name `PREFIX<version>` in
/// the usual library directories (libnccl.so.2.18.5 says 2.18.5), in one
/// pass over them.
fn library_versions(facts: &Facts, prefixes: &[&str]) -> Vec<Option<String>> {
    let mut best: Vec<Option<String>> = vec![None; prefixes.len()];
    for dir in LIB_DIRS {
        let Ok(entries) = std::fs::read_dir(facts.host_path(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            for (prefix, best) in prefixes.iter().zip(best.iter_mut()) {
                if let Some(version) = name.strip_prefix(prefix)
                    && !version.is_empty()
                    && best.as_ref().is_none_or(|b| version.len() > b.len())
                {
                    *best = Some(version.to_string());
                }
            }
        }
    }
    best
}

/// glibc's version, from the banner in the libc this process has mapped
/// ("... release version 2.36."): read, not asked of `getconf`, so that a
/// check-in starts no process.
fn libc_version(facts: &Facts) -> Option<String> {
    if !facts.is_live() {
        return None;
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            std::path::Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libc.so") || n.starts_with("libc-"))
        })?;
    let bytes = std::fs::read(path).ok()?;
    libc_banner_version(&bytes)
}

fn libc_banner_version(bytes: &[u8]) -> Option<String> {
    static BANNER: std::sync::OnceLock<Option<regex::bytes::Regex>> = std::sync::OnceLock::new();
    let re = BANNER
        .get_or_init(|| {
            regex::bytes::Regex::new(r"GNU C Library [^\n]*release version ([0-9]+\.[0-9]+)").ok()
        })
        .as_ref()?;
    let m = re.captures(bytes)?.get(1)?;
    Some(String::from_utf8_lossy(m.as_bytes()).into_owned())
}

/// What the hostname resolves to: the answer Gloo and NCCL get when they
/// advertise this node by name (the same resolution the interface check
/// uses, under its deadline).
pub fn resolve_hostname(facts: &Facts, hostname: &str) -> Vec<String> {
    let limit = std::time::Duration::from_secs(2);
    let mut addrs: Vec<String> = preflight_kinds::resolve::resolve_on_node(facts, hostname, limit)
        .map(|ips| ips.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    addrs.sort();
    addrs.dedup();
    addrs
}

/// The interface holding `ip`, from the node's interface facts.
pub fn interface_of(facts: &Facts, ip: &str) -> Option<String> {
    let ip: std::net::IpAddr = ip.parse().ok()?;
    facts
        .interfaces()
        .iter()
        .find(|i| i.addresses.contains(&ip))
        .map(|i| i.name.clone())
}

/// A check-in as a rank on `host` would send it, for tests.
#[cfg(any(test, feature = "test-support"))]
pub fn sample(rank: u32, world: u32, host: &str) -> CheckIn {
    CheckIn {
        identity: super::identity::Identity {
            rank,
            world_size: world,
            local_rank: 0,
            local_world_size: 1,
            node_rank: rank,
            nnodes: None,
            master_addr: "h0".into(),
            master_port: 29500,
            job_id: None,
            source: "torchrun".into(),
            nodelist: Vec::new(),
            probe_ports: None,
            master_ports: None,
            tasks_per_node: Vec::new(),
        },
        hostname: host.into(),
        addr: "10.0.0.1".into(),
        pid: 100 + rank,
        tool_version: "1".into(),
        checklist_hash: "x".into(),
        local_verdict: "ready".into(),
        failed: Vec::new(),
        versions: Default::default(),
        env: Default::default(),
        devices: Devices::default(),
        clock: None,
        hostname_addrs: Vec::new(),
        probe_addr: None,
        probe_error: None,
        interface: None,
        seen_from: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_a_peer_controls_is_bounded() {
        let mut c = sample(1, 2, &"h".repeat(3 << 20));
        c.env = (0..1000)
            .map(|i| (format!("NCCL_X{i}"), "v".repeat(10_000)))
            .collect();
        c.failed = (0..500)
            .map(|i| FailedCheck {
                id: format!("c{i}"),
                status: Status::Fail,
                message: "é".repeat(5_000),
                hint: Some("x".repeat(5_000)),
                area: "a".repeat(5_000),
                kind: "k".repeat(5_000),
                // Each list longer than ABOUT, each name longer than
                // ABOUT_NAME: gigabytes of them would prove no more.
                about: preflight_result::About {
                    variables: vec!["V".repeat(1_000); 40],
                    holders: vec![7; 100_000],
                    restates: vec!["r".repeat(1_000); 40],
                    loopback_hostnames: vec!["h".repeat(1_000); 40],
                },
            })
            .collect();
        c.devices.models = vec!["m".repeat(1000); 1000];
        let b = c.bounded();
        assert!(
            b.hostname.starts_with("hhh") && b.hostname.ends_with("(3145472 more bytes)"),
            "{}",
            &b.hostname[200..]
        );
        assert_eq!(b.env.len(), ITEMS + 1);
        assert_eq!(b.env["..."], "936 more not listed");
        assert_eq!(b.failed.len(), ITEMS + 1);
        assert_eq!(b.failed[ITEMS].message, "436 more failed checks not listed");
        let about: usize = b
            .failed
            .iter()
            .map(|f| {
                let a = &f.about;
                a.holders.len() + a.variables.len() + a.restates.len() + a.loopback_hostnames.len()
            })
            .sum();
        assert_eq!(about, ABOUT);
        // Holders come first, then the names, each cut.
        let mut c = sample(1, 2, "h");
        let mut f = b.failed[0].clone();
        f.about = preflight_result::About {
            variables: vec!["V".repeat(5_000); 1000],
            ..Default::default()
        };
        c.failed = vec![f];
        let b2 = c.bounded();
        let names = &b2.failed[0].about.variables;
        assert_eq!(names.len(), ABOUT);
        assert!(names.iter().all(|n| n.len() < ABOUT_NAME + 30), "{names:?}");
        assert_eq!(b.devices.models.len(), ITEMS);
        let size = serde_json::to_vec(&b).unwrap().len();
        assert!(size < 160_000, "{size} bytes");
        // An honest check-in is untouched.
        let honest = sample(1, 2, "gpu017");
        let before = serde_json::to_string(&honest).unwrap();
        assert_eq!(serde_json::to_string(&honest.bounded()).unwrap(), before);
    }

    #[test]
    fn per_process_variables_are_not_compared() {
        for name in [
            "CUDA_VISIBLE_DEVICES",
            "CCL_LOCAL_RANK",
            "OMPI_MCA_ess_base_vpid",
            "OMPI_MCA_orte_local_daemon_uri",
            "OMPI_MCA_orte_ess_node_rank",
        ] {
            assert!(per_process(name), "{name}");
        }
        for name in [
            "NCCL_IB_HCA",
            "OMPI_MCA_btl_tcp_if_include",
            "MASTER_PORT",
            "CCL_WORKER_COUNT",
        ] {
            assert!(!per_process(name), "{name}");
        }
    }

    #[test]
    fn glibc_version_is_read_from_the_banner_of_the_mapped_libc() {
        for (banner, want) in [
            (
                &b"\0GNU C Library (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36.\n"[..],
                "2.36",
            ),
            (
                b"GNU C Library (GNU libc) stable release version 2.28.\n",
                "2.28",
            ),
            (
                b"GNU C Library (GNU libc) stable release version 2.17, by Roland",
                "2.17",
            ),
        ] {
            assert_eq!(libc_banner_version(banner).as_deref(), Some(want));
        }
        assert_eq!(libc_banner_version(b"musl libc (x86_64)"), None);
        // This machine's, the same as glibc itself says.
        let Ok(out) = std::process::Command::new("getconf")
            .arg("GNU_LIBC_VERSION")
            .output()
        else {
            preflight_ground::testing::test_skip("no getconf here to say which glibc this is");
            return;
        };
        let said = String::from_utf8_lossy(&out.stdout);
        let facts = Facts::from_process("/".into(), Vec::new());
        assert_eq!(
            libc_version(&facts).as_deref(),
            said.split_whitespace().nth(1),
            "getconf: {said}"
        );
    }

    #[test]
    fn absurd_timestamps_do_not_overflow() {
        let c = Clock::sample(i64::MIN, i64::MAX, i64::MIN, i64::MAX);
        assert!(c.offset_ms.is_finite() && c.rtt_ms.is_finite());
    }

    #[test]
    fn clock_sample_is_ntp_style() {
        // Client 50 ms ahead of the server, 2 ms each way, 1 ms in server.
        let c = Clock::sample(1_050_000, 1_002_000, 1_003_000, 1_055_000);
        assert!((c.offset_ms - 50.0).abs() < 0.01, "{c:?}");
        assert!((c.rtt_ms - 4.0).abs() < 0.01, "{c:?}");
    }
}
