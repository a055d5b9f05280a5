//! What each rank runs in the collective stage; `assemble` turns every
//! rank's result into the one report that every rank exits with.
//!
//! Order per backend: init through the rendezvous store; a verification
//! pass (all five operations, f32 and i32, odd element counts); the sweep
//! (allreduce, allgather, broadcast over the sizes); then the pairwise
//! round. The first failure ends the backend: its connections are closed so
//! that peers blocked on this rank learn at once. Each rank stores its
//! result under `coll/result/RANK`; rank 0 gathers them (waiting at most a
//! step's deadline plus a margin), names the culprit, and stores the
//! report under `coll/report`, which the others wait for.

use std::time::Duration;

use tokio::time::Instant;

use super::assemble::{alone, assemble, failed_with};
use super::config::Config;
use super::exercise::exercise;
use super::rank::{RankBackend, RankInfo, RankResult};
use super::supervisor;
use super::tcp::{self, Tcp};
use super::{Backend, OpError};
use super::{isolate, straggler};
use preflight_cluster::store;
use preflight_cluster::store::FrameError;
use preflight_result::collective::{CollectiveReport, CpuWait};
use preflight_result::report::Interrupted;

/// One rank's whole stage; every rank returns the same report (or, when
/// rank 0 is gone, its own view).
pub async fn run(cfg: &Config, mut info: RankInfo<'_>) -> CollectiveReport {
    let mut result = RankResult {
        rank: info.rank,
        host: info.host.clone(),
        backends: Vec::new(),
        pairs: Vec::new(),
        pair_error: None,
        second: None,
        link: None,
        oversubscribed: oversubscribed(info.local_world),
        cpu: None,
    };
    let mut mesh: Option<Tcp> = None;
    // The library workers load and probe while the TCP backend runs.
    let mut starting: Vec<(String, supervisor::Started)> = cfg
        .backends
        .iter()
        .filter(|n| super::builtin(n).is_none())
        .map(|n| (n.clone(), supervisor::start(n, cfg, &info)))
        .collect();
    for name in &cfg.backends {
        preflight_ground::interrupt::enter(format!("collective stage ({name})"));
        if let Some(avail) = super::builtin(name) {
            let mut rb = RankBackend::new(name, avail.available, avail.reason);
            let t = Instant::now();
            let ip = tcp::listen_ip(info.gloo_ifname.as_deref(), &info.route_ip);
            if ip.is_err() {
                rb.init_about.push(tcp::IFNAME_VAR.into());
            }
            let init = async {
                let ip = ip?;
                let same_host = tcp::same_host_mode(info.same_host.as_deref())?;
                let deadline = cfg.deadline(cfg.step_timeout * 2);
                Tcp::init(
                    info.conn,
                    info.rank,
                    info.world,
                    &ip,
                    same_host,
                    &info.token,
                    deadline,
                )
                .await
            };
            match init.await {
                Ok(mut b) => {
                    b.stall_after(cfg.step_timeout);
                    rb.init_ms = Some(t.elapsed().as_millis() as u64);
                    result.link = Some(b.link(&info.interfaces));
                    let on_row = info.on_row;
                    exercise(&mut b, cfg, &info.hooks, &mut rb, &mut |p| {
                        if let (Some(f), super::exercise::Progress::Passed { row: Some(r), .. }) =
                            (on_row, p)
                        {
                            f(name, r);
                        }
                    })
                    .await;
                    // Out of time, the connections stay open: a peer whose
                    // clock reads the deadline a moment later must not see
                    // this rank leave and blame it.
                    if rb.failure.is_some() && !rb.ran_out_of_time() {
                        b.abort();
                    } else {
                        mesh = Some(b);
                    }
                }
                Err(e) if cfg.out_of_time() => {
                    rb.init_error = Some(format!(
                        "{e}; {}",
                        OpError::RunDeadline { waiting_for: None }
                    ));
                    rb.out_of_time = true;
                }
                Err(e) => rb.init_error = Some(e),
            }
            result.backends.push(rb);
        } else {
            let i = starting.iter().position(|(n, _)| n == name);
            let started = match i {
                Some(i) => starting.swap_remove(i).1,
                None => supervisor::Started::Failed("no worker was started".into()),
            };
            let rb = supervisor::run(name, started, cfg, &mut info).await;
            result.backends.push(rb);
        }
        // A failure may be rank 0's leaving: a rank that rank 0 told of
        // its interruption stops here instead of starting the next backend.
        let last = result.backends.last_mut();
        let told = last.as_ref().and_then(|b| b.told.clone());
        let failed = last.is_some_and(|b| b.failure.is_some() || b.init_error.is_some());
        let told = match told {
            Some(notice) => Some(notice),
            None if failed && info.rank != 0 => store::rank0_interrupted(info.conn).await,
            None => None,
        };
        if let Some(notice) = told {
            return interrupted(cfg, &info.hosts, result, *notice);
        }
    }
    // Not when a backend ran out of time: the round would only wait for
    // ranks that are done.
    if let Some(b) = mesh.as_mut()
        && info.world >= 2
        && !result.backends.iter().any(RankBackend::ran_out_of_time)
        && !cfg.out_of_time()
    {
        // This thread runs the round: its wait for a CPU through both
        // passes is the rank's.
        let before = (preflight_facts::schedstat::this_thread(), Instant::now());
        match straggler::round(b, cfg.pair_bytes(), || cfg.deadline(cfg.step_timeout)).await {
            Ok(p) => {
                result.second = Some(isolate::run(b, cfg, &info.hosts, &p, cfg.pair_bytes()).await);
                result.pairs = p;
            }
            Err(e) => {
                let e = cfg.judge(e);
                if !matches!(e, OpError::RunDeadline { .. }) {
                    b.abort();
                }
                result.pair_error = Some(e);
            }
        }
        // Measured however the round ended: a rank starved enough to miss
        // its deadline is the one whose wait matters most.
        result.cpu = before
            .0
            .zip(preflight_facts::schedstat::this_thread())
            .map(|(then, now)| CpuWait {
                rank: info.rank,
                waited_ms: now.waited.saturating_sub(then.waited).as_millis() as u64,
                wall_ms: before.1.elapsed().as_millis() as u64,
            });
    }
    let margin = cfg.step_timeout + Duration::from_secs(5);
    let json = serde_json::to_string(&result).unwrap_or_default();
    let key = format!("coll/result/{}", info.rank);
    // Results and the report grow with the world: in parts, and a part the
    // store refuses is this rank's failure, never a result silently lost.
    let published = store::set_large(
        info.conn,
        &key,
        &json,
        Instant::now() + Duration::from_secs(5),
    )
    .await;
    if let (Err(FrameError::Interrupted(notice)), false) = (&published, info.rank == 0) {
        return interrupted(cfg, &info.hosts, result, (**notice).clone());
    }
    if let (Err(e), false) = (&published, info.rank == 0) {
        return alone(
            cfg,
            &info.hosts,
            result,
            format!("this rank could not send its result to rank 0 ({e})"),
        );
    }
    if info.rank == 0 {
        let gather_end = Instant::now() + margin;
        let mut all: Vec<Option<RankResult>> = (0..info.world).map(|_| None).collect();
        all[0] = Some(result);
        // Poll rather than wait on one rank at a time: a rank whose sockets
        // every peer saw close is gone, and waiting out the margin for its
        // result would only delay the verdict.
        loop {
            for r in 1..info.world {
                if all[r as usize].is_some() {
                    continue;
                }
                all[r as usize] = store::get_large(
                    info.conn,
                    &format!("coll/result/{r}"),
                    Duration::ZERO,
                    Instant::now() + Duration::from_secs(2),
                )
                .await
                .ok()
                .flatten()
                .and_then(|v| serde_json::from_str::<RankResult>(&v).ok());
            }
            let absent: Vec<u32> = (0..info.world)
                .filter(|r| all[*r as usize].is_none())
                .collect();
            if absent.is_empty() || Instant::now() >= gather_end {
                break;
            }
            let gone = |r: u32| {
                all.iter().flatten().any(|x| {
                    x.backends.iter().any(|b| {
                        matches!(
                            b.failure.as_ref().and_then(|f| f.error.as_ref()),
                            Some(OpError::Closed { peer, .. }) if *peer == r
                        )
                    })
                })
            };
            // Everyone else has reported and every absent rank is gone.
            if absent.iter().all(|r| gone(*r)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let report = assemble(cfg, info.world, &all, &info.hosts);
        let text = serde_json::to_string(&report).unwrap_or_default();
        let shared = store::set_large(
            info.conn,
            "coll/report",
            &text,
            Instant::now() + Duration::from_secs(5),
        )
        .await;
        // The others, without the report, fail the stage naming rank 0:
        // rank 0 fails it too, so every rank leaves with one verdict.
        if let Err(e) = shared {
            return failed_with(
                report,
                &format!("rank 0 could not send the collective report to the other ranks ({e})"),
            );
        }
        // The store lives in this process: stay until every rank that gave
        // a result has fetched the report (each acknowledges), or can no
        // longer (its connection ended), or would itself have stopped
        // waiting for it (or the run's deadline comes, though never sooner
        // than 5 s). A loaded node fetches late, and a rank that finds
        // rank 0 gone leaves with a verdict of its own.
        let ack_end = cfg
            .deadline(wait_for_report(margin))
            .max(Instant::now() + Duration::from_secs(5));
        for r in 1..info.world {
            if report.missing.contains(&r) {
                continue;
            }
            acknowledged(info.conn, r, ack_end).await;
        }
        report
    } else {
        #[cfg(feature = "test-hooks")]
        if let Some(ms) = preflight_ground::test_hooks::rank_bytes(
            &|k| std::env::var(k).ok(),
            preflight_ground::test_hooks::REPORT_FETCH_DELAY_MS,
            info.rank,
        ) {
            if let Ok(path) = std::env::var(preflight_ground::test_hooks::COLL_HANG_MARKER) {
                let _ = std::fs::write(path, "waiting to fetch the report");
            }
            tokio::time::sleep(Duration::from_millis(ms as u64)).await;
        }
        let wait = wait_for_report(margin);
        let got = store::get_large(
            info.conn,
            "coll/report",
            wait,
            Instant::now() + wait + Duration::from_secs(2),
        )
        .await;
        if let Ok(Some(_)) = &got {
            let _ = store::set(
                info.conn,
                &format!("coll/ack/{}", info.rank),
                "1",
                Instant::now() + Duration::from_secs(2),
            )
            .await;
        }
        match got {
            Ok(Some(v)) => match serde_json::from_str(&v) {
                Ok(r) => r,
                Err(e) => alone(cfg, &info.hosts, result, format!("rank 0's report: {e}")),
            },
            Ok(None) => alone(
                cfg,
                &info.hosts,
                result,
                "rank 0 sent no collective report in time".into(),
            ),
            Err(FrameError::Interrupted(notice)) => interrupted(cfg, &info.hosts, result, *notice),
            Err(e @ FrameError::Refused(_)) => alone(
                cfg,
                &info.hosts,
                result,
                format!("rank 0's collective report could not be read ({e})"),
            ),
            Err(e) => alone(
                cfg,
                &info.hosts,
                result,
                format!("rank 0 is gone (the rendezvous connection failed: {e})"),
            ),
        }
    }
}

/// Waits until rank `r` acknowledges the report or its connection to rank
/// 0's store ends, or `end`.
async fn acknowledged(conn: &mut store::Channel, r: u32, end: Instant) {
    let ack = format!("coll/ack/{r}");
    let gone = store::gone_key(r);
    // Each look waits a little on the acknowledgement, then asks after the
    // connection: a get waits on one key.
    let look = Duration::from_millis(200);
    while Instant::now() < end {
        let wait = look.min(end.saturating_duration_since(Instant::now()));
        match store::get(
            conn,
            &ack,
            wait,
            Instant::now() + wait + Duration::from_secs(1),
        )
        .await
        {
            Ok(Some(_)) => return,
            Ok(None) => {}
            Err(_) => return,
        }
        match store::get(
            conn,
            &gone,
            Duration::ZERO,
            Instant::now() + Duration::from_secs(1),
        )
        .await
        {
            Ok(None) => {}
            _ => return,
        }
    }
}

/// How long a rank waits for rank 0's report once its own result is
/// sent: rank 0 gathers for `margin`, then assembles and stores it.
fn wait_for_report(margin: Duration) -> Duration {
    margin * 2
}

/// This rank's own view, with no verdict: rank 0 was interrupted.
fn interrupted(
    cfg: &Config,
    hosts: &[String],
    own: RankResult,
    notice: Interrupted,
) -> CollectiveReport {
    let mut r = alone(cfg, hosts, own, notice.describe());
    for b in r.backends.iter_mut().filter(|b| b.verdict == "fail") {
        b.verdict = "incomplete".into();
    }
    r.interrupted = Some(notice);
    r
}

/// `Some("N ranks on M CPUs")` when this host runs more ranks than the
/// CPUs this process may use.
fn oversubscribed(local_world: u32) -> Option<String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (local_world as usize > cpus).then(|| {
        format!(
            "{local_world} ranks on {}",
            preflight_ground::values::count(cpus, "CPU")
        )
    })
}
