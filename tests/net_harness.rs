//! The namespace harness itself: hosts reach each other, and everything is
//! removed even when the test panics.

mod common;

use common::netns::Cluster;

fn namespaces() -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn hosts_reach_each_other_and_teardown_survives_a_panic() {
    let mut names = Vec::new();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let Some(c) = Cluster::new(3) else {
            return false;
        };
        names = c.hosts.iter().map(|h| h.ns.clone()).collect();
        names.push(c.bridge.clone());
        c.listen(2, 29500, &[]);
        let connect = format!(
            "import socket; socket.create_connection(('{}', 29500), 5); print('ok')",
            c.addr(2)
        );
        assert_eq!(c.must(0, &["python3", "-c", &connect]).trim(), "ok");
        assert!(namespaces().contains(&c.hosts[0].ns));
        panic!("deliberate");
    }));
    if names.is_empty() {
        return; // skipped: the machine cannot build namespaces
    }
    assert!(outcome.is_err(), "the closure panics on purpose");
    let left = namespaces();
    for ns in &names[..names.len() - 1] {
        assert!(!left.contains(ns.as_str()), "{ns} left behind: {left}");
    }
    let links = std::process::Command::new("ip")
        .args(["link"])
        .output()
        .unwrap();
    let bridge = names.last().unwrap();
    assert!(!String::from_utf8_lossy(&links.stdout).contains(bridge.as_str()));
}

#[test]
fn preflight_runs_on_every_host_at_once() {
    let Some(c) = Cluster::new(3) else { return };
    for h in 0..3 {
        c.listen(h, 29500, &[]);
    }
    c.iptables(
        2,
        &[
            "-A", "INPUT", "-i", "eth0", "-p", "tcp", "--dport", "29500", "-j", "DROP",
        ],
    );
    let (_dir, path) = common::checklist(
        "checks:\n  - {id: next, kind: tcp_connect, host_var: NEXT_HOST, port: 29500, connect_timeout: 1s}\n",
    );
    let path = path.to_string_lossy().to_string();
    let children: Vec<_> = (0..3)
        .map(|h| {
            let next = c.addr((h + 1) % 3);
            c.spawn_preflight(
                h,
                common::BIN,
                &[
                    "check",
                    "--no-shipped",
                    "--format",
                    "json",
                    "--checks",
                    &path,
                ],
                &[("NEXT_HOST", next.as_str())],
            )
        })
        .collect();
    let outcomes: Vec<String> = children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            common::measured(&r, "next").to_string()
        })
        .collect();
    assert_eq!(outcomes, ["connected", "timed_out", "connected"]);
}
