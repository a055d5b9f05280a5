//! The size sweep: sizes from 8 B up to a maximum (×2 or ×4), warm-up and
//! timed iterations, a deadline per step, every step verified. Rows read
//! like nccl-tests' all_reduce_perf: size, count, type, time, algbw, busbw.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::verify::{self, Mismatch};
use super::{Backend, Dtype, Op, OpError};
use preflight_result::collective::Row;

/// Sizes from 8 B to `max` (inclusive when reached), multiplying by
/// `factor` (2 or 4); always at least 8 B.
pub fn sizes(max: usize, factor: usize) -> Vec<usize> {
    let factor = factor.max(2);
    let mut out = Vec::new();
    let mut s = 8usize;
    while s <= max.max(8) {
        out.push(s);
        s = match s.checked_mul(factor) {
            Some(n) => n,
            None => break,
        };
    }
    out
}

/// A step that did not give a verified result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Failure {
    pub op: Op,
    pub bytes: usize,
    pub error: Option<OpError>,
    pub mismatch: Option<Mismatch>,
    /// This rank's own contribution at the mismatching element, when it
    /// differs from what it should have sent (the data names the culprit).
    pub own_contribution_wrong: Option<String>,
}

/// Test-only fault hooks (`test_hooks`): always unset in a build without
/// the `test-hooks` feature.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    /// This rank stops taking part in steps above this many bytes.
    pub hang_above: Option<usize>,
    /// Written when the hang begins.
    pub hang_marker: Option<std::path::PathBuf>,
    /// This rank corrupts one value of its contribution from this size on.
    pub corrupt_from: Option<usize>,
}

impl Hooks {
    #[cfg(feature = "test-hooks")]
    pub fn from_env(get: impl Fn(&str) -> Option<String>, rank: u32) -> Hooks {
        use preflight_ground::test_hooks::{COLL_CORRUPT, COLL_HANG, COLL_HANG_MARKER, rank_bytes};
        let hang_above = rank_bytes(&get, COLL_HANG, rank);
        Hooks {
            hang_marker: hang_above
                .and(get(COLL_HANG_MARKER))
                .map(std::path::PathBuf::from),
            hang_above,
            corrupt_from: rank_bytes(&get, COLL_CORRUPT, rank),
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    pub fn from_env(_get: impl Fn(&str) -> Option<String>, _rank: u32) -> Hooks {
        Hooks::default()
    }
}

/// How many times what a step should take, at the rate its op reached at
/// the size before, the step may take before it is slow.
pub const SLACK: u32 = 4;
/// The most a step's budget may be, in stall limits (`--step-timeout`).
pub const MOST_STALLS: u32 = 6;

/// What one operation of a step of `bytes` should take, from `before`:
/// the size before and what each of its operations took, all told (fill,
/// verification and the barrier included), scaled up to this size.
pub fn expected_op(bytes: usize, before: Option<(usize, Duration)>) -> Option<Duration> {
    let (prev, per) = before?;
    let scale = bytes as f64 / prev.max(1) as f64;
    Duration::try_from_secs_f64(per.as_secs_f64() * scale.max(1.0)).ok()
}

/// A step's time budget: `SLACK` times what `ops` operations need, each
/// `per_op` (see `expected_op`), at least the stall limit and at most
/// `MOST_STALLS` of it; with nothing measured yet, the most. It grows
/// with the size and with a slower pace, so a slow node or link gets the
/// time its steps need, up to a bound; past that, it is told slow.
pub fn budget(ops: u32, per_op: Option<Duration>, stall: Duration) -> Duration {
    let most = stall * MOST_STALLS;
    match per_op {
        Some(p) => p
            .checked_mul(ops.saturating_mul(SLACK))
            .unwrap_or(most)
            .clamp(stall, most),
        None => most,
    }
}

pub struct Step<'a> {
    pub op: Op,
    pub bytes: usize,
    pub dtype: Dtype,
    pub warmup: u32,
    pub iters: u32,
    /// When the step, all its iterations, must be done: its budget from
    /// its start, or the run's deadline when that comes first.
    pub deadline: Instant,
    /// The step's budget (see `budget`).
    pub budget: Duration,
    /// An operation is hung when nothing moves for this long
    /// (`--step-timeout`): bytes, for a backend that sees them; else
    /// whole operations, each given at least this, or `SLACK` times the
    /// time operations of this size have taken.
    pub stall: Duration,
    /// What one operation should take, from the size before.
    pub expected_op: Option<Duration>,
    pub hooks: &'a Hooks,
}

/// Runs one step: the first and last timed iterations are verified in
/// full; the row is only returned for a verified result.
pub async fn step<B: Backend>(b: &mut B, s: &Step<'_>) -> Result<Row, Failure> {
    let deadline = s.deadline;
    let fail = |error: Option<OpError>, mismatch: Option<Mismatch>, own: Option<String>| Failure {
        op: s.op,
        bytes: s.bytes,
        error,
        mismatch,
        own_contribution_wrong: own,
    };
    if s.hooks.hang_above.is_some_and(|h| s.bytes > h) {
        // Stays silent past every peer's deadline, connections open, as a
        // rank stuck in a driver would.
        if let Some(marker) = &s.hooks.hang_marker {
            let _ = std::fs::write(marker, s.bytes.to_string());
        }
        let past = deadline.min(Instant::now() + s.stall) + Duration::from_secs(2);
        tokio::time::sleep_until(past).await;
        return Err(fail(Some(OpError::Held), None, None));
    }
    let world = b.world();
    let corrupt = s.hooks.corrupt_from.is_some_and(|c| s.bytes >= c);
    let total = s.warmup + s.iters.max(1);
    let mut bufs = Buffers::new(s.op, s.bytes, world);
    let mut spent = Duration::ZERO;
    let start = Instant::now();
    let moved_before = b.moved();
    // When the last operation ended: how long each has taken so far.
    let mut last = start;
    for it in 0..total {
        let per = (it > 0).then(|| (last - start) / it);
        // What this step will take, from the operations it has done: one
        // that cannot end within its budget stops now, as slow.
        if let Some(per) = per.filter(|p| *p * total > s.budget) {
            return Err(fail(
                Some(slow(s, world, Some(per), None, None)),
                None,
                None,
            ));
        }
        // A backend that sees no bytes is hung when a whole operation
        // overstays what operations of this size take.
        let op_deadline = match moved_before {
            Some(_) => deadline,
            None => {
                let est = per.or(s.expected_op).unwrap_or_default();
                deadline.min(Instant::now() + s.stall.max(est * SLACK))
            }
        };
        let check = it == 0 || it + 1 == total;
        let outcome = one(b, s, &mut bufs, corrupt, check, op_deadline).await;
        match outcome {
            Ok(t) if it >= s.warmup => spent += t,
            Ok(_) => {}
            Err((Some(OpError::Slow { waiting_for, .. }), _, _)) => {
                let moved = b
                    .moved()
                    .zip(moved_before)
                    .map(|(now, then)| (now.saturating_sub(then), start.elapsed()));
                let e = slow(s, world, per, moved, waiting_for);
                return Err(fail(Some(e), None, None));
            }
            Err((e, m, own)) => return Err(fail(e, m, own)),
        }
        last = Instant::now();
    }
    let us = spent.as_secs_f64() * 1e6 / f64::from(s.iters.max(1));
    Ok(Row::new(s.op, s.bytes, s.dtype, us, world))
}

/// A slow step in figures: its bus bandwidth from the time each
/// operation took (`per`), else from the bytes this rank moved in the time
/// it had (`moved`: bytes in and out, time); what the whole step needs at
/// that rate; its budget.
fn slow(
    s: &Step<'_>,
    world: u32,
    per: Option<Duration>,
    moved: Option<(u64, Duration)>,
    waiting_for: Option<u32>,
) -> OpError {
    let ops = s.warmup + s.iters.max(1);
    // Bytes each rank sends in one operation, as nccl-tests counts them.
    let bus_bytes = s.bytes as f64 * s.op.bus_factor(world);
    let per_op = per.map(|p| p.as_secs_f64()).or_else(|| {
        // Every byte sent is received too: half the bytes moved went out.
        let (bytes, t) = moved?;
        (bytes > 0).then(|| 2.0 * bus_bytes * t.as_secs_f64() / bytes as f64)
    });
    let Some(per_op) = per_op.filter(|p| *p > 0.0) else {
        return OpError::Slow {
            busbw_mbps: 0,
            needs_ms: 0,
            budget_ms: s.budget.as_millis() as u64,
            waiting_for,
        };
    };
    OpError::Slow {
        busbw_mbps: (bus_bytes / per_op / 1e6).round() as u64,
        needs_ms: (per_op * f64::from(ops) * 1e3).round() as u64,
        budget_ms: s.budget.as_millis() as u64,
        waiting_for,
    }
}

/// A step's buffers, allocated once and reused by every iteration, as
/// nccl-tests does: a fresh allocation per iteration would have the
/// kernel fault its pages in while the operation is being timed.
struct Buffers {
    /// allreduce and broadcast: the buffer; allgather: the input;
    /// sendrecv: what is sent.
    a: Vec<u8>,
    /// allgather: the output; sendrecv: what is received.
    b: Vec<u8>,
}

/// What a receive buffer holds before an operation: NaN as f32, -1 as
/// i32, never a value any rank sends, so bytes that never arrived fail
/// verification.
const POISON: u8 = 0xff;

impl Buffers {
    fn new(op: Op, bytes: usize, world: u32) -> Buffers {
        let count = (bytes / Dtype::SIZE).max(1);
        let per = (count / world as usize).max(1);
        let (a, b) = match op {
            Op::Allreduce | Op::Broadcast => (count * 4, 0),
            Op::Allgather => (per * 4, per * 4 * world as usize),
            Op::Sendrecv => (count * 4, count * 4),
            Op::Barrier => (0, 0),
        };
        // Not zeroes: a zeroed allocation is mapped lazily, and its pages
        // would be faulted in during the first timed operation.
        Buffers {
            a: vec![POISON; a],
            b: vec![POISON; b],
        }
    }
}

type StepError = (Option<OpError>, Option<Mismatch>, Option<String>);

/// One operation: fill, time, and (when `check`) verify.
async fn one<B: Backend>(
    b: &mut B,
    s: &Step<'_>,
    bufs: &mut Buffers,
    corrupt: bool,
    check: bool,
    deadline: Instant,
) -> Result<Duration, StepError> {
    let (world, rank) = (b.world(), b.rank());
    let dtype = s.dtype;
    let spoil = |buf: &mut [u8]| {
        if corrupt {
            let i = buf.len() / 8;
            let v = verify::value(rank, i, dtype) + 1;
            buf[i * 4..i * 4 + 4].copy_from_slice(&verify::encode(v, dtype));
        }
    };
    match s.op {
        Op::Allreduce => {
            let buf = &mut bufs.a;
            verify::fill(buf, rank, dtype);
            spoil(buf);
            let input = check.then(|| buf.clone());
            align(b, deadline).await?;
            let t = Instant::now();
            b.allreduce(buf, dtype, deadline)
                .await
                .map_err(|e| (Some(e), None, None))?;
            let spent = b.last_op_time().unwrap_or_else(|| t.elapsed());
            if let Some(input) = input
                && let Some(m) = verify::allreduce(buf, world, dtype)
            {
                let mine = verify::decode(&input[m.index * 4..m.index * 4 + 4], dtype);
                let should = verify::value(rank, m.index, dtype) as f64;
                let own = (mine != should).then(|| {
                    format!(
                        "rank {rank} contributed {mine} at element {} instead of {should}",
                        m.index
                    )
                });
                return Err((None, Some(m), own));
            }
            Ok(spent)
        }
        Op::Broadcast => {
            let root = 0;
            let buf = &mut bufs.a;
            if rank == root {
                verify::fill(buf, rank, dtype);
                spoil(buf);
            } else {
                buf.fill(POISON);
            }
            align(b, deadline).await?;
            let t = Instant::now();
            b.broadcast(buf, root, deadline)
                .await
                .map_err(|e| (Some(e), None, None))?;
            let spent = b.last_op_time().unwrap_or_else(|| t.elapsed());
            if check && let Some(m) = verify::broadcast(buf, root, dtype) {
                return Err((None, Some(m), None));
            }
            Ok(spent)
        }
        Op::Allgather => {
            let (input, out) = (&mut bufs.a, &mut bufs.b);
            let per = input.len() / 4;
            verify::fill(input, rank, dtype);
            spoil(input);
            out.fill(POISON);
            align(b, deadline).await?;
            let t = Instant::now();
            b.allgather(input, out, deadline)
                .await
                .map_err(|e| (Some(e), None, None))?;
            let spent = b.last_op_time().unwrap_or_else(|| t.elapsed());
            if check && let Some(m) = verify::allgather(out, world, per * 4, dtype) {
                return Err((None, Some(m), None));
            }
            Ok(spent)
        }
        Op::Sendrecv => {
            let to = (rank + 1) % world;
            let from = (rank + world - 1) % world;
            let (send, recv) = (&mut bufs.a, &mut bufs.b);
            verify::fill(send, rank, dtype);
            spoil(send);
            recv.fill(POISON);
            align(b, deadline).await?;
            let t = Instant::now();
            b.sendrecv(send, to, recv, from, deadline)
                .await
                .map_err(|e| (Some(e), None, None))?;
            let spent = b.last_op_time().unwrap_or_else(|| t.elapsed());
            if check && let Some(m) = verify::received(recv, from, dtype) {
                return Err((None, Some(m), None));
            }
            Ok(spent)
        }
        Op::Barrier => {
            let t = Instant::now();
            b.barrier(deadline)
                .await
                .map_err(|e| (Some(e), None, None))?;
            Ok(t.elapsed())
        }
    }
}

/// A barrier before each timed operation, so that a peer still filling
/// its buffer does not count in this rank's time (the others would wait
/// for it inside the operation).
async fn align<B: Backend>(b: &mut B, deadline: Instant) -> Result<(), StepError> {
    b.barrier(deadline).await.map_err(|e| (Some(e), None, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_double_or_quadruple() {
        assert_eq!(sizes(64, 2), vec![8, 16, 32, 64]);
        assert_eq!(sizes(100, 4), vec![8, 32]);
        assert_eq!(sizes(0, 2), vec![8]);
        assert_eq!(sizes(64 << 20, 2).len(), 24);
    }

    /// The budget is SLACK times what the step needs at the pace of the
    /// size before, scaled to this size, between one and MOST_STALLS
    /// stall limits; with no pace yet, the most.
    #[test]
    fn a_steps_budget_grows_with_its_size_and_pace() {
        let stall = Duration::from_secs(10);
        let ms = Duration::from_millis;
        assert_eq!(budget(25, None, stall), stall * MOST_STALLS);
        // Fast: the stall limit is the least.
        let per = expected_op(1 << 20, Some((512 << 10, ms(1))));
        assert_eq!(per, Some(ms(2)));
        assert_eq!(budget(25, per, stall), stall);
        // 200 ms at 32 MiB: 400 ms at 64 MiB, 25 of them, 4 times over.
        let per = expected_op(64 << 20, Some((32 << 20, ms(200))));
        assert_eq!(budget(25, per, stall), Duration::from_secs(40));
        // Slower still: the most.
        let per = expected_op(64 << 20, Some((32 << 20, ms(2000))));
        assert_eq!(budget(25, per, stall), stall * MOST_STALLS);
        // A smaller size never predicts less than its own pace.
        assert_eq!(expected_op(8, Some((4108, ms(3)))), Some(ms(3)));
    }

    #[test]
    fn busbw_follows_nccl_tests() {
        let r = Row::new(Op::Allreduce, 1_000_000, Dtype::F32, 1000.0, 4);
        assert!((r.algbw - 1.0).abs() < 1e-9);
        assert!((r.busbw - 1.5).abs() < 1e-9);
        let g = Row::new(Op::Allgather, 1_000_000, Dtype::F32, 1000.0, 4);
        assert!((g.busbw - 0.75).abs() < 1e-9);
        let b = Row::new(Op::Broadcast, 1_000_000, Dtype::F32, 1000.0, 4);
        assert!((b.busbw - 1.0).abs() < 1e-9);
    }
}
