//! What the tools cannot say is never a pass: unreadable or partial
//! recordings, interfaces down, cards a tool leaves unlisted, no link state.

use super::*;

/// What only one node shows: a Gaudi's scale-out interface down (a node
/// made here: one Gaudi 3 on the PCI bus, its three interfaces, one down,
/// one at half rate), Intel cards xpu-smi does not list, and an amd-smi
/// from before ROCm 6.4 that prints no XGMI link state.
#[test]
fn interfaces_down_cards_unlisted_and_no_link_state() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let dev = root.join("sys/devices/pci0000:e0/0000:e0:01.0/0000:e9:00.0");
    let put = |p: &std::path::Path, text: &str| {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("{text}\n")).unwrap();
    };
    put(&dev.join("vendor"), "0x1da3");
    put(&dev.join("device"), "0x1060");
    put(&dev.join("class"), "0x120000");
    std::fs::create_dir_all(root.join("sys/bus/pci/drivers/habanalabs")).unwrap();
    std::os::unix::fs::symlink("../../../../bus/pci/drivers/habanalabs", dev.join("driver"))
        .unwrap();
    std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:e0/0000:e0:01.0/0000:e9:00.0",
        root.join("sys/bus/pci/devices/0000:e9:00.0"),
    )
    .unwrap();
    for (name, port, state, speed) in [
        ("ens1", 21, "up", "200000"),
        ("ens2", 22, "down", "-1"),
        ("ens3", 23, "up", "100000"),
    ] {
        let n = dev.join("net").join(name);
        put(&n.join("dev_port"), &port.to_string());
        put(&n.join("operstate"), state);
        put(&n.join("speed"), speed);
    }
    let links = dir.path().join("links.txt");
    std::fs::write(&links, "=== 0000:e9:00.0 ===\nport  0:\tUP\nport  1:\tUP\n").unwrap();
    let list = dir.path().join("checks.yaml");
    // Three of the four cards, as xpu-smi would list them with a mask
    // (xpu-smi's own JSON, no report: untyped).
    let health: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(rec("intel-tools", "health-healthy.json")).unwrap(),
    )
    .unwrap();
    let mut three = health.clone();
    three["device_list"].as_array_mut().unwrap().pop();
    let three_path = dir.path().join("three.json");
    std::fs::write(&three_path, three.to_string()).unwrap();
    let old_xgmi = dir.path().join("xgmi-6.3.json");
    std::fs::write(
        &old_xgmi,
        r#"[{"gpu": 0, "bdf": "0000:05:00.0", "link_metrics": {"bit_rate": {"value": 32, "unit": "Gb/s"}, "max_bandwidth": {"value": 512, "unit": "Gb/s"}, "link_type": "XGMI", "links": []}}]"#,
    )
    .unwrap();
    std::fs::write(
        &list,
        checks(&[
            format!(
                "{{id: nic, kind: hl_smi, subject: nic_ports, hl_smi_links: \"{}\"}}",
                links.display()
            ),
            format!(
                "{{id: xgmi, kind: amd_smi, subject: xgmi, amd_smi_xgmi: \"{}\"}}",
                old_xgmi.display()
            ),
        ]),
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "--no-shipped", "--format", "json", "--checks"])
        .arg(&list)
        .arg("--root")
        .arg(&root)
        .output()
        .unwrap();
    let r = crate::common::report_of(&out);
    assert_eq!(
        crate::common::message(&r, "nic"),
        "0000:e9:00.0: interface ens2 (port 22) is down; 0000:e9:00.0: interface ens3 (port 23) runs at 100 Gb/s, not 200 (the generation's rate)"
    );
    assert_eq!(crate::common::status(&r, "xgmi"), "skip");
    assert!(
        crate::common::message(&r, "xgmi").contains(
            "holds no XGMI link state (amd-smi before ROCm 6.4 prints only link metrics)"
        )
    );
    let unlisted = run(
        "intel-max-xpu",
        &checks(&[format!(
            "{{id: cards, kind: xpu_smi, subject: health, xpu_smi_health: \"{}\"}}",
            three_path.display()
        )]),
    );
    assert_eq!(unlisted.status("cards"), "fail");
    assert!(
        unlisted
            .message("cards")
            .starts_with("xpu-smi lists 3 of the node's 4 Intel GPUs"),
        "{}",
        unlisted.message("cards")
    );
}

/// From the review: what a tool could not say is never a pass, a count
/// past u64 stays a failure, a rest state is no fault, and a link missing
/// everywhere is one.
#[test]
fn what_the_tools_cannot_say_is_never_a_pass() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    // amd-smi's own JSON, no report: untyped.
    let healthy: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(rec("amd-tools", "metric-healthy.json")).unwrap(),
    )
    .unwrap();
    // GPU 2 says N/A for its ECC; GPU 4 counts past u64 with one deferred.
    let mut na = healthy.clone();
    na[2]["ecc"] = "N/A".into();
    let na = write("na.json", na.to_string());
    let mut huge = healthy.clone();
    let huge_text = {
        huge[4]["ecc"]["total_deferred_count"] = 1.into();
        huge.to_string().replacen(
            "\"total_uncorrectable_count\":0",
            "\"total_uncorrectable_count\":1e30",
            5,
        )
    };
    assert!(huge_text.contains("1e30"));
    let huge = write("huge.json", huge_text);
    let pages_na = write(
        "pages.json",
        r#"[{"gpu": 0, "retired": "N/A", "pending": "N/A", "un_res": "N/A"}]"#.into(),
    );
    let rocm_unknown = write(
        "rocm.json",
        r#"{"card0": {"XGMI Error count": "0"}, "card1": {"XGMI Error count": "0"}, "system": {"(Topology) Link type between DRM devices 0 and 1": "XXXX"}}"#.into(),
    );
    let rocm_pcie = write(
        "rocm-pcie.json",
        r#"{"card0": {"XGMI Error count": "0"}, "card1": {"XGMI Error count": "0"}, "system": {"(Topology) Link type between DRM devices 0 and 1": "PCIE"}}"#.into(),
    );
    let r = run(
        "amd-mi300x",
        &checks(&[
            format!("{{id: na, kind: amd_smi, subject: ecc, amd_smi_metric: \"{na}\"}}"),
            format!("{{id: huge, kind: amd_smi, subject: ecc, amd_smi_metric: \"{huge}\"}}"),
            format!(
                "{{id: pages, kind: amd_smi, subject: reset, amd_smi_bad_pages: \"{pages_na}\"}}"
            ),
            format!(
                "{{id: nomax, kind: amd_smi, subject: pcie, amd_smi_metric: \"{}\"}}",
                rec("amd-tools", "metric-healthy.json")
            ),
            format!(
                "{{id: xxxx, kind: amd_smi, subject: xgmi, rocm_smi_json: \"{rocm_unknown}\"}}"
            ),
            format!(
                "{{id: pcie_only, kind: amd_smi, subject: xgmi, rocm_smi_json: \"{rocm_pcie}\"}}"
            ),
            format!(
                "{{id: idle, kind: amd_smi, subject: throttle, amd_smi_metric: \"{}\"}}",
                rec("amd-tools", "metric-broken.json")
            ),
        ]),
    );
    assert_eq!(r.status("na"), "warn");
    assert!(
        r.message("na")
            .contains("not judged: GPU 2 (0000:46:00.0): no uncorrectable count (N/A)"),
        "{}",
        r.message("na")
    );
    assert_eq!(r.status("huge"), "fail");
    assert_eq!(r.status("pages"), "warn");
    assert!(
        r.message("pages")
            .contains("GPU 0 (0000:05:00.0): bad pages N/A"),
        "{}",
        r.message("pages")
    );
    assert_eq!(r.status("nomax"), "skip");
    assert!(
        r.message("nomax").contains("no maximum to compare with"),
        "{}",
        r.message("nomax")
    );
    assert_eq!(r.status("xxxx"), "warn");
    assert_eq!(r.status("pcie_only"), "skip");
    // Only GPU 5's HBM heat: power capping, idle and partition states are not faults.
    assert_eq!(
        r.message("idle"),
        "GPU 5 (0000:a6:00.0): hbm_thermal violation active (37% of the time)"
    );

    // xpu-smi's own JSON, no report: untyped.
    let health: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(rec("intel-tools", "health-healthy.json")).unwrap(),
    )
    .unwrap();
    let mut mixed = health.clone();
    mixed["device_list"][0]["frequency"] = serde_json::json!({"status": "Warning",
        "description": "Tile 0 frequency throttled due to software supplied frequency range. Tile 1 frequency throttled due to thermal excursion."});
    mixed["device_list"][1]["frequency"] = serde_json::json!({"status": "Warning",
        "description": "Device frequency throttled due to software supplied frequency range."});
    mixed["device_list"][2]["core_temperature"] = serde_json::json!({"status": "Unknown", "description": "Health cannot be determined for temperature sensors."});
    let mixed = write("mixed.json", mixed.to_string());
    let matrix = std::fs::read_to_string(rec("intel-tools", "topology-healthy.txt")).unwrap();
    let pcie_only = write(
        "pcie-only.txt",
        matrix.replace("XL8 ", "SYS ").replace("XL* ", "SYS "),
    );
    let r = run(
        "intel-max-xpu",
        &checks(&[
            format!("{{id: thr, kind: xpu_smi, subject: throttle, xpu_smi_health: \"{mixed}\"}}"),
            format!("{{id: health, kind: xpu_smi, subject: health, xpu_smi_health: \"{mixed}\"}}"),
            format!(
                "{{id: nolinks, kind: xpu_smi, subject: xe_link, xpu_smi_health: \"{}\", xpu_smi_topology: \"{pcie_only}\"}}",
                rec("intel-tools", "health-healthy.json")
            ),
            format!(
                "{{id: level, kind: xpu_smi, subject: diag, xpu_smi_diag: \"{}\"}}",
                rec("intel-tools", "diag-l3-memory-fail.json")
            ),
        ]),
    );
    assert_eq!(r.status("thr"), "fail");
    assert!(
        r.message("thr")
            .starts_with("GPU 0 (0000:16:00.0): frequency Warning"),
        "{}",
        r.message("thr")
    );
    assert!(
        !r.message("thr").contains("GPU 1 ("),
        "{}",
        r.message("thr")
    );
    assert_eq!(r.status("health"), "warn");
    assert!(
        r.message("health")
            .contains("not judged: GPU 2 (0000:98:00.0): core temperature Unknown"),
        "{}",
        r.message("health")
    );
    assert_eq!(r.status("nolinks"), "fail");
    assert!(
        r.message("nolinks")
            .contains("no Xe Link between any two of the 4 cards"),
        "{}",
        r.message("nolinks")
    );
    assert_eq!(r.status("level"), "error");
    assert!(
        r.message("level")
            .ends_with("is a level 3 diagnostic where the check asks for level 1")
    );

    let query = std::fs::read_to_string(rec("habana-tools", "query-healthy.csv")).unwrap();
    let ecc_na = write(
        "ecc-na.csv",
        query.replacen(
            "1.17.0-28a11ca, 0, 0, 0, 0, 0, 0,",
            "1.17.0-28a11ca, N/A, N/A, 0, 0, N/A, N/A,",
            1,
        ),
    );
    let report = std::fs::read_to_string(rec("habana-tools", "report-healthy.txt")).unwrap();
    let maybe = write(
        "maybe.txt",
        report.replacen(
            "Pending                 : No",
            "Pending                 : Unknown",
            1,
        ),
    );
    let r = run(
        "gaudi2-hls",
        &checks(&[
            format!("{{id: ecc, kind: hl_smi, subject: ecc, hl_smi_query: \"{ecc_na}\"}}"),
            format!("{{id: rows, kind: hl_smi, subject: reset, hl_smi_report: \"{maybe}\"}}"),
            format!(
                "{{id: uncabled, kind: hl_smi, subject: nic_ports, scale_out: false, hl_smi_links: \"{}\"}}",
                rec("habana-tools", "links-healthy.txt")
            ),
        ]),
    );
    assert_eq!(r.status("ecc"), "warn");
    assert!(
        r.message("ecc")
            .contains("not judged: AIP 0 (0000:19:00.0): no uncorrectable count (N/A)"),
        "{}",
        r.message("ecc")
    );
    assert_eq!(r.status("rows"), "warn");
    // A device listing fewer ports than the others, all up.
    let links = std::fs::read_to_string(rec("habana-tools", "links-healthy.txt")).unwrap();
    let mut seen = 0;
    let fewer: Vec<&str> = links
        .lines()
        .filter(|l| {
            if l.starts_with("=== ") {
                seen += 1;
            }
            !(seen == 1
                && (l.starts_with("port 19:")
                    || l.starts_with("port 20:")
                    || l.starts_with("port 21:")))
        })
        .collect();
    let fewer = write("fewer.txt", fewer.join("\n") + "\n");
    let r2 = run(
        "gaudi2-hls",
        &checks(&[format!(
            "{{id: fewer, kind: hl_smi, subject: nic_ports, hl_smi_links: \"{fewer}\"}}"
        )]),
    );
    assert_eq!(
        r2.message("fewer"),
        "0000:19:00.0: hl-smi lists 18 ports up where 21 are expected as most devices here"
    );
    assert_eq!(r.status("uncabled"), "pass");
    assert_eq!(
        r.measured("uncabled"),
        "168 of 168 ports up on 8 devices; 0 scale-out interfaces"
    );
}
