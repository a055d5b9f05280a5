//! A real rendezvous for tests: a server on loopback and ranks that check
//! in, for the cluster stage's tests and the collective stage's, whose
//! store and mesh start from one.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;

use super::auth::Token;
use super::barrier::Placement;
use super::protocol::{self, Msg};
use super::sealed::Channel;
use super::server::{ServerConfig, serve};
use crate::client::{ClientConfig, connect};
use preflight_facts::Facts;
use preflight_result::cluster::ClusterReport;

/// Runs a test's async body on a runtime of its own.
pub fn block_on<F: std::future::Future>(body: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(body)
}

/// A real server on loopback for `world` ranks whose barrier ends
/// `secs` after now, and a client configuration that reaches it.
pub async fn server(
    world: u32,
    secs: u64,
) -> (tokio::task::JoinHandle<ClusterReport>, ClientConfig) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let token = Token::new(b"rendezvous-test", "test");
    let start = Instant::now();
    let timeout = Duration::from_secs(secs);
    let cfg = ServerConfig {
        world_size: world,
        placement: Placement::default(),
        master: format!("127.0.0.1:{port}"),
        token: token.clone(),
        started: start,
        deadline: start + timeout,
        timeout,
        strict: false,
        clock_offset_ms: 0,
        bound: None,
        checks: Vec::new(),
        facts: Arc::new(Facts::new("/".into(), Default::default(), Vec::new())),
        linger: Duration::ZERO,
        serving_rank: Some(0),
        notes: Vec::new(),
        waiting: None,
    };
    let client = ClientConfig {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        token,
        deadline: start + timeout,
        verdict_deadline: start + timeout + Duration::from_secs(3),
        timeout,
        clock_offset_ms: 0,
        alternates: Vec::new(),
        waiting: None,
    };
    (tokio::spawn(serve(cfg, listener)), client)
}

/// A connection checked in as `rank` of `world` from host `host`,
/// its verdict received: what the collective stage's store uses.
/// A whole job of `world` ranks (hosts h0, h1, ...), each checked in
/// and holding the verdict: what a collective stage starts from.
pub async fn job(
    world: u32,
    secs: u64,
) -> (
    tokio::task::JoinHandle<ClusterReport>,
    ClientConfig,
    Vec<Channel>,
) {
    let (server, client) = server(world, secs).await;
    let mut ranks = Vec::new();
    for r in 0..world {
        ranks.push(ranked(&client, r, world, &format!("h{r}")).await);
    }
    for c in &mut ranks {
        crate::client::await_verdict(c, client.verdict_deadline)
            .await
            .unwrap();
    }
    (server, client, ranks)
}

/// An authenticated connection that never checks in, made before
/// `deadline`: a stranger who holds the token.
pub async fn stranger(client: &ClientConfig, deadline: Instant) -> Channel {
    let late = ClientConfig {
        deadline,
        verdict_deadline: deadline,
        ..client.clone()
    };
    connect(&late).await.unwrap()
}

pub async fn ranked(client: &ClientConfig, rank: u32, world: u32, host: &str) -> Channel {
    let mut conn = connect(client).await.unwrap();
    let c = crate::checkin::sample(rank, world, host);
    protocol::write(&mut conn, &Msg::CheckIn(Box::new(c)), client.deadline)
        .await
        .unwrap();
    conn
}
