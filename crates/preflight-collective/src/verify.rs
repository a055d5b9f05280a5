//! Buffers whose exact result is known: every rank fills element i from
//! its rank and i, with integers small enough to be exact in f32 (below
//! 2^24 even summed over 1024 ranks), so every element of every result is
//! checked exactly on every rank. A mismatch names the first bad index,
//! what was expected and what came, and which rank's contribution explains
//! the difference where one does.

use serde::{Deserialize, Serialize};

use super::{Dtype, Op};

/// Rank r's value at element i. Distinct per rank at every index, so a
/// missing contribution is recognisable by the difference.
pub fn value(rank: u32, i: usize, dtype: Dtype) -> i64 {
    let base = (i % 1021) as i64 + 1;
    match dtype {
        Dtype::F32 => base + 3 * i64::from(rank),
        // The i32 pass uses a wider pattern than f32 could hold exactly.
        Dtype::I32 => (i % 65521) as i64 * 7 + 1000 * i64::from(rank) + 1,
    }
}

/// The sum over all ranks of `value(_, i)`.
pub fn sum(world: u32, i: usize, dtype: Dtype) -> i64 {
    (0..world).map(|r| value(r, i, dtype)).sum()
}

pub fn encode(v: i64, dtype: Dtype) -> [u8; 4] {
    match dtype {
        Dtype::F32 => (v as f32).to_le_bytes(),
        Dtype::I32 => (v as i32).to_le_bytes(),
    }
}

pub fn decode(b: &[u8], dtype: Dtype) -> f64 {
    let a = [b[0], b[1], b[2], b[3]];
    match dtype {
        Dtype::F32 => f64::from(f32::from_le_bytes(a)),
        Dtype::I32 => f64::from(i32::from_le_bytes(a)),
    }
}

/// Every value repeats with this period in the element index, so one
/// period is computed and the rest copied or compared as bytes.
fn period(dtype: Dtype) -> usize {
    match dtype {
        Dtype::F32 => 1021,
        Dtype::I32 => 65521,
    }
}

/// The bytes of the first `n` elements of `f`.
fn pattern(n: usize, dtype: Dtype, f: impl Fn(usize) -> i64) -> Vec<u8> {
    (0..n).flat_map(|i| encode(f(i), dtype)).collect()
}

/// Fills `buf` with rank `rank`'s values.
pub fn fill(buf: &mut [u8], rank: u32, dtype: Dtype) {
    let count = buf.len() / 4;
    let first = pattern(period(dtype).min(count), dtype, |i| value(rank, i, dtype));
    let Some(head) = buf.get_mut(..first.len()) else {
        return;
    };
    head.copy_from_slice(&first);
    // Doubling copies: memcpy speed, not a computation per element.
    let mut done = first.len();
    while done < count * 4 {
        let n = done.min(count * 4 - done);
        buf.copy_within(..n, done);
        done += n;
    }
}

/// Whether `buf` is `period_bytes` repeated (the last repetition cut
/// short): the fast test before the element-wise one.
fn repeats(buf: &[u8], period_bytes: &[u8]) -> bool {
    period_bytes.is_empty() && buf.is_empty()
        || !period_bytes.is_empty()
            && buf
                .chunks(period_bytes.len())
                .all(|c| c == &period_bytes[..c.len()])
}

/// `check`, skipped when the bytes are the expected period repeated (every
/// expected function here repeats with `period`).
fn check_periodic(
    buf: &[u8],
    op: Op,
    dtype: Dtype,
    expected: impl Fn(usize) -> i64,
) -> Option<Mismatch> {
    let first = pattern(period(dtype).min(buf.len() / 4), dtype, &expected);
    if repeats(&buf[..buf.len() / 4 * 4], &first) {
        return None;
    }
    check(buf, op, dtype, expected)
}

/// The first element that differs from `expected(i)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    pub op: Op,
    pub dtype: Dtype,
    pub bytes: usize,
    pub index: usize,
    pub expected: f64,
    pub got: f64,
    /// How many elements differ in all.
    pub bad: usize,
    /// In words: which rank's contribution is missing or wrong, when the
    /// data says.
    pub culprit: Option<String>,
    /// Rank whose contribution is to blame, when known.
    pub rank: Option<u32>,
}

/// An element as a person reads it: integers whole, other values in
/// f32's shortest form, with an exponent when tiny or huge (a flipped
/// exponent bit gives 1.4693679e-38, not 38 zeros).
pub fn element_text(v: f64) -> String {
    let tiny_or_huge = v != 0.0 && (v.abs() < 1e-4 || v.abs() >= 1e15);
    if v.is_finite() && v.fract() == 0.0 && !tiny_or_huge {
        format!("{v}")
    } else if v.is_finite() && tiny_or_huge {
        format!("{:e}", v as f32)
    } else {
        format!("{}", v as f32)
    }
}

pub fn check(
    buf: &[u8],
    op: Op,
    dtype: Dtype,
    expected: impl Fn(usize) -> i64,
) -> Option<Mismatch> {
    let mut first: Option<(usize, f64, f64)> = None;
    let mut bad = 0usize;
    for (i, c) in buf.chunks_exact(4).enumerate() {
        let want = expected(i) as f64;
        let got = decode(c, dtype);
        if got != want {
            bad += 1;
            if first.is_none() {
                first = Some((i, want, got));
            }
        }
    }
    let (index, expected, got) = first?;
    Some(Mismatch {
        op,
        dtype,
        bytes: buf.len(),
        index,
        expected,
        got,
        bad,
        culprit: None,
        rank: None,
    })
}

/// An allreduce result: every element is the sum; a difference equal to
/// one rank's value names that rank's contribution as missing.
pub fn allreduce(buf: &[u8], world: u32, dtype: Dtype) -> Option<Mismatch> {
    let mut m = check_periodic(buf, Op::Allreduce, dtype, |i| sum(world, i, dtype))?;
    let diff = m.expected - m.got;
    if let Some(r) = (0..world).find(|&r| value(r, m.index, dtype) as f64 == diff) {
        m.culprit = Some(format!("rank {r}'s contribution is missing"));
        m.rank = Some(r);
    }
    Some(m)
}

/// An allgather result: block r must be rank r's values; the first bad
/// block names its rank.
pub fn allgather(out: &[u8], world: u32, block: usize, dtype: Dtype) -> Option<Mismatch> {
    let per = (block / 4).max(1);
    let intact = block >= 4
        && out.len() == block * world as usize
        && out.chunks(block).enumerate().all(|(r, b)| {
            let first = pattern(period(dtype).min(per), dtype, |i| value(r as u32, i, dtype));
            repeats(&b[..per * 4], &first)
        });
    if intact {
        return None;
    }
    let mut m = check(out, Op::Allgather, dtype, |i| {
        value((i / per) as u32, i % per, dtype)
    })?;
    let r = (m.index / per) as u32;
    m.culprit = Some(format!(
        "rank {r}'s block is wrong (element {})",
        m.index % per
    ));
    m.rank = Some(r.min(world.saturating_sub(1)));
    Some(m)
}

/// A broadcast result: the root's values.
pub fn broadcast(buf: &[u8], root: u32, dtype: Dtype) -> Option<Mismatch> {
    let mut m = check_periodic(buf, Op::Broadcast, dtype, |i| value(root, i, dtype))?;
    m.culprit = Some(format!(
        "the data from root rank {root} did not arrive intact"
    ));
    Some(m)
}

/// What `from` sent in a send/recv: its values.
pub fn received(buf: &[u8], from: u32, dtype: Dtype) -> Option<Mismatch> {
    let mut m = check_periodic(buf, Op::Sendrecv, dtype, |i| value(from, i, dtype))?;
    m.culprit = Some(format!("the data from rank {from} did not arrive intact"));
    m.rank = Some(from);
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::reduce;

    /// Found by the NCCL stand-in, whose corruption flips a float's
    /// exponent: the report said "got 0.0000…014693679385278594".
    #[test]
    fn elements_read_as_numbers_not_as_forty_digits() {
        let flipped = f32::from_bits(5.0f32.to_bits() ^ 0x4000_0000);
        assert_eq!(element_text(flipped as f64), "1.469368e-38");
        assert_eq!(element_text(5.0), "5");
        assert_eq!(element_text(-7.0), "-7");
        assert_eq!(element_text(0.1f32 as f64), "0.1");
        assert_eq!(element_text(0.0), "0");
        assert_eq!(element_text(3.0e20), "3e20");
        assert_eq!(element_text(f64::NAN), "NaN");
        assert_eq!(element_text(f64::INFINITY), "inf");
    }

    #[test]
    fn sums_are_exact_and_a_missing_rank_is_named() {
        for dtype in [Dtype::F32, Dtype::I32] {
            let world = 5;
            let count = 3001;
            let mut acc = vec![0u8; count * 4];
            fill(&mut acc, 0, dtype);
            for r in 1..world {
                // Rank 3 is left out.
                if r == 3 {
                    continue;
                }
                let mut b = vec![0u8; count * 4];
                fill(&mut b, r, dtype);
                reduce(&mut acc, &b, dtype);
            }
            let m = allreduce(&acc, world, dtype).expect("mismatch");
            assert_eq!(m.index, 0);
            assert_eq!(m.rank, Some(3));
            assert_eq!(m.bad, count);
            let mut b = vec![0u8; count * 4];
            fill(&mut b, 3, dtype);
            reduce(&mut acc, &b, dtype);
            assert_eq!(allreduce(&acc, world, dtype), None);
        }
    }

    #[test]
    fn fill_and_fast_checks_agree_with_the_element_wise_ones() {
        for dtype in [Dtype::F32, Dtype::I32] {
            // Around one and several periods, and a cut-off last one.
            for count in [0, 1, 1020, 1021, 1022, 5000, 65521, 65522, 200_000] {
                let mut b = vec![0u8; count * 4];
                fill(&mut b, 2, dtype);
                for (i, c) in b.chunks_exact(4).enumerate() {
                    assert_eq!(decode(c, dtype), value(2, i, dtype) as f64, "{count} {i}");
                }
                assert_eq!(received(&b, 2, dtype), None);
                assert_eq!(broadcast(&b, 2, dtype), None);
                if count == 0 {
                    continue;
                }
                // A wrong element anywhere, the last included, is found.
                for at in [0, count / 2, count - 1] {
                    let mut bad = b.clone();
                    bad[at * 4..at * 4 + 4].copy_from_slice(&encode(-5, dtype));
                    let m = received(&bad, 2, dtype).expect("mismatch");
                    assert_eq!((m.index, m.bad), (at, 1), "{count}");
                }
            }
        }
    }

    #[test]
    fn f32_values_stay_exact_for_1024_ranks() {
        let max = sum(1024, 1020, Dtype::F32);
        assert!(max < 1 << 24, "{max}");
    }

    #[test]
    fn allgather_names_the_bad_block() {
        let world = 3;
        let block = 40;
        let mut out = vec![0u8; block * 3];
        for r in 0..world {
            fill(
                &mut out[r as usize * block..(r as usize + 1) * block],
                r,
                Dtype::F32,
            );
        }
        assert_eq!(allgather(&out, world, block, Dtype::F32), None);
        out[block + 4] ^= 0x40;
        let m = allgather(&out, world, block, Dtype::F32).unwrap();
        assert_eq!(m.rank, Some(1));
        assert_eq!(m.index, 11);
    }
}
