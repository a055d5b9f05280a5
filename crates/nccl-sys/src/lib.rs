//! NCCL (or RCCL) and the CUDA driver API, loaded at run time.
//!
//! `preflight` ships one binary to every node, GPU or not, so neither
//! library is linked at build time: both are opened with `libloading`, every
//! `unsafe` call stays inside this crate, and a missing library or device is
//! an error value that says what was tried.
//!
//! # Search order for NCCL ([`NcclSearch::from_env`])
//! 1. the caller's explicit path (the CLI passes `--nccl-lib`); if it fails
//!    the search stops there;
//! 2. `PREFLIGHT_NCCL_LIB`, same rule;
//! 3. the system loader by soname: `libnccl.so.2`, then `librccl.so.1` (AMD,
//!    same API and symbol names);
//! 4. `nvidia/nccl/lib/libnccl.so.2` under the Python site-packages dirs,
//!    where pip-installed PyTorch keeps NCCL: first those `python3` reports
//!    (site dirs, user site, sys.path; 5 s deadline), then the common ones.
//!
//! The [`LoadReport`] lists every attempt and why it failed; [`Nccl::path`]
//! and [`Nccl::version`] say what was loaded.
//!
//! # The CUDA side ([`Cuda`])
//! The driver API from `libcuda.so.1` (explicit path, `PREFLIGHT_CUDA_LIB`,
//! the loader, then the usual driver directories), not the CUDA runtime:
//! the driver library is what the NVIDIA driver installs on every GPU node,
//! while the runtime would be one more library to find. NCCL takes a
//! driver-API stream as its `cudaStream_t` (they are the same handle) and
//! uses the context the driver API made current. Bound: cuInit,
//! cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, cuDeviceGetName,
//! cuDevicePrimaryCtxRetain/Release, cuCtxSetCurrent, cuCtxSynchronize,
//! cuMemAlloc, cuMemFree, cuMemcpyHtoD, cuMemcpyDtoH, cuMemGetInfo,
//! cuStreamCreate, cuStreamQuery, cuStreamDestroy, cuGetErrorString; for
//! copies timed on the GPU ([`Stream::timed`]): cuDeviceGetPCIBusId,
//! cuMemHostAlloc, cuMemFreeHost, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync,
//! cuMemcpyDtoDAsync, cuMemsetD32Async, cuEventCreate, cuEventRecord,
//! cuEventElapsedTime, cuEventDestroy, and where the driver has it (CUDA
//! 10 on) cuLaunchHostFunc, which holds a stream until its copies are all
//! queued; for the memory test's pattern kernels ([`Kernels`], PTX text
//! compiled by the driver): cuModuleLoadData, cuModuleGetFunction,
//! cuLaunchKernel and cuModuleUnload.
//!
//! # No GPU
//! [`probe`] answers before any collective call: "no CUDA device
//! (libcuda.so.1 not found)", "CUDA driver present but 0 devices", or
//! "available: N devices, driver X, NCCL 2.x.y at PATH". It matters because
//! libnccl.so.2 loads fine without a driver, and ncclGetVersion and
//! ncclGetUniqueId succeed; only ncclCommInitRank fails (ncclUnhandledCudaError,
//! "CUDA driver version is insufficient for CUDA runtime version", at once).
//!
//! # Non-blocking init and the config struct
//! [`Nccl::init_rank_nonblocking`] calls ncclCommInitRankConfig with
//! `blocking = 0`, then [`Comm::wait_ready`] polls ncclCommGetAsyncError
//! until a deadline, after which the caller calls [`Comm::abort`]. The
//! `ncclConfig_t` we pass has the layout of a fixed header version, not of
//! the loaded library: NCCL (since the config appeared in 2.14) reads `size`
//! from the struct, copies only `min(size, its own sizeof)` bytes over its own
//! NCCL_CONFIG_INITIALIZER defaults, and resets fields newer than the
//! struct's `version`. So for NCCL >= 2.17 we pass the 2.17 layout (size,
//! magic 0xcafebeef, version 21700, blocking, cgaClusterSize, minCTAs,
//! maxCTAs, netName) with every field but `blocking` "undefined" (INT_MIN /
//! NULL) as the initializer leaves them, and NCCL fills in its defaults for
//! everything it added later; for 2.14 to 2.16 the 2.14 layout (size, magic,
//! version, blocking); before 2.14 there is no ncclCommInitRankConfig and
//! init is blocking ([`Nccl::supports_nonblocking`] says which). A
//! non-blocking call that returns ncclInProgress is polled to ncclSuccess
//! before the next call, as NCCL requires.
//!
//! # Threads
//! A CUDA context is current per thread: make the [`Device`] current
//! ([`Device::make_current`]) on the thread that calls NCCL.

// The workspace refuses `unsafe` (Cargo.toml's lints); this crate is
// where it lives, each block saying why it is sound.
#![allow(unsafe_code)]

mod copies;
mod cuda;
mod nccl;
mod patterns;
mod probe;
mod search;

pub use copies::{Copy, PinnedBuffer, timed_together};
pub use cuda::{Cuda, Device, DeviceBuffer, Stream};
pub(crate) use loader_sys::c_text;
pub use nccl::{Comm, CommState, DataType, Nccl, NcclVersion, RedOp, UNIQUE_ID_BYTES, UniqueId};
pub use patterns::{
    BadWord, Found, KERNELS, Kernels, Mismatches, PTX, Pattern, declared, random_word,
};
pub use probe::{CudaStatus, NcclFound, Probe, probe};
pub use search::{
    Attempt, Candidate, CudaSearch, LoadReport, NCCL_SONAMES, NcclSearch, SITE_PACKAGES_NCCL,
    Source, common_site_dirs, python_site_dirs, site_dirs_by_files,
};

use std::fmt;

/// Everything that can go wrong, as values with the text to act on.
#[derive(Debug, Clone)]
pub enum Error {
    /// No candidate opened; the report says what was tried and why.
    NotFound {
        what: &'static str,
        report: LoadReport,
    },
    /// The library opened but a required symbol is missing (too old, or
    /// not the library it claims to be).
    MissingSymbol { path: String, symbol: &'static str },
    /// An NCCL call failed: the code, ncclGetErrorString and
    /// ncclGetLastError.
    Nccl {
        func: &'static str,
        code: i32,
        name: String,
        last: String,
    },
    /// A CUDA driver call failed, with cuGetErrorString's text.
    Cuda {
        func: &'static str,
        code: i32,
        text: String,
    },
    /// A deadline passed while waiting (init or an operation); the
    /// communicator is still alive and should be aborted.
    Timeout { what: String },
    /// The arguments cannot be right; nothing was called.
    InvalidArgument(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound { what, report } => write!(f, "{what} not found: {report}"),
            Error::MissingSymbol { path, symbol } => write!(f, "{path} lacks {symbol}"),
            Error::Nccl {
                func,
                code,
                name,
                last,
            } => {
                write!(f, "{func} failed: {name} (ncclResult {code})")?;
                if !last.is_empty() {
                    write!(f, ": {last}")?;
                }
                Ok(())
            }
            Error::Cuda { func, code, text } => {
                write!(f, "{func} failed: {text} (CUresult {code})")
            }
            Error::Timeout { what } => write!(f, "deadline passed: {what}"),
            Error::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// ncclRemoteError (6): "a call failed possibly due to a network error
    /// or a remote process exiting prematurely", as nccl.h puts it: what a
    /// rank sees when a peer went away or aborted, not a fault of its own.
    pub fn is_remote(&self) -> bool {
        matches!(self, Error::Nccl { code: 6, .. })
    }
}

/// Opens the first candidate that loads, recording every attempt.
pub(crate) fn open_first(
    candidates: Vec<Candidate>,
    report: &mut LoadReport,
) -> Option<(libloading::Library, String)> {
    // SAFETY: loading runs the library's initialisers; NCCL's and the CUDA
    // driver's are what any program using them runs, and the candidates
    // are only ever NCCL, RCCL or libcuda, by the search's documented
    // order.
    unsafe { loader_sys::open_first(candidates, report) }
}
