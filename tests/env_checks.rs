//! env_lint and launch_env through the binary, with a fixture tree for the
//! node's interfaces and RDMA devices.

mod common;

use std::path::Path;

use common::{check, checklist, message, result, status};

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
    assert_eq!(status(&r, "lint"), "fail");
    let m = message(&r, "lint");
    for part in [
        "CCL_LOG_LEVEL=fatal is not a valid level: oneCCL hangs",
        "GLOO_SOCKET_IFNAME=`^lo`: Gloo does not support `^` exclusion",
        "NCCL_DEBUG=INFO logs every connection",
        "NCCL_IB_DISABLE=1 while RDMA ports are active (mlx5_0:1)",
        "NCCL_SOCKET_IFACE is not a variable any library reads (ignored); did you mean NCCL_SOCKET_IFNAME? (nccl: https://docs.nvidia.com/",
    ] {
        assert!(m.contains(part), "missing `{part}` in {m}");
    }
    assert_eq!(result(&r, "lint")["measured"], "6 set, 5 with problems");
    assert_eq!(
        result(&r, "lint")["hint"],
        "fix CCL_LOG_LEVEL, GLOO_SOCKET_IFNAME, NCCL_DEBUG, NCCL_IB_DISABLE, NCCL_SOCKET_IFACE (error)"
    );
    // Only NCCL_ variables, debug allowed: the typo and IB still count.
    let m = message(&r, "lint_nccl");
    assert!(
        !m.contains("CCL_LOG_LEVEL") && !m.contains("NCCL_DEBUG"),
        "{m}"
    );
    assert!(m.contains("NCCL_SOCKET_IFACE"), "{m}");
    // One setting alone: the IB warning and nothing else.
    assert_eq!(status(&r, "ib"), "warn");
    assert!(message(&r, "ib").starts_with("NCCL_IB_DISABLE=1 while RDMA ports are active"));
    assert_eq!(result(&r, "ib")["hint"], "was 1");

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
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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
        result(&r, "env.nccl_ib_disable")["hint"]
            .as_str()
            .unwrap()
            .starts_with("Remove NCCL_IB_DISABLE (it is `1`)")
    );
}
