//! A process's TCP sockets, read as the kernel shows them: the socket
//! inodes its descriptors point to (`/proc/PID/fd`), looked up in its
//! network namespace's tables (`/proc/PID/net/tcp`, `tcp6`): each one's
//! addresses, state, and the bytes waiting in its queues (unsent in the
//! send queue; unread in the receive queue, which is how a rank that
//! stopped reading shows while its peers' data piles up).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpSocket {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// `established`, `listen`, `syn_sent`, ...
    pub state: &'static str,
    /// Bytes written and not yet acknowledged by the peer.
    pub unsent: u64,
    /// Bytes received and not yet read by the process.
    pub unread: u64,
    pub inode: u64,
    /// The kernel's timer on it: 1 retransmission (data sent and not
    /// acknowledged), 4 zero-window probe (the peer's receive window is
    /// full: it does not read), 0 none, 2 keepalive, 3 TIME_WAIT.
    pub timer: u8,
    /// Unanswered retransmissions of its oldest unacknowledged data.
    pub retransmits: u32,
}

/// The TCP sockets of the process at `proc_pid`; empty when its
/// descriptors cannot be read (another user's process, a gone one).
pub fn of_process(proc_pid: &Path) -> Vec<TcpSocket> {
    let Ok(fds) = std::fs::read_dir(proc_pid.join("fd")) else {
        return Vec::new();
    };
    let inodes: Vec<u64> = fds
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    if inodes.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (table, v6) in [("net/tcp", false), ("net/tcp6", true)] {
        if let Ok(text) = std::fs::read_to_string(proc_pid.join(table)) {
            out.extend(
                parse_table(&text, v6)
                    .into_iter()
                    .filter(|s| inodes.contains(&s.inode)),
            );
        }
    }
    out
}

/// Every socket of one table's text: the kernel's, or garbage.
pub fn parse_table(text: &str, v6: bool) -> Vec<TcpSocket> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            let f: Vec<&str> = line.split_whitespace().collect();
            let (tx, rx) = f.get(4)?.split_once(':')?;
            let timer = f.get(5)?.split_once(':')?.0;
            Some(TcpSocket {
                local: addr(f.get(1)?, v6)?,
                remote: addr(f.get(2)?, v6)?,
                state: state(u8::from_str_radix(f.get(3)?, 16).ok()?),
                unsent: u64::from_str_radix(tx, 16).ok()?,
                unread: u64::from_str_radix(rx, 16).ok()?,
                inode: f.get(9)?.parse().ok()?,
                timer: u8::from_str_radix(timer, 16).ok()?,
                retransmits: u32::from_str_radix(f.get(6)?, 16).ok()?,
            })
        })
        .collect()
}

/// `0100007F:1F90` (IPv4, the address in the host's byte order) or 32
/// hex digits of four host-order words (IPv6), then the port.
fn addr(text: &str, v6: bool) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = if v6 {
        if ip.len() != 32 {
            return None;
        }
        let mut bytes = [0u8; 16];
        for w in 0..4 {
            let word = u32::from_str_radix(ip.get(w * 8..w * 8 + 8)?, 16).ok()?;
            bytes[w * 4..w * 4 + 4].copy_from_slice(&word.to_le_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(bytes))
    } else {
        let word = u32::from_str_radix(ip, 16).ok()?;
        IpAddr::V4(Ipv4Addr::from(word.to_le_bytes()))
    };
    Some(SocketAddr::new(ip, port))
}

fn state(code: u8) -> &'static str {
    match code {
        1 => "established",
        2 => "syn_sent",
        3 => "syn_recv",
        4 => "fin_wait1",
        5 => "fin_wait2",
        6 => "time_wait",
        7 => "close",
        8 => "close_wait",
        9 => "last_ack",
        10 => "listen",
        11 => "closing",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_tables() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:7531 0100007F:A2C4 01 00000000:0001F400 00:00000000 00000000     0        0 12345 1 0 20 4 30 10 -1\n   1: garbage\n";
        let s = parse_table(v4, false);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].local, "127.0.0.1:30001".parse().unwrap());
        assert_eq!(s[0].remote, "127.0.0.1:41668".parse().unwrap());
        assert_eq!(s[0].state, "established");
        assert_eq!((s[0].unsent, s[0].unread, s[0].inode), (0, 128_000, 12345));
        assert_eq!((s[0].timer, s[0].retransmits), (0, 0));
        let lossy = "  sl local rem st tx:rx tr when retr uid timeout inode\n   0: 0100007F:7531 0200007F:A2C4 01 00003000:00000000 01:0000012C 00000005     0        0 9 1\n";
        let s = parse_table(lossy, false);
        assert_eq!((s[0].unsent, s[0].timer, s[0].retransmits), (0x3000, 1, 5));
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1\n";
        let s = parse_table(v6, true);
        assert_eq!(s[0].local, "[::1]:8080".parse().unwrap());
        assert_eq!(s[0].state, "listen");
    }

    /// A listener of this process's own, found through its descriptors.
    #[test]
    fn finds_this_processs_own_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mine = of_process(Path::new("/proc/self"));
        assert!(
            mine.iter()
                .any(|s| s.local.port() == port && s.state == "listen"),
            "{mine:?}"
        );
    }
}
