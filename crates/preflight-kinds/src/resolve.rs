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
                preflight_ground::values::format_duration(*d)
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

/// Resolution as the node under `--root` would do it: on the real root the
/// system resolver; under a fixture tree only the tree's /etc/hosts, since
/// asking this machine's resolver about another machine's names means
/// nothing.
pub fn resolve_on_node(
    facts: &preflight_facts::Facts,
    host: &str,
    limit: Duration,
) -> Result<Vec<IpAddr>, ResolveError> {
    if facts.root == std::path::Path::new("/") || literal(host).is_some() {
        return resolve_blocking(host, limit);
    }
    let hosts = facts.host_path("/etc/hosts");
    let text = std::fs::read_to_string(&hosts).unwrap_or_default();
    addresses(host, Ok(hosts_entries(&text, host))).map_err(|_| {
        ResolveError::NotFound(format!(
            "`{host}` is not in {} (under --root, names resolve from the tree's /etc/hosts only)",
            hosts.display()
        ))
    })
}

/// The addresses /etc/hosts text gives a name, in file order.
fn hosts_entries(text: &str, host: &str) -> Vec<IpAddr> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let ip: IpAddr = fields.next()?.parse().ok()?;
            fields
                .any(|name| name.eq_ignore_ascii_case(host))
                .then_some(ip)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn hosts_file_entries() {
        let text = "127.0.0.1 localhost\n127.0.1.1 node7 # Debian\n10.0.0.7 node7.cluster node7\n";
        let ips = super::hosts_entries(text, "node7");
        assert_eq!(
            ips,
            vec![IpAddr::from([127, 0, 1, 1]), IpAddr::from([10, 0, 0, 7])]
        );
        assert!(super::hosts_entries(text, "node8").is_empty());
    }

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
