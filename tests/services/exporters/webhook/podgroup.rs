//! The webhook reading a gang's size from its scheduler's PodGroup: an
//! API server stand-in over real HTTPS (Python's, its certificate made by
//! openssl for 127.0.0.1 and checked against the CA the webhook is given)
//! that answers GETs of PodGroups only with the ServiceAccount's bearer
//! token, as the API server would, and a JobSet gang pod of a Volcano
//! PodGroup sent as the API server sends its CREATE.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Webhook, patched};

/// The stand-in: GET of a path in `objects` with the right token gets
/// the object; a wrong token 401; another path 404; a path ending `/slow` no
/// answer for 10 s.
const API_SERVER: &str = r#"
import http.server, json, ssl, sys, time
cert, key, token, objects = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        want = "Bearer " + open(token).read().strip()
        if self.headers.get("Authorization") != want:
            return self.answer(401, {"kind": "Status", "message": "Unauthorized"})
        if self.path.endswith("/slow"):
            time.sleep(10)
        if self.path in objects:
            return self.answer(200, objects[self.path])
        return self.answer(404, {"kind": "Status", "message": "podgroups.scheduling.volcano.sh not found"})
    def answer(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

struct ApiServer {
    child: Child,
    port: u16,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ApiServer {
    /// Serving `objects` (path → object) to holders of `token`, with a
    /// certificate for 127.0.0.1 signed by a cluster CA, both made in
    /// `dir` (its `ca.crt` is the CA to trust).
    fn start(dir: &Path, token: &Path, objects: &Value) -> ApiServer {
        let (cert, key) = (dir.join("api.crt"), dir.join("api.key"));
        let openssl = |subject: &str, out: &str, more: &[&str]| {
            let o = Command::new("openssl")
                .current_dir(dir)
                .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
                .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
                .args(["-subj", subject])
                .args(more)
                .args([
                    "-keyout",
                    &format!("{out}.key"),
                    "-out",
                    &format!("{out}.crt"),
                ])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        };
        openssl("/CN=kubernetes-ca", "ca", &[]);
        openssl(
            "/CN=kube-apiserver",
            "api",
            &[
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-addext",
                "basicConstraints=critical,CA:FALSE",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
            ],
        );
        let mut child = Command::new("python3")
            .args(["-c", API_SERVER])
            .arg(&cert)
            .arg(&key)
            .arg(token)
            .arg(objects.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
        ApiServer { child, port }
    }
}

/// A JobSet gang pod (2 Jobs, no pods-per-job annotation) that Volcano
/// marks as a member of `group`, as the API server sends its CREATE.
fn jobset_pod(group: &str) -> Vec<u8> {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "js-w-1-2-",
            "namespace": "ml",
            "labels": {
                "preflight.dev/gate": "gang",
                "jobset.sigs.k8s.io/jobset-name": "js",
                "jobset.sigs.k8s.io/replicatedjob-name": "w",
                "jobset.sigs.k8s.io/job-index": "1",
                "jobset.sigs.k8s.io/replicatedjob-replicas": "2",
            },
            "annotations": {"scheduling.k8s.io/group-name": group},
        },
        "spec": {
            "schedulerName": "volcano",
            "subdomain": "js",
            "containers": [{
                "name": "trainer",
                "image": "train:1",
                "env": [{"name": "JOB_COMPLETION_INDEX", "value": "2"}],
            }],
        },
    });
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "5e0b3f9a-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "object": pod,
        },
    }))
    .unwrap()
}

/// The init container's variable `name`, where the patch sets one.
fn var(init: &Value, name: &str) -> Option<String> {
    init["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(String::from))
}

#[test]
fn a_gangs_size_is_read_from_its_podgroup_or_the_pod_is_gated_with_a_warning() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "sa-token-1\n").unwrap();
    let objects = json!({
        "/apis/scheduling.volcano.sh/v1beta1/namespaces/ml/podgroups/js-pg": {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "js-pg", "namespace": "ml"},
            "spec": {"minMember": 6, "queue": "default"},
        },
    });
    let api = ApiServer::start(dir.path(), &token, &objects);
    let Some(w) = Webhook::start_with(&[
        "--api-server".into(),
        format!("https://127.0.0.1:{}", api.port).into(),
        "--api-ca".into(),
        dir.path().join("ca.crt").into_os_string(),
        "--api-token".into(),
        token.clone().into_os_string(),
    ]) else {
        return;
    };
    let review = |group: &str| -> (Value, Duration) {
        let body = jobset_pod(group);
        let start = Instant::now();
        let (code, out) = w.call("POST", "/mutate?timeout=5s", &body);
        let took = start.elapsed();
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&out));
        let req: Value = serde_json::from_slice(&body).unwrap();
        let resp: Value = serde_json::from_slice(&out).unwrap();
        let pod = patched(&req, &resp);
        let mut seen = pod["spec"]["initContainers"][0].clone();
        seen["warnings"] = resp["response"]["warnings"].clone();
        (seen, took)
    };
    // Read: the gang's size and where it came from, for the gate.
    let (init, _) = review("js-pg");
    assert_eq!(
        var(&init, "PREFLIGHT_GANG_SIZE").as_deref(),
        Some("6"),
        "{init}"
    );
    assert_eq!(
        var(&init, "PREFLIGHT_GANG_FROM").as_deref(),
        Some("Volcano PodGroup ml/js-pg"),
        "{init}"
    );
    assert!(init["warnings"].is_null(), "{init}");
    // The gate takes it as a JobSet of 2 Jobs of 3 pods, this pod the
    // last: its plan, from the patched container's own environment.
    let mut env: Vec<(String, String)> = init["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?.into(), e["value"].as_str()?.into())))
        .collect();
    for (var, value) in [
        ("JOBSET_NAME", "js"),
        ("JOBSET_REPLICATED_JOB", "w"),
        ("JOBSET_JOB_INDEX", "1"),
        ("JOBSET_REPLICAS", "2"),
    ] {
        // The downward API's fieldRefs, resolved as the kubelet does.
        env.push((var.into(), value.into()));
    }
    // `preflight run` as the init container (its peers absent here: it
    // ends NOT READY at its deadline, its plan said).
    let out = super::super::binary::preflight()
        .args(["run", "--timeout", "2s", "--format", "json"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    assert_eq!(report["cluster"]["world_size"], 6, "{report}");
    assert_eq!(report["cluster"]["master"], "js-w-0-0.js:29500", "{report}");
    // No such PodGroup, and one that never answers: the gate could not
    // place the pod, so it is refused with why (its controller makes it
    // again), well inside the API server's 5 s wait; the API server's own
    // message is not repeated.
    for (group, why) in [
        (
            "gone",
            "Volcano PodGroup ml/gone not read: the API server answered 404 Not Found: a JobSet's gate needs its pods per Job",
        ),
        (
            "slow",
            "Volcano PodGroup ml/slow not read: no answer in 2000 ms: a JobSet's gate needs its pods per Job",
        ),
    ] {
        let start = Instant::now();
        let (code, out) = w.call("POST", "/mutate?timeout=5s", &jobset_pod(group));
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(code, 200);
        let resp: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(resp["response"]["allowed"], false, "{resp}");
        let message = resp["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.starts_with(&format!("preflight: {why}")),
            "{message}"
        );
        assert!(!message.contains("not found"), "{message}");
    }
    // Read once, taken as read for a minute: the gang's other pods cost
    // the API server nothing (the stand-in, gone, would refuse them).
    drop(api);
    let (init, _) = review("js-pg");
    assert_eq!(
        var(&init, "PREFLIGHT_GANG_SIZE").as_deref(),
        Some("6"),
        "{init}"
    );
}
