//! `tcp_connect`: opens a TCP connection to an endpoint the job needs and
//! says how it failed, because each failure has a different owner: nothing
//! listening (the service), a REJECT rule (refused, instantly), a DROP rule
//! or a dead route (timed out), no route (unreachable), or DNS.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::resolve::{ResolveError, resolve};
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use preflight_facts::Facts;
use preflight_ground::values::{Span, format_duration};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "tcp_connect",
    scope: crate::Scope::Node,
    area: "network",
    summary: "Connects to host:port under a timeout and classifies the outcome: connected, refused, timed out, unreachable, or not resolved.",
    params: &[
        ParamDoc {
            name: "host",
            ty: "string",
            default: Some("unset"),
            doc: "Host name or address to connect to.",
        },
        ParamDoc {
            name: "host_var",
            ty: "string",
            default: Some("unset"),
            doc: "Take the host from this environment variable instead (e.g. MASTER_ADDR).",
        },
        ParamDoc {
            name: "port",
            ty: "integer",
            default: Some("unset"),
            doc: "TCP port.",
        },
        ParamDoc {
            name: "port_var",
            ty: "string",
            default: Some("unset"),
            doc: "Take the port from this environment variable instead (e.g. MASTER_PORT).",
        },
        ParamDoc {
            name: "connect_timeout",
            ty: "duration",
            default: Some("3s"),
            doc: "How long to wait for the connection (and for name resolution). A firewall that drops packets shows as a timeout.",
        },
    ],
    hint_vars: &["outcome", "advice", "address", "target"],
    parse: parse_params::<TcpConnect>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TcpConnect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    host_var: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    port_var: Option<String>,
    #[serde(default = "default_timeout")]
    connect_timeout: Span,
}

fn default_timeout() -> Span {
    Span(Duration::from_secs(3))
}

impl Params for TcpConnect {
    fn validate(&self) -> Result<(), String> {
        if self.host.is_some() == self.host_var.is_some() {
            return Err("give exactly one of `host` and `host_var`".into());
        }
        if self.port.is_some() == self.port_var.is_some() {
            return Err("give exactly one of `port` and `port_var`".into());
        }
        if self.port == Some(0) {
            return Err("`port` must be 1-65535".into());
        }
        if self.connect_timeout.0.is_zero() {
            return Err("`connect_timeout` must be longer than zero".into());
        }
        Ok(())
    }
}

/// How a connection attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Connected,
    Refused,
    TimedOut,
    Unreachable,
    NotResolved,
    Other,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Connected => "connected",
            Outcome::Refused => "refused",
            Outcome::TimedOut => "timed_out",
            Outcome::Unreachable => "unreachable",
            Outcome::NotResolved => "not_resolved",
            Outcome::Other => "error",
        }
    }

    /// What to do about it: each outcome has its own owner.
    pub fn advice(self) -> &'static str {
        match self {
            Outcome::Connected => "",
            Outcome::Refused => {
                "The host answered but nothing accepts on that port: the service is not running or listens on another address/port, or a firewall REJECT rule answers for it (`ss -ltnp` on the target, `nft list ruleset`)."
            }
            Outcome::TimedOut => {
                "No answer at all: a firewall DROP rule (on the target, this node or in between) or a route that goes nowhere. Check `nft list ruleset` / `iptables -S` on both ends and the security groups."
            }
            Outcome::Unreachable => {
                "The kernel or a router reports no route to the host: check `ip route get <address>`, the interface state, and the subnet/VLAN of both nodes."
            }
            Outcome::NotResolved => {
                "The name does not resolve on this node: check /etc/hosts, /etc/resolv.conf and that the DNS server is reachable."
            }
            Outcome::Other => "See the message for the system error.",
        }
    }
}

/// Classifies an I/O error from connect (this check's, the rendezvous's
/// and the cluster's reachability probes'): a reset is `Refused` (nothing
/// listens, or a REJECT rule), an ICMP error `Unreachable`.
pub fn classify(error: &std::io::Error) -> Outcome {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset => Outcome::Refused,
        ErrorKind::TimedOut => Outcome::TimedOut,
        ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => Outcome::Unreachable,
        _ => match error.raw_os_error() {
            Some(libc::EHOSTUNREACH | libc::ENETUNREACH) => Outcome::Unreachable,
            // getaddrinfo's failures carry no errno: std says them so
            // (NXDOMAIN, no DNS server answering, no address).
            _ if error
                .to_string()
                .starts_with("failed to lookup address information") =>
            {
                Outcome::NotResolved
            }
            _ => Outcome::Other,
        },
    }
}

/// One connection attempt bounded by `limit`.
pub async fn attempt(address: SocketAddr, limit: Duration) -> (Outcome, Option<std::io::Error>) {
    match tokio::time::timeout(limit, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(_stream)) => (Outcome::Connected, None),
        Ok(Err(e)) => (classify(&e), Some(e)),
        Err(_) => (Outcome::TimedOut, None),
    }
}

impl TcpConnect {
    fn endpoint(&self, facts: &Facts) -> Result<(String, u16), Finding> {
        let host = match (&self.host, &self.host_var) {
            (Some(h), _) => h.clone(),
            (None, Some(var)) => match facts.env(var).filter(|v| !v.trim().is_empty()) {
                Some(v) => v.trim().to_string(),
                None => return Err(Finding::skip(format!("{var} is not set"))),
            },
            (None, None) => return Err(Finding::error("no host configured")),
        };
        let port = match (self.port, &self.port_var) {
            (Some(p), _) => p,
            (None, Some(var)) => match facts.env(var) {
                None => return Err(Finding::skip(format!("{var} is not set"))),
                Some(v) => match v.trim().parse::<u16>() {
                    Ok(p) if p > 0 => p,
                    _ => {
                        return Err(Finding::fail(format!(
                            "{var}=`{v}` is not a port number (1-65535)"
                        ))
                        .var("outcome", "invalid")
                        .var("advice", format!("Set {var} to a port number."))
                        .about_variables([var.clone()]));
                    }
                },
            },
            (None, None) => return Err(Finding::error("no port configured")),
        };
        Ok((host, port))
    }

    async fn run(&self, facts: &Facts) -> Finding {
        let (host, port) = match self.endpoint(facts) {
            Ok(e) => e,
            Err(f) => return f,
        };
        let target = format!("{host}:{port}");
        let limit = self.connect_timeout.0;
        let with = |f: Finding, outcome: Outcome, address: &str| {
            f.measured(outcome.name())
                .expected("connected")
                .var("outcome", outcome.name())
                .var("advice", outcome.advice())
                .var("address", address.to_string())
                .var("target", target.clone())
        };
        let ips = match resolve(&host, limit).await {
            Ok(ips) => ips,
            Err(e) => {
                let why = match &e {
                    ResolveError::NotFound(r) => r.clone(),
                    ResolveError::TimedOut(_) => e.to_string(),
                };
                return with(
                    Finding::fail(format!("{target}: not resolved: {why}")),
                    Outcome::NotResolved,
                    "",
                );
            }
        };
        let mut first_failure = None;
        for ip in &ips {
            let address = SocketAddr::new(*ip, port);
            let start = Instant::now();
            let (outcome, error) = attempt(address, limit).await;
            if outcome == Outcome::Connected {
                return with(
                    Finding::pass(format!(
                        "{target}: connected to {address} in {}",
                        format_duration(start.elapsed())
                    )),
                    outcome,
                    &address.to_string(),
                );
            }
            if first_failure.is_none() {
                first_failure = Some((address, outcome, error));
            }
        }
        let Some((address, outcome, error)) = first_failure else {
            return Finding::error(format!("{target}: no address to try"));
        };
        let detail = match outcome {
            Outcome::Refused => "connection refused".to_string(),
            Outcome::TimedOut => format!(
                "timed out after {} (no answer: packets dropped)",
                format_duration(limit)
            ),
            Outcome::Unreachable => format!(
                "unreachable ({})",
                error.as_ref().map_or(String::new(), |e| e.to_string())
            ),
            _ => error
                .as_ref()
                .map_or("failed".to_string(), |e| e.to_string()),
        };
        let also = if ips.len() > 1 {
            format!(" (and {} other address(es) failed)", ips.len() - 1)
        } else {
            String::new()
        };
        let via = if address.to_string() == target {
            String::new()
        } else {
            format!(" {address}")
        };
        with(
            Finding::fail(format!("{target}:{via} {detail}{also}")),
            outcome,
            &address.to_string(),
        )
    }
}

impl Probe for TcpConnect {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move { self.run(&facts).await })
    }
}
