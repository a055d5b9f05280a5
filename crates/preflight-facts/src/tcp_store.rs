//! PyTorch's TCPStore, read and never written: which of some keys exist
//! and their values, as a client of the job's own store. Only queries
//! that neither create nor change a key are sent (GETNUMKEYS, CHECK, then
//! GET of a key that exists), in the numbering of the torch the job runs,
//! which the caller learns from the job's own processes (see
//! `facts::torch_install`): torch up to 2.1 numbers GET 2, CHECK 4,
//! GETNUMKEYS 6; from 2.2 every connection opens with VALIDATE and the
//! queries move up by one. Sending 2.2's VALIDATE to an older server
//! stalls its single-threaded daemon, and the newer numbers would turn a
//! GET into an ADD there: so nothing is sent on a guess. A peer whose
//! answers are not a store's (an HTTP proxy on the port) is said to be no
//! store. Every value is bounded in size, and every wait has a deadline.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

/// The largest value read: arrival counters and addresses are short.
const MAX_VALUE: u64 = 64 << 10;
/// More keys than any job's store holds (a rank's few dozen, times the
/// ranks): an answer past it is not a key count.
const MOST_KEYS: i64 = 1 << 28;
/// torch 2.2 and later: the first query of a connection.
const VALIDATE: [u8; 5] = [0, 0xCE, 0xF7, 0x85, 0x3C];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbering {
    /// torch 1.13 to 2.1: SET 0, GET 2, CHECK 4, GETNUMKEYS 6.
    Old,
    /// torch 2.2 and later: VALIDATE 0 first, GET 3, CHECK 5, GETNUMKEYS 7.
    New,
}

impl Numbering {
    fn get(self) -> u8 {
        match self {
            Numbering::Old => 2,
            Numbering::New => 3,
        }
    }
    fn check(self) -> u8 {
        match self {
            Numbering::Old => 4,
            Numbering::New => 5,
        }
    }
    fn num_keys(self) -> u8 {
        match self {
            Numbering::Old => 6,
            Numbering::New => 7,
        }
    }
    /// The numbering of a torch of this version: 2.2 and later the new.
    pub fn of_torch(major: u32, minor: u32) -> Numbering {
        if (major, minor) >= (2, 2) {
            Numbering::New
        } else {
            Numbering::Old
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Numbering::Old => "torch 1.13 to 2.1",
            Numbering::New => "torch 2.2 or later",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreView {
    pub numbering: Numbering,
    /// How many keys the store holds.
    pub keys: Option<i64>,
    /// Each key asked for: its value, or `None` where it does not exist.
    pub values: Vec<(String, Option<Vec<u8>>)>,
}

fn connect(addr: SocketAddr, deadline: Instant) -> Result<TcpStream, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(format!("the store at {addr}: out of time"));
    }
    let s = TcpStream::connect_timeout(&addr, left)
        .map_err(|e| format!("cannot connect to the job's store at {addr}: {e}"))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Reads exactly `buf` by `deadline`, however slowly the peer sends.
fn read_full(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[off..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => off += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn send(s: &mut TcpStream, bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ErrorKind::TimedOut.into());
    }
    s.set_write_timeout(Some(left))?;
    s.write_all(bytes)
}

fn string(key: &str) -> Vec<u8> {
    let mut b = (key.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(key.as_bytes());
    b
}

/// Reads `keys` (wire keys, as the client sends them) from the store at
/// `addr`, which speaks `numbering` (`Numbering::of_torch`), all by
/// `deadline`.
pub fn read(
    addr: SocketAddr,
    numbering: Numbering,
    keys: &[String],
    deadline: Instant,
) -> Result<StoreView, String> {
    let mut s = connect(addr, deadline)?;
    let io = |e: std::io::Error| format!("the store at {addr}: {e}");
    if numbering == Numbering::New {
        send(&mut s, &VALIDATE, deadline).map_err(io)?;
    }
    send(&mut s, &[numbering.num_keys()], deadline).map_err(io)?;
    let mut n = [0u8; 8];
    read_full(&mut s, &mut n, deadline).map_err(io)?;
    let count = i64::from_le_bytes(n);
    if !(0..MOST_KEYS).contains(&count) {
        return Err(not_a_store(addr, "a key count", &n));
    }
    let keys_held = Some(count);
    let mut values = Vec::new();
    for key in keys {
        let mut q = vec![numbering.check()];
        q.extend_from_slice(&1u64.to_le_bytes());
        q.extend(string(key));
        send(&mut s, &q, deadline).map_err(io)?;
        let mut ready = [0u8; 1];
        read_full(&mut s, &mut ready, deadline).map_err(io)?;
        if ready[0] > 1 {
            return Err(not_a_store(addr, "CHECK's one-byte answer", &ready));
        }
        if ready[0] != 0 {
            values.push((key.clone(), None));
            continue;
        }
        let mut q = vec![numbering.get()];
        q.extend(string(key));
        send(&mut s, &q, deadline).map_err(io)?;
        let mut len = [0u8; 8];
        read_full(&mut s, &mut len, deadline).map_err(io)?;
        let len = u64::from_le_bytes(len);
        if len > MAX_VALUE {
            return Err(format!(
                "the store at {addr} sent a {len}-byte value for {key}: more than a counter"
            ));
        }
        let mut v = vec![0u8; len as usize];
        read_full(&mut s, &mut v, deadline).map_err(io)?;
        values.push((key.clone(), Some(v)));
    }
    // A store says nothing it was not asked; a proxy's page goes on.
    let _ = s.set_nonblocking(true);
    let mut extra = [0u8; 16];
    if let Ok(n @ 1..) = s.peek(&mut extra) {
        return Err(not_a_store(addr, "nothing more", &extra[..n]));
    }
    Ok(StoreView {
        numbering,
        keys: keys_held,
        values,
    })
}

/// `addr` answered as no store does: what was wanted, and what came.
fn not_a_store(addr: SocketAddr, wanted: &str, got: &[u8]) -> String {
    let shown: String = got
        .iter()
        .map(|b| match b {
            0x20..=0x7e => char::from(*b).to_string(),
            _ => format!("\\x{b:02x}"),
        })
        .collect();
    format!(
        "{addr} is no torch store: where a store sends {wanted}, it sent \"{shown}\"; the job's MASTER_ADDR:MASTER_PORT reaches something else (a proxy, another service)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// A store server of one numbering, over real sockets, that records
    /// every query type it is sent; its keys as given.
    fn server(
        numbering: Numbering,
        keys: BTreeMap<String, Vec<u8>>,
    ) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            for conn in l.incoming().take(2) {
                let Ok(mut c) = conn else { return };
                let log = Arc::clone(&log);
                let keys = keys.clone();
                std::thread::spawn(move || {
                    let read_str = |c: &mut TcpStream| -> Option<String> {
                        let mut n = [0u8; 8];
                        c.read_exact(&mut n).ok()?;
                        let mut b = vec![0u8; u64::from_le_bytes(n) as usize];
                        c.read_exact(&mut b).ok()?;
                        String::from_utf8(b).ok()
                    };
                    let mut first = true;
                    loop {
                        let mut q = [0u8; 1];
                        if c.read_exact(&mut q).is_err() {
                            break;
                        }
                        log.lock().unwrap().push(q[0]);
                        if numbering == Numbering::New && first {
                            first = false;
                            // 2.2+'s legacy server: VALIDATE or the door.
                            let mut magic = [0u8; 4];
                            if q[0] != 0
                                || c.read_exact(&mut magic).is_err()
                                || magic != VALIDATE[1..]
                            {
                                break;
                            }
                            continue;
                        }
                        match (numbering, q[0]) {
                            (Numbering::Old, 6) | (Numbering::New, 7) => {
                                let _ = c.write_all(&(keys.len() as i64).to_le_bytes());
                            }
                            (Numbering::Old, 4) | (Numbering::New, 5) => {
                                let mut n = [0u8; 8];
                                let _ = c.read_exact(&mut n);
                                let k = read_str(&mut c).unwrap_or_default();
                                let _ = c.write_all(&[u8::from(!keys.contains_key(&k))]);
                            }
                            (Numbering::Old, 2) | (Numbering::New, 3) => {
                                let k = read_str(&mut c).unwrap_or_default();
                                let v = keys.get(&k).cloned().unwrap_or_default();
                                let _ = c.write_all(&(v.len() as u64).to_le_bytes());
                                let _ = c.write_all(&v);
                            }
                            _ => return,
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    /// Each numbering is read; nothing but reads reaches the server (a
    /// write query in either numbering would be SET 0/1, COMPARE_SET 1/2,
    /// ADD 3/4 or DELETE 8), and the new one opens with VALIDATE.
    #[test]
    fn each_numbering_is_read_and_only_read() {
        let keys: BTreeMap<String, Vec<u8>> = [
            ("/default_pg/0/0/0".to_string(), b"addr0".to_vec()),
            ("init/".to_string(), b"4".to_vec()),
        ]
        .into();
        let wanted = vec![
            "/default_pg/0/0/0".to_string(),
            "/default_pg/0/0/1".to_string(),
        ];
        for numbering in [Numbering::Old, Numbering::New] {
            let (addr, seen) = server(numbering, keys.clone());
            let deadline = Instant::now() + Duration::from_secs(2);
            let v = read(addr, numbering, &wanted, deadline).unwrap();
            assert_eq!(v.numbering, numbering);
            assert_eq!(v.keys, Some(2));
            assert_eq!(
                v.values,
                vec![
                    (wanted[0].clone(), Some(b"addr0".to_vec())),
                    (wanted[1].clone(), None)
                ]
            );
            let sent = seen.lock().unwrap().clone();
            let reads: &[u8] = match numbering {
                Numbering::Old => &[6, 4, 2],
                Numbering::New => &[0, 7, 5, 3],
            };
            assert!(
                sent.iter().all(|q| reads.contains(q)),
                "{numbering:?}: {sent:?}"
            );
            if numbering == Numbering::New {
                assert_eq!(sent[0], 0, "VALIDATE first: {sent:?}");
            }
        }
        assert_eq!(Numbering::of_torch(1, 13), Numbering::Old);
        assert_eq!(Numbering::of_torch(2, 1), Numbering::Old);
        assert_eq!(Numbering::of_torch(2, 2), Numbering::New);
        assert_eq!(Numbering::of_torch(2, 15), Numbering::New);
    }

    /// A peer that answers as no store does (an HTTP proxy's page) is
    /// said to be no store, with what it sent, not read as a count.
    #[test]
    fn a_proxy_on_the_port_is_no_store() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in l.incoming().take(2) {
                let Ok(mut c) = conn else { return };
                let mut b = [0u8; 64];
                let _ = c.read(&mut b);
                let _ = c.write_all(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        });
        for numbering in [Numbering::Old, Numbering::New] {
            let deadline = Instant::now() + Duration::from_secs(2);
            let e = read(addr, numbering, &["k".to_string()], deadline).unwrap_err();
            assert!(
                e.contains("is no torch store") && e.contains("HTTP/1.1"),
                "{e}"
            );
        }
    }

    /// A store that answers nothing is cut at the deadline, and one that
    /// trickles its answer too.
    #[test]
    fn a_silent_or_slow_peer_is_cut_at_the_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            // Takes what it is sent, answers nothing.
            if let Ok((mut c, _)) = l.accept() {
                let mut b = [0u8; 64];
                while let Ok(n) = c.read(&mut b) {
                    if n == 0 {
                        break;
                    }
                }
            }
        });
        let start = Instant::now();
        let e = read(
            addr,
            Numbering::New,
            &[],
            start + Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(!e.is_empty());
        assert!(start.elapsed() < Duration::from_secs(2));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut c, _)) = l.accept() {
                let mut q = [0u8; 1];
                let _ = c.read(&mut q);
                for _ in 0..1000 {
                    if c.write_all(&[0]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        let start = Instant::now();
        assert!(
            read(
                addr,
                Numbering::Old,
                &[],
                start + Duration::from_millis(400)
            )
            .is_err()
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_value_past_the_bound_is_refused() {
        let big: BTreeMap<String, Vec<u8>> = [("k".to_string(), vec![b'x'; 70_000])].into();
        let (addr, _) = server(Numbering::Old, big);
        let deadline = Instant::now() + Duration::from_secs(2);
        let e = read(addr, Numbering::Old, &["k".to_string()], deadline).unwrap_err();
        assert!(e.contains("more than a counter"), "{e}");
    }
}
