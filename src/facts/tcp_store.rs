//! PyTorch's TCPStore, read and never written: which of some keys exist
//! and their values, as a client of the job's own store. Only queries
//! that neither create nor change a key are sent (CHECK, then GET of a key
//! that exists; GETNUMKEYS), in the numbering the server speaks, which is
//! found first by a probe that is harmless in every version: one byte, 6,
//! which torch up to 2.1 reads as GETNUMKEYS (and answers with 8 bytes),
//! and torch 2.2 and later, whose first query must be VALIDATE, either
//! closes (the legacy server) or ignores (libuv). Sending 2.2's VALIDATE
//! to an older server would stall its single-threaded daemon, and the
//! newer numbers would turn a GET into an ADD there: so nothing is
//! guessed. Every value is bounded in size, and every wait has a deadline.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

/// The largest value read: arrival counters and addresses are short.
const MAX_VALUE: u64 = 64 << 10;
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

/// Which numbering the server at `addr` speaks (and, for the old one, how
/// many keys it holds), by `deadline`. A server that neither answers nor
/// closes is not guessed at: it may be an old one that is busy (to which
/// the new numbering's VALIDATE would do harm) or torch 2.4's libuv store
/// (which ignores the probe): either way it is not read.
pub fn probe(addr: SocketAddr, deadline: Instant) -> Result<(Numbering, Option<i64>), String> {
    let mut s = connect(addr, deadline)?;
    send(&mut s, &[6], deadline).map_err(|e| format!("the store at {addr}: {e}"))?;
    let mut n = [0u8; 8];
    match read_full(&mut s, &mut n, deadline) {
        Ok(()) => Ok((Numbering::Old, Some(i64::from_le_bytes(n)))),
        // Closed at once: 2.2+'s legacy server, which wants VALIDATE first.
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
            ) =>
        {
            Ok((Numbering::New, None))
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(format!(
            "the store at {addr} answered no probe in time (a busy store, or torch 2.4+'s libuv store, which answers none): not read, rather than guessed at"
        )),
        Err(e) => Err(format!("the store at {addr}: {e}")),
    }
}

fn string(key: &str) -> Vec<u8> {
    let mut b = (key.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(key.as_bytes());
    b
}

/// Reads `keys` (wire keys, as the client sends them) from the store at
/// `addr`, which speaks `numbering` (see `probe`), all by `deadline`.
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
    let keys_held = Some(i64::from_le_bytes(n));
    let mut values = Vec::new();
    for key in keys {
        let mut q = vec![numbering.check()];
        q.extend_from_slice(&1u64.to_le_bytes());
        q.extend(string(key));
        send(&mut s, &q, deadline).map_err(io)?;
        let mut ready = [0u8; 1];
        read_full(&mut s, &mut ready, deadline).map_err(io)?;
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
    Ok(StoreView {
        numbering,
        keys: keys_held,
        values,
    })
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

    /// Both numberings are found and read; nothing but reads reaches the
    /// server (a write query in either numbering would be SET 0/1,
    /// COMPARE_SET 1/2, ADD 3/4 or DELETE 8).
    #[test]
    fn each_numbering_is_found_and_only_read() {
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
            let (found, _) = probe(addr, deadline).unwrap();
            let v = read(addr, found, &wanted, deadline).unwrap();
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
                // The probe's 6 closes the connection; then VALIDATE.
                Numbering::New => &[6, 0, 7, 5, 3],
            };
            assert!(
                sent.iter().all(|q| reads.contains(q)),
                "{numbering:?}: {sent:?}"
            );
            if numbering == Numbering::New {
                assert_eq!(
                    sent[1], 0,
                    "VALIDATE first on the second connection: {sent:?}"
                );
            }
        }
    }

    /// A store that answers nothing to the probe is not read (no VALIDATE
    /// is ever sent on a guess), and a peer that trickles its answer is
    /// cut at the deadline.
    #[test]
    fn a_silent_store_is_not_guessed_at_and_a_slow_one_is_cut() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&got);
        std::thread::spawn(move || {
            // Takes what it is sent, answers nothing.
            if let Ok((mut c, _)) = l.accept() {
                let mut b = [0u8; 64];
                while let Ok(n) = c.read(&mut b) {
                    if n == 0 {
                        break;
                    }
                    log.lock().unwrap().extend_from_slice(&b[..n]);
                }
            }
        });
        let start = Instant::now();
        let e = probe(addr, start + Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("not read, rather than guessed at"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
        assert_eq!(*got.lock().unwrap(), vec![6], "only the probe's byte");
        // An old store that answers a byte at a time, forever.
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
        assert!(probe(addr, start + Duration::from_millis(400)).is_err());
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
