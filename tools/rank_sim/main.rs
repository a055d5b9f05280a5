//! `preflight-rank-sim`: a test and benchmark tool, not part of preflight.
//! It is built only with the `rank-sim` feature (which the tests turn on
//! and `bench/rendezvous-scale.sh` names), so the shipped binary holds
//! none of it.
//!
//! It starts one real rank 0 (`preflight run`, a real process on a real
//! port) and plays the job's other ranks as tasks of one process: each
//! connects from its node's own loopback address (127.1.x.y), proves the
//! token with the real handshake, samples its clock, checks in with what a
//! GPU node sends (versions, devices and environment read from a fixture
//! tree, the same one rank 0 reads), answers its node's probe plan with
//! real probes, and waits for the verdict, all through the same client code
//! the real ranks run. Every simulated node has a real probe listener. So
//! rank 0's server is measured at thousands of ranks without thousands of
//! processes, whose start-up alone would swamp this machine.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

mod summary;

use clap::Parser;
use summary::summarize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use preflight_cluster::auth::Token;
use preflight_cluster::checkin::{self, CheckIn};
use preflight_cluster::client;
use preflight_cluster::identity::Identity;
use preflight_cluster::leader;
use preflight_cluster::protocol::{self, Msg};
use preflight_cluster::reachability;
use preflight_facts::Facts;
use preflight_run::selection::{all_checks, select};
use preflight_run::settings::ChecklistSettings;

#[derive(Debug, Parser)]
#[command(
    name = "preflight-rank-sim",
    about = "TEST TOOL, not part of preflight: one real rank 0 and thousands of simulated ranks speaking the real protocol, with per-phase times"
)]
struct Args {
    /// The preflight binary rank 0 runs.
    #[arg(long, value_name = "PATH")]
    preflight: PathBuf,
    /// Ranks in the job, rank 0 included.
    #[arg(long)]
    world: u32,
    /// `flat` (ranks do not say their node layout; 8 per host) or
    /// `nodes:K` (K nodes of WORLD/K ranks, with LOCAL_RANK and
    /// LOCAL_WORLD_SIZE).
    #[arg(long, default_value = "flat", value_parser = parse_layout)]
    layout: Layout,
    /// The fixture tree rank 0 and every simulated node read.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
    /// The rendezvous port (default: a free one).
    #[arg(long)]
    port: Option<u16>,
    /// Rank 0's --timeout.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Fault: this node (1 or more) dies right after checking in: its
    /// leader's connection (its ranks' connections in the flat layout)
    /// closes.
    #[arg(long, value_name = "NODE")]
    kill_node: Option<u32>,
    /// Fault: a second process claims this rank.
    #[arg(long, value_name = "RANK")]
    duplicate: Option<u32>,
    /// Fault: this node's probe listener drops every connection.
    #[arg(long, value_name = "NODE")]
    deaf_node: Option<u32>,
    /// Where rank 0's JSON report goes (default: a temporary file).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Processes playing the simulated nodes (default: one per 4,096
    /// nodes): each process has its own descriptors (20,000 here, not
    /// raisable), and a node holds two (its leader's connection, its probe
    /// listener) plus its probes in flight. With more than one, they run
    /// at nice 10, below rank 0.
    #[arg(long)]
    shards: Option<u32>,
    /// Internal: this process plays shard I of --shards, started by the
    /// first with the job's port, probe port and start time.
    #[arg(long, hide = true, requires_all = ["port", "probe_port", "t0_unix_ns"])]
    shard: Option<u32>,
    #[arg(long, hide = true)]
    probe_port: Option<u16>,
    #[arg(long, hide = true)]
    t0_unix_ns: Option<u128>,
}

#[derive(Debug, Clone, Copy)]
enum Layout {
    Flat,
    Nodes(u32),
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    match s {
        "flat" => Ok(Layout::Flat),
        _ => s
            .strip_prefix("nodes:")
            .and_then(|k| k.parse::<u32>().ok())
            .filter(|k| *k > 0)
            .map(Layout::Nodes)
            .ok_or_else(|| format!("`{s}`: the layout is `flat` or `nodes:K` with K > 0")),
    }
}

impl Layout {
    fn per_node(self, world: u32) -> u32 {
        match self {
            Layout::Flat => 8,
            Layout::Nodes(k) => world.div_ceil(k),
        }
        .max(1)
    }

    fn name(self) -> String {
        match self {
            Layout::Flat => "flat".into(),
            Layout::Nodes(k) => format!("nodes:{k}"),
        }
    }
}

/// Node `k`'s address: node 0 is rank 0's own host (127.0.0.1), the others
/// 127.1.x.y, every one its own, all on the loopback interface.
fn node_ip(k: u32) -> Ipv4Addr {
    if k == 0 {
        return Ipv4Addr::LOCALHOST;
    }
    Ipv4Addr::new(
        127,
        1 + (k / 62_500) as u8,
        ((k / 250) % 250) as u8,
        (k % 250 + 1) as u8,
    )
}

/// A stream that counts the bytes read from it: what rank 0 sent.
struct Counted<S> {
    inner: S,
    read: Arc<AtomicU64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What every simulated rank shares.
struct Job {
    world: u32,
    layout: Layout,
    per_node: u32,
    master: SocketAddr,
    token: Token,
    rank0_host: String,
    checklist_hash: String,
    /// Each node's probe listener address.
    probe_addrs: Vec<Option<String>>,
    deadline: Instant,
    timeout: Duration,
    received: Arc<AtomicU64>,
    kill_node: Option<u32>,
    /// Simulated nodes answering their probe plan at once.
    probing: tokio::sync::Semaphore,
    /// When the simulated ranks started connecting, as every shard's
    /// clock reads it.
    t0: Instant,
    /// What every simulated rank's check-in shares, read from the fixture
    /// once (not once per rank: the simulator's cost, not rank 0's).
    versions: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    devices: preflight_result::cluster::Devices,
}

/// One simulated rank's times (ms since `t0`) and the verdict it got.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
struct Outcome {
    connected_ms: Option<f64>,
    checked_in_ms: Option<f64>,
    /// The node's probe plan arrived, and its results went back.
    plan_ms: Option<f64>,
    probed_ms: Option<f64>,
    verdict_ms: Option<f64>,
    verdict: Option<(String, i32)>,
    error: Option<String>,
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}

impl Job {
    fn node_of(&self, rank: u32) -> u32 {
        rank / self.per_node
    }

    fn identity(&self, rank: u32) -> Identity {
        let (local_rank, local_world) = match self.layout {
            Layout::Flat => (0, 1),
            Layout::Nodes(_) => (rank % self.per_node, self.per_node),
        };
        Identity {
            rank,
            world_size: self.world,
            local_rank,
            local_world_size: local_world,
            node_rank: self.node_of(rank),
            nnodes: None,
            master_addr: self.master.ip().to_string(),
            master_port: self.master.port(),
            job_id: None,
            source: "torchrun".into(),
            nodelist: Vec::new(),
            probe_ports: None,
            master_ports: None,
            tasks_per_node: Vec::new(),
        }
    }

    fn checkin(&self, rank: u32, clock: Option<preflight_result::cluster::Clock>) -> CheckIn {
        let node = self.node_of(rank);
        let ip = node_ip(node).to_string();
        let hostname = if node == 0 {
            self.rank0_host.clone()
        } else {
            format!("sim{node:05}")
        };
        CheckIn {
            identity: self.identity(rank),
            hostname,
            addr: ip.clone(),
            pid: std::process::id(),
            tool_version: preflight_result::report::TOOL.version.to_string(),
            checklist_hash: self.checklist_hash.clone(),
            local_verdict: "ready".into(),
            failed: Vec::new(),
            versions: self.versions.clone(),
            env: self.env.clone(),
            devices: self.devices.clone(),
            clock,
            hostname_addrs: vec![ip],
            probe_addr: self.probe_addrs[node as usize].clone(),
            probe_error: None,
            interface: Some("lo".into()),
            seen_from: None,
        }
    }
}

impl Job {
    fn client(&self) -> client::ClientConfig {
        client::ClientConfig {
            master_addr: self.master.ip().to_string(),
            master_port: self.master.port(),
            token: self.token.clone(),
            deadline: self.deadline,
            verdict_deadline: self.deadline + Duration::from_secs(3),
            timeout: self.timeout,
            clock_offset_ms: 0,
            alternates: Vec::new(),
            waiting: None,
        }
    }

    /// The ranks a connection from `node` checks in: one in the flat
    /// layout (or for a stray second claimant); all of the node's in the
    /// `nodes:K` layout, where the connection is the node leader's.
    fn ranks_of(&self, node: u32) -> Vec<u32> {
        let first = node * self.per_node;
        (first..(first + self.per_node).min(self.world)).collect()
    }
}

/// One connection to rank 0 from `node`, checking in `ranks` (a rank on
/// its own, or a node leader with its node's ranks), then the verdict:
/// one outcome per rank.
async fn connection(job: Arc<Job>, node: u32, ranks: Vec<u32>) -> Vec<Outcome> {
    let mut out = Outcome::default();
    let fail = |mut out: Outcome, e: String| {
        out.error = Some(e);
        vec![out; ranks.len()]
    };
    let cfg = job.client();
    let received = Arc::clone(&job.received);
    let local = Some(IpAddr::V4(node_ip(node)));
    let wrap = move |inner| Counted {
        inner,
        read: Arc::clone(&received),
    };
    let mut ch = match client::connect_via(&cfg, local, wrap).await {
        Ok(ch) => ch,
        Err(e) => return fail(out, e),
    };
    out.connected_ms = Some(ms(job.t0));
    let clock = client::sample_clock(&mut ch, 0, job.deadline).await;
    for r in &ranks {
        let msg = Msg::CheckIn(Box::new(job.checkin(*r, clock)));
        if let Err(e) = protocol::write(&mut ch, &msg, job.deadline).await {
            return fail(out, format!("check-in: {e}"));
        }
    }
    out.checked_in_ms = Some(ms(job.t0));
    if job.kill_node == Some(node) {
        // The node (its leader, or every rank of it) dies after checking
        // in: the connection closes.
        drop(ch);
        return fail(out, "killed after check-in".into());
    }
    match verdict(Arc::clone(&job), ch, cfg.verdict_deadline, &mut out).await {
        Ok(report) => {
            out.verdict_ms = Some(ms(job.t0));
            out.verdict = Some((report.verdict.name().to_string(), report.exit_code));
            vec![out; ranks.len()]
        }
        Err(e) => fail(out, e),
    }
}

/// `client::await_verdict` for a simulated node: the same messages, and
/// the probe plan answered by the same `reachability::probe_all`, but a
/// bounded number of nodes probing at once. Every probe's two ends are in
/// this one process, whose descriptors (20,000 here, and not raisable)
/// would run out with 2,048 nodes probing a dozen peers each at once;
/// real nodes each have their own.
///
/// The plan is answered beside the reading, not before it: a real node's
/// probes are done in milliseconds, long before rank 0's probe window
/// closes and the verdict comes, so its verdict never waits on them. Here
/// a node may still be queued for its turn to probe when the verdict
/// comes; it takes the verdict then (rank 0 has stopped listening for
/// results), as the real node would have, and gives its turn up.
async fn verdict<S: AsyncRead + AsyncWrite + Send + 'static>(
    job: Arc<Job>,
    ch: S,
    deadline: Instant,
    out: &mut Outcome,
) -> Result<preflight_result::cluster::ClusterReport, String> {
    let (mut rd, wr) = tokio::io::split(ch);
    let wr = Arc::new(tokio::sync::Mutex::new(wr));
    let mut probing: Option<tokio::task::JoinHandle<Result<f64, String>>> = None;
    let heard = loop {
        match protocol::read(&mut rd, deadline).await {
            Ok(Msg::Verdict { report, .. }) => break Ok(*report),
            Ok(Msg::ProbePlan {
                node,
                targets,
                timeout_ms,
            }) => {
                out.plan_ms = Some(ms(job.t0));
                let (job, wr) = (Arc::clone(&job), Arc::clone(&wr));
                probing = Some(tokio::spawn(async move {
                    let results = {
                        let _permit = job.probing.acquire().await;
                        let timeout = Duration::from_millis(timeout_ms.clamp(50, 5000));
                        reachability::probe_all(node, &targets, timeout).await
                    };
                    let mut w = wr.lock().await;
                    protocol::write(&mut *w, &Msg::ProbeResults { results }, deadline)
                        .await
                        .map_err(|e| format!("probe results: {e}"))?;
                    Ok(ms(job.t0))
                }));
            }
            Ok(Msg::Rejected { reason, .. }) => break Err(format!("rejected: {reason}")),
            Ok(_) => {}
            Err(e) => break Err(format!("no verdict: {e}")),
        }
    };
    if let Some(p) = probing {
        if p.is_finished() {
            // Results that could not be written change nothing now.
            if let Ok(Ok(at)) = p.await {
                out.probed_ms = Some(at);
            }
        } else {
            p.abort();
        }
    }
    heard
}

/// A rank of rank 0's own node in the `nodes:K` layout: it checks in
/// through rank 0's process, its node's leader, over the real local
/// socket, as a real local rank does.
async fn follower(job: Arc<Job>, rank: u32) -> Outcome {
    let mut out = Outcome::default();
    let until = Instant::now() + Duration::from_secs(5);
    let mut ch = match leader::connect(&job.token, &job.identity(rank), until).await {
        Ok(ch) => ch,
        Err(why) => {
            out.error = Some(format!("rank 0's node leader: {why}"));
            return out;
        }
    };
    out.connected_ms = Some(ms(job.t0));
    let mut c = job.checkin(rank, None);
    c.addr = String::new();
    c.probe_addr = None;
    if let Err(e) = protocol::write(&mut ch, &Msg::CheckIn(Box::new(c)), job.deadline).await {
        out.error = Some(format!("check-in with the leader: {e}"));
        return out;
    }
    out.checked_in_ms = Some(ms(job.t0));
    match client::await_verdict(&mut ch, job.deadline + Duration::from_secs(3)).await {
        Ok((report, _)) => {
            out.verdict_ms = Some(ms(job.t0));
            out.verdict = Some((report.verdict.name().to_string(), report.exit_code));
        }
        Err(e) => out.error = Some(e),
    }
    out
}

/// A probe listener that takes every connection and drops it at once.
async fn deaf(listener: tokio::net::TcpListener) {
    while let Ok((s, _)) = listener.accept().await {
        drop(s);
    }
}

/// Simulated nodes probing at once in one process: with 14 probes each
/// at 8,192 nodes, both ends in this process, about 7,000 descriptors
/// beside the 8,192 its 4,096 nodes hold.
const PROBING: usize = 256;

/// What rank 0 runs: the shipped cluster checks (the comparisons, the
/// reachability matrix, the barrier), no node checklist, no collectives.
/// The checks rank 0 runs: the cluster kinds alone, which the simulated
/// ranks' check-ins feed.
const RANK0_ONLY: &str = "cluster";

/// Rank 0's command line (a real `preflight run`, started below).
const RANK0_ARGS: &[&str] = &[
    "run",
    "--only",
    RANK0_ONLY,
    "--collective",
    "off",
    "--format",
    "json",
];

/// The hash of rank 0's checklist, made the way rank 0 makes it: every
/// simulated rank sends it, and a node with another checklist is named.
fn checklist_hash(root: &std::path::Path) -> Result<String, String> {
    let mut checklist = ChecklistSettings::shipped_with(Vec::new());
    checklist.only = vec![RANK0_ONLY.to_string()];
    checklist.root = root.to_path_buf();
    let checks = all_checks(&checklist)
        .and_then(|c| select(c, &checklist))
        .map_err(|e| e.to_string())?;
    Ok(preflight_checklist::checklist_hash(&checks))
}

/// Every node's probe listener this shard plays, on `port`, and where
/// every node (this shard's or another's) listens.
async fn listen_for_nodes(
    nodes: u32,
    port: u16,
    mine: &dyn Fn(u32) -> bool,
    deaf_node: Option<u32>,
) -> Result<(Vec<Option<String>>, Vec<tokio::task::JoinHandle<()>>), String> {
    let mut addrs = vec![None];
    let mut listeners = Vec::new();
    for k in 1..nodes {
        let addr = SocketAddr::new(IpAddr::V4(node_ip(k)), port);
        addrs.push(Some(addr.to_string()));
        if !mine(k) {
            continue;
        }
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                for l in listeners {
                    tokio::task::JoinHandle::abort(&l);
                }
                return Err(format!("{addr}, node {k}'s probe listener: {e}"));
            }
        };
        listeners.push(if deaf_node == Some(k) {
            tokio::spawn(deaf(listener))
        } else {
            tokio::spawn(reachability::serve(listener))
        });
    }
    Ok((addrs, listeners))
}

/// A port for every node's probe listener, from `from` on: below the
/// kernel's ephemeral range, where no connection's own end (the simulated
/// ranks make hundreds of thousands) can take it on some node's address
/// first.
fn probe_port(rendezvous: u16, from: u16) -> Result<u16, String> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    // Simulators started together start apart.
    let start = from.max(low.saturating_sub(8000) + (std::process::id() % 4000) as u16);
    (start..low)
        .filter(|p| *p != rendezvous)
        .find(|p| {
            [Ipv4Addr::LOCALHOST, node_ip(1)]
                .iter()
                .all(|ip| std::net::TcpListener::bind((*ip, *p)).is_ok())
        })
        .ok_or_else(|| format!("no free port below {low} for the probe listeners"))
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The tool's entry point; its exit code is 0 when every simulated rank
/// that lived got a verdict and all of them got rank 0's, else 1 (2 for a
/// usage error).
fn main() {
    std::process::exit(simulator());
}

fn simulator() -> i32 {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("preflight-rank-sim: {e}");
            return 1;
        }
    };
    match runtime.block_on(simulate(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("preflight-rank-sim: {e}");
            1
        }
    }
}

/// Nodes one simulator process plays at most, by default.
const NODES_PER_SHARD: u32 = 4096;

async fn simulate(args: Args) -> Result<i32, String> {
    if args.world < 2 {
        return Err("--world must be 2 or more".into());
    }
    preflight_cluster::raise_open_files();
    let per_node = args.layout.per_node(args.world);
    let nodes = args.world.div_ceil(per_node);
    let shards = args
        .shards
        .unwrap_or(nodes.div_ceil(NODES_PER_SHARD))
        .clamp(1, nodes.max(1));
    // With more than one shard, this process plays only rank 0's own
    // node's ranks and starts shards 1 to N for the other nodes, at a
    // lower priority than rank 0: on a real cluster rank 0 has its
    // machine, and the simulated nodes' probes (a real cluster's nodes
    // each run their own) must not take its core.
    let shard = args.shard.unwrap_or(0);
    if shard > shards || (shard == 0 && args.shard.is_some()) {
        return Err(format!("--shard {shard} of {shards}"));
    }
    let port = match args.port {
        Some(p) => p,
        None => free_port().map_err(|e| format!("a free port: {e}"))?,
    };
    // Every node's probe listener on its own address and this one port,
    // so that each shard knows where every other shard's nodes listen.
    // The first shard makes the secret; the others inherit it.
    let secret = match std::env::var("PREFLIGHT_TOKEN") {
        Ok(s) if args.shard.is_some() => s,
        _ => {
            let mut bytes = [0u8; 16];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
                .map_err(|e| format!("/dev/urandom: {e}"))?;
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        }
    };
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert("MASTER_ADDR".into(), "127.0.0.1".into());
    env.insert("MASTER_PORT".into(), port.to_string());
    env.insert("WORLD_SIZE".into(), args.world.to_string());
    env.insert("PREFLIGHT_TOKEN".into(), secret.clone());
    // Every node's addresses are loopback ones here: Gloo told so, as the
    // test hosts' jobs are, or `cluster.addresses` would rightly say that
    // peers on other nodes would connect to themselves.
    env.insert("GLOO_SOCKET_IFNAME".into(), "lo".into());
    if let Layout::Nodes(_) = args.layout {
        env.insert("LOCAL_WORLD_SIZE".into(), per_node.to_string());
    }
    let token = Token::resolve(&env)?;
    let facts = Facts::new(args.root.clone(), env.clone(), Vec::new());
    let report_path = args.report.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("rank-sim-{}-{port}.json", std::process::id()))
    });
    let mine = |k: u32| match shard {
        0 => shards == 1,
        i => k % shards == i - 1,
    };

    // Real probe listeners, one per simulated node (node 0 is rank 0's),
    // each on its node's address and one port that every shard knows. The
    // first shard picks the port; where another simulator running beside
    // this one holds it on some node's address, it picks the next.
    let mut candidate = args.probe_port.unwrap_or(0);
    let (probe_port, probe_addrs, listeners) = loop {
        if args.probe_port.is_none() {
            candidate = probe_port(port, candidate)?;
        }
        match listen_for_nodes(nodes, candidate, &mine, args.deaf_node).await {
            Ok((addrs, listeners)) => break (candidate, addrs, listeners),
            Err(e) if args.probe_port.is_some() => return Err(e),
            Err(_) => candidate += 1,
        }
    };

    // The same moment on every shard's clock.
    let since_t0 = |t0_ns: u128| {
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Duration::from_nanos(now_ns.saturating_sub(t0_ns) as u64)
    };
    let t0_ns = args.t0_unix_ns.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    });
    let started = Instant::now()
        .checked_sub(since_t0(t0_ns))
        .unwrap_or_else(Instant::now);
    let mut rank0 = None;
    let mut others = Vec::new();
    if shard == 0 {
        let mut cmd = tokio::process::Command::new(&args.preflight);
        cmd.args(RANK0_ARGS)
            .arg("--root")
            .arg(&args.root)
            .arg("--timeout")
            .arg(humantime::format_duration(args.timeout).to_string())
            .arg("--output")
            .arg(&report_path)
            .env_clear()
            .envs(&env)
            .env("RANK", "0")
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        if let Layout::Nodes(_) = args.layout {
            cmd.env("LOCAL_RANK", "0");
        }
        rank0 = Some(
            cmd.spawn()
                .map_err(|e| format!("{}: {e}", args.preflight.display()))?,
        );
        let me = std::env::current_exe().map_err(|e| format!("this program: {e}"))?;
        for i in (1..=shards).filter(|_| shards > 1) {
            let mut cmd = tokio::process::Command::new("nice");
            cmd.args(["-n", "10"])
                .arg(&me)
                .arg("--preflight")
                .arg(&args.preflight)
                .arg("--world")
                .arg(args.world.to_string())
                .arg("--layout")
                .arg(args.layout.name())
                .arg("--root")
                .arg(&args.root)
                .arg("--timeout")
                .arg(humantime::format_duration(args.timeout).to_string())
                .args(["--port", &port.to_string()])
                .args(["--probe-port", &probe_port.to_string()])
                .args(["--t0-unix-ns", &t0_ns.to_string()])
                .args(["--shards", &shards.to_string()])
                .args(["--shard", &i.to_string()])
                .env("PREFLIGHT_TOKEN", &secret)
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true);
            if let Some(k) = args.kill_node {
                cmd.args(["--kill-node", &k.to_string()]);
            }
            if let Some(k) = args.deaf_node {
                cmd.args(["--deaf-node", &k.to_string()]);
            }
            others.push(cmd.spawn().map_err(|e| format!("shard {i}: {e}"))?);
        }
    }
    let rank0_pid = rank0.as_ref().and_then(|c| c.id()).unwrap_or(0);

    let job = Arc::new(Job {
        world: args.world,
        layout: args.layout,
        per_node,
        master: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
        token,
        rank0_host: facts.hostname().to_string(),
        versions: checkin::versions(&facts),
        env: checkin::launch_env(&facts, facts.env_vars().keys().cloned()),
        devices: checkin::devices(&facts),
        checklist_hash: checklist_hash(&args.root)?,
        probe_addrs,
        deadline: Instant::now() + args.timeout,
        timeout: args.timeout,
        received: Arc::new(AtomicU64::new(0)),
        kill_node: args.kill_node,
        probing: tokio::sync::Semaphore::new(PROBING),
        t0: started,
    });
    let mut tasks = tokio::task::JoinSet::new();
    match args.layout {
        Layout::Flat => {
            for r in (1..args.world).filter(|r| mine(job.node_of(*r))) {
                tasks.spawn(connection(Arc::clone(&job), job.node_of(r), vec![r]));
            }
        }
        Layout::Nodes(_) => {
            if shard == 0 {
                for r in job.ranks_of(0).into_iter().skip(1) {
                    let job = Arc::clone(&job);
                    tasks.spawn(async move { vec![follower(job, r).await] });
                }
            }
            for node in (1..nodes).filter(|k| mine(*k)) {
                tasks.spawn(connection(Arc::clone(&job), node, job.ranks_of(node)));
            }
        }
    }
    if let Some(r) = args.duplicate.filter(|_| shard == 0) {
        tasks.spawn(connection(Arc::clone(&job), job.node_of(r), vec![r]));
    }
    let mut outcomes = Vec::new();
    while let Some(o) = tasks.join_next().await {
        outcomes.extend(o.unwrap_or_default());
    }
    let Some(mut rank0) = rank0 else {
        // A shard says what its ranks saw, for the first to sum up.
        let mut out = String::new();
        for o in &outcomes {
            out.push_str(&serde_json::to_string(o).unwrap_or_default());
            out.push('\n');
        }
        out.push_str(&format!("bytes {}\n", job.received.load(Ordering::Relaxed)));
        print!("{out}");
        for l in listeners {
            l.abort();
        }
        return Ok(0);
    };
    let status = tokio::time::timeout(args.timeout + Duration::from_secs(10), rank0.wait())
        .await
        .map_err(|_| "rank 0 did not exit".to_string())?
        .map_err(|e| e.to_string())?;
    // Rank 0 is the only child waited for yet: these are its figures.
    let (rss_mb, rank0_cpu) =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
            .map(|u| {
                let secs =
                    |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
                (
                    u.max_rss() as f64 / 1024.0,
                    secs(u.user_time()) + secs(u.system_time()),
                )
            })
            .unwrap_or((0.0, 0.0));
    for mut other in others {
        let mut text = String::new();
        if let Some(mut stdout) = other.stdout.take() {
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut text).await;
        }
        let _ = other.wait().await;
        for line in text.lines() {
            if let Some(n) = line.strip_prefix("bytes ") {
                job.received
                    .fetch_add(n.parse().unwrap_or(0), Ordering::Relaxed);
            } else if let Ok(o) = serde_json::from_str::<Outcome>(line) {
                outcomes.push(o);
            }
        }
    }
    for l in listeners {
        l.abort();
    }
    let own_cpu = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .map(|u| {
            let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            secs(u.user_time()) + secs(u.system_time())
        })
        .unwrap_or(0.0);
    let all_cpu = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|u| {
            let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            secs(u.user_time()) + secs(u.system_time())
        })
        .unwrap_or(0.0);
    println!(
        "cpu: rank 0 {rank0_cpu:.1} s, simulator {:.1} s ({shards} process(es)), wall {:.1} s",
        own_cpu + (all_cpu - rank0_cpu).max(0.0),
        started.elapsed().as_secs_f64()
    );
    let rank0_report: serde_json::Value = std::fs::read_to_string(&report_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    if args.report.is_none() {
        let _ = std::fs::remove_file(&report_path);
    }
    Ok(summarize(
        &args,
        &job,
        &outcomes,
        summary::Rank0 {
            code: status.code(),
            pid: rank0_pid,
            report: &rank0_report,
            rss_mb,
        },
        nodes,
    ))
}
