//! A host name resolved within a deadline: the system resolver has none of
//! its own (a dead DNS server holds a lookup for many seconds), so it runs
//! on a thread of its own, which is left to finish by itself when the
//! deadline passes.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

pub fn within(host: &str, port: u16, limit: Duration) -> Result<SocketAddr, String> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_string();
    std::thread::Builder::new()
        .name("resolve".into())
        .spawn(move || {
            let _ = tx.send(
                (name.as_str(), port)
                    .to_socket_addrs()
                    .map(|mut a| a.next()),
            );
        })
        .map_err(|e| format!("cannot resolve {host}: {e}"))?;
    match rx.recv_timeout(limit) {
        Ok(Ok(Some(a))) => Ok(a),
        Ok(Ok(None)) => Err(format!("{host} resolves to no address")),
        Ok(Err(e)) => Err(format!("{host} does not resolve: {e}")),
        Err(_) => Err(format!(
            "{host} did not resolve within {} ms",
            limit.as_millis()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names_resolve() {
        let a = within("127.0.0.1", 80, Duration::from_secs(1)).unwrap();
        assert_eq!(a, "127.0.0.1:80".parse().unwrap());
        assert!(within("localhost", 80, Duration::from_secs(5)).is_ok());
        let e = within("no-such-host.invalid", 80, Duration::from_secs(5)).unwrap_err();
        assert!(e.contains("no-such-host.invalid"), "{e}");
    }
}
