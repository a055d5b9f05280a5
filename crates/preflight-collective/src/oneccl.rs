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

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use oneccl_sys::{Attempt, Comm, Library, LoadReport, RedOp, SONAMES, Search, Source, UniqueId};
use tokio::time::Instant;

use super::OpError;
use super::driver::{Collectives, InitFailed, Words, drive};
use super::job::{Job, Link, ToParent};
use super::library::{EnvInput, LibraryBackend};
use super::rank::Found;
use preflight_facts::shared_library;

pub const LIBRARY: LibraryBackend = LibraryBackend {
    name: "oneccl",
    flag: "oneccl-lib",
    flag_help: "The oneCCL C library (libccl.so.2, oneCCL 2022 or later) for the oneccl backend, instead of the search: PREFLIGHT_ONECCL_LIB, then the loader, then $CCL_ROOT/lib",
    install_hint: "Install oneCCL 2022 or later (libccl.so.2), source its setvars.sh (CCL_ROOT), or point --oneccl-lib / PREFLIGHT_ONECCL_LIB at it.",
    env,
    absent,
    work,
};

/// The worker's not-found sentence when no libccl is anywhere the search
/// would try (the loader's places, `$CCL_ROOT`), told without a process.
fn absent(named: Option<&Path>) -> Option<String> {
    let search = Search::from_env(named);
    if search.explicit.is_some() || search.env_path.is_some() {
        return None;
    }
    let places = shared_library::Places::of_this_process();
    if SONAMES.iter().any(|s| places.find(s).is_some()) {
        return None;
    }
    let mut attempts = vec![Attempt {
        source: Source::Loader,
        candidate: SONAMES.join(" or "),
        failure: Some(format!("not in {}", places.describe())),
    }];
    if let Some(root) = &search.ccl_root {
        for dir in oneccl_sys::root_dirs(root) {
            for soname in SONAMES {
                let p = dir.join(soname);
                if p.exists() {
                    return None;
                }
                attempts.push(Attempt {
                    source: Source::Root(oneccl_sys::CCL_ROOT),
                    candidate: p.display().to_string(),
                    failure: Some("No such file or directory".into()),
                });
            }
        }
    }
    Some(
        oneccl_sys::Error::NotFound {
            report: LoadReport {
                attempts,
                notes: Vec::new(),
            },
        }
        .to_string(),
    )
}

/// The settings oneCCL gets where the job left them unset (an operator's
/// own value always wins), and reported:
/// `CCL_YIELD=sched_yield` when the node has fewer than two cores per
/// local rank (busy polling starves the others: 17 to 80 ms per tiny
/// allreduce on 2 cores against 0.1 to 0.5 ms); `CCL_KVS_IFACE` and, for
/// libfabric's tcp provider, `FI_TCP_IFACE` set to the interface this rank
/// reached the master from (the default takes the first non-loopback
/// interface, which need not be the one the peers can reach);
/// `CCL_KVS_CONNECTION_TIMEOUT` to our init deadline, so oneCCL gives up
/// near the time we would kill it.
fn env(input: &EnvInput<'_, '_>) -> Vec<(String, String)> {
    let (info, init_timeout) = (input.info, input.init_timeout);
    let unset = |k: &str| std::env::var_os(k).is_none();
    let mut out: Vec<(String, String)> = Vec::new();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if unset("CCL_YIELD") && cores < 2 * info.local_world.max(1) as usize {
        out.push(("CCL_YIELD".into(), "sched_yield".into()));
    }
    if let Some(ifname) = info
        .route_ip
        .parse::<IpAddr>()
        .ok()
        .and_then(preflight_facts::interface_of)
    {
        if unset("CCL_KVS_IFACE") {
            out.push(("CCL_KVS_IFACE".into(), ifname.clone()));
        }
        let tcp_provider = std::env::var("FI_PROVIDER").is_ok_and(|p| p == "tcp");
        if tcp_provider && unset("FI_TCP_IFACE") {
            out.push(("FI_TCP_IFACE".into(), ifname));
        }
    }
    // Without them oneCCL asks its transport, and says so in a
    // warning on every run; only a launcher's own values are passed
    // on (a guess would mislead oneCCL's intra-node transport).
    let launcher_says = |vars: Vec<&str>| vars.into_iter().any(|v| !unset(v));
    if unset("CCL_LOCAL_RANK")
        && unset("CCL_LOCAL_SIZE")
        && launcher_says(preflight_facts::launch::local_rank_vars())
        && launcher_says(preflight_facts::launch::local_size_vars())
    {
        out.push(("CCL_LOCAL_RANK".into(), info.local_rank.to_string()));
        out.push(("CCL_LOCAL_SIZE".into(), info.local_world.max(1).to_string()));
    }
    if unset("CCL_KVS_CONNECTION_TIMEOUT") {
        out.push((
            "CCL_KVS_CONNECTION_TIMEOUT".into(),
            init_timeout.as_secs().max(1).to_string(),
        ));
    }
    out
}

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
    let unique_id = || {
        lib.unique_id()
            .map(|u| u.as_bytes().to_vec())
            .map_err(|e| e.to_string())
    };
    let init = |id: &[u8]| {
        let id = UniqueId::from_bytes(id).map_err(InitFailed::new)?;
        let comm = lib
            .init_rank(job.world as usize, &id, job.rank as usize)
            .map_err(InitFailed::new)?;
        Ok(OnecclComm { lib: &lib, comm })
    };
    drive(LIBRARY.name, job, link, unique_id, init, Vec::new)
}

/// A communicator on host buffers.
struct OnecclComm<'a> {
    lib: &'a Library,
    comm: Comm<'a>,
}

fn failed(e: oneccl_sys::Error) -> OpError {
    OpError::Other {
        detail: e.to_string(),
    }
}

/// Times only the library call, not what surrounds it.
fn timed<T>(call: impl FnOnce() -> Result<T, oneccl_sys::Error>) -> Result<Duration, OpError> {
    let t = std::time::Instant::now();
    call().map_err(failed)?;
    Ok(t.elapsed())
}

// oneCCL's calls cannot be interrupted: the deadline is the parent's, which
// kills the worker when a step overruns.
impl Collectives for OnecclComm<'_> {
    fn all_reduce(&mut self, words: Words<'_>, _deadline: Instant) -> Result<Duration, OpError> {
        match words {
            Words::F32(v) => timed(|| self.comm.all_reduce_in_place(v, RedOp::Sum)),
            Words::I32(v) => timed(|| self.comm.all_reduce_in_place(v, RedOp::Sum)),
        }
    }

    fn broadcast(
        &mut self,
        buf: &mut [u8],
        root: u32,
        _deadline: Instant,
    ) -> Result<Duration, OpError> {
        timed(|| self.comm.broadcast(buf, root as usize))
    }

    fn all_gather(
        &mut self,
        input: &[u8],
        out: &mut [u8],
        _deadline: Instant,
    ) -> Result<Duration, OpError> {
        timed(|| self.comm.all_gather(input, out))
    }

    fn send_recv(
        &mut self,
        send: &[u8],
        to: u32,
        recv: &mut [u8],
        from: u32,
        _deadline: Instant,
    ) -> Result<Duration, OpError> {
        let comm = &self.comm;
        timed(|| {
            self.lib.group(|g| {
                g.send(comm, send, to as usize)?;
                g.recv(comm, recv, from as usize)
            })
        })
    }

    fn barrier(&mut self, _deadline: Instant) -> Result<Duration, OpError> {
        timed(|| self.comm.barrier())
    }

    // oneCCL has no abort; the worker exits and the parent kills it if the
    // exit waits on a peer.
}
