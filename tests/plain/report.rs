//! `preflight report`: JSON reports merged into one cluster report, from
//! the recorded 4-host run in fixtures/reports/run-4node/ (a firewall
//! culprit, a throttled straggler, a failed node check; recorded by
//! `tests/collective/netns.rs::record_the_report_fixture`) and from real
//! `check` reports; the HTML opened in headless Chromium; the Markdown as
//! a snapshot.

use crate::common::binary;

use std::path::{Path, PathBuf};
use std::process::Command;

use binary::{assert_snapshot, preflight, repo, run};
use preflight::schema::Report;
// Only the schema-compatibility test below walks and strips a report's keys.
use serde_json::Value;

use crate::common::{Merged, Status, Verdict, skip};

const RUN: &str = "fixtures/reports/run-4node";

fn report(args: &[&str]) -> binary::Run {
    run(preflight().arg("report").args(args))
}

fn merged(args: &[&str]) -> (binary::Run, Merged) {
    let mut all = vec!["--format", "json"];
    all.extend_from_slice(args);
    let out = report(&all);
    let m = crate::common::merged(&out.stdout, &out.stderr);
    (out, m)
}

fn rank_file(rank: u32) -> String {
    format!("{RUN}/rank{rank}.json")
}

/// A report file, read with the product's own types.
fn read(path: impl AsRef<Path>) -> Report {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn write(path: impl AsRef<Path>, r: &Report) {
    std::fs::write(path, serde_json::to_string(r).unwrap()).unwrap();
}

/// A real `check` report of this machine, renamed to `host` and dated
/// `at`, written into `dir`.
fn check_report(dir: &Path, file: &str, host: &str, at: &str) -> PathBuf {
    let out = run(preflight().args([
        "check",
        "--root",
        "fixtures/h100-ib-broken",
        "--format",
        "json",
    ]));
    let mut r = binary::report(&out).0;
    r.node.hostname = host.into();
    r.started_at = at.into();
    let path = dir.join(file);
    write(&path, &r);
    path
}

#[test]
fn a_runs_reports_merge_into_one_cluster_view_with_every_node() {
    let _shared = crate::common::shared();
    let (out, m) = merged(&[RUN]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(m.schema, "preflight.merged-report/v1");
    assert_eq!(m.verdict, Verdict::NotReady);
    assert_eq!(m.exit_code, 1);
    let culprits: Vec<&str> = m.culprits.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(culprits, ["h1", "h3"], "{m}");
    assert_eq!(m.counts.nodes, 4);
    // Every rank's own report gave its node's every check.
    for h in ["h0", "h1", "h2", "h3"] {
        assert!(m.node(h).complete, "{h}");
    }
    assert_eq!(m.node("h1").checks["limits.nofile"].status, Status::Fail);
    assert_eq!(m.node("h0").checks["limits.nofile"].status, Status::Pass);
    // The barrier's restatement of h1's failure is its consequence, and
    // comes after the root causes.
    let problems = &m.problems;
    let restated = problems
        .iter()
        .position(|p| p.id == "cluster.node_checks")
        .expect("node_checks");
    assert_eq!(
        problems[restated].caused_by.as_deref(),
        Some("limits.nofile")
    );
    assert_eq!(restated, problems.len() - 1, "{problems:#?}");
    assert_eq!(m.thresholds[0].check, "collective.tcp_busbw");
    assert_eq!(m.thresholds[0].threshold.min_busbw, 0.05);
    assert!(
        m.collective
            .as_ref()
            .expect("a collective section")
            .stragglers[0]
            .contains("rank 2 (h2")
    );
}

#[test]
fn rank_0s_report_alone_gives_every_node_from_its_summary() {
    let _shared = crate::common::shared();
    let (out, m) = merged(&[&rank_file(0)]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(m.counts.nodes, 4);
    let h1 = m.node("h1");
    assert!(!h1.complete);
    assert_eq!(h1.checks["limits.nofile"].status, Status::Fail);
    assert_eq!(h1.verdict, Verdict::NotReady);
    assert!(m.node("h0").complete);
    assert!(m.warnings.is_empty(), "{m}");
}

#[test]
fn another_ranks_report_alone_says_the_view_is_cut_down() {
    let _shared = crate::common::shared();
    let (out, m) = merged(&[&rank_file(2)]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let w = &m.warnings[0];
    assert!(w.contains("rank 0's report is not among the inputs"), "{w}");
    assert!(w.contains("rank 2's copy"), "{w}");
    // The culprits travel in every rank's verdict.
    assert_eq!(m.culprits.len(), 2, "{m}");
}

#[test]
fn node_reports_mix_with_a_run_and_the_newest_report_of_a_node_wins() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let old = check_report(dir.path(), "h5-old.json", "h5", "2026-01-01T00:00:00Z");
    let new = check_report(dir.path(), "h5-new.json", "h5", "2026-01-02T00:00:00Z");
    // The old one passed: its failing checks flipped, to tell them apart.
    let mut r = read(&old);
    for c in &mut r.checks {
        if c.status == Status::Fail {
            c.status = Status::Pass;
            c.message = "the old report's pass".into();
        }
    }
    write(&old, &r);
    let (out, m) = merged(&[
        RUN,
        old.to_str().unwrap(),
        new.to_str().unwrap(),
        // The same file twice is one report.
        new.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(m.counts.nodes, 5, "{m}");
    let h5 = m.node("h5");
    assert_eq!(h5.verdict, Verdict::NotReady);
    assert!(h5.from.contains("h5-new.json"), "{h5:#?}");
    let superseded = m
        .warnings
        .iter()
        .find(|w| w.contains("h5-old.json"))
        .unwrap_or_else(|| panic!("no warning names the old report: {m}"));
    assert!(superseded.contains("superseded"), "{superseded}");
    // h5's failures are problems once each, and make it a culprit.
    for p in &m.problems {
        let on_h5 = p.nodes.iter().filter(|(n, _)| n == "h5").count();
        assert!(on_h5 <= 1, "{p:#?}");
    }
    assert!(m.culprits.iter().any(|c| c.node == "h5"), "{m}");
}

#[test]
fn files_that_are_not_reports_are_named_and_left_out() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "{ not json").unwrap();
    let other = dir.path().join("other.json");
    std::fs::write(&other, r#"{"hello": "world"}"#).unwrap();
    let newer = dir.path().join("newer.json");
    let mut r = read(rank_file(1));
    r.schema = "preflight.report/v2".into();
    write(&newer, &r);
    let (out, m) = merged(&[&rank_file(0), dir.path().to_str().unwrap()]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    for (file, why) in [
        (
            &garbage,
            "not JSON: key must be a string at line 1 column 3",
        ),
        (&other, "not a preflight report (no `schema`)"),
        (
            &newer,
            "schema preflight.report/v2: written by another preflight version",
        ),
    ] {
        let line = format!("{}: left out: {why}", file.display());
        assert!(out.stderr.contains(&line), "{line}\n{}", out.stderr);
        let file = file.display().to_string();
        assert!(m.warnings.iter().any(|w| w.contains(&file)), "{file}: {m}");
    }
    assert_eq!(m.sources.len(), 1);
}

/// Every key path of a JSON document, arrays' elements taken together
/// (`checks[].caused_by`), parents before their children.
fn key_paths(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if !out.contains(&path) {
                    out.push(path.clone());
                }
                key_paths(child, &path, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                key_paths(item, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// The document without `path` wherever it occurs.
fn without(v: &Value, path: &str) -> Value {
    fn strip(v: &mut Value, parts: &[&str]) {
        let Some((first, rest)) = parts.split_first() else {
            return;
        };
        let (key, each) = match first.strip_suffix("[]") {
            Some(k) => (k, true),
            None => (*first, false),
        };
        let Value::Object(map) = v else { return };
        if rest.is_empty() && !each {
            map.remove(key);
            return;
        }
        match map.get_mut(key) {
            Some(Value::Array(items)) if each => {
                for item in items {
                    strip(item, rest);
                }
            }
            Some(child) if !each => strip(child, rest),
            _ => {}
        }
    }
    let mut copy = v.clone();
    let parts: Vec<&str> = path.split('.').collect();
    strip(&mut copy, &parts);
    copy
}

/// A v1 report as an earlier preflight wrote it: every field the reader
/// can do without is removed (found by trying each key path of a real
/// report, not by a hand-kept list), and the merged report still reads
/// it whole. The fields added since v1 are among those it does without.
#[test]
fn a_v1_report_without_every_optional_field_reads() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    // Untyped: its key paths are walked and stripped one by one.
    let full: Value =
        serde_json::from_str(&std::fs::read_to_string(rank_file(0)).unwrap()).unwrap();
    let path = dir.path().join("early-v1.json");
    let reads = |doc: &Value| -> bool {
        std::fs::write(&path, doc.to_string()).unwrap();
        let out = report(&["--format", "json", path.to_str().unwrap()]);
        out.code != 2
            && serde_json::from_str::<preflight::schema::MergedReport>(&out.stdout)
                .is_ok_and(|m| m.counts.nodes == 4 && m.warnings.is_empty())
    };
    assert!(reads(&full));
    let mut paths = Vec::new();
    key_paths(&full, "", &mut paths);
    let mut doc = full.clone();
    let mut optional = Vec::new();
    for p in &paths {
        // A parent already removed took its children with it.
        if optional
            .iter()
            .any(|o: &String| p.starts_with(&format!("{o}.")) || p.starts_with(&format!("{o}[].")))
        {
            continue;
        }
        let trial = without(&doc, p);
        if trial != doc && reads(&trial) {
            doc = trial;
            optional.push(p.clone());
        }
    }
    for later in [
        "strict",
        "summary",
        "warnings",
        "cluster.culprits",
        "cluster.node_count",
        "checks[].caused_by",
        "checks[].threshold",
    ]
    .into_iter()
    .filter(|later| paths.iter().any(|p| p == later))
    {
        assert!(
            optional
                .iter()
                .any(|o| o == later || later.starts_with(&format!("{o}."))),
            "{later} is not optional: {optional:?}"
        );
    }
    std::fs::write(&path, full.to_string()).unwrap();
    let (out, m) = merged(&[path.to_str().unwrap()]);
    std::fs::write(&path, doc.to_string()).unwrap();
    let (out2, m2) = merged(&[path.to_str().unwrap()]);
    assert_eq!(out.code, out2.code);
    assert_eq!(m2.counts.nodes, 4);
    assert_eq!(m.verdict, m2.verdict);
    assert!(out2.stderr.is_empty(), "{}", out2.stderr);
    println!("{} of {} key paths optional", optional.len(), paths.len());
}

#[test]
fn nothing_readable_is_a_usage_error() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x.json"), "[]").unwrap();
    let out = report(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("no report could be read from"),
        "{}",
        out.stderr
    );
    let out = report(&["/nonexistent/report.json"]);
    assert_eq!(out.code, 2);
    assert!(
        out.stderr
            .contains("/nonexistent/report.json: No such file"),
        "{}",
        out.stderr
    );
}

#[test]
fn markdown_report_snapshot() {
    let _shared = crate::common::shared();
    let out = report(&["--format", "markdown", RUN]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_snapshot("run-4node.md", &out.stdout);
}

/// Chromium with no network of its own to use: a proxy that counts the
/// connections it gets, so that any request the page made would show.
fn chromium(args: &[&str], proxy: &str, profile: &Path) -> std::process::Output {
    let mut c = Command::new("chromium");
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--hide-scrollbars",
    ])
    .arg(format!("--proxy-server={proxy}"))
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args)
    .env("HOME", profile);
    c.output().expect("chromium runs")
}

/// A proxy that answers every request 502 at once and keeps its request
/// line: any request a page makes shows here.
struct Proxy {
    url: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Proxy {
    fn start() -> Proxy {
        use std::io::{BufRead, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = seen.clone();
        // Lives until the test process ends; it only ever answers 502.
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                let mut line = String::new();
                let _ = std::io::BufReader::new(&stream).read_line(&mut line);
                keep.lock().unwrap().push(line.trim_end().to_string());
                let _ = stream.write_all(
                    b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        Proxy { url, seen }
    }

    /// The request lines so far, once the browser has gone. The proxy
    /// takes connections one at a time, in the order they came: a request
    /// of ours, sent now and seen, means every connection the browser made
    /// before it ended has been read (no guess of how long that takes).
    fn take(&self) -> Vec<String> {
        use std::io::Write;
        const SENTINEL: &str = "GET http://sentinel.invalid/ HTTP/1.1";
        let addr = self.url.trim_start_matches("http://");
        let mut ours = std::net::TcpStream::connect(addr).expect("the proxy listens");
        ours.write_all(format!("{SENTINEL}\r\nhost: sentinel.invalid\r\n\r\n").as_bytes())
            .unwrap();
        let start = std::time::Instant::now();
        loop {
            {
                let mut seen = self.seen.lock().unwrap();
                if let Some(at) = seen.iter().position(|l| l == SENTINEL) {
                    let mut all = std::mem::take(&mut *seen);
                    all.remove(at);
                    return all;
                }
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(30),
                "the proxy never read our own request"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[test]
fn the_html_report_opens_offline_in_chromium_with_every_part() {
    let _shared = crate::common::shared();
    if Command::new("chromium").arg("--version").output().is_err() {
        skip::skip("chromium is not installed (Debian's chromium package)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    let out = report(&["--format", "html", "--output", page.to_str().unwrap(), RUN]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: nothing to fetch from anywhere.
    for outside in [
        "http://", "https://", " src=", "<link", "<script", "url(", "@import",
    ] {
        assert!(!html.contains(outside), "the page holds `{outside}`");
    }
    let counter = Proxy::start();
    let proxy = counter.url.clone();
    let profile = tempfile::tempdir().unwrap();
    let url = format!("file://{}", page.display());
    let dump = chromium(&["--dump-dom", &url], &proxy, profile.path());
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dom = String::from_utf8_lossy(&dump.stdout).into_owned();
    // Chromium's own background requests (time, component updates,
    // accounts) go through the proxy too, page or not: anything else
    // would be the page's.
    let requests = counter.take();
    let browser_own = [
        "clients2.google.com",
        "googleapis.com",
        "accounts.google.com",
        "gvt1.com",
    ];
    let page_made: Vec<&String> = requests
        .iter()
        .filter(|r| !browser_own.iter().any(|h| r.contains(h)))
        .collect();
    assert!(
        page_made.is_empty(),
        "the page made requests: {page_made:?}"
    );
    let section = |id: &str| -> &str {
        let start = dom
            .find(&format!("id=\"{id}\""))
            .unwrap_or_else(|| panic!("no #{id} in the DOM"));
        let end = dom[start..]
            .find("</section>")
            .map_or(dom.len(), |e| start + e);
        &dom[start..end]
    };
    assert!(dom.contains("NOT READY"));
    let culprits = section("culprits");
    for who in [
        "<th scope=\"row\">h1</th>",
        "<th scope=\"row\">h3</th>",
        "drops incoming connections",
    ] {
        assert!(
            culprits.contains(who),
            "{who} not in the culprits:\n{culprits}"
        );
    }
    let matrix = section("matrix");
    for h in ["h0", "h1", "h2", "h3"] {
        assert!(
            matrix.contains(&format!("data-node=\"{h}\"")),
            "{h} has no row"
        );
    }
    let h1 = &matrix[matrix.find("data-node=\"h1\"").unwrap()..];
    let h1 = &h1[..h1.find("</tr>").unwrap()];
    assert!(
        h1.contains("class=\"cell s-fail\" tabindex=\"0\" data-check=\"limits.nofile\""),
        "{h1}"
    );
    assert!(
        h1.contains("open files limited to 1024"),
        "the cell's message: {h1}"
    );
    let reach = section("reachability");
    assert_eq!(
        reach.matches("data-probe=\"timed_out\"").count(),
        3,
        "{reach}"
    );
    assert_eq!(reach.matches("data-probe=\"ok\"").count(), 9, "{reach}");
    let collective = section("collective");
    let tcp = collective
        .find("data-backend=\"tcp\"")
        .expect("the tcp backend");
    assert!(
        collective[tcp..].contains("<svg class=\"chart\""),
        "no chart"
    );
    assert_eq!(
        collective.matches("<polyline").count(),
        3,
        "one line per operation"
    );
    assert!(
        collective.contains("class=\"threshold\""),
        "the threshold is drawn"
    );
    assert!(collective.contains("rank 2 (h2"), "the straggler");
    // The control: a page that does fetch something is caught.
    let fetching = dir.path().join("fetching.html");
    std::fs::write(
        &fetching,
        "<img src=\"http://report-control.invalid/x.png\">",
    )
    .unwrap();
    let control = format!("file://{}", fetching.display());
    chromium(&["--dump-dom", &control], &proxy, profile.path());
    let requests = counter.take();
    assert!(
        requests
            .iter()
            .any(|r| r.contains("report-control.invalid")),
        "the proxy did not see the control page's request: {requests:?}"
    );
    // The picture for the README.
    let png = dir.path().join("report.png");
    let shot = chromium(
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,2300",
            &url,
        ],
        &proxy,
        profile.path(),
    );
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    if std::env::var("UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::write(repo().join("docs/report-html.png"), &bytes).unwrap();
    }
}

/// Markup in every value a report controls: an element that runs, an
/// image, a link with a backslash before its brackets, a backtick that
/// would close a code span.
const HOSTILE: &str = r#"x`<script>alert(1)</script><img src=x onerror=alert(2)> \[y\](https://evil.invalid/a) [z](https://evil.invalid/b) ![i](https://evil.invalid/i.png) https://evil.invalid/c www.evil.invalid x@evil.invalid # h"#;

/// The recorded run with HOSTILE in its check ids, messages, hints, node
/// names, culprit reasons, probe outcomes, findings and warnings.
fn hostile_reports(dir: &Path) {
    for rank in 0..4 {
        let mut r = read(repo().join(rank_file(rank)));
        for c in &mut r.checks {
            c.message = HOSTILE.into();
            c.hint = Some(HOSTILE.into());
            c.id = format!("{}{HOSTILE}", c.id);
        }
        if rank == 0 {
            let cluster = r.cluster.as_mut().expect("rank 0's cluster section");
            cluster.warnings = vec![HOSTILE.into()];
            for c in &mut cluster.culprits {
                c.reasons = vec![HOSTILE.into()];
            }
            let reach = &mut cluster.reachability;
            reach.findings = vec![HOSTILE.into()];
            reach.nodes[1] = format!("h1{HOSTILE}");
            for p in &mut reach.probes {
                if p.status != "ok" {
                    p.status = HOSTILE.into();
                    p.detail = Some(HOSTILE.into());
                }
            }
        }
        write(dir.join(format!("rank{rank}.json")), &r);
    }
}

/// What a page built from HOSTILE must never hold: the report put no
/// element, image or link there.
fn assert_inert(html: &str, what: &str) {
    for bad in [
        "<script",
        "<img",
        "evil.invalid/i.png\"",
        "href=\"https://evil",
        "href=\"http://www.evil",
        "href=\"mailto:",
    ] {
        assert!(!html.contains(bad), "{what} holds `{bad}`:\n{html}");
    }
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{what} does not show the markup as text:\n{html}"
    );
}

/// Neither the HTML report nor the Markdown one, rendered by a real
/// CommonMark renderer with raw HTML allowed (cmark-gfm --unsafe, with
/// GitHub's tables and autolinks), holds an element, image or link a
/// report put there:
/// every value is shown as the text it is.
#[test]
fn a_hostile_report_is_text_in_html_and_in_rendered_markdown() {
    let _shared = crate::common::shared();
    if Command::new("cmark-gfm").arg("--version").output().is_err() {
        skip::skip("cmark-gfm is not installed (Debian's cmark-gfm package)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    hostile_reports(dir.path());
    let reports = dir.path().to_str().unwrap();
    let html = report(&["--format", "html", reports]);
    assert_eq!(html.code, 1, "{}", html.stderr);
    assert_inert(&html.stdout, "the HTML report");

    let md = report(&["--format", "markdown", reports]);
    assert_eq!(md.code, 1, "{}", md.stderr);
    let file = dir.path().join("report.md");
    std::fs::write(&file, &md.stdout).unwrap();
    let rendered = Command::new("cmark-gfm")
        .args(["--unsafe", "-e", "table", "-e", "autolink"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(rendered.status.success());
    let rendered = String::from_utf8_lossy(&rendered.stdout).into_owned();
    assert_inert(&rendered, "the rendered Markdown report");
    // The structure held: one heading per problem, tables intact.
    assert_eq!(
        rendered.matches("<h1>").count(),
        1,
        "a value opened a heading:\n{rendered}"
    );
    assert!(rendered.contains("<table>"), "{rendered}");
}

/// Sixty failing nodes: every Markdown table and list stops at 50 rows
/// and counts the rest, and the JSON keeps all sixty.
#[test]
fn markdown_cuts_long_tables_at_50_rows_with_a_count_of_the_rest() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let first = check_report(
        dir.path(),
        "node001.json",
        "node001",
        "2026-11-26T10:00:00Z",
    );
    let r = read(&first);
    for n in 2..=60 {
        let mut copy = r.clone();
        copy.node.hostname = format!("node{n:03}");
        write(dir.path().join(format!("node{n:03}.json")), &copy);
    }
    let (_, m) = merged(&[dir.path().to_str().unwrap()]);
    assert_eq!(m.counts.nodes, 60);
    assert_eq!(m.culprits.len(), 60);
    let md = report(&["--format", "markdown", dir.path().to_str().unwrap()]).stdout;
    let culprits = &md[md.find("## Culprits").unwrap()..];
    let culprits = &culprits[..culprits.find("\n## ").unwrap_or(culprits.len())];
    let rows = culprits
        .lines()
        .filter(|l| l.starts_with("| node0"))
        .count();
    assert_eq!(rows, 50, "{culprits}");
    assert!(culprits.contains("… and 10 more culprits\n"), "{culprits}");
    assert!(culprits.contains("| node050 |") && !culprits.contains("| node051 |"));
    // Each problem's node list too.
    assert!(md.contains("… and 10 more nodes\n"), "{md}");
    let listed = md.lines().filter(|l| l.starts_with("- **node")).count();
    let problems = md.matches("… and 10 more nodes\n").count();
    assert!(
        problems >= 1 && listed == 50 * problems,
        "{listed} listed for {problems} problems"
    );
    // Every node has a problem and every cell is a check's own status:
    // no "0 more nodes without a problem", no legend for a `·` not shown.
    let nodes = &md[md.find("## Nodes").unwrap()..];
    let nodes = &nodes[..nodes[1..].find("\n## ").map_or(nodes.len(), |i| i + 1)];
    assert!(!nodes.contains("\n0 more node"), "{nodes}");
    assert!(
        nodes.contains("… and 10 more nodes with a problem\n"),
        "{nodes}"
    );
    assert!(!nodes.contains('·'), "{nodes}");
}

/// The node × check matrix says what the cluster findings say: h3, whose
/// inbound connections are dropped, passed every check of its own, and
/// its row names it the culprit, with why, rather than a green "ready".
#[test]
fn the_matrix_row_of_a_culprit_says_so() {
    let _shared = crate::common::shared();
    let html = report(&["--format", "html", RUN]).stdout;
    let row = &html[html.find("<tr id=\"node-h3\"").expect("h3's row")..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("class=\"cell s-fail\""), "{row}");
    assert!(row.contains("✗ culprit"), "{row}");
    assert!(row.contains("h3 drops incoming connections"), "{row}");
    // The straggler (rank 2, on h2) says so, with why.
    let row = &html[html.find("<tr id=\"node-h2\"").expect("h2's row")..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("class=\"cell s-warn\""), "{row}");
    assert!(row.contains("! straggler"), "{row}");
    assert!(
        row.contains("rank 2 (h2 10.231.82.3) is slow in every pair"),
        "{row}"
    );
    // A node no finding names keeps its own verdict.
    let row = &html[html.find("<tr id=\"node-h0\"").expect("h0's row")..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("ready"), "{row}");
}

/// Ranks of one run on one host whose start seconds differ (a second
/// boundary fell between them) are one run's reports, folded in; a report
/// of another job from the next second is superseded.
#[test]
fn one_runs_ranks_fold_in_across_a_second_boundary() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let r0 = read(rank_file(0));
    let mut r1 = read(rank_file(1));
    // Rank 1 ran on h0 too, and its clock read the second before.
    r1.node.hostname = "h0".into();
    r1.started_at = "2026-11-25T08:36:48Z".into();
    let a = dir.path().join("a0.json");
    let b = dir.path().join("a1.json");
    write(&a, &r0);
    write(&b, &r1);
    let (_, m) = merged(&[a.to_str().unwrap(), b.to_str().unwrap()]);
    // Nor is the earlier rank taken for an older run than the view's.
    let warned = |m: &Merged, what: &str| m.warnings.iter().any(|w| w.contains(what));
    assert!(!warned(&m, "superseded"), "{m}");
    assert!(!warned(&m, "older than the one shown"), "{m}");
    // Rank 1 on its own host, a second earlier: the same run as the view.
    let mut elsewhere = r1.clone();
    elsewhere.node.hostname = "h1".into();
    write(&b, &elsewhere);
    let (_, m) = merged(&[a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(m.warnings.is_empty(), "{m}");
    // Another job's report (another token) a second older is not this run.
    let mut other = r1.clone();
    other.cluster.as_mut().expect("a run report").token = "PREFLIGHT_TOKEN (00000000)".into();
    write(&b, &other);
    let (_, m) = merged(&[a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(warned(&m, "a1.json: an older report of h0"), "{m}");
}

/// The tests' typed reader (`common::report`) fails on a key the text
/// lacks that the type would fill in (a missing `culprits` would read as
/// "no culprit") and on one the type does not know (which no assertion
/// could read); the report as written reads.
#[test]
fn the_tests_typed_reader_refuses_a_missing_or_unknown_key() {
    let _shared = crate::common::shared();
    // As this version writes it (the recording predates some keys).
    let text = serde_json::to_string(&read(repo().join(RUN).join("rank0.json"))).unwrap();
    let read = |t: String| std::panic::catch_unwind(|| crate::common::report(&t, "").0);
    assert!(read(text.clone()).is_ok());
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["cluster"]
        .as_object_mut()
        .unwrap()
        .remove("culprits")
        .expect("the fixture's run names its culprits");
    let missing = read(v.to_string()).unwrap_err();
    let why = missing.downcast_ref::<String>().unwrap();
    assert!(
        why.contains("at .cluster.culprits (not in the text)"),
        "{why}"
    );
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["checks"][0]["surprise"] = Value::from(1);
    let unknown = read(v.to_string()).unwrap_err();
    let why = unknown.downcast_ref::<String>().unwrap();
    assert!(
        why.contains("at .checks[0].surprise (not in the type)"),
        "{why}"
    );
}
