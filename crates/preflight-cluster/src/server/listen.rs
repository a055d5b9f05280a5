//! Where rank 0 listens: MASTER_ADDR's address where it is local, with an
//! accept queue as deep as the kernel allows.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

/// What `ServerConfig::bound` should hold for a listener on `addr`.
pub fn bound_name(addr: &str, listener: &TcpListener) -> Option<(String, SocketAddr)> {
    let bound = listener.local_addr().ok()?;
    if addr.parse::<std::net::IpAddr>().is_ok() && !bound.ip().is_unspecified() {
        return None;
    }
    Some((addr.to_string(), bound))
}

/// Binds the rendezvous port: MASTER_ADDR's address where it is local,
/// else every address (the master may be named by an alias).
pub async fn bind(addr: &str, port: u16) -> Result<TcpListener, std::io::Error> {
    let resolved: Vec<SocketAddr> = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::lookup_host((addr, port)),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "resolving timed out"))??
    .collect();
    let mut last = None;
    for a in &resolved {
        match listen(*a) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    // MASTER_ADDR is none of this host's addresses (a NAT or a virtual IP
    // in front of it): every interface, said in the report's warnings.
    match listen(SocketAddr::from(([0, 0, 0, 0], port))) {
        Ok(l) => Ok(l),
        Err(e) => Err(last.unwrap_or(e)),
    }
}

/// Thousands of ranks connect within milliseconds of each other: the
/// accept queue holds as many as the kernel allows (`net.core.somaxconn`
/// caps it), not the 1,024 of a default listener, whose overflow costs a
/// rank a SYN retransmit (1 s, then 3 s).
const BACKLOG: u32 = 65_535;

fn listen(addr: SocketAddr) -> Result<TcpListener, std::io::Error> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a port of a run that just ended, in
    // TIME_WAIT, is free to serve the next.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}
