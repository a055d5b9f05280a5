//! The GPU checks below the driver, on recorded outputs of NVIDIA's tools
//! (fixtures/nvidia-tools and the H100 fixture trees), run by the real
//! binary: clock throttling, reset required, Xids by the action they need,
//! DCGM diagnostics in every JSON shape, NVLink per link. tests/gpu/
//! runs the same checks on a real GPU.

use std::path::PathBuf;

use crate::common::fixture_run;
use fixture_run::*;

fn tools(name: &str) -> PathBuf {
    fixture("nvidia-tools").join(name)
}

/// `preflight check` of a checklist file alone (this machine, no root):
/// its exit code and standard error.
fn check_alone(checklist: &std::path::Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(BIN)
        .args(["check", "--no-shipped", "--checks"])
        .arg(checklist)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Clock event reasons: what repeats in most samples fails, a blip in one
/// sample is noted, the software power cap and idle are normal; both the
/// R535+ names and the older `clocks_throttle_reasons` are read.
#[test]
fn throttling_fails_only_what_repeats_in_either_layout() {
    let _shared = crate::common::shared();
    let checklist = format!(
        "checks:\n  - {{id: thermal, kind: gpu_health, throttle: true, nvidia_smi_xml: \"{}\"}}\n  - {{id: old, kind: gpu_health, throttle: true, nvidia_smi_xml: \"{}\"}}\n  - {{id: healthy, kind: gpu_health, throttle: true, nvidia_smi_xml: \"{{fixture}}/nvidia-smi-q.xml\"}}\n  - {{id: power_cap_too, kind: gpu_health, throttle: true, throttle_reasons: [sw_power_cap], nvidia_smi_xml: \"{}\"}}\n",
        tools("throttle-thermal.xml").display(),
        tools("throttle-old-names.xml").display(),
        tools("throttle-thermal.xml").display(),
    );
    let r = run("h100-ib-healthy", &checklist);
    assert_eq!(r.status("thermal"), "fail");
    assert_eq!(
        r.message("thermal"),
        "GPU 2 (0000:3a:00.0): hw_thermal_slowdown in 3 of 3 samples: clocks held down by the hardware"
    );
    assert_eq!(r.status("old"), "fail");
    assert_eq!(
        r.message("old"),
        "GPU 7 (0000:db:00.0): hw_power_brake_slowdown in 2 of 2 samples: clocks held down by the hardware"
    );
    assert_eq!(r.status("healthy"), "pass", "{}", r.message("healthy"));
    assert_eq!(
        r.message("healthy"),
        "clock event reasons of 8 GPUs in 1 sample"
    );
    // The blip on GPU 5 is named where nothing else failed on it.
    let all = run(
        "h100-ib-healthy",
        &format!(
            "checks:\n  - {{id: t, kind: gpu_health, throttle: true, throttle_reasons: [hw_slowdown], nvidia_smi_xml: \"{}\"}}\n",
            tools("throttle-thermal.xml").display()
        ),
    );
    assert_eq!(all.status("t"), "pass");
    assert_eq!(
        all.message("t"),
        "once, not repeated: GPU 5 (0000:ab:00.0): hw_slowdown in 1 of 3 samples; clock event reasons of 8 GPUs in 3 samples"
    );
    assert_eq!(r.status("power_cap_too"), "fail");
    assert!(
        r.message("power_cap_too")
            .contains("GPU 0 (0000:18:00.0): sw_power_cap in 3 of 3 samples")
    );
}

/// An unknown reason name is a located configuration error, not a check
/// that can never fail.
#[test]
fn an_unknown_throttle_reason_is_a_located_error() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.yaml");
    std::fs::write(
        &file,
        "checks:\n  - id: t\n    kind: gpu_health\n    throttle: true\n    throttle_reasons: [hw_slowdwn]\n",
    )
    .unwrap();
    let (code, err) = check_alone(&file);
    assert_eq!(code, Some(2));
    assert!(err.contains("c.yaml:5:"), "{err}");
    assert!(err.contains("`hw_slowdwn`"), "{err}");
}

/// The driver's reset status: the broken tree's GPU 5 needs a reset.
#[test]
fn a_gpu_the_driver_wants_reset_is_named_with_the_action() {
    let _shared = crate::common::shared();
    let checklist = "checks:\n  - {id: reset, kind: gpu_health, reset_required: true, nvidia_smi_xml: \"{fixture}/nvidia-smi-q.xml\", hint: \"{action}\"}\n";
    let r = run("h100-ib-broken", checklist);
    assert_eq!(r.status("reset"), "fail");
    assert_eq!(
        r.message("reset"),
        "GPU 5 (0000:ba:00.0): the driver requires a GPU reset before further use"
    );
    assert_eq!(r.hint("reset"), "reset the GPU");
    let healthy = run("h100-ib-healthy", checklist);
    assert_eq!(healthy.status("reset"), "pass");
    // R570 and later: the reset fields say "deprecated", the recovery
    // action speaks, and a reboot is what the hint asks for.
    let r570 = run(
        "h100-ib-healthy",
        &format!(
            "checks:\n  - {{id: reset, kind: gpu_health, reset_required: true, nvidia_smi_xml: \"{}\", hint: \"{{action}}\"}}\n",
            tools("recovery-reboot.xml").display()
        ),
    );
    assert_eq!(r570.status("reset"), "fail");
    assert_eq!(
        r570.message("reset"),
        "GPU 4 (0000:9a:00.0): the driver's recovery action is Reboot"
    );
    assert_eq!(r570.hint("reset"), "reboot");
}

/// A kernel log with the same Xid 800,000 times (a real failure mode: an
/// uncontained ECC error repeating) is one finding with a count and the
/// first and last time, worst action first, and the drain reason reads
/// "GPU N Xid C (name): action".
#[test]
fn a_flood_of_one_xid_is_one_finding_with_its_count_and_action() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("kmsg");
    let mut text = String::new();
    for i in 0..800_000u64 {
        text.push_str(&format!(
            "3,{},{},-;NVRM: Xid (PCI:0000:18:00): 95, pid=4242, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No\n",
            1000 + i,
            5_000_000 + i * 1000
        ));
    }
    text.push_str("3,900000,9000000000,-;NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n");
    text.push_str("3,900001,9000000001,-;NVRM: Xid (PCI:0000:5d:00): 92, pid='<unknown>', name=<unknown>, High single-bit ECC error rate\n");
    std::fs::write(&log, text).unwrap();
    let checklist = format!(
        "checks:\n  - {{id: xid, kind: gpu_health, xid: true, kernel_log: \"{}\", hint: \"{{action}}\"}}\n",
        log.display()
    );
    let started = std::time::Instant::now();
    let r = run("h100-ib-healthy", &checklist);
    let took = started.elapsed();
    assert_eq!(r.status("xid"), "fail");
    assert_eq!(
        r.message("xid"),
        "GPU 2 (0000:3a:00.0) Xid 79 (fallen off the bus): reboot, at 9000.0 s after boot: pid='<unknown>', name=<unknown>, GPU has fallen off the bus.; \
         GPU 0 (0000:18:00.0) Xid 95 (uncontained memory error): reset the GPU; 800000 times, 5.0 s to 805.0 s after boot: pid=4242, name=python3, Uncontained: FBHUB. RST: Yes, D-RST: No"
    );
    // The worst action is the hint's.
    assert_eq!(r.hint("xid"), "reboot");
    // 800,000 lines (90 MB) are read in one pass: a generous bound that a
    // quadratic grouping would break.
    assert!(took.as_secs() < 60, "took {took:?}");
}

/// The broken tree's Xids, worst action first, as the Slurm drain reason
/// would start.
#[test]
fn the_broken_trees_xids_name_gpu_action_and_time() {
    let _shared = crate::common::shared();
    let r = run(
        "h100-ib-broken",
        "checks:\n  - {id: xid, kind: gpu_health, xid: true}\n",
    );
    assert_eq!(
        r.message("xid"),
        "0000:9a:00.0 Xid 79 (fallen off the bus): reboot, at 4254.2 s after boot: pid='<unknown>', name=<unknown>, GPU has fallen off the bus.; \
         GPU 5 (0000:ba:00.0) Xid 48 (double-bit ECC error): reset the GPU, at 20211.9 s after boot: pid=3098871, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."
    );
    // Xid 63 (the remap recorded) asks for nothing in NVIDIA's catalog:
    // the remap it left pending is `remapped_rows`' finding.
    assert!(!r.message("xid").contains("Xid 63"));
}

/// NVLink Xids take the site's action; `ignore_xids` still wins.
#[test]
fn nvlink_xids_are_configurable() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("dmesg");
    std::fs::write(
        &log,
        "[  10.000000] NVRM: Xid (PCI:0000:18:00): 74, pid=1, name=python3, NVLink: fatal error detected on link 3\n\
         [  11.000000] NVRM: Xid (PCI:0000:2a:00): 145, pid=1, name=python3, RLW error\n",
    )
    .unwrap();
    let l = log.display();
    let r = run(
        "h100-ib-healthy",
        &format!(
            "checks:\n  - {{id: default, kind: gpu_health, xid: true, kernel_log: \"{l}\"}}\n  - {{id: support, kind: gpu_health, xid: true, nvlink_action: contact_support, kernel_log: \"{l}\"}}\n  - {{id: only74, kind: gpu_health, xid: true, nvlink_xids: [74], nvlink_action: contact_support, kernel_log: \"{l}\"}}\n  - {{id: ignored, kind: gpu_health, xid: true, ignore_xids: [74, 145], kernel_log: \"{l}\"}}\n"
        ),
    );
    assert!(
        r.message("default").starts_with(
            "GPU 0 (0000:18:00.0) Xid 74 (NVLink error): reset the GPU, at 10.0 s after boot"
        ),
        "{}",
        r.message("default")
    );
    assert!(
        r.message("support")
            .starts_with("GPU 0 (0000:18:00.0) Xid 74 (NVLink error): contact support")
    );
    assert!(
        r.message("support")
            .contains("GPU 1 (0000:2a:00.0) Xid 145 (NVLink RLW error): contact support")
    );
    assert!(
        r.message("only74")
            .contains("Xid 145 (NVLink RLW error): reset the GPU")
    );
    assert_eq!(r.status("ignored"), "pass");
}

/// One `dcgm_diag` check per recording, by the same id as the recording.
fn dcgm_checks(names: &[&str], extra: &str) -> String {
    let mut text = String::from("checks:\n");
    for name in names {
        text.push_str(&format!(
            "  - {{id: \"{name}\", kind: dcgm_diag, level: 2, dcgm_json: \"{}\", hint: \"{{action}}\"{extra}}}\n",
            tools(&format!("{name}.json")).display()
        ));
    }
    text
}

fn part<'a>(r: &'a Run, id: &str) -> (&'a str, &'a str, &'a str) {
    let c = r.check(id);
    (
        c.status.name(),
        c.message.as_str(),
        c.hint.as_deref().unwrap_or(""),
    )
}

/// Every shape DCGM writes, read by structure: each failing test on each
/// GPU is its own line with the severity's action; what preflight cannot
/// read is never a pass.
#[test]
fn dcgm_documents_of_every_shape_pass_and_fail_as_dcgm_meant() {
    let _shared = crate::common::shared();
    let names = [
        "dcgm4-r2-pass",
        "dcgm4-r2-memory-fail",
        "dcgm4-r1-config",
        "dcgm4-r1-reset",
        "dcgm4-runtime-error",
        "dcgm4-truncated",
        "dcgm4-unknown-status",
        "dcgm4-no-results",
        "dcgm3-r3-memory-fail",
        "dcgm3-mig",
        "dcgm2-r1-pass",
    ];
    let r = run("h100-ib-healthy", &dcgm_checks(&names, ""));
    assert_eq!(
        part(&r, "dcgm4-r2-pass"),
        (
            "pass",
            "level 2: 24 results on 8 GPUs (DCGM 4.2.3, driver 550.90.07), all passed",
            ""
        )
    );
    assert_eq!(
        part(&r, "dcgm4-r2-memory-fail:gpu3.memory"),
        (
            "fail",
            "GPU 3 (serial 1654923082661) memory (Hardware): ISOLATE: Found 12 faulty memory elements on GPU 3.",
            "isolate the GPU: drain the node and have the GPU serviced"
        )
    );
    assert_eq!(
        part(&r, "dcgm4-r2-memory-fail:gpu6.pcie"),
        (
            "warn",
            "GPU 6 (serial 1654923023417) pcie (Integration): MONITOR: Detected 187 PCIe replays on GPU 6 during the test: watch it.",
            "monitor: the GPU works, watch it for a repeat"
        )
    );
    let (status, message, hint) = part(&r, "dcgm4-r1-config:gpu0.software");
    assert_eq!(status, "warn");
    assert!(message.starts_with("GPU 0 (serial 1654923054549) software (Deployment): CONFIG: Persistence Mode: Persistence mode for GPU 0 is disabled."), "{message}");
    assert_eq!(hint, "fix the node's configuration as DCGM says");
    let (status, message, hint) = part(&r, "dcgm4-r1-reset:gpu5.software");
    assert_eq!(status, "fail");
    assert!(
        message.contains("RESET: GPU 5 had uncorrectable memory errors"),
        "{message}"
    );
    assert_eq!(
        hint,
        "drain the node and reset the GPU (`nvidia-smi -r -i INDEX`)"
    );
    let (status, message, _) = part(&r, "dcgm4-runtime-error");
    assert_eq!(status, "error");
    assert!(message.starts_with("DCGM could not run the diagnostic: Error: Unable to complete diagnostic for group 0. Return: (-33) The GPU has been lost"), "{message}");
    let (status, message, _) = part(&r, "dcgm4-truncated");
    assert_eq!(status, "error");
    assert!(
        message.contains("dcgm4-truncated.json: the JSON document is cut short"),
        "{message}"
    );
    let (status, message, _) = part(&r, "dcgm4-unknown-status:gpu2.memory");
    assert_eq!(status, "error");
    assert_eq!(
        message,
        "GPU 2 (serial 1654923003708) memory (Hardware): DCGM reported `Degraded`, a status preflight does not know"
    );
    assert_eq!(
        part(&r, "dcgm4-no-results").1,
        "DCGM's document holds no test results and no reason"
    );
    assert_eq!(part(&r, "dcgm4-no-results").0, "error");
    // DCGM 3.3.9, after dcgmi's line about the unreachable host engine.
    assert_eq!(
        part(&r, "dcgm3-r3-memory-fail:gpu1.gpu_memory"),
        (
            "fail",
            "GPU 1 (serial 1654923096466) GPU Memory (Hardware): ISOLATE: Found 4 faulty memory elements on GPU 1.",
            "isolate the GPU: drain the node and have the GPU serviced"
        )
    );
    let ids: Vec<&str> = r
        .report
        .checks
        .iter()
        .map(|c| c.id.as_str())
        .filter(|id| id.starts_with("dcgm3-r3-memory-fail"))
        .collect();
    // The skipped infoROM test and the null hole are not failures.
    assert_eq!(ids, ["dcgm3-r3-memory-fail:gpu1.gpu_memory"]);
    let (status, message, _) = part(&r, "dcgm3-mig");
    assert_eq!(status, "skip");
    assert!(
        message.starts_with("DCGM does not run its diagnostic on MIG GPUs: Cannot run diagnostic"),
        "{message}"
    );
    assert_eq!(
        part(&r, "dcgm2-r1-pass").1,
        "level 2: 4 results on 0 GPUs, all passed"
    );
    // A node with these results is not ready; the report says so by exit.
    assert_eq!(r.code, 1);
}

/// MIG mode on a GPU the diagnostic would test: skipped with the reason,
/// before dcgmi runs; a GPU set that leaves it out runs.
#[test]
fn dcgm_skips_mig_gpus_it_would_test() {
    let _shared = crate::common::shared();
    let xml = tools("mig-enabled.xml");
    let r = run(
        "h100-ib-healthy",
        &format!(
            "{}  - {{id: other, kind: dcgm_diag, gpus: [0, 1], dcgm_json: \"{}\", nvidia_smi_xml: \"{}\"}}\n",
            dcgm_checks(
                &["dcgm4-r2-pass"],
                &format!(", nvidia_smi_xml: \"{}\"", xml.display())
            ),
            tools("dcgm4-r2-pass.json").display(),
            xml.display()
        ),
    );
    assert_eq!(
        part(&r, "dcgm4-r2-pass"),
        (
            "skip",
            "MIG mode is enabled on GPU 2 (0000:3a:00.0): dcgmi diag does not run on MIG GPUs",
            ""
        )
    );
    assert_eq!(r.status("other"), "pass");
}

/// On this machine, with no DCGM: a real run of the kind skips naming
/// what is missing, never passes; a level outside 1-4 is a located error.
#[test]
fn dcgm_without_dcgm_skips_and_a_bad_level_is_located() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.yaml");
    std::fs::write(
        &file,
        "checks:\n  - {id: d, kind: dcgm_diag, dcgmi: /nonexistent/dcgmi}\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "--no-shipped", "--format", "json", "--checks"])
        .arg(&file)
        .output()
        .unwrap();
    let report = crate::common::report_of(&out);
    let check = &report.checks[0];
    assert_eq!(check.status, crate::common::Status::Skip);
    let message = check.message.as_str();
    // Without an NVIDIA GPU (this machine) or without dcgmi (a GPU machine
    // without DCGM): either way a reason, never a pass.
    assert!(
        message == "no NVIDIA GPU present"
            || message.starts_with("/nonexistent/dcgmi is not installed"),
        "{message}"
    );
    std::fs::write(
        &file,
        "checks:\n  - id: d\n    kind: dcgm_diag\n    level: 5\n",
    )
    .unwrap();
    let (code, err) = check_alone(&file);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("c.yaml:4:12") && err.contains("`level` must be 1 to 4"),
        "{err}"
    );
}

fn nvlink_check(id: &str, status: &str, extra: &str) -> String {
    format!(
        "  - {{id: \"{id}\", kind: nvlink, nvidia_smi_nvlink: \"{}\"{extra}}}\n",
        tools(status).display()
    )
}

/// NVLink per link on the HGX H100 tree: a healthy board passes; links
/// down on one GPU, every link down on one GPU or on all of them, a slow
/// link, counted errors and a link reaching a GPU where the others reach
/// NVSwitches each fail naming GPU, bus and link.
#[test]
fn nvlink_per_link_on_an_hgx_board() {
    let _shared = crate::common::shared();
    let errors = |f: &str| format!(", nvidia_smi_nvlink_errors: \"{}\"", tools(f).display());
    let remote = |f: &str| format!(", nvidia_smi_nvlink_remote: \"{}\"", tools(f).display());
    let limits = ", max_errors: {replay: 0, recovery: 0, crc: 0}";
    let checklist = [
        nvlink_check(
            "healthy",
            "nvlink-h100-healthy.txt",
            &format!(
                "{}{}{limits}",
                errors("nvlink-h100-errors-clean.txt"),
                remote("nvlink-h100-remote.txt")
            ),
        ),
        nvlink_check("two_down", "nvlink-h100-two-down.txt", ""),
        nvlink_check("gpu6_down", "nvlink-h100-gpu6-down.txt", ""),
        nvlink_check("all_down", "nvlink-h100-all-down.txt", ""),
        nvlink_check("slow", "nvlink-h100-slow-link.txt", ""),
        nvlink_check(
            "errors",
            "nvlink-h100-healthy.txt",
            &format!("{}{limits}", errors("nvlink-h100-errors.txt")),
        ),
        nvlink_check(
            "errors_unlimited",
            "nvlink-h100-healthy.txt",
            &errors("nvlink-h100-errors.txt"),
        ),
        nvlink_check(
            "miswired",
            "nvlink-h100-healthy.txt",
            &remote("nvlink-h100-remote-miswired.txt"),
        ),
        nvlink_check("vm_on_hgx", "nvlink-vm-12-links.txt", ""),
    ]
    .concat();
    let r = run("h100-ib-healthy", &format!("checks:\n{checklist}"));
    // A cloud VM size that exposes 12 of 18 links by design (the VM
    // fixture node: no shipped profile is for a VM) passes by its peers;
    // on the bare-metal HGX board the profile holds it to 18.
    let vm_checks = [
        nvlink_check("vm", "nvlink-vm-12-links.txt", ""),
        nvlink_check("vm_needs_18", "nvlink-vm-12-links.txt", ", links: 18"),
    ]
    .concat();
    let vm = run("cpu-node", &format!("checks:\n{vm_checks}"));
    assert_eq!(r.status("healthy"), "pass", "{}", r.message("healthy"));
    assert!(
        r.message("healthy")
            .starts_with("144 active links on 8 GPUs from "),
        "{}",
        r.message("healthy")
    );
    assert_eq!(
        r.message("two_down"),
        "GPU 3 (0000:5d:00.0): 16 of 18 links active, links 4, 5 inactive; expected 18 as profile hgx-h100-8 sets"
    );
    assert_eq!(
        r.message("gpu6_down"),
        "GPU 6 (0000:ba:00.0): every link inactive; expected 18 as profile hgx-h100-8 sets"
    );
    assert_eq!(r.status("all_down"), "fail");
    assert!(r.message("all_down").starts_with(
        "every link of every NVIDIA H100 80GB HBM3 is inactive: NVLink is down on an SXM module"
    ));
    assert_eq!(
        r.message("slow"),
        "GPU 1 (0000:2a:00.0) link 2: 1 GB/s where links here run at 26.562 GB/s"
    );
    assert_eq!(
        r.message("errors"),
        "GPU 2 (0000:3a:00.0) link 7: 41 crc errors (at most 0); GPU 2 (0000:3a:00.0) link 7: 3 recovery errors (at most 0)"
    );
    assert_eq!(r.status("errors_unlimited"), "pass");
    assert_eq!(
        r.message("miswired"),
        "GPU 4 (0000:9a:00.0) link 0 reaches 0000:18:00.0 (a GPU) where most links here reach an NVSwitch"
    );
    assert_eq!(r.status("vm_on_hgx"), "fail");
    assert!(r.message("vm_on_hgx").starts_with(
        "GPU 0 (0000:18:00.0): 12 of 18 links active, links 12, 13, 14, 15, 16, 17 inactive; expected 18 as profile hgx-h100-8 sets"
    ), "{}", r.message("vm_on_hgx"));
    assert_eq!(vm.status("vm"), "pass", "{}", vm.message("vm"));
    assert_eq!(vm.measured("vm"), "96 active links on 8 GPUs");
    assert_eq!(vm.status("vm_needs_18"), "fail");
    assert!(vm.message("vm_needs_18").starts_with(
        "GPU 0: 12 of 18 links active, links 12, 13, 14, 15, 16, 17 inactive; expected 18 as the check sets"
    ), "{}", vm.message("vm_needs_18"));
}

/// PCIe cards without a bridge have no active NVLink and that is not a
/// failure; NVML's "not supported" is no NVLink at all.
#[test]
fn nvlink_on_pcie_cards_is_not_a_failure() {
    let _shared = crate::common::shared();
    let checklist = format!(
        "checks:\n{}{}",
        nvlink_check("bridgeless", "nvlink-pcie.txt", ""),
        nvlink_check("unsupported", "nvlink-pcie-unsupported.txt", "")
    );
    let r = run("roce-node", &checklist);
    assert_eq!(r.status("bridgeless"), "pass");
    assert!(
        r.message("bridgeless")
            .ends_with("NVIDIA H100 PCIe: no NVLink active (a PCIe card without a bridge)"),
        "{}",
        r.message("bridgeless")
    );
    assert_eq!(r.status("unsupported"), "skip");
    assert!(
        r.message("unsupported")
            .starts_with("no NVLink on this node")
    );
    // Driver 580 on a one-GPU H100 VM prints nothing for `nvlink -s`
    // (recorded on such a machine): no NVLink, not a failure.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("nvlink-s.txt");
    std::fs::write(&empty, "").unwrap();
    let r = run(
        "h100-ib-healthy",
        &format!(
            "checks:\n  - {{id: n, kind: nvlink, nvidia_smi_nvlink: \"{}\"}}\n",
            empty.display()
        ),
    );
    assert_eq!(r.status("n"), "skip");
    assert!(
        r.message("n").ends_with("lists no GPU)"),
        "{}",
        r.message("n")
    );
}

/// A line the reader does not know is an error naming file and line,
/// never a healthy node.
#[test]
fn an_unknown_nvlink_line_is_an_error_with_its_place() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("s.txt");
    std::fs::write(
        &status,
        "GPU 0: NVIDIA H100 80GB HBM3\n\t Link 0: 26.562 GB/s\n\t Link 1: degraded\n",
    )
    .unwrap();
    let r = run(
        "h100-ib-healthy",
        &format!(
            "checks:\n  - {{id: n, kind: nvlink, nvidia_smi_nvlink: \"{}\"}}\n",
            status.display()
        ),
    );
    assert_eq!(r.status("n"), "error");
    assert_eq!(
        r.message("n"),
        format!("{}:3: not understood: `Link 1: degraded`", status.display())
    );
}

/// The new checks where operators look: `list` and `--only` by the words
/// in their ids, every report format, and the merged report's matrix of
/// two nodes (one healthy, one with a failed DCGM memory test and links
/// down).
#[test]
fn the_gpu_depth_checks_show_everywhere() {
    let _shared = crate::common::shared();
    let list = std::process::Command::new(BIN)
        .args(["list", "--format", "json"])
        .output()
        .unwrap();
    // `list`'s entries are no report: its JSON has no schema type.
    let listed: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    for id in [
        "nvidia.dcgm_quick",
        "nvidia.dcgm_medium",
        "nvidia.nvlink",
        "nvidia.throttle",
        "nvidia.reset_required",
        "nvidia.xid",
    ] {
        assert!(ids.contains(&id), "{id} not listed: {ids:?}");
    }
    for word in ["dcgm", "nvlink", "throttle", "reset"] {
        let out = std::process::Command::new(BIN)
            .args(["list", "--format", "json", "--only", word])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "--only {word}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // `list` again: no schema type.
        let sel: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let sel: Vec<&str> = sel
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["id"].as_str())
            .collect();
        assert!(
            !sel.is_empty() && sel.iter().all(|id| id.contains(word)),
            "--only {word}: {sel:?}"
        );
    }
    let explain = std::process::Command::new(BIN)
        .args(["explain", "dcgm_diag"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&explain.stdout).contains("dcgm_json"));

    // One node's failures in every format.
    let dir = tempfile::tempdir().unwrap();
    let checklist = dir.path().join("gpu.yaml");
    std::fs::write(
        &checklist,
        format!(
            "checks:\n  - {{id: nvidia.dcgm_medium, kind: dcgm_diag, level: 2, dcgm_json: \"{}\"}}\n{}",
            tools("dcgm4-r2-memory-fail.json").display(),
            nvlink_check("nvidia.nvlink", "nvlink-h100-two-down.txt", "")
        ),
    )
    .unwrap();
    let root = fixture("h100-ib-healthy").join("root");
    let check = |format: &str, shipped_only: bool| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["check", "--format", format, "--root"]).arg(&root);
        if !shipped_only {
            cmd.args(["--no-shipped", "--checks"]).arg(&checklist);
        }
        let out = cmd.output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    for format in ["human", "json", "junit", "prometheus"] {
        let text = check(format, false);
        for id in [
            "nvidia.dcgm_medium:gpu3.memory",
            "nvidia.dcgm_medium:gpu6.pcie",
            "nvidia.nvlink",
        ] {
            assert!(text.contains(id), "{format} lacks {id}:\n{text}");
        }
    }
    // The merged report of a healthy node and this one.
    let m = crate::common::merged_with_healthy(
        dir.path(),
        &check("json", false),
        &check("json", true),
        "gpu-h100-018",
    );
    for id in ["nvidia.dcgm_medium:gpu3.memory", "nvidia.nvlink"] {
        assert!(
            m.check_ids.iter().any(|c| c == id),
            "matrix lacks {id}: {:?}",
            m.check_ids
        );
    }
    assert!(m.names_culprit("gpu-h100-017"), "{:#?}", m.culprits);
    assert!(!m.names_culprit("gpu-h100-018"), "{:#?}", m.culprits);
}

/// What a real H100 VM on driver R580 printed (tests/gpu/gpu-depth.sh,
/// fixtures/nvidia-tools/real-h100-vm-r580): three whole `-q -x`
/// documents read as three samples, the recovery action read where the
/// reset fields are gone, and the empty NVLink status as no NVLink.
#[test]
fn a_real_r580_recording_reads_back() {
    let _shared = crate::common::shared();
    let real = |f: &str| fixture("nvidia-tools/real-h100-vm-r580").join(f);
    let r = run(
        "h100-ib-healthy",
        &format!(
            "checks:\n  - {{id: throttle, kind: gpu_health, throttle: true, nvidia_smi_xml: \"{x}\"}}\n  - {{id: reset, kind: gpu_health, reset_required: true, nvidia_smi_xml: \"{x}\"}}\n  - {{id: nvlink, kind: nvlink, nvidia_smi_nvlink: \"{n}\"}}\n",
            x = real("samples.xml").display(),
            n = real("nvlink-s.txt").display()
        ),
    );
    assert_eq!(
        (r.status("throttle"), r.message("throttle")),
        ("pass", "clock event reasons of 1 GPUs in 3 samples")
    );
    assert_eq!(r.status("reset"), "pass");
    assert!(
        !r.message("reset").contains("no reset status"),
        "{}",
        r.message("reset")
    );
    assert_eq!(r.status("nvlink"), "skip");
}

/// From the review: a GPU of the node that `nvlink -s` leaves out is
/// named, an NVML error other than "all links inactive" is an error, and
/// throttle with no GPU reporting its reasons checks nothing (skip).
#[test]
fn what_the_readers_cannot_see_is_never_a_pass() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let healthy = std::fs::read_to_string(tools("nvlink-h100-healthy.txt")).unwrap();
    // GPU 7 left out.
    let seven: String = healthy
        .split("GPU ")
        .filter(|b| !b.is_empty() && !b.starts_with("7:"))
        .map(|b| format!("GPU {b}"))
        .collect();
    let missing = dir.path().join("missing.txt");
    std::fs::write(&missing, seven).unwrap();
    let lost = dir.path().join("lost.txt");
    std::fs::write(
        &lost,
        healthy.replacen(
            "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-cac5c6c2-084d-3ddc-34fa-425db37ba6bf)\n",
            "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-cac5c6c2-084d-3ddc-34fa-425db37ba6bf)\nNVML: Unable to retrieve NVLink information: GPU is lost\n",
            1,
        ),
    )
    .unwrap();
    // Clock event reasons gone from every GPU's document.
    let xml = std::fs::read_to_string(fixture("h100-ib-healthy").join("nvidia-smi-q.xml")).unwrap();
    let start = xml.find("<clocks_event_reasons>").unwrap();
    let mut stripped = String::new();
    let mut rest = xml.as_str();
    while let Some(s) = rest.find("<clocks_event_reasons>") {
        let e = rest[s..].find("</clocks_event_reasons>").unwrap()
            + s
            + "</clocks_event_reasons>".len();
        stripped.push_str(&rest[..s]);
        rest = &rest[e..];
    }
    stripped.push_str(rest);
    assert!(start > 0 && !stripped.contains("clocks_event_reasons"));
    let noclock = dir.path().join("noclock.xml");
    std::fs::write(&noclock, stripped).unwrap();
    let r = run(
        "h100-ib-healthy",
        &format!(
            "checks:\n  - {{id: missing, kind: nvlink, nvidia_smi_nvlink: \"{}\"}}\n  - {{id: lost, kind: nvlink, nvidia_smi_nvlink: \"{}\"}}\n  - {{id: noclock, kind: gpu_health, throttle: true, nvidia_smi_xml: \"{}\"}}\n",
            missing.display(),
            lost.display(),
            noclock.display()
        ),
    );
    assert_eq!(r.status("missing"), "fail");
    assert!(
        r.message("missing")
            .starts_with("GPU 7 (0000:db:00.0) is not in "),
        "{}",
        r.message("missing")
    );
    assert_eq!(r.status("lost"), "error");
    assert!(r.message("lost").contains("could not read GPU 1's NVLink: `NVML: Unable to retrieve NVLink information: GPU is lost`"), "{}", r.message("lost"));
    assert_eq!(r.status("noclock"), "skip");
    assert_eq!(
        r.message("noclock"),
        "no GPU reports its clock event reasons"
    );
}
