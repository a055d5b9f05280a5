//! The namespace harness itself: hosts reach each other, and everything is
//! removed even when the test panics.

use crate::common;

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
    let _shared = crate::common::shared();
    // Built outside the caught region: a machine that cannot build
    // namespaces skips here, or fails under PREFLIGHT_REQUIRE_NETNS=1.
    let Some(c) = Cluster::new(3) else { return };
    let mut names: Vec<String> = c.hosts.iter().map(|h| h.ns.clone()).collect();
    names.push(c.bridge.clone());
    let mut reached = None;
    let mut listed = None;
    // The cluster moves into the closure, so the deliberate panic drops it
    // while unwinding: teardown must still remove everything.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let c = c;
        c.listen(2, 29500, &[]);
        let connect = format!(
            "import socket; socket.create_connection(('{}', 29500), 5); print('ok')",
            c.addr(2)
        );
        reached = Some(c.must(0, &["python3", "-c", &connect]).trim().to_string());
        listed = Some(namespaces().contains(&c.hosts[0].ns));
        panic!("deliberate");
    }));
    // What the test is about, asserted outside the caught region.
    assert_eq!(
        reached.as_deref(),
        Some("ok"),
        "host 0 did not reach host 2"
    );
    assert_eq!(
        listed,
        Some(true),
        "the namespace was not listed while it lived"
    );
    let payload = outcome.expect_err("the closure panics on purpose");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"deliberate"));
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
    let _shared = crate::common::shared();
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
            let r = common::report_of(&out);
            common::measured(&r, "next").to_string()
        })
        .collect();
    assert_eq!(outcomes, ["connected", "timed_out", "connected"]);
}
