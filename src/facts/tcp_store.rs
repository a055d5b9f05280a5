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
use std::time::Duration;

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

fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, String> {
    let s = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("cannot connect to the job's store at {addr}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Which numbering the server at `addr` speaks (and, for the old one, how
/// many keys it holds).
pub fn probe(addr: SocketAddr, timeout: Duration) -> Result<(Numbering, Option<i64>), String> {
    let mut s = connect(addr, timeout)?;
    s.write_all(&[6])
        .map_err(|e| format!("the store at {addr}: {e}"))?;
    let mut n = [0u8; 8];
    match s.read_exact(&mut n) {
        Ok(()) => Ok((Numbering::Old, Some(i64::from_le_bytes(n)))),
        // Closed (2.2+'s legacy server), or silent (2.2+'s libuv server).
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::WouldBlock
                    | ErrorKind::TimedOut
            ) =>
        {
            Ok((Numbering::New, None))
        }
        Err(e) => Err(format!("the store at {addr}: {e}")),
    }
}

fn string(key: &str) -> Vec<u8> {
    let mut b = (key.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(key.as_bytes());
    b
}

/// Reads `keys` (wire keys, as the client sends them) from the store at
/// `addr`, each step within `timeout`.
pub fn read(addr: SocketAddr, keys: &[String], timeout: Duration) -> Result<StoreView, String> {
    let (numbering, probed) = probe(addr, timeout)?;
    let mut s = connect(addr, timeout)?;
    let io = |e: std::io::Error| format!("the store at {addr}: {e}");
    if numbering == Numbering::New {
        s.write_all(&VALIDATE).map_err(io)?;
    }
    let mut keys_held = probed;
    if numbering == Numbering::New {
        s.write_all(&[numbering.num_keys()]).map_err(io)?;
        let mut n = [0u8; 8];
        s.read_exact(&mut n).map_err(io)?;
        keys_held = Some(i64::from_le_bytes(n));
    }
    let mut values = Vec::new();
    for key in keys {
        let mut q = vec![numbering.check()];
        q.extend_from_slice(&1u64.to_le_bytes());
        q.extend(string(key));
        s.write_all(&q).map_err(io)?;
        let mut ready = [0u8; 1];
        s.read_exact(&mut ready).map_err(io)?;
        if ready[0] != 0 {
            values.push((key.clone(), None));
            continue;
        }
        let mut q = vec![numbering.get()];
        q.extend(string(key));
        s.write_all(&q).map_err(io)?;
        let mut len = [0u8; 8];
        s.read_exact(&mut len).map_err(io)?;
        let len = u64::from_le_bytes(len);
        if len > MAX_VALUE {
            return Err(format!(
                "the store at {addr} sent a {len}-byte value for {key}: more than a counter"
            ));
        }
        let mut v = vec![0u8; len as usize];
        s.read_exact(&mut v).map_err(io)?;
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
            let v = read(addr, &wanted, Duration::from_millis(300)).unwrap();
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

    #[test]
    fn a_value_past_the_bound_is_refused() {
        let big: BTreeMap<String, Vec<u8>> = [("k".to_string(), vec![b'x'; 70_000])].into();
        let (addr, _) = server(Numbering::Old, big);
        let e = read(addr, &["k".to_string()], Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("more than a counter"), "{e}");
    }
}
