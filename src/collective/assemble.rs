//! How rank 0 turns every rank's result into the one report every rank
//! exits with: per backend, available or why not (naming the ranks that
//! lack it), the operations verified, the sweep (the slowest rank's time),
//! where it ended and the rank at fault; the pairwise round's straggler.

use super::config::Config;
use super::ending::{availability_reason, explain, init_failure, out_of_time, rank_list};
use super::rank::{RankBackend, RankResult};
use super::sweep::Failure;
use super::{Op, OpError};
use super::{isolate, straggler};
use crate::result::collective::{
    BackendReport, CollectiveReport, OpStatus, PairRate, Row, SweepSettings,
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
        let failures: Vec<(u32, &Failure)> = per
            .iter()
            .filter_map(|(r, b)| b.failure.as_ref().map(|f| (*r, f)))
            .filter(|(_, f)| !matches!(f.error, Some(OpError::RunDeadline { .. })))
            .collect();
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
                        crate::values::count(per.len(), "rank"),
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
        } else if ended.is_some() {
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
    let mut straggler_ranks = straggler::stragglers(world, &judged);
    let parts: Vec<&isolate::Part> = present.iter().filter_map(|x| x.second.as_ref()).collect();
    let judged_again = isolate::judge(&parts, hosts, world);
    // Where the second pass decided a node (found it slow, or cleared
    // it), its word stands for that node: a first-pass straggler there
    // gives way, and every rank of a node it found slow is marked. A node
    // it could not confirm keeps the first pass's word.
    let decided: &[String] = judged_again.as_ref().map_or(&[], |j| &j.decided);
    straggler_ranks.retain(|&r| !decided.contains(&isolate::node(hosts, r)));
    let mut stragglers: Vec<String> = straggler_ranks
        .iter()
        .map(|&r| {
            let mine: Vec<f64> = judged
                .iter()
                .filter(|p| p.a == r || p.b == r)
                .map(|p| p.gbps)
                .collect();
            let reference = straggler::reference(r, &judged).unwrap_or(0.0);
            format!(
                "rank {r}{} is slow in every pair it is in: at most {:.3} GB/s, while the pairs without it reach {reference:.3} GB/s (their median)",
                host(r),
                mine.iter().copied().fold(0.0, f64::max)
            )
        })
        .collect();
    let second_pass = judged_again.map(|j| j.pass);
    if let Some(sp) = &second_pass {
        stragglers.extend(sp.slow_nodes.iter().cloned());
        straggler_ranks.extend(&sp.slow_node_ranks);
        straggler_ranks.sort_unstable();
        straggler_ranks.dedup();
    }
    CollectiveReport {
        mode: cfg.mode.name().into(),
        world_size: world,
        backends,
        pairs,
        stragglers,
        straggler_ranks,
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
        second_pass,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::config::Mode;
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

    /// Rank 2 is slow in every pair: named when the host has a CPU for
    /// each rank; with more ranks than CPUs on one host, pairs there are
    /// not evidence, and the report says why they were left out.
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
        assert_eq!(roomy.stragglers.len(), 1, "{:?}", roomy.stragglers);
        assert!(roomy.stragglers[0].starts_with("rank 2 (vm (127.0.0.1)) is slow"));
        assert_eq!(roomy.unjudged, None);
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
