//! NCCL's API: the library, the unique id, communicators and the five
//! operations on device buffers.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cuda::{DeviceBuffer, Stream};
use crate::search::{LoadReport, NcclSearch};
use crate::{Error, c_text, open_first};

/// Size of `ncclUniqueId`, passed by value to ncclCommInitRank.
pub const UNIQUE_ID_BYTES: usize = 128;

const NCCL_SUCCESS: c_int = 0;
const NCCL_IN_PROGRESS: c_int = 7;
const NCCL_CONFIG_MAGIC: c_uint = 0xcafe_beef;
const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// NCCL's version as ncclGetVersion reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl NcclVersion {
    /// NCCL_VERSION(X,Y,Z) is X*10000+Y*100+Z since 2.9 and X*1000+Y*100+Z
    /// before; the two ranges do not overlap.
    pub fn from_code(code: i32) -> NcclVersion {
        let c = code.max(0) as u32;
        if c >= 10000 {
            NcclVersion {
                major: c / 10000,
                minor: (c / 100) % 100,
                patch: c % 100,
            }
        } else {
            NcclVersion {
                major: c / 1000,
                minor: (c / 100) % 10,
                patch: c % 100,
            }
        }
    }

    fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Reduction operations (`ncclRedOp_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

mod sealed {
    pub trait Sealed {}
}

/// Element types with their `ncclDataType_t`. Sealed: a code that does not
/// match the element size would make NCCL read past the buffer.
pub trait DataType: sealed::Sealed + Copy + Default {
    const CODE: c_int;
}

macro_rules! data_types {
    ($($t:ty => $code:expr),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl DataType for $t { const CODE: c_int = $code; }
    )*};
}
data_types!(i8 => 0, u8 => 1, i32 => 2, u32 => 3, i64 => 4, u64 => 5, f32 => 7, f64 => 8);

#[derive(Clone, Copy)]
#[repr(C)]
struct RawUniqueId {
    internal: [c_char; UNIQUE_ID_BYTES],
}

/// Made by rank 0 ([`Nccl::unique_id`]) and given to every rank; it embeds
/// rank 0's bootstrap address (eth0's by default, 127.0.0.1 with
/// NCCL_SOCKET_IFNAME=lo).
#[derive(Clone, Copy)]
pub struct UniqueId(RawUniqueId);

impl UniqueId {
    pub fn as_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        self.0.internal.map(|c| c as u8)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId, Error> {
        let b: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "an NCCL unique id is {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(UniqueId(RawUniqueId {
            internal: b.map(|x| x as c_char),
        }))
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({UNIQUE_ID_BYTES} bytes)")
    }
}

/// `ncclConfig_t` as of NCCL 2.17 (see the crate docs for why a fixed
/// layout is right for every later version).
#[repr(C)]
struct ConfigV217 {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
}

/// `ncclConfig_t` as of NCCL 2.14, the first with the config.
#[repr(C)]
struct ConfigV214 {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
}

type CommPtr = *mut c_void;
type FnCollective3 = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    CommPtr,
    *mut c_void,
) -> c_int;

struct Fns {
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_unique_id: unsafe extern "C" fn(*mut RawUniqueId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut CommPtr, c_int, RawUniqueId, c_int) -> c_int,
    // The config pointer is typed per layout at the call site.
    comm_init_rank_config:
        Option<unsafe extern "C" fn(*mut CommPtr, c_int, RawUniqueId, c_int, *mut c_void) -> c_int>,
    all_reduce: FnCollective3,
    // (send, recv, count, type, root, comm, stream): same shape.
    broadcast: FnCollective3,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        CommPtr,
        *mut c_void,
    ) -> c_int,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, CommPtr, *mut c_void) -> c_int,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, CommPtr, *mut c_void) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    comm_get_async_error: unsafe extern "C" fn(CommPtr, *mut c_int) -> c_int,
    comm_abort: unsafe extern "C" fn(CommPtr) -> c_int,
    comm_destroy: unsafe extern "C" fn(CommPtr) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    // 2.13 and later; older libraries give only the generic string.
    get_last_error: Option<unsafe extern "C" fn(CommPtr) -> *const c_char>,
}

impl Fns {
    fn resolve(lib: &libloading::Library, path: &str) -> Result<Fns, Error> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the field's type is this symbol's prototype in
                // nccl.h; the pointer lives in `Nccl` with the library.
                match unsafe { lib.get($name) } {
                    Ok(s) => *s,
                    Err(_) => {
                        return Err(Error::MissingSymbol {
                            path: path.to_string(),
                            symbol: $name,
                        })
                    }
                }
            };
        }
        macro_rules! opt {
            ($name:literal) => {
                // SAFETY: as above, for a symbol only newer versions have.
                unsafe { lib.get($name) }.ok().map(|s| *s)
            };
        }
        Ok(Fns {
            get_version: sym!("ncclGetVersion"),
            get_unique_id: sym!("ncclGetUniqueId"),
            comm_init_rank: sym!("ncclCommInitRank"),
            comm_init_rank_config: opt!("ncclCommInitRankConfig"),
            all_reduce: sym!("ncclAllReduce"),
            broadcast: sym!("ncclBroadcast"),
            all_gather: sym!("ncclAllGather"),
            send: sym!("ncclSend"),
            recv: sym!("ncclRecv"),
            group_start: sym!("ncclGroupStart"),
            group_end: sym!("ncclGroupEnd"),
            comm_get_async_error: sym!("ncclCommGetAsyncError"),
            comm_abort: sym!("ncclCommAbort"),
            comm_destroy: sym!("ncclCommDestroy"),
            get_error_string: sym!("ncclGetErrorString"),
            get_last_error: opt!("ncclGetLastError"),
        })
    }
}

/// A loaded NCCL (or RCCL).
pub struct Nccl {
    fns: Fns,
    path: String,
    version: NcclVersion,
    report: LoadReport,
    // Last: the function pointers must not outlive the mapping.
    _lib: libloading::Library,
}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

impl Nccl {
    /// Searches in the documented order with the process environment.
    pub fn open(explicit: Option<&Path>) -> Result<Nccl, Error> {
        Nccl::search(&NcclSearch::from_env(explicit))
    }

    pub fn open_path(path: &Path) -> Result<Nccl, Error> {
        Nccl::search(&NcclSearch {
            explicit: Some(path.to_path_buf()),
            ..NcclSearch::default()
        })
    }

    pub fn search(search: &NcclSearch) -> Result<Nccl, Error> {
        let mut report = LoadReport::default();
        let mut found = open_first(search.early(), &mut report);
        // Python is asked only when nothing earlier loaded: it costs a
        // process start.
        // An explicit path or PREFLIGHT_NCCL_LIB that failed ends the search:
        // site_candidates is empty then.
        if found.is_none() {
            let more = search.site_candidates(&mut report);
            found = open_first(more, &mut report);
        }
        let Some((lib, path)) = found else {
            return Err(Error::NotFound {
                what: "NCCL (libnccl.so.2 / librccl.so.1)",
                report,
            });
        };
        let fns = Fns::resolve(&lib, &path)?;
        let mut code: c_int = 0;
        // SAFETY: ncclGetVersion(int*) with a valid out-pointer; it needs
        // no GPU.
        let rc = unsafe { (fns.get_version)(&mut code) };
        let mut nccl = Nccl {
            fns,
            path,
            version: NcclVersion::from_code(0),
            report,
            _lib: lib,
        };
        nccl.check("ncclGetVersion", rc, std::ptr::null_mut())?;
        nccl.version = NcclVersion::from_code(code);
        Ok(nccl)
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn version(&self) -> NcclVersion {
        self.version
    }

    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// Whether init can be non-blocking (ncclCommInitRankConfig, 2.14+).
    pub fn supports_nonblocking(&self) -> bool {
        self.fns.comm_init_rank_config.is_some() && self.version.at_least(2, 14)
    }

    /// Works without a GPU (it only picks the bootstrap address).
    pub fn unique_id(&self) -> Result<UniqueId, Error> {
        let mut raw = RawUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: writes one ncclUniqueId into a buffer of that size.
        let rc = unsafe { (self.fns.get_unique_id)(&mut raw) };
        self.check("ncclGetUniqueId", rc, std::ptr::null_mut())?;
        Ok(UniqueId(raw))
    }

    /// Blocking init on the device current on this thread. Without a GPU
    /// this fails at once with ncclUnhandledCudaError.
    pub fn init_rank(&self, nranks: usize, id: &UniqueId, rank: usize) -> Result<Comm<'_>, Error> {
        let (n, r) = rank_args(nranks, rank)?;
        let mut comm: CommPtr = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the id is passed by value as in C.
        let rc = unsafe { (self.fns.comm_init_rank)(&mut comm, n, id.0, r) };
        self.new_comm("ncclCommInitRank", rc, comm, nranks, rank)
    }

    /// Non-blocking init: returns at once with the communicator still
    /// connecting; [`Comm::wait_ready`] polls it up to a deadline, then
    /// [`Comm::abort`] ends a hang. Falls back to blocking init on NCCL
    /// before 2.14 ([`Nccl::supports_nonblocking`]).
    pub fn init_rank_nonblocking(
        &self,
        nranks: usize,
        id: &UniqueId,
        rank: usize,
    ) -> Result<Comm<'_>, Error> {
        let Some(init) = self
            .fns
            .comm_init_rank_config
            .filter(|_| self.supports_nonblocking())
        else {
            return self.init_rank(nranks, id, rank);
        };
        let (n, r) = rank_args(nranks, rank)?;
        let mut comm: CommPtr = std::ptr::null_mut();
        let rc = if self.version.at_least(2, 17) {
            let mut cfg = ConfigV217 {
                size: size_of::<ConfigV217>(),
                magic: NCCL_CONFIG_MAGIC,
                version: 21700,
                blocking: 0,
                cga_cluster_size: NCCL_CONFIG_UNDEF_INT,
                min_ctas: NCCL_CONFIG_UNDEF_INT,
                max_ctas: NCCL_CONFIG_UNDEF_INT,
                net_name: std::ptr::null(),
            };
            // SAFETY: a config of the 2.17 layout whose `size` and `version`
            // tell NCCL how much of it to read; it is copied during the call.
            unsafe { init(&mut comm, n, id.0, r, (&raw mut cfg).cast()) }
        } else {
            let mut cfg = ConfigV214 {
                size: size_of::<ConfigV214>(),
                magic: NCCL_CONFIG_MAGIC,
                version: 21400,
                blocking: 0,
            };
            // SAFETY: the 2.14 layout, which 2.14 to 2.16 read in full.
            unsafe { init(&mut comm, n, id.0, r, (&raw mut cfg).cast()) }
        };
        self.new_comm("ncclCommInitRankConfig", rc, comm, nranks, rank)
    }

    fn new_comm(
        &self,
        func: &'static str,
        rc: c_int,
        comm: CommPtr,
        nranks: usize,
        rank: usize,
    ) -> Result<Comm<'_>, Error> {
        if rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS {
            let err = self.error(func, rc, comm);
            if !comm.is_null() {
                // SAFETY: a communicator NCCL handed out; abort never blocks.
                let _ = unsafe { (self.fns.comm_abort)(comm) };
            }
            return Err(err);
        }
        if comm.is_null() {
            return Err(Error::Nccl {
                func,
                code: rc,
                name: "no communicator returned".into(),
                last: String::new(),
            });
        }
        Ok(Comm {
            nccl: self,
            raw: comm,
            rank,
            nranks,
            gone: false,
            enqueue_timeout: Duration::from_secs(300),
        })
    }

    /// Runs `f` between ncclGroupStart and ncclGroupEnd (send/recv pairs
    /// and multi-device calls from one thread need it). GroupEnd runs even
    /// when `f` fails.
    pub fn group<R>(&self, f: impl FnOnce() -> Result<R, Error>) -> Result<R, Error> {
        // SAFETY: no arguments; NCCL keeps group depth per thread.
        let rc = unsafe { (self.fns.group_start)() };
        self.check("ncclGroupStart", rc, std::ptr::null_mut())?;
        let out = f();
        // SAFETY: pairs with the GroupStart above.
        let rc = unsafe { (self.fns.group_end)() };
        let end = self.check("ncclGroupEnd", rc, std::ptr::null_mut());
        let out = out?;
        end?;
        Ok(out)
    }

    fn check(&self, func: &'static str, rc: c_int, comm: CommPtr) -> Result<(), Error> {
        if rc == NCCL_SUCCESS || rc == NCCL_IN_PROGRESS {
            return Ok(());
        }
        Err(self.error(func, rc, comm))
    }

    fn error(&self, func: &'static str, rc: c_int, comm: CommPtr) -> Error {
        // SAFETY: ncclGetErrorString returns a static string for any code.
        let name = unsafe { c_text((self.fns.get_error_string)(rc)) };
        let last = match self.fns.get_last_error {
            // SAFETY: ncclGetLastError accepts NULL or a live communicator
            // and returns a string owned by NCCL.
            Some(f) => unsafe { c_text(f(comm)) },
            None => String::new(),
        };
        Error::Nccl {
            func,
            code: rc,
            name,
            last: last.trim().to_string(),
        }
    }
}

fn rank_args(nranks: usize, rank: usize) -> Result<(c_int, c_int), Error> {
    match (c_int::try_from(nranks), c_int::try_from(rank)) {
        (Ok(n), Ok(r)) if n > 0 && r < n => Ok((n, r)),
        _ => Err(Error::InvalidArgument(format!("rank {rank} of {nranks}"))),
    }
}

/// Where a communicator stands, from ncclCommGetAsyncError.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommState {
    Ready,
    /// Non-blocking init or an operation is still running.
    InProgress,
}

/// One rank's communicator. Dropped: destroyed when healthy, aborted
/// otherwise (ncclCommDestroy would wait on a peer that is gone). Keep the
/// [`crate::Device`] whose context was current at init alive until the
/// communicator is gone: NCCL's resources live in that context.
pub struct Comm<'a> {
    nccl: &'a Nccl,
    raw: CommPtr,
    rank: usize,
    nranks: usize,
    gone: bool,
    enqueue_timeout: Duration,
}

impl fmt::Debug for Comm<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Comm(rank {} of {})", self.rank, self.nranks)
    }
}

impl Comm<'_> {
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// ncclCommGetAsyncError: never blocks.
    pub fn state(&self) -> Result<CommState, Error> {
        let mut st: c_int = NCCL_SUCCESS;
        // SAFETY: a live communicator and a valid out-pointer.
        let rc = unsafe { (self.nccl.fns.comm_get_async_error)(self.raw, &mut st) };
        self.nccl.check("ncclCommGetAsyncError", rc, self.raw)?;
        match st {
            NCCL_SUCCESS => Ok(CommState::Ready),
            NCCL_IN_PROGRESS => Ok(CommState::InProgress),
            code => Err(self.nccl.error("ncclCommGetAsyncError", code, self.raw)),
        }
    }

    /// Polls until init has finished, an error shows, or `deadline`
    /// passes: then [`Error::Timeout`] names this rank, and the caller
    /// should [`Comm::abort`].
    pub fn wait_ready(&self, deadline: Instant) -> Result<(), Error> {
        loop {
            if self.state()? == CommState::Ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "NCCL init of rank {} of {} still in progress",
                        self.rank, self.nranks
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Polls the stream and the communicator until the queued operations
    /// are done, an asynchronous NCCL error shows (a peer died, a network
    /// error), or `deadline` passes ([`Error::Timeout`]; then abort).
    pub fn wait(&self, stream: &Stream<'_>, deadline: Instant) -> Result<(), Error> {
        loop {
            // Ready first: with a non-blocking communicator an operation may
            // still be being enqueued, and an empty stream looks done. And
            // again after: an operation that fails records its error, then
            // leaves the stream, which between the two reads would pass
            // for an operation done (the CPU stand-in found this).
            if self.state()? == CommState::Ready
                && stream.is_done()?
                && self.state()? == CommState::Ready
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "NCCL operation on rank {} of {} not done",
                        self.rank, self.nranks
                    ),
                });
            }
            std::thread::yield_now();
        }
    }

    /// ncclCommAbort: ends a hang without waiting for peers.
    pub fn abort(mut self) -> Result<(), Error> {
        self.gone = true;
        // SAFETY: a live communicator, not used again (gone is set).
        let rc = unsafe { (self.nccl.fns.comm_abort)(self.raw) };
        self.nccl.check("ncclCommAbort", rc, std::ptr::null_mut())
    }

    /// ncclCommDestroy: waits for queued work; use on a healthy comm.
    pub fn destroy(mut self) -> Result<(), Error> {
        self.gone = true;
        // SAFETY: a live communicator, not used again (gone is set).
        let rc = unsafe { (self.nccl.fns.comm_destroy)(self.raw) };
        self.nccl.check("ncclCommDestroy", rc, std::ptr::null_mut())
    }

    /// `recv = op over ranks of send`, queued on `stream`.
    pub fn all_reduce<T: DataType>(
        &self,
        send: &DeviceBuffer<'_, T>,
        recv: &mut DeviceBuffer<'_, T>,
        op: RedOp,
        stream: &Stream<'_>,
    ) -> Result<(), Error> {
        self.same_device(&[send.device_ordinal(), recv.device_ordinal()], stream)?;
        if send.len() != recv.len() {
            return Err(Error::InvalidArgument(format!(
                "allreduce: send {} vs recv {}",
                send.len(),
                recv.len()
            )));
        }
        // SAFETY: device buffers of `len` elements of T on the stream's
        // device; they stay allocated while borrowed, and callers wait on
        // the stream before dropping them (see DeviceBuffer).
        let rc = unsafe {
            (self.nccl.fns.all_reduce)(
                send.raw(),
                recv.raw(),
                send.len(),
                T::CODE,
                op as c_int,
                self.raw,
                stream.raw(),
            )
        };
        self.settle("ncclAllReduce", rc)
    }

    /// In place: `buf` is input and output.
    pub fn all_reduce_in_place<T: DataType>(
        &self,
        buf: &mut DeviceBuffer<'_, T>,
        op: RedOp,
        stream: &Stream<'_>,
    ) -> Result<(), Error> {
        self.same_device(&[buf.device_ordinal()], stream)?;
        // SAFETY: NCCL allows sendbuff == recvbuff; `len` elements of T.
        let rc = unsafe {
            (self.nccl.fns.all_reduce)(
                buf.raw(),
                buf.raw(),
                buf.len(),
                T::CODE,
                op as c_int,
                self.raw,
                stream.raw(),
            )
        };
        self.settle("ncclAllReduce", rc)
    }

    /// In place: every rank's `buf` ends equal to `root`'s.
    pub fn broadcast<T: DataType>(
        &self,
        buf: &mut DeviceBuffer<'_, T>,
        root: usize,
        stream: &Stream<'_>,
    ) -> Result<(), Error> {
        self.same_device(&[buf.device_ordinal()], stream)?;
        let root = self.peer("broadcast root", root)?;
        // SAFETY: in place over `len` elements of T.
        let rc = unsafe {
            (self.nccl.fns.broadcast)(
                buf.raw(),
                buf.raw(),
                buf.len(),
                T::CODE,
                root,
                self.raw,
                stream.raw(),
            )
        };
        self.settle("ncclBroadcast", rc)
    }

    /// `recv` is every rank's `send` in rank order (`nranks * send.len()`).
    pub fn all_gather<T: DataType>(
        &self,
        send: &DeviceBuffer<'_, T>,
        recv: &mut DeviceBuffer<'_, T>,
        stream: &Stream<'_>,
    ) -> Result<(), Error> {
        self.same_device(&[send.device_ordinal(), recv.device_ordinal()], stream)?;
        if Some(recv.len()) != send.len().checked_mul(self.nranks) {
            return Err(Error::InvalidArgument(format!(
                "allgather: recv must hold {} x {}, has {}",
                self.nranks,
                send.len(),
                recv.len()
            )));
        }
        // SAFETY: send holds `len`, recv `nranks * len` elements, as checked.
        let rc = unsafe {
            (self.nccl.fns.all_gather)(
                send.raw(),
                recv.raw(),
                send.len(),
                T::CODE,
                self.raw,
                stream.raw(),
            )
        };
        self.settle("ncclAllGather", rc)
    }

    /// Point to point; put both sides' send and recv in [`Nccl::group`]
    /// (a send to self needs its recv in the same group).
    pub fn send<T: DataType>(
        &self,
        buf: &DeviceBuffer<'_, T>,
        peer: usize,
        stream: &Stream<'_>,
    ) -> Result<(), Error> {
        self.same_device(&[buf.device_ordinal()], stream)?;
        let peer = self.peer("send peer", peer)?;
        // SAFETY: `len` elements of T on the stream's device.
        let rc = unsafe {
            (self.nccl.fns.send)(buf.raw(), buf.len(), T::CODE, peer, self.raw, stream.raw())
        };
        self.settle("ncclSend", rc)
    }

    pub fn recv<T: DataType>(
        &self,
        buf: &mut DeviceBuffer<'_, T>,
        peer: usize,
        stream: &Stream<'_>,
    ) -> Result<(), Error> {
        self.same_device(&[buf.device_ordinal()], stream)?;
        let peer = self.peer("recv peer", peer)?;
        // SAFETY: `len` writable elements of T on the stream's device.
        let rc = unsafe {
            (self.nccl.fns.recv)(buf.raw(), buf.len(), T::CODE, peer, self.raw, stream.raw())
        };
        self.settle("ncclRecv", rc)
    }

    /// How long an operation that returned ncclInProgress (non-blocking
    /// communicators: enqueueing can wait for a connection to a peer) may
    /// take to be enqueued before the call gives up with [`Error::Timeout`].
    pub fn set_enqueue_timeout(&mut self, timeout: Duration) {
        self.enqueue_timeout = timeout;
    }

    /// NCCL requires a non-blocking communicator to leave ncclInProgress
    /// before the next call on it.
    fn settle(&self, func: &'static str, rc: c_int) -> Result<(), Error> {
        self.nccl.check(func, rc, self.raw)?;
        if rc != NCCL_IN_PROGRESS {
            return Ok(());
        }
        let deadline = Instant::now() + self.enqueue_timeout;
        while self.state()? == CommState::InProgress {
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "{func} on rank {} of {} still being enqueued",
                        self.rank, self.nranks
                    ),
                });
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// A rank of this communicator. Our own rank is a valid send/recv peer:
    /// NCCL (2.7+) matches a send to self with a recv from self in the same
    /// group, which is what a one-rank world's ring exchange is.
    fn peer(&self, what: &str, peer: usize) -> Result<c_int, Error> {
        if peer >= self.nranks {
            return Err(Error::InvalidArgument(format!(
                "{what} {peer} for rank {} of {}",
                self.rank, self.nranks
            )));
        }
        Ok(peer as c_int)
    }

    fn same_device(&self, buffers: &[usize], stream: &Stream<'_>) -> Result<(), Error> {
        let dev = stream.device_ordinal();
        if let Some(b) = buffers.iter().find(|b| **b != dev) {
            return Err(Error::InvalidArgument(format!(
                "buffer on device {b}, stream on device {dev}"
            )));
        }
        Ok(())
    }
}

impl Drop for Comm<'_> {
    fn drop(&mut self) {
        if self.gone {
            return;
        }
        let healthy = matches!(self.state(), Ok(CommState::Ready));
        // SAFETY: a live communicator, released once. Abort when it is not
        // healthy: destroy would wait for peers that may never answer.
        let _ = unsafe {
            if healthy {
                (self.nccl.fns.comm_destroy)(self.raw)
            } else {
                (self.nccl.fns.comm_abort)(self.raw)
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_old_and_new() {
        assert_eq!(NcclVersion::from_code(23203).to_string(), "2.32.3");
        assert_eq!(NcclVersion::from_code(21805).to_string(), "2.18.5");
        assert_eq!(NcclVersion::from_code(2708).to_string(), "2.7.8");
    }

    #[test]
    fn config_layouts_match_nccl_h() {
        // size_t size; unsigned magic, version; int blocking, cga, min, max;
        // const char* netName: 8 + 4 + 4 + 16 + 8 on LP64.
        assert_eq!(size_of::<ConfigV217>(), 40);
        assert_eq!(std::mem::offset_of!(ConfigV217, blocking), 16);
        assert_eq!(std::mem::offset_of!(ConfigV217, net_name), 32);
        assert_eq!(size_of::<ConfigV214>(), 24);
    }

    #[test]
    fn unique_id_bytes_round_trip() {
        let bytes: Vec<u8> = (0..UNIQUE_ID_BYTES as u32).map(|i| (i * 7) as u8).collect();
        let id = UniqueId::from_bytes(&bytes).unwrap();
        assert_eq!(id.as_bytes().to_vec(), bytes);
        assert!(UniqueId::from_bytes(&bytes[..10]).is_err());
    }

    #[test]
    fn rank_arguments_are_checked() {
        assert!(rank_args(0, 0).is_err());
        assert!(rank_args(2, 2).is_err());
        assert_eq!(rank_args(4, 3).unwrap(), (4, 3));
    }
}
