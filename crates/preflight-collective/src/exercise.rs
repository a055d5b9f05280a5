//! One backend's work on one rank: the verification pass (all five
//! operations, f32 and i32, odd element counts), then the sweep.

use super::config::Config;
use super::rank::RankBackend;
use super::sweep::{self, Failure, Hooks, Step};
use super::{Backend, Dtype, Op, OpError};
use preflight_result::collective::Row;

/// Element counts that are not powers of two and do not divide evenly
/// among most world sizes: 1, 257 and 1027 elements.
const VERIFY_SIZES: [usize; 3] = [4, 1028, 4108];

/// What `exercise` tells its caller as it goes: a worker passes it on to
/// its parent, which holds each step's deadline and keeps the steps that
/// passed should the worker have to be killed later.
pub enum Progress<'a> {
    /// A step begins, with its time budget.
    Begin {
        op: Op,
        bytes: usize,
        budget: std::time::Duration,
    },
    Passed {
        op: Op,
        row: Option<&'a Row>,
    },
}

/// The verification pass, then the sweep, recording into `rb`.
pub async fn exercise<B: Backend>(
    b: &mut B,
    cfg: &Config,
    hooks: &Hooks,
    rb: &mut RankBackend,
    progress: &mut dyn FnMut(Progress<'_>),
) {
    debug_assert_eq!(b.name(), rb.name);
    let mut plan: Vec<(Op, usize, Dtype, u32, u32, bool)> = Vec::new();
    // Each step passed: its op, size, and what each of its operations
    // took, all told.
    let mut pace: Vec<(Op, usize, std::time::Duration)> = Vec::new();
    for dtype in [Dtype::F32, Dtype::I32] {
        for op in [Op::Allreduce, Op::Broadcast, Op::Allgather, Op::Sendrecv] {
            for &size in &VERIFY_SIZES {
                plan.push((op, size, dtype, 0, 1, false));
            }
        }
    }
    plan.push((Op::Barrier, 0, Dtype::F32, 0, 1, false));
    for size in cfg.sizes() {
        for op in [Op::Allreduce, Op::Allgather, Op::Broadcast] {
            plan.push((op, size, Dtype::F32, cfg.warmup, cfg.iters, true));
        }
    }
    for (op, bytes, dtype, warmup, iters, timed) in plan {
        if cfg.out_of_time() {
            rb.failure = Some(Failure {
                op,
                bytes,
                error: Some(OpError::RunDeadline { waiting_for: None }),
                mismatch: None,
                own_contribution_wrong: None,
            });
            return;
        }
        // What this op took at the size before: what this size should
        // take.
        let before = pace
            .iter()
            .rfind(|(o, b, _)| *o == op && *b < bytes)
            .map(|(_, b, per)| (*b, *per));
        let ops = warmup + iters.max(1);
        let expected_op = sweep::expected_op(bytes, before);
        let budget = sweep::budget(ops, expected_op, cfg.step_timeout);
        let step = Step {
            op,
            bytes,
            dtype,
            warmup,
            iters,
            deadline: cfg.deadline(budget),
            budget,
            stall: cfg.step_timeout,
            expected_op,
            hooks,
        };
        progress(Progress::Begin { op, bytes, budget });
        let began = std::time::Instant::now();
        match sweep::step(b, &step).await {
            Ok(row) => {
                pace.push((op, bytes, began.elapsed() / ops));
                progress(Progress::Passed {
                    op,
                    row: timed.then_some(&row),
                });
                if !rb.verified.contains(&op) {
                    rb.verified.push(op);
                }
                if timed {
                    rb.rows.push(row);
                }
            }
            Err(mut f) => {
                f.error = f.error.map(|e| cfg.judge(e));
                rb.failure = Some(f);
                return;
            }
        }
    }
}
