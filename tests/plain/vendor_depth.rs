//! AMD Instinct, Intel Data Center GPU Max and Gaudi below the driver, on
//! recorded outputs of each vendor's own tool (fixtures/amd-tools,
//! fixtures/intel-tools, fixtures/habana-tools, made by
//! fixtures/make-vendor-tools.py) over the matching fixture nodes, run by
//! the real binary. tests/gpu/vendor-depth.sh runs the same checks for
//! real on such a node.

use std::path::PathBuf;

use crate::common::fixture_run;
use fixture_run::*;

mod gaps;

fn rec(dir: &str, name: &str) -> String {
    let p: PathBuf = fixture(dir).join(name);
    assert!(p.exists(), "{}", p.display());
    p.display().to_string()
}

fn checks(lines: &[String]) -> String {
    let mut text = String::from("checks:\n");
    for l in lines {
        text.push_str("  - ");
        text.push_str(l);
        text.push('\n');
    }
    text
}

#[test]
fn amd_checks_pass_a_healthy_mi300x_and_name_each_fault() {
    let _shared = crate::common::shared();
    let a = |n: &str| rec("amd-tools", n);
    let list = checks(&[
        format!(
            "{{id: ecc_ok, kind: amd_smi, subject: ecc, amd_smi_metric: \"{}\"}}",
            a("metric-healthy.json")
        ),
        format!(
            "{{id: ecc_bad, kind: amd_smi, subject: ecc, amd_smi_metric: \"{}\"}}",
            a("metric-broken.json")
        ),
        format!(
            "{{id: xgmi_ok, kind: amd_smi, subject: xgmi, amd_smi_xgmi: \"{}\", amd_smi_metric: \"{}\"}}",
            a("xgmi-healthy.json"),
            a("metric-healthy.json")
        ),
        format!(
            "{{id: xgmi_bad, kind: amd_smi, subject: xgmi, amd_smi_xgmi: \"{}\", amd_smi_metric: \"{}\"}}",
            a("xgmi-link-down.json"),
            a("metric-broken.json")
        ),
        format!(
            "{{id: xgmi_seven, kind: amd_smi, subject: xgmi, links: 8, amd_smi_xgmi: \"{}\"}}",
            a("xgmi-healthy.json")
        ),
        format!(
            "{{id: xgmi_twice, kind: amd_smi, subject: xgmi, amd_smi_xgmi: \"{}\"}}",
            a("xgmi-gpu-twice.json")
        ),
        format!(
            "{{id: rocm_ok, kind: amd_smi, subject: xgmi, rocm_smi_json: \"{}\"}}",
            a("rocm-smi-healthy.json")
        ),
        format!(
            "{{id: rocm_bad, kind: amd_smi, subject: xgmi, rocm_smi_json: \"{}\"}}",
            a("rocm-smi-broken.json")
        ),
        format!(
            "{{id: thr_ok, kind: amd_smi, subject: throttle, amd_smi_metric: \"{}\"}}",
            a("metric-healthy.json")
        ),
        format!(
            "{{id: thr_bad, kind: amd_smi, subject: throttle, amd_smi_metric: \"{}\"}}",
            a("metric-broken.json")
        ),
        format!(
            "{{id: pcie_ok, kind: amd_smi, subject: pcie, amd_smi_metric: \"{}\", amd_smi_static: \"{}\"}}",
            a("metric-healthy.json"),
            a("static.json")
        ),
        format!(
            "{{id: pcie_bad, kind: amd_smi, subject: pcie, amd_smi_metric: \"{}\", amd_smi_static: \"{}\"}}",
            a("metric-broken.json"),
            a("static.json")
        ),
        format!(
            "{{id: reset_ok, kind: amd_smi, subject: reset, amd_smi_bad_pages: \"{}\", amd_smi_static: \"{}\"}}",
            a("bad-pages-healthy.json"),
            a("static.json")
        ),
        format!(
            "{{id: reset_bad, kind: amd_smi, subject: reset, amd_smi_bad_pages: \"{}\"}}",
            a("bad-pages-pending.json")
        ),
    ]);
    let list = list
        + &checks(&[
            format!(
                "{{id: ras_ok, kind: amd_smi, subject: ecc, amd_smi_metric: \"{}\", amd_smi_static: \"{}\"}}",
                a("metric-healthy.json"),
                a("static.json")
            ),
            format!(
                "{{id: ras_off, kind: amd_smi, subject: ecc, amd_smi_metric: \"{}\", amd_smi_static: \"{}\"}}",
                a("metric-healthy.json"),
                a("static-ras-off.json")
            ),
        ])
        .replacen("checks:\n", "", 1);
    let r = run("amd-mi300x", &list);
    for id in [
        "ecc_ok", "ras_ok", "xgmi_ok", "rocm_ok", "thr_ok", "pcie_ok", "reset_ok",
    ] {
        assert_eq!(r.status(id), "pass", "{id}: {}", r.message(id));
    }
    assert_eq!(
        r.message("xgmi_ok"),
        format!(
            "56 XGMI links up on 8 GPUs, from {}",
            a("xgmi-healthy.json")
        )
    );
    assert_eq!(
        r.message("ras_off"),
        "GPU 4 (0000:85:00.0): RAS error counting for UMC is DISABLED where 7 of 8 GPUs have it enabled: its errors go uncounted"
    );
    assert_eq!(
        r.message("ecc_bad"),
        "GPU 3 (0000:65:00.0): 2 uncorrectable ECC errors in UMC 2 (at most 0)"
    );
    // One link down shows at both its ends; GPU 3 also says XGMI errors.
    assert_eq!(
        r.message("xgmi_bad"),
        "GPU 3 (0000:65:00.0): XGMI port 5 down (6 up); GPU 6 (0000:c6:00.0): XGMI port 3 down (6 up); GPU 3 (0000:65:00.0): XGMI error status AMDSMI_XGMI_STATUS_ERROR"
    );
    assert_eq!(r.status("xgmi_seven"), "fail");
    // A GPU listed twice is a document amd-smi did not write whole: never
    // judged as the first entry alone.
    assert_eq!(r.status("xgmi_twice"), "error");
    assert_eq!(
        r.message("xgmi_twice"),
        format!(
            "{}: GPU 6 is listed twice (at 0000:c6:00.0, then at 0000:e5:00.0): not one amd-smi document",
            a("xgmi-gpu-twice.json")
        )
    );
    assert!(
        r.message("xgmi_seven")
            .contains("7 XGMI links up where 8 are expected")
    );
    assert!(
        r.message("rocm_bad")
            .contains("GPU 3 (0000:65:00.0) and GPU 6 (0000:c6:00.0) reach each other over PCIE")
    );
    assert_eq!(
        r.message("thr_bad"),
        "GPU 5 (0000:a6:00.0): hbm_thermal violation active (37% of the time)"
    );
    assert_eq!(
        r.message("pcie_bad"),
        "GPU 6 (0000:c6:00.0): PCIe x8 of x16"
    );
    assert_eq!(
        r.message("reset_bad"),
        "GPU 3 (0000:65:00.0): 2 bad pages pending retirement until the GPU is reset"
    );
}

#[test]
fn intel_checks_read_diag_health_and_the_xe_link_matrix() {
    let _shared = crate::common::shared();
    let i = |n: &str| rec("intel-tools", n);
    let list = checks(&[
        format!(
            "{{id: d1, kind: xpu_smi, subject: diag, xpu_smi_diag: \"{}\"}}",
            i("diag-l1-pass.json")
        ),
        format!(
            "{{id: d1root, kind: xpu_smi, subject: diag, xpu_smi_diag: \"{}\"}}",
            i("diag-l1-not-root.json")
        ),
        format!(
            "{{id: d3, kind: xpu_smi, subject: diag, level: 3, xpu_smi_diag: \"{}\"}}",
            i("diag-l3-memory-fail.json")
        ),
        format!(
            "{{id: busy, kind: xpu_smi, subject: diag, xpu_smi_diag: \"{}\"}}",
            i("diag-busy.json")
        ),
        format!(
            "{{id: h_ok, kind: xpu_smi, subject: health, xpu_smi_health: \"{}\"}}",
            i("health-healthy.json")
        ),
        format!(
            "{{id: h_bad, kind: xpu_smi, subject: health, xpu_smi_health: \"{}\"}}",
            i("health-broken.json")
        ),
        format!(
            "{{id: x_ok, kind: xpu_smi, subject: xe_link, xpu_smi_health: \"{}\", xpu_smi_topology: \"{}\"}}",
            i("health-healthy.json"),
            i("topology-healthy.txt")
        ),
        format!(
            "{{id: x_bad, kind: xpu_smi, subject: xe_link, xpu_smi_health: \"{}\", xpu_smi_topology: \"{}\"}}",
            i("health-broken.json"),
            i("topology-link-down.txt")
        ),
        format!(
            "{{id: t_ok, kind: xpu_smi, subject: throttle, xpu_smi_health: \"{}\"}}",
            i("health-healthy.json")
        ),
        format!(
            "{{id: t_bad, kind: xpu_smi, subject: throttle, xpu_smi_health: \"{}\"}}",
            i("health-broken.json")
        ),
    ]);
    let r = run("intel-max-xpu", &list);
    for id in ["d1", "h_ok", "x_ok", "t_ok"] {
        assert_eq!(r.status(id), "pass", "{id}: {}", r.message(id));
    }
    assert_eq!(
        r.message("d1"),
        "level 1: 5 components on device 0, 1, 2, 3, all passed"
    );
    assert_eq!(r.status("d1root:software_library"), "fail");
    assert!(r.message("d1root:software_library").starts_with("Software Library: Fail to check libraries. GPU 0 : Fail to check libraries. Please run this command with root privilege."));
    assert_eq!(r.status("d3:memory_error"), "fail");
    assert_eq!(
        r.message("d3:memory_error"),
        "Memory Error: Fail to check memory error. GPU 2 : Fail to check memory error. 3 errors were found."
    );
    assert_eq!(r.status("busy"), "error");
    assert!(
        r.message("busy").ends_with(
            "xpu-smi said: last diagnostic task on the device is not completed (errno 15)"
        )
    );
    assert_eq!(
        r.message("h_bad"),
        "GPU 2 (0000:98:00.0): core temperature Warning: Unhealthy temperature sensor value, 106.50 >= 105 (threshold); GPU 2 (0000:98:00.0): memory Warning: Excessive correctable errors have been detected on one or more channels. Device should be reset."
    );
    let x = r.message("x_bad");
    for part in [
        "GPU 1 (0000:38:00.0): xe link port Critical: Ports Tile0-2 connection instabilities",
        "GPU 1 (0000:38:00.0)/0 to GPU 2 (0000:98:00.0)/1: `SYS` (PCIe only)",
        "GPU 1 (0000:38:00.0)/1 to GPU 2 (0000:98:00.0)/0: Xe Link with 4 lanes where links here have 8",
    ] {
        assert!(x.contains(part), "{x}");
    }
    assert_eq!(
        r.message("t_bad"),
        "GPU 3 (0000:b8:00.0): frequency Warning: Tile 0 frequency throttled due to thermal excursion. Tile 1 frequency throttled due to thermal excursion."
    );
}

#[test]
fn gaudi_checks_name_devices_ports_and_modules() {
    let _shared = crate::common::shared();
    let h = |n: &str| rec("habana-tools", n);
    let list = checks(&[
        format!(
            "{{id: dev_ok, kind: hl_smi, subject: devices, hl_smi_query: \"{}\"}}",
            h("query-healthy.csv")
        ),
        format!(
            "{{id: dev_bad, kind: hl_smi, subject: devices, hl_smi_query: \"{}\"}}",
            h("query-broken.csv")
        ),
        format!(
            "{{id: ecc_ok, kind: hl_smi, subject: ecc, hl_smi_query: \"{}\"}}",
            h("query-healthy.csv")
        ),
        format!(
            "{{id: ecc_bad, kind: hl_smi, subject: ecc, hl_smi_query: \"{}\"}}",
            h("query-broken.csv")
        ),
        format!(
            "{{id: thr_ok, kind: hl_smi, subject: throttle, hl_smi_report: \"{}\"}}",
            h("report-healthy.txt")
        ),
        format!(
            "{{id: thr_bad, kind: hl_smi, subject: throttle, hl_smi_report: \"{}\"}}",
            h("report-broken.txt")
        ),
        format!(
            "{{id: rst_ok, kind: hl_smi, subject: reset, hl_smi_report: \"{}\"}}",
            h("report-healthy.txt")
        ),
        format!(
            "{{id: rst_bad, kind: hl_smi, subject: reset, hl_smi_report: \"{}\"}}",
            h("report-broken.txt")
        ),
        format!(
            "{{id: nic_ok, kind: hl_smi, subject: nic_ports, hl_smi_links: \"{}\"}}",
            h("links-healthy.txt")
        ),
        format!(
            "{{id: nic_bad, kind: hl_smi, subject: nic_ports, hl_smi_links: \"{}\"}}",
            h("links-two-down.txt")
        ),
        format!(
            "{{id: nic_rate, kind: hl_smi, subject: nic_ports, speed_gbps: 200, hl_smi_links: \"{}\"}}",
            h("links-healthy.txt")
        ),
    ]);
    let r = run("gaudi2-hls", &list);
    for id in ["dev_ok", "ecc_ok", "thr_ok", "rst_ok", "nic_ok"] {
        assert_eq!(r.status(id), "pass", "{id}: {}", r.message(id));
    }
    assert!(
        r.message("dev_ok")
            .starts_with("8 devices (HL-225), driver 1.17.0-28a11ca")
    );
    assert_eq!(
        r.message("dev_bad"),
        "0000:cd:00.0 is a Gaudi device on the PCI bus that hl-smi does not list; module id 4 is reported by AIP 5 (0000:b4:00.0) and AIP 6 (0000:cc:00.0): a module id names one OAM slot; HABANA_VISIBLE_MODULES=0,1,2,3,4,5,6,7 names module id `5`, which hl-smi does not list (it lists 0, 1, 2, 3, 4, 6); HABANA_VISIBLE_MODULES=0,1,2,3,4,5,6,7 names module id `7`, which hl-smi does not list (it lists 0, 1, 2, 3, 4, 6)"
    );
    // The fixture's job asks for every module: two are gone.
    assert_eq!(
        r.check("dev_bad").about.variables[0],
        "HABANA_VISIBLE_MODULES"
    );
    assert_eq!(
        r.message("ecc_bad"),
        "AIP 1 (0000:1a:00.0): 1 uncorrectable ECC errors (at most 0); AIP 3 (0000:44:00.0): 2 uncorrectable ECC errors (at most 0)"
    );
    assert_eq!(
        r.message("thr_bad"),
        "AIP 5 (0000:b4:00.0): Thermal Slowdown active"
    );
    assert_eq!(
        r.message("rst_bad"),
        "AIP 6 (0000:cc:00.0): module status `needs reset`; AIP 6 (0000:cc:00.0): a row replacement is pending until the device is reset"
    );
    assert_eq!(
        r.message("nic_bad"),
        "0000:b3:00.0: ports 3, 17 down (19 of 21 up)"
    );
    assert_eq!(
        r.measured("nic_ok"),
        "168 of 168 ports up on 8 devices; 24 scale-out interfaces"
    );
    // The scale-out interfaces are read from the node: at 100 Gb/s they
    // fail a Gaudi 3's 200.
    assert!(
        r.message("nic_rate").starts_with(
            "0000:19:00.0: interfaces eth1 (port 8), eth2 (port 22), eth3 (port 23) run at 100 Gb/s, not 200 (as the check sets); 0000:1a:00.0: "
        ),
        "{}",
        r.message("nic_rate")
    );
    // A module id the job asks for that the node lacks.
    let bad = run_with(
        "gaudi2-hls",
        &checks(&[format!(
            "{{id: mods, kind: hl_smi, subject: devices, hl_smi_query: \"{}\"}}",
            h("query-healthy.csv")
        )]),
        &[("HABANA_VISIBLE_MODULES", "0,9")],
        false,
    );
    assert_eq!(bad.status("mods"), "fail");
    assert_eq!(
        bad.message("mods"),
        "HABANA_VISIBLE_MODULES=0,9 names module id `9`, which hl-smi does not list (it lists 0, 1, 2, 3, 4, 5, 6, 7)"
    );
    assert_eq!(
        bad.check("mods").about.variables[0],
        "HABANA_VISIBLE_MODULES"
    );
}

/// What the readers cannot read is an error with its place, never a pass;
/// a parameter of another subject is a located configuration error.
#[test]
fn bad_recordings_and_misplaced_parameters() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.json");
    std::fs::write(&cut, "{\"gpu_data\": [{\"gpu\": 0, \"ecc\": {").unwrap();
    let rows = dir.path().join("rows.csv");
    std::fs::write(&rows, "index, bus_id\n0, 0000:19:00.0, extra\n").unwrap();
    let links = dir.path().join("links.txt");
    std::fs::write(&links, "=== 0000:19:00.0 ===\nport  0:\tMAYBE\n").unwrap();
    let header = dir.path().join("header.csv");
    std::fs::write(&header, "index, module_id, bus_id\n").unwrap();
    let list = checks(&[
        format!(
            "{{id: none, kind: hl_smi, subject: devices, hl_smi_query: \"{}\"}}",
            header.display()
        ),
        format!(
            "{{id: cut, kind: amd_smi, subject: ecc, amd_smi_metric: \"{}\"}}",
            cut.display()
        ),
        format!(
            "{{id: rows, kind: hl_smi, subject: devices, hl_smi_query: \"{}\"}}",
            rows.display()
        ),
        format!(
            "{{id: links, kind: hl_smi, subject: nic_ports, hl_smi_links: \"{}\"}}",
            links.display()
        ),
    ]);
    let r = run("gaudi2-hls", &list);
    // A header and no device: every one of the node's is missing.
    assert_eq!(r.status("none"), "fail");
    assert!(
        r.message("none")
            .contains("header.csv lists no Gaudi device"),
        "{}",
        r.message("none")
    );
    assert_eq!(r.status("cut"), "error");
    assert!(
        r.message("cut").contains("cut short"),
        "{}",
        r.message("cut")
    );
    assert_eq!(r.status("rows"), "error");
    assert!(
        r.message("rows")
            .ends_with("rows.csv:2: 3 values where the header names 2 fields"),
        "{}",
        r.message("rows")
    );
    assert_eq!(r.status("links"), "error");
    assert!(
        r.message("links")
            .contains("links.txt:2: `port  0:\tMAYBE` is not `port N: UP|DOWN`"),
        "{}",
        r.message("links")
    );

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "checks:\n  - id: x\n    kind: hl_smi\n    subject: ecc\n    speed_gbps: 100\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "--no-shipped", "--checks"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml:5:")
            && err.contains("`speed_gbps` applies to `subject: nic_ports` only"),
        "{err}"
    );
}

/// The new checks where operators look: `list` and `--only` by vendor and
/// subject, `explain`, every report format, the merged report, the Slurm
/// epilog's tag and the health check's quick diagnostic; under `--root`
/// with no recording each says what to record rather than pass.
#[test]
fn the_vendor_checks_show_everywhere() {
    let _shared = crate::common::shared();
    let ids = [
        "amd.ecc",
        "amd.xgmi",
        "amd.throttle",
        "amd.pcie",
        "amd.reset_required",
        "intel.xpu_diag",
        "intel.xpu_health",
        "intel.xe_link",
        "intel.throttle",
        "habana.devices",
        "habana.ecc",
        "habana.throttle",
        "habana.reset_required",
        "habana.nic_ports",
    ];
    let listed = |args: &[&str]| -> Vec<String> {
        let out = std::process::Command::new(BIN)
            .args(["list", "--format", "json"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // `list`'s entries are no report: its JSON has no schema type.
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["id"].as_str().map(str::to_string))
            .collect()
    };
    let all = listed(&[]);
    for id in ids {
        assert!(all.iter().any(|i| i == id), "{id} not listed");
    }
    for word in ["xgmi", "xe_link", "nic_ports", "diag"] {
        let sel = listed(&["--only", word]);
        assert!(
            !sel.is_empty() && sel.iter().all(|id| id.contains(word)),
            "--only {word}: {sel:?}"
        );
    }
    let epilog = listed(&["--only", "epilog"]);
    for id in [
        "amd.ecc",
        "amd.reset_required",
        "intel.xpu_health",
        "habana.ecc",
        "habana.reset_required",
    ] {
        assert!(
            epilog.iter().any(|i| i == id),
            "{id} not in the epilog tier"
        );
    }
    for kind in ["amd_smi", "xpu_smi", "hl_smi"] {
        let out = std::process::Command::new(BIN)
            .args(["explain", kind])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("subject"),
            "{kind}: {text}"
        );
    }

    // The query the kind documents is the one the fixtures hold and
    // tests/gpu/vendor-depth.sh records.
    let explain = std::process::Command::new(BIN)
        .args(["explain", "hl_smi"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&explain.stdout).into_owned();
    let fields = text
        .split("FIELDS being: ")
        .nth(1)
        .and_then(|t| t.split(" (joined by commas").next())
        .unwrap_or_else(|| panic!("{text}"))
        .replace(", ", ",");
    let header = std::fs::read_to_string(rec("habana-tools", "query-healthy.csv")).unwrap();
    assert_eq!(header.lines().next().unwrap().replace(", ", ","), fields);
    let script = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/vendor-depth.sh"),
    )
    .unwrap();
    assert!(
        script.contains(&format!("fields={fields}\n")),
        "the script's fields differ"
    );

    // The shipped checks under a fixture root: no recording, no pass.
    let shipped = run_with("amd-mi300x", "checks: []\n", &[], true);
    for id in [
        "amd.ecc",
        "amd.xgmi",
        "amd.throttle",
        "amd.pcie",
        "amd.reset_required",
    ] {
        assert_eq!(shipped.status(id), "skip", "{id}");
        assert!(
            shipped
                .message(id)
                .starts_with("no recording under --root: set "),
            "{id}: {}",
            shipped.message(id)
        );
    }

    // One node's failures in every format, and the merged report.
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("gaudi.yaml");
    std::fs::write(
        &list,
        checks(&[
            format!(
                "{{id: habana.nic_ports, kind: hl_smi, subject: nic_ports, hl_smi_links: \"{}\"}}",
                rec("habana-tools", "links-two-down.txt")
            ),
            format!(
                "{{id: habana.ecc, kind: hl_smi, subject: ecc, hl_smi_query: \"{}\"}}",
                rec("habana-tools", "query-broken.csv")
            ),
        ]),
    )
    .unwrap();
    let root = fixture("gaudi2-hls").join("root");
    let check = |format: &str, checks: Option<&std::path::Path>| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["check", "--format", format, "--root"]).arg(&root);
        if let Some(c) = checks {
            cmd.args(["--no-shipped", "--checks"]).arg(c);
        }
        String::from_utf8(cmd.output().unwrap().stdout).unwrap()
    };
    for format in ["human", "json", "junit", "prometheus"] {
        let text = check(format, Some(&list));
        for id in ["habana.nic_ports", "habana.ecc"] {
            assert!(text.contains(id), "{format} lacks {id}:\n{text}");
        }
    }
    let m = crate::common::merged_with_healthy(
        dir.path(),
        &check("json", Some(&list)),
        &check("json", None),
        "hls2-gaudi-012",
    );
    assert!(m.names_culprit("hls2-gaudi-011"), "{:#?}", m.culprits);
    assert!(!m.names_culprit("hls2-gaudi-012"), "{:#?}", m.culprits);
}

/// The Gaudi node's tree as the other checks read it: every device bound,
/// its device nodes present, nothing failing.
#[test]
fn the_gaudi_fixture_node_is_healthy_to_the_shipped_checks() {
    let _shared = crate::common::shared();
    let r = run_with("gaudi2-hls", "checks: []\n", &[], true);
    assert_eq!(
        r.status("habana.driver"),
        "pass",
        "{}",
        r.message("habana.driver")
    );
    assert_eq!(
        r.status("accelerators.devices"),
        "pass",
        "{}",
        r.message("accelerators.devices")
    );
    assert!(
        r.message("accelerators.devices").contains('8'),
        "{}",
        r.message("accelerators.devices")
    );
    for c in &r.report.checks {
        assert!(
            !matches!(
                c.status,
                crate::common::Status::Fail | crate::common::Status::Error
            ),
            "{}: {}",
            c.id,
            c.message
        );
    }
}

/// tests/gpu/vendor-depth.sh end to end, with each vendor's tool standing
/// in as a script that prints the fixtures' healthy recordings: every
/// recording it makes reads back, every check passes, and the live checks
/// (no such accelerator here) skip without erroring. The query it records
/// is the one `explain hl_smi` documents and the fixtures hold.
#[test]
fn the_gpu_machine_script_records_and_reads_back() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let f = |d: &str, n: &str| rec(d, n);
    let tools = [
        (
            "amd-smi",
            format!(
                "case \"$1 $2\" in\n  'list '*) exit 0 ;;\n  'metric --json') cat '{}' ;;\n  'static --json') cat '{}' ;;\n  'xgmi --json') cat '{}' ;;\n  'bad-pages --json') cat '{}' ;;\n  *) echo \"unexpected: $*\" >&2; exit 9 ;;\nesac\n",
                f("amd-tools", "metric-healthy.json"),
                f("amd-tools", "static.json"),
                f("amd-tools", "xgmi-healthy.json"),
                f("amd-tools", "bad-pages-healthy.json")
            ),
        ),
        (
            "xpu-smi",
            format!(
                "case \"$1\" in\n  discovery) exit 0 ;;\n  health) cat '{}' ;;\n  topology) cat '{}' ;;\n  diag) cat '{}' ;;\n  *) exit 9 ;;\nesac\n",
                f("intel-tools", "health-healthy.json"),
                f("intel-tools", "topology-healthy.txt"),
                f("intel-tools", "diag-l1-pass.json")
            ),
        ),
        (
            "hl-smi",
            format!(
                "q='{q}'\ncase \"$1\" in\n  -L) exit 0 ;;\n  -q) cat '{r}' ;;\n  -Q) if [ \"$2\" = bus_id ]; then sed 1d \"$q\" | cut -d, -f3 | tr -d ' '; elif [ \"$2\" = \"$(head -1 \"$q\" | sed 's/, /,/g')\" ]; then cat \"$q\"; else echo \"unexpected fields: $2\" >&2; exit 9; fi ;;\n  -n) awk -v b=\"=== $4 ===\" '/^===/ {{on = ($0 == b); next}} on' '{l}' ;;\n  *) exit 9 ;;\nesac\n",
                q = f("habana-tools", "query-healthy.csv"),
                r = f("habana-tools", "report-healthy.txt"),
                l = f("habana-tools", "links-healthy.txt")
            ),
        ),
    ];
    for (name, body) in tools {
        crate::common::executable(&bin, name, &format!("#!/bin/sh\n{body}"));
    }
    let out = dir.path().join("out");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gpu/vendor-depth.sh");
    let run = std::process::Command::new("bash")
        .arg(&script)
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .env("PREFLIGHT_BIN", BIN)
        .env("VENDOR_DEPTH_OUT", &out)
        .env_remove("ZE_AFFINITY_MASK")
        .output()
        .unwrap();
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(run.status.code(), Some(0), "{said}");
    assert!(
        said.contains("vendor-depth: every check ran; none errored"),
        "{said}"
    );
    let recorded = crate::common::report(
        &std::fs::read_to_string(out.join("recorded.json")).unwrap(),
        &said,
    );
    assert_eq!(recorded.checks.len(), 14, "{recorded}");
    for c in &recorded.checks {
        assert_eq!(c.status, crate::common::Status::Pass, "{c:#?}");
    }
}
