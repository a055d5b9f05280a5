//! How rank 0 turns every rank's result into the one report every rank
//! exits with: per backend, available or why not (naming the ranks that
//! lack it), the operations verified, the sweep (the slowest rank's time),
//! where it ended and the rank at fault; the pairwise round's straggler.

use super::config::Config;
use super::ending::{availability_reason, explain, init_failure, out_of_time, rank_list};
use super::rank::{RankBackend, RankResult};
use super::sweep::Failure;
use super::{Op, OpError};
use super::{isolate, slowness};
use preflight_result::collective::{
    BackendReport, CollectiveReport, CpuWait, OpStatus, PairRate, Row, SweepSettings,
};

/// A rank without rank 0's report: its own result only.
pub fn alone(cfg: &Config, hosts: &[String], own: RankResult, why: String) -> CollectiveReport {
    let world = hosts.len() as u32;
    let rank = own.rank;
    let mut all: Vec<Option<RankResult>> = (0..world).map(|_| None).collect();
    if let Some(slot) = all.get_mut(rank as usize) {
        *slot = Some(own);
    }
    let mut r = assemble(cfg, world, &all, hosts);
    r.missing.clear();
    failed_with(r, &why)
}

/// Every backend that ran fails with `why`: the ranks could not share one
/// report, so none of them may call the stage a pass.
pub fn failed_with(mut r: CollectiveReport, why: &str) -> CollectiveReport {
    for b in r.backends.iter_mut().filter(|b| b.available) {
        b.verdict = "fail".into();
        b.ended = Some(match b.ended.take() {
            Some(e) => format!("{e}; {why}"),
            None => why.to_string(),
        });
    }
    r
}

/// A step that was slow on some rank, where no rank saw a wrong result:
/// in words, with the slow rank's figures. Every other rank's failure at
/// it (a peer that left the step, a wait that ended) follows from that
/// rank leaving the step.
fn slow_step(failures: &[(u32, &Failure)], host: &dyn Fn(u32) -> String) -> Option<String> {
    if failures.iter().any(|(_, f)| f.mismatch.is_some()) {
        return None;
    }
    let slow_ranks: Vec<u32> = failures
        .iter()
        .filter(|(_, f)| matches!(f.error, Some(OpError::Slow { .. })))
        .map(|(r, _)| *r)
        .collect();
    // A wait that ended, or a connection closed by a rank that left the
    // step as slow; a library's remote error (every rank reported, so none
    // died). A connection another rank closed is a fault of its own.
    let follows = |e: &OpError| match e {
        OpError::RecvTimeout { .. }
        | OpError::SendTimeout { .. }
        | OpError::Stalled { .. }
        | OpError::Remote { .. }
        | OpError::Slow { .. } => true,
        OpError::Closed { peer, .. } => slow_ranks.contains(peer),
        _ => false,
    };
    if !failures
        .iter()
        .all(|(_, f)| f.error.as_ref().is_some_and(follows))
    {
        return None;
    }
    let slow: Vec<(u32, &Failure)> = failures
        .iter()
        .filter(|(_, f)| matches!(f.error, Some(OpError::Slow { .. })))
        .copied()
        .collect();
    // The figures of the rank that measured the most of it.
    let (r, f) = slow.iter().copied().max_by_key(|(_, f)| match f.error {
        Some(OpError::Slow {
            busbw_mbps,
            needs_ms,
            ..
        }) => (busbw_mbps > 0, needs_ms),
        _ => (false, 0),
    })?;
    let error = f.error.as_ref()?;
    let ranks: Vec<u32> = slow.iter().map(|(r, _)| *r).collect();
    Some(format!(
        "slow: {} at {}: {} (rank {r}{}); the sweep ended there, larger sizes not measured ({} left the step at its budget)",
        f.op.name(),
        preflight_ground::values::format_bytes(f.bytes as u64),
        error,
        host(r),
        rank_list(&ranks)
    ))
}

/// Rank 0: one report from every rank's result.
pub fn assemble(
    cfg: &Config,
    world: u32,
    all: &[Option<RankResult>],
    hosts: &[String],
) -> CollectiveReport {
    let present: Vec<&RankResult> = all.iter().flatten().collect();
    let missing: Vec<u32> = (0..world)
        .filter(|r| all.get(*r as usize).is_none_or(Option::is_none))
        .collect();
    let host = |r: u32| {
        present
            .iter()
            .find(|x| x.rank == r)
            .map(|x| format!(" ({})", x.host))
            .or_else(|| hosts.get(r as usize).map(|h| format!(" ({h})")))
            .unwrap_or_default()
    };
    let mut backends = Vec::new();
    for (bi, name) in cfg.backends.iter().enumerate() {
        let per: Vec<(u32, &RankBackend)> = present
            .iter()
            .filter_map(|x| x.backends.get(bi).map(|b| (x.rank, b)))
            .collect();
        let available = !per.is_empty() && per.iter().all(|(_, b)| b.available);
        let reason = availability_reason(&per, &host);
        let found = per.iter().find_map(|(_, b)| b.found.clone());
        let library = found.map(|f| format!("{} at {}", f.version, f.path));
        // One line per distinct note, naming the ranks that said it.
        let mut said: Vec<(bool, &str, Vec<u32>)> = Vec::new();
        for (r, b) in &per {
            for (warning, text) in &b.notes {
                match said.iter_mut().find(|(w, t, _)| w == warning && t == text) {
                    Some((_, _, ranks)) => ranks.push(*r),
                    None => said.push((*warning, text, vec![*r])),
                }
            }
        }
        let notes: Vec<String> = said
            .iter()
            .map(|(warning, text, ranks)| {
                let who = if ranks.len() == 1 {
                    format!("rank {}{}", ranks[0], host(ranks[0]))
                } else if ranks.len() == per.len() {
                    "every rank".to_string()
                } else {
                    rank_list(ranks)
                };
                format!("{}{who}: {text}", if *warning { "warning: " } else { "" })
            })
            .collect();
        let env_set = per
            .first()
            .map(|(_, b)| b.env_set.clone())
            .unwrap_or_default();
        let log = per
            .iter()
            .find(|(_, b)| {
                !b.log.is_empty() && (b.failure.is_some() || b.init_error.is_some() || !b.available)
            })
            .or_else(|| per.iter().find(|(_, b)| !b.log.is_empty()))
            .map(|(r, b)| b.log.iter().map(|l| format!("rank {r}: {l}")).collect())
            .unwrap_or_default();
        // Ranks the run's deadline stopped: the stage ran out of time, which
        // says nothing against the cluster unless something else failed.
        let cut: Vec<(u32, &RankBackend)> = per
            .iter()
            .filter(|(_, b)| b.ran_out_of_time())
            .copied()
            .collect();
        if !available && cut.is_empty() {
            backends.push(BackendReport {
                name: name.clone(),
                available,
                reason,
                library,
                env_set,
                init_ms: None,
                ops: Vec::new(),
                sweep: Vec::new(),
                notes,
                log,
                ended: None,
                about_variables: Vec::new(),
                verdict: "skip".into(),
            });
            continue;
        }
        let init_ms = per.iter().filter_map(|(_, b)| b.init_ms).max();
        let mut ended = None;
        let init_failed: Vec<(u32, &RankBackend)> = per
            .iter()
            .filter(|(_, b)| b.init_error.is_some() && !b.out_of_time)
            .copied()
            .collect();
        let mut about_variables: Vec<String> = Vec::new();
        if !init_failed.is_empty() {
            ended = Some(init_failure(&init_failed, &missing, world, &host));
            // A peer's word: a few short names at most.
            for name in init_failed
                .iter()
                .flat_map(|(_, b)| b.init_about.iter().take(4))
            {
                if name.len() <= 64 && !about_variables.contains(name) && about_variables.len() < 4
                {
                    about_variables.push(name.clone());
                }
            }
        }
        let mut failures: Vec<(u32, &Failure)> = per
            .iter()
            .filter_map(|(r, b)| b.failure.as_ref().map(|f| (*r, f)))
            .filter(|(_, f)| !matches!(f.error, Some(OpError::RunDeadline { .. })))
            .collect();
        let mut notes = notes;
        let slow = ended.is_none() && missing.is_empty() && {
            match slow_step(&failures, &host) {
                Some(text) => {
                    // Slow is not broken: the sweep ended there, and what
                    // every other rank saw of it follows from it.
                    notes.push(format!("warning: {text}"));
                    ended = Some(text);
                    failures.clear();
                    true
                }
                None => false,
            }
        };
        if ended.is_none() && !failures.is_empty() {
            ended = Some(explain(&failures, &present, &missing, &host));
        }
        if ended.is_none() && !missing.is_empty() {
            ended = Some(format!(
                "no result from {}: gone before the end of the stage",
                rank_list(&missing)
            ));
        }
        let incomplete = ended.is_none() && !cut.is_empty();
        if incomplete {
            ended = Some(out_of_time(&cut, &host));
        }
        let failed_op = failures.first().map(|(_, f)| f.op).or_else(|| {
            cut.iter()
                .find_map(|(_, b)| b.failure.as_ref())
                .map(|f| f.op)
        });
        let ops = [
            Op::Allreduce,
            Op::Broadcast,
            Op::Allgather,
            Op::Sendrecv,
            Op::Barrier,
        ]
        .into_iter()
        .map(|op| {
            let by_present = !per.is_empty() && per.iter().all(|(_, b)| b.verified.contains(&op));
            let (status, detail) = if failed_op == Some(op) && incomplete {
                ("not_finished", ended.clone())
            } else if failed_op == Some(op) {
                ("failed", ended.clone())
            } else if by_present && missing.is_empty() {
                ("verified", None)
            } else if by_present {
                // It ran: the ranks that answered verified it; the ones
                // gone say nothing about it either way.
                (
                    "partial",
                    Some(format!(
                        "verified by the {} that gave a result; no result from {}",
                        preflight_ground::values::count(per.len(), "rank"),
                        rank_list(&missing)
                    )),
                )
            } else {
                ("not_run", None)
            };
            OpStatus {
                op: op.name().into(),
                status: status.into(),
                detail,
            }
        })
        .collect();
        // A row counts only when every rank verified that step; its time
        // is the slowest rank's.
        let mut sweep: Vec<Row> = Vec::new();
        if let Some((_, first)) = per.first() {
            for row in &first.rows {
                let mut worst = row.time_us;
                let mut everywhere = true;
                for (_, b) in &per[1..] {
                    match b
                        .rows
                        .iter()
                        .find(|x| x.op == row.op && x.bytes == row.bytes)
                    {
                        Some(x) => worst = worst.max(x.time_us),
                        None => everywhere = false,
                    }
                }
                if everywhere {
                    sweep.push(Row::new(row.op, row.bytes, row.dtype, worst, world));
                }
            }
        }
        let verdict = if incomplete {
            "incomplete"
        } else if ended.is_some() && !slow {
            "fail"
        } else {
            "pass"
        };
        backends.push(BackendReport {
            name: name.clone(),
            available,
            reason,
            library,
            env_set,
            init_ms,
            ops,
            sweep,
            notes,
            log,
            ended,
            about_variables,
            verdict: verdict.into(),
        });
    }
    let pairs: Vec<PairRate> = present.iter().flat_map(|x| x.pairs.clone()).collect();
    // Two ranks on a host with more ranks than CPUs measure the scheduler,
    // not the node: their pair is not evidence about anyone.
    let crowded = |r: u32| present.iter().find(|x| x.rank == r);
    let meaningless = |p: &PairRate| match (crowded(p.a), crowded(p.b)) {
        (Some(a), Some(b)) => a.host == b.host && a.oversubscribed.is_some(),
        _ => false,
    };
    let judged: Vec<PairRate> = pairs.iter().filter(|p| !meaningless(p)).cloned().collect();
    let mut hosts_crowded: Vec<String> = present
        .iter()
        .filter_map(|x| Some(format!("{} ({})", x.host, x.oversubscribed.as_ref()?)))
        .collect();
    hosts_crowded.sort();
    hosts_crowded.dedup();
    let unjudged = (judged.len() < pairs.len()).then(|| {
        format!(
            "{} of {} pairs not judged for stragglers: both ranks on a host with more ranks than CPUs: {}",
            pairs.len() - judged.len(),
            pairs.len(),
            hosts_crowded.join(", ")
        )
    });
    let parts: Vec<&isolate::Part> = present.iter().filter_map(|x| x.second.as_ref()).collect();
    let waits: Vec<CpuWait> = present.iter().filter_map(|x| x.cpu).collect();
    let slow = slowness::verdict(world, &judged, hosts, &host, &parts, &waits);
    let unjudged = unjudged
        .into_iter()
        .chain(slow.unsettled)
        .reduce(|a, b| format!("{a}; {b}"));
    CollectiveReport {
        mode: cfg.mode.name().into(),
        world_size: world,
        backends,
        pairs,
        stragglers: slow.stragglers,
        straggler_ranks: slow.ranks,
        unjudged,
        missing,
        links: present.iter().filter_map(|x| x.link.clone()).collect(),
        interrupted: None,
        settings: Some(SweepSettings {
            max_size: cfg.max_size,
            step_factor: cfg.step_factor,
            warmup: cfg.warmup,
            iters: cfg.iters,
            step_timeout_ms: cfg.step_timeout.as_millis() as u64,
        }),
        second_pass: slow.second_pass,
        cpu_wait: waits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;
    use std::time::Duration;

    fn cfg() -> Config {
        Config {
            mode: Mode::Full,
            backends: vec!["tcp".into()],
            required: Vec::new(),
            max_size: 1 << 20,
            step_factor: 2,
            warmup: 0,
            iters: 1,
            step_timeout: Duration::from_secs(10),
            until: None,
        }
    }

    /// Rank `rank`'s result: tcp stopped at the 128 KiB allreduce with `e`.
    fn stopped(rank: u32, e: Option<OpError>) -> Option<RankResult> {
        let mut b = RankBackend::new("tcp", true, String::new());
        b.init_ms = Some(1);
        b.failure = e.map(|e| Failure {
            op: Op::Allreduce,
            bytes: 128 << 10,
            error: Some(e),
            mismatch: None,
            own_contribution_wrong: None,
        });
        Some(RankResult {
            rank,
            host: format!("h{rank}"),
            backends: vec![b],
            pairs: Vec::new(),
            pair_error: None,
            second: None,
            link: None,
            oversubscribed: None,
            cpu: None,
        })
    }

    fn cut(waiting_for: Option<u32>) -> Option<OpError> {
        Some(OpError::RunDeadline { waiting_for })
    }

    fn one(all: &[Option<RankResult>]) -> BackendReport {
        let hosts: Vec<String> = (0..all.len()).map(|r| format!("h{r}")).collect();
        assemble(&cfg(), all.len() as u32, all, &hosts)
            .backends
            .remove(0)
    }

    /// Rank `rank`'s tcp backend failed init with `error`.
    fn init_failed(rank: u32, error: &str, stalled: bool) -> Option<RankResult> {
        let mut r = stopped(rank, None)?;
        r.backends[0].init_ms = None;
        r.backends[0].init_error = Some(error.into());
        r.backends[0].init_stalled = stalled;
        Some(r)
    }

    /// Found by the NCCL stand-in: a rank that never finished init left
    /// every rank waiting, and rank 0 alone was named; a rank that failed
    /// by itself is named before those that only waited for it.
    #[test]
    fn init_names_the_rank_that_failed_or_every_rank_that_waited() {
        let waited = |r: u32| init_failed(r, &format!("rank {r} still in progress"), true);
        let ended = one(&[waited(0), waited(1)]).ended.unwrap();
        assert!(
            ended.starts_with("init did not finish on ranks 0, 1 (every rank): rank 0 says: rank 0 still in progress"),
            "{ended}"
        );
        let ended = one(&[
            waited(0),
            init_failed(1, "ncclSystemError", false),
            waited(2),
        ])
        .ended
        .unwrap();
        assert_eq!(
            ended,
            "init failed on rank 1 (h1): ncclSystemError; ranks 0, 2 waited for init until the deadline"
        );
        let ended = one(&[waited(0), stopped(1, None)]).ended.unwrap();
        assert_eq!(
            ended,
            "init failed on rank 0 (h0): rank 0 still in progress"
        );
        // Every failure is said, and a rank that gave no result is the one
        // the waiting ranks are said to have waited for.
        let ended = one(&[
            init_failed(0, "ncclSystemError", false),
            init_failed(1, "CUDA_ERROR_ECC_UNCORRECTABLE", false),
            waited(2),
            None,
        ])
        .ended
        .unwrap();
        assert_eq!(
            ended,
            "init failed on rank 0 (h0): ncclSystemError; rank 1 also: CUDA_ERROR_ECC_UNCORRECTABLE; rank 2 waited for init until the deadline; rank 3 gave no result (gone)"
        );
        let ended = one(&[waited(0), waited(1), None]).ended.unwrap();
        assert_eq!(
            ended,
            "init did not finish on ranks 0, 1: rank 0 says: rank 0 still in progress; rank 2 gave no result (gone), which the others were waiting for"
        );
    }

    /// Found by the NCCL stand-in: every rank of a library backend stalled
    /// and none was held or gone; the first rank's words alone named rank 0
    /// as if it were the one at fault.
    #[test]
    fn every_rank_stalled_inside_a_library_names_them_all_and_blames_none() {
        let stall = |r: u32| {
            stopped(
                r,
                Some(OpError::Stalled {
                    detail: format!("NCCL operation on rank {r} of 3 not done by the deadline"),
                }),
            )
        };
        let ended = one(&[stall(0), stall(1), stall(2)]).ended.unwrap();
        assert!(
            ended.starts_with("allreduce timed out at 128 KiB on ranks 0, 1, 2 (every rank): rank 0 says: NCCL operation on rank 0 of 3 not done")
                && ended.contains("does not say which rank held up the others"),
            "{ended}"
        );
        let ended = one(&[stall(0), stopped(1, None), stall(2)]).ended.unwrap();
        assert!(ended.contains("on ranks 0, 2: rank 0 says"), "{ended}");
        // Rank 1 hit its deadline first and aborted; rank 0, still
        // waiting, saw its connection to rank 1 close.
        let closed = stopped(
            0,
            Some(OpError::Remote {
                detail: "Connection closed by remote peer rank 1".into(),
            }),
        );
        let ended = one(&[closed.clone(), stall(1)]).ended.unwrap();
        assert!(
            ended.starts_with("allreduce timed out at 128 KiB on rank 1: rank 1 says: NCCL operation on rank 1 of 3 not done")
                && ended.contains("; then rank 0 saw the aborts (Connection closed by remote peer rank 1)"),
            "{ended}"
        );
        // A rank that failed by itself (a CUDA error, a crashed worker)
        // comes first, whatever its rank; the remote errors it caused and
        // the ranks left waiting come after, or not at all.
        let own = |r: u32, what: &str| {
            stopped(
                r,
                Some(OpError::Other {
                    detail: what.into(),
                }),
            )
        };
        let ended = one(&[
            closed.clone(),
            stall(1),
            own(2, "the worker was killed by signal 11"),
        ])
        .ended
        .unwrap();
        assert_eq!(
            ended,
            "allreduce failed at 128 KiB on rank 2 (h2): the worker was killed by signal 11; rank 1 waited until the deadline"
        );
        let ended = one(&[closed, own(1, "an illegal memory access")])
            .ended
            .unwrap();
        assert_eq!(
            ended,
            "allreduce failed at 128 KiB on rank 1 (h1): an illegal memory access"
        );
        // One rank's own stall, alone: said as it is.
        let ended = one(&[stall(0), stopped(1, None)]).ended.unwrap();
        assert!(
            ended.starts_with("allreduce failed at 128 KiB on rank 0 (h0): NCCL operation"),
            "{ended}"
        );
    }

    #[test]
    fn the_runs_deadline_is_incomplete_and_names_where_every_wait_ends() {
        // Rank 2 was stuck; rank 3 waited for it, rank 0 for rank 3.
        let b = one(&[
            stopped(0, cut(Some(3))),
            stopped(1, None),
            stopped(2, cut(None)),
            stopped(3, cut(Some(2))),
        ]);
        assert_eq!(b.verdict, "incomplete");
        let ended = b.ended.unwrap();
        assert!(
            ended.contains("came during allreduce at 128 KiB")
                && ended.contains("ranks 0, 3 were still waiting for rank 2 (h2)"),
            "{ended}"
        );
        assert_eq!(b.ops[0].status, "not_finished");
    }

    /// Rank 2 is slow in every pair: with three ranks the one pair
    /// without it cannot outvote its partners, so it is not named, and
    /// the report says so; with more ranks than CPUs on one host, pairs
    /// there are not evidence at all, and the report says why they were
    /// left out.
    #[test]
    fn pairs_on_an_oversubscribed_host_are_not_judged() {
        let rates = vec![
            PairRate {
                a: 0,
                b: 1,
                gbps: 5.0,
            },
            PairRate {
                a: 0,
                b: 2,
                gbps: 0.1,
            },
            PairRate {
                a: 1,
                b: 2,
                gbps: 0.1,
            },
        ];
        let ranks = |crowded: Option<&str>| -> Vec<Option<RankResult>> {
            (0..3)
                .map(|r| {
                    let mut x = stopped(r, None).unwrap();
                    x.host = "vm (127.0.0.1)".into();
                    x.oversubscribed = crowded.map(String::from);
                    if r == 0 {
                        x.pairs = rates.clone();
                    }
                    Some(x)
                })
                .collect()
        };
        let hosts = vec!["vm".to_string(); 3];
        let roomy = assemble(&cfg(), 3, &ranks(None), &hosts);
        assert!(roomy.stragglers.is_empty(), "{:?}", roomy.stragglers);
        assert_eq!(
            roomy.unjudged.as_deref(),
            Some(
                "rank 2 (vm (127.0.0.1)) ran slow in every pair it is in (at most 0.100 GB/s), but with 3 ranks the pairs without it are too few to outvote its partners: the network evidence alone names no rank"
            )
        );
        let crowded = assemble(&cfg(), 3, &ranks(Some("3 ranks on 2 CPUs")), &hosts);
        assert!(crowded.stragglers.is_empty(), "{:?}", crowded.stragglers);
        assert_eq!(crowded.pairs.len(), 3, "the rates are still reported");
        assert_eq!(
            crowded.unjudged.as_deref(),
            Some(
                "3 of 3 pairs not judged for stragglers: both ranks on a host with more ranks than CPUs: vm (127.0.0.1) (3 ranks on 2 CPUs)"
            )
        );
    }

    #[test]
    fn a_slow_ring_at_the_deadline_names_nobody() {
        let b = one(&[
            stopped(0, cut(Some(2))),
            stopped(1, cut(Some(0))),
            stopped(2, cut(Some(1))),
        ]);
        assert_eq!(b.verdict, "incomplete");
        assert!(!b.ended.unwrap().contains("waiting"));
    }

    /// A step slow on one rank is a warning, with that rank's figures;
    /// the peers that then saw it leave the step follow from it. A wrong
    /// result beside it, or a held rank, is still a failure.
    #[test]
    fn a_slow_step_is_a_warning_not_a_failure() {
        let slow = || {
            Some(OpError::Slow {
                busbw_mbps: 12,
                needs_ms: 250_000,
                budget_ms: 60_000,
                waiting_for: Some(1),
            })
        };
        let closed = || {
            Some(OpError::Closed {
                peer: 0,
                detail: "end of stream: the process is gone?".into(),
            })
        };
        let b = one(&[stopped(0, slow()), stopped(1, closed())]);
        assert_eq!(b.verdict, "pass");
        let ended = b.ended.unwrap();
        assert_eq!(
            ended,
            "slow: allreduce at 128 KiB: busbw 0.012 GB/s, the step needs about 4m10s, over its budget of 1m (rank 0 (h0)); the sweep ended there, larger sizes not measured (rank 0 left the step at its budget)"
        );
        assert_eq!(b.notes, vec![format!("warning: {ended}")]);
        // A connection a rank that was not slow closed is its own fault.
        let reset = Some(OpError::Closed {
            peer: 2,
            detail: "connection reset".into(),
        });
        let b = one(&[stopped(0, slow()), stopped(1, reset), stopped(2, closed())]);
        assert_eq!(b.verdict, "fail");
        // Held: a real culprit, not a consequence.
        let b = one(&[stopped(0, slow()), stopped(1, Some(OpError::Held))]);
        assert_eq!(b.verdict, "fail");
        // A rank gone is not explained by another's slowness.
        let b = one(&[stopped(0, slow()), None]);
        assert_eq!(b.verdict, "fail");
        // A wrong result is never hidden.
        let mut wrong = stopped(1, None).unwrap();
        wrong.backends[0].failure = Some(Failure {
            op: Op::Allreduce,
            bytes: 128 << 10,
            error: None,
            mismatch: Some(crate::verify::Mismatch {
                op: Op::Allreduce,
                dtype: crate::Dtype::F32,
                bytes: 128 << 10,
                index: 3,
                expected: 1.0,
                got: 2.0,
                bad: 1,
                culprit: None,
                rank: None,
            }),
            own_contribution_wrong: None,
        });
        let b = one(&[stopped(0, slow()), Some(wrong)]);
        assert_eq!(b.verdict, "fail");
    }

    #[test]
    fn a_fault_beside_the_deadline_is_still_a_failure() {
        // Rank 1 went away; the others' waits ended at the deadline.
        let b = one(&[
            stopped(0, cut(Some(2))),
            None,
            stopped(
                2,
                Some(OpError::Closed {
                    peer: 1,
                    detail: "connection reset".into(),
                }),
            ),
        ]);
        assert_eq!(b.verdict, "fail");
        let ended = b.ended.unwrap();
        assert!(ended.contains("rank 1 (h1)"), "{ended}");
    }
}
