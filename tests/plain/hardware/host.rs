//! The host beside the accelerators, on fixture trees and this machine:
//! CPU-only nodes, memory, shm and hugepages, time sync (adjtimex, chrony,
//! PTP), and cgroup v1 and v2 limits along the path.

use super::*;

// ---------------------------------------------------------------- (f)

#[test]
fn cpu_node_skips_hardware_with_reasons() {
    let _shared = crate::common::shared();
    let r = run("cpu-node", ALL_KINDS);
    assert_eq!(r.message("devices"), "no accelerator present");
    assert_eq!(r.message("driver"), "no accelerator present");
    for id in ["ecc", "xid", "persistence", "in_use", "balance"] {
        assert_eq!(r.status(id), "skip");
        assert_eq!(r.message(id), "no NVIDIA or AMD GPU present");
    }
    for id in ["ib", "ib_counters", "memlock"] {
        assert_eq!(r.status(id), "skip");
        assert_eq!(
            r.message(id),
            "no RDMA device (/sys/class/infiniband is empty or absent)"
        );
    }
    assert_eq!(
        r.message("pcie"),
        "no GPU or NIC with PCIe link attributes in sysfs"
    );
    assert_eq!(
        r.message("time"),
        "systemd-timesyn running; clock synchronised (/run/systemd/timesync/synchronized)"
    );
    // 8 GB VM: the 64 GiB threshold fails, naming the value; the open
    // files limit, which the tree has no file for, is named as not checked
    // beside it, never in place of it.
    assert_eq!(r.status("memory"), "fail");
    assert_eq!(
        r.message("memory"),
        "only 6.6 GiB of RAM available, expected at least 64 GiB; not checked: no /proc/self/limits under --root and no nofile policy in /etc/security"
    );
    // MemAvailable: 6943856 kB in the tree's /proc/meminfo.
    assert_eq!(r.measured("memory"), "6.6 GiB available, /dev/shm 3.9 GiB");
    assert_eq!(
        r.message("cpu"),
        "2 CPUs online (0-1), expected at least 224"
    );
}

#[test]
fn cpu_node_memory_and_shm_default_size() {
    let _shared = crate::common::shared();
    let r = run(
        "cpu-node",
        "checks:\n  - {id: m, kind: memory, min_available: 64GiB, min_shm: 8GiB}\n  - {id: ib, kind: infiniband, expect_active: 1}\n",
    );
    // tmpfs without size= is half of MemTotal (8131252 kB).
    assert_eq!(
        r.message("m"),
        "only 6.6 GiB of RAM available, expected at least 64 GiB; /dev/shm is 3.9 GiB, expected at least 8 GiB: NCCL and oneCCL fail or fall back"
    );
    assert_eq!(
        r.message("ib"),
        "no RDMA device (/sys/class/infiniband is empty or absent), expected 1 active ports"
    );
}

#[test]
fn cpu_node_with_the_shipped_checklist_is_ready() {
    let _shared = crate::common::shared();
    let r = run_with("cpu-node", "", &[], true);
    assert_eq!(r.code, 0, "{:#}", r.report);
    for c in &r.report.checks {
        if c.tags.iter().any(|t| t == "hardware") {
            assert_eq!(c.status.name(), "skip", "{c:#?}");
        }
    }
    assert_eq!(r.message("nvidia.driver"), "no NVIDIA GPU present");
}

// ---------------------------------------------------------------- this machine

/// On a machine without accelerators or RDMA (this project's development
/// machines and CI), every hardware check skips with a reason; none errors
/// or fails, and the verdict is ready. Elsewhere the test has nothing to
/// assert.
#[test]
fn real_machine_without_hardware_skips_hardware_checks() {
    let _shared = crate::common::shared();
    let bare = !Path::new("/proc/driver/nvidia").exists()
        && !Path::new("/sys/class/infiniband").exists()
        && !Path::new("/dev/kfd").exists()
        && !Path::new("/dev/dri").exists()
        && !Path::new("/dev/accel").exists();
    if !bare {
        skip::skip(
            "this machine has accelerator or RDMA devices: the shipped hardware checks would not all skip",
        );
        return;
    }
    let out = Command::new(BIN)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .args(["check", "--format", "json"])
        .output()
        .unwrap();
    let report = crate::common::report_of(&out);
    // Every shipped hardware check that `check` runs (opt-in ones aside),
    // as `list` states them: each must be here, and skipped.
    let list = Command::new(BIN)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .args(["list", "--format", "json"])
        .output()
        .unwrap();
    // `list`'s entries are no report: its JSON has no schema type.
    let listed: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let expected: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c["tags"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t == "hardware")
        })
        .filter(|c| !c["reason"].as_str().unwrap_or("").starts_with("opt-in"))
        .filter_map(|c| c["id"].as_str())
        .collect();
    let mut hardware = 0;
    let mut seen = Vec::new();
    for c in &report.checks {
        assert_ne!(c.status, crate::common::Status::Error, "{c:#?}");
        assert_ne!(c.status, crate::common::Status::Fail, "{c:#?}");
        if c.tags.iter().any(|t| t == "hardware") {
            hardware += 1;
            seen.push(c.id.as_str());
            assert_eq!(c.status, crate::common::Status::Skip, "{c:#?}");
            assert!(!c.message.is_empty());
        }
    }
    assert!(hardware >= 15, "{hardware} hardware checks");
    assert_eq!(seen, expected);
    assert_eq!(
        crate::common::message(&report, "nvidia.driver"),
        "no NVIDIA GPU present"
    );
    assert_eq!(out.status.code(), Some(0));
}

// ---------------------------------------------------------------- limits, clocks, cgroups

#[test]
fn memory_limits_against_world_size_hugepages_and_disk() {
    let _shared = crate::common::shared();
    let checklist = r#"
checks:
  - {id: nofile, kind: memory, nofile_per_rank: 4}
  - {id: huge, kind: memory, min_hugepages: 1024}
  - {id: disk, kind: disk_free, paths: [/tmp], min_free: 1024T}
"#;
    let r = run_env("h100-ib-healthy", checklist, &[("WORLD_SIZE", "1000000")]);
    assert_eq!(
        r.message("nofile"),
        "open files limited to 1048576 (ulimit -n), expected at least 4000000 (4 per rank x WORLD_SIZE=1000000)"
    );
    assert_eq!(
        r.message("huge"),
        "0 free hugepages, expected at least 1024"
    );
    assert_eq!(r.status("disk"), "fail");
    let disk = r.message("disk");
    assert!(disk.starts_with("/tmp: "), "{disk}");
    assert!(
        disk.ends_with(" free, expected at least 1024 TiB"),
        "{disk}"
    );
    let r = run_env("h100-ib-healthy", checklist, &[("WORLD_SIZE", "64")]);
    assert_eq!(r.status("nofile"), "pass");
    assert_eq!(r.message("nofile"), "ulimit -n 1048576");
}

#[test]
fn time_sync_from_a_recorded_adjtimex() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let unsynced = dir.path().join("adjtimex.txt");
    std::fs::write(
        &unsynced,
        "         mode: 0\n       offset: 0\n    frequency: 0\n     maxerror: 16000000\n     esterror: 16000000\n       status: 64\n",
    )
    .unwrap();
    let synced = dir.path().join("synced.txt");
    std::fs::write(
        &synced,
        "     maxerror: 2500\n     esterror: 120\n       status: 8193\n",
    )
    .unwrap();
    let checklist = format!(
        "checks:\n  - {{id: bad, kind: time_sync, max_error: 500ms, clock_state: \"{}\"}}\n  - {{id: good, kind: time_sync, max_error: 500ms, clock_state: \"{}\"}}\n",
        unsynced.display(),
        synced.display()
    );
    let r = run("cpu-node", &checklist);
    assert_eq!(
        r.message("bad"),
        format!(
            "the kernel clock is not synchronised (STA_UNSYNC set, from {}); the kernel's maximum clock error is 16s (estimated 16s), expected at most 500ms",
            unsynced.display()
        )
    );
    assert_eq!(r.measured("bad"), "unsynchronised");
    assert_eq!(
        r.message("good"),
        format!(
            "systemd-timesyn running; clock synchronised ({})",
            synced.display()
        )
    );
    // No daemon on the broken node's tree? It runs chronyd: pass. A tree
    // without any daemon fails naming the daemons looked for.
    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(empty.path().join("proc/1")).unwrap();
    std::fs::write(empty.path().join("proc/1/comm"), "systemd\n").unwrap();
    let file = empty.path().join("c.yaml");
    std::fs::write(&file, "checks:\n  - {id: t, kind: time_sync}\n").unwrap();
    let r = run_on_root(empty.path(), &file, &[]);
    assert_eq!(
        r.message("t"),
        "no time daemon is running (chronyd, ntpd, systemd-timesyncd, ptp4l)"
    );
    assert_eq!(r.code, 1);
}

#[test]
fn cgroup_v2_quota_and_memory_limit_along_the_path() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let write = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("proc/self/cgroup", "0::/slurm/uid_1000/job_42\n");
    write("sys/devices/system/cpu/online", "0-63\n");
    // The job's own cgroup is unlimited; its parent carries the quota.
    write(
        "sys/fs/cgroup/slurm/uid_1000/job_42/cpu.max",
        "max 100000\n",
    );
    write("sys/fs/cgroup/slurm/uid_1000/job_42/memory.max", "max\n");
    write("sys/fs/cgroup/slurm/uid_1000/cpu.max", "200000 100000\n");
    write("sys/fs/cgroup/slurm/uid_1000/memory.max", "8589934592\n");
    let file = root.join("c.yaml");
    std::fs::write(
        &file,
        "checks:\n  - {id: c, kind: cpu, min_cpus: 64, cpus_per_rank: 1, min_cgroup_memory: 16GiB}\n",
    )
    .unwrap();
    let r = run_on_root(root, &file, &[("LOCAL_WORLD_SIZE", "4")]);
    assert_eq!(
        r.message("c"),
        "the cgroup CPU quota is 2.0 CPUs, expected at least 4.0 (1 per rank x 4 local ranks); the cgroup memory limit is 8 GiB, expected at least 16 GiB"
    );
}

/// chrony's own view (`chronyc -n tracking`, what time_sync asks where
/// adjtimex(2) is refused) read from a recording: "Not synchronised" is a
/// failure naming it, "Normal" a pass; a PTP node running phc2sys (and no
/// NTP daemon) has its time daemon.
#[test]
fn chronyc_tracking_and_a_ptp_node_running_phc2sys() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("proc/812")).unwrap();
    std::fs::write(root.join("proc/812/comm"), "phc2sys\n").unwrap();
    let tracking = |leap: &str| {
        format!(
            "Reference ID    : 50484330 (PHC0)\nStratum         : 1\nSystem time     : 0.000000012 seconds fast of NTP time\nLeap status     : {leap}\n"
        )
    };
    let synced = root.join("tracking-ok.txt");
    let unsynced = root.join("tracking-bad.txt");
    std::fs::write(&synced, tracking("Normal")).unwrap();
    std::fs::write(&unsynced, tracking("Not synchronised")).unwrap();
    let file = root.join("c.yaml");
    std::fs::write(
        &file,
        format!(
            "checks:\n  - {{id: good, kind: time_sync, clock_state: \"{}\"}}\n  - {{id: bad, kind: time_sync, clock_state: \"{}\"}}\n",
            synced.display(),
            unsynced.display()
        ),
    )
    .unwrap();
    let r = run_on_root(root, &file, &[]);
    assert_eq!(
        r.message("good"),
        format!("phc2sys running; clock synchronised ({})", synced.display())
    );
    assert_eq!(
        r.message("bad"),
        format!(
            "the kernel clock is not synchronised (STA_UNSYNC set, from {})",
            unsynced.display()
        )
    );
}

/// cgroup v1 (still on RHEL 8 and older Slurm sites): the quota and the
/// memory limit come from the cpu and memory hierarchies, each along its
/// own path, the tightest one winning; v1's "unlimited" (a huge number)
/// is no limit.
#[test]
fn cgroup_v1_quota_and_memory_limit_along_each_hierarchy() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let write = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write(
        "proc/self/cgroup",
        "11:memory:/slurm/uid_1000/job_7\n4:cpu,cpuacct:/slurm/uid_1000/job_7\n1:name=systemd:/init.scope\n",
    );
    write("sys/devices/system/cpu/online", "0-63\n");
    write(
        "sys/fs/cgroup/cpu/slurm/uid_1000/job_7/cpu.cfs_quota_us",
        "-1\n",
    );
    write(
        "sys/fs/cgroup/cpu/slurm/uid_1000/job_7/cpu.cfs_period_us",
        "100000\n",
    );
    write(
        "sys/fs/cgroup/cpu/slurm/uid_1000/cpu.cfs_quota_us",
        "150000\n",
    );
    write(
        "sys/fs/cgroup/cpu/slurm/uid_1000/cpu.cfs_period_us",
        "100000\n",
    );
    write(
        "sys/fs/cgroup/memory/slurm/uid_1000/job_7/memory.limit_in_bytes",
        "4294967296\n",
    );
    write(
        "sys/fs/cgroup/memory/slurm/memory.limit_in_bytes",
        "9223372036854771712\n",
    );
    let file = root.join("c.yaml");
    std::fs::write(
        &file,
        "checks:\n  - {id: c, kind: cpu, min_cpus: 64, cpus_per_rank: 1, min_cgroup_memory: 16GiB}\n",
    )
    .unwrap();
    let r = run_on_root(root, &file, &[("LOCAL_WORLD_SIZE", "2")]);
    assert_eq!(
        r.message("c"),
        "the cgroup CPU quota is 1.5 CPUs, expected at least 2.0 (1 per rank x 2 local ranks); the cgroup memory limit is 4 GiB, expected at least 16 GiB"
    );
}
