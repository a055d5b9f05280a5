//! The shipped network checks diagnose a broken node end to end: a wrong
//! socket interface, a leftover rank holding MASTER_PORT, a firewall rule
//! on a rendezvous port, and a misspelt variable, each with its hint.

use crate::common;

use common::netns::Cluster;
use common::{BIN, message, status};

#[test]
fn shipped_checks_name_what_is_wrong() {
    let _shared = crate::common::shared();
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
        common::hint(&r, "net.master_route")
            .contains("Set NCCL_SOCKET_IFNAME=eth0 and GLOO_SOCKET_IFNAME=eth0"),
        "{}",
        common::hint(&r, "net.master_route")
    );
    assert_eq!(status(&r, "net.master_port_free"), "fail");
    let h = common::hint(&r, "net.master_port_free");
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
        common::hint(&r, "net.firewall")
            .starts_with("nft has a rule that blocks the rendezvous: `iifname \"eth0\" tcp dport 29501 drop` (port 29501)."),
        "{}",
        common::hint(&r, "net.firewall")
    );
    // env.lint: one result per variable at fault.
    let ifname = "env.lint:NCCL_SOCKET_IFNAME";
    assert_eq!(status(&r, ifname), "fail");
    assert!(
        message(&r, ifname).contains("NCCL_SOCKET_IFNAME=`eth1`: no interface matching `eth1`"),
        "{}",
        message(&r, ifname)
    );
    // The fix is the interface that carries the route to rank 0, first.
    assert!(
        message(&r, ifname)
            .ends_with("; the route to MASTER_ADDR goes through `eth0`: NCCL_SOCKET_IFNAME=eth0"),
        "{}",
        message(&r, ifname)
    );
    assert!(
        common::hint(&r, "net.master_route")
            .starts_with("The route to MASTER_ADDR goes through eth0"),
        "{}",
        common::hint(&r, "net.master_route")
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
    let _shared = crate::common::shared();
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

/// `net.master_route`'s hint fits the case: a MASTER_ADDR that does not
/// resolve (in a test host: no resolver reachable) or one that resolves to
/// loopback in a multi-node job gets its own remedy, not the route's; and
/// `net.hostname` measures what the name resolves to, never "no route".
#[test]
fn the_master_route_hint_fits_the_case() {
    let _shared = crate::common::shared();
    let Some(c) = Cluster::new(1) else { return };
    let run = |addr: &str| {
        let env = [
            ("MASTER_ADDR", addr),
            ("MASTER_PORT", "29500"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("SLURM_NNODES", "2"),
        ];
        c.preflight(
            0,
            BIN,
            &[
                "check",
                "--only",
                "net.master_route",
                "--only",
                "net.hostname",
            ],
            &env,
        )
        .1
    };
    let r = run("gpu-node-00.invalid");
    assert_eq!(status(&r, "net.master_route"), "fail", "{r:#}");
    let h = common::hint(&r, "net.master_route");
    assert_eq!(
        h,
        "Add `gpu-node-00.invalid` to DNS or /etc/hosts on every node, or set MASTER_ADDR to rank 0's address."
    );
    let r = run("localhost");
    assert_eq!(status(&r, "net.master_route"), "fail", "{r:#}");
    let h = common::hint(&r, "net.master_route");
    assert!(h.starts_with("`localhost` resolves to 127.0.0.1 on this node: set MASTER_ADDR to rank 0's cluster address"), "{h}");
    assert!(!h.contains("does not resolve"), "{h}");
    assert_eq!(
        common::measured(&r, "net.master_route"),
        "127.0.0.1 (loopback)"
    );
    let measured = common::measured(&r, "net.hostname");
    assert!(measured != "no route" && !measured.is_empty(), "{r:#}");
}
