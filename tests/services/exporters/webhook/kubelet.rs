//! The gate as a stock cluster runs it: each pod of a job, as its
//! operator makes it, sent to the real webhook as the API server sends a
//! CREATE; the patch applied; then the injected init container run as
//! the kubelet runs one, in a network namespace per pod with the pod's
//! hostname and DNS names: its environment with the downward API's
//! fieldRefs and the Secret's keys resolved, its user (the container's or
//! the pod's runAsUser, else the image's numeric USER), no capabilities,
//! and its own mounts: /dev/shm is a 64 MiB tmpfs, as in any container,
//! unless the patched init container mounts a memory-backed volume there
//! (sized by its sizeLimit, else by the pod's memory limit, as the kubelet
//! sizes it). Its arguments are the patch's, the shipped checklist and
//! all: a gang of three must come out READY, for Kubeflow Trainer and for
//! LeaderWorkerSet.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{Webhook, patched};
use crate::common;
use crate::common::cluster::{self, HostFiles, Proc};
use crate::common::netns::Cluster;

/// A Secret the job's pods read: (name, key) → value.
type Secrets = BTreeMap<(String, String), String>;

/// The value a fieldRef names, of `pod` (on `ip`).
fn field(pod: &Value, path: &str, ip: &str) -> Option<String> {
    let meta = &pod["metadata"];
    let keyed = |prefix: &str, of: &Value| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        of[key].as_str().map(String::from)
    };
    match path {
        "metadata.name" => meta["name"].as_str().map(String::from),
        "metadata.namespace" => meta["namespace"].as_str().map(String::from),
        "status.podIP" => Some(ip.to_string()),
        _ => keyed("metadata.annotations['", &meta["annotations"])
            .or_else(|| keyed("metadata.labels['", &meta["labels"])),
    }
}

/// The container's environment as the kubelet gives it: `value`s, the
/// downward API's fieldRefs and secretKeyRefs resolved; HOSTNAME the
/// pod's.
fn environment(pod: &Value, c: &Value, ip: &str, secrets: &Secrets) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else if let Some(p) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            field(pod, p, ip).unwrap_or_else(|| panic!("fieldRef {p} of {pod}"))
        } else if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
            let key = (
                r["name"].as_str().unwrap().to_string(),
                r["key"].as_str().unwrap().to_string(),
            );
            secrets
                .get(&key)
                .cloned()
                .unwrap_or_else(|| panic!("no Secret {key:?}"))
        } else {
            panic!("an env entry the stand-in kubelet does not know: {e}")
        };
        out.retain(|(k, _)| *k != name);
        out.push((name, value));
    }
    out.push(("HOSTNAME".into(), hostname(pod)));
    out
}

fn hostname(pod: &Value) -> String {
    pod["spec"]["hostname"]
        .as_str()
        .or(pod["metadata"]["name"].as_str())
        .unwrap()
        .to_string()
}

/// Bytes of a quantity (`1Gi`, `64Mi`, `16Gi`).
fn bytes(q: &str) -> u64 {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = n.parse().unwrap();
    n * match unit {
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "" => 1,
        other => panic!("unit {other}"),
    }
}

/// The size of the container's /dev/shm: a memory-backed volume mounted
/// there is its sizeLimit, else the pod's memory limit (the larger of its
/// containers' sum and any init container's); none, a container's 64 MiB.
fn shm_size(pod: &Value, c: &Value) -> u64 {
    let Some(mount) = c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["mountPath"] == "/dev/shm")
    else {
        return 64 << 20;
    };
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {} in {pod}", mount["name"]));
    assert_eq!(volume["emptyDir"]["medium"], "Memory", "{volume}");
    if let Some(limit) = volume["emptyDir"]["sizeLimit"].as_str() {
        return bytes(limit);
    }
    let limit = |cs: &Value| -> Vec<u64> {
        cs.as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["resources"]["limits"]["memory"].as_str().map(bytes))
            .collect()
    };
    let sum: u64 = limit(&pod["spec"]["containers"]).iter().sum();
    sum.max(
        limit(&pod["spec"]["initContainers"])
            .into_iter()
            .max()
            .unwrap_or(0),
    )
}

/// The image's USER (contrib/kubernetes/Dockerfile): uid and gid.
fn image_user() -> (u32, u32) {
    let text =
        std::fs::read_to_string(super::repo().join("contrib/kubernetes/Dockerfile")).unwrap();
    let user = text
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .unwrap();
    let (u, g) = user.split_once(':').unwrap_or((user, user));
    (u.trim().parse().unwrap(), g.trim().parse().unwrap())
}

/// The user the container runs as: its securityContext's, else the
/// pod's, else the image's; refused as the kubelet refuses root under
/// runAsNonRoot.
fn user(pod: &Value, c: &Value) -> (u32, u32) {
    let ctx = |k: &str| {
        c["securityContext"][k]
            .as_u64()
            .or(pod["spec"]["securityContext"][k].as_u64())
    };
    let image = image_user();
    let uid = ctx("runAsUser").map_or(image.0, |u| u as u32);
    let gid = ctx("runAsGroup").map_or(
        if ctx("runAsUser").is_some() {
            uid
        } else {
            image.1
        },
        |g| g as u32,
    );
    let non_root = c["securityContext"]["runAsNonRoot"]
        .as_bool()
        .or(pod["spec"]["securityContext"]["runAsNonRoot"].as_bool());
    assert!(
        !(non_root == Some(true) && uid == 0),
        "the kubelet refuses root under runAsNonRoot"
    );
    (uid, gid)
}

/// What the kubelet does to start the init container of `pod` on host
/// `i`: its mounts, its user, no capabilities, its environment, the
/// image's entrypoint with the container's arguments.
fn run_init(c: &Cluster, files: &HostFiles, pod: &Value, i: usize, secrets: &Secrets) -> Proc {
    let init = &pod["spec"]["initContainers"][0];
    assert_eq!(init["name"], "preflight", "{pod}");
    let env = environment(pod, init, &c.addr(i), secrets);
    let (uid, gid) = user(pod, init);
    let shm = shm_size(pod, init);
    let script = "mount -t tmpfs -o size=\"$1\",mode=1777 tmpfs /dev/shm && shift && exec setpriv --reuid=\"$1\" --regid=\"$2\" --clear-groups --inh-caps=-all --bounding-set=-all -- \"${@:3}\"";
    let mut argv: Vec<String> = ["bash", "-c", script, "kubelet"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.extend([
        shm.to_string(),
        uid.to_string(),
        gid.to_string(),
        common::BIN.to_string(),
    ]);
    argv.extend(
        init["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string()),
    );
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let name = hostname(pod);
    cluster::on_host_named(c, files, i, &name, &argv, &env)
}

/// Each pod's /etc/hosts: its own name and every pod's DNS names (the
/// headless Service publishes them before the pods are Ready, as
/// Trainer's and LeaderWorkerSet's do).
fn write_hosts(c: &Cluster, files: &HostFiles, names: &[String]) {
    let mut text = String::from("127.0.0.1 localhost\n");
    for (i, n) in names.iter().enumerate() {
        let short = n.split('.').next().unwrap();
        text.push_str(&format!("{} {n} {short}\n", c.addr(i)));
    }
    for p in &files.paths {
        std::fs::write(p, &text).unwrap();
    }
}

/// The AdmissionReview of `pod`'s CREATE, as the API server sends it.
fn review(pod: &Value, uid: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("kubelet-{uid}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kubeflow:jobset-controller"},
            "object": pod,
            "dryRun": false,
        },
    }))
    .unwrap()
}

const TOKEN: &str = "5f4dcc3b5aa765d61d8327deb882cf99";

/// Kubeflow Trainer v2's pod `i` of a TrainJob `tj` of three nodes: the
/// `node` container with its PET_ variables (the rank from the Job's
/// completion index annotation), its own memory-backed /dev/shm (`dshm`,
/// no sizeLimit, under a 16 GiB limit), a non-root user of its own.
fn trainer(i: usize) -> Value {
    json!({
        "metadata": {
            "name": format!("tj-node-0-{i}-x2k9q"),
            "namespace": "default",
            "labels": {
                "preflight.dev/gate": "gang",
                "jobset.sigs.k8s.io/jobset-name": "tj",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "jobset.sigs.k8s.io/job-index": "0",
            },
            "annotations": {
                "batch.kubernetes.io/job-completion-index": i.to_string(),
                "preflight.dev/token-secret": "tj-token",
            },
        },
        "spec": {
            "hostname": format!("tj-node-0-{i}"),
            "subdomain": "tj",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000},
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
            "containers": [{
                "name": "node",
                "image": "pytorch/pytorch:2.15.0",
                "command": ["torchrun", "train.py"],
                "env": [
                    {"name": "PET_NNODES", "value": "3"},
                    {"name": "PET_NPROC_PER_NODE", "value": "1"},
                    {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
                    {"name": "PET_MASTER_ADDR", "value": "tj-node-0-0.tj"},
                    {"name": "PET_MASTER_PORT", "value": "29500"},
                ],
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                "resources": {"limits": {"memory": "16Gi"}},
            }],
        },
    })
}

/// LeaderWorkerSet's pod `i` of group 0 of `lws` (size 3): the worker
/// index from its label, no /dev/shm volume of its own (the gate brings
/// one), runAsNonRoot with no runAsUser (the image's numeric USER).
fn leader_worker_set(i: usize) -> Value {
    let name = if i == 0 {
        "lws-0".to_string()
    } else {
        format!("lws-0-{i}")
    };
    json!({
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {
                "preflight.dev/gate": "gang",
                "leaderworkerset.sigs.k8s.io/name": "lws",
                "leaderworkerset.sigs.k8s.io/worker-index": i.to_string(),
            },
        },
        "spec": {
            "hostname": name,
            "subdomain": "lws",
            "securityContext": {"runAsNonRoot": true},
            "containers": [{
                "name": "worker",
                "image": "vllm/vllm-openai:latest",
                "env": [
                    {"name": "LWS_LEADER_ADDRESS", "value": "lws-0.lws.default"},
                    {"name": "LWS_GROUP_SIZE", "value": "3"},
                    {"name": "LWS_WORKER_INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']"}}},
                ],
            }],
        },
    })
}

/// The three pods of `make`'s job through the webhook and the stand-in
/// kubelet: each pod's exit code, report and what its /dev/shm was.
fn gang(make: fn(usize) -> Value, names: [&str; 3]) {
    let _serial = common::serial();
    let Some(w) = Webhook::start() else { return };
    let Some(c) = Cluster::new(3) else { return };
    let files = cluster::host_files(&c, None);
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    write_hosts(&c, &files, &names);
    let secrets: Secrets = [(
        ("tj-token".to_string(), "token".to_string()),
        TOKEN.to_string(),
    )]
    .into();
    let pods: Vec<Value> = (0..3)
        .map(|i| {
            let pod = make(i);
            let req: Value = serde_json::from_slice(&review(&pod, i)).unwrap();
            let (code, out) = w.call("POST", "/mutate?timeout=5s", &review(&pod, i));
            assert_eq!(code, 200, "{}", String::from_utf8_lossy(&out));
            patched(&req, &serde_json::from_slice(&out).unwrap())
        })
        .collect();
    // As the API server stores them: each against the schema.
    for p in &pods {
        let mut p = p.clone();
        p["apiVersion"] = json!("v1");
        p["kind"] = json!("Pod");
        super::validate(&p, w.dir.path());
    }
    // The workers first; the leader last, as a scheduler may start them.
    let mut procs: Vec<Proc> = (1..3)
        .map(|i| run_init(&c, &files, &pods[i], i, &secrets))
        .collect();
    procs.insert(0, run_init(&c, &files, &pods[0], 0, &secrets));
    for (i, p) in procs.into_iter().enumerate() {
        let o = p.finish(std::time::Duration::from_secs(120));
        println!("pod {i}: {}", o.stdout.lines().last().unwrap_or(""));
        assert_eq!(
            o.code,
            0,
            "pod {i} ({}) as the kubelet runs its gate, /dev/shm {} bytes: {}\n{}",
            names[i],
            shm_size(&pods[i], &pods[i]["spec"]["initContainers"][0]),
            o.stdout,
            o.stderr
        );
    }
}

#[test]
fn a_trainer_gang_of_three_is_ready_as_a_stock_cluster_runs_its_gates() {
    gang(
        trainer,
        ["tj-node-0-0.tj", "tj-node-0-1.tj", "tj-node-0-2.tj"],
    );
}

#[test]
fn a_leader_worker_set_gang_of_three_is_ready_as_a_stock_cluster_runs_its_gates() {
    gang(
        leader_worker_set,
        [
            "lws-0.lws.default",
            "lws-0-1.lws.default",
            "lws-0-2.lws.default",
        ],
    );
}

/// The control: the same init container with the 64 MiB /dev/shm of a
/// container that mounts nothing there is not ready, and says why.
#[test]
fn without_the_gates_shm_a_stock_container_fails_the_shm_check() {
    let _serial = common::serial();
    let Some(c) = Cluster::new(1) else { return };
    let files = cluster::host_files(&c, None);
    let mut pod = leader_worker_set(0);
    pod["spec"]["initContainers"] = json!([{
        "name": "preflight",
        "args": ["check", "--only", "memory.shm", "--format", "json"],
    }]);
    let o =
        run_init(&c, &files, &pod, 0, &Secrets::new()).finish(std::time::Duration::from_secs(60));
    assert_eq!(o.code, 1, "{}\n{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("memory.shm"), "{}", o.stdout);
}

/// Why the webhook adds nothing for the kernel log (docs/kubernetes.md),
/// measured as a container's process is made: a non-root gate given
/// CAP_SYSLOG (the kubelet puts an added capability in the bounding and
/// inheritable sets; a non-root process gets none of it, with no ambient
/// capabilities) still cannot open /dev/kmsg where kernel.dmesg_restrict
/// is 1, which only root with CAP_SYSLOG can, and root is what
/// `runAsNonRoot` and the `restricted` Pod Security level forbid. Where
/// dmesg_restrict is 0 anyone reads it, and the gate needs nothing.
#[test]
fn a_capability_added_to_a_non_root_gate_does_not_open_the_kernel_log() {
    let _shared = common::shared();
    if !std::path::Path::new("/dev/kmsg").exists() || !super::super::have("setpriv") {
        common::skip::skip("no /dev/kmsg or no setpriv here");
        return;
    }
    let restricted =
        std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict").is_ok_and(|v| v.trim() == "1");
    // One record, read without waiting (a read of /dev/kmsg takes a
    // record whole, into a buffer that holds it).
    let opens = |user: &[&str]| {
        std::process::Command::new("setpriv")
            .args(user)
            .args(["--inh-caps=-all,+syslog", "--bounding-set=-all,+syslog"])
            .args(["--no-new-privs", "--", "dd", "if=/dev/kmsg", "of=/dev/null"])
            .args(["bs=65536", "count=1", "iflag=nonblock", "status=none"])
            .output()
            .unwrap()
    };
    let gate = opens(&["--reuid=65532", "--regid=65532", "--clear-groups"]);
    let root = opens(&[]);
    assert_eq!(
        gate.status.success(),
        !restricted,
        "uid 65532 with CAP_SYSLOG added: {}",
        String::from_utf8_lossy(&gate.stderr)
    );
    assert!(
        root.status.success(),
        "root with CAP_SYSLOG alone: {}",
        String::from_utf8_lossy(&root.stderr)
    );
}
