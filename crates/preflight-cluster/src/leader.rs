//! Hierarchical check-in: where the node layout is known (LOCAL_RANK and
//! LOCAL_WORLD_SIZE, Slurm's per-node tasks), a node's ranks check in
//! through its leader (local rank 0) over a local socket, and only the
//! leaders talk to rank 0: rank 0 holds one connection per node, not per
//! rank, and sends one verdict per node, which the leader hands on.
//!
//! The local socket is an abstract Unix socket, named by the job token's
//! fingerprint, the rendezvous port and the node's index: nothing on disk
//! to clean up, private to the host's network namespace, and a rank still
//! proves the job token on it as it would to rank 0. A rank that cannot
//! reach its leader in time (the leader died, or never started) checks in
//! with rank 0 directly, so rank 0 names the leader missing and not its
//! whole node. A leader that dies after checking its node in takes the
//! connection down with it: rank 0 names every rank it carried as lost,
//! with their host, and the ranks waiting on it say that their leader went
//! away.

use std::os::linux::net::SocketAddrExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWrite, WriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::auth::{self, HANDSHAKE_LIMIT, Token};
use super::checkin::CheckIn;
use super::identity::Identity;
use super::protocol::{self, MAX_RANK_FRAME, Msg};
use super::sealed::Sealed;
use preflight_result::CheckResult;
use preflight_result::cluster::{Clock, ClusterReport};

/// Whether this rank's node checks in through a leader: its layout is
/// known (from the launcher, Slurm, or node mode's agent, which starts its
/// node's ranks) and holds more than one rank.
pub fn hierarchical(id: &Identity) -> bool {
    id.local_world_size > 1 && id.local_rank < id.local_world_size
}

/// The leader's socket, in the abstract namespace: the same name on every
/// rank of one node of one job, another for another job or node. Every
/// user of the host reads these names (/proc/net/unix), so nothing in one
/// is derived from the secret. A stranger (another user) who takes the
/// name first is sent nothing: the node's ranks see whose process holds
/// it, evaluate their node's checks themselves and check in with rank 0
/// directly; and the leader takes no connection from another user (both
/// sides also prove the job's secret).
fn name(id: &Identity) -> String {
    format!(
        "preflight-leader/{}/{}/{}",
        id.master_addr, id.master_port, id.node_rank
    )
}

/// The leader's listener, bound as early as the process can, so that its
/// node's ranks find it rather than falling back to rank 0.
pub fn listen(id: &Identity) -> Result<UnixListener, String> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name(id).as_bytes())
        .map_err(|e| e.to_string())?;
    let std = std::os::unix::net::UnixListener::bind_addr(&addr)
        .map_err(|e| format!("the node leader's socket @{}: {e}", name(id)))?;
    std.set_nonblocking(true).map_err(|e| e.to_string())?;
    UnixListener::from_std(std).map_err(|e| e.to_string())
}

/// Whether the process at the other end of `stream` runs as this user:
/// every rank of a job does, and a stranger who took the leader's name
/// first is sent nothing, not even a proof of the job's secret.
fn same_user(stream: &UnixStream) -> bool {
    stream
        .peer_cred()
        .is_ok_and(|c| c.uid() == nix::unistd::getuid().as_raw())
}

/// A local rank's connection to its leader, authenticated; why not when
/// the leader did not answer by `until`, or a process of another user
/// holds the leader's name.
pub async fn connect(
    token: &Token,
    id: &Identity,
    until: Instant,
) -> Result<Sealed<UnixStream>, String> {
    let named = name(id);
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(named.as_bytes())
        .map_err(|e| format!("the leader's socket @{named}: {e}"))?;
    let mut backoff = Duration::from_millis(5);
    let started = Instant::now();
    loop {
        if let Ok(std) = std::os::unix::net::UnixStream::connect_addr(&addr)
            && std.set_nonblocking(true).is_ok()
            && let Ok(mut stream) = UnixStream::from_std(std)
        {
            if !same_user(&stream) {
                return Err(format!(
                    "a process of another user holds this node's leader socket @{named}, and was sent nothing"
                ));
            }
            let deadline = (Instant::now() + HANDSHAKE_LIMIT).min(until + HANDSHAKE_LIMIT);
            return match auth::client(&mut stream, token, deadline).await {
                Ok(session) => Ok(session.seal(stream, token, true)),
                Err(e) => Err(format!(
                    "this node's leader socket @{named} did not prove the job's secret: {e}"
                )),
            };
        }
        if Instant::now() + backoff >= until {
            return Err(format!(
                "this node's leader (local rank 0) did not answer on its local socket within {}",
                preflight_ground::values::format_duration(started.elapsed())
            ));
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(100));
    }
}

/// What the leader stamps on its ranks' check-ins: where the node reaches
/// rank 0 from, its clock against rank 0 (one sample per node), and the
/// node's versions and addresses where a rank left them to it.
#[derive(Clone)]
pub struct Stamp {
    pub hostname: String,
    pub addr: String,
    pub interface: Option<String>,
    pub clock: Option<Clock>,
    /// The node's versions and what its hostname resolves to: read once,
    /// by the leader, for every rank of the node.
    pub versions: std::collections::BTreeMap<String, String>,
    pub hostname_addrs: Vec<String>,
}

type Follower = Sealed<UnixStream>;

/// A local rank that proved the token and checked in, waiting for the
/// leader's own connection to rank 0.
type Arrived = (CheckIn, Follower);

/// The leader's side: from the process's start it takes its node's
/// ranks' handshakes and check-ins, so that they know at once whether
/// their leader is there; once it is checked in itself (`attach`), it
/// relays them to rank 0 on its own connection, and at the verdict hands
/// each its node's shared findings and the verdict.
pub struct Relay {
    accept: tokio::task::JoinHandle<()>,
    /// One task per local rank while it proves the token and checks in,
    /// and the forwarder once attached; `finish` waits for them.
    each: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    arrived: Option<tokio::sync::mpsc::Receiver<Arrived>>,
    followers: Arc<Mutex<Vec<Follower>>>,
}

impl Relay {
    /// Serves `listener` until `finish`: each local rank proves the token
    /// and sends its check-in, kept until `attach`.
    pub fn start(listener: UnixListener, token: Token, id: &Identity, deadline: Instant) -> Relay {
        let each: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let tasks = Arc::clone(&each);
        let node_rank = id.node_rank;
        // The node's other ranks; a connection that did not check in one
        // of them (it broke off, or proved nothing) takes no one's place.
        let others = id.local_world_size.saturating_sub(1) as usize;
        let (tx, rx) = tokio::sync::mpsc::channel(others.max(1));
        // Handshakes at once, at most: the node's ranks twice over.
        let proving = Arc::new(tokio::sync::Semaphore::new(2 * others.max(1)));
        let accept = tokio::spawn(async move {
            loop {
                let Ok(Ok((stream, _))) =
                    tokio::time::timeout_at(deadline, listener.accept()).await
                else {
                    break;
                };
                // Another user's process is no rank of this job.
                if !same_user(&stream) {
                    continue;
                }
                let Ok(permit) = Arc::clone(&proving).try_acquire_owned() else {
                    continue;
                };
                let task = tokio::spawn(follow(
                    stream,
                    token.clone(),
                    node_rank,
                    tx.clone(),
                    deadline,
                    permit,
                ));
                tasks.lock().unwrap_or_else(|e| e.into_inner()).push(task);
            }
        });
        Relay {
            accept,
            each,
            arrived: Some(rx),
            followers: Arc::default(),
        }
    }

    /// This rank is checked in with rank 0: its node's check-ins go on
    /// through `upstream`, stamped with where the node reaches rank 0 from.
    pub fn attach<W: AsyncWrite + Unpin + Send + 'static>(
        &mut self,
        stamp: Stamp,
        upstream: Arc<Mutex<WriteHalf<W>>>,
        deadline: Instant,
    ) {
        let Some(mut arrived) = self.arrived.take() else {
            return;
        };
        let followers = Arc::clone(&self.followers);
        let task = tokio::spawn(async move {
            while let Some((c, mut f)) = arrived.recv().await {
                let relayed = Msg::CheckIn(Box::new(stamped(c, &stamp)));
                if protocol::write(&mut *upstream.lock().await, &relayed, deadline)
                    .await
                    .is_ok()
                {
                    // Said, so that a rank whose leader dies before this
                    // checks in itself instead of going missing.
                    let said = (Instant::now() + Duration::from_secs(1)).min(deadline);
                    if protocol::write(&mut f, &Msg::Relayed, said).await.is_ok() {
                        followers.lock().await.push(f);
                    }
                }
            }
        });
        self.each
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
    }

    /// Stops taking check-ins, lets the relays in flight end (1 s at most:
    /// a frame cut halfway would garble the connection to rank 0), and
    /// hands each local rank the node's findings (`node`: the node-scope
    /// checks this leader evaluated for them) and the verdict, cut to its
    /// node. When it returns, no task holds the upstream writer.
    pub async fn finish(mut self, report: &ClusterReport, left_ms: u64, node: &[CheckResult]) {
        self.accept.abort();
        let _ = (&mut self.accept).await;
        let settle = Instant::now() + Duration::from_secs(1);
        // Check-ins first, then the forwarder, which ends once they have.
        loop {
            let tasks = std::mem::take(&mut *self.each.lock().unwrap_or_else(|e| e.into_inner()));
            if tasks.is_empty() {
                break;
            }
            for mut t in tasks {
                if tokio::time::timeout_at(settle, &mut t).await.is_err() {
                    t.abort();
                    let _ = t.await;
                }
            }
        }
        let report = if report.full_report.is_none() {
            // Rank 0 leads its node: its ranks get what every other rank
            // gets, not the whole report.
            let own = report.node_of_rank().get(&0).copied();
            report.for_rank(own)
        } else {
            report.clone()
        };
        let shared = Msg::NodeFindings {
            results: node.to_vec(),
        };
        let msg = Msg::Verdict {
            report: Box::new(report),
            left_ms,
        };
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut followers = std::mem::take(&mut *self.followers.lock().await);
        let mut sends = JoinSet::new();
        for mut f in followers.drain(..) {
            let (shared, msg) = (shared.clone(), msg.clone());
            sends.spawn(async move {
                if protocol::write(&mut f, &shared, deadline).await.is_ok() {
                    let _ = protocol::write(&mut f, &msg, deadline).await;
                }
            });
        }
        while sends.join_next().await.is_some() {}
    }
}

impl Drop for Relay {
    /// A leader that got no verdict: its ranks' relays end with it, and
    /// the ranks see their connections close.
    fn drop(&mut self) {
        self.accept.abort();
        for t in self.each.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            t.abort();
        }
    }
}

/// One local rank: its handshake and its check-in, kept for the relay.
async fn follow(
    mut stream: UnixStream,
    token: Token,
    node_rank: u32,
    arrived: tokio::sync::mpsc::Sender<Arrived>,
    deadline: Instant,
    proving: tokio::sync::OwnedSemaphorePermit,
) {
    let handshake = (Instant::now() + HANDSHAKE_LIMIT).min(deadline);
    let Ok(session) = auth::server(&mut stream, &token, handshake).await else {
        return;
    };
    let mut sealed = session.seal(stream, &token, false);
    let Ok(Msg::CheckIn(c)) = protocol::read_limited(&mut sealed, deadline, MAX_RANK_FRAME).await
    else {
        return;
    };
    drop(proving);
    // Only a rank of this node: another node's rank has its own leader.
    if c.identity.node_rank != node_rank {
        let reason = format!(
            "this is node {node_rank}'s leader, and rank {} says it is on node {}",
            c.identity.rank, c.identity.node_rank
        );
        let _ = protocol::write(
            &mut sealed,
            &Msg::Rejected {
                reason,
                source: None,
                fingerprint: None,
            },
            deadline,
        )
        .await;
        return;
    }
    let _ = arrived.send((*c, sealed)).await;
}

/// A local rank's check-in as the leader sends it on: on the leader's node
/// (hostname, address, interface), with the leader's clock sample.
fn stamped(mut c: CheckIn, stamp: &Stamp) -> CheckIn {
    c.hostname = stamp.hostname.clone();
    c.addr = stamp.addr.clone();
    if c.interface.is_none() {
        c.interface = stamp.interface.clone();
    }
    if c.clock.is_none() {
        c.clock = stamp.clock;
    }
    if c.versions.is_empty() {
        c.versions = stamp.versions.clone();
    }
    if c.hostname_addrs.is_empty() {
        c.hostname_addrs = stamp.hostname_addrs.clone();
    }
    c
}
