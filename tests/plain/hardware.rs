//! The hardware check kinds run by the real binary over the fixture trees
//! (fixtures/*/root), with each fixture's environment and nothing else.
//! Assertions name the exact device, port, bus id and value.

use std::path::Path;
use std::process::Command;

use crate::common::fixture_run;
use crate::common::skip;
use fixture_run::*;

mod vendors;

mod host;

/// Every hardware kind, configured as a strict site checklist would.
const ALL_KINDS: &str = r#"
checks:
  - {id: devices, kind: devices}
  - {id: driver, kind: driver, peermem: true, min_version: "535.104.05", nvidia_smi_xml: "{fixture}/nvidia-smi-q.xml"}
  - {id: ecc, kind: gpu_health, max_uncorrectable_ecc: 0, remapped_rows: true, nvidia_smi_xml: "{fixture}/nvidia-smi-q.xml"}
  - {id: xid, kind: gpu_health, xid: true}
  - {id: persistence, kind: gpu_health, persistence: true, nvidia_smi_xml: "{fixture}/nvidia-smi-q.xml"}
  - {id: in_use, kind: gpu_health, max_used: 1GiB, nvidia_smi_xml: "{fixture}/nvidia-smi-q.xml"}
  - {id: balance, kind: gpu_health, min_free_ratio: 0.9, nvidia_smi_xml: "{fixture}/nvidia-smi-q.xml"}
  - {id: ib, kind: infiniband, min_rate: 400, link_layer: InfiniBand, ipoib: true, active_per_gpu: true}
  - {id: ib_counters, kind: infiniband, state: false, max_counters: {symbol_error: 0, link_downed: 0, port_rcv_errors: 0, link_error_recovery: 0}}
  - {id: memlock, kind: infiniband, state: false, min_memlock: unlimited}
  - {id: pcie, kind: pcie_link}
  - {id: memory, kind: memory, min_available: 64GiB, min_shm: 1GiB, min_nofile: 65536}
  - {id: disk, kind: disk_free, paths: [/tmp, /var/checkpoints/run-1], min_free: 1M}
  - {id: time, kind: time_sync}
  - {id: cpu, kind: cpu, min_cpus: 224, governor: performance, cpus_per_rank: 1}
"#;

// ---------------------------------------------------------------- (a)

#[test]
fn healthy_h100_passes_every_kind() {
    let _shared = crate::common::shared();
    let r = run("h100-ib-healthy", ALL_KINDS);
    for c in &r.report.checks {
        assert_eq!(c.status.name(), "pass", "{c:#?}");
    }
    assert_eq!(r.code, 0);
    assert_eq!(
        r.message("devices"),
        "NVIDIA: 8 on PCI, 8 usable (driver and device nodes), 8 visible"
    );
    assert_eq!(r.measured("devices"), "8/8 usable");
    let xml = fixture("h100-ib-healthy").join("nvidia-smi-q.xml");
    assert_eq!(
        r.message("driver"),
        format!(
            "NVIDIA driver 550.90.07: nvidia bound, {} agrees, nvidia_peermem loaded",
            xml.display()
        )
    );
    assert_eq!(r.message("xid"), "no Xid errors");
    assert_eq!(
        r.message("ib"),
        "8 of 8 ports active, InfiniBand 400 Gb/sec (4X NDR), 8 IPoIB up"
    );
    assert_eq!(r.measured("pcie"), "0 of 17 degraded");
    let pcie = r.message("pcie");
    assert!(
        pcie.starts_with("17 links at full width and speed; "),
        "{pcie}"
    );
    assert!(
        pcie.contains("GPU 0000:18:00.0 numa 0, NIC 0000:19:00.0 numa 0"),
        "{pcie}"
    );
    assert!(
        pcie.contains("GPU 0000:db:00.0 numa 1, NIC 0000:dc:00.0 numa 1"),
        "{pcie}"
    );
    assert_eq!(
        r.message("memory"),
        "1.9 TiB available, /dev/shm 1 TiB, ulimit -n 1048576"
    );
    assert_eq!(
        r.message("time"),
        "chronyd running; kernel clock state unknown (no adjtimex, timedatectl or timesyncd flag)"
    );
    assert_eq!(
        r.message("cpu"),
        "224 CPUs online, governor performance, no /proc/self/cgroup under --root: cgroup limits not checked"
    );
}

#[test]
fn healthy_h100_with_the_shipped_checklist_is_ready() {
    let _shared = crate::common::shared();
    let r = run_with("h100-ib-healthy", "", &[], true);
    assert_eq!(
        r.report.verdict,
        crate::common::Verdict::Ready,
        "{:#}",
        r.report
    );
    assert_eq!(r.code, 0);
    assert_eq!(r.status("accelerators.devices"), "pass");
    assert_eq!(r.status("nvidia.driver"), "pass");
    assert_eq!(r.status("nvidia.gpudirect_rdma"), "pass");
    assert_eq!(r.status("pcie.links"), "pass");
    assert_eq!(r.status("ib.ports"), "pass");
    assert_eq!(r.status("ib.memlock"), "pass");
    assert_eq!(r.status("ib.hca_per_gpu"), "pass");
    // No recording and not the real machine: GPU health has no source.
    assert_eq!(r.status("nvidia.ecc"), "skip");
    assert!(r.message("nvidia.ecc").contains("set nvidia_smi_xml"));
    assert_eq!(r.status("amd.driver"), "skip");
    assert_eq!(r.message("amd.driver"), "no AMD GPU present");
}

#[test]
fn visibility_by_uuid_and_local_rank() {
    let _shared = crate::common::shared();
    let masks = [
        (
            "CUDA_VISIBLE_DEVICES",
            "GPU-0477efaf-2c7e-085e-3e34-58a041b619cd,GPU-01deee74",
        ),
        ("LOCAL_RANK", "1"),
    ];
    let r = run_env("h100-ib-healthy", ALL_KINDS, &masks);
    assert_eq!(r.status("devices"), "pass");
    assert_eq!(
        r.message("devices"),
        "NVIDIA: 8 on PCI, 8 usable (driver and device nodes), 2 visible"
    );
    let r = run_env(
        "h100-ib-healthy",
        ALL_KINDS,
        &[masks[0], ("LOCAL_RANK", "2")],
    );
    assert_eq!(r.status("devices"), "fail");
    assert_eq!(
        r.message("devices"),
        "LOCAL_RANK=2 but only 2 NVIDIA devices are visible through CUDA_VISIBLE_DEVICES=GPU-0477efaf-2c7e-085e-3e34-58a041b619cd,GPU-01deee74"
    );
    let r = run_env(
        "h100-ib-healthy",
        ALL_KINDS,
        &[("CUDA_VISIBLE_DEVICES", "0,1,8,2")],
    );
    assert_eq!(
        r.message("devices"),
        "CUDA_VISIBLE_DEVICES=0,1,8,2 names device 8, but only 8 NVIDIA devices are usable here (0-7)"
    );
    let r = run_env(
        "h100-ib-healthy",
        ALL_KINDS,
        &[("CUDA_VISIBLE_DEVICES", "3,3")],
    );
    assert_eq!(
        r.message("devices"),
        "CUDA_VISIBLE_DEVICES=3,3 names 0000:5d:00.0 twice"
    );
}

#[test]
fn expected_count_from_the_checklist() {
    let _shared = crate::common::shared();
    let r = run(
        "h100-ib-healthy",
        "checks:\n  - {id: d, kind: devices, vendor: nvidia, expect: 16}\n  - {id: a, kind: devices, vendor: amd}\n",
    );
    assert_eq!(
        r.message("d"),
        "8 NVIDIA devices on the PCI bus, expected 16"
    );
    assert_eq!(r.check("d").expected.as_deref(), Some("16"));
    assert_eq!(r.message("a"), "no AMD accelerator on the PCI bus");
}

#[test]
fn memory_balance_follows_the_visible_gpus() {
    let _shared = crate::common::shared();
    // On the broken node only 0000:5d:00.0 is short of memory; masked out,
    // the remaining GPUs are balanced.
    let r = run_env(
        "h100-ib-broken",
        ALL_KINDS,
        &[("CUDA_VISIBLE_DEVICES", "0,1,2,4")],
    );
    assert_eq!(r.status("balance"), "pass");
    let r = run_env(
        "h100-ib-broken",
        ALL_KINDS,
        &[("CUDA_VISIBLE_DEVICES", "2,3")],
    );
    assert_eq!(r.status("balance"), "fail");
    assert!(
        r.message("balance")
            .contains("0000:5d:00.0 has 39.1 GiB free against 79.1 GiB on 0000:3a:00.0")
    );
}

// ---------------------------------------------------------------- (b)

#[test]
fn broken_h100_reports_every_fault_by_device() {
    let _shared = crate::common::shared();
    let r = run("h100-ib-broken", ALL_KINDS);
    assert_eq!(r.report.verdict, crate::common::Verdict::NotReady);
    assert_eq!(r.code, 1);
    // 1. GPU on PCI without a driver.
    assert_eq!(
        r.message("devices"),
        "NVIDIA: 8 on PCI, 7 in the driver, 7 with device nodes; 0000:9a:00.0 is on the PCI bus but not bound to any driver"
    );
    assert_eq!(r.measured("devices"), "7/8 usable");
    // 7. nvidia_peermem.
    assert_eq!(
        r.message("driver"),
        "0000:9a:00.0 is not bound to any driver (expected nvidia); GPUDirect RDMA is unavailable: neither nvidia_peermem nor nv_peer_mem is loaded"
    );
    // 10. ECC and remap on 0000:ba:00.0.
    assert_eq!(
        r.message("ecc"),
        "0000:ba:00.0: 1 uncorrectable ECC error (at most 0); 0000:ba:00.0: a row remap is pending: reset the GPU"
    );
    // 2 and 10. Xid 79 and 48, each with its action (63, the remap
    // recorded, needs none; the whole message: tests/plain/gpu_depth.rs).
    let xid = r.message("xid");
    for part in [
        "0000:9a:00.0 Xid 79 (fallen off the bus): reboot",
        "GPU 5 (0000:ba:00.0) Xid 48 (double-bit ECC error): reset the GPU",
    ] {
        assert!(xid.contains(part), "{part} missing: {xid}");
    }
    // 11. Persistence.
    assert_eq!(
        r.message("persistence"),
        "0000:db:00.0: persistence mode is off"
    );
    // 9. Memory used by another process, and the balance SGLang checks.
    assert_eq!(
        r.message("in_use"),
        "0000:5d:00.0: 40 GiB already in use (pid 3114872 /usr/bin/python3 40 GiB), more than 1 GiB"
    );
    assert_eq!(
        r.message("balance"),
        "free memory is unbalanced: 0000:5d:00.0 has 39.1 GiB free against 79.1 GiB on 0000:db:00.0 (below 90% of it); SGLang refuses to start (\"The memory capacity is unbalanced. Some GPUs may be occupied by other processes.\")"
    );
    // 3 and 4. Degraded links.
    assert_eq!(
        r.message("pcie"),
        "0000:3a:00.0 (GPU, numa 0): link x8 at 32 GT/s, capable of x16 at 32 GT/s; 0000:ab:00.0 (GPU, numa 1): link x16 at 16 GT/s, capable of x16 at 32 GT/s"
    );
    assert_eq!(r.measured("pcie"), "2 of 17 degraded");
    // 5 and 8. mlx5_3 down, mlx5_9 absent; ib3 down.
    assert_eq!(
        r.message("ib"),
        "NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_9 names mlx5_9, which is not present (present: mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7); \
         mlx5_3 port 1 (0000:5e:00.0, not selected by NCCL_IB_HCA): state DOWN, phys_state Polling; \
         2 active ports, expected at least 8 (one per accelerator: 8 on the bus); IPoIB interface ib3 is down, no carrier"
    );
    // 6. Error counters on mlx5_5.
    assert_eq!(
        r.message("ib_counters"),
        "mlx5_5 port 1: link_downed is 3 (at most 0); mlx5_5 port 1: link_error_recovery is 11 (at most 0); mlx5_5 port 1: port_rcv_errors is 27 (at most 0); mlx5_5 port 1: symbol_error is 1473 (at most 0)"
    );
    // Not faults: must pass.
    for id in ["memlock", "memory", "disk", "time", "cpu"] {
        assert_eq!(r.status(id), "pass", "{id}: {}", r.message(id));
    }
}

#[test]
fn broken_h100_without_nccl_ib_hca_checks_every_port() {
    let _shared = crate::common::shared();
    let r = run_env(
        "h100-ib-broken",
        ALL_KINDS,
        &[(
            "NCCL_IB_HCA",
            "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7",
        )],
    );
    assert_eq!(
        r.message("ib"),
        "mlx5_3 port 1 (0000:5e:00.0): state DOWN, phys_state Polling; 7 active ports, expected at least 8 (one per accelerator: 8 on the bus); IPoIB interface ib3 is down, no carrier"
    );
    // NCCL_IB_HCA=mlx5, as in the field notes: a prefix selecting all eight.
    let prefix = run_env("h100-ib-broken", ALL_KINDS, &[("NCCL_IB_HCA", "mlx5")]);
    assert_eq!(prefix.message("ib"), r.message("ib"));
}

#[test]
fn broken_h100_local_rank_past_the_usable_gpus() {
    let _shared = crate::common::shared();
    let r = run_env(
        "h100-ib-broken",
        ALL_KINDS,
        &[("LOCAL_RANK", "7"), ("LOCAL_WORLD_SIZE", "8")],
    );
    let m = r.message("devices");
    assert!(
        m.contains("LOCAL_WORLD_SIZE=8 ranks on this node, but only 7 usable NVIDIA devices"),
        "{m}"
    );
    assert!(
        m.contains("LOCAL_RANK=7 but only 7 NVIDIA devices are visible"),
        "{m}"
    );
    let r = run_env(
        "h100-ib-broken",
        ALL_KINDS,
        &[(
            "CUDA_VISIBLE_DEVICES",
            "GPU-6b4ad8b0-0cbf-d9cf-e9d4-01d22834ea99",
        )],
    );
    assert!(r.message("devices").ends_with(
        "CUDA_VISIBLE_DEVICES=GPU-6b4ad8b0-0cbf-d9cf-e9d4-01d22834ea99 names GPU-6b4ad8b0-0cbf-d9cf-e9d4-01d22834ea99, which is not a usable GPU on this node"
    ));
}

#[test]
fn driver_minimum_and_library_mismatch() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let xml = std::fs::read_to_string(fixture("h100-ib-healthy").join("nvidia-smi-q.xml"))
        .unwrap()
        .replace(
            "<driver_version>550.90.07</driver_version>",
            "<driver_version>550.54.15</driver_version>",
        );
    let path = dir.path().join("smi.xml");
    std::fs::write(&path, xml).unwrap();
    let checklist = format!(
        "checks:\n  - {{id: d, kind: driver, min_version: \"560.28.03\", nvidia_smi_xml: \"{}\"}}\n",
        path.display()
    );
    let r = run("h100-ib-healthy", &checklist);
    assert_eq!(
        r.message("d"),
        format!(
            "driver/library version mismatch: the kernel module is 550.90.07 but {} reports 550.54.15; NVIDIA driver 550.90.07 is older than the minimum 560.28.03",
            path.display()
        )
    );
    assert_eq!(r.check("d").expected.as_deref(), Some(">= 560.28.03"));
}

#[test]
fn malformed_nvidia_smi_xml_is_an_error_with_the_path() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smi.xml");
    std::fs::write(&path, "<nvidia_smi_log><gpu id=").unwrap();
    let checklist = format!(
        "checks:\n  - {{id: h, kind: gpu_health, persistence: true, nvidia_smi_xml: \"{}\"}}\n",
        path.display()
    );
    let r = run("h100-ib-healthy", &checklist);
    assert_eq!(r.status("h"), "error");
    assert!(
        r.message("h")
            .starts_with(&format!("{}: invalid XML", path.display()))
    );
    assert_eq!(r.code, 3);
}

// ---------------------------------------------------------------- (e)

const ROCE: &str = r#"
checks:
  - {id: roce, kind: infiniband, link_layer: Ethernet, min_rate: 100, gid_type: RoCE v2, min_memlock: unlimited}
  - {id: rate, kind: infiniband, state: false, min_rate: 200}
  - {id: ib_layer, kind: infiniband, state: false, link_layer: InfiniBand}
"#;

#[test]
fn roce_node_gid_and_link_layer() {
    let _shared = crate::common::shared();
    let r = run("roce-node", ROCE);
    assert_eq!(r.status("roce"), "pass", "{}", r.message("roce"));
    assert_eq!(
        r.message("roce"),
        "2 of 2 ports active, Ethernet 100 Gb/sec (4X EDR)"
    );
    assert_eq!(
        r.message("rate"),
        "mlx5_0 port 1: rate 100 Gb/sec (4X EDR), expected at least 200 Gb/sec; mlx5_1 port 1: rate 100 Gb/sec (4X EDR), expected at least 200 Gb/sec"
    );
    assert_eq!(
        r.message("ib_layer"),
        "mlx5_0 port 1: link layer Ethernet, expected InfiniBand; mlx5_1 port 1: link layer Ethernet, expected InfiniBand"
    );
    let r = run_env("roce-node", ROCE, &[("NCCL_IB_GID_INDEX", "2")]);
    assert_eq!(
        r.message("roce"),
        "mlx5_0 port 1: GID index 2 is IB/RoCE v1, expected RoCE v2; mlx5_1 port 1: GID index 2 is IB/RoCE v1, expected RoCE v2"
    );
    let r = run_env("roce-node", ROCE, &[("NCCL_IB_GID_INDEX", "4")]);
    assert_eq!(
        r.message("roce"),
        "mlx5_0 port 1: GID index 4 is empty (no address on the RoCE interface?); mlx5_1 port 1: GID index 4 is empty (no address on the RoCE interface?)"
    );
    let r = run_env("roce-node", ROCE, &[("NCCL_IB_HCA", "mlx5_1:1")]);
    assert_eq!(
        r.message("roce"),
        "1 of 1 port active, Ethernet 100 Gb/sec (4X EDR)"
    );
    let r = run_env("roce-node", ROCE, &[("NCCL_IB_HCA", "^mlx5")]);
    assert_eq!(
        r.message("roce"),
        "NCCL_IB_HCA=^mlx5 selects no port on this node"
    );
}

#[test]
fn roce_node_gpus_and_shipped_checks() {
    let _shared = crate::common::shared();
    let r = run_with("roce-node", "", &[], true);
    assert_eq!(
        r.report.verdict,
        crate::common::Verdict::Ready,
        "{:#}",
        r.report
    );
    assert_eq!(r.status("ib.roce_gid"), "pass");
    assert_eq!(r.status("ib.hca_per_gpu"), "pass");
    assert_eq!(
        r.message("accelerators.devices"),
        "NVIDIA: 2 on PCI, 2 usable (driver and device nodes), 2 visible"
    );
}

// ---------------------------------------------------------------- malformed input

#[test]
fn malformed_sysfs_is_an_error_naming_the_file_not_a_panic() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let write = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("sys/devices/system/cpu/online", "zero-to-three\n");
    write("proc/meminfo", "MemTotal: lots\n");
    write("proc/self/limits", "Max open files  many  many  files\n");
    write("sys/bus/pci/devices/0000:18:00.0/vendor", "0x10de\n");
    write("sys/bus/pci/devices/0000:18:00.0/class", "0x030200\n");
    write(
        "sys/bus/pci/devices/0000:18:00.0/current_link_width",
        "sixteen\n",
    );
    write("sys/bus/pci/devices/0000:18:00.0/max_link_width", "16\n");
    write("sys/bus/pci/devices/0000:18:00.0/numa_node", "-1\n");
    write("sys/class/infiniband/mlx5_0/ports/1/state", "\n");
    write("proc/driver/nvidia/version", "NVRM version: garbled\n");
    let checklist = dir.path().join("c.yaml");
    std::fs::write(
        &checklist,
        "checks:\n  - {id: cpu, kind: cpu, min_cpus: 1}\n  - {id: mem, kind: memory, min_available: 1G}\n  - {id: nofile, kind: memory, min_nofile: 10}\n  - {id: pcie, kind: pcie_link}\n  - {id: ib, kind: infiniband}\n  - {id: drv, kind: driver, vendor: nvidia}\n  - {id: dev, kind: devices}\n",
    )
    .unwrap();
    let r = run_on_root(root, &checklist, &[]);
    assert_eq!(r.status("cpu"), "error");
    assert_eq!(
        r.message("cpu"),
        "/sys/devices/system/cpu/online: `zero-to-three` is not a CPU list"
    );
    assert_eq!(r.message("mem"), "/proc/meminfo has no MemAvailable");
    assert_eq!(
        r.message("nofile"),
        "/proc/self/limits: `Max open files` soft limit `many` is not a number"
    );
    assert_eq!(r.status("pcie"), "error");
    assert_eq!(
        r.message("pcie"),
        "unreadable link attributes: /sys/bus/pci/devices/0000:18:00.0/current_link_width: `sixteen`"
    );
    assert_eq!(r.status("ib"), "error");
    assert_eq!(
        r.message("ib"),
        "unreadable or empty: /sys/class/infiniband/mlx5_0/ports/1/state, /sys/class/infiniband/mlx5_0/ports/1/phys_state"
    );
    assert!(
        r.message("drv")
            .contains("/proc/driver/nvidia/version has no version in its NVRM line")
    );
    assert!(
        r.message("dev")
            .contains("0000:18:00.0 is on the PCI bus but not bound to any driver")
    );
    assert_eq!(r.code, 1);
}

#[test]
fn fabric_registration_incomplete_names_the_gpu() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let xml = std::fs::read_to_string(fixture("h100-ib-healthy").join("nvidia-smi-q.xml")).unwrap();
    // The third GPU's fabric state: registration still in progress.
    let mut parts: Vec<&str> = xml.split("<state>Completed</state>").collect();
    assert!(parts.len() > 3, "fixture has fabric states");
    let tail = parts.split_off(3).join("<state>Completed</state>");
    let xml = format!(
        "{}<state>In Progress</state>{tail}",
        parts.join("<state>Completed</state>")
    );
    let path = dir.path().join("smi.xml");
    std::fs::write(&path, xml).unwrap();
    let checklist = format!(
        "checks:\n  - {{id: d, kind: driver, nvidia_smi_xml: \"{}\"}}\n",
        path.display()
    );
    let r = run("h100-ib-healthy", &checklist);
    assert_eq!(
        r.message("d"),
        "0000:3a:00.0: fabric registration In Progress (Success)"
    );
}

#[test]
fn broken_h100_with_the_shipped_checklist_names_faults_in_hints() {
    let _shared = crate::common::shared();
    let r = run_with("h100-ib-broken", "", &[], true);
    assert_eq!(r.report.verdict, crate::common::Verdict::NotReady);
    assert_eq!(r.code, 1);
    assert_eq!(r.status("accelerators.devices"), "fail");
    assert!(
        r.hint("accelerators.devices")
            .starts_with("Missing from the driver or /dev: 0000:9a:00.0.")
    );
    assert_eq!(r.status("nvidia.gpudirect_rdma"), "warn");
    assert_eq!(
        r.message("nvidia.gpudirect_rdma"),
        "GPUDirect RDMA is unavailable: neither nvidia_peermem nor nv_peer_mem is loaded"
    );
    assert_eq!(r.status("pcie.links"), "fail");
    assert!(
        r.hint("pcie.links")
            .starts_with("Degraded: 0000:3a:00.0, 0000:ab:00.0.")
    );
    assert!(r.hint("ib.ports").starts_with("Down: mlx5_3 port 1."));
    assert_eq!(r.status("ib.error_counters"), "warn");
    assert_eq!(
        r.message("ib.error_counters"),
        "mlx5_5 port 1: symbol_error is 1473 (at most 100)"
    );
    assert_eq!(r.status("ib.memlock"), "pass");
    assert_eq!(r.status("cpu.governor"), "pass");
}

/// A port an administrator disabled (phys_state Disabled) is not a fault:
/// left alone. A port that should be up and is not (Polling: no link
/// partner) is named.
#[test]
fn a_disabled_ib_port_is_left_alone_and_a_polling_one_is_named() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let ok = Command::new("cp")
        .arg("-a")
        .arg(fixture("h100-ib-healthy").join("root"))
        .arg(&root)
        .status()
        .unwrap();
    assert!(ok.success());
    let port = |hca: &str| root.join(format!("sys/class/infiniband/{hca}/ports/1"));
    std::fs::write(port("mlx5_3").join("state"), "1: DOWN\n").unwrap();
    std::fs::write(port("mlx5_3").join("phys_state"), "3: Disabled\n").unwrap();
    let file = dir.path().join("c.yaml");
    std::fs::write(&file, "checks:\n  - {id: ib, kind: infiniband}\n").unwrap();
    let r = run_on_root(&root, &file, &[]);
    assert_eq!(r.status("ib"), "pass", "{}", r.message("ib"));
    std::fs::write(port("mlx5_3").join("phys_state"), "2: Polling\n").unwrap();
    let r = run_on_root(&root, &file, &[]);
    assert_eq!(r.status("ib"), "fail");
    assert!(
        r.message("ib")
            .contains("mlx5_3 port 1 (0000:5e:00.0): state DOWN, phys_state Polling"),
        "{}",
        r.message("ib")
    );
}

/// Xids an application causes (13 graphics exception, 31 MMU fault, 43
/// stopped work, 45 killed work) are not the node's fault and are left out
/// by default; the hardware's (79 fallen off the bus) is named; a saved
/// dmesg given as `kernel_log` is read instead of /dev/kmsg; with
/// `ignore_xids: []` every one counts.
#[test]
fn application_xids_are_ignored_by_default_in_a_saved_kernel_log() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("dmesg.txt");
    std::fs::write(
        &log,
        "[  812.100] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)\n\
         [  812.200] NVRM: Xid (PCI:0000:18:00): 31, pid=4242, name=python3, Ch 0000000a, intr 10000000. MMU Fault\n\
         [  813.000] NVRM: Xid (PCI:0000:2a:00): 43, pid=4243, name=python3, Ch 00000008\n\
         [  813.100] NVRM: Xid (PCI:0000:2a:00): 45, pid=4243, name=python3, Ch 00000008\n\
         [  900.000] NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n",
    )
    .unwrap();
    let checklist = format!(
        "checks:\n  - {{id: default, kind: gpu_health, xid: true, kernel_log: \"{l}\"}}\n  - {{id: all, kind: gpu_health, xid: true, ignore_xids: [], kernel_log: \"{l}\"}}\n",
        l = log.display()
    );
    let r = run("h100-ib-healthy", &checklist);
    assert_eq!(r.status("default"), "fail");
    assert_eq!(
        r.message("default"),
        "GPU 2 (0000:3a:00.0) Xid 79 (fallen off the bus): reboot, at 900.0 s after boot: pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    );
    // Counted with `ignore_xids: []`, each with the catalog's action
    // (43 and 45 need none in NVIDIA's catalog: they are not problems).
    let all = r.message("all");
    assert!(
        !all.contains("Xid 43 ") && !all.contains("Xid 45 "),
        "{all}"
    );
    for xid in [
        "Xid 13 (graphics engine exception): restart the application",
        "Xid 31 (GPU memory page fault): restart the application",
        "Xid 79 ",
    ] {
        assert!(all.contains(xid), "{xid} missing: {all}");
    }
}

/// A check reports every problem it found: a part it could not read is
/// named beside them, never in their place. The ECC and row-remap faults
/// of the broken tree stay failures when the kernel log for the Xid part
/// cannot be read; with nothing wrong in what was read, the unread part
/// makes the check could-not-evaluate, never a pass.
#[test]
fn gpu_health_keeps_its_findings_when_a_part_cannot_be_read() {
    let _shared = crate::common::shared();
    let r = run(
        "h100-ib-broken",
        r#"
checks:
  - {id: both, kind: gpu_health, max_uncorrectable_ecc: 0, remapped_rows: true, xid: true, kernel_log: /nonexistent/dmesg, nvidia_smi_xml: "{fixture}/nvidia-smi-q.xml"}
  - {id: clean, kind: gpu_health, max_used: 1024GiB, xid: true, kernel_log: /nonexistent/dmesg, nvidia_smi_xml: "{fixture}/nvidia-smi-q.xml"}
"#,
    );
    assert_eq!(r.status("both"), "fail");
    assert_eq!(
        r.message("both"),
        "0000:ba:00.0: 1 uncorrectable ECC error (at most 0); 0000:ba:00.0: a row remap is pending: reset the GPU; \
         not checked: cannot read /nonexistent/dmesg: No such file or directory (os error 2)"
    );
    assert_eq!(r.measured("both"), "2 problems");
    assert_eq!(r.status("clean"), "error");
    assert_eq!(
        r.message("clean"),
        "cannot read /nonexistent/dmesg: No such file or directory (os error 2)"
    );
}

/// The same for `memory`: a low open-files limit is reported when
/// /proc/meminfo cannot be read, with the unread part named beside it.
#[test]
fn memory_keeps_its_findings_when_a_part_cannot_be_read() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("proc/self")).unwrap();
    std::fs::write(
        root.join("proc/self/limits"),
        "Limit                     Soft Limit           Hard Limit           Units     \n\
         Max open files            1024                 1048576              files     \n",
    )
    .unwrap();
    let checklist = dir.path().join("checks.yaml");
    std::fs::write(
        &checklist,
        "checks:\n  - {id: memory, kind: memory, min_available: 1GiB, min_nofile: 65536}\n  - {id: readable, kind: memory, min_nofile: 1000}\n  - {id: unread, kind: memory, min_available: 1GiB, min_nofile: 1000}\n",
    )
    .unwrap();
    let r = run_on_root(&root, &checklist, &[]);
    assert_eq!(r.status("memory"), "fail");
    assert_eq!(
        r.message("memory"),
        "open files limited to 1024 (ulimit -n), expected at least 65536; \
         not checked: cannot read /proc/meminfo: No such file or directory (os error 2)"
    );
    assert_eq!(r.measured("memory"), "ulimit -n 1024");
    assert_eq!(r.status("readable"), "pass");
    // Nothing wrong in what was read, and a part unread: not evaluated.
    assert_eq!(r.status("unread"), "error");
    assert_eq!(
        r.message("unread"),
        "cannot read /proc/meminfo: No such file or directory (os error 2)"
    );
}

/// fixtures/check-tree.sh: every fixture tree's links stay inside it,
/// device placeholders are empty files, env files are KEY=VALUE lines.
#[test]
fn fixture_trees_pass_their_own_sanity_check() {
    let _shared = crate::common::shared();
    let out = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/check-tree.sh"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
