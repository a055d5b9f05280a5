//! Node mode: one `preflight run --nnodes N --node-rank K ...` per node
//! starts the node's ranks itself (re-executing this binary with RANK,
//! WORLD_SIZE, LOCAL_RANK, ... in the environment), as torchrun does. The
//! node-rank-0 agent also serves the rendezvous. The agent prints what its
//! first local rank printed and exits with its code, which is the cluster's.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::auth::{self, Token};
use super::identity::{CHILD_MARKER, NodePlan};
use super::rendezvous::{self, ServerConfig};
use super::{clock_offset, failure, master_label};
use crate::checklist::Check;
use crate::cli::RunArgs;
use crate::commands::Failure;
use crate::exit::ExitCode;
use crate::facts::Facts;

/// Set to 0 for the local ranks whose output nobody reads: they must not
/// write `--output` files over the first rank's.
pub const SPEAKER: &str = "PREFLIGHT_NODE_SPEAKER";

/// After the barrier's deadline, how long the agent waits for its ranks
/// before killing them: their verdict arrives within a second or three.
const GRACE: Duration = Duration::from_secs(6);

/// Why rank 0 cannot serve on the port: another job's preflight there is
/// named as such (we ask it, with our token, and it says the tokens differ).
pub async fn bind_failure(host: &str, port: u16, error: &std::io::Error, token: &Token) -> String {
    if error.kind() != std::io::ErrorKind::AddrInUse {
        return format!(
            "rank 0 cannot listen on {}: {error}",
            master_label(host, port)
        );
    }
    let probe = async {
        let mut s = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        let deadline = Instant::now() + Duration::from_secs(2);
        Some(auth::client(&mut s, token, deadline).await)
    };
    match tokio::time::timeout(Duration::from_secs(3), probe).await {
        Ok(Some(Err(auth::AuthError::OtherJob))) => format!(
            "port {port} on {host} is in use by another job: a preflight with another job token already serves there"
        ),
        Ok(Some(Ok(()))) => format!(
            "port {port} on {host} is in use by another preflight of this same job: two processes think they are rank 0"
        ),
        _ => format!(
            "port {port} on {host} is in use by another program (`ss -ltnp 'sport = :{port}'` names it); pick another MASTER_PORT"
        ),
    }
}

pub fn agent(
    plan: NodePlan,
    args: &RunArgs,
    facts: Arc<Facts>,
    cluster_checks: Vec<Arc<Check>>,
    started: Instant,
    linger: Duration,
) -> Result<ExitCode, Failure> {
    let nproc = plan
        .nproc
        .unwrap_or_else(|| facts.accelerators().len().max(1) as u32)
        .max(1);
    let world = plan
        .nnodes
        .checked_mul(nproc)
        .filter(|w| *w <= super::identity::MAX_WORLD)
        .ok_or_else(|| {
            Failure::Usage(format!(
                "--nnodes {} × --nproc-per-node {nproc} is more ranks than {}",
                plan.nnodes,
                super::identity::MAX_WORLD
            ))
        })?;
    let timeout = args.timeout.0;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Usage(format!("cannot start the async runtime: {e}")))?;
    let token = Token::resolve(facts.env_vars());
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Usage(format!("cannot find this program to start the ranks: {e}")))?;
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();

    let outcome = runtime.block_on(async {
        let mut port = plan.master_port;
        let server = if plan.node_rank == 0 {
            let bound = if port == 0 {
                bind_outside_ephemeral(&plan.master_addr, &facts).await
            } else {
                rendezvous::bind(&plan.master_addr, port).await
            };
            match bound {
                Ok(listener) => {
                    port = listener.local_addr().map(|a| a.port()).unwrap_or(port);
                    let master = master_label(&plan.master_addr, port);
                    Some(tokio::spawn(rendezvous::serve(
                        ServerConfig {
                            bound: rendezvous::bound_name(&plan.master_addr, &listener),
                            world_size: world,
                            placement: super::barrier::Placement {
                                nodelist: plan.nodelist.clone(),
                                tasks_per_node: Vec::new(),
                                local_world_size: nproc,
                                master_host: Some(plan.master_addr.clone()),
                            },
                            master,
                            token: token.clone(),
                            started,
                            deadline: started + timeout,
                            timeout,
                            strict: args.strict,
                            clock_offset_ms: clock_offset(&facts),
                            checks: cluster_checks,
                            facts: Arc::clone(&facts),
                            linger,
                        },
                        listener,
                    )))
                }
                Err(e) => {
                    let why = bind_failure(&plan.master_addr, port, &e, &token).await;
                    let master = master_label(&plan.master_addr, port);
                    return Err(failure(world, master, &token, why));
                }
            }
        } else {
            None
        };

        let mut children = Vec::new();
        for local in 0..nproc {
            let rank = plan.node_rank * nproc + local;
            let mut cmd = tokio::process::Command::new(&exe);
            cmd.args(&argv)
                .env(CHILD_MARKER, "1")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", local.to_string())
                .env("LOCAL_WORLD_SIZE", nproc.to_string())
                .env("GROUP_RANK", plan.node_rank.to_string())
                .env("MASTER_ADDR", &plan.master_addr)
                .env("MASTER_PORT", port.to_string())
                .env(SPEAKER, if local == 0 { "1" } else { "0" })
                .stdin(Stdio::null())
                .stdout(if local == 0 {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stderr(Stdio::inherit())
                .kill_on_drop(true);
            match cmd.spawn() {
                Ok(child) => children.push(child),
                Err(e) => {
                    return Err(failure(
                        world,
                        master_label(&plan.master_addr, port),
                        &token,
                        format!("cannot start local rank {rank}: {e}"),
                    ));
                }
            }
        }
        // The ranks run the collective stage after the verdict.
        let end = started + timeout + GRACE + linger;
        let mut speaker = None;
        let mut codes = Vec::new();
        for (i, child) in children.into_iter().enumerate() {
            match tokio::time::timeout_at(end, child.wait_with_output()).await {
                Ok(Ok(out)) => {
                    let code = out.status.code().unwrap_or(ExitCode::NotReady.code());
                    if i == 0 {
                        speaker = Some((out.stdout, code));
                    }
                    codes.push(code);
                }
                // Dropping the child kills it (kill_on_drop).
                _ => codes.push(ExitCode::NotReady.code()),
            }
        }
        if let Some(server) = server {
            let _ = tokio::time::timeout_at(end, server).await;
        }
        Ok((speaker, codes))
    });
    runtime.shutdown_background();
    match outcome {
        Err(report) => crate::commands::emit_cluster_only(args, &facts, report),
        Ok((Some((stdout, code)), _)) => {
            crate::report::output::write_stdout(&String::from_utf8_lossy(&stdout))
                .map_err(|e| Failure::Usage(format!("cannot write the report: {e}")))?;
            Ok(exit_code(code))
        }
        Ok((None, codes)) => {
            eprintln!(
                "preflight: local rank 0 gave no verdict before the deadline (exit codes {codes:?})"
            );
            Ok(ExitCode::NotReady)
        }
    }
}

fn exit_code(code: i32) -> ExitCode {
    match code {
        0 => ExitCode::Ready,
        2 => ExitCode::Usage,
        3 => ExitCode::Incomplete,
        _ => ExitCode::NotReady,
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
        if let Ok(listener) = rendezvous::bind(addr, port).await {
            return Ok(listener);
        }
    }
    rendezvous::bind(addr, 0).await
}
