//! Whoever is not the job's, on loopback: another job's ranks and rank 0,
//! garbage, oversized and silent clients, floods of handshakes, guessed and
//! weak secrets, strangers holding the rank's slots, a relay on the port.

use super::*;

#[test]
fn another_jobs_rank_is_rejected_and_both_sides_say_so() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let args = run_args("60s");
    let r0 = local("jobA-rank0", &args, &env("0", "2", &port));
    cluster::wait_listening(r0.pid, port.parse().unwrap());
    let mut other = env("1", "2", &port);
    other.retain(|(k, _)| *k != "PREFLIGHT_TOKEN");
    other.push(("PREFLIGHT_TOKEN", "d5cf52d2dad5399f87c83ebbfc420b53"));
    // An answer that proves another secret ends no retry (a stranger can
    // give one before rank 0 binds): the intruder tries to its own
    // deadline, then says what it saw.
    let intruder = local("jobB-rank1", &run_args("4s"), &other).finish(MARGIN);
    assert_eq!(intruder.code, 1, "{}", intruder.stderr);
    let msg = intruder.message("cluster.rendezvous");
    assert!(
        msg.contains(&format!(
            "the preflight at 127.0.0.1:{port} has another job token: this rank's job secret differs from rank 0's (rank 0's: PREFLIGHT_TOKEN; this rank's: PREFLIGHT_TOKEN)"
        )),
        "{msg}"
    );
    assert!(msg.contains("export the same PREFLIGHT_TOKEN"), "{msg}");
    let r1 = local("jobA-rank1", &args, &env("1", "2", &port));
    let a0 = r0.finish(MARGIN);
    let a1 = r1.finish(MARGIN);
    // No fingerprint of a secret anywhere, not to a stranger and not in
    // rank 0's report: it would let anyone test guesses offline.
    assert_eq!(a0.report().cluster().token, "PREFLIGHT_TOKEN");
    assert!(!msg.contains("fingerprint"), "{msg}");
    all_exit(&[a0.clone_outcome(), a1], 0);
    let warnings = a0.report().cluster().warnings.join("\n");
    assert!(warnings.contains("another job"), "{warnings}");
}

trait CloneOutcome {
    fn clone_outcome(&self) -> Outcome;
}

impl CloneOutcome for Outcome {
    fn clone_outcome(&self) -> Outcome {
        Outcome {
            label: self.label.clone(),
            code: self.code,
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
            elapsed: self.elapsed,
        }
    }
}

#[test]
fn garbage_oversized_and_silent_clients_do_not_disturb_the_rendezvous() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let args = run_args("10s");
    let r0 = local("rank0", &args, &env("0", "2", &port));
    let addr = format!("127.0.0.1:{port}");
    let mut connected = None;
    for _ in 0..100 {
        if let Ok(s) = TcpStream::connect(&addr) {
            connected = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // A silent (half-open) client, kept open for the whole test.
    let _silent = connected.expect("rank 0 listens");
    let mut garbage = TcpStream::connect(&addr).unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut oversized = TcpStream::connect(&addr).unwrap();
    // This protocol's version (3), then a length beyond any limit.
    oversized.write_all(b"PFL\x03\xff\xff\xff\xff").unwrap();
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"P").unwrap();
    // The server closes the junk connections.
    garbage
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(garbage.read(&mut buf).unwrap_or(0), 0);
    let r1 = local("rank1", &args, &env("1", "2", &port));
    let out = [r0.finish(MARGIN), r1.finish(MARGIN)];
    all_exit(&out, 0);
    let warnings = out[0].report().cluster().warnings.join("\n");
    assert!(warnings.contains("bad magic"), "{warnings}");
    assert!(warnings.contains("bytes"), "{warnings}");
}

#[test]
fn another_jobs_rank_0_on_the_port_is_named_on_both_sides() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let args = run_args("60s");
    let a0 = local("jobA-rank0", &args, &env("0", "2", &port));
    cluster::wait_listening(a0.pid, port.parse().unwrap());
    let mut other = env("0", "2", &port);
    other.retain(|(k, _)| *k != "PREFLIGHT_TOKEN");
    other.push(("PREFLIGHT_TOKEN", "d5cf52d2dad5399f87c83ebbfc420b53"));
    let b0 = local("jobB-rank0", &args, &other).finish(MARGIN);
    assert_eq!(b0.code, 1, "{}\n{}", b0.stdout, b0.stderr);
    let msg = b0.message("cluster.rendezvous");
    assert!(
        msg.contains(&format!(
            "port {port} on 127.0.0.1 is in use by another job: a preflight with another job token already serves there"
        )),
        "{msg}"
    );
    let a1 = local("jobA-rank1", &args, &env("1", "2", &port));
    let out = [a0.finish(MARGIN), a1.finish(MARGIN)];
    all_exit(&out, 0);
    let warnings = out[0].report().cluster().warnings.join("\n");
    assert!(
        warnings.contains("a preflight of another job (another token) connected from 127.0.0.1")
            && warnings.contains(&format!("this job's master port 127.0.0.1:{port}")),
        "{warnings}"
    );
}

/// Runs a Python script to its end; what it printed. Fails the test
/// with its stderr when it fails.
fn python(code: &str) -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", code])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Python: `frame(msg)` makes a protocol frame of a message, `read(s)`
/// reads one from a socket (None at its end).
const PY_FRAMES: &str = r#"def frame(msg):
    body = json.dumps(msg).encode()
    return b"PFL\x03" + struct.pack(">I", len(body)) + body
def read(s):
    head = b""
    while len(head) < 8:
        part = s.recv(8 - len(head))
        if not part: return None
        head += part
    n = struct.unpack(">I", head[4:])[0]
    body = b""
    while len(body) < n:
        part = s.recv(n - len(body))
        if not part: return None
        body += part
    return json.loads(body)
"#;

/// Python: wait (10 s at most) until rank 0 listens on `port`.
const AWAIT_RANK_0: &str = r#"deadline = time.time() + 10
while True:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close(); break
    except OSError:
        if time.time() > deadline: sys.exit("rank 0 never listened")
        time.sleep(0.02)
"#;

/// A stranger floods rank 0 with another job's handshakes from 40 source
/// addresses (127.0.0.10-49): every one is rejected and counted, the report
/// lists each source once with its count (at most 32), and the job's own
/// ranks are ready with a verdict of the usual size.
#[test]
fn a_flood_of_another_jobs_handshakes_is_counted_not_listed() {
    let _shared = crate::common::shared();
    const FLOOD: usize = 2000;
    let port = cluster::free_port().to_string();
    let args = run_args("60s");
    let r0 = local("rank0", &args, &env("0", "2", &port));
    let code = format!(
        r#"
import json, os, socket, struct, sys, time
port = {port}
{frames}{await_rank_0}rejected = 0
for i in range({FLOOD}):
    s = socket.socket()
    s.bind(("127.0.0.%d" % (10 + i % 40), 0))
    s.connect(("127.0.0.1", port))
    s.sendall(frame({{"type": "hello", "nonce": os.urandom(16).hex(), "version": "0.1.0"}}))
    if read(s)["type"] == "challenge":
        s.sendall(frame({{"type": "rejected", "reason": "another job: the job tokens differ"}}))
        rejected += 1
    s.close()
print(rejected)
"#,
        await_rank_0 = AWAIT_RANK_0,
        frames = PY_FRAMES
    );
    let out = python(&code);
    assert_eq!(out.trim(), FLOOD.to_string());
    let r0_started = r0.started();
    let r1 = local("rank1", &args, &env("1", "2", &port));
    let joined = r1.started();
    let out = [r0.finish(MARGIN), r1.finish(MARGIN)];
    all_exit(&out, 0);
    // 0.58 s in docs/faults.md; --timeout is 60 s. Rank 0's clock counts
    // from rank 1's start: before it, rank 0 waited through the test's own
    // flood (2,000 handshakes from Python, 10 s on a busy machine), which
    // is not the job's time.
    cluster::verdicts_within(&out[1..], Duration::from_secs(10));
    let rank0_after_join = (r0_started + out[0].elapsed).saturating_duration_since(joined);
    assert!(
        rank0_after_join < Duration::from_secs(10),
        "rank 0's verdict {rank0_after_join:?} after rank 1 started, promised within 10 s"
    );
    let report = out[0].report();
    let barrier = &report.cluster().barrier;
    assert_eq!(barrier.other_job_total, FLOOD, "{barrier:#?}");
    let sources = &barrier.other_job_clients;
    assert_eq!(sources.len(), 32, "{barrier:#?}");
    assert_eq!(sources[0], "127.0.0.10 (50 times)", "{barrier:#?}");
    let warnings = &report.cluster().warnings;
    let flood: Vec<_> = warnings
        .iter()
        .filter(|w| w.contains("another job"))
        .collect();
    assert_eq!(flood.len(), 1, "{warnings:#?}");
    assert!(
        flood[0]
            .starts_with(&format!("{FLOOD} connections of preflights of another job (another token) connected from 127.0.0.10 (50 times), ")),
        "{}",
        flood[0]
    );
    assert!(
        out[0].stdout.len() < 64 << 10,
        "rank 0's report is {} bytes",
        out[0].stdout.len()
    );
}

/// The job's secret: a short one is refused before anything runs (exit 2;
/// `check` meets no peer and does not care); a file others can read is
/// refused, one only its owner reads is used; a token derived from a job
/// id anyone can read is a warning, and `--require-secret` refuses it for
/// a job across nodes; `preflight token` prints fresh 128-bit secrets.
#[test]
fn a_job_secret_must_be_a_secret() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let mut short = env("0", "2", &port);
    short.retain(|(k, _)| *k != "PREFLIGHT_TOKEN");
    short.push(("PREFLIGHT_TOKEN", "job-a"));
    let out = local("short", &run_args("20s"), &short).finish(MARGIN);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("PREFLIGHT_TOKEN is 5 characters: a job secret needs at least 16 (`preflight token` prints a fresh 128-bit one)"),
        "{}",
        out.stderr
    );
    // Long enough, but words and a number: guessed offline from one
    // recorded handshake.
    let mut human = env("0", "2", &port);
    human.retain(|(k, _)| *k != "PREFLIGHT_TOKEN");
    human.push(("PREFLIGHT_TOKEN", "cluster-prod-token-21"));
    let out = local("human", &run_args("20s"), &human).finish(MARGIN);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("PREFLIGHT_TOKEN is too easy to guess: about 58 bits by zxcvbn's estimate"),
        "{}",
        out.stderr
    );
    let check: Vec<String> = [
        "check",
        "--no-shipped",
        "--checks",
        &cluster::checks(),
        "--format",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(local("check", &check, &short).finish(MARGIN).code, 0);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, "ec26e9aef7eb8a3378e3accc3c82a2fb\n").unwrap();
    let with_file = |rank: &'static str| {
        let mut e = env(rank, "2", &port);
        e.retain(|(k, _)| *k != "PREFLIGHT_TOKEN");
        e.push(("PREFLIGHT_TOKEN_FILE", file.to_str().unwrap()));
        e
    };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = local("readable", &run_args("20s"), &with_file("0")).finish(MARGIN);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("can be read by others (mode 0640)"),
        "{}",
        out.stderr
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let procs: Vec<_> = ["0", "1"]
        .iter()
        .map(|r| local(&format!("rank{r}"), &run_args("20s"), &with_file(r)))
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 0);
    let report = out[0].report();
    let c = report.cluster();
    assert!(
        c.token == "PREFLIGHT_TOKEN_FILE",
        "a secret's source, and no fingerprint of it: {report}"
    );
    assert!(!c.warnings.iter().any(|w| w.contains("token")), "{report}");

    // A run id anyone can read in `ps`: accepted, with a warning even on
    // one machine's loopback, which every local user reaches (across
    // hosts: tests/network/cluster_netns.rs).
    let port = cluster::free_port().to_string();
    let derived = |rank: &'static str| {
        let mut e = env(rank, "2", &port);
        e.retain(|(k, _)| *k != "PREFLIGHT_TOKEN");
        e.push(("TORCHELASTIC_RUN_ID", "job-4242"));
        e
    };
    let procs: Vec<_> = ["0", "1"]
        .iter()
        .map(|r| local(&format!("rank{r}"), &run_args("20s"), &derived(r)))
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 0);
    let warnings = out[0].report().cluster().warnings.join("\n");
    assert!(
        warnings.contains("the job token is derived from TORCHELASTIC_RUN_ID")
            && warnings
                .contains("any user of this host (the rendezvous is on loopback) can check in"),
        "{warnings}"
    );
    assert!(
        out[0]
            .report()
            .cluster()
            .token
            .starts_with("TORCHELASTIC_RUN_ID ("),
        "{warnings}"
    );
    // ... and refused for a job across nodes under --require-secret.
    let mut strict = run_args("20s");
    strict.extend(["--require-secret", "--nnodes", "2", "--node-rank", "1"].map(String::from));
    let out = local("strict", &strict, &derived("1")).finish(MARGIN);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("--require-secret: this job spans 2 nodes and its token comes from TORCHELASTIC_RUN_ID, which any user of the cluster can read"),
        "{}",
        out.stderr
    );
    // ... and for a one-node job of a launcher's ranks too, by the flag
    // or by PREFLIGHT_REQUIRE_SECRET=1 (a site sets it everywhere).
    let mut strict = run_args("20s");
    strict.push("--require-secret".into());
    let mut one_node = derived("1");
    one_node.push(("LOCAL_WORLD_SIZE", "2"));
    let out = local("strict", &strict, &one_node).finish(MARGIN);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("--require-secret: this job runs on one node, where every local user reaches its rendezvous"),
        "{}",
        out.stderr
    );
    // A launcher that says only the ranks (no local world size) is not
    // told it spans nodes it may not.
    let out = local("strict", &strict, &derived("1")).finish(MARGIN);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("--require-secret: this job has 2 ranks (on one node or several"),
        "{}",
        out.stderr
    );
    let mut by_env = one_node.clone();
    by_env.push(("PREFLIGHT_REQUIRE_SECRET", "1"));
    let out = local("strict-env", &run_args("20s"), &by_env).finish(MARGIN);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("this job runs on one node, where every local user reaches its rendezvous"),
        "{}",
        out.stderr
    );

    let token = |_: u8| {
        let out = std::process::Command::new(cluster::BIN)
            .arg("token")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let (a, b) = (token(0), token(1));
    assert_eq!(a.trim().len(), 32, "{a}");
    assert!(a.trim().chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    assert_ne!(a, b);
}

/// A stranger on 127.0.0.2 keeps 1,500 silent connections open against a
/// rank 0 whose descriptors are limited to 512: one address may hold only
/// a few of them (the rest are closed at accept), a silent one is closed
/// after a second, and the real rank gets in; rank 0 counts what it closed.
#[test]
fn a_flood_of_silent_connections_does_not_lock_a_rank_out() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    // Shorter than the 5 s a silent connection used to be held: a flood
    // that fills rank 0's descriptors then keeps rank 1 out to the end.
    let mut args = run_args("4s");
    args.extend(["--collective".to_string(), "off".to_string()]);
    let r0 = local_under(
        &["prlimit", "--nofile=512:512"],
        "rank0",
        &args,
        &env("0", "2", &port),
    );
    let code = format!(
        r#"
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
port = {port}
{await_rank_0}print("flooding", flush=True)
held, opened, said = [], 0, False
end = time.time() + 6
while time.time() < end:
    held = [s for s in held if s.fileno() >= 0]
    while len(held) < 1500 and time.time() < end:
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        except OSError:
            s.close(); break
        held.append(s); opened += 1
    if not said:
        print("held", len(held), flush=True); said = True
    time.sleep(0.2)
    # Whatever rank 0 closed, open again: a flood that never lets up.
    for s in held:
        try:
            if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                s.close()
        except BlockingIOError:
            pass
        except OSError:
            s.close()
print(opened)
"#,
        await_rank_0 = AWAIT_RANK_0
    );
    let mut flood = std::process::Command::new("python3")
        .args(["-c", &code])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut first = String::new();
    let mut reader = std::io::BufReader::new(flood.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut reader, &mut first).unwrap();
    assert_eq!(first.trim(), "flooding");
    // Rank 1 comes once the stranger holds its connections.
    first.clear();
    std::io::BufRead::read_line(&mut reader, &mut first).unwrap();
    assert!(first.starts_with("held "), "{first}");
    let r1 = local("rank1", &args, &env("1", "2", &port));
    let out = [r0.finish(MARGIN), r1.finish(MARGIN)];
    let status = flood.wait().unwrap();
    assert!(status.success(), "the flood itself failed");
    all_exit(&out, 0);
    let report = out[0].report();
    let barrier = &report.cluster().barrier;
    assert!(barrier.dropped_total > 100, "{barrier:#?}");
    assert!(
        barrier
            .dropped
            .iter()
            .any(|d| d.contains("127.0.0.2: closed unproven to make room for a newer connection")),
        "{barrier:#?}"
    );
}

/// The usual mismatch: rank 0 has the job's secret, this rank none. It
/// says so, naming where each token comes from; a public token's
/// fingerprint is told, a secret's never.
#[test]
fn a_rank_without_the_secret_says_its_token_differs_from_rank_0s() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    // Rank 1 keeps trying to its deadline (an answer that proves no secret
    // is noise), then says what it saw.
    let args = run_args("5s");
    let r0 = local("rank0", &args, &env("0", "2", &port));
    cluster::wait_listening(r0.pid, port.parse().unwrap());
    let mut none = env("1", "2", &port);
    none.retain(|(k, _)| *k != "PREFLIGHT_TOKEN");
    let r1 = local("rank1", &args, &none).finish(MARGIN);
    r0.kill();
    let _ = r0.finish(MARGIN);
    assert_eq!(r1.code, 1, "{}", r1.stderr);
    let msg = r1.message("cluster.rendezvous");
    assert!(
        msg.contains("this rank's job secret differs from rank 0's (rank 0's: PREFLIGHT_TOKEN; this rank's: none)"),
        "{msg}"
    );
    // Two public tokens: both fingerprints, nothing to hide.
    let port = cluster::free_port().to_string();
    let derived = |rank: &'static str, id: &'static str| {
        let mut e = env(rank, "2", &port);
        e.retain(|(k, _)| *k != "PREFLIGHT_TOKEN");
        e.push(("TORCHELASTIC_RUN_ID", id));
        e
    };
    let r0 = local("rank0", &args, &derived("0", "run-1"));
    cluster::wait_listening(r0.pid, port.parse().unwrap());
    let r1 = local("rank1", &args, &derived("1", "run-2")).finish(MARGIN);
    r0.kill();
    let _ = r0.finish(MARGIN);
    let msg = r1.message("cluster.rendezvous");
    assert!(
        msg.contains("(rank 0's: TORCHELASTIC_RUN_ID, fingerprint "),
        "{msg}"
    );
}

/// A stranger holds MASTER_PORT before rank 0 binds it and answers each
/// connection with garbage, then leaves. Until a server has proven the job
/// secret its words are noise: rank 1 keeps trying, and both ranks are
/// ready once rank 0 comes up.
#[test]
fn an_unproven_answer_on_the_port_does_not_end_a_ranks_retries() {
    let _shared = crate::common::shared();
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = squatter.local_addr().unwrap().port().to_string();
    let args = run_args("20s");
    let r1 = local("rank1", &args, &env("1", "2", &port));
    squatter.set_nonblocking(true).unwrap();
    let start = std::time::Instant::now();
    let mut answered = 0;
    while answered < 2 {
        match squatter.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\n");
                answered += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "rank 1 never came back after the first answer"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("{e}"),
        }
    }
    drop(squatter);
    let r0 = local("rank0", &args, &env("0", "2", &port));
    let (r0, r1) = (r0.finish(MARGIN), r1.finish(MARGIN));
    // 0.72 s in docs/faults.md; --timeout is 20 s.
    cluster::verdicts_within(std::slice::from_ref(&r0), Duration::from_secs(10));
    cluster::verdicts_within(std::slice::from_ref(&r1), Duration::from_secs(10));
    assert_eq!(r1.code, 0, "{}{}", r1.stdout, r1.stderr);
    assert_eq!(r0.code, 0, "{}{}", r0.stdout, r0.stderr);
}

/// Python: a stranger who opens `per_source` handshakes from each of
/// `sources`, each with a valid hello, and never sends its proof; whatever
/// rank 0 closes is opened again at once, for `seconds`. Prints "holding"
/// once every one was opened, and at the end how many it opened.
fn handshake_holder(port: &str, sources: &[String], per_source: usize, seconds: u32) -> String {
    let sources = sources
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
import json, os, resource, select, socket, struct, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
port = {port}
def frame(msg):
    body = json.dumps(msg).encode()
    return b"PFL\x03" + struct.pack(">I", len(body)) + body
def hold(src):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(frame({{"type": "hello", "nonce": os.urandom(16).hex(), "version": "0.1.0"}}))
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    return s
{await_rank_0}held = {{}}
opened = 0
for src in [{sources}]:
    for _ in range({per_source}):
        s = hold(src)
        if s is not None:
            held[s] = src; opened += 1
print("holding", len(held), flush=True)
end = time.time() + {seconds}
while time.time() < end:
    ready, _, _ = select.select(list(held), [], [], 0.05)
    for s in ready:
        try:
            data = s.recv(65536)
        except OSError:
            data = b""
        if data:
            continue  # the challenge: read, never answered
        src = held.pop(s)
        s.close()
        n = hold(src)
        if n is not None:
            held[n] = src; opened += 1
print(opened, flush=True)
"#,
        await_rank_0 = AWAIT_RANK_0
    )
}

/// Runs a 2-rank job while `holder` (Python) holds rank 0's unproven
/// slots; both ranks must be ready, and rank 0 must have closed some of
/// the stranger's connections to make room.
fn ready_while_held(port: &str, holder: &str, limit_files: bool) {
    let mut args = run_args("10s");
    args.extend(["--collective".to_string(), "off".to_string()]);
    let wrapper: &[&str] = if limit_files {
        &["prlimit", "--nofile=512:512"]
    } else {
        &[]
    };
    let r0 = local_under(wrapper, "rank0", &args, &env("0", "2", port));
    let mut stranger = std::process::Command::new("python3")
        .args(["-c", holder])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    let mut reader = std::io::BufReader::new(stranger.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
    assert!(line.starts_with("holding "), "{line}");
    let r1 = local("rank1", &args, &env("1", "2", port));
    let out = [r0.finish(MARGIN), r1.finish(MARGIN)];
    let _ = stranger.kill();
    let _ = stranger.wait();
    all_exit(&out, 0);
    // 0.53 s in docs/faults.md; --timeout is 10 s: the held slots cost
    // the ranks no deadline.
    cluster::verdicts_within(&out, Duration::from_secs(7));
    let dropped = out[0].report().cluster().barrier.dropped.join("\n");
    assert!(
        dropped.contains("closed unproven to make room for a newer connection"),
        "{dropped}"
    );
}

/// A stranger on the ranks' own address (127.0.0.1) holds every
/// handshake slot that address has, with valid hellos, reopening each one
/// rank 0 closes: the job's ranks still get in.
#[test]
fn a_stranger_holding_the_ranks_own_address_slots_locks_no_rank_out() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let holder = handshake_holder(&port, &["127.0.0.1".to_string()], 80, 12);
    ready_while_held(&port, &holder, false);
}

/// A stranger on 100 addresses holds every handshake slot rank 0 has in
/// all (its descriptors limited to 512), with valid hellos: the job's
/// ranks still get in.
#[test]
fn a_stranger_holding_every_handshake_slot_from_many_addresses_locks_no_rank_out() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let sources: Vec<String> = (10..110).map(|i| format!("127.0.0.{i}")).collect();
    let holder = handshake_holder(&port, &sources, 4, 12);
    ready_while_held(&port, &holder, true);
}

/// A stranger guessing the secret online, one wrong proof after another
/// from one address, as fast as rank 0 answers: after a short burst rank
/// 0 checks about ten a second (6,400 a second unthrottled on this
/// machine), and the job's own ranks are ready all the same.
#[test]
fn online_guessing_is_paced_per_source() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let args = run_args("20s");
    let r0 = local("rank0", &args, &env("0", "2", &port));
    let code = format!(
        r#"
import json, os, socket, struct, sys, time
port = {port}
{frames}{await_rank_0}answered = 0
end = time.time() + 3
while time.time() < end:
    s = socket.socket()
    s.settimeout(max(0.01, end - time.time()))
    try:
        s.bind(("127.0.0.7", 0))
        s.connect(("127.0.0.1", port))
        s.sendall(frame({{"type": "hello", "nonce": os.urandom(16).hex(), "version": "0.1.0"}}))
        if read(s)["type"] == "challenge":
            s.sendall(frame({{"type": "proof", "proof": os.urandom(32).hex()}}))
            if read(s) is not None:
                answered += 1
    except (OSError, TypeError):
        pass
    s.close()
print(answered)
"#,
        await_rank_0 = AWAIT_RANK_0,
        frames = PY_FRAMES
    );
    let out = python(&code);
    let answered: u32 = out.trim().parse().unwrap();
    // The burst (16) and three seconds at ten a second, with room to spare.
    assert!(answered <= 80, "{answered} guesses answered in 3 s");
    assert!(answered >= 16, "the guesser never got through: {answered}");
    let r1 = local("rank1", &args, &env("1", "2", &port));
    let out = [r0.finish(MARGIN), r1.finish(MARGIN)];
    all_exit(&out, 0);
    // 3.5 s in docs/faults.md (the guessing ran 3 s first); --timeout 20 s.
    cluster::verdicts_within(&out, Duration::from_secs(12));
}

/// A stranger holds MASTER_PORT before rank 0 (the Slurm prolog's port
/// can be computed by anyone), so rank 0 serves on the next port of
/// PREFLIGHT_MASTER_PORTS; the stranger relays every connection to it and
/// cuts each one after the handshake, to have ranks lost and blamed. The
/// proofs cover which port a handshake is for: none passes the relay, the
/// ranks go to rank 0's port themselves, and the job is ready.
#[test]
fn a_relay_on_master_port_passes_no_handshake_to_the_port_rank_0_moved_to() {
    let _shared = crate::common::shared();
    // Four free ports in a row.
    let first = loop {
        let p = cluster::free_port();
        if p < 65000 && (1..4).all(|k| std::net::TcpListener::bind(("127.0.0.1", p + k)).is_ok()) {
            break p;
        }
    };
    let relay_code = format!(
        r#"
import socket, struct, sys, threading
front = socket.socket(); front.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
front.bind(("127.0.0.1", {first})); front.listen(64)
print("relaying", flush=True)
def pipe(a, b, cut):
    frames, buf = 0, b""
    try:
        while True:
            data = a.recv(65536)
            if not data: break
            b.sendall(data)
            if cut:
                buf += data
                while len(buf) >= 8:
                    n = struct.unpack(">I", buf[4:8])[0]
                    if len(buf) < 8 + n: break
                    buf = buf[8 + n:]; frames += 1
                if frames >= 2:
                    break
    except OSError:
        pass
    for s in (a, b):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass
while True:
    c, _ = front.accept()
    try:
        s = socket.create_connection(("127.0.0.1", {second}), 2)
    except OSError:
        c.close(); continue
    threading.Thread(target=pipe, args=(c, s, False), daemon=True).start()
    threading.Thread(target=pipe, args=(s, c, True), daemon=True).start()
"#,
        second = first + 1
    );
    let mut relay = std::process::Command::new("python3")
        .args(["-c", &relay_code])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    let mut reader = std::io::BufReader::new(relay.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
    assert_eq!(line.trim(), "relaying");
    let port = first.to_string();
    let range = format!("{first}-{}", first + 3);
    let args = run_args("15s");
    let ranks: Vec<_> = ["0", "1"]
        .iter()
        .map(|r| {
            let mut e = env(r, "2", &port);
            e.push(("PREFLIGHT_MASTER_PORTS", range.as_str()));
            local(&format!("rank{r}"), &args, &e)
        })
        .collect();
    let out: Vec<Outcome> = ranks.into_iter().map(|p| p.finish(MARGIN)).collect();
    let _ = relay.kill();
    let _ = relay.wait();
    all_exit(&out, 0);
    // 0.65 s in docs/faults.md; --timeout is 15 s.
    cluster::verdicts_within(&out, Duration::from_secs(10));
    let warnings = out[0].report().cluster().warnings.join("\n");
    assert!(
        warnings.contains(&format!(
            "MASTER_PORT {first} on 127.0.0.1 was taken: rank 0 serves on {}",
            first + 1
        )),
        "{warnings}"
    );
}

/// A self-test on one machine served on loopback: nobody else can reach
/// it, so a missing job secret is no warning (across hosts it is:
/// tests/network/cluster_netns.rs).
/// Loopback is reached by every user of the host: a one-node job of a
/// launcher's ranks without a secret is warned that any of them can check
/// in as one of its ranks.
#[test]
fn a_one_node_job_without_a_secret_is_warned_that_local_users_can_join() {
    let _shared = crate::common::shared();
    let port = cluster::free_port().to_string();
    let mut args = run_args("20s");
    args.truncate(args.len() - 2);
    for format in [None, Some("json")] {
        let mut args = args.clone();
        if let Some(f) = format {
            args.extend(["--format".to_string(), f.to_string()]);
        }
        let procs: Vec<_> = (0..2)
            .map(|r| {
                let rank = r.to_string();
                let mut e = env(&rank, "2", &port);
                e.retain(|(k, _)| *k != "PREFLIGHT_TOKEN");
                local(&format!("rank{r}"), &args, &e)
            })
            .collect();
        let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
        all_exit(&out, 0);
        assert!(
            out[0]
                .stdout
                .contains("any user of this host (the rendezvous is on loopback) can check in"),
            "{}",
            out[0].stdout
        );
    }
}

/// Node mode on one node makes a secret of its own and hands it to its
/// ranks alone: no warning, and --require-secret has nothing to refuse.
#[test]
fn node_mode_on_one_node_makes_its_own_secret() {
    let _shared = crate::common::shared();
    let mut args = run_args("20s");
    args.extend(["--nproc-per-node", "2", "--require-secret"].map(String::from));
    let out = local("agent", &args, &[]).finish(MARGIN);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report = out.report();
    let cluster = report.cluster();
    assert!(
        cluster
            .token
            .starts_with("a secret of the node agent's own"),
        "{report}"
    );
    assert!(
        !cluster.warnings.iter().any(|w| w.contains("token")),
        "{report}"
    );
}
