//! The cluster stage of `preflight run`: every rank meets the others at
//! rank 0, the nodes are compared with each other, every node proves it
//! reaches every other, and every rank leaves with the same verdict.
//!
//! One concept per module: `identity` (who am I), `hostlist` (Slurm
//! nodelists), `protocol` (frames), `auth` (job token), `serving` (where
//! rank 0 listens, and why it cannot), `server` (rank 0's rendezvous:
//! connections pending proof, each connection, the barrier's events, and the one report
//! it assembles, `server::verdict`), `client` (a rank's side of it),
//! `checkin` (what a rank reports), `barrier` (who is missing),
//! `reachability` (probe matrix), `store` (key-value store for the
//! collective stage). The comparison kinds are in `kinds::cluster`, the
//! stage's result in `result::cluster`, its rendering in `report::cluster`,
//! and node mode's agent in `commands::node`.

pub mod auth;
pub mod barrier;
pub mod checkin;
pub mod client;
pub mod hostlist;
pub mod identity;
pub mod leader;
pub mod protocol;
pub mod reachability;
pub mod sealed;
pub mod server;
mod serving;
pub mod store;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod unproven;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use auth::Token;
use identity::Identity;
use preflight_facts::Facts;
use preflight_result::cluster::ClusterReport;
use preflight_result::{About, CheckResult, Status, Verdict};
pub use serving::{Server, ServerInput, start_node_server, start_server};

/// Everything a rank brings to the cluster stage.
pub struct RankInput {
    pub identity: Identity,
    pub facts: Arc<Facts>,
    pub local: Vec<CheckResult>,
    pub local_verdict: Verdict,
    pub checklist_hash: String,
    pub timeout: Duration,
    /// When this process started: the barrier's deadline counts from here.
    pub started: Instant,
    pub token: Token,
    /// Whether the collective stage may follow: a rank checked in by its
    /// node's leader then opens its own connection to rank 0's store.
    pub collective: bool,
    /// Where this rank says how its attempts at reaching rank 0 go.
    pub waiting: Waiting,
    /// Its place among its node's ranks, settled before its checklist.
    pub node: NodeLink,
    /// A leader's node-scope findings, shared with its node's ranks.
    pub node_findings: Vec<CheckResult>,
}

/// A rank's place among its node's ranks, settled before its checklist
/// runs: whether the node's checks are its leader's to evaluate.
pub enum NodeLink {
    /// No known node layout, or one rank on its node.
    Alone,
    /// Local rank 0: it evaluates the node's checks, takes its node's
    /// check-ins from the start, and shares its findings with them.
    Leader(leader::Relay),
    /// Another local rank, connected to its leader, which evaluates the
    /// node's checks for it.
    Follower(sealed::Sealed<tokio::net::UnixStream>),
    /// Another local rank whose leader did not answer: it evaluates the
    /// node's checks itself, and says why.
    Unled(String),
}

impl NodeLink {
    /// Local rank 0 listens for its node's ranks; the others look for it,
    /// for a tenth of the timeout (1 to 5 s): every rank of a node starts
    /// within moments of the others.
    pub async fn settle(
        id: &Identity,
        token: &Token,
        started: Instant,
        timeout: Duration,
    ) -> NodeLink {
        if !leader::hierarchical(id) {
            return NodeLink::Alone;
        }
        let deadline = started + timeout;
        if id.local_rank == 0 {
            // A leader that cannot bind its socket (another process holds
            // the name) still checks in; its node's ranks then come on
            // their own, each evaluating its node's checks.
            return match leader::listen(id) {
                Ok(l) => NodeLink::Leader(leader::Relay::start(l, token.clone(), id, deadline)),
                Err(_) => NodeLink::Alone,
            };
        }
        let wait = (timeout / 10).clamp(Duration::from_secs(1), Duration::from_secs(5));
        let until = (Instant::now() + wait).min(deadline);
        match leader::connect(token, id, until).await {
            Ok(ch) => NodeLink::Follower(ch),
            Err(why) => NodeLink::Unled(why),
        }
    }

    /// Whether this rank leaves its node's checks to its leader.
    pub fn led(&self) -> bool {
        matches!(self, NodeLink::Follower(_))
    }
}

/// What the cluster stage brings back to a rank.
pub struct Staged {
    pub report: ClusterReport,
    /// The connection to rank 0, for the collective stage.
    pub link: Option<Link>,
    /// A led rank's node findings, from its leader; `None`: none came.
    pub node_findings: Option<Vec<CheckResult>>,
}

/// The test hook's clock offset (`test_hooks`), bounded to a day either
/// way so that no value of it can overflow the clock arithmetic; 0 in a
/// build without the `test-hooks` feature.
#[cfg(feature = "test-hooks")]
pub fn clock_offset(facts: &Facts) -> i64 {
    const DAY_MS: i64 = 24 * 3600 * 1000;
    facts
        .env(preflight_ground::test_hooks::CLOCK_OFFSET_MS)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .unwrap_or(0)
        .clamp(-DAY_MS, DAY_MS)
}

#[cfg(not(feature = "test-hooks"))]
pub fn clock_offset(_facts: &Facts) -> i64 {
    0
}

/// How a node's warning starts when strangers held its whole probe range
/// (the Slurm prolog names them in the job's comment).
pub const PROBE_RANGE_TAKEN: &str = "every port of the probe range";

/// The test hook's marker (`test_hooks`): written once this rank's
/// check-in has gone out, so that a test acts on a checked-in rank (stops
/// it, say), never on a guess of when that was.
fn checked_in(facts: &Facts) {
    #[cfg(feature = "test-hooks")]
    if let Some(path) = facts.env(preflight_ground::test_hooks::CHECKIN_MARKER) {
        let _ = std::fs::write(path, "checked in");
    }
    let _ = facts;
}

/// The tool version this rank reports: the test hook's (`test_hooks`) in
/// a test build, else the real one.
fn tool_version(facts: &Facts) -> String {
    #[cfg(feature = "test-hooks")]
    if let Some(v) = facts.env(preflight_ground::test_hooks::VERSION) {
        return v.to_string();
    }
    let _ = facts;
    preflight_result::report::TOOL.version.to_string()
}

pub fn master_label(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

const RENDEZVOUS_HINT: &str = "Compare MASTER_ADDR and MASTER_PORT on every rank; check that rank 0 started and that no firewall on its host blocks the port (`iptables -S`, `nft list ruleset`).";

/// The verdict of a rank that could not take part: it names why.
pub fn failure(world_size: u32, master: String, token: &Token, message: String) -> ClusterReport {
    failure_with_hint(
        world_size,
        master,
        token,
        message,
        RENDEZVOUS_HINT,
        About::default(),
    )
}

/// The results this stage prints that no checklist defines.
pub fn built_in_results() -> Vec<preflight_result::built_in::BuiltIn> {
    use preflight_result::built_in::BuiltIn;
    vec![
        BuiltIn {
            id: "cluster.rendezvous".into(),
            kind: "rendezvous",
            area: "cluster",
            severity: preflight_result::Severity::Fail,
            verifies: "This rank reached rank 0 at MASTER_ADDR:MASTER_PORT and proved it holds the job's secret (rank 0: it could listen there), within the run's deadline.".into(),
            why: "A rank that cannot reach rank 0 is the one that hangs a job's init for 10 to 30 minutes; only it knows why (a name that does not resolve, a refused or dropped port, another secret).",
            hint: RENDEZVOUS_HINT.into(),
            commands: "run, bench",
        },
        BuiltIn {
            id: "cluster.barrier".into(),
            kind: "barrier",
            area: "cluster",
            severity: preflight_result::Severity::Fail,
            verifies: "Every rank of WORLD_SIZE checked in at rank 0 before the deadline, each once, all with the same WORLD_SIZE and job secret; names the missing ranks and where they should have run.".into(),
            why: "The job's own init waits for the last rank: a rank that never starts, or starts twice, is the hang preflight names in seconds.",
            hint: barrier::MISSING_HINT.into(),
            commands: "run, bench",
        },
    ]
}

fn failure_with_hint(
    world_size: u32,
    master: String,
    token: &Token,
    message: String,
    hint: &str,
    about: About,
) -> ClusterReport {
    let check = CheckResult::built_in(
        "cluster.rendezvous",
        "rendezvous",
        "cluster",
        Status::Fail,
        message,
        Some(hint.into()),
    )
    .about(about);
    ClusterReport {
        verdict: Verdict::NotReady,
        exit_code: Verdict::NotReady.exit_code().code(),
        world_size,
        master,
        token: token.describe(),
        duration_ms: 0,
        nodes: Vec::new(),
        node_count: 0,
        full_report: None,
        barrier: Default::default(),
        checks: vec![check],
        reachability: Default::default(),
        culprits: Vec::new(),
        warnings: Vec::new(),
        interrupted: None,
        collective: None,
        phases: None,
    }
}

/// Raises this process's soft open-files limit to its hard limit: rank 0
/// holds a connection per rank, and the usual soft limit (1,024) is far
/// below the hard one. Where it cannot, the limit stays as it was, and the
/// cluster stage names a limit too low for the world.
pub fn raise_open_files() {
    use nix::sys::resource::{Resource, setrlimit};
    if let Some((soft, hard)) = preflight_facts::limits::open_files()
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// What this process is waiting for during the rendezvous, in words, for
/// the operator to watch: rank 0's count of the ranks checked in and the
/// first missing ones; another rank's attempts at reaching rank 0. `None`
/// where nobody watches.
pub type Waiting = Option<tokio::sync::watch::Sender<String>>;

/// The rendezvous connection, kept open after the verdict for the
/// collective stage's store, and the address it left from (the route's
/// choice of interface).
pub struct Link {
    pub stream: sealed::Channel,
    pub local_ip: String,
    /// Rank 0's `--timeout` deadline, as this rank's clock reads it: the
    /// same moment on every rank, give or take the verdict's delivery.
    pub until: Instant,
}

impl Link {
    /// Each rank's host, for the collective stage's messages: from the
    /// report on rank 0, which holds every node; from rank 0's store on
    /// the others, whose verdict holds only their own node. `Err` says
    /// why the list could not be read (the stage then names ranks alone).
    pub async fn hosts(&mut self, report: &ClusterReport) -> Result<Vec<String>, String> {
        if report.full_report.is_none() {
            return Ok(report.hosts_by_rank());
        }
        let deadline = (Instant::now() + Duration::from_secs(5)).min(self.until);
        let text = store::get_large(&mut self.stream, store::HOSTS_KEY, Duration::ZERO, deadline)
            .await
            .map_err(|e| format!("rank 0's list of hosts: {e}"))?
            .ok_or("rank 0 published no list of hosts")?;
        let hosts: Vec<String> =
            serde_json::from_str(&text).map_err(|e| format!("rank 0's list of hosts: {e}"))?;
        if hosts.len() != report.world_size as usize {
            return Err(format!(
                "rank 0's list of hosts names {} ranks, not {}",
                hosts.len(),
                report.world_size
            ));
        }
        Ok(hosts)
    }
}

/// One rank's cluster stage. Rank 0's server is borrowed, not taken: a
/// run cut short by a signal still reads the verdict it sent the others.
/// One rank's cluster stage: serve (rank 0 of a launcher-started job),
/// connect, check in, probe, and return the verdict rank 0 sent.
pub async fn rank_stage(mut input: RankInput, server: &mut Server) -> Staged {
    let node = std::mem::replace(&mut input.node, NodeLink::Alone);
    let staged = |report: ClusterReport| Staged {
        report,
        link: None,
        node_findings: None,
    };
    let id = &input.identity;
    let facts = &input.facts;
    let token = input.token.clone();
    let offset = clock_offset(facts);
    let deadline = input.started + input.timeout;
    let master = master_label(&id.master_addr, id.master_port);
    let server = match server {
        Ok(s) => s,
        Err(report) => return staged((**report).clone()),
    };
    // A rank outside the world cannot take part: it says so at once, where
    // it would otherwise retry the master until the deadline for a
    // check-in that rank 0 refuses.
    if id.rank >= id.world_size {
        let named = |names: Vec<&'static str>| {
            names
                .into_iter()
                .find_map(|n| facts.env(n).map(|v| (n, format!("{n}={v}"))))
        };
        let set: Vec<(&str, String)> = [
            named(preflight_facts::launch::rank_vars()),
            named(preflight_facts::launch::size_vars()),
        ]
        .into_iter()
        .flatten()
        .collect();
        let vars = set
            .iter()
            .map(|(_, shown)| shown.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let about = About {
            variables: set.iter().map(|(name, _)| name.to_string()).collect(),
            ..About::default()
        };
        let message = format!(
            "rank {} is not below the world size {}{}: this process cannot take part in the job",
            id.rank,
            id.world_size,
            if vars.is_empty() {
                String::new()
            } else {
                format!(" ({vars})")
            }
        );
        let hint = format!(
            "Give every process a distinct rank from 0 to {} and the same world size (the launcher sets both; check what the job script exports).",
            id.world_size - 1
        );
        return staged(failure_with_hint(
            id.world_size,
            master,
            &token,
            message,
            &hint,
            about,
        ));
    }

    let cfg = client::ClientConfig {
        master_addr: id.master_addr.clone(),
        master_port: id.master_port,
        token: token.clone(),
        deadline,
        verdict_deadline: deadline + Duration::from_secs(3),
        timeout: input.timeout,
        clock_offset_ms: offset,
        alternates: identity::rendezvous_ports(id.master_port, id.master_ports),
        // Rank 0's own server says more than its client could.
        waiting: if id.rank == 0 {
            None
        } else {
            input.waiting.clone()
        },
    };
    let mut node_findings = None;
    let result = match node {
        // Through the node's leader; a leader that never answered left
        // this rank to check in straight with rank 0.
        NodeLink::Follower(ch) => match follower_session(&cfg, &input, ch).await {
            Ok((r, l, shared)) => {
                node_findings = shared;
                Ok((r, l))
            }
            Err(Followed::NotRelayed(why)) => {
                eprintln!("preflight: warning: {why}: this rank checks in with rank 0 itself");
                session(&cfg, &input, None).await.map(|(r, l)| (r, Some(l)))
            }
            Err(Followed::Failed(e)) => Err(e),
        },
        NodeLink::Leader(relay) => session(&cfg, &input, Some(relay))
            .await
            .map(|(r, l)| (r, Some(l))),
        NodeLink::Alone | NodeLink::Unled(_) => {
            session(&cfg, &input, None).await.map(|(r, l)| (r, Some(l)))
        }
    };
    // Rank 0's own verdict may arrive before the others' are written: stay
    // until the server has sent them all. Its report is the whole one,
    // which rank 0 reports (its connection got its node's cut).
    let mut whole: Option<ClusterReport> = None;
    if let Some(handle) = server.as_mut()
        && let Ok(joined) = tokio::time::timeout_at(cfg.verdict_deadline, handle).await
    {
        // Done: a finished task must not be polled again.
        *server = None;
        whole = joined.ok();
    }
    match result {
        // Only the server this rank checked in at: a second process that
        // took an alternate port thinking it was rank 0 has a server of
        // its own, which nobody joined.
        Ok((report, link)) => Staged {
            report: whole
                .filter(|w| w.master == report.master)
                .unwrap_or(report),
            link,
            node_findings,
        },
        // Rank 0's own check-in never reached its server (no descriptor
        // left for it, the others' connections holding them all), which
        // heard from the rest of the job: that verdict is the job's, rank
        // 0 missing from it and the open-files warning in it (rank 0
        // reported "cannot reach the master" of itself). Not where rank 0
        // did check in (a second claimant of rank 0, a verdict that never
        // came): its client's failure stands.
        Err(message) => match whole.filter(|w| {
            w.node_count > 0
                && !w.barrier.complete
                && w.barrier.missing.iter().any(|m| m.rank == id.rank)
        }) {
            Some(mut w) => {
                w.warnings
                    .push(format!("rank 0's own check-in did not complete: {message}"));
                staged(w)
            }
            None => staged(failure(id.world_size, master, &token, message)),
        },
    }
}

/// What a rank reports of its node besides its checklist: gathered off the
/// runtime, 3 s at most (a resolver can hang).
struct Gathered {
    hostname_addrs: Vec<String>,
    interface: Option<String>,
    versions: std::collections::BTreeMap<String, String>,
    devices: preflight_result::cluster::Devices,
    env: std::collections::BTreeMap<String, String>,
    hostname: String,
}

/// Why this node's probe listener is outside the probe range: every port
/// of it is held, by whom (the first holders this user can see).
fn probe_range_taken(
    facts: &Facts,
    range: preflight_kinds::ports::PortRange,
    listener: &tokio::net::TcpListener,
) -> String {
    let mut who: Vec<String> = Vec::new();
    // The range's two ends, in one pass over every process's descriptors,
    // before this rank checks in.
    let ends: &[u16] = if range.first == range.last {
        &[range.first]
    } else {
        &[range.first, range.last]
    };
    for (_, found) in preflight_kinds::port_holder::holders_of(facts, ends) {
        for h in found.unwrap_or_default() {
            let d = h.describe();
            if !who.contains(&d) && who.len() < 3 {
                who.push(d);
            }
        }
    }
    let held = if who.is_empty() {
        "by processes this user cannot inspect".to_string()
    } else {
        format!("by {}", who.join(", "))
    };
    format!(
        "{PROBE_RANGE_TAKEN} {range} is taken ({held}): its probe listener took port {} instead",
        listener.local_addr().map(|a| a.port()).unwrap_or(0)
    )
}

/// What a rank reports of its node. A rank led by its node's leader
/// (`led`) leaves the node's versions and addresses to the leader's stamp.
async fn gather(facts: &Arc<Facts>, local_ip: &str, led: bool) -> Result<Gathered, String> {
    let facts = Arc::clone(facts);
    let ip = local_ip.to_string();
    let gathered = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::task::spawn_blocking(move || {
            let hostname = facts.hostname().to_string();
            let names = facts.env_vars().keys().cloned().collect::<Vec<_>>();
            Gathered {
                hostname_addrs: if led {
                    Vec::new()
                } else {
                    checkin::resolve_hostname(&facts, &hostname)
                },
                interface: if ip.is_empty() {
                    None
                } else {
                    checkin::interface_of(&facts, &ip)
                },
                versions: if led {
                    Default::default()
                } else {
                    checkin::versions(&facts)
                },
                devices: checkin::devices(&facts),
                env: checkin::launch_env(&facts, names.into_iter()),
                hostname,
            }
        }),
    )
    .await;
    match gathered {
        Ok(Ok(g)) => Ok(g),
        _ => Err("gathering this node's versions and addresses took longer than 3 s".into()),
    }
}

fn make_checkin(
    input: &RankInput,
    g: Gathered,
    addr: String,
    clock: Option<preflight_result::cluster::Clock>,
    probe: (Option<String>, Option<String>),
) -> checkin::CheckIn {
    let facts = &input.facts;
    checkin::CheckIn {
        identity: input.identity.clone(),
        hostname: g.hostname,
        addr,
        pid: std::process::id(),
        tool_version: tool_version(facts),
        checklist_hash: input.checklist_hash.clone(),
        local_verdict: input.local_verdict.name().to_string(),
        failed: checkin::failed_checks(&input.local),
        versions: g.versions,
        env: g.env,
        devices: g.devices,
        clock,
        hostname_addrs: g.hostname_addrs,
        probe_addr: probe.0,
        probe_error: probe.1,
        interface: g.interface,
        seen_from: None,
    }
}

/// Checks in with rank 0 on its own connection; a node leader (`relay`)
/// also relays its node's ranks' check-ins and hands them the verdict.
async fn session(
    cfg: &client::ClientConfig,
    input: &RankInput,
    relay: Option<leader::Relay>,
) -> Result<(ClusterReport, Link), String> {
    let mut stream = client::connect(cfg).await?;
    let local_ip = stream
        .get_ref()
        .local_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    // The probe listener lives on the address this rank reaches the master
    // from: the one its peers will have to reach.
    let (probe_listener, probe_error) =
        match reachability::listen(&local_ip, input.identity.probe_ports).await {
            Ok(l) => {
                let note = l
                    .taken
                    .map(|range| probe_range_taken(&input.facts, range, &l.listener));
                (Some(l.listener), note)
            }
            Err(e) => (None, Some(e)),
        };
    let probe_addr = probe_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string());
    // Serves peers' probes until this session ends, whichever way it ends.
    let (_probe_task, probe_addr, probe_error) = match probe_listener.map(reachability::serve_apart)
    {
        Some(Ok(serving)) => (Some(serving), probe_addr, probe_error),
        Some(Err(e)) => (None, None, Some(e)),
        None => (None, probe_addr, probe_error),
    };

    let clock_deadline = (Instant::now() + Duration::from_secs(2)).min(cfg.deadline);
    let clock = client::sample_clock(&mut stream, cfg.clock_offset_ms, clock_deadline).await;
    let g = gather(&input.facts, &local_ip, false).await?;
    let stamp = leader::Stamp {
        hostname: g.hostname.clone(),
        addr: local_ip.clone(),
        interface: g.interface.clone(),
        clock,
        versions: g.versions.clone(),
        hostname_addrs: g.hostname_addrs.clone(),
    };
    let checkin = make_checkin(input, g, local_ip.clone(), clock, (probe_addr, probe_error));
    protocol::write(
        &mut stream,
        &protocol::Msg::CheckIn(Box::new(checkin)),
        cfg.verdict_deadline,
    )
    .await
    .map_err(|e| format!("cannot check in with the master: {e}"))?;
    checked_in(&input.facts);
    let (mut rd, wr) = tokio::io::split(stream);
    let wr = Arc::new(tokio::sync::Mutex::new(wr));
    let relay = relay.map(|mut r| {
        r.attach(stamp, Arc::clone(&wr), cfg.deadline);
        r
    });
    let verdict = client::await_verdict_on(&mut rd, &wr, cfg.verdict_deadline).await;
    if let (Some(relay), Ok((report, until))) = (relay, &verdict) {
        let left = until.saturating_duration_since(Instant::now()).as_millis() as u64;
        relay.finish(report, left, &input.node_findings).await;
    }
    let (report, until) = verdict?;
    let wr = Arc::try_unwrap(wr)
        .map_err(|_| "the node's relay still holds the connection to rank 0".to_string())?
        .into_inner();
    Ok((
        report,
        Link {
            stream: rd.unsplit(wr),
            local_ip,
            until,
        },
    ))
}

/// How a led rank's session with its leader ended short of a verdict.
enum Followed {
    /// Before the leader said this rank's check-in went on: the rank
    /// checks in with rank 0 itself.
    NotRelayed(String),
    /// After it (rank 0 has the check-in, and names the rank lost with its
    /// leader), or for a reason a direct check-in would not mend.
    Failed(String),
}

/// A rank whose node leader checks it in: its check-in goes to the leader,
/// the verdict comes from it. For the collective stage it then opens its
/// own connection to rank 0 and takes over its store keys (`Attach`).
async fn follower_session(
    cfg: &client::ClientConfig,
    input: &RankInput,
    mut ch: sealed::Sealed<tokio::net::UnixStream>,
) -> Result<(ClusterReport, Option<Link>, Option<Vec<CheckResult>>), Followed> {
    let g = gather(&input.facts, "", true)
        .await
        .map_err(Followed::Failed)?;
    // The leader stamps its node's address, interface and clock sample.
    let checkin = make_checkin(input, g, String::new(), None, (None, None));
    let rank = input.identity.rank;
    protocol::write(
        &mut ch,
        &protocol::Msg::CheckIn(Box::new(checkin)),
        cfg.verdict_deadline,
    )
    .await
    .map_err(|e| {
        Followed::NotRelayed(format!(
            "cannot check in with this node's leader (local rank 0): {e}"
        ))
    })?;
    checked_in(&input.facts);
    // Until the leader says the check-in went on, its death leaves this
    // rank to check in itself, not missing.
    match protocol::read(&mut ch, cfg.verdict_deadline).await {
        Ok(protocol::Msg::Relayed) => {}
        Ok(protocol::Msg::Rejected { reason, .. }) => {
            return Err(Followed::Failed(format!(
                "this node's leader (local rank 0) refused this rank: {reason}"
            )));
        }
        Ok(other) => {
            return Err(Followed::NotRelayed(format!(
                "this node's leader (local rank 0) answered out of turn: {other:?}"
            )));
        }
        Err(e) => {
            return Err(Followed::NotRelayed(format!(
                "this node's leader (local rank 0) went away before checking this rank in: {e}"
            )));
        }
    }
    let client::Heard {
        report,
        until,
        node_findings,
    } = client::hear_verdict(&mut ch, cfg.verdict_deadline)
        .await
        .map_err(|e| {
            Followed::Failed(format!(
                "this node's leader (local rank 0), which checks its ranks in with rank 0, failed: {}",
                e.replace("the master", "the leader")
            ))
        })?;
    if !(input.collective && report.barrier.complete) {
        return Ok((report, None, node_findings));
    }
    let attach = client::ClientConfig {
        deadline: (Instant::now() + Duration::from_secs(10)).min(until),
        ..cfg.clone()
    };
    let mut stream = client::connect(&attach).await.map_err(Followed::Failed)?;
    let deadline = attach.deadline;
    protocol::write(&mut stream, &protocol::Msg::Attach { rank }, deadline)
        .await
        .map_err(|e| {
            Followed::Failed(format!(
                "cannot attach to rank 0 for the collective stage: {e}"
            ))
        })?;
    match protocol::read(&mut stream, deadline).await {
        Ok(protocol::Msg::StoreValue { .. }) => {}
        Ok(protocol::Msg::Rejected { reason, .. }) => {
            return Err(Followed::Failed(format!(
                "rank 0 refused this rank's store connection: {reason}"
            )));
        }
        other => {
            return Err(Followed::Failed(format!(
                "rank 0 did not answer this rank's store connection: {other:?}"
            )));
        }
    }
    let local_ip = stream
        .get_ref()
        .local_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    Ok((
        report,
        Some(Link {
            stream,
            local_ip,
            until,
        }),
        node_findings,
    ))
}
