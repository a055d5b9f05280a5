//! What the webhook does to a pod: the AdmissionReview v1 the API server
//! sends, answered with the pod allowed and, for a pod labelled
//! `preflight.dev/gate`, a JSON patch that puts preflight's init container
//! first:
//!
//! - `gang`: `preflight run`, with the environment of the pod's first
//!   container (the rank variables its operator gave it: PET_, LWS_,
//!   VC_, MASTER_ADDR, JOB_COMPLETION_INDEX), JobSet's labels through the
//!   downward API, the job's secret from the Secret the pod's annotation
//!   names, and the first container's devices;
//! - `node`: `preflight check` of the node, with the same devices;
//! - anything else: refused, with why;
//! - every other pod, and every operation but CREATE: allowed unchanged.
//!
//! Both see what the job will: its memory-backed volume at /dev/shm (or
//! one of the gate's own, sized for the shm check, where the job mounts
//! none: a container's own /dev/shm is 64 MiB), its devices, DRA claims
//! included, and its user. A training-operator v1 PyTorchJob pod is
//! refused a gang gate, with why: its Services publish no address of a
//! pod that is not Ready, so its peers could never be found.
//!
//! Pure: bytes in, status and bytes out; the server is `serve`.

use base64::Engine;
use serde_json::{Value, json};

/// The label that asks for the gate, and its values.
pub const GATE_LABEL: &str = "preflight.dev/gate";
/// The annotation naming the Secret that holds the job's token (key
/// `token`), which every pod of the job mounts.
pub const TOKEN_SECRET_ANNOTATION: &str = "preflight.dev/token-secret";
/// JobSet: its Jobs' parallelism, which no label carries.
pub const PODS_PER_JOB_ANNOTATION: &str = "preflight.dev/pods-per-job";
/// The init container's name: a pod that has one is left as it is (the
/// API server may call the webhook again for the same pod).
pub const CONTAINER: &str = "preflight";

/// A gang's size, as its scheduler's PodGroup gives it (`podgroup`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gang {
    pub size: u32,
    /// Where it was read: `Volcano PodGroup ml/train-pg`.
    pub from: String,
}

/// The webhook's settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub image: String,
    /// `preflight run`'s deadline: every pod of the gang must start within
    /// it (image pulls, scheduling).
    pub gang_timeout: std::time::Duration,
    /// Where gangs' PodGroups are read; `None`: not read.
    pub podgroups: Option<std::sync::Arc<super::podgroup::ApiServer>>,
}

/// JobSet's labels, as the downward API gives them to the init container.
const JOBSET_LABELS: &[(&str, &str)] = &[
    ("JOBSET_NAME", "jobset.sigs.k8s.io/jobset-name"),
    (
        "JOBSET_REPLICATED_JOB",
        "jobset.sigs.k8s.io/replicatedjob-name",
    ),
    ("JOBSET_JOB_INDEX", "jobset.sigs.k8s.io/job-index"),
    (
        "JOBSET_REPLICAS",
        "jobset.sigs.k8s.io/replicatedjob-replicas",
    ),
];

/// Resources that are not devices: the init container asks for little
/// CPU and memory of its own.
fn is_device(name: &str) -> bool {
    name.contains('/')
}

/// The first container's device requests and limits (`nvidia.com/gpu`,
/// `amd.com/gpu`, `habana.ai/gaudi`, `rdma/...`), and its Dynamic
/// Resource Allocation claims (`resources.claims`: on a DRA cluster the
/// GPUs come only through them).
fn devices(first: &Value) -> Value {
    let mut out = json!({
        "requests": {"cpu": "100m", "memory": "64Mi"},
        "limits": {"memory": "256Mi"},
    });
    for side in ["requests", "limits"] {
        if let Some(m) = first["resources"][side].as_object() {
            for (k, v) in m.iter().filter(|(k, _)| is_device(k)) {
                out[side][k] = v.clone();
            }
        }
    }
    if let Some(claims) = first["resources"]["claims"].as_array() {
        out["claims"] = Value::Array(claims.clone());
    }
    out
}

/// Where a container's shared memory is.
const SHM: &str = "/dev/shm";
/// The gate's own memory-backed volume, where the job mounts none at
/// /dev/shm, and its size: what the shipped `memory.shm` check asks.
pub const SHM_VOLUME: &str = "preflight-shm";
const SHM_SIZE: &str = "1Gi";

/// The job container's mount at /dev/shm, where it has one.
fn shm_mount(first: &Value) -> Option<Value> {
    first["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["mountPath"].as_str().map(|p| p.trim_end_matches('/')) == Some(SHM))
        .cloned()
}

/// Labels that mark a pod of Kubeflow training-operator v1's PyTorchJob
/// (v1.7 on, then the older one).
const PYTORCHJOB_V1_LABELS: &[&str] = &["training.kubeflow.org/job-name", "pytorch-job-name"];

/// The container whose environment is the job's: the one its operator
/// gives the rank variables (Kubeflow Trainer's `node`, PyTorchJob's
/// `pytorch`), else the first that carries any of them, else the first
/// (a sidecar injected first has none of them).
fn job_container(pod: &Value) -> &Value {
    let containers = pod["spec"]["containers"].as_array();
    let all = containers.map(Vec::as_slice).unwrap_or_default();
    let carries = |c: &&Value| {
        c["env"].as_array().is_some_and(|env| {
            env.iter().any(|e| {
                e["name"].as_str().is_some_and(|n| {
                    preflight_facts::pod::POD_VARS.contains(&n) || n == "MASTER_ADDR"
                })
            })
        })
    };
    all.iter()
        .find(|c| c["name"] == "node" || c["name"] == "pytorch")
        .or_else(|| all.iter().find(carries))
        .or(all.first())
        .unwrap_or(&Value::Null)
}

/// The init container for a pod gated as `gate`.
fn container(pod: &Value, gate: &str, cfg: &Config, gang: Option<&Gang>) -> Value {
    let first = job_container(pod);
    let meta = &pod["metadata"];
    let mut env: Vec<Value> = Vec::new();
    let mut c = json!({
        "name": CONTAINER,
        "image": cfg.image,
        "resources": devices(first),
        "terminationMessagePolicy": "File",
    });
    // The job's own container's: the same user (the token is this user's
    // to read) and whatever the namespace's Pod Security level asks of it.
    if first["securityContext"].is_object() {
        c["securityContext"] = first["securityContext"].clone();
    }
    // The job's /dev/shm, else the gate's own (added to the pod's volumes
    // by `patch`).
    c["volumeMounts"] = json!([shm_mount(first).unwrap_or_else(|| json!({
        "name": SHM_VOLUME,
        "mountPath": SHM,
    }))]);
    if gate == "gang" {
        c["args"] = json!(
            GateRun::Gang {
                timeout: cfg.gang_timeout
            }
            .argv()
        );
        env.extend(first["env"].as_array().cloned().unwrap_or_default());
        if let Some(from) = first["envFrom"].as_array() {
            c["envFrom"] = Value::Array(from.clone());
        }
        let labels = &meta["labels"];
        for (var, label) in JOBSET_LABELS {
            if labels[*label].is_string() && !env.iter().any(|e| e["name"] == *var) {
                env.push(json!({
                    "name": var,
                    "valueFrom": {"fieldRef": {"fieldPath": format!("metadata.labels['{label}']")}},
                }));
            }
        }
        // A JobSet's pods live under the headless Service its
        // `network.subdomain` names, which the pod carries.
        if labels["jobset.sigs.k8s.io/jobset-name"].is_string()
            && let Some(sub) = pod["spec"]["subdomain"].as_str()
        {
            env.retain(|e| e["name"] != "JOBSET_SUBDOMAIN");
            env.push(json!({"name": "JOBSET_SUBDOMAIN", "value": sub}));
        }
        if let Some(n) = meta["annotations"][PODS_PER_JOB_ANNOTATION].as_str() {
            env.retain(|e| e["name"] != "JOBSET_PODS_PER_JOB");
            env.push(json!({"name": "JOBSET_PODS_PER_JOB", "value": n}));
        }
        if let Some(secret) = meta["annotations"][TOKEN_SECRET_ANNOTATION].as_str() {
            // The Secret's key as the variable (an explicit env entry wins
            // over envFrom): a Secret volume's files are root's, under
            // fsGroup readable by the group, and preflight takes a token
            // file only when it is its own user's alone; a variable only
            // this user's processes can read works for every user.
            env.retain(|e| e["name"] != "PREFLIGHT_TOKEN" && e["name"] != "PREFLIGHT_TOKEN_FILE");
            env.push(json!({
                "name": "PREFLIGHT_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}},
            }));
        }
        if let Some(g) = gang {
            env.retain(|e| {
                e["name"] != preflight_facts::pod::GANG_SIZE
                    && e["name"] != preflight_facts::pod::GANG_FROM
            });
            env.push(json!({"name": preflight_facts::pod::GANG_SIZE, "value": g.size.to_string()}));
            env.push(json!({"name": preflight_facts::pod::GANG_FROM, "value": g.from}));
        }
        // No contract found in the pod is an error there, never a world of
        // one that passes alone.
        env.retain(|e| e["name"] != REQUIRE_GANG);
        env.push(json!({"name": REQUIRE_GANG, "value": "1"}));
    } else {
        c["args"] = json!(GateRun::NODE.argv());
    }
    if !env.is_empty() {
        c["env"] = Value::Array(env);
    }
    c
}

/// What the init container runs, as values; `argv` spells it the way
/// `preflight`'s command line takes it (the kubelet tests run it so).
#[derive(Debug, PartialEq)]
enum GateRun {
    /// `preflight run`: the gang meets and is checked, within `timeout`.
    Gang { timeout: std::time::Duration },
    /// `preflight check`: this node's checklist, the checks tagged `skip`
    /// left out, within `timeout`.
    Node {
        skip: &'static str,
        timeout: std::time::Duration,
    },
}

impl GateRun {
    /// A node's gate: quick enough for every pod's start.
    const NODE: GateRun = GateRun::Node {
        skip: "slow",
        timeout: std::time::Duration::from_secs(45),
    };

    fn argv(&self) -> Vec<String> {
        // Whole seconds, at least one: `--timeout` takes no zero.
        let secs = |d: &std::time::Duration| format!("{}s", d.as_secs().max(1));
        match self {
            GateRun::Gang { timeout } => vec!["run".into(), "--timeout".into(), secs(timeout)],
            GateRun::Node { skip, timeout } => vec![
                "check".into(),
                "--skip".into(),
                skip.to_string(),
                "--timeout".into(),
                secs(timeout),
            ],
        }
    }
}

/// Set in a gang's init container: a pod in which no operator's contract
/// is found fails instead of running as a job of one (the cluster stage's
/// `REQUIRE_GANG_VAR`).
const REQUIRE_GANG: &str = "PREFLIGHT_REQUIRE_GANG";

/// The JSON patch for `pod`, or `None` when it is left unchanged; an
/// error for a gate label with a value that means nothing.
pub fn patch(pod: &Value, cfg: &Config, gang: Option<&Gang>) -> Result<Option<Vec<Value>>, String> {
    let Some(gate) = pod["metadata"]["labels"][GATE_LABEL].as_str() else {
        return Ok(None);
    };
    if gate != "gang" && gate != "node" {
        return Err(format!(
            "the label {GATE_LABEL}={gate}: it takes `gang` (preflight run across the job's pods) or `node` (preflight check of the node)"
        ));
    }
    let spec = &pod["spec"];
    if !spec["containers"][0].is_object() {
        return Err("the pod has no container".into());
    }
    let labels = &pod["metadata"]["labels"];
    if gate == "gang" && PYTORCHJOB_V1_LABELS.iter().any(|l| labels[*l].is_string()) {
        return Err(format!(
            "{GATE_LABEL}=gang on a training-operator v1 PyTorchJob pod: its Services do not publish the addresses of pods that are not Ready, so a gate in an init container can never find its peers and would hold the job's GPUs until its deadline. Set `publishNotReadyAddresses: true` on the job's Services, or run it as a Kubeflow Trainer v2 TrainJob; `{GATE_LABEL}=node` checks the node alone"
        ));
    }
    let inits = spec["initContainers"].as_array();
    if inits.is_some_and(|i| i.iter().any(|c| c["name"] == CONTAINER)) {
        return Ok(None);
    }
    if spec["containers"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["name"] == CONTAINER))
    {
        return Err(format!(
            "a container of this pod is named `{CONTAINER}`, the name of the gate's init container: rename it"
        ));
    }
    let c = container(pod, gate, cfg, gang);
    let own_shm = c["volumeMounts"][0]["name"] == SHM_VOLUME;
    let mut ops = vec![match inits {
        // First: nothing else in the pod starts before the gate opens.
        Some(_) => json!({"op": "add", "path": "/spec/initContainers/0", "value": c}),
        None => json!({"op": "add", "path": "/spec/initContainers", "value": [c]}),
    }];
    if own_shm {
        let volume = json!({
            "name": SHM_VOLUME,
            "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE},
        });
        ops.push(match spec["volumes"].as_array() {
            Some(v) if v.iter().any(|v| v["name"] == SHM_VOLUME) => {
                return Err(format!(
                    "a volume of this pod is named `{SHM_VOLUME}`, the name of the gate's own /dev/shm: rename it"
                ));
            }
            Some(_) => json!({"op": "add", "path": "/spec/volumes/-", "value": volume}),
            None => json!({"op": "add", "path": "/spec/volumes", "value": [volume]}),
        });
    }
    Ok(Some(ops))
}

/// The most of a request the webhook reads: the API server's own limit
/// on an object is 3 MiB, and a CREATE's review wraps one.
pub const MAX_BODY: usize = 4 << 20;

/// The AdmissionReview in `body`, or the 400 that refuses it, with why.
pub fn read(body: &[u8]) -> Result<Value, (u16, Vec<u8>)> {
    let bad = |why: String| (400, format!("{why}\n").into_bytes());
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        bad(format!(
            "not an AdmissionReview: the body is not JSON ({e})"
        ))
    })?;
    if v["kind"] != "AdmissionReview" || v["apiVersion"] != "admission.k8s.io/v1" {
        return Err(bad(format!(
            "not an AdmissionReview of admission.k8s.io/v1 (kind {}, apiVersion {})",
            v["kind"], v["apiVersion"]
        )));
    }
    if !v["request"]["uid"].is_string() {
        return Err(bad("an AdmissionReview without request.uid".into()));
    }
    Ok(v)
}

/// A pod this review would gate as a gang (created, labelled `gang`),
/// where it is one.
fn gang_pod(review: &Value) -> Option<&Value> {
    let req = &review["request"];
    let pod = &req["object"];
    let creating = req["operation"].as_str().is_none_or(|o| o == "CREATE");
    (req["kind"]["kind"] == "Pod" && creating && pod["metadata"]["labels"][GATE_LABEL] == "gang")
        .then_some(pod)
}

/// The PodGroup of the gang pod this review is for, where the gate
/// needs its size (a JobSet's pod with no pods per Job given, in its
/// annotation or its job container's variables) and its scheduler marked
/// one: what `answer` takes the size from. In the review's namespace,
/// whatever the pod says.
pub fn podgroup(review: &Value) -> Option<super::podgroup::GroupRef> {
    let pod = gang_pod(review)?;
    let meta = &pod["metadata"];
    let jobset = meta["labels"]["jobset.sigs.k8s.io/jobset-name"].is_string();
    let given = meta["annotations"][PODS_PER_JOB_ANNOTATION].is_string()
        || job_container(pod)["env"]
            .as_array()
            .is_some_and(|env| env.iter().any(|e| e["name"] == "JOBSET_PODS_PER_JOB"));
    if !jobset || given {
        return None;
    }
    let namespace = review["request"]["namespace"].as_str()?;
    super::podgroup::reference(pod, namespace)
}

/// The answer to a review `read` took, as the HTTP status and body: the
/// pod allowed, patched or refused (a gate label with a value that means
/// nothing is refused with why, which the API server shows to whoever
/// created the pod); `gang`, the size its PodGroup gave, or why it could
/// not be read (the pod is refused with why).
pub fn answer(v: &Value, cfg: &Config, gang: Option<Result<Gang, String>>) -> (u16, Vec<u8>) {
    let req = &v["request"];
    let uid = req["uid"].as_str().unwrap_or_default();
    let pod = &req["object"];
    let mut response = json!({"uid": uid, "allowed": true});
    // Only a pod being created: an init container cannot be added to one
    // that exists, and an UPDATE's pod is left as it is.
    let creating = req["operation"].as_str().is_none_or(|o| o == "CREATE");
    if req["kind"]["kind"] == "Pod" && pod.is_object() && creating {
        let patched = match &gang {
            Some(Ok(g)) => patch(pod, cfg, Some(g)),
            // The gate needs the size and has none: gated, the pod would
            // fail while the rest of its gang waits. Refused, its
            // controller makes it again.
            Some(Err(why)) => Err(format!(
                "{why}: a JobSet's gate needs its pods per Job, which no label carries; the PodGroup gives them, else set the annotation {PODS_PER_JOB_ANNOTATION}"
            )),
            None => patch(pod, cfg, None),
        };
        match patched {
            Ok(Some(ops)) => {
                let text = serde_json::to_vec(&ops).unwrap_or_default();
                response["patchType"] = json!("JSONPatch");
                response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(text));
            }
            Ok(None) => {}
            Err(why) => {
                response["allowed"] = json!(false);
                response["status"] = json!({"code": 400, "message": format!("preflight: {why}")});
            }
        }
    }
    let out = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    });
    (200, serde_json::to_vec(&out).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A review answered with no PodGroup read, as `serve` answers one
    /// without an API server.
    fn review(body: &[u8], cfg: &Config) -> (u16, Vec<u8>) {
        match read(body) {
            Ok(v) => answer(&v, cfg, None),
            Err(refused) => refused,
        }
    }

    fn cfg() -> Config {
        Config {
            image: "preflight:0.1.0".into(),
            gang_timeout: std::time::Duration::from_secs(600),
            podgroups: None,
        }
    }

    fn reviewed(pod: Value) -> Value {
        let req = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": pod},
        });
        let (status, body) = review(&serde_json::to_vec(&req).unwrap(), &cfg());
        assert_eq!(status, 200);
        serde_json::from_slice(&body).unwrap()
    }

    fn ops(r: &Value) -> Vec<Value> {
        let b = base64::engine::general_purpose::STANDARD
            .decode(r["response"]["patch"].as_str().unwrap())
            .unwrap();
        serde_json::from_slice(&b).unwrap()
    }

    #[test]
    fn the_gates_command_lines_are_spelt_from_their_values() {
        let gang = GateRun::Gang {
            timeout: std::time::Duration::from_millis(600_400),
        };
        assert_eq!(gang.argv(), ["run", "--timeout", "600s"]);
        assert_eq!(
            GateRun::NODE.argv(),
            ["check", "--skip", "slow", "--timeout", "45s"]
        );
        let instant = GateRun::Gang {
            timeout: std::time::Duration::ZERO,
        };
        assert_eq!(instant.argv()[2], "1s", "--timeout takes no zero");
    }

    #[test]
    fn a_gang_pod_gets_run_with_its_first_containers_environment_and_devices() {
        let r = reviewed(json!({
            "metadata": {
                "labels": {GATE_LABEL: "gang", "jobset.sigs.k8s.io/jobset-name": "js"},
                "annotations": {TOKEN_SECRET_ANNOTATION: "job-token"},
            },
            "spec": {"containers": [{
                "name": "node",
                "env": [{"name": "PET_NNODES", "value": "3"}],
                "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "1Ti"}},
            }]},
        }));
        assert_eq!(r["response"]["uid"], "u-1");
        assert_eq!(r["response"]["allowed"], true);
        let ops = ops(&r);
        let c = &ops[0]["value"][0];
        assert_eq!(ops[0]["path"], "/spec/initContainers");
        assert_eq!(c["args"][0], "run");
        let env = c["env"].to_string();
        assert!(
            env.contains("PET_NNODES") && env.contains("JOBSET_NAME"),
            "{env}"
        );
        assert!(
            env.contains("secretKeyRef") && env.contains("job-token"),
            "{env}"
        );
        assert!(env.contains(REQUIRE_GANG), "{env}");
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "8");
        assert_eq!(c["resources"]["limits"]["memory"], "256Mi");
        // The job mounts nothing at /dev/shm: the gate brings its own,
        // sized for the shm check, not a container's 64 MiB.
        assert_eq!(
            c["volumeMounts"],
            json!([{"name": SHM_VOLUME, "mountPath": "/dev/shm"}])
        );
        assert_eq!(ops[1]["path"], "/spec/volumes");
        assert_eq!(
            ops[1]["value"][0]["emptyDir"],
            json!({"medium": "Memory", "sizeLimit": "1Gi"})
        );
        assert_eq!(ops.len(), 2, "{ops:?}");
    }

    #[test]
    fn the_jobs_shm_claims_and_subdomain_are_the_gates() {
        let r = reviewed(json!({
            "metadata": {"labels": {GATE_LABEL: "gang", "jobset.sigs.k8s.io/jobset-name": "js"}},
            "spec": {
                "subdomain": "js-net",
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}],
                "containers": [{
                    "name": "node",
                    "env": [{"name": "JOB_COMPLETION_INDEX", "value": "0"}],
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                    "resources": {"claims": [{"name": "gpus"}]},
                }],
            },
        }));
        let ops = ops(&r);
        assert_eq!(
            ops.len(),
            1,
            "the job's own /dev/shm, no volume added: {ops:?}"
        );
        let c = &ops[0]["value"][0];
        assert_eq!(
            c["volumeMounts"],
            json!([{"name": "dshm", "mountPath": "/dev/shm"}])
        );
        assert_eq!(c["resources"]["claims"], json!([{"name": "gpus"}]));
        let env = c["env"].as_array().unwrap();
        assert!(
            env.iter()
                .any(|e| e["name"] == "JOBSET_SUBDOMAIN" && e["value"] == "js-net"),
            "{env:?}"
        );
    }

    #[test]
    fn a_pytorchjob_v1_pod_is_refused_a_gang_gate_and_only_a_create_is_patched() {
        let v1 = json!({
            "metadata": {"labels": {GATE_LABEL: "gang", "training.kubeflow.org/job-name": "pj"}},
            "spec": {"containers": [{"name": "pytorch"}]},
        });
        let r = reviewed(v1.clone());
        assert_eq!(r["response"]["allowed"], false);
        let why = r["response"]["status"]["message"].as_str().unwrap();
        assert!(
            why.contains("publishNotReadyAddresses") && why.contains("Trainer v2"),
            "{why}"
        );
        // Its node gate is fine.
        let mut node = v1;
        node["metadata"]["labels"][GATE_LABEL] = json!("node");
        assert_eq!(reviewed(node)["response"]["allowed"], true);
        // An UPDATE of a gated pod: allowed as it is.
        let req = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-2", "operation": "UPDATE",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "object": {"metadata": {"labels": {GATE_LABEL: "gang"}}, "spec": {"containers": [{"name": "c"}]}},
            },
        });
        let (_, body) = review(&serde_json::to_vec(&req).unwrap(), &cfg());
        let r: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(r["response"]["allowed"], true);
        assert!(r["response"]["patch"].is_null(), "{r}");
    }

    #[test]
    fn the_job_container_is_the_operators_not_a_sidecar_and_its_user_is_kept() {
        let r = reviewed(json!({
            "metadata": {"labels": {GATE_LABEL: "gang"}},
            "spec": {"containers": [
                {"name": "istio-proxy", "env": [{"name": "ISTIO_META", "value": "x"}]},
                {
                    "name": "trainer",
                    "env": [{"name": "LWS_GROUP_SIZE", "value": "3"}],
                    "securityContext": {"runAsUser": 1000, "runAsNonRoot": true},
                },
            ]},
        }));
        let c = &ops(&r)[0]["value"][0];
        assert!(c["env"].to_string().contains("LWS_GROUP_SIZE"), "{c}");
        assert!(!c["env"].to_string().contains("ISTIO_META"), "{c}");
        assert_eq!(c["securityContext"]["runAsUser"], 1000);
        let clash = reviewed(json!({
            "metadata": {"labels": {GATE_LABEL: "node"}},
            "spec": {"containers": [{"name": CONTAINER}]},
        }));
        assert_eq!(clash["response"]["allowed"], false);
    }

    #[test]
    fn node_unlabelled_gated_already_and_nonsense_labels() {
        let node = reviewed(json!({
            "metadata": {"labels": {GATE_LABEL: "node"}},
            "spec": {"initContainers": [{"name": "setup"}], "containers": [{"name": "c"}]},
        }));
        let ops = ops(&node);
        assert_eq!(ops[0]["path"], "/spec/initContainers/0");
        assert_eq!(ops[0]["value"]["args"][0], "check");
        let plain = reviewed(json!({"metadata": {}, "spec": {"containers": [{"name": "c"}]}}));
        assert!(plain["response"]["patch"].is_null());
        let again = reviewed(json!({
            "metadata": {"labels": {GATE_LABEL: "gang"}},
            "spec": {"initContainers": [{"name": CONTAINER}], "containers": [{"name": "c"}]},
        }));
        assert!(again["response"]["patch"].is_null());
        let odd = reviewed(json!({
            "metadata": {"labels": {GATE_LABEL: "yes"}},
            "spec": {"containers": [{"name": "c"}]},
        }));
        assert_eq!(odd["response"]["allowed"], false);
        assert!(
            odd["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains("gang")
        );
    }

    #[test]
    fn what_is_no_review_is_a_400_that_says_why() {
        for (body, why) in [
            (&b"{not json"[..], "not JSON"),
            (&br#"{"kind": "Pod", "apiVersion": "v1"}"#[..], "not an AdmissionReview"),
            (
                &br#"{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}}"#[..],
                "request.uid",
            ),
        ] {
            let (status, text) = review(body, &cfg());
            assert_eq!(status, 400);
            assert!(String::from_utf8_lossy(&text).contains(why), "{why}");
        }
    }
}
