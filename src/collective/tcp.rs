//! The built-in TCP backend (the Gloo analogue): a full mesh of TCP
//! connections set up through the rendezvous store, on the address of the
//! interface GLOO_SOCKET_IFNAME names or else the one this rank reaches the
//! master from (the route's choice). Ring algorithms for allreduce
//! (reduce-scatter then allgather, received in chunks and reduced as they
//! arrive while the send runs) and allgather, a pipelined chain for
//! broadcast, a dissemination barrier. Any world size, 1 included.
//!
//! Every read and write runs under the operation's deadline; a timeout
//! says which peer stopped sending or receiving.

use std::cell::Cell;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::{Backend, Dtype, OpError};
use crate::cluster::store;

/// Receive granularity: a chunk is reduced while the next is in flight.
const CHUNK: usize = 512 << 10;
const MAGIC: &[u8; 4] = b"PFC1";

pub struct Tcp {
    rank: u32,
    world: u32,
    readers: Vec<Option<OwnedReadHalf>>,
    writers: Vec<Option<OwnedWriteHalf>>,
    /// Receive buffer of the reduce-scatter, kept between calls: a fresh
    /// one per call costs a page fault per 4 KiB inside the timed region.
    scratch: Vec<u8>,
}

/// The address to listen on: GLOO_SOCKET_IFNAME's interface's IPv4
/// address when set, else `route_ip` (the address the rendezvous
/// connection left from, i.e. the route's choice).
pub fn listen_ip(ifname: Option<&str>, route_ip: &str) -> Result<String, String> {
    let Some(name) = ifname.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(route_ip.to_string());
    };
    // Gloo takes the first name of a comma-separated list.
    let name = name.split(',').next().unwrap_or(name);
    let addrs = nix::ifaddrs::getifaddrs()
        .map_err(|e| format!("cannot list interfaces for GLOO_SOCKET_IFNAME={name}: {e}"))?;
    for a in addrs {
        if a.interface_name != name {
            continue;
        }
        if let Some(sin) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
            return Ok(sin.ip().to_string());
        }
    }
    Err(format!(
        "GLOO_SOCKET_IFNAME={name}: no interface of that name with an IPv4 address on this node"
    ))
}

fn closed(peer: u32, e: &std::io::Error) -> OpError {
    let detail = match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "end of stream: the process is gone?".to_string(),
        _ => e.to_string(),
    };
    OpError::Closed { peer, detail }
}

impl Tcp {
    /// Listens, publishes the address in the store, and connects the
    /// mesh: rank r dials every lower rank and accepts every higher one.
    pub async fn init(
        conn: &mut TcpStream,
        rank: u32,
        world: u32,
        ip: &str,
        deadline: Instant,
    ) -> Result<Tcp, String> {
        let n = world as usize;
        let mut readers: Vec<Option<OwnedReadHalf>> = (0..n).map(|_| None).collect();
        let mut writers: Vec<Option<OwnedWriteHalf>> = (0..n).map(|_| None).collect();
        if world <= 1 {
            return Ok(Tcp {
                rank,
                world,
                readers,
                writers,
                scratch: Vec::new(),
            });
        }
        let listener = TcpListener::bind((ip, 0))
            .await
            .map_err(|e| format!("cannot listen on {ip}: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("listener address: {e}"))?
            .to_string();
        store::set(conn, &format!("coll/tcp/addr/{rank}"), &addr, deadline)
            .await
            .map_err(|e| format!("cannot publish this rank's address in the store: {e}"))?;
        let mut peers = Vec::new();
        for j in 0..rank {
            let wait = deadline.saturating_duration_since(Instant::now());
            let a = store::get(conn, &format!("coll/tcp/addr/{j}"), wait, deadline)
                .await
                .map_err(|e| format!("store: {e}"))?
                .ok_or_else(|| format!("rank {j} never published its address"))?;
            peers.push((j, a));
        }
        let dial = async {
            let mut out = Vec::new();
            for (j, a) in peers {
                let mut s = loop {
                    match TcpStream::connect(a.as_str()).await {
                        Ok(s) => break s,
                        Err(e) if Instant::now() + Duration::from_millis(50) < deadline => {
                            let _ = e;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => return Err(format!("cannot connect to rank {j} at {a}: {e}")),
                    }
                };
                let _ = s.set_nodelay(true);
                let mut hello = Vec::from(&MAGIC[..]);
                hello.extend_from_slice(&rank.to_le_bytes());
                s.write_all(&hello)
                    .await
                    .map_err(|e| format!("rank {j} at {a}: {e}"))?;
                out.push((j, s));
            }
            Ok::<_, String>(out)
        };
        let accept = async {
            let mut out = Vec::new();
            while out.len() < (world - 1 - rank) as usize {
                let (mut s, peer) = listener
                    .accept()
                    .await
                    .map_err(|e| format!("accept: {e}"))?;
                let mut hello = [0u8; 8];
                // A stranger that connects and says nothing is dropped
                // when the whole init deadline ends.
                if s.read_exact(&mut hello).await.is_err() || &hello[..4] != MAGIC {
                    continue;
                }
                let j = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]);
                if j <= rank || j >= world || out.iter().any(|(k, _)| *k == j) {
                    return Err(format!("unexpected peer {peer} claiming rank {j}"));
                }
                let _ = s.set_nodelay(true);
                out.push((j, s));
            }
            Ok::<_, String>(out)
        };
        let (dialed, accepted) =
            tokio::time::timeout_at(deadline, async { tokio::join!(dial, accept) })
                .await
                .map_err(|_| {
                    "connecting the mesh timed out: some peer did not connect or accept".to_string()
                })?;
        for (j, s) in dialed?.into_iter().chain(accepted?) {
            let (r, w) = s.into_split();
            readers[j as usize] = Some(r);
            writers[j as usize] = Some(w);
        }
        Ok(Tcp {
            rank,
            world,
            readers,
            writers,
            scratch: Vec::new(),
        })
    }

    fn right(&self) -> u32 {
        (self.rank + 1) % self.world
    }

    fn left(&self) -> u32 {
        (self.rank + self.world - 1) % self.world
    }

    /// Sends `send` to `to` while receiving into `recv` from `from`,
    /// handing each received chunk to `each(offset, chunk)`.
    async fn exchange(
        &mut self,
        send: &[u8],
        to: u32,
        recv: &mut [u8],
        from: u32,
        deadline: Instant,
        mut each: impl FnMut(usize, &[u8]),
    ) -> Result<(), OpError> {
        let total_recv = recv.len();
        let sent = Cell::new(0usize);
        let got = Cell::new(0usize);
        let (Some(Some(rd)), Some(Some(wr))) = (
            self.readers.get_mut(from as usize),
            self.writers.get_mut(to as usize),
        ) else {
            return Err(OpError::Other {
                detail: format!("no connection to rank {to} or from rank {from}"),
            });
        };
        let write = async {
            for c in send.chunks(CHUNK) {
                wr.write_all(c).await.map_err(|e| closed(to, &e))?;
                sent.set(sent.get() + c.len());
            }
            Ok::<(), OpError>(())
        };
        let read = async {
            let mut off = 0;
            while off < recv.len() {
                let end = (off + CHUNK).min(recv.len());
                rd.read_exact(&mut recv[off..end])
                    .await
                    .map_err(|e| closed(from, &e))?;
                each(off, &recv[off..end]);
                off = end;
                got.set(off);
            }
            Ok::<(), OpError>(())
        };
        match tokio::time::timeout_at(deadline, async { tokio::try_join!(write, read) }).await {
            Ok(r) => r.map(|_| ()),
            Err(_) if got.get() < total_recv => Err(OpError::RecvTimeout { from }),
            Err(_) if sent.get() < send.len() => Err(OpError::SendTimeout { to }),
            Err(_) => Ok(()),
        }
    }
}

/// The element ranges of `count` elements split into `n` near-equal parts.
pub fn segments(count: usize, n: usize) -> Vec<std::ops::Range<usize>> {
    (0..n).map(|k| k * count / n..(k + 1) * count / n).collect()
}

fn byte_range(r: &std::ops::Range<usize>) -> std::ops::Range<usize> {
    r.start * Dtype::SIZE..r.end * Dtype::SIZE
}

/// `dst += src`, element-wise.
pub fn reduce(dst: &mut [u8], src: &[u8], dtype: Dtype) {
    match dtype {
        Dtype::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                let v = f32::from_le_bytes([d[0], d[1], d[2], d[3]])
                    + f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        Dtype::I32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                let v = i32::from_le_bytes([d[0], d[1], d[2], d[3]])
                    .wrapping_add(i32::from_le_bytes([s[0], s[1], s[2], s[3]]));
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

impl Backend for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn rank(&self) -> u32 {
        self.rank
    }

    fn world(&self) -> u32 {
        self.world
    }

    async fn allreduce(
        &mut self,
        buf: &mut [u8],
        dtype: Dtype,
        deadline: Instant,
    ) -> Result<(), OpError> {
        let n = self.world as usize;
        if n <= 1 {
            return Ok(());
        }
        let segs = segments(buf.len() / Dtype::SIZE, n);
        let r = self.rank as usize;
        let (to, from) = (self.right(), self.left());
        let longest = segs.iter().map(|s| s.len()).max().unwrap_or(0) * Dtype::SIZE;
        let mut tmp = std::mem::take(&mut self.scratch);
        if tmp.len() < longest {
            tmp.resize(longest, 0);
        }
        // Reduce-scatter: after n-1 steps segment (r+1)%n holds the sum.
        for step in 0..n - 1 {
            let s_idx = (r + n - step) % n;
            let r_idx = (r + n - step - 1) % n;
            let sb = byte_range(&segs[s_idx]);
            let rb = byte_range(&segs[r_idx]);
            let recv = &mut tmp[..rb.len()];
            let (send, dst) = split_pair(buf, sb, rb);
            let done = self
                .exchange(send, to, recv, from, deadline, |off, chunk| {
                    reduce(&mut dst[off..off + chunk.len()], chunk, dtype)
                })
                .await;
            if let Err(e) = done {
                self.scratch = tmp;
                return Err(e);
            }
        }
        self.scratch = tmp;
        // Allgather of the reduced segments.
        for step in 0..n - 1 {
            let s_idx = (r + 1 + n - step) % n;
            let r_idx = (r + n - step) % n;
            let sb = byte_range(&segs[s_idx]);
            let rb = byte_range(&segs[r_idx]);
            let (send, recv) = split_pair(buf, sb, rb);
            self.exchange(send, to, recv, from, deadline, |_, _| {})
                .await?;
        }
        Ok(())
    }

    async fn broadcast(
        &mut self,
        buf: &mut [u8],
        root: u32,
        deadline: Instant,
    ) -> Result<(), OpError> {
        let n = self.world;
        if n <= 1 {
            return Ok(());
        }
        // A chain from the root around the ring, chunk by chunk: each
        // chunk is forwarded as soon as it has arrived.
        let (to, from) = (self.right(), self.left());
        let forward = to != root;
        let receive = self.rank != root;
        let mut off = 0;
        while off < buf.len() {
            let end = (off + CHUNK).min(buf.len());
            if receive {
                let Some(Some(rd)) = self.readers.get_mut(from as usize) else {
                    return Err(OpError::Other {
                        detail: format!("no connection from rank {from}"),
                    });
                };
                match tokio::time::timeout_at(deadline, rd.read_exact(&mut buf[off..end])).await {
                    Err(_) => return Err(OpError::RecvTimeout { from }),
                    Ok(Err(e)) => return Err(closed(from, &e)),
                    Ok(Ok(_)) => {}
                }
            }
            if forward {
                let Some(Some(wr)) = self.writers.get_mut(to as usize) else {
                    return Err(OpError::Other {
                        detail: format!("no connection to rank {to}"),
                    });
                };
                match tokio::time::timeout_at(deadline, wr.write_all(&buf[off..end])).await {
                    Err(_) => return Err(OpError::SendTimeout { to }),
                    Ok(Err(e)) => return Err(closed(to, &e)),
                    Ok(Ok(())) => {}
                }
            }
            off = end;
        }
        Ok(())
    }

    async fn allgather(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        deadline: Instant,
    ) -> Result<(), OpError> {
        let n = self.world as usize;
        let block = input.len();
        if out.len() != block * n {
            return Err(OpError::Other {
                detail: "allgather: output is not world × input".into(),
            });
        }
        let r = self.rank as usize;
        out[r * block..(r + 1) * block].copy_from_slice(input);
        let (to, from) = (self.right(), self.left());
        for step in 0..n.saturating_sub(1) {
            let s_idx = (r + n - step) % n;
            let r_idx = (r + n - step - 1) % n;
            let (send, recv) = split_pair(
                out,
                s_idx * block..(s_idx + 1) * block,
                r_idx * block..(r_idx + 1) * block,
            );
            self.exchange(send, to, recv, from, deadline, |_, _| {})
                .await?;
        }
        Ok(())
    }

    async fn sendrecv(
        &mut self,
        send: &[u8],
        to: u32,
        recv: &mut [u8],
        from: u32,
        deadline: Instant,
    ) -> Result<(), OpError> {
        if self.world <= 1 {
            recv.copy_from_slice(send);
            return Ok(());
        }
        self.exchange(send, to, recv, from, deadline, |_, _| {})
            .await
    }

    async fn barrier(&mut self, deadline: Instant) -> Result<(), OpError> {
        let n = self.world;
        let mut k = 1;
        while k < n {
            let to = (self.rank + k) % n;
            let from = (self.rank + n - k) % n;
            let mut got = [0u8; 1];
            self.exchange(&[1], to, &mut got, from, deadline, |_, _| {})
                .await?;
            k *= 2;
        }
        Ok(())
    }

    fn abort(&mut self) {
        // Dropping the halves closes the sockets: peers blocked on this
        // rank see the end of the stream at once.
        self.readers.iter_mut().for_each(|r| *r = None);
        self.writers.iter_mut().for_each(|w| *w = None);
    }
}

/// Two disjoint ranges of one buffer, the first to read, the second to
/// write.
fn split_pair(
    buf: &mut [u8],
    a: std::ops::Range<usize>,
    b: std::ops::Range<usize>,
) -> (&[u8], &mut [u8]) {
    // Empty ranges may share a start: order by where `a` ends.
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_every_element_once() {
        for count in [0, 1, 2, 5, 7, 1000] {
            for n in 1..7 {
                let s = segments(count, n);
                assert_eq!(s.len(), n);
                assert_eq!(s[0].start, 0);
                assert_eq!(s[n - 1].end, count);
                for w in s.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
            }
        }
    }

    #[test]
    fn split_pair_either_order() {
        let mut b = [0u8, 1, 2, 3, 4, 5];
        let (s, r) = split_pair(&mut b, 4..6, 0..2);
        assert_eq!(s, &[4, 5]);
        r.copy_from_slice(&[9, 9]);
        let (s, r) = split_pair(&mut b, 0..2, 2..4);
        assert_eq!(s, &[9, 9]);
        assert_eq!(r, &[2, 3]);
        let (s, r) = split_pair(&mut b, 2..2, 2..4);
        assert!(s.is_empty());
        assert_eq!(r.len(), 2);
        let (s, r) = split_pair(&mut b, 2..4, 2..2);
        assert_eq!(s.len(), 2);
        assert!(r.is_empty());
    }
}
