//! Entry points for the fuzz targets in `fuzz/` (the `fuzzing` feature,
//! never in a shipped binary): every input that comes from outside (files
//! an operator writes, bytes a peer sends, text the kernel and tools
//! print) through the real parser. A panic is a finding; where a parser
//! has a property beyond "no panic", it is asserted here, so that the
//! fuzzer checks it too.

use std::pin::Pin;
use std::task::{Context, Poll};

use preflight_cluster::{auth, hostlist, protocol};
use preflight_facts::Interface;

/// A YAML checklist: checks, or errors that name the file.
pub fn checklist(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(errors) = preflight_checklist::load_text("fuzz.yaml", text) {
        for e in &errors.0 {
            assert!(e.to_string().starts_with("fuzz.yaml"), "{e}");
        }
    }
    // The same data spelled by saphyr's emitter loads to the same checks.
    preflight_checklist::reemit::assert_reemitted_loads_the_same("fuzz.yaml", text);
}

/// A node profile: a profile, or errors that name the file; one that
/// reads is judged against an empty node without a panic.
pub fn profile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match preflight_facts::profile::parse("profile.yaml", text) {
        Ok(p) => {
            let node = preflight_facts::profile::Inventory::default();
            let _ = p.fit(&node);
            let _ = preflight_facts::profile::diff(&p, &node, true);
        }
        Err(errors) => {
            for e in &errors {
                assert!(e.to_string().starts_with("profile.yaml"), "{e}");
            }
        }
    }
}

/// The second pass's shared table as a peer sends it, and the plan made
/// from it: every round's pairs disjoint and in the world.
pub fn second_pass_table(data: &[u8]) {
    preflight_collective::isolate::plan_for_fuzzing(data);
}

/// The site settings file of /etc/preflight.
pub fn site_settings(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = preflight_run::site::parse_settings("settings.yaml", text);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

/// A frame as a peer sends it; one that decodes encodes back to itself.
pub fn frame(data: &[u8]) {
    let rt = runtime();
    rt.block_on(async {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut input = data;
        let Ok(msg) = protocol::read_limited(&mut input, deadline, protocol::MAX_RANK_FRAME).await
        else {
            return;
        };
        let encoded = protocol::encode(&msg);
        let mut again = encoded.as_slice();
        let back = protocol::read_limited(&mut again, deadline, protocol::MAX_RANK_FRAME)
            .await
            .expect("an encoded frame decodes");
        assert_eq!(
            serde_json::to_value(&msg).ok(),
            serde_json::to_value(&back).ok()
        );
    });
}

/// A stream that reads the fuzzer's bytes and swallows what is written:
/// the other side of a handshake, hostile.
struct Peer<'a> {
    input: &'a [u8],
}

impl tokio::io::AsyncRead for Peer<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.input).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Peer<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Both sides of the handshake against a peer that sends these bytes:
/// it never authenticates without the secret.
pub fn handshake(data: &[u8]) {
    let rt = runtime();
    let token = auth::Token::new(b"fuzzing-secret-0123456789abcdef", "fuzz");
    rt.block_on(async {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut server_side = Peer { input: data };
        let accepted = auth::server(&mut server_side, &token, deadline).await;
        assert!(accepted.is_err(), "a stranger's bytes passed the server");
        let mut client_side = Peer { input: data };
        let welcomed = auth::client(&mut client_side, &token, deadline).await;
        assert!(welcomed.is_err(), "a stranger's bytes passed the client");
    });
}

/// SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE. An expansion written out
/// as a plain list expands to itself.
pub fn nodelist(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(names) = hostlist::expand(text) {
        let plain = names
            .iter()
            .all(|n| !n.is_empty() && !n.contains(['[', ']', ',']));
        if plain && !names.is_empty() {
            assert_eq!(hostlist::expand(&names.join(",")).ok(), Some(names));
        }
    }
    let _ = hostlist::counts(text);
}

fn interface(name: &str, up: bool) -> Interface {
    Interface {
        name: name.into(),
        operstate: if up { "up" } else { "down" }.into(),
        carrier: Some(up),
        mtu: Some(1500),
        speed_mbps: None,
        link_type: "ether".into(),
        hw_address: None,
        addresses: vec![std::net::IpAddr::from([10, 0, 0, 1])],
    }
}

/// NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME selectors and NCCL_IB_HCA, the
/// first byte choosing the variable.
pub fn interface_selector(data: &[u8]) {
    let Some((first, rest)) = data.split_first() else {
        return;
    };
    let Ok(value) = std::str::from_utf8(rest) else {
        return;
    };
    let variable = match first % 3 {
        0 => "NCCL_SOCKET_IFNAME",
        1 => "GLOO_SOCKET_IFNAME",
        _ => "NCCL_IB_HCA",
    };
    let interfaces = [
        interface("lo", true),
        interface("eth0", true),
        interface("ib0", false),
    ];
    let _ = preflight_kinds::ifname_spec::check(variable, value, &interfaces, None);
    for i in &interfaces {
        let _ = preflight_kinds::ifname_spec::picks(variable, value, &i.name);
    }
}

/// `nvidia-smi -q -x`.
pub fn nvidia_smi_xml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = preflight_facts::gpu_status::parse_xml("nvidia-smi", text);
    }
}

/// Text from /proc and /sys: meminfo, limits, the NVIDIA driver's version
/// file, an IB port's rate, a process's Unix sockets; and a torch Flight
/// Recorder, as its worker server answers (JSON) and as its dump (a
/// pickle), which the job's side writes.
pub fn proc_text(data: &[u8]) {
    let _ = preflight_facts::flight_recorder::parse_json(data);
    let _ = preflight_facts::flight_recorder::parse_pickle(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = preflight_facts::meminfo::field(text, "MemAvailable");
    let _ = preflight_facts::limits::soft_limit(text, "Max open files");
    let _ = preflight_facts::nvidia::proc_version(text);
    let _ = preflight_facts::infiniband::parse_rate(text);
    // /proc/net/tcp: every inode found for the port is written in the text.
    for inode in preflight_kinds::port_holder::bound_inodes(text, 29500) {
        assert!(text.contains(&inode.to_string()), "{inode}");
    }
    // /proc/PID/stat, as a signal's cleanup reads it to find descendants.
    let _ = preflight_ground::interrupt::parse_stat(1, text);
    // /proc/PID/net/unix: only listening paths among the inodes given.
    for path in preflight_facts::flight_recorder::listening_paths(text, &[1, 2, 3]) {
        assert!(text.contains(&path), "{path}");
    }
}

/// `nft -j list ruleset` and `iptables-save`, the first byte choosing.
pub fn firewall(data: &[u8]) {
    let Some((first, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    preflight_kinds::firewall::parse_for_fuzzing(*first, text);
}

/// A JSON report as `preflight report` reads it, merged and drawn.
pub fn report(data: &[u8]) {
    let Ok(report) = serde_json::from_slice::<preflight_result::report::Report>(data) else {
        return;
    };
    let merged = preflight_result::merged::merge(vec![("fuzz.json".into(), report)], Vec::new());
    let _ = preflight_report::html(&merged);
    let _ = preflight_report::markdown(&merged);
}

/// `dcgmi diag -j` output, as the dcgm_diag kind reads it. A result DCGM
/// says failed never becomes a passing check.
pub fn dcgm_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(report) = preflight_kinds::dcgm_diag::parse::parse(text) else {
        return;
    };
    let finding = preflight_kinds::dcgm_diag::judge(&report, 1);
    let failed = report.results.iter().any(|r| {
        !matches!(
            r.status,
            preflight_kinds::dcgm_diag::parse::DiagStatus::Pass
                | preflight_kinds::dcgm_diag::parse::DiagStatus::Skip
                | preflight_kinds::dcgm_diag::parse::DiagStatus::NotRun
        )
    });
    if failed || report.results.is_empty() {
        assert_ne!(finding.status, preflight_result::Status::Pass, "{report:?}");
    }
}

/// NVIDIA tools' text, the first byte choosing: `nvidia-smi nvlink -s`,
/// `-e`, `-R`, a kernel log's Xids (grouped: the counts add up to the
/// lines), several `nvidia-smi -q -x` documents.
pub fn nvidia_text(data: &[u8]) {
    let Some((first, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    use preflight_facts::{gpu_status, kmsg, xid};
    use preflight_kinds::nvlink::parse as nvlink;
    match first % 5 {
        0 => {
            let _ = nvlink::parse_status("s", text);
        }
        1 => {
            let mut gpus = nvlink::parse_status("s", "GPU 0: X\n").unwrap_or_default();
            let _ = nvlink::parse_errors("e", text, &mut gpus);
        }
        2 => {
            let mut gpus = nvlink::parse_status("s", "GPU 0: X\n").unwrap_or_default();
            let _ = nvlink::parse_remotes("r", text, &mut gpus);
        }
        3 => {
            let xids = kmsg::parse(text);
            let groups = xid::group(&xids, &xid::NVLINK_XIDS, None);
            let counted: u64 = groups.iter().map(|g| g.count).sum();
            assert_eq!(counted, xids.len() as u64);
        }
        _ => {
            let _ = gpu_status::parse_xml_samples("x", text);
        }
    }
}

/// A vendor tool's output: the first byte chooses which of the tool's
/// outputs the rest is read as.
fn tool_output(data: &[u8]) -> Option<(u8, &str)> {
    let (which, rest) = data.split_first()?;
    Some((*which, std::str::from_utf8(rest).ok()?))
}

/// `amd-smi metric|static|bad-pages --json`, `amd-smi xgmi --json` and
/// `rocm-smi --json`, as the `amd_smi` kind reads them: an uncorrectable
/// error counted or an XGMI link down never becomes a pass.
pub fn amd_smi(data: &[u8]) {
    if let Some((which, text)) = tool_output(data) {
        preflight_kinds::amd_smi::judge_for_fuzzing(which, text);
    }
}

/// `xpu-smi diag -j`, `health -j` and `topology -m`, as the `xpu_smi`
/// kind reads them: a failed component never becomes a pass.
pub fn xpu_smi(data: &[u8]) {
    if let Some((which, text)) = tool_output(data) {
        preflight_kinds::xpu_smi::judge_for_fuzzing(which, text);
    }
}

/// `hl-smi -Q ... -f csv`, `hl-smi -q` and `hl-smi -n link`, as the
/// `hl_smi` kind reads them: a port down or a throttle reason active
/// never becomes a pass.
pub fn hl_smi(data: &[u8]) {
    if let Some((which, text)) = tool_output(data) {
        preflight_kinds::hl_smi::judge_for_fuzzing(which, text);
    }
}
