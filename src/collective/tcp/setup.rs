//! Setting the backend up: this rank's address, which ranks it connects
//! to (its partners), the connections themselves through the rendezvous
//! store, and the single-copy handshake between ranks on one host.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::time::Instant;

use super::transport::*;
use super::*;
use crate::cluster::store;

pub(super) const MAGIC: &[u8; 4] = b"PFC1";

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

/// tokio's spelling of a name in the abstract namespace: a leading NUL.
pub(super) fn abstract_path(name: &str) -> String {
    format!("\0{name}")
}

pub(super) fn tune(s: &TcpStream) {
    let _ = s.set_nodelay(true);
}

/// A Unix stream socket's send buffer bounds the bytes in flight to its
/// peer (net.core.wmem_default, about 200 KiB, by default): at that size a
/// 16 MiB segment costs the pair a wake-up per 100 KiB or so (measured on
/// a 64 MiB sweep: 7× the voluntary context switches of loopback TCP, whose
/// buffers grow on their own; 2.6× fewer with 4 MiB). The kernel caps it
/// at net.core.wmem_max.
pub(super) const UNIX_BUFFER: usize = 4 << 20;

pub(super) fn tune_unix(s: &UnixStream) {
    let _ = socket2::SockRef::from(s).set_send_buffer_size(UNIX_BUFFER);
}

/// Every same-host peer reads a marker out of this rank's memory and this
/// rank reads each one's; a pair uses single-copy reads only when both
/// worked. Offers go out to every peer before any is read, so no order of
/// peers can deadlock.
pub(super) async fn direct_handshake(
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
    for pairs in
        crate::collective::straggler::schedule(world, crate::collective::straggler::MAX_ROUNDS)
    {
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
}
