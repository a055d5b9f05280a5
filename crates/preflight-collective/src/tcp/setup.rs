//! Setting the backend up: this rank's address, which ranks it connects
//! to (its partners), the connections themselves through the rendezvous
//! store, and the single-copy handshake between ranks on one host.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::time::Instant;

use super::transport::*;
use super::*;
use preflight_cluster::auth::Token;
use preflight_cluster::store;

/// 2: the hello carries a proof of the job's token.
pub(super) const MAGIC: &[u8; 4] = b"PFC2";
/// MAGIC, the dialing rank, and HMAC(token, "mesh" | run nonce | "from>to")
/// as 64 hex digits.
const HELLO_LEN: usize = 4 + 4 + 64;
/// How long an accepted connection may take to say its hello.
const HELLO_LIMIT: Duration = Duration::from_secs(1);
/// Accepted connections whose hello is still awaited, at most: beyond,
/// a flood is closed at accept.
const HELLOS_PENDING: usize = 64;
/// How long a pending hello keeps its slot against a newcomer.
const HELLO_CHANCE: Duration = Duration::from_millis(100);

/// The hello `from` sends `to`: it proves the job's token for this run
/// and this pair, so it can be neither made without the token nor
/// replayed to another rank or in another run.
fn hello(token: &Token, nonce: &str, from: u32, to: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(HELLO_LEN);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&from.to_le_bytes());
    h.extend_from_slice(
        token
            .proof("mesh", nonce, &format!("{from}>{to}"))
            .as_bytes(),
    );
    h
}

/// Reads an accepted connection's hello within `HELLO_LIMIT`: the rank it
/// claims and its proof, or `None` (silent, short, not ours).
async fn read_hello(mut s: Conn) -> Option<(u32, String, Conn)> {
    let mut b = [0u8; HELLO_LEN];
    tokio::time::timeout(HELLO_LIMIT, s.read_exact(&mut b))
        .await
        .ok()?
        .ok()?;
    if &b[..4] != MAGIC {
        return None;
    }
    let j = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let proof = std::str::from_utf8(&b[8..]).ok()?.to_string();
    Some((j, proof, s))
}

/// The variable that picks the interface to listen on, as Gloo's.
pub const IFNAME_VAR: &str = "GLOO_SOCKET_IFNAME";

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
    peers_of: &[Option<(i32, u32)>],
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
        // The offer must come from the process at the other end of this
        // socket, run by this user: a peer cannot name another process
        // (this one, say) and have this rank read where it points.
        let me = nix::unistd::geteuid().as_raw();
        let checked = match peers_of[j] {
            Some((pid, uid)) if pid == offer.pid && uid == me => offer.try_read(),
            Some((pid, uid)) if uid != me => Err(format!(
                "rank {j}'s process (pid {pid}) runs as uid {uid}, not as this rank's uid {me}"
            )),
            Some((pid, _)) => Err(format!(
                "rank {j}'s offer names pid {}, but its socket belongs to pid {pid}: another PID namespace, or a peer that is not what it says",
                offer.pid
            )),
            None => Err(format!(
                "the credentials of rank {j}'s socket cannot be read"
            )),
        };
        read.push((j, checked.map(|()| offer.pid)));
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

/// The next connection on the mesh's TCP listener or, when it has one, its
/// Unix listener.
/// The next connection; `None` for one from another user, closed at once.
async fn accept_one(
    listener: &TcpListener,
    unix: Option<&UnixListener>,
) -> Result<Option<Conn>, String> {
    match unix {
        Some(u) => tokio::select! {
            t = listener.accept() => {
                let (t, _) = t.map_err(|e| format!("accept: {e}"))?;
                tune(&t);
                Ok(Some(Conn::Tcp(t)))
            }
            x = u.accept() => {
                let (x, _) = x.map_err(|e| format!("accept: {e}"))?;
                // Abstract sockets have no permissions, and every user
                // reads their names in /proc/net/unix: the kernel's word
                // on who connected keeps other users out before they
                // cost a hello's slot.
                let me = nix::unistd::geteuid().as_raw();
                match x.peer_cred() {
                    Ok(c) if c.uid() == me => {}
                    _ => return Ok(None),
                }
                tune_unix(&x);
                Ok(Some(Conn::Unix(x)))
            }
        },
        None => {
            let (t, _) = listener
                .accept()
                .await
                .map_err(|e| format!("accept: {e}"))?;
            tune(&t);
            Ok(Some(Conn::Tcp(t)))
        }
    }
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
    for pairs in crate::straggler::schedule(world, crate::straggler::MAX_ROUNDS) {
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
    /// `token`: the job's, which every connection of the mesh proves.
    pub async fn init(
        conn: &mut preflight_cluster::store::Channel,
        rank: u32,
        world: u32,
        ip: &str,
        same_host: SameHost,
        token: &Token,
        deadline: Instant,
    ) -> Result<Tcp, String> {
        let n = world as usize;
        let mut readers: Vec<Option<Reader>> = (0..n).map(|_| None).collect();
        let mut writers: Vec<Option<Writer>> = (0..n).map(|_| None).collect();
        let mut transports: Vec<Option<Transport>> = (0..n).map(|_| None).collect();
        let watch = Watch::new();
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
                watch,
                stall: None,
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
        // This run's nonce, from rank 0: a hello of an earlier run of the
        // same job proves nothing in this one.
        let nonce = if rank == 0 {
            let n = preflight_cluster::auth::nonce();
            store::set(conn, "coll/tcp/nonce", &n, deadline)
                .await
                .map_err(|e| format!("cannot publish the mesh's nonce in the store: {e}"))?;
            n
        } else {
            let wait = deadline.saturating_duration_since(Instant::now());
            store::get(conn, "coll/tcp/nonce", wait, deadline)
                .await
                .map_err(|e| format!("store: {e}"))?
                .ok_or("rank 0 never published the mesh's nonce")?
        };
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
        let dial = async {
            #[cfg(feature = "test-hooks")]
            if let Some(ms) = preflight_ground::test_hooks::rank_bytes(
                &|k| std::env::var(k).ok(),
                preflight_ground::test_hooks::MESH_DIAL_DELAY_MS,
                rank,
            ) {
                tokio::time::sleep(Duration::from_millis(ms as u64)).await;
            }
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
                s.write_all(&hello(token, &nonce, rank, j))
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
            // Each hello is read in its own task with its own short
            // deadline: a silent or slow stranger costs a slot for a second,
            // never the set-up; a bad hello closes that connection only.
            // When every slot is taken, the oldest gives its slot up: a
            // stranger who keeps connecting cannot have a rank's connection
            // dropped for its own.
            let mut hellos = tokio::task::JoinSet::new();
            let mut oldest: std::collections::VecDeque<(tokio::task::AbortHandle, Instant)> =
                std::collections::VecDeque::new();
            while out.len() < higher {
                tokio::select! {
                    accepted = accept_one(&listener, unix_listener.as_ref()) => {
                        let Some(s) = accepted? else { continue };
                        oldest.retain(|(h, _)| !h.is_finished());
                        if oldest.len() >= HELLOS_PENDING {
                            // Only one that has had its chance to say its
                            // hello (a rank's is in its first packet).
                            match oldest.front() {
                                Some((h, at)) if at.elapsed() >= HELLO_CHANCE => {
                                    h.abort();
                                    oldest.pop_front();
                                }
                                _ => continue,
                            }
                        }
                        oldest.push_back((hellos.spawn(read_hello(s)), Instant::now()));
                    }
                    Some(done) = hellos.join_next() => {
                        let Ok(Some((j, proof, s))) = done else { continue };
                        let wanted = j > rank
                            && need.contains(&j)
                            && !out.iter().any(|(k, _)| *k == j);
                        if wanted && token.verify("mesh", &nonce, &format!("{j}>{rank}"), &proof) {
                            out.push((j, s));
                        }
                    }
                }
            }
            Ok::<_, String>(out)
        };
        let (dialed, accepted) =
            tokio::time::timeout_at(deadline, async { tokio::join!(dial, accept) })
                .await
                .map_err(|_| {
                    "connecting the mesh timed out: some peer did not connect or accept".to_string()
                })?;
        let mut peers_of: Vec<Option<(i32, u32)>> = vec![None; n];
        for (j, s) in dialed?.into_iter().chain(accepted?) {
            peers_of[j as usize] = s.peer();
            transports[j as usize] = Some(s.transport());
            let (r, w) = s.split(&watch);
            readers[j as usize] = Some(r);
            writers[j as usize] = Some(w);
        }
        let (direct, direct_refused) = if same_host == SameHost::Direct {
            let shake = direct_handshake(rank, &transports, &peers_of, &mut readers, &mut writers);
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
            watch,
            stall: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backend;
    use preflight_cluster::test_support::{block_on, job, stranger};

    /// While two ranks set up their mesh, a stranger who knows rank 0's
    /// mesh address (the store is readable to anyone with the token; a port
    /// scan finds it too) connects silently, says an 8-byte hello claiming
    /// rank 1, forges a proof, and sends garbage: every one of them is
    /// dropped, and the real rank 1 still joins.
    #[test]
    fn strangers_on_the_mesh_are_dropped_and_the_real_peer_joins() {
        block_on(async {
            let (_server, client, ranks) = job(2, 2).await;
            let [mut c0, mut c1]: [_; 2] = ranks.try_into().ok().unwrap();
            let deadline = Instant::now() + Duration::from_secs(8);
            let token = client.token.clone();
            let rank0 = async {
                let mut t =
                    Tcp::init(&mut c0, 0, 2, "127.0.0.1", SameHost::Tcp, &token, deadline).await?;
                t.barrier(deadline).await.map_err(|e| e.to_string())?;
                Ok::<_, String>(())
            };
            let rest = async {
                // The attacker reads rank 0's address as any authenticated
                // connection may.
                let mut spy = stranger(&client, deadline).await;
                let addr = store::get(
                    &mut spy,
                    "coll/tcp/addr/0",
                    Duration::from_secs(2),
                    deadline,
                )
                .await
                .unwrap()
                .expect("rank 0 published its address");
                let silent = TcpStream::connect(&addr).await.unwrap();
                let mut old_hello = TcpStream::connect(&addr).await.unwrap();
                old_hello.write_all(b"PFC1\x01\x00\x00\x00").await.unwrap();
                let mut forged = TcpStream::connect(&addr).await.unwrap();
                let mut h = Vec::from(&MAGIC[..]);
                h.extend_from_slice(&1u32.to_le_bytes());
                h.extend_from_slice(&[b'0'; 64]);
                forged.write_all(&h).await.unwrap();
                let mut garbage = TcpStream::connect(&addr).await.unwrap();
                garbage.write_all(&[0xff; HELLO_LEN]).await.unwrap();
                // A hello of another run (another nonce) proves nothing here.
                let mut replayed = TcpStream::connect(&addr).await.unwrap();
                replayed
                    .write_all(&hello(&token, "an earlier run", 1, 0))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
                let mut t1 = Tcp::init(&mut c1, 1, 2, "127.0.0.1", SameHost::Tcp, &token, deadline)
                    .await
                    .unwrap();
                t1.barrier(deadline).await.unwrap();
                // The forged connections were closed, not kept.
                let mut b = [0u8; 1];
                for s in [&mut forged, &mut garbage, &mut replayed] {
                    assert_eq!(s.read(&mut b).await.unwrap_or(0), 0);
                }
                drop((silent, old_hello));
            };
            let (r0, ()) = tokio::join!(rank0, rest);
            r0.unwrap();
        });
    }

    /// A same-host peer echoes this rank's own single-copy offer back, as
    /// if it were its own: the offer names this process, the socket's
    /// other end is another process, and single-copy reads stay off.
    #[test]
    fn an_offer_from_another_process_than_the_sockets_is_refused() {
        block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("peer.sock");
            let code = format!(
                "import socket\n\
                 s = socket.socket(socket.AF_UNIX)\n\
                 s.bind({p:?}); s.listen(1); print('ready', flush=True)\n\
                 c, _ = s.accept()\n\
                 offer = b''\n\
                 while len(offer) < {n}: offer += c.recv({n} - len(offer))\n\
                 c.sendall(offer)\n\
                 verdict = c.recv(1)\n\
                 c.sendall(b'\\x01')\n\
                 print(verdict[0], flush=True)\n",
                p = path.display().to_string(),
                n = direct::OFFER_LEN
            );
            let mut child = tokio::process::Command::new("python3")
                .args(["-c", &code])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("python3");
            let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
                .await
                .unwrap();
            assert_eq!(line.trim(), "ready");
            let conn = Conn::Unix(UnixStream::connect(&path).await.unwrap());
            let peer = conn.peer().expect("SO_PEERCRED");
            assert_eq!(peer.0 as u32, child.id().unwrap());
            let transports = vec![None, Some(conn.transport())];
            let (r, w) = conn.split(&Watch::new());
            let mut readers = vec![None, Some(r)];
            let mut writers = vec![None, Some(w)];
            let (direct, refused) = direct_handshake(
                0,
                &transports,
                &[None, Some(peer)],
                &mut readers,
                &mut writers,
            )
            .await
            .unwrap();
            assert_eq!(direct[1], None, "single-copy reads must stay off");
            let why = refused.unwrap();
            assert!(
                why.contains(&format!(
                    "rank 1's offer names pid {}, but its socket belongs to pid {}",
                    std::process::id(),
                    peer.0
                )),
                "{why}"
            );
            line.clear();
            tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
                .await
                .unwrap();
            assert_eq!(line.trim(), "0", "the peer was told its offer was refused");
            child.wait().await.unwrap();
        });
    }
}
