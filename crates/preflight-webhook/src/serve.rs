//! The webhook's HTTPS server: `POST /mutate` takes an AdmissionReview and
//! answers it (`mutate::answer`, with the gang's PodGroup read from the
//! API server where the pod has one: `podgroup`), `GET /healthz` answers `ok` for the
//! Deployment's probes. Every peer is bounded, below the API server's own
//! 5 s wait for a review (`timeoutSeconds`), so that no peer can stall
//! admission: 3 s for the TLS handshake and for a request's headers (an
//! idle kept-alive connection included), `MAX_BODY` for its body and 128
//! MiB for the bodies of every connection together (`body`), a minute for
//! a connection (closed after the request in hand), `PER_SOURCE`
//! connections from one address and `AT_ONCE` in all, `REVIEWS_AT_ONCE`
//! reviews parsed at once; a request it cannot read gets its 4xx and the
//! server goes on serving.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use tokio_rustls::rustls;

use super::body::{self, Body};
use super::mutate::{self, Config};

/// Connections served at once; the next waits to be accepted.
const AT_ONCE: usize = 512;
/// Connections from one address at once: a pod that opens hundreds
/// (idle or slow) gets a few, the API server's slots stay free. Past it a
/// connection is closed at once.
const PER_SOURCE: usize = 32;
/// Reviews parsed at once: one of `MAX_BODY` may take a hundred MiB.
const REVIEWS_AT_ONCE: usize = 2;
/// A PodGroup's read from the API server: well inside its 5 s wait for
/// the review.
const LOOKUP: Duration = Duration::from_secs(2);
/// A review this small gives its turn up while its PodGroup is read.
const SMALL_REVIEW: usize = 256 << 10;
/// The TLS handshake, and a request's headers.
const HANDSHAKE: Duration = Duration::from_secs(3);
/// One connection, however many requests it carries (the API server
/// keeps them alive and opens another).
const CONNECTION: Duration = Duration::from_secs(60);

/// The server's TLS settings from PEM files: the certificate chain the API
/// server verifies (its caBundle), and the key, taken up again when the
/// files change (`certificate`).
pub fn tls(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    super::certificate::server_config(cert, key)
}

fn reply(status: u16, body: Vec<u8>, json: bool) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    let kind = if json {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    if let Ok(v) = hyper::header::HeaderValue::from_str(kind) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

async fn handle(
    req: Request<Incoming>,
    cfg: Arc<Config>,
    peer: SocketAddr,
    reviews: Arc<tokio::sync::Semaphore>,
    bodies: Arc<tokio::sync::Semaphore>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let path = req.uri().path().to_string();
    Ok(match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => reply(200, b"ok\n".to_vec(), false),
        (&Method::POST, "/mutate") => {
            let (headers, incoming) = req.into_parts();
            let (body, _held) = match body::read(&headers.headers, incoming, &bodies).await {
                Body::Read(b, held) => (b, held),
                refused => {
                    let (status, why) = match refused {
                        Body::Unreadable(e) => (400, format!("the body could not be read: {e}")),
                        Body::Busy => (503, "too many bodies at once: try again".to_string()),
                        _ => (413, format!("a body over {} MiB", mutate::MAX_BODY >> 20)),
                    };
                    eprintln!("preflight webhook: {peer}: {status} {why}");
                    let mut r = reply(status, format!("{why}\n").into_bytes(), false);
                    // The API server's webhook client retries a call whose
                    // answer asks for a delay.
                    if status == 503 {
                        r.headers_mut().insert(
                            hyper::header::RETRY_AFTER,
                            hyper::header::HeaderValue::from_static("1"),
                        );
                    }
                    return Ok(r);
                }
            };
            // A parsed review takes many times its body's bytes: a few at
            // a time keep the webhook within its memory limit.
            let Ok(turn) = reviews.acquire().await else {
                return Ok(reply(503, b"shutting down\n".to_vec(), false));
            };
            let (status, out) = match mutate::read(&body) {
                Err(refused) => refused,
                Ok(review) => {
                    let gang =
                        match (&cfg.podgroups, mutate::podgroup(&review)) {
                            (Some(api), Some(group)) => {
                                // A pod's review is small: its turn is for
                                // others while the API server answers.
                                if body.len() <= SMALL_REVIEW {
                                    drop(turn);
                                }
                                Some(api.group_size(&group, LOOKUP).await.map(|size| {
                                    mutate::Gang {
                                        size,
                                        from: group.words(),
                                    }
                                }))
                            }
                            _ => None,
                        };
                    mutate::answer(&review, &cfg, gang)
                }
            };
            if status != 200 {
                eprintln!(
                    "preflight webhook: {peer}: {status} {}",
                    String::from_utf8_lossy(&out).trim()
                );
            }
            reply(status, out, status == 200)
        }
        _ => reply(
            404,
            b"preflight webhook: POST /mutate, GET /healthz\n".to_vec(),
            false,
        ),
    })
}

/// One connection counted against its address's share; given back on
/// drop.
struct Source {
    ip: std::net::IpAddr,
    counts: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

impl Source {
    fn take(
        counts: &Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
        ip: std::net::IpAddr,
    ) -> Option<Source> {
        let mut m = counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_default();
        if *n >= PER_SOURCE {
            return None;
        }
        *n += 1;
        Some(Source {
            ip,
            counts: Arc::clone(counts),
        })
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        let mut m = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// Serves on `listener` until SIGTERM or SIGINT (exit 0 then).
pub fn serve(
    listener: std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    cfg: Config,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async move {
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("the listener: {e}"))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| format!("the listener: {e}"))?;
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let cfg = Arc::new(cfg);
        let slots = Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
        let reviews = Arc::new(tokio::sync::Semaphore::new(REVIEWS_AT_ONCE));
        let bodies = body::budget();
        let sources: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>> =
            Arc::default();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| format!("SIGTERM: {e}"))?;
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return Ok(());
            };
            let (tcp, peer) = tokio::select! {
                a = listener.accept() => match a {
                    Ok(a) => a,
                    // A peer gone between SYN and accept, or no descriptor
                    // left: said, and the next one taken.
                    Err(e) => {
                        eprintln!("preflight webhook: accept: {e}");
                        continue;
                    }
                },
                _ = term.recv() => return Ok(()),
                _ = tokio::signal::ctrl_c() => return Ok(()),
            };
            let Some(from) = Source::take(&sources, peer.ip()) else {
                // Closed unread: its peer holds its share already.
                drop(tcp);
                continue;
            };
            let (acceptor, cfg) = (acceptor.clone(), cfg.clone());
            let (reviews, bodies) = (reviews.clone(), bodies.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let _from = from;
                let tls = match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        eprintln!("preflight webhook: {peer}: TLS: {e}");
                        return;
                    }
                    Err(_) => return,
                };
                let service = hyper::service::service_fn(move |req| {
                    handle(req, cfg.clone(), peer, reviews.clone(), bodies.clone())
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HANDSHAKE)
                    .max_buf_size(64 << 10)
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service);
                tokio::pin!(conn);
                // At the connection's deadline, the request in hand is
                // answered and the connection closed after it (the API
                // server opens another), never cut mid-request.
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = tokio::time::sleep(CONNECTION) => {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(HANDSHAKE, conn).await;
                    }
                }
            });
        }
    })
}
