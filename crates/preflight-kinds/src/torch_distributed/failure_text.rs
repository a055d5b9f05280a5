//! torch's, Gloo's and the backends' failure texts, read as what went
//! wrong in the operator's terms and what to do about it.

use std::time::Duration;

use super::Rendezvous;
use preflight_ground::values::format_duration;

/// What went wrong, in the operator's terms, and what to do about it.
#[derive(Debug, PartialEq)]
pub(super) struct Explained {
    pub(super) summary: String,
    pub(super) advice: String,
    pub(super) port: Option<u16>,
}

/// The rendezvous this run used, for messages.
pub(super) struct Context<'a> {
    pub(super) rendezvous: Rendezvous,
    pub(super) port: u16,
    pub(super) master: Option<&'a str>,
    pub(super) deadline: Duration,
}

fn capture(re: &str, text: &str) -> Option<String> {
    regex::Regex::new(re)
        .ok()?
        .captures(text)?
        .get(1)
        .map(|m| m.as_str().to_string())
}

/// Maps torch's, Gloo's and the backends' failure texts to a diagnosis.
pub(super) fn explain(kind: &str, text: &str, ctx: &Context) -> Explained {
    let plain = |summary: String, advice: String| Explained {
        summary,
        advice,
        port: None,
    };
    if let Some(device) = capture(r"No backend type associated with device type (\w+)", text) {
        return plain(
            format!("No backend type associated with device type {device}"),
            format!(
                "init_process_group was given device_id={device}:N, which binds every later group to that device; Gloo has no {device} support, so new_group(backend=\"gloo\") for the CPU group fails. Do not pass device_id to init_process_group on {device} (SGLang passes it only for CUDA/ROCm with NCCL), or create the Gloo group without the bound device, or move to a torch release where new_group(backend=\"gloo\") ignores it. `device_id: omit` on this check shows whether the rest works."
            ),
        );
    }
    // torch up to 2.3: `bind to [::]:29544 (errno: 98 - Address already
    // in use)`; its libuv store (2.4 on): `port: 29544, useIpv6: false,
    // code: -98, name: EADDRINUSE, message: address already in use`.
    if text.contains("Address already in use")
        || text.contains("errno: 98")
        || text.contains("EADDRINUSE")
    {
        let port = capture(r":(\d+) \(errno: 98", text)
            .or_else(|| capture(r"port: (\d+),[^.]*EADDRINUSE", text))
            .and_then(|p| p.parse().ok())
            .unwrap_or(ctx.port);
        let advice = match ctx.rendezvous {
            Rendezvous::Job => format!(
                "MASTER_PORT {port} is already taken on rank 0's node (TCPStore binds every address): a leftover rank of an earlier job, or another service. Find it with `ss -ltnp 'sport = :{port}'`, end it, or give the job another MASTER_PORT."
            ),
            Rendezvous::Local => format!(
                "port {port}, just handed out free by the kernel, was taken before torch bound it: something on this node is grabbing ports. See `ss -ltnp 'sport = :{port}'`."
            ),
        };
        return Explained {
            summary: format!("port {port} is already in use"),
            advice,
            port: Some(port),
        };
    }
    if let Some(addr) = capture(r"connect \[?(127\.\d+\.\d+\.\d+)\]?", text) {
        return plain(
            format!("a peer tried to connect to loopback address {addr}"),
            format!(
                "Gloo announces the address of the host's name; here it resolves to {addr}, so other nodes are told to connect to themselves. Set GLOO_SOCKET_IFNAME to the interface the nodes share (and NCCL_SOCKET_IFNAME likewise), or fix /etc/hosts so the hostname maps to that interface's address, not 127.x."
            ),
        );
    }
    if let Some(iface) = capture(r"Unable to find address for:? ?(\S+)", text) {
        return plain(
            format!("Gloo found no address for interface {iface}"),
            format!(
                "GLOO_SOCKET_IFNAME (or the hostname Gloo falls back on) names `{iface}`, which is missing or has no IP address here: set it to an interface that is up (`ip -br addr`)."
            ),
        );
    }
    let unbuilt = [
        r"doesn't have (\w+) built in",
        r"Invalid backend: '(\w+)'",
        r"Unknown c10d backend type (\w+)",
        r"Backend (\w+) not available",
        r"(\w+) backend is not available",
        r"has no (\w+) backend",
    ];
    if let Some(backend) = unbuilt.iter().find_map(|re| capture(re, text)) {
        return plain(
            format!("this torch has no {backend} backend"),
            format!(
                "torch.distributed here was built without `{backend}` (or its plugin is not installed: oneccl_bindings_for_pytorch for `ccl`, habana_frameworks for `hccl`). Install the torch build for this node's device, or run the job with a backend it has (`gloo` for CPU)."
            ),
        );
    }
    let no_device = [
        "only supported with GPUs, no GPUs found",
        "Torch not compiled with CUDA enabled",
        "No CUDA GPUs are available",
        "Found no NVIDIA driver",
        "invalid device ordinal",
        "XPU device count is zero",
        "is_available() is False",
    ];
    if no_device.iter().any(|t| text.contains(*t)) {
        return plain(
            format!("no usable device: {}", first_line(text)),
            "The backend needs an accelerator this process cannot use: check the driver (see the accelerators checks), the visibility mask (CUDA_VISIBLE_DEVICES, ZE_AFFINITY_MASK) against LOCAL_RANK, or force `backend: gloo` on CPU nodes.".into(),
        );
    }
    let timed_out = kind.contains("Timeout")
        || kind == "DistStoreError"
        || text.contains("timed out")
        || text.contains("Timed out")
        || text.contains("Socket Timeout");
    if timed_out {
        let advice = match (ctx.rendezvous, ctx.master) {
            (Rendezvous::Job, Some(master)) => format!(
                "No answer from the rendezvous at {master} within {}: every rank must run this check at once (`preflight run` does), rank 0 must be up, and MASTER_PORT must be reachable (see net.master_route and net.firewall).",
                format_duration(ctx.deadline)
            ),
            _ => "torch's store on 127.0.0.1 did not answer in time: the node is overloaded, or a firewall rule drops loopback traffic (see net.firewall).".into(),
        };
        return plain(format!("timed out: {}", first_line(text)), advice);
    }
    if text.contains("Connection refused") {
        return plain(
            format!("connection refused: {}", first_line(text)),
            "Nothing listened where the rank connected: rank 0 is not up yet or died, MASTER_ADDR/MASTER_PORT differ between ranks (see launch.env), or a REJECT rule is in the way (net.firewall).".into(),
        );
    }
    plain(
        format!("{kind}: {}", first_line(text)),
        "Run the job's own start-up with TORCH_DISTRIBUTED_DEBUG=DETAIL (and NCCL_DEBUG=WARN or CCL_LOG_LEVEL=warn) to see more.".into(),
    )
}

/// torch's messages can run to many lines of C++ context; the first one
/// carries the point, cut to a report line.
pub(super) fn first_line(text: &str) -> String {
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let mut out: String = line.chars().take(300).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(rendezvous: Rendezvous) -> Context<'static> {
        Context {
            rendezvous,
            port: 29500,
            master: Some("10.0.0.1:29500"),
            deadline: Duration::from_secs(40),
        }
    }

    #[test]
    fn known_failure_texts_map_to_their_fix() {
        let local = ctx(Rendezvous::Local);
        let job = ctx(Rendezvous::Job);
        // (exception type, text, mode, summary part, advice part)
        let table: &[(&str, &str, &Context, &str, &str)] = &[
            (
                "RuntimeError",
                "No backend type associated with device type xpu",
                &local,
                "device type xpu",
                "Do not pass device_id",
            ),
            (
                "RuntimeError",
                "The server socket has failed to listen on any local network address. The server socket has failed to bind to [::]:29544 (errno: 98 - Address already in use).",
                &job,
                "port 29544 is already in use",
                "ss -ltnp 'sport = :29544'",
            ),
            (
                "DistNetworkError",
                "The server socket has failed to listen on any local network address. port: 37363, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
                &job,
                "port 37363 is already in use",
                "ss -ltnp 'sport = :37363'",
            ),
            (
                "RuntimeError",
                "[/opt/gloo/transport/tcp/pair.cc:799] connect [127.0.1.1]:51731: Connection refused",
                &job,
                "loopback address 127.0.1.1",
                "GLOO_SOCKET_IFNAME",
            ),
            (
                "RuntimeError",
                "[enforce fail at ./gloo/transport/tcp/device.cc:80] ifa != nullptr. Unable to find address for: eth9",
                &local,
                "interface eth9",
                "GLOO_SOCKET_IFNAME",
            ),
            (
                "RuntimeError",
                "Distributed package doesn't have NCCL built in",
                &local,
                "no NCCL backend",
                "built without `NCCL`",
            ),
            (
                "ValueError",
                "Invalid backend: 'xccl'",
                &local,
                "no xccl backend",
                "oneccl_bindings_for_pytorch",
            ),
            (
                "RuntimeError",
                "ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
                &local,
                "no usable device",
                "visibility mask",
            ),
            (
                "TimeoutError",
                "The client socket has timed out after 5s while trying to connect to (10.0.0.1, 29500).",
                &job,
                "timed out",
                "every rank must run this check at once",
            ),
            (
                "RuntimeError",
                "Connection refused",
                &job,
                "connection refused",
                "launch.env",
            ),
            (
                "KeyError",
                "something new\nwith context",
                &local,
                "KeyError: something new",
                "TORCH_DISTRIBUTED_DEBUG=DETAIL",
            ),
        ];
        for (kind, text, c, summary, advice) in table {
            let d = explain(kind, text, c);
            assert!(d.summary.contains(summary), "{text}: {d:?}");
            assert!(d.advice.contains(advice), "{text}: {d:?}");
        }
        assert_eq!(
            explain("RuntimeError", "errno: 98 - Address already in use", &local).port,
            Some(29500)
        );
    }
}
