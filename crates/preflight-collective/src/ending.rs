//! In words, why a backend ended where it did, and who is at fault: the
//! ranks that lack it, the rank whose init failed (or every rank that
//! waited), the rank every blame leads to, the wait the run's deadline cut.

use super::OpError;
use super::rank::{RankBackend, RankResult};
use super::sweep::Failure;

/// Why a backend cannot run, naming the ranks that lack it when not all
/// do. A rank that can run it but heard rank 0's "no" carries rank 0's
/// words, which already name the rank ("… (rank 2, host)").
pub(super) fn availability_reason(
    per: &[(u32, &RankBackend)],
    host: &dyn Fn(u32) -> String,
) -> String {
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
pub(super) fn out_of_time(cut: &[(u32, &RankBackend)], host: &dyn Fn(u32) -> String) -> String {
    let at = cut
        .iter()
        .filter_map(|(_, b)| b.failure.as_ref())
        .min_by_key(|f| f.bytes)
        .map(|f| {
            format!(
                "during {} at {}",
                f.op.name(),
                preflight_ground::values::format_bytes(f.bytes as u64)
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
pub(super) fn init_failure(
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

pub(crate) fn rank_list(ranks: &[u32]) -> String {
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
pub(super) fn explain(
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
            preflight_ground::values::format_bytes(f.bytes as u64),
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
                preflight_ground::values::format_bytes(f.bytes as u64),
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
                    preflight_ground::values::format_bytes(f.bytes as u64),
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
                    preflight_ground::values::format_bytes(first.bytes as u64),
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
                        preflight_ground::values::format_bytes(f.bytes as u64),
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
            preflight_ground::values::format_bytes(f.bytes as u64),
            host(culprit)
        ),
        None => format!(
            "{} failed at {}",
            f.op.name(),
            preflight_ground::values::format_bytes(f.bytes as u64)
        ),
    }
}

/// `ended` for a step that timed out, e.g. "timed out at 64 KiB: rank 3
/// stopped sending to rank 0".
/// `culprit` is "rank 3" or "rank 3 (host)".
fn timed_out(op: &str, bytes: usize, culprit: &str, victim: u32, sending: bool) -> String {
    if sending {
        format!(
            "{op} timed out at {}: {culprit} stopped sending to rank {victim}",
            preflight_ground::values::format_bytes(bytes as u64)
        )
    } else {
        format!(
            "{op} timed out at {}: {culprit} stopped receiving from rank {victim}",
            preflight_ground::values::format_bytes(bytes as u64)
        )
    }
}
