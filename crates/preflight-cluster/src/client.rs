//! The rank's side of the rendezvous: connect to rank 0 with backoff until
//! the deadline, sample the clock against it, and wait for the verdict.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::sealed::{Channel, Sealed};
use tokio::time::Instant;

use super::auth::HANDSHAKE_LIMIT;
use super::auth::{self, AuthError, OTHER_JOB, Token};
use super::protocol::now_us;
use super::protocol::{self, FrameError, Msg};
use super::reachability;
use preflight_ground::values::format_duration;
use preflight_kinds::tcp_connect::{self, Outcome};
use preflight_result::CheckResult;
use preflight_result::cluster::{Clock, ClusterReport};

/// Each connect attempt's limit; a DROPped SYN is retried by the kernel
/// for minutes otherwise.
const CONNECT_LIMIT: Duration = Duration::from_secs(2);

const CLOCK_SAMPLES: usize = 5;

#[derive(Clone)]
pub struct ClientConfig {
    pub master_addr: String,
    pub master_port: u16,
    pub token: Token,
    /// Until when to keep trying to connect and check in.
    pub deadline: Instant,
    /// Until when to wait for the verdict after checking in.
    pub verdict_deadline: Instant,
    pub timeout: Duration,
    pub clock_offset_ms: i64,
    /// Where else rank 0 may serve (PREFLIGHT_MASTER_PORTS after
    /// MASTER_PORT): looked at in turn, the first that proves the job
    /// secret wins.
    pub alternates: Vec<u16>,
    /// Where each attempt's outcome is said, for the operator to watch.
    pub waiting: super::Waiting,
}

/// Connects and authenticates, retrying with backoff until the deadline.
/// The error says what the last attempts saw, in words that tell a DROP
/// from a REJECT from another job on the port.
pub async fn connect(cfg: &ClientConfig) -> Result<Channel, String> {
    connect_via(cfg, None, |s| s).await
}

/// `connect`, from `local` when given (a simulated node's own address),
/// over `wrap(stream)` (a stream that counts what it reads): the rank
/// simulator's way in, through the same retries and handshake.
pub async fn connect_via<S, F>(
    cfg: &ClientConfig,
    local: Option<std::net::IpAddr>,
    wrap: F,
) -> Result<Sealed<S>, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Fn(TcpStream) -> S,
{
    let mut backoff = Duration::from_millis(25);
    // How the last attempt on MASTER_PORT ended; `Connected` only until
    // the first one.
    let mut last = Outcome::Connected;
    let mut last_text = String::new();
    // The first answer that did not prove the job secret: until the
    // server has proven itself its words are noise (a stranger on the
    // port before rank 0 binds it), so they end no retry, but they are
    // what is reported if rank 0 never answers.
    let mut answered: Option<String> = None;
    // The first handshake that broke off after connecting (a server that
    // closed on us: full, or locked by a flood): kept, since a last
    // attempt after rank 0 has gone would say only "refused".
    let mut broke: Option<String> = None;
    let mut attempts = 0u32;
    let host = &cfg.master_addr;
    let ports: Vec<u16> = std::iter::once(cfg.master_port)
        .chain(
            cfg.alternates
                .iter()
                .copied()
                .filter(|p| *p != cfg.master_port),
        )
        .collect();
    // Ports that answered without proving the secret are tried last.
    let mut squatted = vec![false; ports.len()];
    'rounds: loop {
        let mut order: Vec<usize> = (0..ports.len()).collect();
        order.sort_by_key(|&i| squatted[i]);
        for i in order {
            let port = ports[i];
            let now = Instant::now();
            if now >= cfg.deadline {
                break 'rounds;
            }
            attempts += 1;
            let attempt = (now + CONNECT_LIMIT).min(cfg.deadline);
            let (outcome, text) = match tokio::time::timeout_at(attempt, open(host, port, local))
                .await
            {
                Err(_) => {
                    // A port that swallows connections (a full backlog, a
                    // DROP) costs a round's time: tried last.
                    squatted[i] = true;
                    (
                        Outcome::TimedOut,
                        "connection attempt timed out".to_string(),
                    )
                }
                Ok(Err(e)) => (tcp_connect::classify(&e), e.to_string()),
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    let mut stream = wrap(stream);
                    let handshake = (Instant::now() + HANDSHAKE_LIMIT).min(cfg.deadline);
                    // The proofs cover which of the ports this is: a relay
                    // from one to another fails the handshake.
                    let token = cfg.token.at(i);
                    match auth::client(&mut stream, &token, handshake).await {
                        Ok(session) => return Ok(session.seal(stream, &token, true)),
                        Err(e) => {
                            squatted[i] = true;
                            let said = unproven_answer(cfg, port, &e);
                            if answered.is_none() {
                                answered = said.clone();
                            }
                            let text = said.unwrap_or_else(|| {
                                format!("connected to port {port}, but the handshake failed: {e}")
                            });
                            if broke.is_none() {
                                broke = Some(text.clone());
                            }
                            (Outcome::Other, text)
                        }
                    }
                }
            };
            if let Some(w) = &cfg.waiting {
                let _ = w.send(format!(
                    "reaching rank 0 at {host}:{port}: {} so far, the last: {text}",
                    preflight_ground::values::count(attempts as usize, "attempt")
                ));
            }
            if port == cfg.master_port {
                last = outcome;
                last_text = text;
            }
        }
        let left = cfg.deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(backoff.min(left)).await;
        // Short at most: rank 0 usually comes up within milliseconds of
        // the others, and a long sleep would add to every healthy run.
        backoff = (backoff * 2).min(Duration::from_millis(250));
    }
    let waited = format_duration(cfg.timeout);
    let port = cfg.master_port;
    if let Some(said) = answered {
        return Err(format!(
            "{said}; no preflight proving this job's secret answered there within {waited} ({attempts} attempts)"
        ));
    }
    if let Some(first) = broke.filter(|_| last != Outcome::Other) {
        return Err(format!(
            "cannot reach the master {host}:{port} (rank 0) within {waited} ({attempts} attempts): {first} (the first failure seen; the last attempt: {last_text})"
        ));
    }
    Err(match last {
        Outcome::TimedOut => format!(
            "cannot reach the master {host}:{port} (rank 0): every connection attempt timed out for {waited} ({attempts} attempts): packets to port {port} are dropped, by a firewall DROP rule on {host} or on the way"
        ),
        Outcome::Refused => format!(
            "cannot reach the master {host}:{port} (rank 0): connection refused for {waited} ({attempts} attempts): nothing listens on port {port} on {host} (rank 0 never started, or already finished with the job's other ranks, or MASTER_PORT differs), or a firewall REJECTs it"
        ),
        Outcome::Unreachable => format!(
            "cannot reach the master {host}:{port} (rank 0): {last_text}: no route to {host} from here"
        ),
        Outcome::NotResolved => format!(
            "rank 0's {host} did not come up within {waited}: its name does not resolve here ({attempts} attempts, the last: {last_text}): the node or pod that runs rank 0 is not up yet or is gone, or its name is wrong (in Kubernetes a pod's name resolves only once the pod exists, under the job's headless Service)"
        ),
        Outcome::Other | Outcome::Connected => format!(
            "cannot reach the master {host}:{port} (rank 0) within {waited}: {}",
            if last_text.is_empty() {
                "no attempt completed"
            } else {
                &last_text
            }
        ),
    })
}

/// What an answer that did not prove the job secret says about the port,
/// in words; `None` for a handshake that merely broke off.
fn unproven_answer(cfg: &ClientConfig, port: u16, e: &AuthError) -> Option<String> {
    let host = &cfg.master_addr;
    match e {
        AuthError::OtherJob {
            theirs: Some(theirs),
        } => Some(format!(
            "the preflight at {host}:{port} has another job token: this rank's job secret differs from rank 0's (rank 0's: {theirs}; this rank's: {}): export the same PREFLIGHT_TOKEN (or PREFLIGHT_TOKEN_FILE) on every node; if {host}:{port} is not this job's master, another job holds that port",
            cfg.token.source,
        )),
        AuthError::OtherJob { theirs: None } => Some(format!(
            "port {port} on {host} is in use by another job: the preflight there proves another job token (PREFLIGHT_TOKEN / SLURM_JOB_ID / TORCHELASTIC_RUN_ID), so this job's master is not there"
        )),
        AuthError::RejectedByPeer(r) if r == OTHER_JOB => Some(format!(
            "port {port} on {host} is in use by another job: it rejected this job's token"
        )),
        AuthError::Frame(e @ (FrameError::Garbage | FrameError::Version(_))) => Some(format!(
            "port {port} on {host} is in use by something that is not this job's preflight ({e})"
        )),
        _ => None,
    }
}

/// A TCP connection to the master, from `local` when given.
async fn open(
    host: &str,
    port: u16,
    local: Option<std::net::IpAddr>,
) -> std::io::Result<TcpStream> {
    let Some(local) = local else {
        return TcpStream::connect((host, port)).await;
    };
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = match addr {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        if let Err(e) = socket.bind(std::net::SocketAddr::new(local, 0)) {
            last = Some(e);
            continue;
        }
        match socket.connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no address")))
}

/// NTP-style: the sample with the smallest round trip.
pub async fn sample_clock<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    offset_ms: i64,
    deadline: Instant,
) -> Option<Clock> {
    let mut best: Option<Clock> = None;
    for _ in 0..CLOCK_SAMPLES {
        let t0 = now_us(offset_ms);
        protocol::write(stream, &Msg::TimeRequest { t0 }, deadline)
            .await
            .ok()?;
        let Ok(Msg::TimeReply { t0: echoed, t1, t2 }) = protocol::read(stream, deadline).await
        else {
            return best;
        };
        let t3 = now_us(offset_ms);
        if echoed != t0 {
            continue;
        }
        let c = Clock::sample(t0, t1, t2, t3);
        if best.is_none_or(|b| c.rtt_ms < b.rtt_ms) {
            best = Some(c);
        }
    }
    best
}

/// After checking in: answer a probe plan, then return the verdict and the
/// run's deadline as rank 0 holds it.
#[cfg(any(test, feature = "rank-sim"))]
pub async fn await_verdict<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    deadline: Instant,
) -> Result<(ClusterReport, Instant), String> {
    hear_verdict(stream, deadline)
        .await
        .map(|h| (h.report, h.until))
}

/// What a rank hears after checking in.
pub struct Heard {
    pub report: ClusterReport,
    /// The run's deadline as rank 0 holds it.
    pub until: Instant,
    /// From a node's leader: the node-scope findings it shares.
    pub node_findings: Option<Vec<CheckResult>>,
}

/// `await_verdict`, with what a node's leader shares before the verdict.
pub async fn hear_verdict<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    deadline: Instant,
) -> Result<Heard, String> {
    let (mut rd, wr) = tokio::io::split(stream);
    hear_on(&mut rd, &tokio::sync::Mutex::new(wr), deadline).await
}

/// `await_verdict` over a connection split in two: a node leader's writer
/// is shared with the tasks that relay its node's check-ins.
pub async fn await_verdict_on<R, W>(
    rd: &mut R,
    wr: &tokio::sync::Mutex<W>,
    deadline: Instant,
) -> Result<(ClusterReport, Instant), String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    hear_on(rd, wr, deadline).await.map(|h| (h.report, h.until))
}

async fn hear_on<R, W>(
    rd: &mut R,
    wr: &tokio::sync::Mutex<W>,
    deadline: Instant,
) -> Result<Heard, String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut node_findings = None;
    loop {
        match protocol::read(rd, deadline).await {
            Ok(Msg::Verdict { report, left_ms }) => {
                return Ok(Heard {
                    report: *report,
                    until: Instant::now() + Duration::from_millis(left_ms),
                    node_findings,
                });
            }
            Ok(Msg::NodeFindings { results }) => node_findings = Some(results),
            Ok(Msg::ProbePlan {
                node,
                targets,
                timeout_ms,
            }) => {
                let timeout = Duration::from_millis(timeout_ms.clamp(50, 5000));
                let results = reachability::probe_all(node, &targets, timeout).await;
                protocol::write(
                    &mut *wr.lock().await,
                    &Msg::ProbeResults { results },
                    deadline,
                )
                .await
                .map_err(|e| format!("cannot send the probe results to the master: {e}"))?;
            }
            Ok(Msg::Rejected { reason, .. }) => {
                return Err(format!("the master rejected this rank: {reason}"));
            }
            Ok(_) => {}
            Err(FrameError::Timeout) => {
                return Err(
                    "checked in, but no verdict came from the master before the deadline".into(),
                );
            }
            Err(e) => {
                return Err(format!(
                    "checked in, but the master went away before the verdict: {e}"
                ));
            }
        }
    }
}
