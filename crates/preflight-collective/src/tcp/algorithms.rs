//! The algorithms over the pairs' connections: a ring allreduce
//! (reduce-scatter, then allgather, received in chunks and reduced as they
//! arrive while the send runs), a ring allgather, a pipelined chain for
//! broadcast, a dissemination barrier.

use tokio::time::Instant;

use super::transport::*;
use super::*;
use crate::{Backend, Dtype, OpError};

/// The reduce-scatter's receive buffer: one chunk, reused, so the
/// reduction reads it from cache rather than from memory.
pub(super) const REDUCE_CHUNK: usize = CHUNK;

/// The element ranges of `count` elements split into `n` near-equal parts.
pub fn segments(count: usize, n: usize) -> Vec<std::ops::Range<usize>> {
    (0..n).map(|k| k * count / n..(k + 1) * count / n).collect()
}

pub(super) fn byte_range(r: &std::ops::Range<usize>) -> std::ops::Range<usize> {
    r.start * Dtype::SIZE..r.end * Dtype::SIZE
}

/// `dst += src`, element-wise.
pub fn reduce(dst: &mut [u8], src: &[u8], dtype: Dtype) {
    match dtype {
        Dtype::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                let v = f32::from_le_bytes([d[0], d[1], d[2], d[3]])
                    + f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        Dtype::I32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                let v = i32::from_le_bytes([d[0], d[1], d[2], d[3]])
                    .wrapping_add(i32::from_le_bytes([s[0], s[1], s[2], s[3]]));
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

impl Backend for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn rank(&self) -> u32 {
        self.rank
    }

    fn world(&self) -> u32 {
        self.world
    }

    async fn allreduce(
        &mut self,
        buf: &mut [u8],
        dtype: Dtype,
        deadline: Instant,
    ) -> Result<(), OpError> {
        let n = self.world as usize;
        if n <= 1 {
            return Ok(());
        }
        let segs = segments(buf.len() / Dtype::SIZE, n);
        let r = self.rank as usize;
        let (to, from) = (self.right(), self.left());
        let mut tmp = std::mem::take(&mut self.scratch);
        if tmp.len() < REDUCE_CHUNK {
            tmp.resize(REDUCE_CHUNK, 0);
        }
        // Reduce-scatter: after n-1 steps segment (r+1)%n holds the sum.
        for step in 0..n - 1 {
            let s_idx = (r + n - step) % n;
            let r_idx = (r + n - step - 1) % n;
            let sb = byte_range(&segs[s_idx]);
            let rb = byte_range(&segs[r_idx]);
            let (send, dst) = split_pair(buf, sb, rb);
            let into = Recv::Reduce {
                dst,
                tmp: &mut tmp,
                dtype,
            };
            let done = self.exchange(send, to, into, from, deadline).await;
            if let Err(e) = done {
                self.scratch = tmp;
                return Err(e);
            }
        }
        self.scratch = tmp;
        // Allgather of the reduced segments.
        for step in 0..n - 1 {
            let s_idx = (r + 1 + n - step) % n;
            let r_idx = (r + n - step) % n;
            let sb = byte_range(&segs[s_idx]);
            let rb = byte_range(&segs[r_idx]);
            let (send, recv) = split_pair(buf, sb, rb);
            self.exchange(send, to, Recv::Into(recv), from, deadline)
                .await?;
        }
        Ok(())
    }

    async fn broadcast(
        &mut self,
        buf: &mut [u8],
        root: u32,
        deadline: Instant,
    ) -> Result<(), OpError> {
        let n = self.world;
        if n <= 1 {
            return Ok(());
        }
        // A chain from the root around the ring, chunk by chunk: each
        // chunk is forwarded as soon as it has arrived.
        let (to, from) = (self.right(), self.left());
        let forward = to != root;
        let receive = self.rank != root;
        let (watch, stall) = (self.watch.clone(), self.stall);
        let mut off = 0;
        while off < buf.len() {
            let end = (off + CHUNK).min(buf.len());
            if receive {
                let Some(Some(rd)) = self.readers.get_mut(from as usize) else {
                    return Err(OpError::Other {
                        detail: format!("no connection from rank {from}"),
                    });
                };
                match watched(&watch, stall, deadline, rd.read_exact(&mut buf[off..end])).await {
                    Waited::Stalled => return Err(OpError::RecvTimeout { from }),
                    Waited::StillMoving => return Err(OpError::still_moving(Some(from))),
                    Waited::Done(Err(e)) => return Err(closed(from, &e)),
                    Waited::Done(Ok(_)) => {}
                }
            }
            if forward {
                let Some(Some(wr)) = self.writers.get_mut(to as usize) else {
                    return Err(OpError::Other {
                        detail: format!("no connection to rank {to}"),
                    });
                };
                match watched(&watch, stall, deadline, wr.write_all(&buf[off..end])).await {
                    Waited::Stalled => return Err(OpError::SendTimeout { to }),
                    Waited::StillMoving => return Err(OpError::still_moving(Some(to))),
                    Waited::Done(Err(e)) => return Err(closed(to, &e)),
                    Waited::Done(Ok(())) => {}
                }
            }
            off = end;
        }
        Ok(())
    }

    async fn allgather(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        deadline: Instant,
    ) -> Result<(), OpError> {
        let n = self.world as usize;
        let block = input.len();
        if out.len() != block * n {
            return Err(OpError::Other {
                detail: "allgather: output is not world × input".into(),
            });
        }
        let r = self.rank as usize;
        out[r * block..(r + 1) * block].copy_from_slice(input);
        let (to, from) = (self.right(), self.left());
        for step in 0..n.saturating_sub(1) {
            let s_idx = (r + n - step) % n;
            let r_idx = (r + n - step - 1) % n;
            let (send, recv) = split_pair(
                out,
                s_idx * block..(s_idx + 1) * block,
                r_idx * block..(r_idx + 1) * block,
            );
            self.exchange(send, to, Recv::Into(recv), from, deadline)
                .await?;
        }
        Ok(())
    }

    async fn sendrecv(
        &mut self,
        send: &[u8],
        to: u32,
        recv: &mut [u8],
        from: u32,
        deadline: Instant,
    ) -> Result<(), OpError> {
        if self.world <= 1 {
            recv.copy_from_slice(send);
            return Ok(());
        }
        self.exchange(send, to, Recv::Into(recv), from, deadline)
            .await
    }

    async fn barrier(&mut self, deadline: Instant) -> Result<(), OpError> {
        let n = self.world;
        let mut k = 1;
        while k < n {
            let to = (self.rank + k) % n;
            let from = (self.rank + n - k) % n;
            let mut got = [0u8; 1];
            self.exchange(&[1], to, Recv::Into(&mut got), from, deadline)
                .await?;
            k *= 2;
        }
        Ok(())
    }

    fn moved(&self) -> Option<u64> {
        Some(self.watch.bytes())
    }

    fn abort(&mut self) {
        // Dropping the halves closes the sockets: peers blocked on this
        // rank see the end of the stream at once.
        self.readers.iter_mut().for_each(|r| *r = None);
        self.writers.iter_mut().for_each(|w| *w = None);
    }
}

/// Two disjoint ranges of one buffer, the first to read, the second to
/// write.
pub(super) fn split_pair(
    buf: &mut [u8],
    a: std::ops::Range<usize>,
    b: std::ops::Range<usize>,
) -> (&[u8], &mut [u8]) {
    // Empty ranges may share a start: order by where `a` ends.
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}
