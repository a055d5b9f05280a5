//! http against servers the test starts on loopback: status, body, a
//! server that never answers, connection refused, and a proxy taken from
//! the job's environment.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::{check, checklist, measured, message, status};

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
    let _shared = crate::common::shared();
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
    assert_eq!(measured(&r, "ok"), "200");
    assert_eq!(status(&r, "body"), "fail");
    assert!(message(&r, "body").contains("body does not match /ready/"));
    assert_eq!(status(&r, "missing"), "fail");
    assert_eq!(
        common::hint(&r, "missing"),
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

/// A Python helper started for this test, killed at its end; its stdout
/// lines (the first is the port it serves on) are collected.
struct Helper {
    child: std::process::Child,
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Helper {
    fn start(code: &str, args: &[&str]) -> Helper {
        let mut child = std::process::Command::new("python3")
            .arg("-c")
            .arg(code)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let port = first.trim().parse().expect("the helper's port");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&lines);
        std::thread::spawn(move || {
            let mut line = String::new();
            while out.read_line(&mut line).unwrap_or(0) > 0 {
                log.lock().unwrap().push(line.trim().to_string());
                line.clear();
            }
        });
        Helper { child, port, lines }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TLS_SERVER: &str = r#"
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"status": "healthy"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// An HTTP CONNECT proxy that prints each request line it gets.
const CONNECT_PROXY: &str = r#"
import socket, threading
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(16)
print(l.getsockname()[1], flush=True)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass
def handle(c):
    req = b""
    while b"\r\n\r\n" not in req:
        d = c.recv(4096)
        if not d:
            return
        req += d
    line = req.split(b"\r\n")[0].decode()
    print(line, flush=True)
    host, port = line.split(" ")[1].rsplit(":", 1)
    u = socket.create_connection((host, int(port)))
    c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    pipe(u, c)
while True:
    c, _ = l.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
"#;

/// A site's own CA and a certificate for localhost and 127.0.0.1 signed by
/// it, made with the openssl command.
fn site_ca(dir: &std::path::Path) -> (String, String, String) {
    let path = |f: &str| dir.join(f).display().to_string();
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    for args in [
        vec![
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &path("ca.key"),
            "-out",
            &path("ca.pem"),
            "-days",
            "1",
            "-subj",
            "/CN=preflight test CA",
        ],
        vec![
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &path("srv.key"),
            "-out",
            &path("srv.csr"),
            "-subj",
            "/CN=localhost",
        ],
        vec![
            "x509",
            "-req",
            "-in",
            &path("srv.csr"),
            "-CA",
            &path("ca.pem"),
            "-CAkey",
            &path("ca.key"),
            "-CAcreateserial",
            "-out",
            &path("srv.pem"),
            "-days",
            "1",
            "-extfile",
            &path("ext"),
        ],
    ] {
        let out = std::process::Command::new("openssl")
            .args(&args)
            .output()
            .expect("openssl (apt: openssl)");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    }
    (path("ca.pem"), path("srv.pem"), path("srv.key"))
}

/// https to a server whose certificate a site's own CA signed: trusted
/// through SSL_CERT_FILE, refused without it; HTTPS_PROXY tunnels it
/// (CONNECT), ALL_PROXY serves where the scheme's variable is unset, as
/// the job's own tools would use them.
#[test]
fn https_with_a_site_ca_through_https_proxy_and_all_proxy() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = site_ca(dir.path());
    let tls = Helper::start(TLS_SERVER, &[&cert, &key]);
    let proxy = Helper::start(CONNECT_PROXY, &[]);
    let (plain, seen) = serve(respond);
    let yaml = format!(
        "checks:
  - {{id: direct, kind: http, url: \"https://127.0.0.1:{t}/health\", body_matches: healthy}}
  - {{id: tunnelled, kind: http, url: \"https://localhost:{t}/health\", body_matches: healthy}}
  - {{id: all_proxy, kind: http, url: \"http://registry.invalid/health\"}}
",
        t = tls.port
    );
    let (_d, path) = checklist(&yaml);
    let https_proxy = format!("http://127.0.0.1:{}", proxy.port);
    let all_proxy = format!("http://127.0.0.1:{plain}");
    let (code, r) = check(
        &path,
        &[],
        &[
            ("SSL_CERT_FILE", &ca),
            ("HTTPS_PROXY", &https_proxy),
            ("ALL_PROXY", &all_proxy),
            ("NO_PROXY", "127.0.0.1"),
        ],
    );
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(status(&r, "direct"), "pass", "{}", message(&r, "direct"));
    assert!(!message(&r, "direct").contains("via proxy"));
    assert_eq!(
        status(&r, "tunnelled"),
        "pass",
        "{}",
        message(&r, "tunnelled")
    );
    assert!(message(&r, "tunnelled").contains(&format!("via proxy {https_proxy}")));
    assert_eq!(
        proxy.lines.lock().unwrap().clone(),
        vec![format!("CONNECT localhost:{} HTTP/1.1", tls.port)]
    );
    assert_eq!(
        status(&r, "all_proxy"),
        "pass",
        "{}",
        message(&r, "all_proxy")
    );
    assert!(message(&r, "all_proxy").contains(&format!("via proxy {all_proxy}")));
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .any(|l| l == "GET http://registry.invalid/health HTTP/1.1")
    );
    // Without the site's CA the certificate is not trusted, and says why.
    let (code, r) = check(&path, &["--only", "direct"], &[]);
    assert_eq!(code, 1);
    assert!(
        message(&r, "direct").contains("invalid peer certificate"),
        "{}",
        message(&r, "direct")
    );
}
