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
//!
//! `setup` connects a rank to its partners, `transport` carries one
//! message between two of them, `algorithms` builds the collectives on
//! top; `direct` (single-copy reads) and `splice` (zero-copy sends) are
//! the same-host paths.

use std::rc::Rc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use nix::unistd::Pid;

use preflight_result::collective::RankLink;

mod algorithms;
mod direct;
mod setup;
mod splice;
mod transport;

use transport::{Reader, Writer};

pub use algorithms::reduce;
pub use setup::{IFNAME_VAR, listen_ip};

/// Receive granularity: a chunk is reduced while the next is in flight.
const CHUNK: usize = 512 << 10;
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
    /// What every connection has moved, and when last.
    watch: Rc<transport::Watch>,
    /// An operation is hung when nothing has moved for this long (and only
    /// then, however long it takes); `None`: the operation's deadline
    /// alone.
    stall: Option<Duration>,
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

impl Tcp {
    /// Holds each operation to "something moves at least every `stall`"
    /// (the step's `--step-timeout`) rather than to its deadline alone: a
    /// deadline that comes while data still moves ends the operation as
    /// slow, not as a peer that stopped.
    pub fn stall_after(&mut self, stall: Duration) {
        self.stall = Some(stall);
    }

    /// This rank's interface, its speed and each peer's transport.
    pub fn link(&self, interfaces: &[preflight_facts::Interface]) -> RankLink {
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
}

#[cfg(test)]
mod tests {
    use super::algorithms::{segments, split_pair};
    use super::setup::partners;
    use super::*;

    /// Data that trickles in keeps an operation alive past the stall
    /// limit, and ends it as still moving at its deadline; a peer that
    /// sends nothing is stalled at the stall limit, long before the
    /// deadline. Paused time: the clock runs forward, nothing waits.
    #[test]
    fn a_slow_peer_is_moving_and_a_silent_one_stalled() {
        use super::transport::{Conn, Waited, Watch, watched};
        use tokio::time::Instant;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let stall = Some(Duration::from_secs(1));
            let (a, b) = tokio::net::UnixStream::pair().unwrap();
            let watch = Watch::new();
            let (mut rd, _keep) = Conn::Unix(a).split(&watch);
            let (_, mut wr) = Conn::Unix(b).split(&Watch::new());
            let start = Instant::now();
            let mut buf = [0u8; 100];
            let trickle = async {
                for _ in 0..40 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    wr.write_all(&[1]).await.unwrap();
                }
            };
            let read = watched(
                &watch,
                stall,
                start + Duration::from_secs(3),
                rd.read_exact(&mut buf),
            );
            let (got, ()) = tokio::join!(read, trickle);
            assert!(matches!(got, Waited::StillMoving));
            assert!(watch.bytes() >= 29, "{}", watch.bytes());
            let start = Instant::now();
            let read = watched(
                &watch,
                stall,
                start + Duration::from_secs(3),
                rd.read_exact(&mut buf),
            );
            assert!(matches!(read.await, Waited::Stalled));
            assert_eq!(start.elapsed().as_secs(), 1);
            // With no stall limit, the deadline alone, and no verdict of
            // slowness.
            let start = Instant::now();
            let read = watched(
                &watch,
                None,
                start + Duration::from_secs(3),
                rd.read_exact(&mut buf),
            );
            assert!(matches!(read.await, Waited::Stalled));
            assert_eq!(start.elapsed().as_secs(), 3);
        });
    }

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
            for pairs in crate::straggler::schedule(world, 8) {
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
