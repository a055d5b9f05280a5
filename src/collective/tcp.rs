//! The built-in TCP backend (the Gloo analogue): TCP connections to each
//! rank's partners (`partners`), set up through the rendezvous store, on the address of the
//! interface GLOO_SOCKET_IFNAME names or else the one this rank reaches the
//! master from (the route's choice). Two ranks on one host (same boot id,
//! same network namespace, same hostname) talk over a Unix-domain stream
//! socket instead, as NCCL uses shared memory within a node: same data, same
//! algorithms, about half the kernel work of loopback TCP per byte; ranks in
//! different network namespaces (containers, the test harness's namespace
//! hosts) always use TCP, since that network path is what they must test.
//! `PREFLIGHT_COLL_SAME_HOST=tcp` keeps same-host pairs on TCP too. Each
//! pair's transport is reported. Ring algorithms for allreduce
//! (reduce-scatter then allgather, received in chunks and reduced as they
//! arrive while the send runs) and allgather, a pipelined chain for
//! broadcast, a dissemination barrier. Any world size, 1 included.
//!
//! Every read and write runs under the operation's deadline; a timeout
//! says which peer stopped sending or receiving.

use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream, tcp, unix};
use tokio::time::Instant;

use nix::unistd::Pid;

use super::{Backend, Dtype, OpError};
use crate::cluster::store;
use crate::result::collective::RankLink;

mod direct;
mod splice;

/// Receive granularity: a chunk is reduced while the next is in flight.
const CHUNK: usize = 512 << 10;
const MAGIC: &[u8; 4] = b"PFC1";
/// How ranks on one host talk: `direct` (the default), `unix` or `tcp`.
pub const SAME_HOST_VAR: &str = "PREFLIGHT_COLL_SAME_HOST";

/// How ranks on one host talk, from PREFLIGHT_COLL_SAME_HOST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameHost {
    /// A Unix socket, with large messages copied straight out of the
    /// sender's memory where the kernel allows (the default).
    Direct,
    /// A Unix socket carrying every byte.
    Unix,
    /// Loopback TCP, as between hosts.
    Tcp,
}

/// The transport of one pair of ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    Tcp,
    Unix,
}

enum Reader {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
}

enum Writer {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
}

impl AsyncRead for Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Reader::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            Reader::Unix(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Writer {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Writer::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            Writer::Unix(w) => Pin::new(w).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Writer::Tcp(w) => Pin::new(w).poll_flush(cx),
            Writer::Unix(w) => Pin::new(w).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Writer::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            Writer::Unix(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// One connected peer before it is split into halves.
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn transport(&self) -> Transport {
        match self {
            Conn::Tcp(_) => Transport::Tcp,
            Conn::Unix(_) => Transport::Unix,
        }
    }

    async fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.write_all(b).await,
            Conn::Unix(s) => s.write_all(b).await,
        }
    }

    async fn read_exact(&mut self, b: &mut [u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.read_exact(b).await.map(|_| ()),
            Conn::Unix(s) => s.read_exact(b).await.map(|_| ()),
        }
    }

    fn split(self) -> (Reader, Writer) {
        match self {
            Conn::Tcp(s) => {
                let (r, w) = s.into_split();
                (Reader::Tcp(r), Writer::Tcp(w))
            }
            Conn::Unix(s) => {
                let (r, w) = s.into_split();
                (Reader::Unix(r), Writer::Unix(w))
            }
        }
    }
}

pub struct Tcp {
    rank: u32,
    world: u32,
    readers: Vec<Option<Reader>>,
    writers: Vec<Option<Writer>>,
    /// Each peer's transport (`None` for this rank).
    transports: Vec<Option<Transport>>,
    /// Same-host peers whose large messages are copied out of their
    /// memory: their process ids.
    direct: Vec<Option<Pid>>,
    /// Why a same-host peer could not use single-copy reads.
    direct_refused: Option<String>,
    /// The pipe large messages are spliced through; made on first use,
    /// dropped after a failed exchange.
    pipe: Option<splice::Pipe>,
    /// The IP address the TCP listener used.
    ip: String,
    /// Receive buffer of the reduce-scatter (one chunk), kept between
    /// calls: a fresh one per call costs page faults inside the timed
    /// region.
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
        // A single-copy read from a process that has exited.
        _ if e.raw_os_error() == Some(libc::ESRCH) => {
            "its memory could not be read: the process is gone".to_string()
        }
        _ => e.to_string(),
    };
    OpError::Closed { peer, detail }
}

/// What makes two ranks "on one host" for the Unix-socket path: the same
/// kernel (boot id), network namespace and hostname. `None` when any of
/// them cannot be read (then every pair uses TCP).
pub fn host_key() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let netns = std::fs::read_link("/proc/self/ns/net").ok()?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(format!(
        "{}/{}/{}",
        boot.trim(),
        netns.display(),
        host.trim()
    ))
}

/// How same-host pairs talk, from `PREFLIGHT_COLL_SAME_HOST`: unset or
/// `direct`, `unix`, or `tcp`.
pub fn same_host_mode(var: Option<&str>) -> Result<SameHost, String> {
    match var.map(str::trim) {
        None | Some("") | Some("direct") => Ok(SameHost::Direct),
        Some("unix") => Ok(SameHost::Unix),
        Some("tcp") => Ok(SameHost::Tcp),
        Some(other) => Err(format!(
            "{SAME_HOST_VAR}={other}: expected `direct` (the default), `unix` or `tcp`"
        )),
    }
}

/// The reduce-scatter's receive buffer: one chunk, reused, so the
/// reduction reads it from cache rather than from memory.
const REDUCE_CHUNK: usize = CHUNK;

/// tokio's spelling of a name in the abstract namespace: a leading NUL.
fn abstract_path(name: &str) -> String {
    format!("\0{name}")
}

fn tune(s: &TcpStream) {
    let _ = s.set_nodelay(true);
}

/// A Unix stream socket's send buffer bounds the bytes in flight to its
/// peer (net.core.wmem_default, about 200 KiB, by default): at that size a
/// 16 MiB segment costs the pair a wake-up per 100 KiB or so (measured on
/// a 64 MiB sweep: 7× the voluntary context switches of loopback TCP, whose
/// buffers grow on their own; 2.6× fewer with 4 MiB). The kernel caps it
/// at net.core.wmem_max.
const UNIX_BUFFER: usize = 4 << 20;

fn tune_unix(s: &UnixStream) {
    let _ = socket2::SockRef::from(s).set_send_buffer_size(UNIX_BUFFER);
}

/// Every same-host peer reads a marker out of this rank's memory and this
/// rank reads each one's; a pair uses single-copy reads only when both
/// worked. Offers go out to every peer before any is read, so no order of
/// peers can deadlock.
async fn direct_handshake(
    rank: u32,
    transports: &[Option<Transport>],
    readers: &mut [Option<Reader>],
    writers: &mut [Option<Writer>],
) -> Result<(Vec<Option<Pid>>, Option<String>), String> {
    let mut out = vec![None; transports.len()];
    let peers: Vec<usize> = (0..transports.len())
        .filter(|j| transports[*j] == Some(Transport::Unix))
        .collect();
    // Lives until every peer has said whether it could read it.
    let marker = direct::Marker::new(rank);
    let io = |j: usize, e: std::io::Error| format!("single-copy handshake with rank {j}: {e}");
    for &j in &peers {
        if let Some(w) = writers[j].as_mut() {
            w.write_all(&marker.offer()).await.map_err(|e| io(j, e))?;
        }
    }
    let mut read = Vec::new();
    for &j in &peers {
        let Some(r) = readers[j].as_mut() else {
            continue;
        };
        let mut b = [0u8; direct::OFFER_LEN];
        r.read_exact(&mut b).await.map_err(|e| io(j, e))?;
        let offer = direct::Offer::parse(&b);
        read.push((j, offer.try_read().map(|()| offer.pid)));
    }
    for (j, r) in &read {
        if let Some(w) = writers[*j].as_mut() {
            w.write_all(&[u8::from(r.is_ok())])
                .await
                .map_err(|e| io(*j, e))?;
        }
    }
    let mut refused = None;
    for (j, r) in read {
        let Some(rd) = readers[j].as_mut() else {
            continue;
        };
        let mut b = [0u8; 1];
        rd.read_exact(&mut b).await.map_err(|e| io(j, e))?;
        match r {
            Ok(pid) if b[0] == 1 => out[j] = Some(Pid::from_raw(pid)),
            Ok(_) => {
                refused.get_or_insert(format!("rank {j} could not read this rank's memory"));
            }
            Err(e) => {
                refused.get_or_insert(format!("reading rank {j}'s memory: {e}"));
            }
        }
    }
    Ok((out, refused))
}

/// The ranks `rank` exchanges data with, sorted: its ring neighbours (ring
/// allreduce and allgather, the broadcast chain, send/recv), its
/// dissemination-barrier partners (rank ± 2^k) and its partners in the
/// pairwise round. The relation is symmetric, so each pair agrees on
/// whether to connect. At most 2·log2(N) + 8 peers instead of N − 1: a
/// rank of a 4,096-rank job holds about 30 sockets, not 4,095.
pub fn partners(rank: u32, world: u32) -> Vec<u32> {
    let mut out = std::collections::BTreeSet::new();
    if world < 2 {
        return Vec::new();
    }
    let mut k = 1;
    while k < world {
        out.insert((rank + k) % world);
        out.insert((rank + world - k) % world);
        k *= 2;
    }
    for pairs in super::straggler::schedule(world, super::straggler::MAX_ROUNDS) {
        for (a, b) in pairs {
            if a == rank {
                out.insert(b);
            } else if b == rank {
                out.insert(a);
            }
        }
    }
    out.remove(&rank);
    out.into_iter().collect()
}

impl Tcp {
    /// Listens, publishes the address in the store, and connects to this
    /// rank's partners (`partners`): it dials the lower ones and accepts
    /// the higher ones.
    /// `same_host`: how pairs on one host talk.
    pub async fn init(
        conn: &mut TcpStream,
        rank: u32,
        world: u32,
        ip: &str,
        same_host: SameHost,
        deadline: Instant,
    ) -> Result<Tcp, String> {
        let n = world as usize;
        let mut readers: Vec<Option<Reader>> = (0..n).map(|_| None).collect();
        let mut writers: Vec<Option<Writer>> = (0..n).map(|_| None).collect();
        let mut transports: Vec<Option<Transport>> = (0..n).map(|_| None).collect();
        if world <= 1 {
            return Ok(Tcp {
                rank,
                world,
                readers,
                writers,
                transports,
                direct: vec![None; n],
                direct_refused: None,
                pipe: None,
                ip: ip.to_string(),
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
        // An abstract Unix socket: scoped to this network namespace, gone
        // with the process, nothing to clean up on disk.
        let key = if same_host == SameHost::Tcp {
            None
        } else {
            host_key()
        };
        let local = key.and_then(|k| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let name = format!("preflight-coll-{}-{rank}-{nanos}", std::process::id());
            UnixListener::bind(abstract_path(&name))
                .ok()
                .map(|l| (k, name, l))
        });
        if let Some((k, name, _)) = &local {
            store::set(
                conn,
                &format!("coll/tcp/local/{rank}"),
                &format!("{k}\t{name}"),
                deadline,
            )
            .await
            .map_err(|e| format!("cannot publish this rank's address in the store: {e}"))?;
        }
        store::set(conn, &format!("coll/tcp/addr/{rank}"), &addr, deadline)
            .await
            .map_err(|e| format!("cannot publish this rank's address in the store: {e}"))?;
        let my_key = local.as_ref().map(|(k, _, _)| k.clone());
        let need = partners(rank, world);
        let mut peers = Vec::new();
        for &j in need.iter().filter(|j| **j < rank) {
            let wait = deadline.saturating_duration_since(Instant::now());
            let a = store::get(conn, &format!("coll/tcp/addr/{j}"), wait, deadline)
                .await
                .map_err(|e| format!("store: {e}"))?
                .ok_or_else(|| format!("rank {j} never published its address"))?;
            // Published before the TCP address, so present by now if at all.
            let same_host = match &my_key {
                Some(mine) => store::get(
                    conn,
                    &format!("coll/tcp/local/{j}"),
                    Duration::ZERO,
                    deadline,
                )
                .await
                .map_err(|e| format!("store: {e}"))?
                .and_then(|v| {
                    let (k, name) = v.split_once('\t')?;
                    (k == mine).then(|| name.to_string())
                }),
                None => None,
            };
            peers.push((j, a, same_host));
        }
        let hello = {
            let mut h = Vec::from(&MAGIC[..]);
            h.extend_from_slice(&rank.to_le_bytes());
            h
        };
        let dial = async {
            let mut out = Vec::new();
            for (j, a, same_host) in peers {
                // A same-host peer's Unix socket, else (or when it refuses)
                // TCP.
                let mut s = match same_host {
                    Some(name) => UnixStream::connect(abstract_path(&name))
                        .await
                        .ok()
                        .map(|x| {
                            tune_unix(&x);
                            Conn::Unix(x)
                        }),
                    None => None,
                };
                if s.is_none() {
                    let t = loop {
                        match TcpStream::connect(a.as_str()).await {
                            Ok(t) => break t,
                            Err(e) if Instant::now() + Duration::from_millis(50) < deadline => {
                                let _ = e;
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            Err(e) => {
                                return Err(format!("cannot connect to rank {j} at {a}: {e}"));
                            }
                        }
                    };
                    tune(&t);
                    s = Some(Conn::Tcp(t));
                }
                let Some(mut s) = s else { continue };
                s.write_all(&hello)
                    .await
                    .map_err(|e| format!("rank {j} at {a}: {e}"))?;
                out.push((j, s));
            }
            Ok::<_, String>(out)
        };
        let unix_listener = local.map(|(_, _, l)| l);
        let accept = async {
            let mut out: Vec<(u32, Conn)> = Vec::new();
            let higher = need.iter().filter(|j| **j > rank).count();
            while out.len() < higher {
                let (mut s, peer) = match &unix_listener {
                    Some(u) => tokio::select! {
                        t = listener.accept() => {
                            let (t, p) = t.map_err(|e| format!("accept: {e}"))?;
                            tune(&t);
                            (Conn::Tcp(t), p.to_string())
                        }
                        x = u.accept() => {
                            let (x, _) = x.map_err(|e| format!("accept: {e}"))?;
                            tune_unix(&x);
                            (Conn::Unix(x), "a local Unix socket".to_string())
                        }
                    },
                    None => {
                        let (t, p) = listener
                            .accept()
                            .await
                            .map_err(|e| format!("accept: {e}"))?;
                        tune(&t);
                        (Conn::Tcp(t), p.to_string())
                    }
                };
                let mut hello = [0u8; 8];
                // A stranger that connects and says nothing is dropped
                // when the whole init deadline ends.
                if s.read_exact(&mut hello).await.is_err() || &hello[..4] != MAGIC {
                    continue;
                }
                let j = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]);
                if j <= rank || !need.contains(&j) || out.iter().any(|(k, _)| *k == j) {
                    return Err(format!("unexpected peer {peer} claiming rank {j}"));
                }
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
            transports[j as usize] = Some(s.transport());
            let (r, w) = s.split();
            readers[j as usize] = Some(r);
            writers[j as usize] = Some(w);
        }
        let (direct, direct_refused) = if same_host == SameHost::Direct {
            let shake = direct_handshake(rank, &transports, &mut readers, &mut writers);
            tokio::time::timeout_at(deadline, shake)
                .await
                .map_err(|_| {
                    format!(
                        "the single-copy handshake with same-host peers timed out \
                         (is {SAME_HOST_VAR} the same on every rank?)"
                    )
                })??
        } else {
            (vec![None; n], None)
        };
        Ok(Tcp {
            rank,
            world,
            readers,
            writers,
            transports,
            direct,
            direct_refused,
            pipe: None,
            ip: ip.to_string(),
            scratch: Vec::new(),
        })
    }

    /// This rank's interface, its speed and each peer's transport.
    pub fn link(&self, interfaces: &[crate::facts::Interface]) -> RankLink {
        let ip: Option<std::net::IpAddr> = self.ip.parse().ok();
        let iface = interfaces
            .iter()
            .find(|i| ip.is_some_and(|ip| i.addresses.contains(&ip)));
        RankLink {
            rank: self.rank,
            interface: iface.map(|i| i.name.clone()),
            speed_mbps: iface.and_then(|i| i.speed_mbps),
            unix_peers: (0..self.world)
                .filter(|j| self.transports[*j as usize] == Some(Transport::Unix))
                .collect(),
            direct_peers: (0..self.world)
                .filter(|j| self.direct[*j as usize].is_some())
                .collect(),
            direct_refused: self.direct_refused.clone(),
            connections: self.transports.iter().flatten().count() as u32,
        }
    }

    fn right(&self) -> u32 {
        (self.rank + 1) % self.world
    }

    fn left(&self) -> u32 {
        (self.rank + self.world - 1) % self.world
    }

    /// How a message of `len` bytes to or from `peer` travels.
    fn way(&self, peer: u32, len: usize) -> Way {
        if len < direct::MIN_BYTES {
            return Way::Bytes;
        }
        match self.direct.get(peer as usize).copied().flatten() {
            Some(pid) => Way::Direct(pid),
            // Within a host the acknowledgement costs microseconds; across
            // a network it would cost a round trip per message.
            None if self.transports.get(peer as usize).copied().flatten()
                == Some(Transport::Unix) =>
            {
                Way::Acked
            }
            None => Way::Bytes,
        }
    }

    /// Sends `send` to `to` while receiving from `from` into `recv`. A
    /// large message is acknowledged by its receiver: when this returns,
    /// the peer has every byte and `send` may change, so the sender may
    /// hand the kernel its pages rather than a copy (see `Way`).
    async fn exchange(
        &mut self,
        send: &[u8],
        to: u32,
        recv: Recv<'_>,
        from: u32,
        deadline: Instant,
    ) -> Result<(), OpError> {
        let out = self.way(to, send.len());
        let inw = self.way(from, recv.len());
        let sent = Cell::new(false);
        let got = Cell::new(false);
        let missing = |peer: u32| OpError::Other {
            detail: format!("no connection with rank {peer}"),
        };
        let (t, f) = (to as usize, from as usize);
        let pipe = &mut self.pipe;
        let readers = &mut self.readers;
        let writers = &mut self.writers;
        let work = async {
            if t == f {
                let rd = readers.get_mut(f).and_then(Option::as_mut);
                let wr = writers.get_mut(t).and_then(Option::as_mut);
                let (Some(rd), Some(wr)) = (rd, wr) else {
                    return Err(missing(to));
                };
                if matches!(out, Way::Direct(_)) || matches!(inw, Way::Direct(_)) {
                    // A descriptor one way at least: in this order on both
                    // sides, the bytes that may go the other way are few,
                    // and an acknowledgement follows everything else the
                    // peer writes in this exchange.
                    send_out(wr, pipe, send, out, to).await?;
                    recv_in(rd, wr, recv, inw, from).await?;
                    got.set(true);
                } else {
                    tokio::try_join!(send_out(wr, pipe, send, out, to), async {
                        recv_bytes(rd, recv, from).await?;
                        got.set(true);
                        Ok(())
                    })?;
                    if inw.acked() {
                        write(wr, &[direct::ACK], from).await?;
                    }
                }
                if out.acked() {
                    read_ack(rd, to).await?;
                }
                sent.set(true);
                return Ok(());
            }
            let Ok([rd_from, rd_to]) = readers.get_disjoint_mut([f, t]) else {
                return Err(missing(to));
            };
            let Ok([wr_to, wr_from]) = writers.get_disjoint_mut([t, f]) else {
                return Err(missing(to));
            };
            let (Some(rd_from), Some(wr_to)) = (rd_from.as_mut(), wr_to.as_mut()) else {
                return Err(missing(to));
            };
            let send_side = async {
                send_out(wr_to, pipe, send, out, to).await?;
                if out.acked() {
                    read_ack(rd_to.as_mut().ok_or_else(|| missing(to))?, to).await?;
                }
                sent.set(true);
                Ok(())
            };
            let recv_side = async {
                let ack = wr_from.as_mut().ok_or_else(|| missing(from))?;
                recv_in(rd_from, ack, recv, inw, from).await?;
                got.set(true);
                Ok(())
            };
            tokio::try_join!(send_side, recv_side)?;
            Ok(())
        };
        let r = match tokio::time::timeout_at(deadline, work).await {
            Ok(r) => r,
            Err(_) if !got.get() => Err(OpError::RecvTimeout { from }),
            Err(_) if !sent.get() => Err(OpError::SendTimeout { to }),
            Err(_) => Ok(()),
        };
        if r.is_err() {
            // Pages of an unfinished message may still sit in the pipe.
            self.pipe = None;
        }
        r
    }
}

/// How one message travels.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// Small: bytes through the socket, nothing more.
    Bytes,
    /// Large, between hosts (or same-host pairs without single-copy
    /// reads): bytes through the socket, then an acknowledgement from the
    /// receiver, so the sender may splice its pages into the socket
    /// (vmsplice) instead of copying them: the kernel holds the pages
    /// themselves until the receiver has read them, and the
    /// acknowledgement says when that was.
    Acked,
    /// Large, same host with single-copy reads: a descriptor, the receiver
    /// copies out of the sender's memory, then the acknowledgement.
    Direct(Pid),
}

impl Way {
    fn acked(self) -> bool {
        !matches!(self, Way::Bytes)
    }
}

async fn write(wr: &mut Writer, b: &[u8], to: u32) -> Result<(), OpError> {
    wr.write_all(b).await.map_err(|e| closed(to, &e))
}

/// This rank's side of a message to `to`: the bytes or the descriptor
/// (the acknowledgement, when due, is read by the caller).
async fn send_out(
    wr: &mut Writer,
    pipe: &mut Option<splice::Pipe>,
    send: &[u8],
    way: Way,
    to: u32,
) -> Result<(), OpError> {
    match way {
        Way::Direct(_) => write(wr, &direct::descriptor(send), to).await,
        Way::Acked => {
            if pipe.is_none() {
                *pipe = splice::Pipe::new();
            }
            match pipe {
                Some(p) => splice::send(wr, p, send).await.map_err(|e| closed(to, &e)),
                None => send_bytes(wr, send, to).await,
            }
        }
        Way::Bytes => send_bytes(wr, send, to).await,
    }
}

/// This rank's side of a message from `from`: the bytes, or the bytes
/// copied out of the sender's memory; then the acknowledgement when due.
async fn recv_in(
    rd: &mut Reader,
    ack: &mut Writer,
    recv: Recv<'_>,
    way: Way,
    from: u32,
) -> Result<(), OpError> {
    match way {
        Way::Direct(pid) => recv_direct(rd, recv, pid, from).await?,
        Way::Acked | Way::Bytes => recv_bytes(rd, recv, from).await?,
    }
    if way.acked() {
        write(ack, &[direct::ACK], from).await?;
    }
    Ok(())
}

/// `send` through the socket, in chunks.
async fn send_bytes(wr: &mut Writer, send: &[u8], to: u32) -> Result<(), OpError> {
    for c in send.chunks(CHUNK) {
        write(wr, c, to).await?;
    }
    Ok(())
}

/// Bytes from the socket into `recv`, a chunk at a time (a reduction
/// reduces each chunk while the next is in flight).
async fn recv_bytes(rd: &mut Reader, recv: Recv<'_>, from: u32) -> Result<(), OpError> {
    let mut off = 0;
    match recv {
        Recv::Into(buf) => {
            while off < buf.len() {
                let end = (off + CHUNK).min(buf.len());
                rd.read_exact(&mut buf[off..end])
                    .await
                    .map_err(|e| closed(from, &e))?;
                off = end;
            }
        }
        Recv::Reduce { dst, tmp, dtype } => {
            // tmp is small and reused, so the reduction reads it from
            // cache rather than from memory.
            let step = tmp.len().max(Dtype::SIZE);
            while off < dst.len() {
                let end = (off + step).min(dst.len());
                let t = &mut tmp[..end - off];
                rd.read_exact(t).await.map_err(|e| closed(from, &e))?;
                reduce(&mut dst[off..end], t, dtype);
                off = end;
            }
        }
    }
    Ok(())
}

/// A descriptor from `from`, and the bytes copied out of its memory.
async fn recv_direct(rd: &mut Reader, recv: Recv<'_>, pid: Pid, from: u32) -> Result<(), OpError> {
    let mut d = [0u8; 16];
    rd.read_exact(&mut d).await.map_err(|e| closed(from, &e))?;
    let (addr, len) = direct::parse_descriptor(&d);
    if len != recv.len() {
        return Err(OpError::Other {
            detail: format!(
                "rank {from} offered {len} bytes where {} were due",
                recv.len()
            ),
        });
    }
    let copy = |dst: &mut [u8], at: usize| {
        direct::read(pid, addr + at as u64, dst).map_err(|e| closed(from, &e))
    };
    match recv {
        Recv::Into(buf) => copy(buf, 0)?,
        Recv::Reduce { dst, tmp, dtype } => {
            let step = tmp.len().max(Dtype::SIZE);
            let mut off = 0;
            while off < dst.len() {
                let end = (off + step).min(dst.len());
                let t = &mut tmp[..end - off];
                copy(t, off)?;
                reduce(&mut dst[off..end], t, dtype);
                off = end;
            }
        }
    }
    Ok(())
}

async fn read_ack(rd: &mut Reader, to: u32) -> Result<(), OpError> {
    let mut a = [0u8; 1];
    rd.read_exact(&mut a).await.map_err(|e| closed(to, &e))?;
    if a[0] != direct::ACK {
        return Err(OpError::Other {
            detail: format!(
                "rank {to} sent {:#04x} where an acknowledgement was due",
                a[0]
            ),
        });
    }
    Ok(())
}

/// Where an exchange's incoming bytes go.
enum Recv<'a> {
    /// Stored as they are.
    Into(&'a mut [u8]),
    /// Added element-wise into `dst`, through `tmp` (a multiple of 4 bytes).
    Reduce {
        dst: &'a mut [u8],
        tmp: &'a mut [u8],
        dtype: Dtype,
    },
}

impl Recv<'_> {
    fn len(&self) -> usize {
        match self {
            Recv::Into(b) => b.len(),
            Recv::Reduce { dst, .. } => dst.len(),
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
        let mut tmp = std::mem::take(&mut self.scratch);
        if tmp.len() < REDUCE_CHUNK {
            tmp.resize(REDUCE_CHUNK, 0);
        }
        // Reduce-scatter: after n-1 steps segment (r+1)%n holds the sum.
        for step in 0..n - 1 {
            let s_idx = (r + n - step) % n;
            let r_idx = (r + n - step - 1) % n;
            let sb = byte_range(&segs[s_idx]);
            let rb = byte_range(&segs[r_idx]);
            let (send, dst) = split_pair(buf, sb, rb);
            let into = Recv::Reduce {
                dst,
                tmp: &mut tmp,
                dtype,
            };
            let done = self.exchange(send, to, into, from, deadline).await;
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
            self.exchange(send, to, Recv::Into(recv), from, deadline)
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
            self.exchange(send, to, Recv::Into(recv), from, deadline)
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
        self.exchange(send, to, Recv::Into(recv), from, deadline)
            .await
    }

    async fn barrier(&mut self, deadline: Instant) -> Result<(), OpError> {
        let n = self.world;
        let mut k = 1;
        while k < n {
            let to = (self.rank + k) % n;
            let from = (self.rank + n - k) % n;
            let mut got = [0u8; 1];
            self.exchange(&[1], to, Recv::Into(&mut got), from, deadline)
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
    fn partners_are_symmetric_and_cover_every_exchange() {
        for world in 1..70u32 {
            for rank in 0..world {
                let p = partners(rank, world);
                assert!(!p.contains(&rank));
                for &q in &p {
                    assert!(partners(q, world).contains(&rank), "{rank}/{q} of {world}");
                }
                if world > 1 {
                    assert!(p.contains(&((rank + 1) % world)));
                    assert!(p.contains(&((rank + world - 1) % world)));
                }
            }
            for pairs in crate::collective::straggler::schedule(world, 8) {
                for (a, b) in pairs {
                    assert!(partners(a, world).contains(&b));
                }
            }
        }
        // Small worlds stay a full mesh; large ones do not.
        for world in 2..=8 {
            for rank in 0..world {
                assert_eq!(
                    partners(rank, world).len() as u32,
                    world - 1,
                    "{rank} of {world}"
                );
            }
        }
        assert!((0..24).all(|r| partners(r, 24).len() < 23));
        // 4,096 ranks: 12 powers of two each way, 8 pairwise partners, some
        // shared.
        let big = partners(7, 4096).len();
        assert!((12..=2 * 12 + 8).contains(&big), "{big}");
    }

    #[test]
    fn same_host_variable() {
        assert_eq!(same_host_mode(None), Ok(SameHost::Direct));
        assert_eq!(same_host_mode(Some("direct")), Ok(SameHost::Direct));
        assert_eq!(same_host_mode(Some("unix")), Ok(SameHost::Unix));
        assert_eq!(same_host_mode(Some(" tcp ")), Ok(SameHost::Tcp));
        let e = same_host_mode(Some("shm")).unwrap_err();
        assert!(e.contains("PREFLIGHT_COLL_SAME_HOST=shm"), "{e}");
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
