//! Where the verdict goes besides the terminal: `--format prometheus`
//! read by the real promtool and node_exporter's textfile collector; the
//! Kubernetes manifests in contrib/kubernetes/ validated against the
//! Kubernetes schemas (kubernetes-validate, offline) and the
//! node-problem-detector rule run as NPD runs it; `--post` to a real HTTP
//! listener, directly, through a proxy, retried, and failing without
//! changing the verdict.

use crate::common;
use crate::common::binary;

use crate::common::cluster;
/// `preflight webhook` over HTTPS, fed the API server's requests.
mod webhook;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use binary::{preflight, repo, run};
use common::Verdict;
use serde_json::Value;

const BROKEN: &str = "fixtures/h100-ib-broken";

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn promtool(file: &Path) -> (bool, String) {
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(file).unwrap())
        .output()
        .expect("promtool");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// GET `path` from 127.0.0.1:`port`, retried until `limit` while the
/// server starts.
fn http_get(port: u16, path: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
            let mut body = String::new();
            let _ = s.read_to_string(&mut body);
            return body;
        }
        assert!(start.elapsed() < limit, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn check_metrics_pass_promtool_and_node_exporter_serves_them() {
    let _shared = crate::common::shared();
    if !have("promtool") || !have("prometheus-node-exporter") {
        common::skip::skip(
            "promtool or node_exporter missing (apt: prometheus, prometheus-node-exporter)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("preflight.prom");
    let out = run(preflight().args([
        "check",
        "--root",
        BROKEN,
        "--format",
        "prometheus",
        "--output",
        file.to_str().unwrap(),
    ]));
    assert_eq!(out.code, 1, "{}", out.stderr);
    let text = std::fs::read_to_string(&file).unwrap();
    let (ok, lint) = promtool(&file);
    assert!(ok, "promtool: {lint}");
    for line in [
        "preflight_verdict{verdict=\"not_ready\"} 1",
        "preflight_verdict{verdict=\"ready\"} 0",
        "preflight_ready 0",
        "preflight_exit_code 1",
        "preflight_check_status{check=\"net.hostname\",area=\"network\",severity=\"fail\",status=\"fail\"} 1",
        "preflight_check_status{check=\"net.hostname\",area=\"network\",severity=\"fail\",status=\"pass\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
    // The control: promtool does reject what breaks its conventions.
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "preflight_thing_count 1\n").unwrap();
    assert!(!promtool(&bad).0, "promtool accepted a metric without HELP");
    // node_exporter's textfile collector, as a node runs it.
    let port = cluster::free_port();
    let mut exporter = Command::new("prometheus-node-exporter")
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .args(["--collector.disable-defaults", "--collector.textfile"])
        .arg(format!(
            "--collector.textfile.directory={}",
            dir.path().display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node_exporter");
    let scraped = http_get(port, "/metrics", Duration::from_secs(20));
    let _ = exporter.kill();
    let _ = exporter.wait();
    assert!(
        scraped.contains("node_textfile_scrape_error 0"),
        "{scraped}"
    );
    assert!(
        scraped.contains("preflight_verdict{verdict=\"not_ready\"} 1"),
        "{scraped}"
    );
    assert!(
        scraped.contains(
            "preflight_check_status{area=\"network\",check=\"net.hostname\",severity=\"fail\",status=\"fail\"} 1"
        ),
        "{scraped}"
    );
}

#[test]
fn bench_metrics_carry_the_bus_bandwidth_per_size() {
    let _shared = crate::common::shared();
    if !have("promtool") {
        common::skip::skip("promtool missing (apt: prometheus)");
        return;
    }
    let port = cluster::free_port().to_string();
    let args: Vec<String> = [
        "bench",
        "--backends",
        "tcp",
        "--max-size",
        "64KiB",
        "--timeout",
        "60s",
        "--format",
        "prometheus",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let procs: Vec<cluster::Proc> = (0..2)
        .map(|r| {
            let rank = r.to_string();
            let env = [
                ("RANK", rank.as_str()),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port.as_str()),
                ("PREFLIGHT_TOKEN", "a1ab37a362ce8e83697008057fd35abf"),
            ];
            cluster::local(&format!("rank{r}"), &args, &env)
        })
        .collect();
    let out: Vec<cluster::Outcome> = procs
        .into_iter()
        .map(|p| p.finish(Duration::from_secs(90)))
        .collect();
    for o in &out {
        assert_eq!(o.code, 0, "{}: {}", o.label, o.stderr);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bench.prom");
    std::fs::write(&file, &out[0].stdout).unwrap();
    let (ok, lint) = promtool(&file);
    assert!(ok, "promtool: {lint}");
    let text = &out[0].stdout;
    for prefix in [
        "preflight_collective_busbw_bytes_per_second{backend=\"tcp\",op=\"allreduce\",size_bytes=\"65536\"} ",
        "preflight_collective_time_seconds{backend=\"tcp\",op=\"allgather\",size_bytes=\"8\"} ",
        "preflight_collective_backend_up{backend=\"tcp\",verdict=\"pass\"} 1",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` in\n{text}"));
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(value > 0.0, "{line}");
    }
}

fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join("contrib/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    v
}

fn kubernetes_validate() -> Option<PathBuf> {
    let venv = std::env::var("PREFLIGHT_K8S_VENV").unwrap_or_else(|_| "/opt/preflight-k8s".into());
    let bin = Path::new(&venv).join("bin/kubernetes-validate");
    bin.exists().then_some(bin)
}

#[test]
fn the_kubernetes_manifests_are_valid_against_the_schemas() {
    let _shared = crate::common::shared();
    let Some(validate) = kubernetes_validate() else {
        common::skip::skip("no kubernetes-validate (`.ci/install` puts it in /opt/preflight-k8s)");
        return;
    };
    let files = manifests();
    assert!(files.len() >= 4, "{files:?}");
    let out = Command::new(&validate)
        .args(["--kubernetes-version", "1.37.0", "--strict"])
        .args(&files)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for kind in [
        "daemonset/preflight-npd",
        "daemonset/preflight-check",
        "job/preflight",
        "pod/trainer",
        "configmap/preflight-npd-config",
        "deployment/preflight-webhook",
        "service/preflight-webhook",
        "mutatingwebhookconfiguration/preflight-gate",
        "poddisruptionbudget/preflight-webhook",
        "priorityclass/preflight-webhook",
        "networkpolicy/preflight-webhook",
    ] {
        assert!(
            text.contains(&format!("passed for resource {kind}")),
            "{kind}: {text}"
        );
    }
    // The control: a misspelt field fails under the same flags.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    let text = std::fs::read_to_string(repo().join("contrib/kubernetes/init-container.yaml"))
        .unwrap()
        .replace("restartPolicy:", "restartPolicyy:");
    std::fs::write(&broken, text).unwrap();
    let out = Command::new(&validate)
        .args(["--kubernetes-version", "1.37.0", "--strict"])
        .arg(&broken)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a misspelt field passed");
}

fn kubectl() -> Option<PathBuf> {
    let venv = std::env::var("PREFLIGHT_K8S_VENV").unwrap_or_else(|_| "/opt/preflight-k8s".into());
    let bin = Path::new(&venv).join("bin/kubectl");
    bin.exists().then_some(bin)
}

/// `kubectl kustomize DIR`'s objects, each as JSON.
fn kustomized(kubectl: &Path, dir: &str) -> Vec<serde_json::Value> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(repo().join("contrib/kubernetes/kustomize").join(dir))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_objects(&String::from_utf8_lossy(&out.stdout))
}

/// The objects of a multi-document YAML text, as JSON, in a stable order.
fn yaml_objects(text: &str) -> Vec<serde_json::Value> {
    let script = "import json, sys, yaml\nprint(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))";
    let python = Path::new(
        &std::env::var("PREFLIGHT_K8S_VENV").unwrap_or_else(|_| "/opt/preflight-k8s".into()),
    )
    .join("bin/python");
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let mut v: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    v.sort_by_key(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]));
    v
}

/// The kustomize base and its overlays build with kubectl (1.37's
/// kustomize): the base is the plain webhook.yaml, object for object;
/// node-checks adds the plain daemonset.yaml; cert-manager adds its
/// issuers and certificates and hands the caBundle to cert-manager's
/// injector. What Kubernetes itself defines passes the strict schema.
#[test]
fn the_kustomize_base_and_overlays_build_and_match_the_plain_files() {
    let _shared = crate::common::shared();
    let (Some(kubectl), Some(validate)) = (kubectl(), kubernetes_validate()) else {
        common::skip::skip(
            "no kubectl or kubernetes-validate (`.ci/install` puts them in /opt/preflight-k8s)",
        );
        return;
    };
    let plain = |f: &str| {
        yaml_objects(&std::fs::read_to_string(repo().join("contrib/kubernetes").join(f)).unwrap())
    };
    let base = kustomized(&kubectl, "base");
    assert_eq!(base, plain("webhook.yaml"));
    let mut both = plain("webhook.yaml");
    both.extend(plain("daemonset.yaml"));
    both.sort_by_key(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]));
    assert_eq!(kustomized(&kubectl, "node-checks"), both);
    let cm = kustomized(&kubectl, "cert-manager");
    let hook = cm
        .iter()
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .unwrap();
    assert_eq!(
        hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "preflight/preflight-webhook"
    );
    assert!(
        hook["webhooks"][0]["clientConfig"]["caBundle"].is_null(),
        "{hook}"
    );
    let serving = cm
        .iter()
        .find(|o| o["kind"] == "Certificate" && o["metadata"]["name"] == "preflight-webhook")
        .unwrap();
    assert_eq!(serving["spec"]["secretName"], "preflight-webhook-tls");
    assert_eq!(
        serving["spec"]["dnsNames"][0],
        "preflight-webhook.preflight.svc"
    );
    // The Deployment mounts that Secret, and the selector refuses a
    // mistyped value rather than letting it by.
    let deploy = base.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(
        deploy["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        "preflight-webhook-tls"
    );
    assert_eq!(
        deploy["spec"]["template"]["spec"]["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(
        hook["webhooks"][0]["objectSelector"]["matchExpressions"][0]["operator"],
        "Exists"
    );
    assert_eq!(
        hook["webhooks"][0]["rules"][0]["operations"],
        serde_json::json!(["CREATE"])
    );
    let ds = both.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    assert_eq!(
        ds["spec"]["template"]["spec"]["automountServiceAccountToken"],
        false
    );
    // Kubernetes' own objects of the overlay against the schema.
    let dir = tempfile::tempdir().unwrap();
    let own: Vec<&serde_json::Value> = cm
        .iter()
        .filter(|o| {
            !o["apiVersion"]
                .as_str()
                .unwrap_or("")
                .starts_with("cert-manager.io/")
        })
        .collect();
    let file = dir.path().join("cert-manager.json");
    std::fs::write(
        &file,
        serde_json::to_vec(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": own}))
            .unwrap(),
    )
    .unwrap();
    let out = Command::new(&validate)
        .args(["--kubernetes-version", "1.37.0", "--strict"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The image runs as a numeric user that is not root (a pod with
/// `runAsNonRoot: true` and no `runAsUser` starts only so) and carries
/// NVIDIA's redistributable NCCL where the loader finds it.
#[test]
fn the_image_runs_as_a_numeric_non_root_user_and_carries_nccl() {
    let _shared = crate::common::shared();
    let text = std::fs::read_to_string(repo().join("contrib/kubernetes/Dockerfile")).unwrap();
    let user = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("USER "))
        .next_back()
        .expect("a USER line");
    let uid = user.split(':').next().unwrap();
    assert!(uid.parse::<u32>().is_ok_and(|u| u != 0), "USER {user}");
    assert!(
        text.contains("nvidia-nccl-cu12==") && text.contains("/usr/local/lib/libnccl.so.2"),
        "{text}"
    );
    // The last stage's USER comes after everything it installs.
    let last_from = text.rfind("\nFROM ").unwrap();
    assert!(text.rfind("\nUSER ").unwrap() > last_from);
}

/// The node-problem-detector rule, run as NPD runs a custom plugin: its
/// path and args, with the host's tree a fixture's. NPD's contract: exit
/// 0 OK, 1 problem, anything else unknown; stdout (cut to
/// max_output_length) is the condition's message.
#[test]
fn the_node_problem_detector_rule_keeps_the_plugin_contract() {
    let _shared = crate::common::shared();
    // node-problem-detector's own plugin configuration, no report: untyped.
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("contrib/kubernetes/preflight-monitor.json")).unwrap(),
    )
    .unwrap();
    // The ConfigMap carries the same configuration.
    let npd = std::fs::read_to_string(repo().join("contrib/kubernetes/node-problem-detector.yaml"))
        .unwrap();
    let start = npd.find("preflight-monitor.json: |").unwrap();
    let embedded: String = npd[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("    ") || l.is_empty())
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let embedded: Value = serde_json::from_str(&embedded).unwrap();
    assert_eq!(
        config, embedded,
        "the ConfigMap and preflight-monitor.json differ"
    );
    let rule = &config["rules"][0];
    assert_eq!(rule["path"], "/opt/preflight/bin/preflight");
    let max = config["pluginConfig"]["max_output_length"]
        .as_u64()
        .unwrap() as usize;
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("npd-report.json");
    let args: Vec<String> = rule["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| match a.as_str().unwrap() {
            "/host" => BROKEN.to_string(),
            "/var/lib/preflight/npd-report.json" => report.display().to_string(),
            other => other.to_string(),
        })
        .collect();
    let out = run(preflight().args(&args));
    assert_eq!(out.code, 1, "{}", out.stderr);
    let message = out.stdout.trim_end();
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(message.len() <= max, "{} > {max}: {message}", message.len());
    assert!(message.starts_with("NOT READY"), "{message}");
    assert!(message.contains("failed: net.hostname"), "{message}");
    let written = common::report(&std::fs::read_to_string(&report).unwrap(), &out.stderr);
    assert_eq!(written.verdict, Verdict::NotReady);
}

/// What one connection to the collector sent.
#[derive(Debug, Clone)]
struct Received {
    line: String,
    headers: Vec<String>,
    body: String,
}

/// A collector on loopback that answers the given statuses in turn (the
/// last one from then on) and keeps what it received.
struct Collector {
    port: u16,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Collector {
    fn start(statuses: &'static [u16]) -> Collector {
        Collector::answering(statuses, String::new())
    }

    /// A collector that answers every request with a redirect to `to`.
    fn redirecting(to: &str) -> Collector {
        Collector::answering(&[307], format!("location: {to}\r\n"))
    }

    fn answering(statuses: &'static [u16], extra: String) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let keep = got.clone();
        // Lives until the test process ends; it answers and records only.
        std::thread::spawn(move || {
            for (i, stream) in listener.incoming().enumerate() {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let mut headers = Vec::new();
                let mut length = 0;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    let h = h.trim_end().to_string();
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    headers.push(h);
                }
                let mut body = vec![0; length];
                let _ = reader.read_exact(&mut body);
                keep.lock().unwrap().push(Received {
                    line: line.trim_end().to_string(),
                    headers,
                    body: String::from_utf8_lossy(&body).into_owned(),
                });
                let status = statuses[i.min(statuses.len() - 1)];
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\n{extra}content-length: 0\r\nconnection: close\r\n\r\n"
                );
            }
        });
        Collector { port, got }
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

fn post_check(url: &str, env: &[(&str, &str)]) -> binary::Run {
    let mut cmd = preflight();
    cmd.args(["check", "--root", BROKEN, "--format", "json", "--post", url]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

#[test]
fn post_sends_the_json_report_and_keeps_the_verdict() {
    let _shared = crate::common::shared();
    let collector = Collector::start(&[200]);
    let out = post_check(&format!("http://127.0.0.1:{}/reports", collector.port), &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    let got = collector.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].line, "POST /reports HTTP/1.1");
    assert!(
        got[0]
            .headers
            .iter()
            .any(|h| h.eq_ignore_ascii_case("content-type: application/json")),
        "{got:?}"
    );
    let sent = common::report(&got[0].body, "the body the collector received");
    let printed = common::report(&out.stdout, &out.stderr);
    assert_eq!(sent.schema, "preflight.report/v1");
    assert_eq!(sent.verdict, printed.verdict);
    assert_eq!(sent.checks, printed.checks);
}

#[test]
fn post_retries_a_collector_that_is_not_ready_yet() {
    let _shared = crate::common::shared();
    let collector = Collector::start(&[503, 503, 200]);
    let out = post_check(&format!("http://127.0.0.1:{}/", collector.port), &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    assert_eq!(collector.received().len(), 3);
}

#[test]
fn post_goes_through_the_jobs_proxy() {
    let _shared = crate::common::shared();
    let proxy = Collector::start(&[200]);
    let out = post_check(
        "http://collector.invalid/in",
        &[("HTTP_PROXY", &format!("http://127.0.0.1:{}", proxy.port))],
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    let got = proxy.received();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].line, "POST http://collector.invalid/in HTTP/1.1");
}

#[test]
fn a_failed_post_is_a_warning_never_a_verdict() {
    let _shared = crate::common::shared();
    // A port nobody listens on: bound, then let go.
    let port = cluster::free_port();
    let url = format!("http://127.0.0.1:{port}/reports");
    let out = post_check(&url, &[]);
    assert_eq!(out.code, 1, "the verdict's exit code: {}", out.stderr);
    let warning = format!("preflight: warning: --post {url}: the report was not delivered: ");
    assert!(out.stderr.contains(&warning), "{}", out.stderr);
    let report = common::report(&out.stdout, &out.stderr);
    assert_eq!(report.verdict, Verdict::NotReady);
    let w = &report.warnings[0];
    assert!(w.contains("the report was not delivered"), "{w}");
    // A collector that refuses the report (4xx) is not retried.
    let refusing = Collector::start(&[400]);
    let out = post_check(&format!("http://127.0.0.1:{}/", refusing.port), &[]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("the collector answered 400"),
        "{}",
        out.stderr
    );
    assert_eq!(refusing.received().len(), 1);
}

#[test]
fn a_post_url_that_is_not_http_is_refused_before_the_run() {
    let _shared = crate::common::shared();
    let out = run(preflight().args(["check", "--post", "ftp://collector/x"]));
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("--post `ftp://collector/x`: only http:// and https:// are supported"),
        "{}",
        out.stderr
    );
}

/// A password in the collector's URL or in the proxy's is shown nowhere:
/// not on stderr, not in the report's warnings.
#[test]
fn a_post_never_shows_a_password() {
    let _shared = crate::common::shared();
    let port = cluster::free_port();
    let url = format!("http://ops:collector-s3cret@127.0.0.1:{port}/reports");
    let proxy = format!("http://relay:proxy-s3cret@127.0.0.1:{port}");
    for (url, env) in [
        (url.clone(), vec![]),
        (
            "http://collector.invalid/in".to_string(),
            vec![("HTTP_PROXY", proxy.as_str())],
        ),
    ] {
        let out = post_check(&url, &env);
        assert_eq!(out.code, 1, "{}", out.stderr);
        for shown in [&out.stdout, &out.stderr] {
            assert!(!shown.contains("s3cret"), "{shown}");
        }
        assert!(out.stderr.contains(":***@127.0.0.1"), "{}", out.stderr);
    }
    let out = run(preflight().args(["check", "--post", "ftp://u:ftp-s3cret@collector/x"]));
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(!out.stderr.contains("s3cret"), "{}", out.stderr);
}

/// A collector that answers 307 does not get the report sent on to the
/// host it names: nothing reaches that host, and the warning says why.
#[test]
fn a_post_follows_no_redirect() {
    let _shared = crate::common::shared();
    let elsewhere = Collector::start(&[200]);
    let redirect = Collector::redirecting(&format!("http://127.0.0.1:{}/stolen", elsewhere.port));
    let out = post_check(&format!("http://127.0.0.1:{}/reports", redirect.port), &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(redirect.received().len(), 1);
    assert!(elsewhere.received().is_empty(), "the report was forwarded");
    assert!(
        out.stderr
            .contains("the collector answered 307 Temporary Redirect to http://127.0.0.1:"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("redirects are not followed"),
        "{}",
        out.stderr
    );
}

/// "Up to 3 attempts": a collector that is never ready sees exactly three,
/// and "never a change of exit code": a ready run whose upload fails
/// still exits 0.
#[test]
fn a_post_makes_three_attempts_at_most_and_a_ready_run_stays_ready() {
    let _shared = crate::common::shared();
    let busy = Collector::start(&[503]);
    let out = post_check(&format!("http://127.0.0.1:{}/", busy.port), &[]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(busy.received().len(), 3, "{:?}", busy.received());
    assert!(
        out.stderr.contains("the collector answered 503"),
        "{}",
        out.stderr
    );

    let dir = tempfile::tempdir().unwrap();
    let checks = dir.path().join("ok.yaml");
    std::fs::write(
        &checks,
        "checks:\n  - {id: ok, kind: command, argv: [\"true\"]}\n",
    )
    .unwrap();
    let port = cluster::free_port();
    let out = run(preflight().args([
        "check",
        "--no-shipped",
        "--checks",
        checks.to_str().unwrap(),
        "--format",
        "json",
        "--post",
        &format!("http://127.0.0.1:{port}/reports"),
    ]));
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("the report was not delivered"),
        "{}",
        out.stderr
    );
    let report = common::report(&out.stdout, &out.stderr);
    assert_eq!(report.verdict, Verdict::Ready);
}

/// The alerting rules the packages ship (and docs/install.md quotes) load
/// in promtool, fire on a not-ready node in its unit test, and are the
/// ones docs/install.md shows.
#[test]
fn the_alerting_rules_pass_promtool_and_the_install_docs_quote_them() {
    let _shared = crate::common::shared();
    if !have("promtool") {
        common::skip::skip("promtool is not installed (apt: prometheus)");
        return;
    }
    let rules = repo().join("contrib/prometheus/preflight-alerts.yml");
    for args in [
        vec!["check", "rules", rules.to_str().unwrap()],
        vec![
            "test",
            "rules",
            "contrib/prometheus/preflight-alerts.test.yml",
        ],
    ] {
        let out = Command::new("promtool")
            .args(&args)
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = std::fs::read_to_string(&rules).unwrap();
    let readme = std::fs::read_to_string(repo().join("docs/install.md")).unwrap();
    let quoted: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .collect();
    assert_eq!(quoted.len(), 3, "{quoted:?}");
    for expr in quoted {
        assert!(
            text.contains(&format!("expr: {expr}")),
            "docs/install.md's {expr} is not in {rules:?}"
        );
    }
}
