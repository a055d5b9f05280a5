//! Name resolution under a deadline. getaddrinfo blocks and can hang on a
//! dead DNS server, so it runs on the blocking pool and the caller stops
//! waiting at the deadline.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    NotFound(String),
    TimedOut(Duration),
}

impl std::fmt::Display for ResolveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolveError::NotFound(reason) => write!(f, "{reason}"),
            ResolveError::TimedOut(d) => write!(
                f,
                "name resolution did not answer within {}",
                crate::checklist::values::format_duration(*d)
            ),
        }
    }
}

/// The addresses `host` resolves to, IPv4 first, duplicates removed.
pub async fn resolve(host: &str, limit: Duration) -> Result<Vec<IpAddr>, ResolveError> {
    if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let lookup = tokio::net::lookup_host((host.to_string(), 0));
    match tokio::time::timeout(limit, lookup).await {
        Err(_) => Err(ResolveError::TimedOut(limit)),
        Ok(Err(e)) => Err(ResolveError::NotFound(format!(
            "`{host}` does not resolve: {e}"
        ))),
        Ok(Ok(addrs)) => {
            let mut ips: Vec<IpAddr> = Vec::new();
            for ip in addrs.map(|a: SocketAddr| a.ip()) {
                if !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
            ips.sort_by_key(|ip| ip.is_ipv6());
            if ips.is_empty() {
                Err(ResolveError::NotFound(format!(
                    "`{host}` resolves to no address"
                )))
            } else {
                Ok(ips)
            }
        }
    }
}

/// Blocking form, for probes that already run on the blocking pool. The
/// lookup runs on its own thread so the deadline holds even when
/// getaddrinfo hangs; that thread is left to finish on its own.
pub fn resolve_blocking(host: &str, limit: Duration) -> Result<Vec<IpAddr>, ResolveError> {
    if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = host.to_string();
    std::thread::spawn(move || {
        use std::net::ToSocketAddrs;
        let result = (owned.as_str(), 0)
            .to_socket_addrs()
            .map(|a| a.map(|s| s.ip()).collect::<Vec<_>>());
        let _ = tx.send(result);
    });
    match rx.recv_timeout(limit) {
        Err(_) => Err(ResolveError::TimedOut(limit)),
        Ok(Err(e)) => Err(ResolveError::NotFound(format!(
            "`{host}` does not resolve: {e}"
        ))),
        Ok(Ok(list)) => {
            let mut ips: Vec<IpAddr> = Vec::new();
            for ip in list {
                if !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
            ips.sort_by_key(|ip| ip.is_ipv6());
            if ips.is_empty() {
                Err(ResolveError::NotFound(format!(
                    "`{host}` resolves to no address"
                )))
            } else {
                Ok(ips)
            }
        }
    }
}
