//! Rank 0's side of the rendezvous: where it listens (MASTER_PORT, the
//! range it may move to, a one-node job's own port), why it cannot, and
//! the server it starts there.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::auth::{self, Token};
use super::identity::{self, Identity};
use super::{Waiting, barrier, clock_offset, failure_with_hint, master_label, server};
use preflight_checklist::Check;
use preflight_facts::Facts;
use preflight_result::About;
use preflight_result::cluster::ClusterReport;

/// Rank 0 of a launcher-started job serves the rendezvous itself.
fn serves(identity: &Identity) -> bool {
    identity.rank == 0 && identity.source != "node"
}

/// The rendezvous server of a launcher-started rank 0, or `None` for the
/// other ranks. Started before the checklist runs, so that the other ranks
/// find the port open as early as possible; `Err` is the verdict when the
/// port cannot be bound.
pub type Server = Result<Option<tokio::task::JoinHandle<ClusterReport>>, Box<ClusterReport>>;

/// What a rendezvous server needs besides where it listens and whom it
/// expects: the same for rank 0 and for node mode's agent.
pub struct ServerInput<'a> {
    pub facts: &'a Arc<Facts>,
    pub cluster_checks: Vec<Arc<Check>>,
    pub timeout: Duration,
    pub strict: bool,
    pub started: Instant,
    /// The collective stage's budget: how long the store stays up after
    /// the verdict.
    pub linger: Duration,
    pub token: Token,
    pub waiting: Waiting,
}

/// Where a server listens and whom it expects.
struct Serving {
    addr: String,
    port: u16,
    world_size: u32,
    placement: barrier::Placement,
    token: Token,
    /// 0 for rank 0's server, none for node mode's agent.
    rank: Option<u32>,
    /// For the report's warnings: why it serves where it does.
    notes: Vec<String>,
}

/// The server, on a thread and runtime of its own: rank 0's own work
/// (its checklist, its part of the collective stage, timed exchanges with
/// its peers) and the serving of every other rank never wait for each
/// other on one task queue, so rank 0's extra work never makes it look
/// slow, and a busy rank 0 still answers its peers at once. The handle is
/// a task on the caller's runtime that ends with the server's verdict.
fn spawn_server(
    input: ServerInput<'_>,
    serving: Serving,
    listener: tokio::net::TcpListener,
) -> tokio::task::JoinHandle<ClusterReport> {
    let cfg = server::ServerConfig {
        bound: server::bound_name(&serving.addr, &listener),
        world_size: serving.world_size,
        placement: serving.placement,
        master: master_label(&serving.addr, serving.port),
        token: serving.token,
        started: input.started,
        deadline: input.started + input.timeout,
        timeout: input.timeout,
        strict: input.strict,
        clock_offset_ms: clock_offset(input.facts),
        checks: input.cluster_checks,
        facts: Arc::clone(input.facts),
        linger: input.linger,
        serving_rank: serving.rank,
        notes: serving.notes,
        waiting: input.waiting,
    };
    let store_end = server::store_end(&cfg);
    // What the relay says if the server's thread cannot run at all.
    let (world_size, master, token) = (cfg.world_size, cfg.master.clone(), cfg.token.clone());
    let lost = move |why: String| {
        failure_with_hint(
            world_size,
            master,
            &token,
            format!("rank 0 could not serve the rendezvous: {why}"),
            "Read the error: the process ran out of threads or file descriptors (ulimit -u, ulimit -n).",
            About::default(),
        )
    };
    let listener = match listener.into_std() {
        Ok(l) => l,
        Err(e) => {
            let why = format!("its listener could not be handed to its thread ({e})");
            return tokio::spawn(async move { lost(why) });
        }
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<ClusterReport>();
    let started = std::thread::Builder::new()
        .name("rendezvous".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                // Registered with this thread's runtime, not the caller's.
                if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                    let _ = tx.send(server::serve(cfg, listener).await);
                }
                // The store's connections are this runtime's tasks: they
                // serve the collective stage until the store's own end.
                tokio::time::sleep_until(store_end).await;
            });
        });
    match started {
        Ok(_) => tokio::spawn(async move {
            rx.await
                .unwrap_or_else(|_| lost("its thread ended without a verdict".into()))
        }),
        Err(e) => {
            let why = format!("no thread for it ({e})");
            tokio::spawn(async move { lost(why) })
        }
    }
}

/// Rank 0's rendezvous, started before its checklist runs.
pub async fn start_server(id: &Identity, input: ServerInput<'_>) -> Server {
    if !serves(id) {
        return Ok(None);
    }
    let token = input.token.clone();
    match bind_in_range(id, input.facts).await {
        Ok((listener, port, notes)) => {
            let place = identity::rendezvous_ports(id.master_port, id.master_ports)
                .iter()
                .position(|p| *p == port)
                .unwrap_or(0);
            let token = token.at(place);
            let serving = Serving {
                addr: id.master_addr.clone(),
                port,
                world_size: id.world_size,
                placement: barrier::Placement {
                    nodelist: id.nodelist.clone(),
                    tasks_per_node: id.tasks_per_node.clone(),
                    local_world_size: id.local_world_size,
                    master_host: Some(id.master_addr.clone()),
                },
                token,
                rank: Some(id.rank),
                notes,
            };
            Ok(Some(spawn_server(input, serving, listener)))
        }
        Err(e) => {
            let BindFailure {
                mut why,
                hint,
                held_by,
            } = bind_failure(&id.master_addr, id.master_port, &e, &token, input.facts).await;
            if let Some(range) = id
                .master_ports
                .filter(|_| e.kind() == std::io::ErrorKind::AddrInUse)
            {
                let tried = identity::rendezvous_ports(id.master_port, Some(range)).len();
                why.push_str(&format!(
                    "; so are the {} other ports rank 0 may move to ({} {range})",
                    tried - 1,
                    identity::MASTER_PORTS_VAR
                ));
            }
            let master = master_label(&id.master_addr, id.master_port);
            Err(Box::new(failure_with_hint(
                id.world_size,
                master,
                &token,
                why,
                &hint,
                About {
                    holders: held_by,
                    ..About::default()
                },
            )))
        }
    }
}

/// Rank 0's listener: on MASTER_PORT, else, with PREFLIGHT_MASTER_PORTS,
/// on the first free port after it in that range (a stranger who binds
/// the port first, which anyone can compute from the job id in the Slurm
/// prolog, moves the rendezvous instead of stopping it; the ranks find it
/// by its proof of the job secret). The port it holds, and a note naming
/// what held the ports it passed over. `Err`: MASTER_PORT's error, when
/// no port could be had.
async fn bind_in_range(
    id: &Identity,
    facts: &Facts,
) -> Result<(tokio::net::TcpListener, u16, Vec<String>), std::io::Error> {
    let ports = identity::rendezvous_ports(id.master_port, id.master_ports);
    let mut taken: Vec<u16> = Vec::new();
    let mut first_error = None;
    for &port in &ports {
        match server::bind(&id.master_addr, port).await {
            Ok(listener) => {
                let mut notes = Vec::new();
                if !taken.is_empty() {
                    let held: Vec<String> = preflight_kinds::port_holder::holders_of(facts, &taken)
                        .into_iter()
                        .map(|(p, found)| match found {
                            Ok(found) if !found.is_empty() => format!(
                                "{p} (held by {})",
                                found
                                    .iter()
                                    .map(|h| h.describe())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                            _ => format!("{p} (held by a process this user cannot inspect)"),
                        })
                        .collect();
                    notes.push(format!(
                        "MASTER_PORT {} on {} was taken: rank 0 serves on {port} instead, within {} {}; taken: {}",
                        id.master_port,
                        id.master_addr,
                        identity::MASTER_PORTS_VAR,
                        id.master_ports.map(|r| r.to_string()).unwrap_or_default(),
                        held.join(", ")
                    ));
                }
                return Ok((listener, port, notes));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && ports.len() > 1 => {
                taken.push(port);
                first_error.get_or_insert(e);
            }
            Err(e) => return Err(first_error.unwrap_or(e)),
        }
    }
    Err(first_error.unwrap_or_else(|| std::io::Error::other("no port to bind")))
}

/// Node mode's rendezvous, served by the node-rank-0 agent for every rank
/// it and the other agents start: binds the plan's port (a free one
/// outside the ephemeral range when it is 0) and serves there; returns the
/// server and the port it holds, or the verdict when it cannot bind.
pub async fn start_node_server(
    plan: &identity::NodePlan,
    world_size: u32,
    local_world_size: u32,
    token: &Token,
    input: ServerInput<'_>,
) -> Result<(tokio::task::JoinHandle<ClusterReport>, u16), ClusterReport> {
    let port = plan.master_port;
    let bound = if port == 0 {
        bind_outside_ephemeral(&plan.master_addr, input.facts).await
    } else {
        server::bind(&plan.master_addr, port).await
    };
    match bound {
        Ok(listener) => {
            let port = listener.local_addr().map(|a| a.port()).unwrap_or(port);
            let serving = Serving {
                addr: plan.master_addr.clone(),
                port,
                world_size,
                placement: barrier::Placement {
                    nodelist: plan.nodelist.clone(),
                    tasks_per_node: Vec::new(),
                    local_world_size,
                    master_host: Some(plan.master_addr.clone()),
                },
                token: token.clone(),
                rank: None,
                notes: plan.notes.clone(),
            };
            Ok((spawn_server(input, serving, listener), port))
        }
        Err(e) => {
            let failed = bind_failure(&plan.master_addr, port, &e, token, input.facts).await;
            let master = master_label(&plan.master_addr, port);
            let about = About {
                holders: failed.held_by,
                ..About::default()
            };
            Err(failure_with_hint(
                world_size,
                master,
                token,
                failed.why,
                &failed.hint,
                about,
            ))
        }
    }
}

/// Why rank 0 could not listen, what to do, and who holds the port.
pub struct BindFailure {
    pub why: String,
    pub hint: String,
    pub held_by: Vec<u32>,
}

/// Why rank 0 cannot serve on the port: another job's preflight there is
/// named as such (we ask it, with our token, and it says the tokens differ).
pub async fn bind_failure(
    host: &str,
    port: u16,
    error: &std::io::Error,
    token: &Token,
    facts: &Facts,
) -> BindFailure {
    let cannot_bind = format!(
        "Rank 0 must be able to listen on MASTER_PORT {port}: stop what holds it, or choose another MASTER_PORT for this job, the same on every node."
    );
    if error.kind() != std::io::ErrorKind::AddrInUse {
        let label = master_label(host, port);
        // The name itself, asked again: a lookup that fails is no port
        // problem, and an address of another machine neither.
        let resolved = tokio::time::timeout(
            Duration::from_secs(3),
            tokio::net::lookup_host((host, port)),
        )
        .await;
        let hint = match resolved {
            Ok(Err(_)) | Err(_) => format!(
                "MASTER_ADDR `{host}` does not resolve on rank 0's node: add it to DNS or /etc/hosts on every node (`getent hosts {host}` shows what this node gets), or set MASTER_ADDR to rank 0's own address."
            ),
            Ok(Ok(_)) if error.kind() == std::io::ErrorKind::AddrNotAvailable => format!(
                "MASTER_ADDR `{host}` is not an address of this node, yet this process is rank 0: start rank 0 on MASTER_ADDR's host, or set MASTER_ADDR to this node's address (`ip -br addr`)."
            ),
            Ok(Ok(_)) => cannot_bind,
        };
        return BindFailure {
            why: format!("rank 0 cannot listen on {label}: {error}"),
            hint,
            held_by: Vec::new(),
        };
    }
    let probe = async {
        let mut s = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        let deadline = Instant::now() + Duration::from_secs(2);
        Some(auth::client(&mut s, token, deadline).await)
    };
    let message = match tokio::time::timeout(Duration::from_secs(3), probe).await {
        Ok(Some(Err(auth::AuthError::OtherJob { .. }))) => format!(
            "port {port} on {host} is in use by another job: a preflight with another job token already serves there"
        ),
        Ok(Some(Ok(_))) => format!(
            "port {port} on {host} is in use by another preflight of this same job: two processes think they are rank 0"
        ),
        // As `net.master_port_free` says it: the holder by pid and command.
        _ => match preflight_kinds::port_holder::holders(facts, port) {
            Ok(found) if !found.is_empty() => {
                let who: Vec<String> = found.iter().map(|h| h.describe()).collect();
                let kill: Vec<String> = found.iter().map(|h| h.pid.to_string()).collect();
                return BindFailure {
                    why: format!(
                        "port {port} on {host} is in use by another program: held by {}",
                        who.join(", ")
                    ),
                    hint: format!(
                        "Stop what holds MASTER_PORT {port} on rank 0's host (`kill {}`), or choose another MASTER_PORT for this job, the same on every node.",
                        kill.join(" ")
                    ),
                    held_by: found.iter().map(|h| h.pid).collect(),
                };
            }
            _ => format!(
                "port {port} on {host} is in use by another program (`ss -ltnp 'sport = :{port}'` names it)"
            ),
        },
    };
    BindFailure {
        why: message,
        hint: cannot_bind,
        held_by: Vec::new(),
    }
}

/// A one-node job picks its own port. The kernel's choice would come from
/// the ephemeral range, where an outgoing connection can take it (the very
/// thing `launch_env` warns about), so try a few ports below the usual
/// 29500 first.
async fn bind_outside_ephemeral(
    addr: &str,
    facts: &Facts,
) -> Result<tokio::net::TcpListener, std::io::Error> {
    let ephemeral = facts.ephemeral_ports();
    for port in 29400..29500u16 {
        if ephemeral.is_some_and(|(low, high)| (low..=high).contains(&port)) {
            continue;
        }
        if let Ok(listener) = server::bind(addr, port).await {
            return Ok(listener);
        }
    }
    server::bind(addr, 0).await
}
