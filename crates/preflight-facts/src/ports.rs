//! Whether a TCP port can be bound on this node, probed once per address
//! and port per run. Two checks that probe one port (MASTER_PORT inside
//! the 29500-29510 range the rendezvous check covers) share the one
//! probe: probing it twice at once would make each find the other's
//! socket and report a healthy port as taken.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Mutex;

use socket2::{Domain, Socket, Type};

/// What binding a port found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bind {
    Free,
    /// Another socket holds it (EADDRINUSE).
    InUse,
    /// The address is not one of this node's (EADDRNOTAVAIL).
    NotAvailable,
    /// Any other error, in words.
    Failed(String),
}

/// The probes of one run.
#[derive(Default)]
pub struct PortProbes {
    // Held while a port is probed: a second check waits for the first's
    // answer instead of racing it.
    done: Mutex<HashMap<SocketAddr, Bind>>,
}

impl PortProbes {
    pub fn bind(&self, address: SocketAddr) -> Bind {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        done.entry(address)
            .or_insert_with(|| match try_bind(address) {
                Ok(()) => Bind::Free,
                Err(e) if e.kind() == ErrorKind::AddrInUse => Bind::InUse,
                Err(e) if e.kind() == ErrorKind::AddrNotAvailable => Bind::NotAvailable,
                Err(e) => Bind::Failed(e.to_string()),
            })
            .clone()
    }
}

/// Binds like the job's listener: SO_REUSEADDR set, as PyTorch's TCPStore
/// does, so a port only in TIME_WAIT is free, as it is for the job.
fn try_bind(address: SocketAddr) -> std::io::Result<()> {
    let domain = if address.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let socket = Socket::new(domain, Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&address.into())?;
    socket.listen(1)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_probed_once_and_its_answer_shared() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = held.local_addr().unwrap();
        let probes = PortProbes::default();
        assert_eq!(probes.bind(taken), Bind::InUse);
        // Freed since: the run keeps the answer it found, so every check
        // of this run agrees about the port.
        drop(held);
        assert_eq!(probes.bind(taken), Bind::InUse);
        assert_eq!(PortProbes::default().bind(taken), Bind::Free);
    }

    /// Many checks probing one free port at once, as the engine runs them:
    /// every one finds it free. Without the shared probe, two binds at the
    /// same moment each see the other's socket.
    #[test]
    fn concurrent_probes_of_one_port_agree_that_it_is_free() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        for _ in 0..50 {
            let probes = PortProbes::default();
            let answers: Vec<Bind> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..8).map(|_| s.spawn(|| probes.bind(port))).collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(answers.iter().all(|a| *a == Bind::Free), "{answers:?}");
        }
    }
}
