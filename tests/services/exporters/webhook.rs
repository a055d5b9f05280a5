//! `preflight webhook` over real HTTPS (a certificate made by openssl for
//! the Service's DNS name, checked by curl as the API server checks it
//! against its caBundle), fed the AdmissionReview requests the API server
//! sends (fixtures/admission): the gang, node, unlabelled and malformed
//! cases, and the patched pod validated against the Kubernetes schema.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use super::binary::repo;

/// The injected init container run as a kubelet runs it.
mod kubelet;
/// A gang's size from its PodGroup, read from an API server.
mod podgroup;

const NAME: &str = "preflight-webhook.preflight.svc";

struct Webhook {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Webhook {
    fn start() -> Option<Webhook> {
        Webhook::start_with(&[])
    }

    /// With more arguments of the caller's (`--api-server ...`).
    fn start_with(more: &[std::ffi::OsString]) -> Option<Webhook> {
        if !super::have("openssl") || !super::have("curl") {
            super::common::skip::skip("openssl and curl are needed (apt: openssl curl)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = new_pair(dir.path(), "tls");
        let mut child = super::binary::preflight()
            .args([
                "webhook",
                "--listen",
                "127.0.0.1:0",
                "--image",
                "preflight:0.1.0",
            ])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .args(more)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Its first line says where it serves: the event to wait for.
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        let port = line
            .split("https://127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        // Its later lines (each request it refuses) are drained, never
        // left to fill the pipe.
        std::thread::spawn(move || for _ in err.lines() {});
        Some(Webhook { child, port, dir })
    }

    /// A request as the API server makes it: HTTPS to the Service's name,
    /// the certificate checked against the CA bundle.
    fn call(&self, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
        self.call_with(method, path, body, &[])
    }

    /// `call`, with curl options of the caller's own.
    fn call_with(&self, method: &str, path: &str, body: &[u8], curl: &[&str]) -> (u16, Vec<u8>) {
        let file = self.body_file(body);
        let mut out = self.curl(|c| {
            c.args(["-X", method])
                .args([
                    "-H",
                    "Content-Type: application/json",
                    "-H",
                    "Accept: application/json",
                ])
                .args(curl)
                .arg("--data-binary")
                .arg(format!("@{}", file.display()))
                .args(["-w", "\n%{http_code}"])
                .args(self.to(path));
        });
        let at = out.iter().rposition(|b| *b == b'\n').unwrap();
        let code = String::from_utf8_lossy(&out[at + 1..]).parse().unwrap();
        out.truncate(at);
        (code, out)
    }

    /// A POST of `body`, then `GET /healthz` by the same curl, which keeps
    /// the connection for it if the webhook did: for each, its status,
    /// the connections it opened and the bytes it sent.
    fn post_then_healthz(&self, body: &[u8], curl: &[&str]) -> String {
        let file = self.body_file(body);
        let said = [
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{num_connects} %{size_upload}\n",
        ];
        let out = self.curl(|c| {
            c.args(curl)
                .arg("--data-binary")
                .arg(format!("@{}", file.display()))
                .args(said)
                .args(self.to("/mutate?timeout=10s"))
                .arg("--next")
                .args(said)
                .args(self.to("/healthz"));
        });
        String::from_utf8_lossy(&out).into_owned()
    }

    fn body_file(&self, body: &[u8]) -> std::path::PathBuf {
        let file = self.dir.path().join("body");
        std::fs::write(&file, body).unwrap();
        file
    }

    /// The options that reach `path` as the API server does (after
    /// `--next` too: curl takes them per URL): the Service's name
    /// resolved to the webhook, its certificate checked, 10 s at most.
    fn to(&self, path: &str) -> Vec<String> {
        vec![
            "--max-time".into(),
            "10".into(),
            "--cacert".into(),
            self.dir.path().join("tls.crt").display().to_string(),
            "--resolve".into(),
            format!("{NAME}:{}:127.0.0.1", self.port),
            format!("https://{NAME}:{}{path}", self.port),
        ]
    }

    /// curl with the options `add` gives it; its stdout, the test failing
    /// on an error of curl's own.
    fn curl(&self, add: impl FnOnce(&mut Command)) -> Vec<u8> {
        let mut c = Command::new("curl");
        c.arg("-sS");
        add(&mut c);
        let o = c.output().unwrap();
        assert!(
            o.status.success(),
            "curl: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    }

    fn review(&self, fixture: &str) -> (Value, Value) {
        let text = std::fs::read(repo().join("fixtures/admission").join(fixture)).unwrap();
        let (code, out) = self.call("POST", "/mutate?timeout=10s", &text);
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&out));
        (
            serde_json::from_slice(&text).unwrap(),
            serde_json::from_slice(&out).unwrap(),
        )
    }
}

/// RFC 6902 `add`, as the API server applies the webhook's patch (the
/// only operation the webhook sends).
fn apply(mut doc: Value, ops: &[Value]) -> Value {
    for op in ops {
        assert_eq!(op["op"], "add", "{op}");
        let path = op["path"].as_str().unwrap();
        let (parent, last) = path.rsplit_once('/').unwrap();
        let target = doc
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("no {parent}"));
        match (target, last) {
            (Value::Array(a), "-") => a.push(op["value"].clone()),
            (Value::Array(a), i) => a.insert(i.parse().unwrap(), op["value"].clone()),
            (Value::Object(m), k) => {
                assert!(!m.contains_key(k), "add over an existing {path}");
                m.insert(k.to_string(), op["value"].clone());
            }
            (other, _) => panic!("{path} into {other}"),
        }
    }
    doc
}

fn patched(request: &Value, response: &Value) -> Value {
    use base64::Engine;
    let r = &response["response"];
    assert_eq!(r["uid"], request["request"]["uid"]);
    assert_eq!(r["allowed"], true, "{response:#}");
    assert_eq!(r["patchType"], "JSONPatch");
    let ops: Vec<Value> = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(r["patch"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    apply(request["request"]["object"].clone(), &ops)
}

/// The pod, as the API server would store it, against the schema.
fn validate(pod: &Value, dir: &Path) {
    let Some(validate) = super::kubernetes_validate() else {
        super::common::skip::skip(
            "no kubernetes-validate (`.ci/install` puts it in /opt/preflight-k8s)",
        );
        return;
    };
    let mut pod = pod.clone();
    // A created pod has its name by now.
    if let Some(g) = pod["metadata"]["generateName"].as_str() {
        pod["metadata"]["name"] = json!(format!("{g}x7k2p"));
    }
    let file: PathBuf = dir.join("patched-pod.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&pod).unwrap()).unwrap();
    let out = Command::new(&validate)
        .args(["--kubernetes-version", "1.37.0", "--strict"])
        .arg(&file)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("passed"), "{text}");
}

#[test]
fn the_webhook_gates_gang_and_node_pods_leaves_others_and_survives_a_bad_body() {
    let _shared = crate::common::shared();
    let Some(w) = Webhook::start() else {
        return;
    };
    // Gang: `preflight run` first, with the pod's own rank variables, the
    // JobSet's labels, the job's secret and the pod's GPUs.
    let (req, resp) = w.review("review-gang.json");
    let pod = patched(&req, &resp);
    let init = &pod["spec"]["initContainers"][0];
    assert_eq!(init["name"], "preflight");
    assert_eq!(init["image"], "preflight:0.1.0");
    assert_eq!(init["args"], json!(["run", "--timeout", "600s"]));
    let env = init["env"].to_string();
    for var in [
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "JOB_COMPLETION_INDEX",
        "JOBSET_NAME",
        "PREFLIGHT_REQUIRE_GANG",
    ] {
        assert!(env.contains(var), "{var}: {env}");
    }
    // The job's secret, from the Secret the annotation names.
    let token = init["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "PREFLIGHT_TOKEN")
        .unwrap();
    assert_eq!(
        token["valueFrom"]["secretKeyRef"]["name"],
        "llama-preflight-token"
    );
    assert_eq!(init["resources"]["limits"]["nvidia.com/gpu"], "8");
    validate(&pod, w.dir.path());

    // Node: `preflight check`, before the pod's own init container.
    let (req, resp) = w.review("review-node.json");
    let pod = patched(&req, &resp);
    let inits = pod["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(
        (inits[0]["name"].as_str(), inits[1]["name"].as_str()),
        (Some("preflight"), Some("fetch-data"))
    );
    assert_eq!(inits[0]["args"][0], "check");
    validate(&pod, w.dir.path());

    // No label: allowed, unchanged.
    let (req, resp) = w.review("review-unlabelled.json");
    assert_eq!(resp["response"]["uid"], req["request"]["uid"]);
    assert_eq!(resp["response"]["allowed"], true);
    assert!(resp["response"]["patch"].is_null(), "{resp:#}");

    // A body it cannot read: 400 with why, and the next request is served.
    let (code, out) = w.call(
        "POST",
        "/mutate?timeout=10s",
        b"{\"kind\": \"AdmissionReview\", ",
    );
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&out));
    assert!(String::from_utf8_lossy(&out).contains("not JSON"));
    // Too big, said before a byte is sent (curl waits for "100
    // Continue" over 1 MiB; here as long as it takes), or sent without
    // waiting (`Expect:` empty), with its length or in chunks: each
    // sender gets its 413, never a connection reset under it while it is
    // still sending.
    let big = vec![b' '; 9 << 20];
    let waits = ["--expect100-timeout", "30"];
    let at_once = ["-H", "Expect:"];
    let chunked = ["-H", "Expect:", "-H", "Transfer-Encoding: chunked"];
    for curl in [&waits[..], &at_once, &chunked] {
        let (code, out) = w.call_with("POST", "/mutate?timeout=10s", &big, curl);
        assert_eq!(code, 413, "{curl:?}: {}", String::from_utf8_lossy(&out));
        assert_eq!(out, b"a body over 4 MiB\n", "{curl:?}");
    }
    // The sender that waits sent nothing: refused on the length it said.
    let said = w.post_then_healthz(&big, &waits);
    assert!(said.starts_with("413 1 0\n200 "), "{said}");
    // A body sent whole was read whole: the connection it came on is
    // kept, and the next request goes on it (no second connect), where a
    // connection closed on unread bytes is one the sender may see reset.
    // (Sent in chunks, the bytes sent count the chunks' framing too.)
    for curl in [&at_once[..], &chunked] {
        let said = w.post_then_healthz(&big, curl);
        let sent: Option<usize> = said
            .strip_prefix("413 1 ")
            .and_then(|r| r.strip_suffix("\n200 0 0\n"))
            .and_then(|n| n.parse().ok());
        assert!(sent.is_some_and(|n| n >= big.len()), "{curl:?}: {said}");
    }
    let (code, _) = w.call("GET", "/healthz", b"");
    assert_eq!(code, 200);
    let (code, _) = w.call("GET", "/mutate", b"");
    assert_eq!(code, 404);
    let (_, resp) = w.review("review-gang.json");
    assert_eq!(resp["response"]["allowed"], true);
}

/// A new pair made by openssl for the Service's name, as cert-manager
/// renews it: key and certificate files in `dir`.
fn new_pair(dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
    let (cert, key) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    let o = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", &format!("/CN={NAME}")])
        .args(["-addext", &format!("subjectAltName=DNS:{NAME}")])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (cert, key)
}

/// The certificate the webhook serves now: its SHA-256 fingerprint, as
/// `openssl s_client` sees it in a handshake.
fn served_fingerprint(port: u16) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect 127.0.0.1:{port} -servername {NAME} </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256"
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A renewed certificate is served within seconds of its files changing,
/// without a restart (the files replaced as the kubelet replaces a
/// Secret's: a rename over each), and a half-written pair is not taken:
/// the one in service stays.
#[test]
fn a_renewed_certificate_is_served_without_a_restart() {
    let _shared = crate::common::shared();
    let Some(w) = Webhook::start() else {
        return;
    };
    let first = served_fingerprint(w.port);
    assert!(first.contains("Fingerprint="), "{first}");
    let (cert, key) = new_pair(w.dir.path(), "renewed");
    let renewed = String::from_utf8(
        Command::new("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
            .arg(&cert)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    assert_ne!(renewed, first);
    // Mid-rotation, the new key beside the old certificate: not a pair,
    // so the one in service stays, and handshakes go on.
    std::fs::rename(&key, w.dir.path().join("tls.key")).unwrap();
    let mid = std::time::Instant::now();
    while mid.elapsed() < std::time::Duration::from_millis(1500) {
        assert_eq!(served_fingerprint(w.port), first, "mid-rotation");
    }
    std::fs::rename(&cert, w.dir.path().join("tls.crt")).unwrap();
    let changed = std::time::Instant::now();
    loop {
        let now = served_fingerprint(w.port);
        if now == renewed {
            break;
        }
        assert!(
            changed.elapsed() < std::time::Duration::from_secs(10),
            "still serving {now}, not the renewed {renewed}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // And reviews go on over it, checked against the new certificate.
    let (_, resp) = w.review("review-gang.json");
    assert_eq!(resp["response"]["allowed"], true);
}

/// Hundreds of idle connections from one pod take only that address's
/// share: a review from another address (the API server's) is answered
/// at once, the connections past the share are closed unread, and an
/// idle one is closed within the handshake's 3 s, below the API server's
/// 5 s wait.
#[test]
fn idle_connections_from_one_pod_cannot_stall_admission() {
    use std::io::Read;
    let _shared = crate::common::shared();
    let Some(w) = Webhook::start() else {
        return;
    };
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], w.port));
    let from = |_: usize| {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&std::net::SocketAddr::from(([127, 0, 0, 2], 0)).into())
            .unwrap();
        s.connect(&to.into()).unwrap();
        std::net::TcpStream::from(s)
    };
    let held: Vec<std::net::TcpStream> = (0..200).map(from).collect();
    let started = std::time::Instant::now();
    let (_, resp) = w.review("review-gang.json");
    assert_eq!(resp["response"]["allowed"], true);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Past the share: closed unread (end of stream, or reset).
    let mut closed = 0;
    for mut s in held {
        s.set_read_timeout(Some(std::time::Duration::from_secs(8)))
            .unwrap();
        let waited = std::time::Instant::now();
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) | Err(_) if waited.elapsed() < std::time::Duration::from_secs(5) => closed += 1,
            other => panic!("an idle connection lived {:?}: {other:?}", waited.elapsed()),
        }
    }
    assert_eq!(closed, 200);
}
