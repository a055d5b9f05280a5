//! Name resolution under a deadline. getaddrinfo blocks and can hang on a
//! dead DNS server, so it runs on a thread of its own (or tokio's blocking
//! pool) and the caller stops waiting at the deadline.

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

fn literal(host: &str) -> Option<IpAddr> {
    host.trim_matches(['[', ']']).parse().ok()
}

/// The answer, duplicates removed, IPv4 first (what the job's libraries
/// try first).
fn addresses(
    host: &str,
    answer: std::io::Result<Vec<IpAddr>>,
) -> Result<Vec<IpAddr>, ResolveError> {
    let list =
        answer.map_err(|e| ResolveError::NotFound(format!("`{host}` does not resolve: {e}")))?;
    let mut ips: Vec<IpAddr> = Vec::new();
    for ip in list {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips.sort_by_key(IpAddr::is_ipv6);
    if ips.is_empty() {
        return Err(ResolveError::NotFound(format!(
            "`{host}` resolves to no address"
        )));
    }
    Ok(ips)
}

/// The addresses `host` resolves to.
pub async fn resolve(host: &str, limit: Duration) -> Result<Vec<IpAddr>, ResolveError> {
    if let Some(ip) = literal(host) {
        return Ok(vec![ip]);
    }
    let lookup = tokio::net::lookup_host((host.to_string(), 0));
    match tokio::time::timeout(limit, lookup).await {
        Err(_) => Err(ResolveError::TimedOut(limit)),
        Ok(answer) => addresses(
            host,
            answer.map(|a| a.map(|s: SocketAddr| s.ip()).collect()),
        ),
    }
}

/// Blocking form, for probes that already run on the blocking pool. The
/// lookup runs on its own thread so the deadline holds even when
/// getaddrinfo hangs; that thread is left to finish on its own.
pub fn resolve_blocking(host: &str, limit: Duration) -> Result<Vec<IpAddr>, ResolveError> {
    if let Some(ip) = literal(host) {
        return Ok(vec![ip]);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = host.to_string();
    std::thread::spawn(move || {
        use std::net::ToSocketAddrs;
        let answer = (owned.as_str(), 0)
            .to_socket_addrs()
            .map(|a| a.map(|s| s.ip()).collect::<Vec<_>>());
        let _ = tx.send(answer);
    });
    match rx.recv_timeout(limit) {
        Err(_) => Err(ResolveError::TimedOut(limit)),
        Ok(answer) => addresses(host, answer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_localhost() {
        let limit = Duration::from_secs(5);
        assert_eq!(
            resolve_blocking("[::1]", limit).unwrap(),
            vec![IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])]
        );
        let local = resolve_blocking("localhost", limit).unwrap();
        // /etc/hosts answers; no DNS query leaves the machine.
        assert!(local.iter().all(IpAddr::is_loopback), "{local:?}");
    }
}
