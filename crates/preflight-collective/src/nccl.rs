//! The NCCL (or RCCL) backend over crates/nccl-sys, run inside a worker
//! process: one rank per GPU, the rank's GPU being `local_rank` modulo the
//! devices it sees (node mode and torchrun start one process per GPU;
//! CUDA_VISIBLE_DEVICES narrows what it sees).
//!
//! Init is non-blocking where NCCL has it (2.14 and later) and polled to
//! the deadline; every operation is queued on the rank's stream and
//! polled with ncclCommGetAsyncError, so a hang ends in ncclCommAbort at
//! the step's deadline with this rank saying so, before the parent would
//! kill the worker. Buffers are copied between host and device for
//! verification; the time reported is the operation's alone.
//!
//! The probe comes first and calls no collective: without a driver,
//! libnccl loads and ncclCommInitRank fails at once with
//! ncclUnhandledCudaError, so "no CUDA device (libcuda.so.1 not found)" is
//! the answer, with the NCCL found named.
//!
//! After init, the network NCCL chose is read back from its INFO lines
//! (`transport`) and sent as a note; a socket fallback on a node with
//! active InfiniBand/RoCE ports is a warning.
//!
//! NCCL semantics this relies on: send and recv to the same or different
//! peers go in one group (ncclGroupStart/End), or each rank's send would
//! wait for a recv its peer has not posted yet; a rank may send to itself
//! inside a group (a one-rank world does); allreduce and broadcast run in
//! place (sendbuff == recvbuff); a non-blocking communicator's calls may
//! return ncclInProgress, and nothing else may be called on it until
//! ncclCommGetAsyncError leaves ncclInProgress, which `Comm` does within
//! the step's deadline.

pub mod transport;

use std::path::Path;
use std::time::Duration;

use nccl_sys::{
    Comm, CudaSearch, CudaStatus, DataType, Device, DeviceBuffer, NCCL_SONAMES, Nccl, NcclSearch,
    RedOp, SITE_PACKAGES_NCCL, Stream, UniqueId,
};
use tokio::time::Instant;

use super::OpError;
use super::driver::{Collectives, InitFailed, Words, drive};
use super::job::{Job, Link, ToParent};
use super::library::{EnvInput, LibraryBackend};
use super::rank::Found;
use preflight_facts::shared_library;

pub const LIBRARY: LibraryBackend = LibraryBackend {
    name: "nccl",
    flag: "nccl-lib",
    flag_help: "The NCCL (or RCCL) library for the nccl backend, instead of the search: PREFLIGHT_NCCL_LIB, then libnccl.so.2 and librccl.so.1 by the loader, then Python's site-packages (nvidia/nccl/lib)",
    install_hint: "Install NCCL (or RCCL) where the job can load it, or point --nccl-lib / PREFLIGHT_NCCL_LIB at libnccl.so.2; on a node without a GPU or driver, check nvidia-smi first. Leave nccl out of --backends on CPU-only nodes.",
    env,
    absent,
    work,
};

/// The worker's no-GPU sentence, when neither the CUDA driver nor NCCL is
/// anywhere the worker would look: the common case on a CPU node, told
/// without a process. Where either is found, the worker loads them and
/// names what it found (NCCL's version, the devices, or why not).
fn absent(named: Option<&Path>) -> Option<String> {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if named.is_some() || set("PREFLIGHT_NCCL_LIB") || set("PREFLIGHT_CUDA_LIB") {
        return None;
    }
    let places = shared_library::Places::of_this_process();
    let cuda = CudaSearch::from_env(None);
    let driver = places.find("libcuda.so.1").is_some()
        || cuda.dirs.iter().any(|d| d.join("libcuda.so.1").exists());
    let nccl = NCCL_SONAMES.iter().any(|s| places.find(s).is_some())
        || nccl_sys::site_dirs_by_files()
            .iter()
            .any(|d| d.join(SITE_PACKAGES_NCCL).exists());
    (!driver && !nccl).then(|| {
        CudaStatus::NotFound {
            report: Default::default(),
        }
        .to_string()
    })
}

/// The settings NCCL gets where the job left them unset (an operator's own
/// value always wins), and reported: `NCCL_DEBUG=INFO` with
/// `NCCL_DEBUG_FILE` in the worker's scratch directory, so the transport
/// NCCL chose can be read back (see `transport`), unless the job sets
/// NCCL_DEBUG itself. A job's own debug file stays the job's: the
/// transport goes unchecked then, and the worker says so.
fn env(input: &EnvInput<'_, '_>) -> Vec<(String, String)> {
    let unset = |k: &str| std::env::var_os(k).is_none();
    if unset("NCCL_DEBUG") && unset("NCCL_DEBUG_FILE") {
        vec![
            ("NCCL_DEBUG".into(), "INFO".into()),
            (
                "NCCL_DEBUG_FILE".into(),
                input.scratch.join("nccl.%h.%p.log").display().to_string(),
            ),
        ]
    } else {
        Vec::new()
    }
}

pub fn work(job: &Job, link: &mut Link) -> Result<(), String> {
    let probe = nccl_sys::probe(
        &CudaSearch::from_env(None),
        &NcclSearch::from_env(job.lib.as_deref()),
    );
    let found = probe.nccl.as_ref().ok().map(|n| Found {
        path: n.path.clone(),
        version: format!("{} {}", flavour(&n.path), n.version),
    });
    if !probe.available() {
        let mut reason = probe.to_string();
        // Without a device the probe's sentence is about the device alone;
        // a library the operator named and that failed to load is worth
        // saying too, with what was tried.
        let named = job.lib.is_some() || std::env::var_os("PREFLIGHT_NCCL_LIB").is_some();
        if let (true, Err(e)) = (named, &probe.nccl)
            && !reason.contains(&e.to_string())
        {
            reason = format!("{reason}; {e}");
        }
        return link.send(&ToParent::Probe {
            available: false,
            reason,
            found,
        });
    }
    let cuda = nccl_sys::Cuda::open(None).map_err(|e| e.to_string())?;
    let nccl = Nccl::open(job.lib.as_deref()).map_err(|e| e.to_string())?;
    let count = cuda.init().map_err(|e| e.to_string())?;
    let ordinal = job.local_rank as usize % count.max(1);
    let dev = match cuda.device(ordinal) {
        Ok(d) => d,
        Err(e) => {
            return link.send(&ToParent::Probe {
                available: false,
                reason: format!("CUDA device {ordinal}: {e}"),
                found,
            });
        }
    };
    let name = dev.name().unwrap_or_default();
    link.send(&ToParent::Probe {
        available: true,
        reason: format!("{probe}; rank {} on GPU {ordinal} {name}", job.rank),
        found,
    })?;
    let unique_id = || {
        nccl.unique_id()
            .map(|u| u.as_bytes().to_vec())
            .map_err(|e| e.to_string())
    };
    let init = |id: &[u8]| {
        let id = UniqueId::from_bytes(id).map_err(InitFailed::new)?;
        dev.make_current().map_err(InitFailed::new)?;
        let deadline = std::time::Instant::now() + Duration::from_millis(job.init_timeout_ms);
        let comm = nccl
            .init_rank_nonblocking(job.world as usize, &id, job.rank as usize)
            .and_then(|c| match c.wait_ready(deadline) {
                Ok(()) => Ok(c),
                Err(e) => {
                    let _ = c.abort();
                    Err(e)
                }
            });
        let comm = comm.map_err(|e| {
            let mut error = e.to_string();
            // NCCL names the ranks; how they came to share a device is
            // ours to say.
            if error.contains("Duplicate GPU detected") {
                error.push_str(&format!(
                    "; this rank (local rank {}) took GPU {ordinal} of the {count} it sees (local rank modulo the devices): start no more ranks on a node than it has GPUs, or give each rank its own (CUDA_VISIBLE_DEVICES)",
                    job.local_rank
                ));
            }
            InitFailed {
                stalled: matches!(e, nccl_sys::Error::Timeout { .. }),
                error,
            }
        })?;
        let stream = dev.stream().map_err(InitFailed::new)?;
        Ok(NcclComm {
            nccl: &nccl,
            dev: &dev,
            comm: Some(comm),
            stream,
            rank: job.rank,
            world: job.world,
        })
    };
    let notes = || transport_notes(&job.root);
    drive(LIBRARY.name, job, link, unique_id, init, notes)
}

/// What NCCL's INFO lines say about the network it chose, once init has
/// finished (NCCL picks it during init and writes its debug file
/// unbuffered, so the lines are there by now).
fn transport_notes(root: &Path) -> Vec<transport::Note> {
    use transport::{NetLog, Source};
    let env = |k: &str| std::env::var(k).ok();
    let level = env("NCCL_DEBUG").unwrap_or_default();
    let source = if !matches!(level.to_ascii_uppercase().as_str(), "INFO" | "TRACE") {
        Source::Quiet(if level.is_empty() {
            "(unset)".into()
        } else {
            level
        })
    } else {
        match env("NCCL_DEBUG_FILE") {
            Some(pattern) => Source::File(debug_file(&pattern, std::process::id())),
            None => Source::Stdout,
        }
    };
    let text = match &source {
        Source::File(path) => match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                return vec![(
                    false,
                    format!("cannot read NCCL's debug file {path} for the network it chose: {e}"),
                )];
            }
        },
        _ => String::new(),
    };
    let hcas = preflight_facts::infiniband::scan(&root.join("sys/class/infiniband"));
    transport::assess(
        &NetLog::parse(&text),
        &source,
        &transport::active_ports(&hcas),
        &env,
    )
}

/// NCCL_DEBUG_FILE as NCCL expands it: `%h` the host name up to its first
/// dot, `%p` the pid, `%%` a percent sign; anything else is kept.
fn debug_file(pattern: &str, pid: u32) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim().split('.').next().unwrap_or_default();
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// RCCL is NCCL's API under another name: say which one was loaded.
fn flavour(path: &str) -> &'static str {
    if path.contains("rccl") {
        "RCCL"
    } else {
        "NCCL"
    }
}

/// A communicator on this rank's GPU: NCCL's collectives on device copies
/// of the host buffers, polled to the step's deadline.
struct NcclComm<'a> {
    nccl: &'a Nccl,
    dev: &'a Device<'a>,
    /// `None` once aborted. Declared before `stream` so it is destroyed
    /// first: the stream its work was queued on outlives it.
    comm: Option<Comm<'a>>,
    stream: Stream<'a>,
    rank: u32,
    world: u32,
}

fn failed(e: nccl_sys::Error) -> OpError {
    match e {
        nccl_sys::Error::Timeout { what } => OpError::Stalled {
            detail: format!("{what} by the deadline; aborted with ncclCommAbort"),
        },
        remote if remote.is_remote() => OpError::Remote {
            detail: remote.to_string(),
        },
        other => OpError::Other {
            detail: other.to_string(),
        },
    }
}

fn aborted() -> nccl_sys::Error {
    nccl_sys::Error::InvalidArgument("the communicator was aborted".into())
}

impl<'a> NcclComm<'a> {
    fn comm(&self) -> Result<&Comm<'a>, nccl_sys::Error> {
        self.comm.as_ref().ok_or_else(aborted)
    }

    fn upload<T: DataType>(&self, host: &[T]) -> Result<DeviceBuffer<'a, T>, OpError> {
        let mut d = self.dev.alloc::<T>(host.len()).map_err(failed)?;
        d.copy_from_host(host).map_err(failed)?;
        Ok(d)
    }

    fn alloc<T: DataType>(&self, len: usize) -> Result<DeviceBuffer<'a, T>, OpError> {
        self.dev.alloc::<T>(len).map_err(failed)
    }

    /// Queues with `enqueue`, then waits for the stream under the deadline;
    /// the time is the operation's alone. A timeout aborts the
    /// communicator, so peers blocked on us learn at once.
    fn run(
        &mut self,
        deadline: Instant,
        enqueue: impl FnOnce(&Self) -> Result<(), nccl_sys::Error>,
    ) -> Result<Duration, OpError> {
        // An enqueue that returns ncclInProgress (a non-blocking
        // communicator connecting to a peer) is polled inside the call:
        // it must end by the step's deadline too, not NCCL-sys's default.
        if let Some(c) = self.comm.as_mut() {
            c.set_enqueue_timeout(deadline.saturating_duration_since(Instant::now()));
        }
        let t = std::time::Instant::now();
        let queued = enqueue(self);
        let done = queued.and_then(|()| self.comm()?.wait(&self.stream, deadline.into_std()));
        match done {
            Ok(()) => Ok(t.elapsed()),
            Err(e) => {
                // Said on stderr too, which the parent keeps as the
                // backend's log: the report shows that this rank ended the
                // operation itself, with ncclCommAbort, rather than being
                // killed.
                let how = match self.comm.take().map(Comm::abort) {
                    Some(Ok(())) => "ncclCommAbort done".to_string(),
                    Some(Err(a)) => format!("ncclCommAbort: {a}"),
                    None => "already aborted".to_string(),
                };
                eprintln!(
                    "preflight collective-worker: rank {} of {}: {e}; {how}",
                    self.rank, self.world
                );
                Err(failed(e))
            }
        }
    }

    fn sum<T: DataType + Copy>(
        &mut self,
        values: &mut [T],
        deadline: Instant,
    ) -> Result<Duration, OpError> {
        let mut d = self.upload(values)?;
        let took = self.run(deadline, |s| {
            s.comm()?.all_reduce_in_place(&mut d, RedOp::Sum, &s.stream)
        })?;
        d.copy_to_host(values).map_err(failed)?;
        Ok(took)
    }
}

impl Collectives for NcclComm<'_> {
    fn all_reduce(&mut self, words: Words<'_>, deadline: Instant) -> Result<Duration, OpError> {
        match words {
            Words::F32(v) => self.sum(v, deadline),
            Words::I32(v) => self.sum(v, deadline),
        }
    }

    fn broadcast(
        &mut self,
        buf: &mut [u8],
        root: u32,
        deadline: Instant,
    ) -> Result<Duration, OpError> {
        let mut d = self.upload::<u8>(buf)?;
        let took = self.run(deadline, |s| {
            s.comm()?.broadcast(&mut d, root as usize, &s.stream)
        })?;
        d.copy_to_host(buf).map_err(failed)?;
        Ok(took)
    }

    fn all_gather(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        deadline: Instant,
    ) -> Result<Duration, OpError> {
        let d_in = self.upload::<u8>(input)?;
        let mut d_out = self.alloc::<u8>(out.len())?;
        let took = self.run(deadline, |s| {
            s.comm()?.all_gather(&d_in, &mut d_out, &s.stream)
        })?;
        d_out.copy_to_host(out).map_err(failed)?;
        Ok(took)
    }

    fn send_recv(
        &mut self,
        send: &[u8],
        to: u32,
        recv: &mut [u8],
        from: u32,
        deadline: Instant,
    ) -> Result<Duration, OpError> {
        let d_send = self.upload::<u8>(send)?;
        let mut d_recv = self.alloc::<u8>(recv.len())?;
        let took = self.run(deadline, |s| {
            let comm = s.comm()?;
            s.nccl.group(|| {
                comm.send(&d_send, to as usize, &s.stream)?;
                comm.recv(&mut d_recv, from as usize, &s.stream)
            })
        })?;
        d_recv.copy_to_host(recv).map_err(failed)?;
        Ok(took)
    }

    // NCCL has no barrier: the driver's one-element all-reduce is one.

    fn abort(&mut self) {
        if let Some(c) = self.comm.take() {
            let _ = c.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_file_is_expanded_as_nccl_does() {
        assert_eq!(debug_file("/s/nccl.%p.log", 42), "/s/nccl.42.log");
        assert_eq!(debug_file("/s/100%%-%q%", 7), "/s/100%-%q%");
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        let short = host.trim().split('.').next().unwrap().to_string();
        assert_eq!(debug_file("%h:%p", 1), format!("{short}:1"));
    }
}
