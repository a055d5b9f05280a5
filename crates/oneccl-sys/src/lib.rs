//! oneCCL's C API, loaded at run time.
//!
//! `preflight` ships one binary to every node, so oneCCL is never linked at
//! build time: [`Library::open`] finds `libccl.so.2` (oneCCL 2022.x, the first
//! release with the `oneccl*` C functions) with `libloading` and says clearly
//! what it tried when it cannot.
//!
//! # Search order
//! 1. the caller's explicit path (the CLI passes `--oneccl-lib`); if it fails
//!    the search stops there;
//! 2. `PREFLIGHT_ONECCL_LIB`, same rule;
//! 3. the system loader by soname: `libccl.so.2`, then `libccl.so.1`;
//! 4. `$CCL_ROOT/lib/` then `$CCL_ROOT/lib/intel64/` (the oneAPI layouts).
//!
//! Every attempt is kept in a [`LoadReport`]. A library that opens but lacks
//! the `oneccl*` C symbols (oneCCL 2021.x, C++ API only) is
//! [`Error::Unsupported`], with the version read from its embedded build
//! string when there is one.
//!
//! # Bound
//! onecclGetVersion, onecclGetUniqueId, onecclCommInitRank, onecclAllReduce,
//! onecclBroadcast, onecclAllGather, onecclSend, onecclRecv,
//! onecclGroupStart/End, onecclCommDestroy, onecclGetLastError,
//! onecclGetErrorString. oneCCL's C API has no barrier: [`Comm::barrier`] is
//! an allreduce of one element.
//!
//! # Things a caller must know
//! - **Logs go to stdout.** oneCCL prints its warnings and errors on the
//!   process's stdout; a backend that owns stdout must run oneCCL in a child
//!   process whose stdout it captures into its log.
//! - **Few cores**: set `CCL_YIELD=sched_yield` when it is unset. oneCCL's
//!   default busy polling starves a 2-core node: a 4-float allreduce took 17
//!   to 80 ms instead of 0.13 to 0.5 ms.
//! - **Init can block for minutes, or longer.** When rank 0 is gone, the
//!   other ranks wait in `onecclCommInitRank` for `CCL_KVS_CONNECTION_TIMEOUT`
//!   (120 s by default), and there is no way to interrupt the call. Measured
//!   here with oneCCL 2022.2.0: a rank whose rank 0 had exited was still
//!   blocked after 50 s with `CCL_KVS_CONNECTION_TIMEOUT=5`. So run init
//!   under your own deadline, in a child process you can kill (a thread you
//!   abandon keeps its sockets and CPU). `CCL_LOG_LEVEL=fatal` is not a valid
//!   level: GetUniqueId then fails and waiting ranks hang forever.
//! - **Stale ranks and ports**: rank 0's key-value store takes port 4096 or
//!   the next free one, so a stale rank still waiting from an earlier run can
//!   reach a new rank 0 on the same port and wreck its init. Kill the ranks
//!   of a failed run before starting the next.
//! - **One oneCCL per process**: the 2022 CPU plugin needs the 2022
//!   `libccl.so.1`; a 2021 `libccl.so.1` (same soname) already loaded in the
//!   process, even one this crate refused as unsupported, makes it fail with
//!   "Could not load any plugin". C++ libraries are not unloaded, so probe
//!   an unknown library in a child process when the same process will use
//!   another oneCCL afterwards.
//! - **Errors**: failures come back as code 11 (`onecclPluginException`),
//!   whose `onecclGetErrorString` text is useless; [`Error::Call`] carries
//!   `onecclGetLastError` instead.
//! - **Threads**: oneCCL keeps its plugin state per thread, so a [`Comm`] is
//!   neither `Send` nor `Sync`: use it on the thread that created it.
//! - Loopback test environment: `CCL_KVS_IFACE=lo FI_PROVIDER=tcp
//!   FI_TCP_IFACE=lo CCL_ATL_SHM=1` (`FI_PROVIDER=shm` alone aborts).

// The workspace refuses `unsafe` (Cargo.toml's lints); this crate is
// where it lives, each block saying why it is sound.
#![allow(unsafe_code)]

mod search;

use loader_sys::c_text;
pub use search::{
    Attempt, CCL_ROOT, Candidate, LoadReport, SONAMES, Search, Source, embedded_version, root_dirs,
};

use std::ffi::{c_char, c_int, c_void};
use std::fmt;
use std::path::Path;

/// Size of `onecclUniqueId`, passed by value to `onecclCommInitRank`.
pub const UNIQUE_ID_BYTES: usize = 4096;

/// Everything that can go wrong, as values with the context to act on.
#[derive(Debug, Clone)]
pub enum Error {
    /// No candidate opened; the report lists each one and why.
    NotFound { report: LoadReport },
    /// The library opened but is not usable through the C API.
    Unsupported {
        path: String,
        version: Option<String>,
        missing: String,
        report: LoadReport,
    },
    /// A call returned an error code.
    Call {
        func: &'static str,
        code: i32,
        text: String,
    },
    /// The arguments cannot be right (lengths, ranks); nothing was called.
    InvalidArgument(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound { report } => {
                write!(f, "oneCCL C API (libccl.so.2) not found: {report}")
            }
            Error::Unsupported {
                path,
                version,
                missing,
                ..
            } => {
                let v = version
                    .as_deref()
                    .map(|v| format!("oneCCL {v}"))
                    .unwrap_or("a library".into());
                write!(
                    f,
                    "unsupported oneCCL version: {path} is {v} without the C API ({missing} missing); \
                     oneCCL 2022.x (libccl.so.2) is required"
                )
            }
            Error::Call { func, code, text } => write!(f, "{func} failed (code {code}): {text}"),
            Error::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// oneCCL's version, from `onecclGetVersion` (major*10000 + minor*100 + patch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub fn from_code(code: i32) -> Version {
        let c = code.max(0) as u32;
        Version {
            major: c / 10000,
            minor: (c / 100) % 100,
            patch: c % 100,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Reduction operations (`onecclRedOp_t`).
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

/// Element types oneCCL can move, with their `onecclDataType_t` value. Sealed:
/// the value must match the element size, or oneCCL reads past the buffer.
pub trait DataType: sealed::Sealed + Copy {
    const CODE: c_int;
}

macro_rules! data_types {
    ($($t:ty => $code:expr),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl DataType for $t { const CODE: c_int = $code; }
    )*};
}
data_types!(i8 => 0, u8 => 1, i32 => 2, u32 => 3, i64 => 4, u64 => 5, f32 => 7, f64 => 8);

/// The id rank 0 makes and every rank passes to init; it travels between
/// processes as [`UniqueId::as_bytes`].
#[derive(Clone)]
#[repr(C)]
struct RawUniqueId {
    data: [u8; UNIQUE_ID_BYTES],
}

#[derive(Clone)]
pub struct UniqueId(Box<RawUniqueId>);

impl UniqueId {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0.data
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId, Error> {
        let data: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "a unique id is {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(UniqueId(Box::new(RawUniqueId { data })))
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({} bytes)", UNIQUE_ID_BYTES)
    }
}

type CommPtr = *mut c_void;
type FnGetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type FnGetUniqueId = unsafe extern "C" fn(*mut RawUniqueId) -> c_int;
// nranks is size_t in the 2022 sources (int in some drafts); on x86-64 and
// aarch64 a zero-extended usize is read correctly either way.
type FnCommInitRank = unsafe extern "C" fn(*mut CommPtr, usize, RawUniqueId, c_int) -> c_int;
type FnAllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    CommPtr,
    *mut c_void,
) -> c_int;
type FnBroadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    CommPtr,
    *mut c_void,
) -> c_int;
type FnAllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, CommPtr, *mut c_void) -> c_int;
type FnSend =
    unsafe extern "C" fn(*const c_void, usize, c_int, c_int, CommPtr, *mut c_void) -> c_int;
type FnRecv = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, CommPtr, *mut c_void) -> c_int;
type FnVoid = unsafe extern "C" fn() -> c_int;
type FnCommDestroy = unsafe extern "C" fn(CommPtr) -> c_int;
type FnGetLastError = unsafe extern "C" fn(CommPtr) -> *const c_char;
type FnGetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

struct Fns {
    get_version: FnGetVersion,
    get_unique_id: FnGetUniqueId,
    comm_init_rank: FnCommInitRank,
    all_reduce: FnAllReduce,
    broadcast: FnBroadcast,
    all_gather: FnAllGather,
    send: FnSend,
    recv: FnRecv,
    group_start: FnVoid,
    group_end: FnVoid,
    comm_destroy: FnCommDestroy,
    get_last_error: FnGetLastError,
    get_error_string: FnGetErrorString,
}

impl Fns {
    /// Resolves every symbol or names the first one missing.
    fn resolve(lib: &libloading::Library) -> Result<Fns, &'static str> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the type alias matches the C prototype of this
                // symbol in oneCCL 2022's `oneapi/ccl.h`; the pointer is only
                // used while `lib` is alive (both live in `Library`).
                match unsafe { lib.get($name) } {
                    Ok(s) => *s,
                    Err(_) => return Err($name),
                }
            };
        }
        Ok(Fns {
            get_version: sym!("onecclGetVersion"),
            get_unique_id: sym!("onecclGetUniqueId"),
            comm_init_rank: sym!("onecclCommInitRank"),
            all_reduce: sym!("onecclAllReduce"),
            broadcast: sym!("onecclBroadcast"),
            all_gather: sym!("onecclAllGather"),
            send: sym!("onecclSend"),
            recv: sym!("onecclRecv"),
            group_start: sym!("onecclGroupStart"),
            group_end: sym!("onecclGroupEnd"),
            comm_destroy: sym!("onecclCommDestroy"),
            get_last_error: sym!("onecclGetLastError"),
            get_error_string: sym!("onecclGetErrorString"),
        })
    }
}

/// A loaded oneCCL with its C API resolved.
pub struct Library {
    fns: Fns,
    path: String,
    version: Version,
    report: LoadReport,
    // Last so that the function pointers above are dropped before the
    // library is unloaded.
    _lib: libloading::Library,
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

impl Library {
    /// Searches in the documented order with the process environment.
    pub fn open(explicit: Option<&Path>) -> Result<Library, Error> {
        Library::search(&Search::from_env(explicit))
    }

    /// Opens exactly this file.
    pub fn open_path(path: &Path) -> Result<Library, Error> {
        Library::search(&Search {
            explicit: Some(path.to_path_buf()),
            ..Search::default()
        })
    }

    pub fn search(search: &Search) -> Result<Library, Error> {
        let mut report = LoadReport::default();
        // SAFETY: loading runs the library's initialisers. oneCCL's are
        // plain C++ static constructors; that is the trust any dlopen of
        // the collective library needs, and the candidates are only ever
        // libccl, by the search's documented order.
        let opened = unsafe { loader_sys::open_first(search.candidates(), &mut report) };
        let Some((lib, path)) = opened else {
            return Err(Error::NotFound { report });
        };
        let fns = match Fns::resolve(&lib) {
            Ok(fns) => fns,
            Err(missing) => {
                if let Some(last) = report.attempts.last_mut() {
                    last.failure = Some(format!("no C API ({missing} missing)"));
                }
                let version = embedded_version(Path::new(&path));
                return Err(Error::Unsupported {
                    path,
                    version,
                    missing: missing.to_string(),
                    report,
                });
            }
        };
        let mut code: c_int = 0;
        // SAFETY: `get_version` is onecclGetVersion(int*), given a valid
        // pointer to a local.
        let rc = unsafe { (fns.get_version)(&mut code) };
        let mut library = Library {
            fns,
            path,
            version: Version::from_code(0),
            report,
            _lib: lib,
        };
        library.check("onecclGetVersion", rc)?;
        library.version = Version::from_code(code);
        Ok(library)
    }

    /// The file that was loaded (resolved through the loader when found by
    /// soname, when the platform tells us).
    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// Rank 0 makes the id; it embeds rank 0's key-value store address.
    pub fn unique_id(&self) -> Result<UniqueId, Error> {
        let mut raw = Box::new(RawUniqueId {
            data: [0; UNIQUE_ID_BYTES],
        });
        // SAFETY: onecclGetUniqueId writes one onecclUniqueId (4096 bytes)
        // into the boxed buffer of exactly that size.
        let rc = unsafe { (self.fns.get_unique_id)(&mut *raw) };
        self.check("onecclGetUniqueId", rc)?;
        Ok(UniqueId(raw))
    }

    /// Joins the communicator. Blocks until every rank has joined, or for
    /// `CCL_KVS_CONNECTION_TIMEOUT` when rank 0 is gone: see the crate docs.
    pub fn init_rank(&self, nranks: usize, id: &UniqueId, rank: usize) -> Result<Comm<'_>, Error> {
        if nranks == 0 || rank >= nranks || nranks > c_int::MAX as usize {
            return Err(Error::InvalidArgument(format!("rank {rank} of {nranks}")));
        }
        let mut comm: CommPtr = std::ptr::null_mut();
        // SAFETY: prototype onecclCommInitRank(onecclComm_t*, size_t,
        // onecclUniqueId, int); `comm` is a valid out-pointer and the id is
        // passed by value as the C struct.
        let rc =
            unsafe { (self.fns.comm_init_rank)(&mut comm, nranks, (*id.0).clone(), rank as c_int) };
        self.check("onecclCommInitRank", rc)?;
        if comm.is_null() {
            return Err(Error::Call {
                func: "onecclCommInitRank",
                code: 0,
                text: "returned no communicator".into(),
            });
        }
        Ok(Comm {
            lib: self,
            raw: comm,
            rank,
            nranks,
        })
    }

    /// Runs `f` between onecclGroupStart and onecclGroupEnd, so that sends
    /// and receives inside it progress together (a ring exchange needs this).
    /// GroupEnd is called even when `f` fails.
    ///
    /// Inside a group oneCCL only queues the work; it runs at GroupEnd. So
    /// the only way to queue work here is the [`Group`] handed to `f`, whose
    /// buffers must live for `'b`, longer than this call: a buffer made and
    /// dropped inside `f` does not compile. The communicators' own calls
    /// refuse to run while a group is open on this thread.
    ///
    /// ```no_run
    /// # fn ring(lib: &oneccl_sys::Library, comm: &oneccl_sys::Comm<'_>) -> Result<(), oneccl_sys::Error> {
    /// let out = vec![1u8; 8];
    /// let mut got = vec![0u8; 8];
    /// lib.group(|g| {
    ///     g.send(comm, &out, 1)?;
    ///     g.recv(comm, &mut got, 1)
    /// })
    /// # }
    /// ```
    ///
    /// ```compile_fail,E0597
    /// # fn ring(lib: &oneccl_sys::Library, comm: &oneccl_sys::Comm<'_>) -> Result<(), oneccl_sys::Error> {
    /// lib.group(|g| {
    ///     let out = vec![1u8; 8]; // dropped before the group runs
    ///     g.send(comm, &out, 1)
    /// })
    /// # }
    /// ```
    pub fn group<'b, R>(
        &self,
        f: impl FnOnce(&mut Group<'b>) -> Result<R, Error>,
    ) -> Result<R, Error> {
        if GROUP_OPEN.with(|g| g.replace(true)) {
            return Err(Error::InvalidArgument(
                "a group inside a group on one thread".into(),
            ));
        }
        // SAFETY: onecclGroupStart(void) has no preconditions.
        let rc = unsafe { (self.fns.group_start)() };
        if let Err(e) = self.check("onecclGroupStart", rc) {
            GROUP_OPEN.with(|g| g.set(false));
            return Err(e);
        }
        let mut group = Group {
            _buffers: std::marker::PhantomData,
        };
        let out = f(&mut group);
        // SAFETY: pairs with the GroupStart above on this thread; every
        // buffer queued since lives for 'b, beyond this call.
        let rc = unsafe { (self.fns.group_end)() };
        GROUP_OPEN.with(|g| g.set(false));
        let end = self.check("onecclGroupEnd", rc);
        let out = out?;
        end?;
        Ok(out)
    }

    fn check(&self, func: &'static str, rc: c_int) -> Result<(), Error> {
        if rc == 0 {
            return Ok(());
        }
        Err(Error::Call {
            func,
            code: rc,
            text: self.error_text(rc),
        })
    }

    /// onecclGetLastError first: for code 11 the error string is only
    /// "Unknown error code".
    fn error_text(&self, rc: c_int) -> String {
        // SAFETY: onecclGetLastError ignores its comm argument and returns a
        // NUL-terminated string owned by oneCCL (or NULL).
        let last = unsafe { c_text((self.fns.get_last_error)(std::ptr::null_mut())) };
        // SAFETY: onecclGetErrorString returns a static string for any code.
        let generic = unsafe { c_text((self.fns.get_error_string)(rc)) };
        match (last.trim(), generic.trim()) {
            ("", "") => format!("error {rc}"),
            ("", g) => g.to_string(),
            (l, _) => l.to_string(),
        }
    }
}

std::thread_local! {
    /// Whether this thread is inside [`Library::group`]: oneCCL's groups
    /// belong to the thread, and work queued in one runs only at its end.
    static GROUP_OPEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Refuses a communicator call that would only be queued, not run, because
/// a group is open: its buffers could be gone by the group's end.
fn not_in_group(func: &str) -> Result<(), Error> {
    if GROUP_OPEN.with(|g| g.get()) {
        return Err(Error::InvalidArgument(format!(
            "{func} inside a group: queue sends and receives with the group's own send and recv"
        )));
    }
    Ok(())
}

/// Sends and receives queued in an open group (see [`Library::group`]);
/// every buffer lives for `'b`, until after the group has run.
pub struct Group<'b> {
    _buffers: std::marker::PhantomData<&'b mut [u8]>,
}

impl<'b> Group<'b> {
    /// Queues a send of `buf` to `peer` on `comm`.
    pub fn send<T: DataType>(
        &mut self,
        comm: &Comm<'_>,
        buf: &'b [T],
        peer: usize,
    ) -> Result<(), Error> {
        comm.check_peer("send peer", peer, false)?;
        // SAFETY: `buf` holds `len` elements of T and is borrowed for 'b,
        // which outlives the group's end, where oneCCL reads it.
        let rc = unsafe {
            (comm.lib.fns.send)(
                buf.as_ptr().cast(),
                buf.len(),
                T::CODE,
                peer as c_int,
                comm.raw,
                std::ptr::null_mut(),
            )
        };
        comm.lib.check("onecclSend", rc)
    }

    /// Queues a receive into `buf` from `peer` on `comm`.
    pub fn recv<T: DataType>(
        &mut self,
        comm: &Comm<'_>,
        buf: &'b mut [T],
        peer: usize,
    ) -> Result<(), Error> {
        comm.check_peer("recv peer", peer, false)?;
        // SAFETY: `buf` holds `len` writable elements of T and is borrowed
        // mutably for 'b, which outlives the group's end, where oneCCL
        // writes it.
        let rc = unsafe {
            (comm.lib.fns.recv)(
                buf.as_mut_ptr().cast(),
                buf.len(),
                T::CODE,
                peer as c_int,
                comm.raw,
                std::ptr::null_mut(),
            )
        };
        comm.lib.check("onecclRecv", rc)
    }
}

/// One rank's communicator; destroyed on drop. Buffers are host memory.
pub struct Comm<'a> {
    lib: &'a Library,
    raw: CommPtr,
    rank: usize,
    nranks: usize,
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

    /// `recv[i] = op over ranks of send[i]`.
    pub fn all_reduce<T: DataType>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: RedOp,
    ) -> Result<(), Error> {
        not_in_group("onecclAllReduce")?;
        if send.len() != recv.len() {
            return Err(Error::InvalidArgument(format!(
                "allreduce: send has {} elements, recv {}",
                send.len(),
                recv.len()
            )));
        }
        // SAFETY: both buffers hold `len` elements of T, whose CODE matches
        // its size; the call completes before returning (stream NULL).
        let rc = unsafe {
            (self.lib.fns.all_reduce)(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                send.len(),
                T::CODE,
                op as c_int,
                self.raw,
                std::ptr::null_mut(),
            )
        };
        self.lib.check("onecclAllReduce", rc)
    }

    /// In place: `buf` is both input and output.
    pub fn all_reduce_in_place<T: DataType>(&self, buf: &mut [T], op: RedOp) -> Result<(), Error> {
        not_in_group("onecclAllReduce")?;
        let p = buf.as_mut_ptr();
        // SAFETY: oneCCL allows sendbuff == recvbuff; the buffer holds
        // `len` elements of T.
        let rc = unsafe {
            (self.lib.fns.all_reduce)(
                p.cast_const().cast(),
                p.cast(),
                buf.len(),
                T::CODE,
                op as c_int,
                self.raw,
                std::ptr::null_mut(),
            )
        };
        self.lib.check("onecclAllReduce", rc)
    }

    /// Every rank's `buf` ends equal to `root`'s.
    pub fn broadcast<T: DataType>(&self, buf: &mut [T], root: usize) -> Result<(), Error> {
        not_in_group("onecclBroadcast")?;
        self.check_peer("broadcast root", root, true)?;
        let p = buf.as_mut_ptr();
        // SAFETY: in place (sendbuff == recvbuff) over `len` elements of T.
        let rc = unsafe {
            (self.lib.fns.broadcast)(
                p.cast_const().cast(),
                p.cast(),
                buf.len(),
                T::CODE,
                root as c_int,
                self.raw,
                std::ptr::null_mut(),
            )
        };
        self.lib.check("onecclBroadcast", rc)
    }

    /// `recv` holds every rank's `send` in rank order: `nranks * send.len()`.
    pub fn all_gather<T: DataType>(&self, send: &[T], recv: &mut [T]) -> Result<(), Error> {
        not_in_group("onecclAllGather")?;
        if Some(recv.len()) != send.len().checked_mul(self.nranks) {
            return Err(Error::InvalidArgument(format!(
                "allgather: recv must hold {} x {} elements, has {}",
                self.nranks,
                send.len(),
                recv.len()
            )));
        }
        // SAFETY: send holds `len` elements, recv `nranks * len`, as checked.
        let rc = unsafe {
            (self.lib.fns.all_gather)(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                send.len(),
                T::CODE,
                self.raw,
                std::ptr::null_mut(),
            )
        };
        self.lib.check("onecclAllGather", rc)
    }

    /// Point to point, run before it returns; pair it with [`Comm::recv`]
    /// on `peer`. When both sides send and receive, use a
    /// [`Library::group`] and its [`Group::send`] and [`Group::recv`].
    pub fn send<T: DataType>(&self, buf: &[T], peer: usize) -> Result<(), Error> {
        not_in_group("onecclSend")?;
        self.check_peer("send peer", peer, false)?;
        // SAFETY: `buf` holds `len` elements of T and outlives the call.
        let rc = unsafe {
            (self.lib.fns.send)(
                buf.as_ptr().cast(),
                buf.len(),
                T::CODE,
                peer as c_int,
                self.raw,
                std::ptr::null_mut(),
            )
        };
        self.lib.check("onecclSend", rc)
    }

    pub fn recv<T: DataType>(&self, buf: &mut [T], peer: usize) -> Result<(), Error> {
        not_in_group("onecclRecv")?;
        self.check_peer("recv peer", peer, false)?;
        // SAFETY: `buf` holds `len` writable elements of T.
        let rc = unsafe {
            (self.lib.fns.recv)(
                buf.as_mut_ptr().cast(),
                buf.len(),
                T::CODE,
                peer as c_int,
                self.raw,
                std::ptr::null_mut(),
            )
        };
        self.lib.check("onecclRecv", rc)
    }

    /// The C API has no barrier: a one-element allreduce cannot finish on
    /// any rank before every rank has entered it.
    pub fn barrier(&self) -> Result<(), Error> {
        let mut one = [1i32];
        self.all_reduce_in_place(&mut one, RedOp::Sum)?;
        if one[0] as usize != self.nranks {
            return Err(Error::Call {
                func: "barrier",
                code: 0,
                text: format!("allreduce of 1 gave {}, expected {}", one[0], self.nranks),
            });
        }
        Ok(())
    }

    fn check_peer(&self, what: &str, peer: usize, self_ok: bool) -> Result<(), Error> {
        if peer >= self.nranks || (!self_ok && peer == self.rank) {
            return Err(Error::InvalidArgument(format!(
                "{what} {peer} for rank {} of {}",
                self.rank, self.nranks
            )));
        }
        Ok(())
    }
}

impl Drop for Comm<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` came from onecclCommInitRank and is destroyed once.
        // A failure here cannot be acted on; oneCCL logs it itself.
        let _ = unsafe { (self.lib.fns.comm_destroy)(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_code_splits_like_oneccl() {
        assert_eq!(Version::from_code(20220200).to_string(), "2022.2.0");
        assert_eq!(Version::from_code(20211602).to_string(), "2021.16.2");
    }

    #[test]
    fn unique_id_round_trips_and_rejects_wrong_sizes() {
        let id = UniqueId::from_bytes(&[7u8; UNIQUE_ID_BYTES]).unwrap();
        assert_eq!(id.as_bytes().len(), UNIQUE_ID_BYTES);
        assert!(matches!(
            UniqueId::from_bytes(&[0u8; 10]),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn a_missing_explicit_path_is_reported_with_the_loader_message() {
        let err = Library::open_path(Path::new("/nonexistent/libccl.so.2")).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::NotFound { .. }));
        assert!(
            text.contains("/nonexistent/libccl.so.2 (explicit path)"),
            "{text}"
        );
        assert!(text.contains("No such file"), "{text}");
    }

    #[test]
    fn a_library_without_the_c_api_is_unsupported() {
        // The C library itself has none of the oneccl* symbols.
        let err = Library::open_path(Path::new("libc.so.6")).unwrap_err();
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
        assert!(
            err.to_string().contains("onecclGetVersion missing"),
            "{err}"
        );
    }
}
