//! firewall: nft and iptables rules created inside a namespace are read
//! back, judged against the rendezvous ports and peers, and quoted.

use crate::common;

use common::netns::Cluster;
use common::{BIN, checklist, message, status};

const CHECKS: &str = "checks:
  - {id: auto, kind: firewall, hint: \"{tool}: {rule} ({ports})\"}
  - {id: ipt, kind: firewall, backend: iptables, peers: [\"10.231.0.0\"]}
  - {id: ssh_only, kind: firewall, ports: [22]}
";

#[test]
fn rules_are_read_back_and_quoted() {
    let _shared = crate::common::shared();
    let Some(c) = Cluster::new(2) else { return };
    let (_dir, path) = checklist(CHECKS);
    let path = path.to_string_lossy().to_string();
    let args = ["check", "--no-shipped", "--checks", path.as_str()];
    let peer = c.addr(1);
    let env = [("MASTER_ADDR", peer.as_str()), ("MASTER_PORT", "29600")];

    // Nothing configured: open.
    let (code, r) = c.preflight(0, BIN, &args, &env);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(status(&r, "auto"), "pass", "{}", message(&r, "auto"));
    assert!(message(&r, "auto").starts_with("nft: "));
    assert_eq!(status(&r, "ipt"), "pass", "{}", message(&r, "ipt"));

    // nft: a drop for one rendezvous port, a reject for MASTER_PORT, and
    // rules that must not count (other ports, loopback, established).
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
            "add", "rule", "inet", "pf", "input", "iifname", "lo", "accept",
        ],
    );
    c.nft(
        0,
        &[
            "add", "rule", "inet", "pf", "input", "ct", "state", "invalid", "drop",
        ],
    );
    c.nft(
        0,
        &[
            "add", "rule", "inet", "pf", "input", "tcp", "dport", "22", "drop",
        ],
    );
    c.nft(
        0,
        &[
            "add", "rule", "inet", "pf", "input", "tcp", "dport", "29503", "drop",
        ],
    );
    c.nft(
        0,
        &[
            "add",
            "rule",
            "inet",
            "pf",
            "input",
            "tcp",
            "dport",
            "{ 29600, 8080 }",
            "reject",
        ],
    );
    let (code, r) = c.preflight(0, BIN, &args, &env);
    assert_eq!(code, 1);
    assert_eq!(status(&r, "auto"), "fail");
    let m = message(&r, "auto");
    assert!(
        m.contains(
            "`tcp dport 29503 drop` (table inet pf, chain input) blocks incoming TCP to port 29503"
        ),
        "{m}"
    );
    assert!(m.contains("`tcp dport { 8080, 29600 } reject` (table inet pf, chain input) blocks incoming TCP to port 29600"), "{m}");
    assert!(!m.contains("dport 22"), "{m}");
    assert_eq!(
        common::hint(&r, "auto"),
        "nft: tcp dport 29503 drop (port 29503)"
    );
    assert_eq!(status(&r, "ssh_only"), "fail");

    // iptables (nf_tables backend) in the same namespace: an output policy
    // of DROP blocks connections to the peer; a multiport REJECT is quoted
    // in iptables' own words even when read through nft.
    c.nft(0, &["flush", "ruleset"]);
    c.iptables(
        0,
        &[
            "-A",
            "INPUT",
            "-p",
            "tcp",
            "-m",
            "multiport",
            "--dports",
            "29508:29509",
            "-j",
            "REJECT",
            "--reject-with",
            "tcp-reset",
        ],
    );
    c.iptables(0, &["-A", "OUTPUT", "-o", "lo", "-j", "ACCEPT"]);
    c.iptables(0, &["-P", "OUTPUT", "DROP"]);
    let (_, r) = c.preflight(0, BIN, &args, &env);
    let m = message(&r, "auto");
    assert!(m.starts_with("nft + iptables-save: "), "{m}");
    assert!(m.contains("`-A INPUT -p tcp -m multiport --dports 29508:29509 -j REJECT --reject-with tcp-reset` (iptables table filter, chain INPUT) blocks incoming TCP to ports 29508-29509"), "{m}");
    assert!(m.contains(&format!("`policy drop` (iptables table filter, chain OUTPUT) blocks outgoing TCP to ports 29500-29510, port 29600 and the data ports (ephemeral range, sampled at 32768) (to {peer})")), "{m}");
    let m = message(&r, "ipt");
    assert!(m.starts_with("iptables-save: "), "{m}");
    assert!(m.contains("--dports 29508:29509"), "{m}");
    assert_eq!(
        status(&r, "ssh_only"),
        "fail",
        "output policy drop blocks port 22 to the peer"
    );

    // An accept for the cluster subnet ahead of the drop policy opens it.
    c.iptables(
        0,
        &[
            "-I",
            "OUTPUT",
            "-d",
            &format!("10.231.{}.0/24", c.subnet),
            "-j",
            "ACCEPT",
        ],
    );
    c.iptables(
        0,
        &[
            "-D",
            "INPUT",
            "-p",
            "tcp",
            "-m",
            "multiport",
            "--dports",
            "29508:29509",
            "-j",
            "REJECT",
            "--reject-with",
            "tcp-reset",
        ],
    );
    let (code, r) = c.preflight(0, BIN, &args, &env);
    assert_eq!(status(&r, "auto"), "pass", "{}", message(&r, "auto"));
    assert_eq!(
        status(&r, "ssh_only"),
        "pass",
        "{}",
        message(&r, "ssh_only")
    );
    // A peer outside the accepted subnet is still blocked.
    assert_eq!(status(&r, "ipt"), "fail");
    assert!(
        message(&r, "ipt").contains("(to 10.231.0.0)"),
        "{}",
        message(&r, "ipt")
    );
    assert_eq!(code, 1, "{r:#}");
}

#[test]
fn missing_tools_skip_with_the_reason() {
    let _shared = crate::common::shared();
    // PATH without nft or iptables-save.
    let empty = tempfile::tempdir().unwrap();
    let (_dir, path) = checklist("checks:\n  - {id: fw, kind: firewall}\n");
    let bin_path = empty.path().to_string_lossy().to_string();
    let out = std::process::Command::new(BIN)
        .args(["check", "--no-shipped", "--format", "json", "--checks"])
        .arg(&path)
        .env_clear()
        .env("PATH", &bin_path)
        .output()
        .unwrap();
    let r = common::report_of(&out);
    assert_eq!(status(&r, "fw"), "skip");
    assert!(message(&r, "fw").contains("neither nft nor iptables-save is installed"));
}

#[test]
fn a_drop_policy_that_opens_only_the_rendezvous_blocks_data_ports() {
    let _shared = crate::common::shared();
    let Some(c) = Cluster::new(1) else { return };
    c.nft(0, &["add", "table", "inet", "pf"]);
    c.nft(
        0,
        &[
            "add",
            "chain",
            "inet",
            "pf",
            "input",
            "{ type filter hook input priority 0; policy drop; }",
        ],
    );
    c.nft(
        0,
        &[
            "add",
            "rule",
            "inet",
            "pf",
            "input",
            "ct",
            "state",
            "established,related",
            "accept",
        ],
    );
    c.nft(
        0,
        &[
            "add",
            "rule",
            "inet",
            "pf",
            "input",
            "tcp",
            "dport",
            "29500-29510",
            "accept",
        ],
    );
    let (_dir, path) = checklist(
        "checks:\n  - {id: fw, kind: firewall}\n  - {id: rdzv_only, kind: firewall, data_ports: false}\n",
    );
    let path = path.to_string_lossy().to_string();
    let (_, r) = c.preflight(0, BIN, &["check", "--no-shipped", "--checks", &path], &[]);
    assert_eq!(
        message(&r, "fw"),
        "nft: `policy drop` (table inet pf, chain input) blocks incoming TCP to the data ports (ephemeral range, sampled at 32768)"
    );
    assert_eq!(
        status(&r, "rdzv_only"),
        "pass",
        "{}",
        message(&r, "rdzv_only")
    );
}

#[test]
fn legacy_iptables_rules_are_read_next_to_nft() {
    let _shared = crate::common::shared();
    let Some(c) = Cluster::new(1) else { return };
    if c.exec(
        0,
        &[
            "iptables-legacy",
            "-w",
            "-A",
            "INPUT",
            "-p",
            "tcp",
            "--dport",
            "29507",
            "-j",
            "DROP",
        ],
    )
    .status
    .code()
        != Some(0)
    {
        common::netns::skip_or_panic("iptables-legacy is not usable here");
        return;
    }
    let (_dir, path) = checklist("checks:\n  - {id: fw, kind: firewall}\n");
    let path = path.to_string_lossy().to_string();
    let (_, r) = c.preflight(0, BIN, &["check", "--no-shipped", "--checks", &path], &[]);
    assert_eq!(
        message(&r, "fw"),
        "nft + iptables-legacy-save: `-A INPUT -p tcp -m tcp --dport 29507 -j DROP` (iptables-legacy table filter, chain INPUT) blocks incoming TCP to port 29507"
    );
}

/// The cluster stage's probes listen in PREFLIGHT_PROBE_PORTS (the Slurm
/// prolog sets it from the site's `probe_ports`): a rule that drops that
/// range is this node's fault, and the firewall check must say so, or the
/// node its peers cannot reach is not told apart from the peers.
#[test]
fn the_probe_range_is_checked_where_the_cluster_stage_listens() {
    let _shared = crate::common::shared();
    let Some(c) = Cluster::new(1) else { return };
    c.nft_rule(
        0,
        "input",
        &["ct", "state", "new", "tcp", "dport", "29450-29459", "drop"],
    );
    let (_dir, path) = checklist("checks:\n  - {id: fw, kind: firewall, data_ports: false}\n");
    let path = path.to_string_lossy().to_string();
    let args = ["check", "--no-shipped", "--checks", path.as_str()];

    let (_, r) = c.preflight(0, BIN, &args, &[]);
    assert_eq!(status(&r, "fw"), "pass", "{}", message(&r, "fw"));

    let (code, r) = c.preflight(0, BIN, &args, &[("PREFLIGHT_PROBE_PORTS", "29450-29459")]);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(status(&r, "fw"), "fail", "{r:#}");
    assert!(
        message(&r, "fw").contains("blocks incoming TCP to ports 29450-29459"),
        "{}",
        message(&r, "fw")
    );

    let (code, r) = c.preflight(0, BIN, &args, &[("PREFLIGHT_PROBE_PORTS", "29459-29450")]);
    assert_eq!(status(&r, "fw"), "error", "{r:#}");
    assert_eq!(code, 3, "{r:#}");
    assert!(
        message(&r, "fw").starts_with("PREFLIGHT_PROBE_PORTS=`29459-29450`: "),
        "{}",
        message(&r, "fw")
    );
}
