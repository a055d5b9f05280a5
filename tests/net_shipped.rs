//! The shipped network checks diagnose a broken node end to end: a wrong
//! socket interface, a leftover rank holding MASTER_PORT, a firewall rule
//! on a rendezvous port, and a misspelt variable, each with its hint.

mod common;

use common::netns::Cluster;
use common::{BIN, message, result, status};

fn hint<'a>(r: &'a serde_json::Value, id: &str) -> &'a str {
    result(r, id)["hint"].as_str().unwrap_or("")
}

#[test]
fn shipped_checks_name_what_is_wrong() {
    let Some(c) = Cluster::new(2) else { return };
    let leftover = c.listen(0, 29500, &["-m", "torch.distributed.run", "train.py"]);
    c.nft(0, &["add", "table", "inet", "pf"]);
    c.nft(
        0,
        &[
            "add",
            "chain",
            "inet",
            "pf",
            "input",
            "{ type filter hook input priority 0; policy accept; }",
        ],
    );
    c.nft(
        0,
        &[
            "add", "rule", "inet", "pf", "input", "iifname", "eth0", "tcp", "dport", "29501",
            "drop",
        ],
    );
    let master = c.addr(1);
    let mut args = vec!["check"];
    for id in [
        "net.master_route",
        "net.master_port_free",
        "net.firewall",
        "env.lint",
        "launch.env",
    ] {
        args.extend(["--only", id]);
    }
    let env = [
        ("MASTER_ADDR", master.as_str()),
        ("MASTER_PORT", "29500"),
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("NCCL_SOCKET_IFNAME", "eth1"),
        ("NCCL_SOCKET_IFACE", "eth0"),
    ];
    let (code, r) = c.preflight(0, BIN, &args, &env);
    assert_eq!(code, 1, "{r:#}");

    assert_eq!(status(&r, "net.master_route"), "fail");
    assert!(
        hint(&r, "net.master_route")
            .contains("Set NCCL_SOCKET_IFNAME=eth0 and GLOO_SOCKET_IFNAME=eth0"),
        "{}",
        hint(&r, "net.master_route")
    );
    assert_eq!(status(&r, "net.master_port_free"), "fail");
    let h = hint(&r, "net.master_port_free");
    assert!(
        h.starts_with(&format!(
            "Port 29500 is held by pid {leftover} (user root) `python3 -c"
        )),
        "{h}"
    );
    assert!(
        h.contains("(a PyTorch job). Kill the leftover (`kill "),
        "{h}"
    );
    assert_eq!(status(&r, "net.firewall"), "fail");
    assert!(
        hint(&r, "net.firewall")
            .starts_with("nft has a rule that blocks the rendezvous: `iifname \"eth0\" tcp dport 29501 drop` (port 29501)."),
        "{}",
        hint(&r, "net.firewall")
    );
    // env.lint: one result per variable at fault.
    let ifname = "env.lint:NCCL_SOCKET_IFNAME";
    assert_eq!(status(&r, ifname), "fail");
    assert!(
        message(&r, ifname).contains("NCCL_SOCKET_IFNAME=`eth1`: no interface matching `eth1`"),
        "{}",
        message(&r, ifname)
    );
    assert!(message(&r, "env.lint:NCCL_SOCKET_IFACE").contains("did you mean NCCL_SOCKET_IFNAME?"));
    assert_eq!(
        status(&r, "launch.env"),
        "pass",
        "{}",
        message(&r, "launch.env")
    );
}

#[test]
fn shipped_checks_are_ready_on_a_clean_node_without_a_job() {
    let Some(c) = Cluster::new(1) else { return };
    let mut args = vec!["check"];
    for id in [
        "net.hostname",
        "net.master_route",
        "net.master_port_free",
        "net.rendezvous_ports_free",
        "net.firewall",
        "env.lint",
        "env.nccl_ib_disable",
        "launch.env",
    ] {
        args.extend(["--only", id]);
    }
    let (code, r) = c.preflight(0, BIN, &args, &[]);
    assert_eq!(code, 0, "{r:#}");
    for id in ["net.master_route", "net.master_port_free", "launch.env"] {
        assert_eq!(status(&r, id), "skip", "{id}: {}", message(&r, id));
    }
    for id in ["net.rendezvous_ports_free", "net.firewall", "env.lint"] {
        assert_eq!(status(&r, id), "pass", "{id}: {}", message(&r, id));
    }
}
