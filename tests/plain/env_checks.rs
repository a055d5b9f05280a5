//! env_lint and launch_env through the binary, with a fixture tree for the
//! node's interfaces and RDMA devices.

use crate::common;

use std::path::Path;

use common::{check, checklist, measured, message, status};

fn write(root: &Path, path: &str, text: &str) {
    let p = root.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn node() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    for (name, state, ty) in [
        ("lo", "unknown", "772"),
        ("eth0", "up", "1"),
        ("ib0", "down", "32"),
    ] {
        write(r, &format!("sys/class/net/{name}/operstate"), state);
        write(r, &format!("sys/class/net/{name}/type"), ty);
    }
    write(
        r,
        "sys/class/infiniband/mlx5_0/ports/1/state",
        "4: ACTIVE\n",
    );
    write(
        r,
        "sys/class/infiniband/mlx5_0/ports/1/gids/0",
        "fe80:0000:0000:0000:0000:0000:0000:0001\n",
    );
    dir
}

#[test]
fn env_lint_reports_typos_values_and_risks() {
    let _shared = crate::common::shared();
    let root = node();
    let root_arg = root.path().to_string_lossy().to_string();
    let (_dir, path) = checklist(
        "checks:
  - {id: lint, kind: env_lint, hint: \"fix {variables} ({suggestion})\"}
  - {id: lint_nccl, kind: env_lint, prefixes: [NCCL_], allow_debug: true}
  - {id: ib, kind: env_lint, variables: [NCCL_IB_DISABLE], hint: \"was {env.NCCL_IB_DISABLE}\"}
",
    );
    let (code, r) = check(
        &path,
        &["--root", &root_arg],
        &[
            ("NCCL_SOCKET_IFACE", "eth0"),
            ("NCCL_IB_DISABLE", "1"),
            ("NCCL_DEBUG", "INFO"),
            ("CCL_LOG_LEVEL", "fatal"),
            ("GLOO_SOCKET_IFNAME", "^lo"),
            ("NCCL_IB_HCA", "mlx5_0:1"),
        ],
    );
    assert_eq!(code, 1);
    // One result per variable at fault, each with its own status, value
    // and hint: a warning never sits inside another variable's failure.
    for (variable, status_, part, hint) in [
        (
            "CCL_LOG_LEVEL",
            "fail",
            "CCL_LOG_LEVEL=fatal is not a valid level: oneCCL hangs",
            "fix CCL_LOG_LEVEL (error)",
        ),
        (
            "GLOO_SOCKET_IFNAME",
            "fail",
            "GLOO_SOCKET_IFNAME=`^lo`: Gloo does not support `^` exclusion",
            "fix GLOO_SOCKET_IFNAME",
        ),
        (
            "NCCL_DEBUG",
            "warn",
            "NCCL_DEBUG=INFO logs every connection",
            "fix NCCL_DEBUG (NCCL_DEBUG=WARN)",
        ),
        (
            "NCCL_IB_DISABLE",
            "warn",
            "NCCL_IB_DISABLE=1 while RDMA ports are active (mlx5_0:1)",
            "fix NCCL_IB_DISABLE",
        ),
        (
            "NCCL_SOCKET_IFACE",
            "fail",
            "NCCL_SOCKET_IFACE is not a variable any library reads (ignored); did you mean NCCL_SOCKET_IFNAME? (nccl: https://docs.nvidia.com/",
            "fix NCCL_SOCKET_IFACE (NCCL_SOCKET_IFNAME)",
        ),
    ] {
        let id = format!("lint:{variable}");
        assert_eq!(status(&r, &id), status_, "{id}");
        let m = message(&r, &id);
        assert!(m.starts_with(part), "`{part}` in {m}");
        assert!(measured(&r, &id).starts_with(&format!("{variable}=")));
        assert!(common::hint(&r, &id).starts_with(hint), "{id}: {r:#}");
    }
    assert!(
        !r.checks.iter().any(|c| c.id == "lint"),
        "no summary line beside the parts: {r:#}"
    );
    // Only NCCL_ variables, debug allowed: the typo and IB still count.
    let nccl: Vec<&str> = r
        .checks
        .iter()
        .map(|c| c.id.as_str())
        .filter(|id| id.starts_with("lint_nccl:"))
        .collect();
    assert_eq!(
        nccl,
        ["lint_nccl:NCCL_IB_DISABLE", "lint_nccl:NCCL_SOCKET_IFACE"],
        "{r:#}"
    );
    // One setting alone: the IB warning and nothing else.
    assert_eq!(status(&r, "ib"), "warn");
    assert!(message(&r, "ib").starts_with("NCCL_IB_DISABLE=1 while RDMA ports are active"));
    assert_eq!(common::hint(&r, "ib"), "was 1");

    let (code, r) = check(
        &path,
        &["--root", &root_arg],
        &[("NCCL_SOCKET_IFNAME", "eth0")],
    );
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(message(&r, "lint"), "1 variable(s) checked, all valid");
    assert_eq!(message(&r, "ib"), "NCCL_IB_DISABLE not set");
}

#[test]
fn launch_env_finds_disagreements_and_init_method_mismatch() {
    let _shared = crate::common::shared();
    let (_dir, path) = checklist(
        "checks:
  - {id: launch, kind: launch_env, init_method_var: JOB_ARGS, hint: \"{problem}\"}
",
    );
    let (code, r) = check(&path, &[], &[]);
    assert_eq!(code, 0);
    assert_eq!(status(&r, "launch"), "skip");

    let (code, r) = check(
        &path,
        &[],
        &[
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29511"),
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            (
                "JOB_ARGS",
                "train.py --init-method tcp://localhost:29500 --epochs 3",
            ),
        ],
    );
    assert_eq!(code, 1);
    assert_eq!(
        message(&r, "launch"),
        "RANK=1 but SLURM_PROCID=2: torchrun and Slurm disagree on this process's rank; \
         init method in JOB_ARGS `tcp://localhost:29500` uses port 29500 but MASTER_PORT=29511: \
         ranks that follow MASTER_PORT wait on a port nobody listens on"
    );

    let (code, r) = check(
        &path,
        &[],
        &[
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("JOB_ARGS", "--init_method=tcp://localhost:29500"),
        ],
    );
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(status(&r, "launch"), "pass");
}

#[test]
fn shipped_ib_check_warns_only_when_the_variable_disables_active_ports() {
    let _shared = crate::common::shared();
    let root = node();
    let run = |env: &[(&str, &str)]| {
        let mut c = std::process::Command::new(common::BIN);
        c.args([
            "check",
            "--only",
            "env.nccl_ib_disable",
            "--format",
            "json",
            "--root",
        ])
        .arg(root.path())
        .env_clear()
        .env("PATH", common::netns::PATH);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let r = common::report_of(&out);
        (out.status.code(), r)
    };
    let (code, r) = run(&[]);
    assert_eq!(code, Some(0));
    assert_eq!(status(&r, "env.nccl_ib_disable"), "pass");
    let (code, r) = run(&[("NCCL_IB_DISABLE", "0")]);
    assert_eq!(code, Some(0));
    assert_eq!(status(&r, "env.nccl_ib_disable"), "pass");
    let (code, r) = run(&[("NCCL_IB_DISABLE", "1")]);
    assert_eq!(code, Some(0), "a warning keeps the node ready");
    assert_eq!(status(&r, "env.nccl_ib_disable"), "warn");
    assert!(
        common::hint(&r, "env.nccl_ib_disable").starts_with("Remove NCCL_IB_DISABLE (it is `1`)")
    );
}

/// The shipped checks `--only` these ids, over a fixture root, with
/// exactly `env`.
fn shipped(root: &Path, only: &[&str], env: &[(&str, &str)]) -> (Option<i32>, common::Report) {
    let mut c = std::process::Command::new(common::BIN);
    c.args(["check", "--format", "json", "--root"])
        .arg(root)
        .env_clear()
        .env("PATH", common::netns::PATH);
    for id in only {
        c.args(["--only", id]);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let r = common::report_of(&out);
    (out.status.code(), r)
}

fn intel_node() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/intel-max-xpu/root")
}

#[test]
fn ze_affinity_mask_syntax_and_devices() {
    let _shared = crate::common::shared();
    let id = "xpu.affinity_mask";
    let xpu = intel_node();
    // Four GPU Max cards, two tiles each: 8 devices in the FLAT hierarchy.
    let (code, r) = shipped(&xpu, &[id], &[("ZE_AFFINITY_MASK", "0,7")]);
    assert_eq!(code, Some(0), "{r:#}");
    assert_eq!(status(&r, id), "pass");
    let (code, r) = shipped(&xpu, &[id], &[("ZE_AFFINITY_MASK", "0,8")]);
    assert_eq!(code, Some(1));
    assert_eq!(
        message(&r, id),
        "ZE_AFFINITY_MASK=`0,8` names device 8, but this node has 8 Intel GPU devices (0-7) in the FLAT hierarchy, Level Zero's default (one device per tile)"
    );
    assert!(common::hint(&r, id).starts_with("Fix ZE_AFFINITY_MASK (`0,8`)"));
    // COMPOSITE: cards are devices, tiles their sub-devices.
    let composite = ("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE");
    let (code, r) = shipped(&xpu, &[id], &[("ZE_AFFINITY_MASK", "3.1"), composite]);
    assert_eq!(code, Some(0), "{r:#}");
    let (code, r) = shipped(&xpu, &[id], &[("ZE_AFFINITY_MASK", "0,4.0"), composite]);
    assert_eq!(code, Some(1));
    assert!(message(&r, id).contains("names device 4 (in `4.0`), but this node has 4 Intel GPU devices (0-3) in the COMPOSITE hierarchy"));
    let (code, r) = shipped(&xpu, &[id], &[("ZE_AFFINITY_MASK", "1.2"), composite]);
    assert_eq!(code, Some(1));
    assert_eq!(
        message(&r, id),
        "ZE_AFFINITY_MASK=`1.2` names sub-device 2 of card 1, which has 2 tiles"
    );
    // Syntax alone where no Intel GPU is seen.
    let bare = tempfile::tempdir().unwrap();
    let (code, r) = shipped(bare.path(), &[id], &[("ZE_AFFINITY_MASK", "0-3")]);
    assert_eq!(code, Some(1));
    assert_eq!(
        message(&r, id),
        "ZE_AFFINITY_MASK=`0-3`: `0-3` is not an entry Level Zero reads (ranges are not part of the syntax: list every device (0,1,2,3))"
    );
    let (code, r) = shipped(bare.path(), &[id], &[("ZE_AFFINITY_MASK", "12")]);
    assert_eq!(code, Some(0));
    assert_eq!(status(&r, id), "pass");
    let (_, r) = shipped(bare.path(), &[id], &[]);
    assert_eq!(message(&r, id), "ZE_AFFINITY_MASK is not set");
    // The general lint leaves the variable to its own check.
    let (_, r) = shipped(&xpu, &["env.lint"], &[("ZE_AFFINITY_MASK", "0,8")]);
    assert_eq!(status(&r, "env.lint"), "pass", "{r:#}");
}

#[test]
fn ccl_atl_transport_and_the_silent_switch_to_ofi() {
    let _shared = crate::common::shared();
    let id = "oneccl.atl_transport";
    let xpu = intel_node();
    let bare = tempfile::tempdir().unwrap();
    let hint = |r: &common::Report| common::hint(r, id).to_string();

    // An Intel GPU, torchrun's variables only: oneCCL leaves mpi for ofi.
    let torchrun = [("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")];
    let (code, r) = shipped(&xpu, &[id], &torchrun);
    assert_eq!(code, Some(0), "a warning keeps the node ready");
    assert_eq!(status(&r, id), "warn");
    assert!(
        message(&r, id).starts_with(
            "CCL_ATL_TRANSPORT is unset and no MPI launcher variable oneCCL looks for (MPI_LOCALRANKID, MPI_LOCALNRANKS, PMI_RANK, PMI_SIZE, PMIX_RANK) is set: oneCCL switches from its default, mpi, to ofi"
        ),
        "{r:#}"
    );
    assert!(
        hint(&r).starts_with("Set CCL_ATL_TRANSPORT explicitly in the job script (suggested: ofi)")
    );

    // Started by Intel MPI's hydra: the default mpi holds.
    let (code, r) = shipped(
        &xpu,
        &[id],
        &[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "0"),
        ],
    );
    assert_eq!(code, Some(0));
    assert_eq!(status(&r, id), "pass");
    assert_eq!(
        message(&r, id),
        "CCL_ATL_TRANSPORT is unset: oneCCL keeps its default, mpi (MPI_LOCALRANKID is set by the MPI launcher)"
    );

    // Open MPI without PMIx: an MPI launcher oneCCL does not recognise.
    let (_, r) = shipped(
        &xpu,
        &[id],
        &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")],
    );
    assert_eq!(status(&r, id), "warn");
    assert!(message(&r, id).contains(
        "started by Open MPI (OMPI_COMM_WORLD_RANK), whose variables oneCCL does not look for"
    ));
    assert!(hint(&r).contains("(suggested: mpi)"));

    // Asked for mpi under torchrun: MPI has no launcher to join.
    let mut env = torchrun.to_vec();
    env.push(("CCL_ATL_TRANSPORT", "mpi"));
    let (_, r) = shipped(&xpu, &[id], &env);
    assert_eq!(status(&r, id), "warn");
    assert!(
        message(&r, id)
            .starts_with("CCL_ATL_TRANSPORT=mpi, but no MPI launcher started this process")
    );
    env.pop();
    env.push(("CCL_ATL_TRANSPORT", "ofi"));
    let (code, r) = shipped(&xpu, &[id], &env);
    assert_eq!(code, Some(0));
    assert_eq!(status(&r, id), "pass");
    // A value oneCCL rejects outright fails.
    let (code, r) = shipped(bare.path(), &[id], &[("CCL_ATL_TRANSPORT", "tcp")]);
    assert_eq!(code, Some(1));
    assert!(message(&r, id).contains("`tcp` is not one of ofi, mpi"));

    // No Intel GPU and no oneCCL settings: nothing to say.
    let (code, r) = shipped(bare.path(), &[id], &torchrun);
    assert_eq!(code, Some(0));
    assert_eq!(status(&r, id), "pass");
    assert!(message(&r, id).contains("oneCCL does not seem to be in use here"));
    // ... but a CCL_ setting on a CPU node brings oneCCL into play.
    let (_, r) = shipped(bare.path(), &[id], &[("CCL_WORKER_COUNT", "1")]);
    assert_eq!(status(&r, id), "warn");
}

/// A MASTER_PORT inside the kernel's ephemeral range (read from the node's
/// ip_local_port_range) warns: an outgoing connection can take the port
/// before rank 0 binds it. Outside it, or with another range, nothing.
#[test]
fn a_master_port_in_the_ephemeral_range_warns() {
    let _shared = crate::common::shared();
    let (_dir, path) = checklist("checks:\n  - {id: launch, kind: launch_env}\n");
    let root = node();
    write(
        root.path(),
        "proc/sys/net/ipv4/ip_local_port_range",
        "32768\t60999\n",
    );
    let root_arg = root.path().display().to_string();
    let env = |port: &'static str| {
        vec![
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", port),
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
        ]
    };
    let (code, r) = check(&path, &["--root", &root_arg], &env("40000"));
    assert_eq!(code, 0, "a warning, not a failure: {r:#}");
    assert_eq!(status(&r, "launch"), "warn");
    assert!(
        message(&r, "launch").contains(
            "MASTER_PORT=40000 is inside the kernel's ephemeral range 32768-60999: an outgoing connection can take it before rank 0 binds it"
        ),
        "{}",
        message(&r, "launch")
    );
    let (_, r) = check(&path, &["--root", &root_arg], &env("29500"));
    assert_eq!(status(&r, "launch"), "pass", "{}", message(&r, "launch"));
    write(
        root.path(),
        "proc/sys/net/ipv4/ip_local_port_range",
        "50000 60999\n",
    );
    let (_, r) = check(&path, &["--root", &root_arg], &env("40000"));
    assert_eq!(status(&r, "launch"), "pass", "{}", message(&r, "launch"));
}

/// `command` keeps the first 256 KiB of each stream and drains the rest: a
/// program that writes 4 MiB still ends (it never blocks on a full pipe),
/// a pattern in the kept part is found, and one only past it is not.
#[test]
fn command_keeps_256_kib_of_each_stream_and_drains_the_rest() {
    let _shared = crate::common::shared();
    let script = "printf 'head-marker\\n'; head -c 4194304 /dev/zero | tr '\\\\0' x; printf '\\ntail-marker\\n'; head -c 4194304 /dev/zero >&2";
    let (_dir, path) = checklist(&format!(
        "checks:\n  - {{id: head, kind: command, argv: [sh, -c, \"{script}\"], stdout_matches: head-marker}}\n  - {{id: tail, kind: command, argv: [sh, -c, \"{script}\"], stdout_matches: tail-marker}}\n"
    ));
    let (code, r) = check(&path, &[], &[]);
    assert_eq!(status(&r, "head"), "pass", "{}", message(&r, "head"));
    assert_eq!(status(&r, "tail"), "fail", "{}", message(&r, "tail"));
    assert!(
        message(&r, "tail").starts_with("output of sh does not match /tail-marker/"),
        "{}",
        message(&r, "tail")
    );
    assert_eq!(code, 1);
}

/// Under `--root` a `command` check skips, saying why (it would run a
/// program of this machine, not the tree's), as `--root`'s help says.
#[test]
fn a_command_check_skips_under_root_as_the_help_says() {
    let _shared = crate::common::shared();
    let (_dir, path) = checklist("checks:\n  - {id: cmd, kind: command, argv: [\"false\"]}\n");
    let root = node();
    let root_arg = root.path().display().to_string();
    let (code, r) = check(&path, &["--root", &root_arg], &[]);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(status(&r, "cmd"), "skip", "{}", message(&r, "cmd"));
    let help = std::process::Command::new(common::BIN)
        .args(["check", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains("`command` checks skip, since they would run programs of this machine"),
        "{help}"
    );
}

/// The vendors' own variables against the node: NVIDIA-fabric NCCL names
/// on an AMD node (RCCL reads the NCCL names but has no NVLink), a
/// sub-device in the FLAT hierarchy, oneCCL with no launcher and no local
/// place, the fabric check turned off.
#[test]
fn vendor_variables_are_judged_against_the_node() {
    let _shared = crate::common::shared();
    // One variable's problem is its own result, `env.lint:NAME`.
    let lint = |r: &common::Report| -> (String, String) {
        let c = r
            .checks
            .iter()
            .find(|c| c.id.starts_with("env.lint:"))
            .or_else(|| r.checks.iter().find(|c| c.id == "env.lint"))
            .unwrap_or_else(|| panic!("no env.lint in {r:#}"));
        (c.status.name().to_string(), c.message.clone())
    };
    let amd = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/amd-mi300x/root");
    let nvidia = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/h100-ib-healthy/root");
    let (code, r) = shipped(&amd, &["env.lint"], &[("NCCL_NVLS_ENABLE", "1")]);
    assert_eq!(code, Some(0), "a warning keeps the node ready");
    assert_eq!(lint(&r).0, "warn");
    assert!(
        lint(&r).1.starts_with("NCCL_NVLS_ENABLE=1 tunes NVLink SHARP or multi-node NVLink, which this node's AMD GPUs do not have"),
        "{r:#}"
    );
    let (_, r) = shipped(&nvidia, &["env.lint"], &[("NCCL_NVLS_ENABLE", "1")]);
    assert_eq!(lint(&r).0, "pass", "{r:#}");
    let (_, r) = shipped(&amd, &["env.lint"], &[("RCCL_MSCCL_ENABLE", "2")]);
    assert_eq!(lint(&r).0, "fail", "{r:#}");
    let (_, r) = shipped(
        &amd,
        &["env.lint"],
        &[("RCCL_MSCCL_ENABLE", "0"), ("HSA_NO_SCRATCH_RECLAIM", "1")],
    );
    assert_eq!(lint(&r).0, "pass", "{r:#}");

    let xpu = intel_node();
    let (code, r) = shipped(
        &xpu,
        &["xpu.affinity_mask"],
        &[("ZE_AFFINITY_MASK", "0.0,0.1")],
    );
    assert_eq!(code, Some(1));
    assert!(
        message(&r, "xpu.affinity_mask").contains("names the sub-device `0.0`, which the FLAT hierarchy, Level Zero's default (one device per tile) does not have"),
        "{r:#}"
    );
    let composite = ("ZE_FLAT_DEVICE_HIERARCHY", "COMPOSITE");
    let (code, _) = shipped(
        &xpu,
        &["xpu.affinity_mask"],
        &[("ZE_AFFINITY_MASK", "0.0,0.1"), composite],
    );
    assert_eq!(code, Some(0));
    let (_, r) = shipped(
        &xpu,
        &["env.lint"],
        &[("ZE_FLAT_DEVICE_HIERARCHY", "TILES")],
    );
    assert_eq!(lint(&r).0, "fail", "{r:#}");
    let (_, r) = shipped(
        &xpu,
        &["env.lint"],
        &[("CCL_PROCESS_LAUNCHER", "none"), ("CCL_LOCAL_RANK", "0")],
    );
    assert_eq!(lint(&r).0, "fail");
    assert!(lint(&r).1.contains("CCL_LOCAL_SIZE is unset"), "{r:#}");
    let (_, r) = shipped(
        &xpu,
        &["env.lint"],
        &[
            ("CCL_PROCESS_LAUNCHER", "none"),
            ("CCL_LOCAL_RANK", "0"),
            ("CCL_LOCAL_SIZE", "8"),
        ],
    );
    assert_eq!(lint(&r).0, "pass", "{r:#}");
    let (_, r) = shipped(
        &xpu,
        &["env.lint"],
        &[("CCL_TOPO_FABRIC_VERTEX_CONNECTION_CHECK", "0")],
    );
    assert_eq!(lint(&r).0, "warn");
    assert!(
        lint(&r).1.contains("a link that is down is no longer seen"),
        "{r:#}"
    );
}
