//! The oneCCL backend: oneCCL's C API (crates/oneccl-sys) on host buffers,
//! run inside a worker process (see `worker` for why).
//!
//! Host buffers work on every CPU node, and on Intel XPU nodes oneCCL
//! reaches the same network path; device (USM) buffers would need a SYCL
//! queue, which the C API does not create, so XPU memory is not exercised
//! here (the checklist's XPU checks cover the device side).
//!
//! oneCCL's calls cannot be interrupted: `deadline` is not used inside
//! them; the parent kills the worker when a step overruns.

use std::time::Duration;

use oneccl_sys::{Comm, DataType, Library, RedOp, UniqueId};
use tokio::time::Instant;

use super::job::{Job, Link, ToParent};
use super::rank::Found;
use super::{Backend, Dtype, OpError};

/// The worker's whole life for oneCCL: probe, id, init, the exercise.
pub fn work(job: &Job, link: &mut Link) -> Result<(), String> {
    let lib = match Library::open(job.lib.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            return link.send(&ToParent::Probe {
                available: false,
                reason: e.to_string(),
                found: None,
            });
        }
    };
    let found = Found {
        path: lib.path().to_string(),
        version: format!("oneCCL {}", lib.version()),
    };
    link.send(&ToParent::Probe {
        available: true,
        reason: format!("{} at {}", found.version, found.path),
        found: Some(found),
    })?;
    let id = link.exchange_id(|| {
        lib.unique_id()
            .map(|u| u.as_bytes().to_vec())
            .map_err(|e| e.to_string())
    })?;
    let Some(id) = id else {
        return Ok(());
    };
    let id = UniqueId::from_bytes(&id).map_err(|e| e.to_string())?;
    let t = std::time::Instant::now();
    let comm = match lib.init_rank(job.world as usize, &id, job.rank as usize) {
        Ok(c) => c,
        Err(e) => {
            return link.send(&ToParent::InitFailed {
                error: e.to_string(),
            });
        }
    };
    link.send(&ToParent::Init {
        ms: t.elapsed().as_millis() as u64,
    })?;
    let mut backend = Oneccl {
        lib: &lib,
        comm,
        rank: job.rank,
        world: job.world,
        last: None,
    };
    link.exercise(&mut backend, job)
}

struct Oneccl<'a> {
    lib: &'a Library,
    comm: Comm<'a>,
    rank: u32,
    world: u32,
    last: Option<Duration>,
}

/// Element types that travel as little-endian 4-byte words.
trait Word: DataType + Copy + Default {
    fn read(b: &[u8]) -> Self;
    fn write(self, b: &mut [u8]);
}

impl Word for f32 {
    fn read(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn write(self, b: &mut [u8]) {
        b.copy_from_slice(&self.to_le_bytes());
    }
}

impl Word for i32 {
    fn read(b: &[u8]) -> i32 {
        i32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn write(self, b: &mut [u8]) {
        b.copy_from_slice(&self.to_le_bytes());
    }
}

fn failed(e: oneccl_sys::Error) -> OpError {
    OpError::Other {
        detail: e.to_string(),
    }
}

impl Oneccl<'_> {
    /// Times only the library call, not the conversions around it.
    fn timed<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let t = std::time::Instant::now();
        let r = f(self);
        self.last = Some(t.elapsed());
        r
    }

    /// oneCCL reduces aligned f32/i32 arrays and the framework's buffers
    /// are bytes: a typed copy each way, outside the timed call.
    fn allreduce_as<T: Word>(&mut self, buf: &mut [u8]) -> Result<(), OpError> {
        let mut typed: Vec<T> = buf.chunks_exact(4).map(T::read).collect();
        let r = self.timed(|s| s.comm.all_reduce_in_place(&mut typed, RedOp::Sum));
        r.map_err(failed)?;
        for (v, b) in typed.iter().zip(buf.chunks_exact_mut(4)) {
            v.write(b);
        }
        Ok(())
    }
}

impl Backend for Oneccl<'_> {
    fn name(&self) -> &'static str {
        "oneccl"
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
        _deadline: Instant,
    ) -> Result<(), OpError> {
        match dtype {
            Dtype::F32 => self.allreduce_as::<f32>(buf),
            Dtype::I32 => self.allreduce_as::<i32>(buf),
        }
    }

    async fn broadcast(
        &mut self,
        buf: &mut [u8],
        root: u32,
        _deadline: Instant,
    ) -> Result<(), OpError> {
        // A broadcast moves bytes unchanged, whatever they encode.
        let r = self.timed(|s| s.comm.broadcast(buf, root as usize));
        r.map_err(failed)
    }

    async fn allgather(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        _deadline: Instant,
    ) -> Result<(), OpError> {
        // A gather moves bytes unchanged, whatever they encode.
        let r = self.timed(|s| s.comm.all_gather(input, out));
        r.map_err(failed)
    }

    async fn sendrecv(
        &mut self,
        send: &[u8],
        to: u32,
        recv: &mut [u8],
        from: u32,
        _deadline: Instant,
    ) -> Result<(), OpError> {
        let r = self.timed(|s| {
            let (comm, lib) = (&s.comm, s.lib);
            lib.group(|| {
                comm.send(send, to as usize)?;
                comm.recv(recv, from as usize)
            })
        });
        r.map_err(failed)
    }

    async fn barrier(&mut self, _deadline: Instant) -> Result<(), OpError> {
        self.comm.barrier().map_err(failed)
    }

    fn abort(&mut self) {
        // oneCCL has no abort; the worker exits and the parent kills it if
        // the exit waits on a peer.
    }

    fn last_op_time(&self) -> Option<Duration> {
        self.last
    }
}
