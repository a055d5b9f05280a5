//! tcp_connect against real hosts in network namespaces: a listener, an
//! empty port, iptables and nft DROP and REJECT rules, an ICMP
//! host-unreachable, and a name that does not resolve.

use crate::common;

use common::netns::Cluster;
use common::{BIN, checklist, measured, message, status};

#[test]
fn outcomes_are_classified_by_cause() {
    let _shared = crate::common::shared();
    let Some(c) = Cluster::new(2) else { return };
    let target = c.addr(1);
    c.listen(1, 29500, &[]);
    for port in ["29502", "29504", "29506"] {
        c.listen(1, port.parse().unwrap(), &[]);
    }
    // Filtered ports have listeners too: only the rule explains the result.
    c.iptables(
        1,
        &[
            "-A",
            "INPUT",
            "-i",
            "eth0",
            "-p",
            "tcp",
            "--dport",
            "29502",
            "-j",
            "REJECT",
            "--reject-with",
            "tcp-reset",
        ],
    );
    c.iptables(
        1,
        &[
            "-A", "INPUT", "-i", "eth0", "-p", "tcp", "--dport", "29504", "-j", "DROP",
        ],
    );
    c.iptables(
        1,
        &[
            "-A",
            "INPUT",
            "-i",
            "eth0",
            "-p",
            "tcp",
            "--dport",
            "29505",
            "-j",
            "REJECT",
            "--reject-with",
            "icmp-host-unreachable",
        ],
    );
    c.nft(1, &["add", "table", "inet", "pf"]);
    c.nft(
        1,
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
        1,
        &[
            "add", "rule", "inet", "pf", "input", "tcp", "dport", "29506", "drop",
        ],
    );
    c.nft(
        1,
        &[
            "add", "rule", "inet", "pf", "input", "tcp", "dport", "29507", "reject",
        ],
    );

    let entry = |id: &str, port: &str| {
        format!(
            "  - {{id: {id}, kind: tcp_connect, host: \"{target}\", port: {port}, connect_timeout: 1500ms, hint: \"{{outcome}}: {{advice}}\"}}\n"
        )
    };
    let mut yaml = String::from("checks:\n");
    for (id, port) in [
        ("open", "29500"),
        ("closed", "29501"),
        ("ipt_reject", "29502"),
        ("ipt_drop", "29504"),
        ("ipt_unreachable", "29505"),
        ("nft_drop", "29506"),
        ("nft_reject", "29507"),
    ] {
        yaml.push_str(&entry(id, port));
    }
    yaml.push_str("  - {id: unresolved, kind: tcp_connect, host: no-such-host.invalid, port: 1, connect_timeout: 3s}\n");
    yaml.push_str(
        "  - {id: from_env, kind: tcp_connect, host_var: MASTER_ADDR, port_var: MASTER_PORT}\n",
    );
    let (_dir, path) = checklist(&yaml);
    let path = path.to_string_lossy().to_string();
    let (code, report) = c.preflight(
        0,
        BIN,
        &["check", "--no-shipped", "--checks", &path],
        &[("MASTER_ADDR", &target), ("MASTER_PORT", "29500")],
    );
    assert_eq!(code, 1, "{report:#}");
    for (id, want_status, outcome) in [
        ("open", "pass", "connected"),
        ("from_env", "pass", "connected"),
        ("closed", "fail", "refused"),
        ("ipt_reject", "fail", "refused"),
        ("nft_reject", "fail", "refused"),
        ("ipt_drop", "fail", "timed_out"),
        ("nft_drop", "fail", "timed_out"),
        ("ipt_unreachable", "fail", "unreachable"),
        ("unresolved", "fail", "not_resolved"),
    ] {
        assert_eq!(
            status(&report, id),
            want_status,
            "{id}: {}",
            message(&report, id)
        );
        assert_eq!(
            measured(&report, id),
            outcome,
            "{id}: {}",
            message(&report, id)
        );
    }
    let drop = common::result(&report, "ipt_drop");
    assert!(
        drop.hint.as_deref().unwrap_or("").contains("DROP rule"),
        "{drop:#?}"
    );
    let reject = common::result(&report, "ipt_reject");
    assert!(
        reject.hint.as_deref().unwrap_or("").contains("REJECT rule"),
        "{reject:#?}"
    );
}
