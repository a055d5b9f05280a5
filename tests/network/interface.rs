//! interface and env_lint against real interfaces in a namespace: up, down
//! and absent links, the route to MASTER_ADDR, and socket-interface
//! variables that disagree with it.

use crate::common;

use common::netns::Cluster;
use common::{BIN, checklist, message, status};

const CHECKS: &str = "checks:
  - {id: route, kind: interface, check_hostname: false, min_mtu: 1000, hint: \"set NCCL_SOCKET_IFNAME={suggest}\"}
  - {id: lint, kind: env_lint}
";

#[test]
fn route_interface_and_socket_variables() {
    let _shared = crate::common::shared();
    let Some(c) = Cluster::new(2) else { return };
    // A second link in host 0 that stays down.
    c.must(
        0,
        &[
            "ip", "link", "add", "eth1", "type", "veth", "peer", "name", "eth1p",
        ],
    );
    let (_dir, path) = checklist(CHECKS);
    let path = path.to_string_lossy().to_string();
    let args = ["check", "--no-shipped", "--checks", path.as_str()];
    let master = c.addr(1);
    let run = |env: &[(&str, &str)]| {
        let mut all = vec![("MASTER_ADDR", master.as_str())];
        all.extend_from_slice(env);
        c.preflight(0, BIN, &args, &all).1
    };

    let r = run(&[
        ("NCCL_SOCKET_IFNAME", "eth0"),
        ("GLOO_SOCKET_IFNAME", "eth0"),
    ]);
    assert_eq!(status(&r, "route"), "pass", "{}", message(&r, "route"));
    assert_eq!(common::measured(&r, "route"), "eth0");
    assert!(
        message(&r, "route").contains("via eth0 (up, carrier, mtu 1500"),
        "{}",
        message(&r, "route")
    );
    assert!(message(&r, "route").contains(&format!("from {}", c.addr(0))));
    assert_eq!(status(&r, "lint"), "pass", "{}", message(&r, "lint"));

    // Absent interface: route check suggests the right one, lint says
    // there is no such interface.
    let r = run(&[("NCCL_SOCKET_IFNAME", "ib0")]);
    assert_eq!(status(&r, "route"), "fail");
    assert!(
        message(&r, "route").contains(
            "NCCL_SOCKET_IFNAME=`ib0` selects no interface of this node, but the route to"
        ),
        "{}",
        message(&r, "route")
    );
    assert_eq!(common::hint(&r, "route"), "set NCCL_SOCKET_IFNAME=eth0");
    assert_eq!(status(&r, "lint:NCCL_SOCKET_IFNAME"), "fail");
    assert!(
        message(&r, "lint:NCCL_SOCKET_IFNAME").contains("no interface matching `ib0`"),
        "{}",
        message(&r, "lint:NCCL_SOCKET_IFNAME")
    );

    // A down interface named by the variables.
    let r = run(&[("GLOO_SOCKET_IFNAME", "eth1")]);
    assert_eq!(status(&r, "route"), "fail");
    assert!(message(&r, "route").contains("GLOO_SOCKET_IFNAME=`eth1` selects eth1, but the route"));
    assert!(
        message(&r, "lint:GLOO_SOCKET_IFNAME")
            .contains("selects only interfaces that are down: eth1 (down"),
        "{}",
        message(&r, "lint:GLOO_SOCKET_IFNAME")
    );
    let r = run(&[("GLOO_SOCKET_IFNAME", "^lo")]);
    assert!(message(&r, "lint:GLOO_SOCKET_IFNAME").contains("does not support `^`"));
    // NCCL's exclusion syntax that leaves eth0 is fine.
    let r = run(&[("NCCL_SOCKET_IFNAME", "^lo,eth1")]);
    assert_eq!(status(&r, "route"), "pass", "{}", message(&r, "route"));
    assert_eq!(status(&r, "lint"), "pass", "{}", message(&r, "lint"));

    // MTU below the minimum.
    c.must(0, &["ip", "link", "set", "eth0", "mtu", "900"]);
    let r = run(&[]);
    assert!(
        message(&r, "route").contains("eth0 has MTU 900, below 1000"),
        "{}",
        message(&r, "route")
    );
    c.must(0, &["ip", "link", "set", "eth0", "mtu", "1500"]);

    // The cluster link goes down: no route to the master at all.
    c.must(0, &["ip", "link", "set", "eth0", "down"]);
    let r = run(&[]);
    assert_eq!(status(&r, "route"), "fail");
    assert!(
        message(&r, "route").contains("no route from this node to MASTER_ADDR"),
        "{}",
        message(&r, "route")
    );
}

#[test]
fn hostname_on_loopback_fails_only_multi_node() {
    let _shared = crate::common::shared();
    // A fixture root gives the node the name `localhost`, which its own
    // /etc/hosts (the only resolver under --root) maps to loopback.
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("etc")).unwrap();
    std::fs::write(root.path().join("etc/hostname"), "localhost\n").unwrap();
    std::fs::write(root.path().join("etc/hosts"), "127.0.0.1 localhost\n").unwrap();
    let (_dir, path) = checklist("checks:\n  - {id: host, kind: interface, check_route: false}\n");
    let root_arg = root.path().to_string_lossy().to_string();
    let (code, r) = common::check(&path, &["--root", &root_arg], &[]);
    assert_eq!(code, 0);
    assert_eq!(status(&r, "host"), "pass");
    let (code, r) = common::check(
        &path,
        &["--root", &root_arg],
        &[
            ("WORLD_SIZE", "16"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("RANK", "9"),
        ],
    );
    assert_eq!(code, 1);
    assert!(
        message(&r, "host").contains("hostname localhost resolves only to loopback"),
        "{}",
        message(&r, "host")
    );
}
