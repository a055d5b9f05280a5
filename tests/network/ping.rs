//! ping to a namespace peer, through both socket kinds, and to a peer that
//! drops ICMP.

use crate::common;

use common::netns::Cluster;
use common::{BIN, checklist, message, status};

#[test]
fn echo_replies_loss_and_socket_kinds() {
    let _shared = crate::common::shared();
    let Some(c) = Cluster::new(3) else { return };
    // Host 2 drops ICMP.
    c.iptables(2, &["-A", "INPUT", "-p", "icmp", "-j", "DROP"]);
    let yaml = format!(
        "checks:
  - {{id: peer, kind: ping, hosts: [\"{}\"], count: 3, interval: 20ms}}
  - {{id: master, kind: ping, hosts_var: MASTER_ADDR, count: 2, interval: 20ms}}
  - {{id: dropped, kind: ping, hosts: [\"{}\"], count: 2, interval: 20ms, reply_timeout: 500ms, hint: \"loss {{loss}} via {{socket}}\"}}
  - {{id: fast, kind: ping, hosts: [\"{}\"], count: 2, max_rtt: 1ns}}
",
        c.addr(1),
        c.addr(2),
        c.addr(1)
    );
    let (_dir, path) = checklist(&yaml);
    let path = path.to_string_lossy().to_string();
    let args = ["check", "--no-shipped", "--checks", path.as_str()];
    let env = [("MASTER_ADDR", c.hosts[1].addr.to_string())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    // Raw socket: the namespace's ping_group_range allows no group.
    c.must(0, &["sysctl", "-qw", "net.ipv4.ping_group_range=1 0"]);
    let (code, r) = c.preflight(0, BIN, &args, &env);
    assert_eq!(code, 1);
    assert_eq!(status(&r, "peer"), "pass", "{}", message(&r, "peer"));
    assert!(
        message(&r, "peer").contains("3/3 replies, 0% loss"),
        "{}",
        message(&r, "peer")
    );
    assert!(message(&r, "peer").ends_with("(via raw socket)"));
    assert_eq!(status(&r, "master"), "pass", "{}", message(&r, "master"));
    assert_eq!(status(&r, "dropped"), "fail");
    assert!(
        message(&r, "dropped").contains("0/2 replies, 100% loss"),
        "{}",
        message(&r, "dropped")
    );
    assert_eq!(common::hint(&r, "dropped"), "loss 100% via raw socket");
    assert_eq!(status(&r, "fast"), "fail", "{}", message(&r, "fast"));

    // Unprivileged ICMP datagram socket where the group range allows it.
    c.must(
        0,
        &["sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647"],
    );
    let (_, r) = c.preflight(0, BIN, &args, &env);
    assert_eq!(status(&r, "peer"), "pass", "{}", message(&r, "peer"));
    assert!(
        message(&r, "peer").ends_with("(via unprivileged ICMP socket)"),
        "{}",
        message(&r, "peer")
    );
    assert_eq!(status(&r, "dropped"), "fail");
}

/// An ordinary user with no ICMP socket (ping_group_range excludes it, no
/// CAP_NET_RAW) and no right to read the ruleset: both checks say what they
/// need as a skip, not a pass and not an error that makes a healthy node
/// INCOMPLETE (the job's user runs `srun ... preflight run`).
#[test]
fn no_permitted_socket_is_a_skip_naming_the_privilege_never_a_pass() {
    let _shared = crate::common::shared();
    let Some(c) = Cluster::new(2) else { return };
    c.must(0, &["sysctl", "-qw", "net.ipv4.ping_group_range=1 0"]);
    let yaml = format!(
        "checks:\n  - {{id: peer, kind: ping, hosts: [\"{}\"], count: 1}}\n  - {{id: fw, kind: firewall}}\n",
        c.addr(1)
    );
    let (dir, path) = checklist(&yaml);
    // The unprivileged user must be able to read the checklist.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = path.to_string_lossy().to_string();
    let out = c.exec(
        0,
        &[
            "runuser",
            "-u",
            "nobody",
            "--",
            BIN,
            "check",
            "--no-shipped",
            "--format",
            "json",
            "--checks",
            &path,
        ],
    );
    let r = common::report_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert_eq!(status(&r, "peer"), "skip", "{r:#}");
    assert_eq!(
        message(&r, "peer"),
        "an ICMP echo needs root, CAP_NET_RAW or a group in net.ipv4.ping_group_range; the node's root health check covers it"
    );
    assert_eq!(status(&r, "fw"), "skip", "{r:#}");
    assert!(
        message(&r, "fw").contains("needs root or CAP_NET_ADMIN"),
        "{}",
        message(&r, "fw")
    );
}

#[test]
fn ipv6_echo_and_dropped_echo() {
    let _shared = crate::common::shared();
    let Some(c) = Cluster::new(3) else { return };
    c.add_ipv6();
    c.must(
        2,
        &[
            "ip6tables",
            "-w",
            "-A",
            "INPUT",
            "-p",
            "icmpv6",
            "--icmpv6-type",
            "echo-request",
            "-j",
            "DROP",
        ],
    );
    let yaml = format!(
        "checks:
  - {{id: peer6, kind: ping, hosts: [\"{}\"], count: 2, interval: 20ms}}
  - {{id: dropped6, kind: ping, hosts: [\"{}\"], count: 2, interval: 20ms, reply_timeout: 500ms}}
",
        c.addr6(1),
        c.addr6(2)
    );
    let (_dir, path) = checklist(&yaml);
    let path = path.to_string_lossy().to_string();
    let args = ["check", "--no-shipped", "--checks", path.as_str()];
    for (range, socket) in [
        ("1 0", "raw socket"),
        ("0 2147483647", "unprivileged ICMP socket"),
    ] {
        c.must(
            0,
            &[
                "sysctl",
                "-qw",
                &format!("net.ipv4.ping_group_range={range}"),
            ],
        );
        let (_, r) = c.preflight(0, BIN, &args, &[]);
        assert_eq!(status(&r, "peer6"), "pass", "{}", message(&r, "peer6"));
        assert!(
            message(&r, "peer6").contains("2/2 replies"),
            "{}",
            message(&r, "peer6")
        );
        assert!(message(&r, "peer6").ends_with(&format!("(via {socket})")));
        assert_eq!(status(&r, "dropped6"), "fail");
        assert!(
            message(&r, "dropped6").contains("0/2 replies, 100% loss"),
            "{}",
            message(&r, "dropped6")
        );
    }
}
