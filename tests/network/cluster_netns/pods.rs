//! Kubernetes pods as network namespaces: each "pod" has exactly the
//! variables its job's operator gives (read from the operators' code:
//! ../../docs/kubernetes.md), its own hostname, and the job's DNS names
//! in its /etc/hosts, as the cluster DNS would answer them. No flag tells
//! preflight its place: it reads it from the pod's environment, meets the
//! others, and writes the verdict where `kubectl describe pod` shows it
//! (--termination-log, the kubelet's file in a real pod).

use std::path::{Path, PathBuf};

use super::MARGIN;
use super::cluster::{self, HostFiles, Outcome, Proc};
use super::common::netns::Cluster;

/// One operator's job of three pods: each pod's DNS name (index order),
/// hostname, and environment.
struct Operator {
    name: &'static str,
    names: [&'static str; 3],
    env: fn(usize) -> Vec<(String, String)>,
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(k, x)| (k.to_string(), x.to_string()))
        .collect()
}

const OPERATORS: &[Operator] = &[
    Operator {
        name: "Kubeflow Trainer",
        names: ["tj-node-0-0.tj", "tj-node-0-1.tj", "tj-node-0-2.tj"],
        env: |i| {
            pairs(&[
                ("PET_NNODES", "3"),
                ("PET_NPROC_PER_NODE", "1"),
                ("PET_NODE_RANK", &i.to_string()),
                ("PET_MASTER_ADDR", "tj-node-0-0.tj"),
                ("PET_MASTER_PORT", "29500"),
            ])
        },
    },
    Operator {
        name: "Kubeflow PyTorchJob",
        names: ["pj-master-0", "pj-worker-0", "pj-worker-1"],
        env: |i| {
            pairs(&[
                ("MASTER_ADDR", "pj-master-0"),
                ("MASTER_PORT", "23456"),
                ("PET_MASTER_ADDR", "pj-master-0"),
                ("PET_MASTER_PORT", "23456"),
                ("RANK", &i.to_string()),
                ("WORLD_SIZE", "3"),
                ("PET_NNODES", "3"),
                ("PET_NPROC_PER_NODE", "auto"),
                ("PET_NODE_RANK", &i.to_string()),
            ])
        },
    },
    Operator {
        name: "LeaderWorkerSet",
        names: [
            "lws-0.lws.default",
            "lws-0-1.lws.default",
            "lws-0-2.lws.default",
        ],
        env: |i| {
            pairs(&[
                ("LWS_LEADER_ADDRESS", "lws-0.lws.default"),
                ("LWS_GROUP_SIZE", "3"),
                ("LWS_WORKER_INDEX", &i.to_string()),
            ])
        },
    },
    Operator {
        name: "Volcano",
        names: ["vj-master-0.vj", "vj-worker-0.vj", "vj-worker-1.vj"],
        env: |i| {
            let task_index = if i == 0 { 0 } else { i - 1 };
            pairs(&[
                ("VC_MASTER_HOSTS", "vj-master-0.vj"),
                ("VC_MASTER_NUM", "1"),
                ("VC_WORKER_HOSTS", "vj-worker-0.vj,vj-worker-1.vj"),
                ("VC_WORKER_NUM", "2"),
                ("VC_TASK_INDEX", &task_index.to_string()),
                ("MASTER_ADDR", "vj-master-0.vj"),
                ("MASTER_PORT", "23456"),
                ("WORLD_SIZE", "3"),
                ("RANK", &i.to_string()),
            ])
        },
    },
    Operator {
        name: "JobSet",
        names: ["js-w-0-0.js", "js-w-1-0.js", "js-w-2-0.js"],
        env: |i| {
            pairs(&[
                ("JOBSET_NAME", "js"),
                ("JOBSET_REPLICATED_JOB", "w"),
                ("JOBSET_JOB_INDEX", &i.to_string()),
                ("JOBSET_REPLICAS", "3"),
                ("JOBSET_PODS_PER_JOB", "1"),
                ("JOB_COMPLETION_INDEX", "0"),
            ])
        },
    },
    Operator {
        name: "MPIJob",
        names: [
            "mj-worker-0.mj.default.svc",
            "mj-worker-1.mj.default.svc",
            "mj-worker-2.mj.default.svc",
        ],
        // What mpirun gives each rank it starts in a worker pod, with the
        // operator's hostfile variable that mpirun forwards.
        env: |i| {
            pairs(&[
                ("OMPI_COMM_WORLD_RANK", &i.to_string()),
                ("OMPI_COMM_WORLD_SIZE", "3"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
                (
                    "OMPI_MCA_orte_default_hostfile",
                    &mpijob_hostfile().display().to_string(),
                ),
                ("PREFLIGHT_TOKEN", "68ce95aaa77512be502ba7b8564b040f"),
            ])
        },
    },
];

/// The MPIJob's hostfile, as the operator mounts it (/etc/mpi/hostfile).
fn mpijob_hostfile() -> PathBuf {
    std::env::temp_dir().join(format!("pf-mpijob-hostfile-{}", std::process::id()))
}

/// Each pod's /etc/hosts: its own name (the kubelet writes it), and the
/// names of the pods in `up` (and their short names, as the pod's search
/// path finds them) at their namespace addresses: a pod not yet started
/// has no DNS record.
fn write_hosts(c: &Cluster, files: &HostFiles, op: &Operator, up: &[usize]) {
    for (me, p) in files.paths.iter().enumerate() {
        let mut text = String::from("127.0.0.1 localhost\n");
        for i in (0..3).filter(|i| *i == me || up.contains(i)) {
            let name = op.names[i];
            let short = name.split('.').next().unwrap_or(name);
            text.push_str(&format!("{} {name} {short}\n", c.addr(i)));
        }
        // In place: the pod's /etc/hosts is this file, bind-mounted.
        std::fs::write(p, &text).unwrap();
    }
}

fn start(c: &Cluster, files: &HostFiles, op: &Operator, i: usize, log: &Path) -> Proc {
    start_for(c, files, op, i, log, "12s")
}

fn start_for(
    c: &Cluster,
    files: &HostFiles,
    op: &Operator,
    i: usize,
    log: &Path,
    timeout: &str,
) -> Proc {
    let mut args = cluster::run_args(timeout);
    args.extend(["--collective".into(), "off".into()]);
    args.extend(["--termination-log".into(), log.display().to_string()]);
    let env = (op.env)(i);
    let hostname = op.names[i].split('.').next().unwrap_or(op.names[i]);
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    all.push(("HOSTNAME", hostname));
    // As the webhook's init container has it: no contract found would be
    // an error, not a world of one.
    all.push(("PREFLIGHT_REQUIRE_GANG", "1"));
    all.push(("GLOO_SOCKET_IFNAME", "eth0"));
    let argv: Vec<String> = std::iter::once(cluster::BIN.to_string())
        .chain(args)
        .collect();
    cluster::on_host_named(c, files, i, hostname, &argv, &all)
}

/// The leader's port: what its contract says.
fn leader_port(op: &Operator) -> u16 {
    (op.env)(0)
        .iter()
        .find(|(k, _)| k == "MASTER_PORT" || k == "PET_MASTER_PORT")
        .map_or(29500, |(_, v)| v.parse().unwrap())
}

/// The three pods, the leader last: the workers start before its name
/// resolves, and it resolves once the leader listens.
fn gang(op: &Operator, block: Option<usize>) -> Option<(Vec<Outcome>, Vec<PathBuf>)> {
    let c = Cluster::new(3)?;
    let files = cluster::host_files(&c, None);
    let dir = tempfile::tempdir().unwrap();
    if let Some(b) = block {
        // The pod's own firewall drops new connections to it, past the
        // leader's rendezvous: its peers cannot reach it.
        c.nft_rule(
            b,
            "input",
            &["ct", "state", "new", "tcp", "dport", "1024-65535", "drop"],
        );
    }
    if op.name == "MPIJob" {
        let text: String = op.names.iter().map(|n| format!("{n} slots=1\n")).collect();
        std::fs::write(mpijob_hostfile(), text).unwrap();
    }
    write_hosts(&c, &files, op, &[1, 2]);
    let logs: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("termination-{i}")))
        .collect();
    let mut procs: Vec<Proc> = (1..3).map(|i| start(&c, &files, op, i, &logs[i])).collect();
    let leader = start(&c, &files, op, 0, &logs[0]);
    cluster::wait_listening(leader.pid, leader_port(op));
    write_hosts(&c, &files, op, &[0, 1, 2]);
    procs.insert(0, leader);
    let out = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    // The files outlive the directory's guard only as text.
    let kept: Vec<PathBuf> = logs
        .iter()
        .map(|l| {
            let keep = std::env::temp_dir().join(format!(
                "pf-pod-{}-{}",
                std::process::id(),
                l.file_name().unwrap().to_string_lossy()
            ));
            let _ = std::fs::copy(l, &keep);
            keep
        })
        .collect();
    Some((out, kept))
}

#[test]
fn each_operators_pods_meet_as_a_world_of_three_from_their_own_environment() {
    let _shared = crate::common::shared();
    for op in OPERATORS {
        let Some((out, logs)) = gang(op, None) else {
            return;
        };
        for (i, o) in out.iter().enumerate() {
            assert_eq!(o.code, 0, "{} pod {i}: {}\n{}", op.name, o.stdout, o.stderr);
            let r = o.report();
            assert_eq!(r.cluster().world_size, 3, "{} pod {i}: {r:#}", op.name);
            assert_eq!(
                r.cluster().verdict,
                crate::common::Verdict::Ready,
                "{}",
                op.name
            );
            let said = std::fs::read_to_string(&logs[i]).unwrap_or_default();
            assert!(
                said.starts_with("READY") && said.len() <= 4096,
                "{} pod {i}'s termination message: {said:?}",
                op.name
            );
            let _ = std::fs::remove_file(&logs[i]);
        }
        // Where the operator's contract is ambiguous, the report says what
        // preflight took.
        let notes = out[0].report().cluster().warnings.join("\n");
        if op.name == "MPIJob" {
            // Ranks of mpirun's: the nodes are the hostfile's.
            let _ = std::fs::remove_file(mpijob_hostfile());
            continue;
        }
        assert!(notes.contains(op.name), "{}: {notes}", op.name);
        if op.name == "Kubeflow PyTorchJob" || op.name == "Volcano" {
            assert!(notes.contains("WORLD_SIZE=3 counts pods"), "{notes}");
        }
    }
}

#[test]
fn a_pod_whose_port_is_blocked_is_named_by_its_name() {
    let _shared = crate::common::shared();
    let op = &OPERATORS[2];
    let Some((out, logs)) = gang(op, Some(2)) else {
        return;
    };
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.code, 1, "pod {i}: {}\n{}", o.stdout, o.stderr);
        let culprits: Vec<String> = o
            .report()
            .cluster()
            .culprits
            .iter()
            .map(|c| c.node.clone())
            .collect();
        assert_eq!(culprits, ["lws-0-2"], "pod {i}: {}", o.stdout);
        let said = std::fs::read_to_string(&logs[i]).unwrap_or_default();
        assert!(
            said.starts_with("NOT READY") && said.contains("lws-0-2"),
            "pod {i}'s termination message: {said}"
        );
        // Each failed check once: the kubelet keeps 4,096 bytes.
        let lines: Vec<&str> = said.lines().collect();
        let once: std::collections::BTreeSet<&&str> = lines.iter().collect();
        assert_eq!(
            once.len(),
            lines.len(),
            "pod {i}'s termination message: {said}"
        );
        let _ = std::fs::remove_file(&logs[i]);
    }
}

#[test]
fn a_pod_that_never_comes_is_named_and_a_leader_that_never_resolves_is_said_so() {
    let _shared = crate::common::shared();
    let op = &OPERATORS[0];
    let Some(c) = Cluster::new(3) else {
        return;
    };
    let files = cluster::host_files(&c, None);
    let dir = tempfile::tempdir().unwrap();
    let log = |i: usize| dir.path().join(format!("termination-{i}"));
    // Pod 2 is never scheduled: the leader and pod 1 name it by its name.
    write_hosts(&c, &files, op, &[0, 1]);
    let procs: Vec<Proc> = (0..2)
        .map(|i| start_for(&c, &files, op, i, &log(i), "4s"))
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.code, 1, "pod {i}: {}", o.stdout);
        let m = o.message("cluster.barrier");
        assert!(
            m.contains("rank 2 (expected on tj-node-0-2.tj)"),
            "pod {i}: {m}"
        );
        let said = std::fs::read_to_string(log(i)).unwrap();
        assert!(said.contains("tj-node-0-2.tj"), "pod {i}: {said}");
    }
    // The leader never comes: its name never resolves, and pod 1 says so
    // in words, not as a bare lookup error.
    write_hosts(&c, &files, op, &[1]);
    let o = start_for(&c, &files, op, 1, &log(1), "3s").finish(MARGIN);
    assert_eq!(o.code, 1, "{}", o.stdout);
    let m = o.message("cluster.rendezvous");
    assert!(
        m.contains(
            "rank 0's tj-node-0-0.tj did not come up within 3s: its name does not resolve here"
        ),
        "{m}"
    );
}
