//! How rank 0 turns every rank's result into the one report every rank
//! exits with: per backend, available or why not (naming the ranks that
//! lack it), the operations verified, the sweep (the slowest rank's time),
//! where it ended and the rank at fault; the pairwise round's straggler.

use super::config::Config;
use super::rank::{RankBackend, RankResult};
use super::straggler;
use super::sweep::Failure;
use super::{Op, OpError};
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
    let straggler_ranks = straggler::stragglers(world, &judged);
    let stragglers = straggler_ranks
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
    }
}

/// Why a backend cannot run, naming the ranks that lack it when not all
/// do. A rank that can run it but heard rank 0's "no" carries rank 0's
/// words, which already name the rank ("… (rank 2, host)").
fn availability_reason(per: &[(u32, &RankBackend)], host: &dyn Fn(u32) -> String) -> String {
    let lacking: Vec<(u32, &RankBackend)> = per
        .iter()
        .filter(|(_, b)| !b.available && !b.reason.contains("(rank "))
        .copied()
        .collect();
    if let Some((_, first)) = lacking.first() {
        let same = lacking.iter().all(|(_, b)| b.reason == first.reason);
        if lacking.len() == per.len() && same {
            return first.reason.clone();
        }
        let ranks: Vec<u32> = lacking.iter().map(|(r, _)| *r).collect();
        let hosts: Vec<String> = ranks.iter().map(|r| host(*r)).collect();
        return format!(
            "{} on {}{}",
            first.reason,
            rank_list(&ranks),
            hosts.concat()
        );
    }
    per.iter()
        .find(|(_, b)| !b.available)
        .or(per.first())
        .map(|(_, b)| b.reason.clone())
        .unwrap_or_else(|| "no rank reported".into())
}

/// Where the run's deadline stopped a backend, and whom ranks were still
/// waiting for then when that names one rank that waited for nobody (a
/// rank stuck in the step); in a slow ring every rank waits for another,
/// and nobody is named.
fn out_of_time(cut: &[(u32, &RankBackend)], host: &dyn Fn(u32) -> String) -> String {
    let at = cut
        .iter()
        .filter_map(|(_, b)| b.failure.as_ref())
        .min_by_key(|f| f.bytes)
        .map(|f| {
            format!(
                "during {} at {}",
                f.op.name(),
                crate::values::format_bytes(f.bytes as u64)
            )
        })
        .unwrap_or_else(|| {
            if cut.iter().any(|(_, b)| b.init_error.is_some()) {
                "during init".into()
            } else {
                "before it could start".into()
            }
        });
    let waits = |b: &RankBackend| match b.failure.as_ref().and_then(|f| f.error.as_ref()) {
        Some(OpError::RunDeadline { waiting_for }) => *waiting_for,
        _ => None,
    };
    let mut text = format!("the run's deadline (--timeout) came {at}, before every step had run");
    // Where each rank's chain of waits ends: at a rank that waits for
    // nobody, or nowhere (a cycle, or a rank with no result).
    let end_of_wait = |mut r: u32| {
        for _ in 0..=cut.len() {
            let (_, b) = cut.iter().find(|(x, _)| *x == r)?;
            match waits(b) {
                Some(next) => r = next,
                None => return b.failure.is_some().then_some(r),
            }
        }
        None
    };
    let stuck = cut.iter().find_map(|(r, _)| {
        let waiting: Vec<u32> = cut
            .iter()
            .filter(|(w, o)| waits(o).is_some() && end_of_wait(*w) == Some(*r))
            .map(|(w, _)| *w)
            .collect();
        (end_of_wait(*r) == Some(*r) && !waiting.is_empty()).then_some((*r, waiting))
    });
    if let Some((r, waiting)) = stuck {
        text.push_str(&format!(
            "; {} {} still waiting for rank {r}{}",
            rank_list(&waiting),
            if waiting.len() == 1 { "was" } else { "were" },
            host(r)
        ));
    }
    text
}

/// Why init failed: the ranks that failed by themselves are named first,
/// with the ranks that waited on them; else a rank that gave no result
/// (gone), for which the others waited; else, when every failed rank was
/// only waiting at its deadline, all of them, for inside a library nobody
/// can tell who held up whom.
fn init_failure(
    failed: &[(u32, &RankBackend)],
    missing: &[u32],
    world: u32,
    host: &dyn Fn(u32) -> String,
) -> String {
    let error = |b: &RankBackend| b.init_error.clone().unwrap_or_default();
    let stalled: Vec<u32> = failed
        .iter()
        .filter(|(_, b)| b.init_stalled)
        .map(|(r, _)| *r)
        .collect();
    let waited = if stalled.is_empty() {
        String::new()
    } else {
        format!(
            "; {} waited for init until the deadline",
            rank_list(&stalled)
        )
    };
    let gone = if missing.is_empty() {
        String::new()
    } else {
        format!("; {} gave no result (gone)", rank_list(missing))
    };
    let own: Vec<&(u32, &RankBackend)> = failed.iter().filter(|(_, b)| !b.init_stalled).collect();
    if let Some((r, b)) = own.first() {
        let mut text = format!("init failed on rank {r}{}: {}", host(*r), error(b));
        for (k, other) in own.iter().skip(1) {
            text.push_str(&format!("; rank {k} also: {}", error(other)));
        }
        return format!("{text}{waited}{gone}");
    }
    let (r, b) = failed[0];
    if !missing.is_empty() {
        return format!(
            "init did not finish on {}: rank {r} says: {}; {} gave no result (gone), which the others were waiting for",
            rank_list(&stalled),
            error(b),
            rank_list(missing)
        );
    }
    if stalled.len() > 1 {
        let every = if stalled.len() == world as usize {
            " (every rank)"
        } else {
            ""
        };
        return format!(
            "init did not finish on {}{every}: rank {r} says: {}; the library does not say which rank held up the others",
            rank_list(&stalled),
            error(b)
        );
    }
    format!("init failed on rank {r}{}: {}", host(r), error(b))
}

fn rank_list(ranks: &[u32]) -> String {
    let names: Vec<String> = ranks.iter().map(u32::to_string).collect();
    if ranks.len() == 1 {
        format!("rank {}", names[0])
    } else {
        format!("ranks {}", names.join(", "))
    }
}

/// Why the backend stopped, naming the rank at fault: a wrong result
/// first (with the contribution that explains it), else the rank every
/// blame leads to: one that blames nobody itself (held, or gone).
fn explain(
    failures: &[(u32, &Failure)],
    present: &[&RankResult],
    missing: &[u32],
    host: &dyn Fn(u32) -> String,
) -> String {
    if let Some((r, f)) = failures.iter().find(|(_, f)| f.mismatch.is_some()) {
        let m = f.mismatch.as_ref().expect("checked above");
        let mut text = format!(
            "{} {} at {} gave a wrong result on rank {r}: element {} expected {} got {} ({} elements wrong)",
            m.op.name(),
            m.dtype.name(),
            crate::values::format_bytes(f.bytes as u64),
            m.index,
            super::verify::element_text(m.expected),
            super::verify::element_text(m.got),
            m.bad
        );
        if let Some(c) = &m.culprit {
            text.push_str(&format!("; {c}"));
        }
        for (_, g) in failures {
            if let Some(own) = &g.own_contribution_wrong {
                text.push_str(&format!("; {own}: its contribution is wrong"));
            }
        }
        return text;
    }
    let blames = |r: u32| -> Option<u32> {
        failures
            .iter()
            .find(|(x, _)| *x == r)
            .and_then(|(_, f)| f.error.as_ref())
            .and_then(OpError::blames)
    };
    // Count who is blamed by ranks whose own blame does not explain it.
    let mut best: Option<(u32, u32, &Failure)> = None;
    for (victim, f) in failures {
        let Some(culprit) = f.error.as_ref().and_then(OpError::blames) else {
            continue;
        };
        let culprit_is_root = missing.contains(&culprit)
            || blames(culprit).is_none()
            || !present.iter().any(|x| x.rank == culprit);
        if culprit_is_root {
            let prefer = matches!(f.error, Some(OpError::RecvTimeout { .. }));
            if best.is_none() || prefer {
                best = Some((*victim, culprit, f));
            }
        }
    }
    // A library backend cannot say whom it waits for: the rank a test hook
    // held, or one that gave no result, is the one the others waited on.
    if best.is_none() {
        let held: Vec<u32> = failures
            .iter()
            .filter(|(_, f)| matches!(f.error, Some(OpError::Held)))
            .map(|(r, _)| *r)
            .collect();
        let culprits: Vec<u32> = held.iter().chain(missing).copied().collect();
        let waiting: Vec<u32> = failures
            .iter()
            .filter(|(_, f)| matches!(f.error, Some(OpError::Stalled { .. })))
            .map(|(r, _)| *r)
            .collect();
        if let (Some(&c), Some((_, f))) = (
            culprits.first(),
            failures
                .iter()
                .find(|(_, f)| matches!(f.error, Some(OpError::Stalled { .. }))),
        ) {
            let gone = if missing.contains(&c) {
                " (gone: no result)"
            } else {
                ""
            };
            return format!(
                "{} timed out at {} on {}: rank {c}{} stopped taking part{gone}",
                f.op.name(),
                crate::values::format_bytes(f.bytes as u64),
                rank_list(&waiting),
                host(c)
            );
        }
        // Ranks that stalled ended their own operation at the deadline
        // and none is missing or held: inside a library nobody can tell
        // who held up whom. A rank that failed by itself (not the
        // library's remote error, which is what a peer's abort looks
        // like) comes first, with those that waited; else every rank that
        // waited is named, not the first to report, with those that saw
        // the aborts.
        let said = |f: &Failure| {
            f.error
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default()
        };
        let first_stalled = failures
            .iter()
            .find(|(_, f)| matches!(f.error, Some(OpError::Stalled { .. })));
        let (mut remote, mut own) = (Vec::new(), Vec::new());
        for x in failures {
            match x.1.error {
                Some(OpError::Stalled { .. }) => {}
                Some(OpError::Remote { .. }) => remote.push(x),
                _ => own.push(x),
            }
        }
        if let (true, Some((_, first))) = (culprits.is_empty(), first_stalled) {
            if let Some((r, f)) = own.first() {
                let mut text = format!(
                    "{} failed at {} on rank {r}{}: {}",
                    f.op.name(),
                    crate::values::format_bytes(f.bytes as u64),
                    host(*r),
                    said(f)
                );
                for (k, g) in own.iter().skip(1) {
                    text.push_str(&format!("; rank {k} also: {}", said(g)));
                }
                text.push_str(&format!(
                    "; {} waited until the deadline",
                    rank_list(&waiting)
                ));
                return text;
            }
            if waiting.len() > 1 || !remote.is_empty() {
                let every = if waiting.len() == present.len() {
                    " (every rank)"
                } else {
                    ""
                };
                let then = remote
                    .first()
                    .map(|(r, f)| {
                        let ranks: Vec<u32> = remote.iter().map(|(r, _)| *r).collect();
                        let whose = if ranks.len() > 1 {
                            format!("rank {r}: ")
                        } else {
                            String::new()
                        };
                        format!(
                            "; then {} saw the aborts ({whose}{})",
                            rank_list(&ranks),
                            said(f)
                        )
                    })
                    .unwrap_or_default();
                return format!(
                    "{} timed out at {} on {}{every}: rank {} says: {}{then}; the library does not say which rank held up the others (the tcp backend over the same hosts names it)",
                    first.op.name(),
                    crate::values::format_bytes(first.bytes as u64),
                    rank_list(&waiting),
                    waiting[0],
                    said(first)
                );
            }
        }
    }
    let (victim, culprit, f) = match best {
        Some(b) => b,
        None => {
            // A rank's own failure before the library's remote errors it
            // caused on its peers.
            let (victim, f) = failures
                .iter()
                .find(|(_, f)| !matches!(f.error, Some(OpError::Remote { .. })))
                .copied()
                .unwrap_or(failures[0]);
            match f.error.as_ref().and_then(OpError::blames) {
                Some(c) => (victim, c, f),
                None => {
                    return format!(
                        "{} failed at {} on rank {victim}{}: {}",
                        f.op.name(),
                        crate::values::format_bytes(f.bytes as u64),
                        host(victim),
                        f.error
                            .as_ref()
                            .map(ToString::to_string)
                            .unwrap_or_default()
                    );
                }
            }
        }
    };
    let gone = if missing.contains(&culprit) {
        " and gave no result (gone)"
    } else {
        ""
    };
    match &f.error {
        Some(e @ (OpError::RecvTimeout { .. } | OpError::SendTimeout { .. })) => format!(
            "{}{gone}",
            timed_out(
                f.op.name(),
                f.bytes,
                &format!("rank {culprit}{}", host(culprit)),
                victim,
                matches!(e, OpError::RecvTimeout { .. })
            ),
        ),
        Some(e) => format!(
            "{} failed at {}: rank {culprit}{} broke off{gone}; rank {victim} saw: {e}",
            f.op.name(),
            crate::values::format_bytes(f.bytes as u64),
            host(culprit)
        ),
        None => format!(
            "{} failed at {}",
            f.op.name(),
            crate::values::format_bytes(f.bytes as u64)
        ),
    }
}

/// `ended` for a step that timed out, e.g. "timed out at 64 KiB: rank 3
/// stopped sending to rank 0".
/// `culprit` is "rank 3" or "rank 3 (host)".
pub fn timed_out(op: &str, bytes: usize, culprit: &str, victim: u32, sending: bool) -> String {
    if sending {
        format!(
            "{op} timed out at {}: {culprit} stopped sending to rank {victim}",
            crate::values::format_bytes(bytes as u64)
        )
    } else {
        format!(
            "{op} timed out at {}: {culprit} stopped receiving from rank {victim}",
            crate::values::format_bytes(bytes as u64)
        )
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
