//! The verdict where preflight is deployed: as the job's ordinary user
//! (no capabilities), under the README's launch lines with the real
//! launchers (torchrun from Debian's torch, Open MPI's mpirun, node mode),
//! on one host and across namespace hosts; a full /dev/shm; and what a
//! rank other than 0 prints.
//!
//! Each launch line is read from the README (tools/readme-commands.sh,
//! section "Run it under torchrun, srun or mpirun") and run as printed, the placeholders filled in
//! (`host0`, `K`, the counts) and `preflight` the path of a copy of the
//! binary that an ordinary user may run. Every case runs in network
//! namespaces of its own, so the README's fixed ports collide with
//! nothing. Skipped with a reason where namespaces cannot be made;
//! PREFLIGHT_REQUIRE_NETNS=1 (CI) turns the skip into a failure, and so
//! does a missing launcher under PREFLIGHT_REQUIRE_LIBS=1.

use crate::common;
use crate::common::cluster;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cluster::{HostFiles, Outcome, host_files, local, on_host_cmd};
use common::netns::Cluster;

/// Process start, `import torch` (2 to 9 s here) and the run's own
/// deadline on a loaded 2-core machine; a hang still fails.
const LIMIT: Duration = Duration::from_secs(150);

/// What makes a process an ordinary user without capabilities.
const NOBODY: [&str; 4] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
];

/// A copy of the binary in a directory every user may enter: the build
/// tree may not be (a CI clone under /root).
struct Shared {
    _dir: tempfile::TempDir,
    bin: PathBuf,
}

fn shared_binary() -> Shared {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("preflight");
    common::install_executable(Path::new(common::BIN), &bin);
    Shared { _dir: dir, bin }
}

/// The README's launch line that starts with `first`, as words.
fn readme_line(first: &str) -> Vec<String> {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tools/readme-commands.sh"
    ))
    .arg("Run it under torchrun, srun or mpirun")
    .output()
    .unwrap();
    assert!(out.status.success(), "README has no launch lines");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("README has no `{first}` launch line:\n{text}"));
    line.split_whitespace().map(str::to_string).collect()
}

/// Fills a placeholder: the word after `flag` becomes `value`; the line
/// must have that flag (a README that drops it fails here, loudly).
fn set_after(words: &mut [String], flag: &str, value: &str) {
    let at = words
        .iter()
        .position(|w| w == flag)
        .unwrap_or_else(|| panic!("the README's line has no {flag}: {words:?}"));
    words[at + 1] = value.to_string();
}

/// `preflight` in the line is the binary to run.
fn set_binary(words: &mut [String], bin: &Path) {
    let at = words
        .iter()
        .position(|w| w == "preflight")
        .unwrap_or_else(|| panic!("the README's line runs no `preflight`: {words:?}"));
    words[at] = bin.display().to_string();
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Every rank's verdict line in a launcher's merged output (torchrun
/// prefixes `[default0]:`): one per local rank, each READY.
fn all_ready(o: &Outcome, ranks: usize) {
    let text = strip_ansi(&o.stdout);
    let verdicts: Vec<&str> = text
        .lines()
        .map(|l| match l.split_once("]:") {
            Some((tag, rest)) if tag.starts_with('[') => rest,
            _ => l,
        })
        .filter(|l| {
            l.starts_with("READY  ")
                || l.starts_with("NOT READY  ")
                || l.starts_with("INCOMPLETE  ")
        })
        .collect();
    assert_eq!(
        o.code, 0,
        "{}: exit {}\n{text}\nstderr: {}",
        o.label, o.code, o.stderr
    );
    assert_eq!(
        verdicts.len(),
        ranks,
        "{}: {ranks} verdicts expected:\n{text}",
        o.label
    );
    assert!(
        verdicts.iter().all(|v| v.starts_with("READY  ")),
        "{}: {verdicts:#?}\n{text}",
        o.label
    );
}

fn launcher(program: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        common::skip_unless_required(&format!("{program} is not installed"));
    }
    found
}

fn hosts(n: usize) -> Option<(Cluster, HostFiles)> {
    let cluster = Cluster::new(n)?;
    let files = host_files(&cluster, None);
    Some((cluster, files))
}

fn words(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// What every launched process gets: no cluster variables of its own.
fn base_env() -> Vec<(&'static str, &'static str)> {
    vec![("LANG", "C.UTF-8"), ("HOME", "/tmp"), ("TMPDIR", "/tmp")]
}

/// The README's torchrun line on `nodes` hosts, `per_node` ranks each,
/// as root or as nobody, under `torch`'s torchrun.
fn torchrun(torch: &crate::torch::Torch, nodes: usize, per_node: usize, as_nobody: bool) {
    let Some((cluster, files)) = hosts(nodes) else {
        return;
    };
    let shared = shared_binary();
    let master = cluster.addr(0);
    let procs: Vec<_> = (0..nodes)
        .map(|k| {
            let mut line = readme_line("torchrun");
            set_after(&mut line, "--nnodes", &nodes.to_string());
            set_after(&mut line, "--node_rank", &k.to_string());
            set_after(&mut line, "--nproc_per_node", &per_node.to_string());
            set_after(&mut line, "--master_addr", &master);
            set_binary(&mut line, &shared.bin);
            assert_eq!(line[0], "torchrun", "the README's line: {line:?}");
            line[0] = torch.torchrun.display().to_string();
            let mut argv = if as_nobody {
                words(&NOBODY)
            } else {
                Vec::new()
            };
            argv.extend(line);
            on_host_cmd(&cluster, &files, k, &argv, &base_env())
        })
        .collect();
    for p in procs {
        all_ready(&p.finish(LIMIT), per_node);
    }
}

on_each_torch!(
    the_readme_torchrun_line_on_one_node_is_ready_on_every_rank,
    |t| {
        let _shared = crate::common::shared();
        super::torchrun(t, 1, 2, false);
    }
);

on_each_torch!(the_readme_torchrun_line_as_an_ordinary_user_is_ready, |t| {
    let _shared = crate::common::shared();
    super::torchrun(t, 1, 2, true);
});

on_each_torch!(
    the_readme_torchrun_line_on_two_hosts_is_ready_on_every_rank,
    |t| {
        let _shared = crate::common::shared();
        super::torchrun(t, 2, 2, false);
    }
);

/// The README's mpirun line, one host, 2 ranks: as root (Open MPI wants
/// its two variables for that, not a change of the line) and as nobody.
#[test]
fn the_readme_mpirun_line_is_ready_on_every_rank_as_root_and_as_nobody() {
    let _shared = crate::common::shared();
    if !launcher("mpirun") {
        return;
    }
    let Some((cluster, files)) = hosts(1) else {
        return;
    };
    let shared = shared_binary();
    for as_nobody in [false, true] {
        let mut line = readme_line("mpirun");
        set_after(&mut line, "-np", "2");
        set_after(&mut line, "--map-by", "ppr:2:node");
        let addr = line
            .iter_mut()
            .find(|w| w.starts_with("MASTER_ADDR="))
            .expect("the README's mpirun line passes MASTER_ADDR");
        *addr = format!("MASTER_ADDR={}", cluster.addr(0));
        set_binary(&mut line, &shared.bin);
        let mut env = base_env();
        let mut argv = Vec::new();
        if as_nobody {
            argv = words(&NOBODY);
        } else {
            env.push(("OMPI_ALLOW_RUN_AS_ROOT", "1"));
            env.push(("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"));
        }
        argv.extend(line);
        let o = on_host_cmd(&cluster, &files, 0, &argv, &env).finish(LIMIT);
        all_ready(&o, 2);
    }
}

/// The README's node-mode line on two hosts, as nobody.
#[test]
fn the_readme_node_mode_line_on_two_hosts_is_ready() {
    let _shared = crate::common::shared();
    let Some((cluster, files)) = hosts(2) else {
        return;
    };
    let shared = shared_binary();
    let master = cluster.addr(0);
    let procs: Vec<_> = (0..2)
        .map(|k| {
            let mut line = readme_line("preflight");
            set_after(&mut line, "--node-rank", &k.to_string());
            set_after(&mut line, "--master-addr", &master);
            set_binary(&mut line, &shared.bin);
            let mut argv = words(&NOBODY);
            argv.extend(line);
            on_host_cmd(&cluster, &files, k, &argv, &base_env())
        })
        .collect();
    for p in procs {
        let o = p.finish(LIMIT);
        // Node mode prints the node's first rank.
        all_ready(&o, 1);
    }
}

/// `preflight check` with the whole shipped checklist in a namespace
/// host, JSON out, as root or as nobody.
fn check_as(cluster: &Cluster, bin: &Path, as_nobody: bool) -> (i32, common::Report, String) {
    let mut argv: Vec<String> = Vec::new();
    if as_nobody {
        argv = words(&NOBODY);
    }
    argv.extend(words(&[
        &bin.display().to_string(),
        "check",
        "--format",
        "json",
    ]));
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = cluster.exec(0, &args);
    (
        out.status.code().unwrap_or(-1),
        common::report_of(&out),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A healthy node, nft installed: the shipped checklist as nobody is
/// READY (exit 0), the firewall a skip that names the privilege and who
/// covers it; as root it reads the ruleset. With a DROP rule, root still
/// finds it, and nobody still cannot block every job.
#[test]
fn an_ordinary_user_gets_ready_on_a_healthy_node_and_root_still_finds_a_drop_rule() {
    let _shared = crate::common::shared();
    let Some(cluster) = Cluster::new(1) else {
        return;
    };
    let shared = shared_binary();
    let (code, r, err) = check_as(&cluster, &shared.bin, true);
    assert_eq!(code, 0, "{r:#}\n{err}");
    assert_eq!(r.verdict, common::Verdict::Ready, "{r:#}");
    assert_eq!(common::status(&r, "net.firewall"), "skip", "{r:#}");
    let why = common::message(&r, "net.firewall");
    assert!(
        why.contains("needs root or CAP_NET_ADMIN; the node's root health check covers it"),
        "{why}"
    );
    assert!(
        !why.contains('\n'),
        "a foreign tool's stderr on its own line: {why}"
    );
    let errors: Vec<&common::CheckResult> = r
        .checks
        .iter()
        .filter(|c| c.status == common::Status::Error)
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");

    let (code, r, err) = check_as(&cluster, &shared.bin, false);
    assert_eq!(common::status(&r, "net.firewall"), "pass", "{r:#}\n{err}");
    assert_eq!(code, 0, "{r:#}");
    cluster.nft_rule(0, "input", &["tcp", "dport", "29500", "drop"]);
    let (code, r, _) = check_as(&cluster, &shared.bin, false);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(common::status(&r, "net.firewall"), "fail", "{r:#}");
    assert!(
        common::message(&r, "net.firewall").contains("tcp dport 29500 drop"),
        "{r:#}"
    );
    let (code, r, _) = check_as(&cluster, &shared.bin, true);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(common::status(&r, "net.firewall"), "skip", "{r:#}");

    // The human report as nobody: nothing of nft's at column 0.
    let bin = shared.bin.display().to_string();
    let mut argv = words(&NOBODY);
    argv.extend(words(&[&bin, "check", "-v"]));
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = cluster.exec(0, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.lines().any(|l| l.starts_with("netlink")), "{text}");
    assert_eq!(out.status.code(), Some(0), "{text}");
}

/// A 2-rank `run` of the shipped checklist as nobody (node mode, one
/// host): READY, exit 0.
#[test]
fn a_two_rank_run_as_an_ordinary_user_is_ready() {
    let _shared = crate::common::shared();
    let Some(cluster) = Cluster::new(1) else {
        return;
    };
    let shared = shared_binary();
    let bin = shared.bin.display().to_string();
    let mut argv = words(&NOBODY);
    argv.extend(words(&[
        &bin,
        "run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--format",
        "json",
    ]));
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = cluster.exec(0, &args);
    let r = common::report_of(&out);
    assert_eq!(r.verdict, common::Verdict::Ready, "{r:#}");
    assert_eq!(r.cluster.as_ref().map(|c| c.world_size), Some(2), "{r:#}");
    assert_eq!(common::status(&r, "net.firewall"), "skip", "{r:#}");
    assert_eq!(out.status.code(), Some(0));
}

/// A 2 GiB /dev/shm filled to 8 MiB free (its own mount namespace): the
/// shipped memory.shm fails, naming the leftover and its owner.
#[test]
fn a_full_dev_shm_fails_naming_the_largest_leftover_and_its_owner() {
    let _shared = crate::common::shared();
    if !nix::unistd::Uid::effective().is_root() {
        common::skip_unless_required("not root: cannot mount a tmpfs of its own");
        return;
    }
    let script = format!(
        "mount -t tmpfs -o size=2g tmpfs /dev/shm && fallocate -l 2040m /dev/shm/nccl-crashed-job && chown 65534 /dev/shm/nccl-crashed-job && exec {} check --only memory.shm --format json",
        common::BIN
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    let r = common::report_of(&out);
    assert_eq!(common::status(&r, "memory.shm"), "fail", "{r:#}");
    let m = common::message(&r, "memory.shm");
    assert!(
        m.starts_with("/dev/shm has 8 MiB free of 2 GiB, expected at least 640 MiB"),
        "{m}"
    );
    assert!(
        m.contains("/dev/shm/nccl-crashed-job 2 GiB (nobody)"),
        "{m}"
    );
    assert_eq!(out.status.code(), Some(1));

    // The same mount, emptied: it passes, saying how much is free.
    let script = format!(
        "mount -t tmpfs -o size=2g tmpfs /dev/shm && exec {} check --only memory.shm --format json",
        common::BIN
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    let r = common::report_of(&out);
    assert_eq!(common::status(&r, "memory.shm"), "pass", "{r:#}");
    assert_eq!(
        common::measured(&r, "memory.shm"),
        "/dev/shm 2 GiB (2 GiB free)"
    );
}

/// The same under a fixture root: the mount's size less the files there
/// (sparse stand-ins of the leftovers), owners from its /etc/passwd.
#[test]
fn a_full_dev_shm_under_a_fixture_root_is_found() {
    let _shared = crate::common::shared();
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("proc")).unwrap();
    std::fs::create_dir_all(r.join("etc")).unwrap();
    std::fs::create_dir_all(r.join("dev/shm")).unwrap();
    std::fs::write(
        r.join("proc/mounts"),
        "tmpfs /dev/shm tmpfs rw,nosuid,nodev,size=1048576k 0 0\n",
    )
    .unwrap();
    std::fs::write(r.join("proc/meminfo"), "MemTotal: 16000000 kB\n").unwrap();
    let me = nix::unistd::Uid::effective().as_raw();
    std::fs::write(
        r.join("etc/passwd"),
        format!("trainer:x:{me}:{me}::/:/bin/sh\n"),
    )
    .unwrap();
    let f = std::fs::File::create(r.join("dev/shm/torch_1234_leftover")).unwrap();
    f.set_len(1000 << 20).unwrap();
    let (_d, list) = common::checklist(
        "checks:\n  - {id: shm, kind: memory, min_shm: 1GiB, min_shm_free: 640MiB}\n",
    );
    let (code, report) = common::check(&list, &["--root", &r.display().to_string()], &[]);
    assert_eq!(code, 1, "{report:#}");
    let m = common::message(&report, "shm");
    assert!(m.starts_with("/dev/shm has 24 MiB free of 1 GiB"), "{m}");
    assert!(
        m.contains("/dev/shm/torch_1234_leftover 1000 MiB (trainer)"),
        "{m}"
    );
}

/// Rank 1 with the master absent: its own problems first, the failing
/// rendezvous among them with its hint, and its verdict as the last line.
#[test]
fn a_rank_other_than_0_ends_with_its_verdict_after_its_own_problems() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let args = words(&[
        "run",
        "--no-shipped",
        "--checks",
        &cluster::checks(),
        "--timeout",
        "3s",
    ]);
    let o = local(
        "rank1",
        &args,
        &[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port),
        ],
    )
    .finish(Duration::from_secs(30));
    let text = o.stdout.trim_end();
    let last = text.lines().last().unwrap_or("");
    assert!(last.starts_with("NOT READY  rank 1 of 2"), "{text}");
    let problems = text.find("Problems").unwrap_or_else(|| panic!("{text}"));
    let rendezvous = text
        .find("FAIL  cluster.rendezvous: ")
        .unwrap_or_else(|| panic!("{text}"));
    assert!(problems < rendezvous, "{text}");
    assert!(
        text[rendezvous..]
            .lines()
            .any(|l| l.trim_start().starts_with("hint: ")),
        "{text}"
    );
    assert_eq!(o.code, 1);
}
