//! Helpers shared by the integration tests: running the real binary with an
//! explicit environment, and reading its JSON report with the product's
//! own types (`preflight::schema`).

#![allow(dead_code)]

pub mod binary;
pub mod cluster;
pub mod fixture_run;
pub mod skip;

pub mod cpu_limit;
pub mod netns;
pub mod slurm;
pub mod standin;

use std::path::Path;
use std::process::Command;

// Each binary names the ones its modules read.
#[allow(unused_imports)]
pub use preflight::schema::{CheckResult, Interrupted, Severity, Status, Verdict};

pub const BIN: &str = env!("CARGO_BIN_EXE_preflight");

/// Runs `preflight check --no-shipped --checks FILE --format json` with
/// exactly `env` (plus PATH) and returns the exit code and report.
pub fn check(checklist: &Path, extra: &[&str], env: &[(&str, &str)]) -> (i32, Report) {
    let mut c = Command::new(BIN);
    c.args(["check", "--no-shipped", "--checks"])
        .arg(checklist)
        .args(extra)
        .args(["--format", "json"])
        .env_clear()
        .env("PATH", netns::PATH);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run preflight");
    let stderr = String::from_utf8_lossy(&out.stderr);
    (
        out.status.code().unwrap_or(-1),
        report(&String::from_utf8_lossy(&out.stdout), &stderr),
    )
}

/// JSON the product wrote, read with its own types (`T`'s fields through
/// `Deref`); shown as the pretty JSON it came as (`{report}`), for a
/// failing assertion.
#[derive(Debug, Clone)]
pub struct Typed<T>(pub T);

impl<T> std::ops::Deref for Typed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: serde::Serialize> std::fmt::Display for Typed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&serde_json::to_string_pretty(&self.0).unwrap_or_default())
    }
}

/// `text` read as `T`, or the test fails naming `what` it should have
/// been, with the text and what went with it (`context`: the run's
/// stderr, say). `T` written back must say what the text says, key for
/// key: a key the text lacks that `T` fills with a default (an empty
/// list an assertion would take as "none"), or one `T` does not know
/// (and so no assertion could read), fails the read.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    text: &str,
    what: &str,
    context: &str,
) -> Typed<T> {
    let t: T = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("not {what} ({e}): {text}\n{context}"));
    let said: serde_json::Value = serde_json::from_str(text).unwrap();
    let read = serde_json::to_value(&t).unwrap();
    if let Some(at) = first_difference(&said, &read, String::new()) {
        panic!(
            "{what} read as the product's type differs from its text at {at}: {text}\n{context}"
        );
    }
    Typed(t)
}

/// Where two JSON values first differ (a path like `.checks[3].hint`),
/// taking numbers by value (`0` is `0.0`) and a key set to `null` as one
/// left out (an `Option` the writer skips when empty).
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let (u, v) = (x.get(k), y.get(k));
                let path = format!("{at}.{k}");
                match (u, v) {
                    (Some(u), Some(v)) => first_difference(u, v, path),
                    (Some(Value::Null), None) | (None, Some(Value::Null)) => None,
                    (Some(_), None) => Some(format!("{path} (not in the type)")),
                    _ => Some(format!("{path} (not in the text)")),
                }
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (u, v))| first_difference(u, v, format!("{at}[{i}]"))),
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(if at.is_empty() { "the top".into() } else { at }),
    }
}

/// A check, run or bench report (`--format json`, or a file preflight
/// wrote).
pub type Report = Typed<preflight::schema::Report>;

/// A merged report (`preflight report --format json`).
pub type Merged = Typed<preflight::schema::MergedReport>;

impl Report {
    /// The cluster section, which a `run` report has.
    pub fn cluster(&self) -> &preflight::schema::ClusterReport {
        self.0
            .cluster
            .as_ref()
            .unwrap_or_else(|| panic!("no cluster section in {self}"))
    }

    /// The collective section, which a `run` or `bench` report has.
    pub fn collective(&self) -> &preflight::schema::CollectiveReport {
        self.0
            .collective
            .as_ref()
            .unwrap_or_else(|| panic!("no collective section in {self}"))
    }

    /// Backend `name` of the collective section.
    pub fn backend(&self, name: &str) -> &preflight::schema::BackendReport {
        self.collective()
            .backends
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("no {name} backend in {self}"))
    }
}

/// A report as the product's own types read it, or the test fails.
pub fn report(text: &str, context: &str) -> Report {
    typed(text, "a report", context)
}

impl Merged {
    /// The row of node `name`.
    pub fn node(&self, name: &str) -> &preflight::schema::MergedNode {
        self.0
            .nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}: {self}"))
    }

    /// Whether any culprit names `host`, as its node or in a reason.
    pub fn names_culprit(&self, host: &str) -> bool {
        self.0
            .culprits
            .iter()
            .any(|c| c.node.contains(host) || c.reasons.iter().any(|r| r.contains(host)))
    }
}

/// A merged report as the product's own types read it, or the test fails.
pub fn merged(text: &str, context: &str) -> Merged {
    typed(text, "a merged report", context)
}

/// `dir/name`, written with `text` and executable by anyone: a script a
/// test puts in a tool's place, or a launcher's wrapper. Written by a
/// child process (see `install_executable`).
pub fn executable(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join(name);
    let mut sh = std::process::Command::new("sh")
        .args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh"])
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sh");
    sh.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    assert!(
        sh.wait().unwrap().success(),
        "cannot write {}",
        path.display()
    );
    path
}

/// `src` copied to `dest`, executable by anyone, by `install` (coreutils)
/// rather than this process: a file the test process holds open for
/// writing is inherited by any child another test's thread forks at that
/// moment, and until that child execs, running the file fails with "Text
/// file busy" (ETXTBSY). Tests side by side made that happen in CI.
pub fn install_executable(src: &Path, dest: &Path) {
    let o = std::process::Command::new("install")
        .args(["-m", "755"])
        .arg(src)
        .arg(dest)
        .output()
        .expect("install (coreutils)");
    assert!(
        o.status.success(),
        "install {} {}: {}",
        src.display(),
        dest.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A temporary directory with `mode`: 0o755 for one another user reads
/// (the job's ordinary user), 0o777 for one it also writes.
pub fn tempdir_with_mode(mode: u32) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

/// `preflight report --format json` over two nodes in `dir`: one whose
/// report is `broken` (JSON, as printed), and a healthy one, `healthy`
/// written back under the hostname `healthy_host`: what the merged report
/// says when one node of a pair is faulty.
pub fn merged_with_healthy(
    dir: &std::path::Path,
    broken: &str,
    healthy: &str,
    healthy_host: &str,
) -> Merged {
    std::fs::write(dir.join("bad.json"), broken).unwrap();
    let mut good = report(healthy, "").0;
    good.node.hostname = healthy_host.into();
    std::fs::write(dir.join("good.json"), serde_json::to_string(&good).unwrap()).unwrap();
    let out = Command::new(BIN)
        .args(["report", "--format", "json"])
        .arg(dir)
        .output()
        .unwrap();
    merged(
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    )
}

/// The report a finished run printed on stdout.
pub fn report_of(out: &std::process::Output) -> Report {
    report(
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
    )
}

/// The result of check `id` in a report.
pub fn result<'a>(report: &'a Report, id: &str) -> &'a CheckResult {
    report
        .checks
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no check `{id}` in {report}"))
}

pub fn status(report: &Report, id: &str) -> &'static str {
    result(report, id).status.name()
}

pub fn message<'a>(report: &'a Report, id: &str) -> &'a str {
    &result(report, id).message
}

pub fn measured<'a>(report: &'a Report, id: &str) -> &'a str {
    result(report, id).measured.as_deref().unwrap_or("")
}

pub fn hint<'a>(report: &'a Report, id: &str) -> &'a str {
    result(report, id).hint.as_deref().unwrap_or("")
}

/// Writes a checklist into a temporary directory.
pub fn checklist(yaml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("checks.yaml");
    std::fs::write(&path, yaml).expect("write checklist");
    (dir, path)
}

/// The cache tests/setup/collective-libs.sh fills: PREFLIGHT_LIB_CACHE,
/// default /var/cache/preflight-test-libs.
pub fn lib_cache() -> std::path::PathBuf {
    std::env::var_os("PREFLIGHT_LIB_CACHE")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || std::path::PathBuf::from("/var/cache/preflight-test-libs"),
            std::path::PathBuf::from,
        )
}

/// A real collective library for the tests: `var` when set, else
/// `relative` under the cache tests/setup/collective-libs.sh fills
/// (PREFLIGHT_LIB_CACHE, default /var/cache/preflight-test-libs). `None`
/// after printing why when it is absent; a failure instead under
/// PREFLIGHT_REQUIRE_LIBS=1 (CI), where a skip would hide a regression.
pub fn cached_lib(var: &str, relative: &str) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let cache = lib_cache();
    let path = std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map_or_else(|| cache.join(relative), PathBuf::from);
    if path.exists() {
        return Some(path);
    }
    skip_unless_required(&format!(
        "{} not found (set {var} or run tests/setup/collective-libs.sh)",
        path.display()
    ));
    None
}

/// Prints why a test does nothing here, or fails where skipping is
/// forbidden (see `skip`).
pub fn skip_unless_required(why: &str) {
    skip::skip(why);
}

/// A port free now on `ip`, from below the kernel's ephemeral range
/// (32768-60999 by default): a port the kernel hands out for `:0` goes
/// back to the pool the outgoing connections of every other test draw
/// from, and one of them can take it before the rank 0 under test binds
/// it (a test that fails once in many runs). Where each test process
/// starts looking is spread by its pid, and each call moves on.
pub fn unused_port(ip: &str) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 20000;
    const SPAN: u32 = 12000;
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    for _ in 0..SPAN {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (start + step * 97) % SPAN) as u16;
        if std::net::TcpListener::bind((ip, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FIRST}-{}", FIRST + SPAN - 1)
}

/// A stranger: `script` in Python as user nobody (65534), its stdout
/// piped. setpriv execs (runuser would fork, and outlive a kill).
pub fn python_as_nobody(script: &str) -> std::process::Child {
    std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            script,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("setpriv")
}

/// The binary's one lock. A test that measures time or loads the machine
/// (collective runs, torch jobs, Slurm, signals, starved hosts, 2,048
/// simulated ranks) takes `serial()` and runs alone; every other test takes
/// `shared()` and runs beside the others that do. On two cores, tests side
/// by side would measure each other, and cargo runs the binaries one after
/// another, so within one this is what keeps them apart. In `services`
/// the shared ones run twelve at once (tools/test.sh), so none of them
/// there may hold a bound on time that a busy machine would break. A test
/// takes one of the two, once, at its top (never both: the write would
/// wait on its own read). A test that panicked holding it poisons nothing.
static LOCK: std::sync::RwLock<()> = std::sync::RwLock::new(());

pub fn serial() -> std::sync::RwLockWriteGuard<'static, ()> {
    LOCK.write().unwrap_or_else(|p| p.into_inner())
}

pub fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    LOCK.read().unwrap_or_else(|p| p.into_inner())
}

/// Polls `ready` until it holds or `limit` passes, and says whether it
/// held: a bound on a wait for an event, never a timing assertion.
pub fn wait_until(limit: std::time::Duration, mut ready: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if ready() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    ready()
}

/// Waits (30 s at most) until `ready` holds, or fails the test naming
/// `what`: the event a test waits for instead of sleeping.
pub fn wait_for(what: &str, ready: impl FnMut() -> bool) {
    assert!(
        wait_until(std::time::Duration::from_secs(30), ready),
        "{what}: not after 30 s"
    );
}
