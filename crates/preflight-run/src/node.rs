//! Node mode: one `preflight run --nnodes N --node-rank K ...` per node
//! starts the node's ranks itself (re-executing this binary with RANK,
//! WORLD_SIZE, LOCAL_RANK, ... in the environment), as torchrun does. The
//! node-rank-0 agent also serves the rendezvous. The agent prints what its
//! first local rank printed and exits with its code, which is the cluster's.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::emit::{SPEAKER, emit_cluster_only};
use super::{Failure, RunSettings};
use preflight_checklist::Check;
use preflight_cluster::auth::Token;
use preflight_cluster::identity::{CHILD_MARKER, MAX_WORLD, NodePlan};
use preflight_cluster::{self as cluster, ServerInput, failure, master_label};
use preflight_facts::Facts;
use preflight_ground::exit::ExitCode;

/// After the barrier's deadline, how long the agent waits for its ranks
/// before killing them: their verdict arrives within a second or three.
const GRACE: Duration = Duration::from_secs(6);

pub fn agent(
    plan: NodePlan,
    args: &RunSettings,
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
        .filter(|w| *w <= MAX_WORLD)
        .ok_or_else(|| {
            Failure::Usage(format!(
                "--nnodes {} × --nproc-per-node {nproc} is more ranks than {}",
                plan.nnodes, MAX_WORLD
            ))
        })?;
    let timeout = args.timeout.0;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Runtime(format!("cannot start the async runtime: {e}")))?;
    let mut token = Token::resolve(facts.env_vars()).map_err(Failure::Usage)?;
    // A one-node job is reached over loopback, which every user of the
    // host reaches too: without a secret, any of them could check in as
    // one of its ranks. Its ranks are all this agent's children, so it
    // makes a secret and hands it to them alone.
    let own_secret = if plan.nnodes == 1 && !token.is_secret() {
        let secret = preflight_cluster::auth::fresh_secret().map_err(Failure::Usage)?;
        token = Token::new(secret.as_bytes(), preflight_cluster::auth::AGENT_SECRET);
        Some(secret)
    } else {
        None
    };
    let exe = std::env::current_exe().map_err(|e| {
        Failure::Runtime(format!("cannot find this program to start the ranks: {e}"))
    })?;
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();

    // The agent serves (node 0) and waits for its ranks: its part of the
    // rendezvous, whatever stage the ranks are in.
    preflight_ground::interrupt::enter("rendezvous");
    let watch = super::waiting::Watch::new(args, plan.node_rank == 0);
    let outcome = runtime.block_on(async {
        let mut port = plan.master_port;
        let server = if plan.node_rank == 0 {
            let served = cluster::start_node_server(
                &plan,
                world,
                nproc,
                &token,
                ServerInput {
                    facts: &facts,
                    cluster_checks,
                    timeout,
                    strict: args.strict,
                    started,
                    linger,
                    token: token.clone(),
                    waiting: watch.sender.clone(),
                },
            )
            .await?;
            port = served.1;
            Some(served.0)
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
                .stdin(Stdio::null());
            if let Some(secret) = &own_secret {
                cmd.env(preflight_cluster::auth::TOKEN_VAR, secret)
                    .env_remove(preflight_cluster::auth::TOKEN_FILE_VAR);
            }
            cmd.stdout(if local == 0 {
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
        // A signal to the agent goes on to its ranks: each ends as an
        // interrupted rank does, with its report, which the agent passes on.
        let pids: Vec<u32> = children.iter().filter_map(|c| c.id()).collect();
        tokio::spawn(async move {
            let i = preflight_ground::interrupt::wait().await;
            let sig = i
                .signal
                .parse::<nix::sys::signal::Signal>()
                .unwrap_or(nix::sys::signal::Signal::SIGTERM);
            for pid in pids {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
            }
        });
        // The ranks run the collective stage after the verdict.
        let end = started + timeout + GRACE + linger;
        let mut speaker = None;
        let mut codes = Vec::new();
        let wait = async {
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
        };
        // The agent serves the rendezvous: it says whom it waits for.
        tokio::select! {
            () = wait => {}
            () = watch.show(started + timeout) => {}
        }
        watch.done();
        if let Some(server) = server {
            let _ = tokio::time::timeout_at(end, server).await;
        }
        Ok((speaker, codes))
    });
    runtime.shutdown_background();
    match outcome {
        Err(report) => emit_cluster_only(args, facts, report),
        Ok((Some((stdout, code)), _)) => {
            preflight_report::output::write_stdout(&String::from_utf8_lossy(&stdout))
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
