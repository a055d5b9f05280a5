//! http against servers the test starts on loopback: status, body, a
//! server that never answers, connection refused, and a proxy taken from
//! the job's environment.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::{check, checklist, message, result, status};

/// Serves every connection with `respond(request_line)` until the test
/// ends; records the request lines.
fn serve(respond: fn(&str) -> Option<String>) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut first = String::new();
                let _ = reader.read_line(&mut first);
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 2 {
                    line.clear();
                }
                log.lock().unwrap().push(first.trim().to_string());
                match respond(first.trim()) {
                    Some(r) => {
                        let _ = stream.write_all(r.as_bytes());
                    }
                    // Hold the connection open without answering.
                    None => std::thread::sleep(std::time::Duration::from_secs(20)),
                }
            });
        }
    });
    (port, seen)
}

fn respond(request: &str) -> Option<String> {
    let path = request.split(' ').nth(1).unwrap_or("/");
    let (status, body) = if path.ends_with("/hang") {
        return None;
    } else if path.ends_with("/health") {
        ("200 OK", "{\"status\": \"healthy\"}")
    } else {
        ("404 Not Found", "no such thing")
    };
    Some(format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ))
}

#[test]
fn status_body_timeout_refused_and_proxy() {
    let (port, seen) = serve(respond);
    // A port with nothing behind it: bind, note, close.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let yaml = format!(
        "checks:
  - {{id: ok, kind: http, url: \"{base}/health\", body_matches: '\"healthy\"'}}
  - {{id: body, kind: http, url: \"{base}/health\", body_matches: 'ready'}}
  - {{id: missing, kind: http, url: \"{base}/nope\", hint: \"got {{status}} from {{url}}\"}}
  - {{id: either, kind: http, url: \"{base}/nope\", status: [200, 404]}}
  - {{id: hang, kind: http, url: \"{base}/hang\", request_timeout: 500ms}}
  - {{id: refused, kind: http, url: \"http://127.0.0.1:{closed}/\"}}
  - {{id: proxied, kind: http, url: \"http://registry.invalid/health\"}}
  - {{id: no_proxy, kind: http, url: \"{base}/health\"}}
"
    );
    let (_dir, path) = checklist(&yaml);
    let proxy = format!("http://127.0.0.1:{port}");
    let (code, r) = check(
        &path,
        &[],
        &[("HTTP_PROXY", &proxy), ("NO_PROXY", "127.0.0.1,localhost")],
    );
    assert_eq!(code, 1);
    assert_eq!(status(&r, "ok"), "pass", "{}", message(&r, "ok"));
    assert_eq!(result(&r, "ok")["measured"], "200");
    assert_eq!(status(&r, "body"), "fail");
    assert!(message(&r, "body").contains("body does not match /ready/"));
    assert_eq!(status(&r, "missing"), "fail");
    assert_eq!(
        result(&r, "missing")["hint"],
        format!("got 404 from {base}/nope")
    );
    assert_eq!(status(&r, "either"), "pass");
    assert_eq!(status(&r, "hang"), "fail");
    assert!(
        message(&r, "hang").contains("no response within 500ms"),
        "{}",
        message(&r, "hang")
    );
    assert_eq!(status(&r, "refused"), "fail");
    assert!(
        message(&r, "refused").contains("cannot connect: Connection refused"),
        "{}",
        message(&r, "refused")
    );
    // The proxy (our server) got the absolute URL; NO_PROXY kept the
    // loopback requests direct.
    assert_eq!(status(&r, "proxied"), "pass", "{}", message(&r, "proxied"));
    assert!(message(&r, "proxied").contains(&format!("via proxy {proxy}")));
    assert!(!message(&r, "no_proxy").contains("via proxy"));
    let lines = seen.lock().unwrap().clone();
    assert!(
        lines
            .iter()
            .any(|l| l == "GET http://registry.invalid/health HTTP/1.1"),
        "{lines:?}"
    );
}
