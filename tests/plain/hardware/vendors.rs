//! AMD, Intel and Habana trees: accelerator-class GPUs and amdgpu health,
//! Intel Max tiles, a split driver and a missing Level Zero loader, Gaudi
//! nodes and masks, and the shipped checklist over them.

use super::*;

// ---------------------------------------------------------------- (c)

#[test]
fn intel_max_counts_tiles_and_finds_level_zero() {
    let _shared = crate::common::shared();
    let r = run("intel-max-xpu", ALL_KINDS);
    assert_eq!(
        r.message("devices"),
        "Intel: 4 on PCI, 4 usable (driver and device nodes), 2 visible"
    );
    assert_eq!(
        r.message("driver"),
        "Intel driver (no version published): i915 bound, Level Zero loader in /usr/lib/x86_64-linux-gnu/libze_loader.so.1"
    );
    assert_eq!(r.status("ecc"), "skip");
    assert_eq!(r.message("ecc"), "no NVIDIA or AMD GPU present");
    assert_eq!(r.status("pcie"), "pass");
    // FLAT hierarchy: 8 tiles are 8 devices.
    let r = run_env("intel-max-xpu", ALL_KINDS, &[("ZE_AFFINITY_MASK", "0,8")]);
    assert_eq!(
        r.message("devices"),
        "ZE_AFFINITY_MASK=0,8 names device 8, but only 8 Intel devices are usable here (0-7)"
    );
    // COMPOSITE: one device per card.
    let r = run_env(
        "intel-max-xpu",
        ALL_KINDS,
        &[
            ("ZE_AFFINITY_MASK", "0.0,4"),
            ("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE"),
        ],
    );
    assert_eq!(
        r.message("devices"),
        "ZE_AFFINITY_MASK=0.0,4 names device 4, but only 4 Intel devices are usable here (0-3)"
    );
}

// ---------------------------------------------------------------- (d)

#[test]
fn amd_mi300x_counts_accelerator_class_gpus() {
    let _shared = crate::common::shared();
    let r = run("amd-mi300x", ALL_KINDS);
    assert_eq!(
        r.message("devices"),
        "AMD: 8 on PCI, 8 usable (driver and device nodes), 8 visible"
    );
    assert_eq!(r.message("driver"), "AMD driver 6.8.5: amdgpu bound");
    assert_eq!(r.status("pcie"), "pass");
    assert_eq!(r.measured("pcie"), "0 of 9 degraded");
    assert_eq!(r.status("ib"), "skip");
    // Health from amdgpu's files: RAS counts and VRAM in use.
    assert_eq!(r.message("ecc"), "8 GPUs from amdgpu sysfs");
    assert_eq!(r.message("balance"), "8 GPUs from amdgpu sysfs");
    assert_eq!(
        r.message("persistence"),
        "persistence mode, row remaps and Xid errors are NVIDIA's; nothing to check on AMD GPUs"
    );
    let r = run_env(
        "amd-mi300x",
        ALL_KINDS,
        &[
            ("ROCR_VISIBLE_DEVICES", "4,5,6,7"),
            ("HIP_VISIBLE_DEVICES", "5"),
        ],
    );
    assert_eq!(
        r.message("devices"),
        "HIP_VISIBLE_DEVICES=5 names device 5, but only 4 AMD devices are usable here (0-3)"
    );
    let r = run_env(
        "amd-mi300x",
        ALL_KINDS,
        &[
            ("ROCR_VISIBLE_DEVICES", "GPU-7e62d3bbc04f1e28"),
            ("LOCAL_RANK", "1"),
        ],
    );
    assert_eq!(
        r.message("devices"),
        "LOCAL_RANK=1 but only 1 AMD device is visible through ROCR_VISIBLE_DEVICES=GPU-7e62d3bbc04f1e28"
    );
    let r = run_env(
        "amd-mi300x",
        ALL_KINDS,
        &[("ROCR_VISIBLE_DEVICES", "4,5,6,7"), ("LOCAL_RANK", "3")],
    );
    assert_eq!(
        r.message("devices"),
        "AMD: 8 on PCI, 8 usable (driver and device nodes), 4 visible"
    );
}

/// A two-GPU AMD node built in a temporary root: one GPU with RAS
/// uncorrectable errors, the other's VRAM mostly in use.
#[test]
fn amd_health_from_amdgpu_files_names_the_gpu() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("sys/bus/pci/drivers/amdgpu")).unwrap();
    let gpus = [
        ("0000:05:00.0", "ue: 2\nce: 17\n", "1073741824"),
        ("0000:26:00.0", "ue: 0\nce: 0\n", "103079215104"),
    ];
    for (bus, ras, used) in gpus {
        let d = root.join("sys/bus/pci/devices").join(bus);
        std::fs::create_dir_all(d.join("ras")).unwrap();
        std::fs::write(d.join("vendor"), "0x1002\n").unwrap();
        std::fs::write(d.join("class"), "0x120000\n").unwrap();
        std::fs::write(d.join("mem_info_vram_total"), "206141652992\n").unwrap();
        std::fs::write(d.join("mem_info_vram_used"), format!("{used}\n")).unwrap();
        std::fs::write(d.join("ras/umc_err_count"), ras).unwrap();
        std::os::unix::fs::symlink("../../drivers/amdgpu", d.join("driver")).unwrap();
    }
    let checklist = root.join("c.yaml");
    std::fs::write(
        &checklist,
        "checks:\n  - {id: h, kind: gpu_health, max_uncorrectable_ecc: 0, min_free_ratio: 0.9}\n",
    )
    .unwrap();
    let r = run_on_root(root, &checklist, &[]);
    assert_eq!(
        r.message("h"),
        "0000:05:00.0: 2 uncorrectable ECC errors (at most 0); free memory is unbalanced: 0000:26:00.0 has 96 GiB free against 191 GiB on 0000:05:00.0 (below 90% of it); SGLang refuses to start (\"The memory capacity is unbalanced. Some GPUs may be occupied by other processes.\")"
    );
    assert_eq!(r.code, 1);
}

/// Two Intel GPU Max cards in a temporary root: one on i915 (tiles as
/// drm/cardN/gt/gtM), one on xe (tiles as tileM), no Level Zero loader and
/// one render node missing from /dev.
#[test]
fn intel_driver_split_tiles_and_missing_loader() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mk = |rel: &str| std::fs::create_dir_all(root.join(rel)).unwrap();
    let write = |rel: &str, text: &str| std::fs::write(root.join(rel), text).unwrap();
    mk("sys/bus/pci/drivers/i915");
    mk("sys/bus/pci/drivers/xe");
    mk("dev/dri");
    for (bus, driver, render) in [
        ("0000:16:00.0", "i915", "renderD128"),
        ("0000:38:00.0", "xe", "renderD129"),
    ] {
        let d = format!("sys/bus/pci/devices/{bus}");
        mk(&format!("{d}/drm/{render}"));
        write(&format!("{d}/vendor"), "0x8086\n");
        write(&format!("{d}/device"), "0x0bd5\n");
        write(&format!("{d}/class"), "0x038000\n");
        std::os::unix::fs::symlink(
            format!("../../drivers/{driver}"),
            root.join(&d).join("driver"),
        )
        .unwrap();
        if driver == "i915" {
            mk(&format!("{d}/drm/card1/gt/gt0"));
            mk(&format!("{d}/drm/card1/gt/gt1"));
            write(&format!("dev/dri/{render}"), "");
        } else {
            mk(&format!("{d}/tile0"));
            mk(&format!("{d}/tile1"));
        }
    }
    let file = root.join("c.yaml");
    std::fs::write(
        &file,
        "checks:\n  - {id: dev, kind: devices}\n  - {id: drv, kind: driver, vendor: intel}\n",
    )
    .unwrap();
    let r = run_on_root(root, &file, &[("ZE_AFFINITY_MASK", "0,1,2,3")]);
    // The xe card lacks its render node, so only the i915 card's 2 tiles
    // are usable and ZE_AFFINITY_MASK's third entry does not exist.
    assert_eq!(
        r.message("dev"),
        "Intel: 2 on PCI, 2 in the driver, 1 with device nodes; 0000:38:00.0 has no /dev/dri/renderD129; \
         ZE_AFFINITY_MASK=0,1,2,3 names device 2, but only 2 Intel devices are usable here (0-1)"
    );
    assert_eq!(
        r.message("drv"),
        "Intel GPUs are split between drivers: i915 (0000:16:00.0) and xe (0000:38:00.0); \
         the Level Zero loader libze_loader.so.1 is not installed (not in LD_LIBRARY_PATH, the library directories or ld.so.cache)"
    );
    assert_eq!(r.code, 1);
    // With its render node, the xe card's two tiles count too.
    write("dev/dri/renderD129", "");
    let out = Command::new(BIN)
        .env_clear()
        .env("ZE_AFFINITY_MASK", "0,1,2,3")
        .args([
            "check",
            "--no-shipped",
            "--format",
            "json",
            "--only",
            "dev",
            "--checks",
        ])
        .arg(&file)
        .arg("--root")
        .arg(root)
        .output()
        .unwrap();
    let r = Run {
        report: crate::common::report_of(&out),
        code: out.status.code().unwrap(),
    };
    assert_eq!(
        r.message("dev"),
        "Intel: 2 on PCI, 2 usable (driver and device nodes), 4 visible"
    );
}

/// Two Gaudi devices in a temporary root: accel nodes from sysfs, one
/// missing in /dev, and HABANA_VISIBLE_DEVICES past the usable ones.
#[test]
fn habana_accel_nodes_and_mask() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mk = |rel: &str| std::fs::create_dir_all(root.join(rel)).unwrap();
    let write = |rel: &str, text: &str| std::fs::write(root.join(rel), text).unwrap();
    mk("sys/bus/pci/drivers/habanalabs");
    mk("dev/accel");
    for (bus, node) in [("0000:33:00.0", "accel0"), ("0000:9a:00.0", "accel1")] {
        let d = format!("sys/bus/pci/devices/{bus}");
        mk(&format!("{d}/accel/{node}"));
        write(&format!("{d}/vendor"), "0x1da3\n");
        write(&format!("{d}/device"), "0x1020\n");
        write(&format!("{d}/class"), "0x120000\n");
        std::os::unix::fs::symlink("../../drivers/habanalabs", root.join(&d).join("driver"))
            .unwrap();
    }
    write("dev/accel/accel0", "");
    let file = root.join("c.yaml");
    std::fs::write(
        &file,
        "checks:\n  - {id: dev, kind: devices}\n  - {id: drv, kind: driver}\n",
    )
    .unwrap();
    let r = run_on_root(root, &file, &[("HABANA_VISIBLE_DEVICES", "0,1")]);
    assert_eq!(
        r.message("dev"),
        "Habana: 2 on PCI, 2 in the driver, 1 with device nodes; 0000:9a:00.0 has no /dev/accel/accel1; \
         HABANA_VISIBLE_DEVICES=0,1 names device 1, but only 1 Habana device is usable here (0)"
    );
    assert_eq!(
        r.message("drv"),
        "Habana driver (no version published): habanalabs bound"
    );
}

/// EXPECTED.md of the AMD and Intel trees: a correct tool reports no
/// failures on them with the shipped checklist (the MI300X node's 192 CPUs
/// and the like must not trip a shipped check).
#[test]
fn amd_and_intel_trees_pass_the_shipped_checklist() {
    let _shared = crate::common::shared();
    for tree in ["amd-mi300x", "intel-max-xpu"] {
        let r = run_with(tree, "", &[], true);
        let failed: Vec<String> = r
            .report
            .checks
            .iter()
            .filter(|c| c.status == crate::common::Status::Fail)
            .map(|c| format!("{}: {}", c.id, c.message))
            .collect();
        assert!(failed.is_empty(), "{tree}: {failed:#?}");
        assert_ne!(
            r.report.verdict,
            crate::common::Verdict::NotReady,
            "{tree}: {:#}",
            r.report
        );
        assert_eq!(r.status("accelerators.devices"), "pass", "{tree}");
    }
}
