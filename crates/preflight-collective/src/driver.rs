//! One driver for every library backend: a library's module says how to
//! call its collectives (`Collectives`) and how to make and use its unique
//! id; the driver does what is the same for each: the id exchanged, init
//! timed and reported, the notes init leaves, the element types converted,
//! each operation's own time kept, and the exercise run as a `Backend`.
//!
//! A third library (RCCL under its own name, HCCL for Gaudi) is then one
//! module: its probe, its `Collectives`, and a call to `drive`.

use std::time::Duration;

use tokio::time::Instant;

use super::job::{Job, Link, ToParent};
use super::{Backend, Dtype, OpError};

/// A buffer of 4-byte elements, typed as the library reduces them.
pub enum Words<'a> {
    F32(&'a mut [f32]),
    I32(&'a mut [i32]),
}

/// How to call one library's collectives on host buffers, each call
/// returning the operation's own time (the copies around it, to and from
/// a device, left out). `deadline` is the step's: a library that can be
/// polled ends its call by it; one that cannot is killed by the parent.
pub trait Collectives {
    /// The sum of every rank's `words`, in place.
    fn all_reduce(&mut self, words: Words<'_>, deadline: Instant) -> Result<Duration, OpError>;
    /// `root`'s `buf` into every rank's `buf`.
    fn broadcast(
        &mut self,
        buf: &mut [u8],
        root: u32,
        deadline: Instant,
    ) -> Result<Duration, OpError>;
    /// Every rank's `input` into `out`, block r from rank r.
    fn all_gather(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        deadline: Instant,
    ) -> Result<Duration, OpError>;
    /// `send` to `to` while `recv` comes from `from`, in one group.
    fn send_recv(
        &mut self,
        send: &[u8],
        to: u32,
        recv: &mut [u8],
        from: u32,
        deadline: Instant,
    ) -> Result<Duration, OpError>;
    /// A library without a barrier of its own: a one-element all-reduce.
    fn barrier(&mut self, deadline: Instant) -> Result<Duration, OpError> {
        let mut one = [0i32];
        self.all_reduce(Words::I32(&mut one), deadline)
    }
    /// Ends the communicator so that peers blocked on it learn at once,
    /// where the library can.
    fn abort(&mut self) {}
}

/// Why init failed, as the parent reports it.
pub struct InitFailed {
    pub error: String,
    /// Init was still in progress at its deadline (and was aborted): this
    /// rank waited, rather than failed on its own.
    pub stalled: bool,
}

impl InitFailed {
    pub fn new(error: impl ToString) -> InitFailed {
        InitFailed {
            error: error.to_string(),
            stalled: false,
        }
    }
}

/// The worker's life after a probe that found the library: rank 0 makes
/// the id (`unique_id`), every rank inits with it (`init`, the time the
/// parent is told), what init left to say is read (`notes`: warning?,
/// text, such as the transport NCCL chose), and the exercise runs on what
/// init made. The parent hears each step.
pub fn drive<C: Collectives>(
    name: &'static str,
    job: &Job,
    link: &mut Link,
    unique_id: impl FnOnce() -> Result<Vec<u8>, String>,
    init: impl FnOnce(&[u8]) -> Result<C, InitFailed>,
    notes: impl FnOnce() -> Vec<(bool, String)>,
) -> Result<(), String> {
    let Some(id) = link.exchange_id(unique_id)? else {
        return Ok(());
    };
    let t = std::time::Instant::now();
    let comm = match init(&id) {
        Ok(comm) => comm,
        Err(failed) => {
            return link.send(&ToParent::InitFailed {
                error: failed.error,
                stalled: failed.stalled,
            });
        }
    };
    link.send(&ToParent::Init {
        ms: t.elapsed().as_millis() as u64,
    })?;
    for (warning, text) in notes() {
        link.send(&ToParent::Note { warning, text })?;
    }
    let mut backend = Driven {
        name,
        rank: job.rank,
        world: job.world,
        comm,
        last: None,
    };
    link.exercise(&mut backend, job)
}

/// A library's collectives as a `Backend`.
pub struct Driven<C> {
    name: &'static str,
    rank: u32,
    world: u32,
    comm: C,
    last: Option<Duration>,
}

impl<C: Collectives> Driven<C> {
    /// The operation's own time kept for `last_op_time`.
    fn timed(&mut self, took: Result<Duration, OpError>) -> Result<(), OpError> {
        self.last = Some(took?);
        Ok(())
    }
}

/// An element type's reading from and writing to little-endian bytes.
type LeBytes<T> = (fn([u8; 4]) -> T, fn(T) -> [u8; 4]);

/// The framework's buffers (little-endian 4-byte words) as elements,
/// reduced by `comm` as `as_words` types them, then written back.
fn sum_as<T: Copy>(
    comm: &mut impl Collectives,
    buf: &mut [u8],
    (read, write): LeBytes<T>,
    as_words: for<'a> fn(&'a mut [T]) -> Words<'a>,
    deadline: Instant,
) -> Result<Duration, OpError> {
    let mut values: Vec<T> = buf
        .chunks_exact(4)
        .map(|c| read([c[0], c[1], c[2], c[3]]))
        .collect();
    let took = comm.all_reduce(as_words(&mut values), deadline)?;
    for (v, b) in values.iter().zip(buf.chunks_exact_mut(4)) {
        b.copy_from_slice(&write(*v));
    }
    Ok(took)
}

impl<C: Collectives> Backend for Driven<C> {
    fn name(&self) -> &'static str {
        self.name
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
        let took = match dtype {
            Dtype::F32 => sum_as(
                &mut self.comm,
                buf,
                (f32::from_le_bytes, f32::to_le_bytes),
                |v| Words::F32(v),
                deadline,
            ),
            Dtype::I32 => sum_as(
                &mut self.comm,
                buf,
                (i32::from_le_bytes, i32::to_le_bytes),
                |v| Words::I32(v),
                deadline,
            ),
        };
        self.timed(took)
    }

    async fn broadcast(
        &mut self,
        buf: &mut [u8],
        root: u32,
        deadline: Instant,
    ) -> Result<(), OpError> {
        // A broadcast moves bytes unchanged, whatever they encode.
        let took = self.comm.broadcast(buf, root, deadline);
        self.timed(took)
    }

    async fn allgather(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        deadline: Instant,
    ) -> Result<(), OpError> {
        let took = self.comm.all_gather(input, out, deadline);
        self.timed(took)
    }

    async fn sendrecv(
        &mut self,
        send: &[u8],
        to: u32,
        recv: &mut [u8],
        from: u32,
        deadline: Instant,
    ) -> Result<(), OpError> {
        let took = self.comm.send_recv(send, to, recv, from, deadline);
        self.timed(took)
    }

    async fn barrier(&mut self, deadline: Instant) -> Result<(), OpError> {
        let took = self.comm.barrier(deadline);
        self.timed(took)
    }

    fn abort(&mut self) {
        self.comm.abort();
    }

    fn last_op_time(&self) -> Option<Duration> {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-rank library in memory: what any library's collectives do in
    /// a world of one, each call taking a known time.
    struct Alone {
        calls: Vec<&'static str>,
        aborted: bool,
    }

    const TOOK: Duration = Duration::from_micros(7);

    impl Collectives for Alone {
        fn all_reduce(&mut self, words: Words<'_>, _: Instant) -> Result<Duration, OpError> {
            self.calls.push(match words {
                Words::F32(_) => "all_reduce f32",
                Words::I32(_) => "all_reduce i32",
            });
            Ok(TOOK)
        }
        fn broadcast(&mut self, _: &mut [u8], _: u32, _: Instant) -> Result<Duration, OpError> {
            self.calls.push("broadcast");
            Ok(TOOK)
        }
        fn all_gather(
            &mut self,
            input: &[u8],
            out: &mut [u8],
            _: Instant,
        ) -> Result<Duration, OpError> {
            out.copy_from_slice(input);
            self.calls.push("all_gather");
            Ok(TOOK)
        }
        fn send_recv(
            &mut self,
            send: &[u8],
            _: u32,
            recv: &mut [u8],
            _: u32,
            _: Instant,
        ) -> Result<Duration, OpError> {
            recv.copy_from_slice(send);
            self.calls.push("send_recv");
            Err(OpError::Other {
                detail: "refused".into(),
            })
        }
        fn abort(&mut self) {
            self.aborted = true;
        }
    }

    /// The driver converts the element types both ways, keeps the
    /// library's own time, passes a failure through without a time, and
    /// a library without a barrier gets a one-element all-reduce.
    #[test]
    fn the_driver_converts_times_and_fills_in_the_barrier() {
        let mut b = Driven {
            name: "alone",
            rank: 0,
            world: 1,
            comm: Alone {
                calls: Vec::new(),
                aborted: false,
            },
            last: None,
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut buf: Vec<u8> = [1.5f32, -2.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let before = buf.clone();
            b.allreduce(&mut buf, Dtype::F32, deadline).await.unwrap();
            assert_eq!(buf, before, "a world of one sums to itself");
            assert_eq!(b.last_op_time(), Some(TOOK));
            b.barrier(deadline).await.unwrap();
            let mut out = [0u8; 3];
            b.allgather(b"abc", &mut out, deadline).await.unwrap();
            assert_eq!(&out, b"abc");
            b.last = None;
            let mut recv = [0u8; 2];
            let e = b.sendrecv(b"xy", 0, &mut recv, 0, deadline).await;
            assert!(matches!(e, Err(OpError::Other { .. })), "{e:?}");
            assert_eq!(b.last_op_time(), None);
        });
        b.abort();
        assert_eq!(
            b.comm.calls,
            [
                "all_reduce f32",
                "all_reduce i32",
                "all_gather",
                "send_recv"
            ]
        );
        assert!(b.comm.aborted);
    }
}
