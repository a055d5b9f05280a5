//! The CUDA driver API from libcuda.so.1: devices, primary contexts, device
//! memory and streams, as much as an NCCL check needs.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;
use std::time::Instant;

use crate::nccl::DataType;
use crate::search::{CudaSearch, LoadReport};
use crate::{Error, c_text, open_first};

const CUDA_SUCCESS: c_int = 0;
const CUDA_ERROR_NO_DEVICE: c_int = 100;
pub(crate) const CUDA_ERROR_NOT_READY: c_int = 600;

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
pub(crate) type CuStream = *mut c_void;
pub(crate) type CuDevPtr = u64;
pub(crate) type CuEvent = *mut c_void;
/// CUhostFn: what a stream calls on a driver thread when it reaches it.
pub(crate) type CuHostFn = unsafe extern "C" fn(*mut c_void);

pub(crate) struct Fns {
    pub(crate) init: unsafe extern "C" fn(c_uint) -> CuResult,
    pub(crate) driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub(crate) device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub(crate) device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    pub(crate) device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    pub(crate) primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    pub(crate) primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    pub(crate) ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    pub(crate) ctx_synchronize: unsafe extern "C" fn() -> CuResult,
    pub(crate) mem_alloc: unsafe extern "C" fn(*mut CuDevPtr, usize) -> CuResult,
    pub(crate) mem_free: unsafe extern "C" fn(CuDevPtr) -> CuResult,
    pub(crate) memcpy_htod: unsafe extern "C" fn(CuDevPtr, *const c_void, usize) -> CuResult,
    pub(crate) memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevPtr, usize) -> CuResult,
    pub(crate) mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    pub(crate) stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    pub(crate) stream_query: unsafe extern "C" fn(CuStream) -> CuResult,
    pub(crate) stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    pub(crate) get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    pub(crate) device_get_pci_bus_id:
        unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    pub(crate) mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    pub(crate) mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(crate) memcpy_htod_async:
        unsafe extern "C" fn(CuDevPtr, *const c_void, usize, CuStream) -> CuResult,
    pub(crate) memcpy_dtoh_async:
        unsafe extern "C" fn(*mut c_void, CuDevPtr, usize, CuStream) -> CuResult,
    pub(crate) memcpy_dtod_async:
        unsafe extern "C" fn(CuDevPtr, CuDevPtr, usize, CuStream) -> CuResult,
    pub(crate) memset_d32_async:
        unsafe extern "C" fn(CuDevPtr, c_uint, usize, CuStream) -> CuResult,
    pub(crate) event_create: unsafe extern "C" fn(*mut CuEvent, c_uint) -> CuResult,
    pub(crate) event_record: unsafe extern "C" fn(CuEvent, CuStream) -> CuResult,
    pub(crate) event_elapsed_time: unsafe extern "C" fn(*mut f32, CuEvent, CuEvent) -> CuResult,
    pub(crate) event_destroy: unsafe extern "C" fn(CuEvent) -> CuResult,
    /// cuLaunchHostFunc, from CUDA 10: `None` in an older driver.
    pub(crate) launch_host_func:
        Option<unsafe extern "C" fn(CuStream, CuHostFn, *mut c_void) -> CuResult>,
    /// The memory test's kernels (`patterns`): every driver has them, but
    /// a library that lacks them fails only that test, not the rest.
    pub(crate) module_load_data:
        Option<unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CuResult>,
    pub(crate) module_get_function:
        Option<unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> CuResult>,
    pub(crate) module_unload: Option<unsafe extern "C" fn(*mut c_void) -> CuResult>,
    #[allow(clippy::type_complexity)]
    pub(crate) launch_kernel: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            CuStream,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> CuResult,
    >,
}

impl Fns {
    fn resolve(lib: &libloading::Library, path: &str) -> Result<Fns, Error> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the field's type is the prototype of this symbol in
                // cuda.h (the `_v2` names are what the header's macros select
                // for 64-bit device pointers); the pointer lives in `Cuda`
                // together with the library.
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
        Ok(Fns {
            init: sym!("cuInit"),
            driver_get_version: sym!("cuDriverGetVersion"),
            device_get_count: sym!("cuDeviceGetCount"),
            device_get: sym!("cuDeviceGet"),
            device_get_name: sym!("cuDeviceGetName"),
            primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain"),
            primary_ctx_release: sym!("cuDevicePrimaryCtxRelease_v2"),
            ctx_set_current: sym!("cuCtxSetCurrent"),
            ctx_synchronize: sym!("cuCtxSynchronize"),
            mem_alloc: sym!("cuMemAlloc_v2"),
            mem_free: sym!("cuMemFree_v2"),
            memcpy_htod: sym!("cuMemcpyHtoD_v2"),
            memcpy_dtoh: sym!("cuMemcpyDtoH_v2"),
            mem_get_info: sym!("cuMemGetInfo_v2"),
            stream_create: sym!("cuStreamCreate"),
            stream_query: sym!("cuStreamQuery"),
            stream_destroy: sym!("cuStreamDestroy_v2"),
            get_error_string: sym!("cuGetErrorString"),
            device_get_pci_bus_id: sym!("cuDeviceGetPCIBusId"),
            mem_host_alloc: sym!("cuMemHostAlloc"),
            mem_free_host: sym!("cuMemFreeHost"),
            memcpy_htod_async: sym!("cuMemcpyHtoDAsync_v2"),
            memcpy_dtoh_async: sym!("cuMemcpyDtoHAsync_v2"),
            memcpy_dtod_async: sym!("cuMemcpyDtoDAsync_v2"),
            memset_d32_async: sym!("cuMemsetD32Async"),
            event_create: sym!("cuEventCreate"),
            event_record: sym!("cuEventRecord"),
            event_elapsed_time: sym!("cuEventElapsedTime"),
            event_destroy: sym!("cuEventDestroy_v2"),
            // SAFETY: as `sym!`: the prototype of cuLaunchHostFunc in cuda.h.
            launch_host_func: unsafe { lib.get("cuLaunchHostFunc") }.ok().map(|s| *s),
            // SAFETY: as `sym!`: cuModuleLoadData, cuModuleGetFunction,
            // cuModuleUnload and cuLaunchKernel as cuda.h declares them.
            module_load_data: unsafe { lib.get("cuModuleLoadData") }.ok().map(|s| *s),
            // SAFETY: as above.
            module_get_function: unsafe { lib.get("cuModuleGetFunction") }.ok().map(|s| *s),
            // SAFETY: as above.
            module_unload: unsafe { lib.get("cuModuleUnload") }.ok().map(|s| *s),
            // SAFETY: as above.
            launch_kernel: unsafe { lib.get("cuLaunchKernel") }.ok().map(|s| *s),
        })
    }
}

/// The loaded CUDA driver. [`Cuda::open`] does not call cuInit: a driver
/// that loads but cannot initialise is a different finding from no driver.
pub struct Cuda {
    pub(crate) fns: Fns,
    path: String,
    report: LoadReport,
    // Last: the function pointers must not outlive the mapping.
    _lib: libloading::Library,
}

impl fmt::Debug for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cuda").field("path", &self.path).finish()
    }
}

impl Cuda {
    /// Searches in the documented order with the process environment.
    pub fn open(explicit: Option<&Path>) -> Result<Cuda, Error> {
        Cuda::search(&CudaSearch::from_env(explicit))
    }

    pub fn search(search: &CudaSearch) -> Result<Cuda, Error> {
        let mut report = LoadReport::default();
        let Some((lib, path)) = open_first(search.candidates(), &mut report) else {
            return Err(Error::NotFound {
                what: "libcuda.so.1",
                report,
            });
        };
        let fns = Fns::resolve(&lib, &path)?;
        Ok(Cuda {
            fns,
            path,
            report,
            _lib: lib,
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// cuInit(0). Returns the number of devices; a driver without devices
    /// answers CUDA_ERROR_NO_DEVICE, which is 0 here, not an error.
    pub fn init(&self) -> Result<usize, Error> {
        // SAFETY: cuInit takes flags that must be 0.
        let rc = unsafe { (self.fns.init)(0) };
        if rc == CUDA_ERROR_NO_DEVICE {
            return Ok(0);
        }
        self.check("cuInit", rc)?;
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.fns.device_get_count)(&mut n) };
        if rc == CUDA_ERROR_NO_DEVICE {
            return Ok(0);
        }
        self.check("cuDeviceGetCount", rc)?;
        Ok(n.max(0) as usize)
    }

    /// The driver's CUDA version as (major, minor), e.g. (12, 4).
    pub fn driver_version(&self) -> Result<(u32, u32), Error> {
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer; allowed before cuInit.
        let rc = unsafe { (self.fns.driver_get_version)(&mut v) };
        self.check("cuDriverGetVersion", rc)?;
        let v = v.max(0) as u32;
        Ok((v / 1000, (v % 1000) / 10))
    }

    /// Retains device `ordinal`'s primary context (the one the CUDA runtime
    /// inside NCCL also uses) and makes it current on this thread. Call
    /// [`Cuda::init`] first.
    pub fn device(&self, ordinal: usize) -> Result<Device<'_>, Error> {
        let mut dev: CuDevice = 0;
        let ord = c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("device {ordinal}")))?;
        // SAFETY: valid out-pointer; the driver checks the ordinal.
        self.check("cuDeviceGet", unsafe {
            (self.fns.device_get)(&mut dev, ord)
        })?;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: valid out-pointer and a device handle from cuDeviceGet.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.fns.primary_ctx_retain)(&mut ctx, dev)
        })?;
        let device = Device {
            cuda: self,
            dev,
            ordinal,
            ctx,
            hung: Cell::new(false),
        };
        device.make_current()?;
        Ok(device)
    }

    pub(crate) fn check(&self, func: &'static str, rc: CuResult) -> Result<(), Error> {
        if rc == CUDA_SUCCESS {
            return Ok(());
        }
        Err(Error::Cuda {
            func,
            code: rc,
            text: self.error_text(rc),
        })
    }

    fn error_text(&self, rc: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString stores a pointer to a static string.
        let ok = unsafe { (self.fns.get_error_string)(rc, &mut p) } == CUDA_SUCCESS;
        let text = if ok {
            // SAFETY: NULL or a static NUL-terminated string from the driver.
            unsafe { c_text(p) }
        } else {
            String::new()
        };
        if text.is_empty() {
            format!("CUDA error {rc}")
        } else {
            text
        }
    }
}

/// One GPU with its primary context retained; released on drop.
pub struct Device<'c> {
    pub(crate) cuda: &'c Cuda,
    dev: CuDevice,
    ordinal: usize,
    ctx: CuContext,
    /// Queued copies missed their deadline (`Stream::timed`): the device
    /// may never finish them, so nothing of it waits for its work again:
    /// its buffers are left allocated and its context retained.
    pub(crate) hung: Cell<bool>,
}

impl fmt::Debug for Device<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.ordinal)
    }
}

impl<'c> Device<'c> {
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes this device's context current on the calling thread, which is
    /// where NCCL and the memory calls look for it.
    pub fn make_current(&self) -> Result<(), Error> {
        // SAFETY: `ctx` is a retained primary context, valid until drop.
        self.cuda.check("cuCtxSetCurrent", unsafe {
            (self.cuda.fns.ctx_set_current)(self.ctx)
        })
    }

    pub fn name(&self) -> Result<String, Error> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL included.
        let rc = unsafe {
            (self.cuda.fns.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, self.dev)
        };
        self.cuda.check("cuDeviceGetName", rc)?;
        // SAFETY: NUL-terminated within the buffer on success.
        Ok(unsafe { c_text(buf.as_ptr()) })
    }

    /// The device's PCI address as sysfs writes it (`0000:3b:00.0`): the
    /// driver answers `0000:3B:00.0`.
    pub fn pci_bus_id(&self) -> Result<String, Error> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: the driver writes at most `len` bytes, NUL included.
        let rc = unsafe {
            (self.cuda.fns.device_get_pci_bus_id)(buf.as_mut_ptr(), buf.len() as c_int, self.dev)
        };
        self.cuda.check("cuDeviceGetPCIBusId", rc)?;
        // SAFETY: NUL-terminated within the buffer on success.
        Ok(unsafe { c_text(buf.as_ptr()) }.to_ascii_lowercase())
    }

    /// (free, total) bytes of the current context's device.
    pub fn mem_info(&self) -> Result<(usize, usize), Error> {
        self.make_current()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers, a current context.
        let rc = unsafe { (self.cuda.fns.mem_get_info)(&mut free, &mut total) };
        self.cuda.check("cuMemGetInfo", rc)?;
        Ok((free, total))
    }

    /// Whether copies on this device missed their deadline
    /// ([`Stream::timed`]): its buffers are then never freed.
    pub fn is_hung(&self) -> bool {
        self.hung.get()
    }

    /// Waits for all work on the device: a blocking call, for tests and
    /// teardown; use [`Stream::wait`] where a deadline matters.
    pub fn synchronize(&self) -> Result<(), Error> {
        self.make_current()?;
        // SAFETY: no arguments; a current context.
        self.cuda.check("cuCtxSynchronize", unsafe {
            (self.cuda.fns.ctx_synchronize)()
        })
    }

    /// `len` elements of uninitialised device memory.
    pub fn alloc<T: DataType>(&self, len: usize) -> Result<DeviceBuffer<'_, T>, Error> {
        self.make_current()?;
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or_else(|| Error::InvalidArgument(format!("{len} elements overflow")))?;
        let mut ptr: CuDevPtr = 0;
        // SAFETY: valid out-pointer, a current context; 0 bytes is rounded
        // up so every buffer has a real pointer.
        let rc = unsafe { (self.cuda.fns.mem_alloc)(&mut ptr, bytes.max(1)) };
        self.cuda.check("cuMemAlloc", rc)?;
        Ok(DeviceBuffer {
            device: self,
            ptr,
            len,
            abandoned: Cell::new(false),
            _t: PhantomData,
        })
    }

    /// A non-blocking stream (flag 1: it does not synchronise with the
    /// legacy default stream, as NCCL recommends).
    pub fn stream(&self) -> Result<Stream<'_>, Error> {
        self.make_current()?;
        let mut s: CuStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer, a current context.
        let rc = unsafe { (self.cuda.fns.stream_create)(&mut s, 1) };
        self.cuda.check("cuStreamCreate", rc)?;
        Ok(Stream {
            device: self,
            raw: s,
        })
    }
}

impl Drop for Device<'_> {
    fn drop(&mut self) {
        if self.hung.get() {
            // The last release would destroy the context under work that
            // may never finish.
            return;
        }
        // SAFETY: releases the retain taken in `Cuda::device`, once.
        let _ = unsafe { (self.cuda.fns.primary_ctx_release)(self.dev) };
    }
}

/// Device memory for `len` elements of T; freed on drop, after the
/// device's queued work has finished (cuCtxSynchronize), so that no
/// collective queued on it by safe code can run on freed memory. A buffer
/// of an operation that hangs is dropped after the communicator is
/// aborted, which ends that work.
pub struct DeviceBuffer<'d, T> {
    pub(crate) device: &'d Device<'d>,
    pub(crate) ptr: CuDevPtr,
    len: usize,
    /// Queued work that missed its deadline may still use the buffer
    /// (`Stream::timed`): it is then left allocated, never freed under it.
    pub(crate) abandoned: Cell<bool>,
    _t: PhantomData<T>,
}

impl<T> fmt::Debug for DeviceBuffer<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceBuffer({} elements on device {})",
            self.len, self.device.ordinal
        )
    }
}

impl<T: DataType> DeviceBuffer<'_, T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn raw(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }

    /// The buffer's device address, as a memory fault is reported.
    pub fn address(&self) -> u64 {
        self.ptr
    }

    pub(crate) fn device_ordinal(&self) -> usize {
        self.device.ordinal
    }

    /// Host-to-device copy of exactly `len` elements, complete on the
    /// device when this returns.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<(), Error> {
        self.same_len(src.len())?;
        self.device.make_current()?;
        // SAFETY: `src` holds `len` elements and the buffer as many.
        let rc = unsafe {
            (self.device.cuda.fns.memcpy_htod)(self.ptr, src.as_ptr().cast(), size_of_val(src))
        };
        self.device.cuda.check("cuMemcpyHtoD", rc)?;
        // From pageable memory cuMemcpyHtoD may return before the DMA has
        // landed, and our streams do not wait for the legacy stream it
        // uses: without this an NCCL kernel could read the old contents.
        self.device.synchronize()
    }

    /// Synchronous device-to-host copy of exactly `len` elements.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<(), Error> {
        self.same_len(dst.len())?;
        self.device.make_current()?;
        let bytes = size_of_val(dst);
        // SAFETY: `dst` holds `len` writable elements and the buffer as many.
        let rc =
            unsafe { (self.device.cuda.fns.memcpy_dtoh)(dst.as_mut_ptr().cast(), self.ptr, bytes) };
        self.device.cuda.check("cuMemcpyDtoH", rc)
    }

    fn same_len(&self, n: usize) -> Result<(), Error> {
        if n != self.len {
            return Err(Error::InvalidArgument(format!(
                "host slice has {n} elements, device buffer {}",
                self.len
            )));
        }
        Ok(())
    }
}

impl<T> Drop for DeviceBuffer<'_, T> {
    fn drop(&mut self) {
        // cuCtxSynchronize would wait for ever on a hung device's work.
        if self.abandoned.get() || self.device.hung.get() {
            return;
        }
        let _ = self.device.make_current();
        // Work queued on any stream of this context may still use the
        // buffer: let it finish before the memory goes back.
        let _ = self.device.synchronize();
        // SAFETY: `ptr` came from cuMemAlloc and is freed once.
        let _ = unsafe { (self.device.cuda.fns.mem_free)(self.ptr) };
    }
}

/// A CUDA stream; NCCL operations are queued on it and complete
/// asynchronously. Destroyed on drop.
pub struct Stream<'d> {
    pub(crate) device: &'d Device<'d>,
    pub(crate) raw: CuStream,
}

impl fmt::Debug for Stream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream(device {})", self.device.ordinal)
    }
}

impl Stream<'_> {
    pub(crate) fn raw(&self) -> *mut c_void {
        self.raw
    }

    pub(crate) fn device_ordinal(&self) -> usize {
        self.device.ordinal
    }

    /// True when all queued work is done (cuStreamQuery, never blocks).
    pub fn is_done(&self) -> Result<bool, Error> {
        // SAFETY: a live stream handle.
        let rc = unsafe { (self.device.cuda.fns.stream_query)(self.raw) };
        if rc == CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        self.device.cuda.check("cuStreamQuery", rc)?;
        Ok(true)
    }

    /// Polls until the stream is done or `deadline` passes
    /// ([`Error::Timeout`]). NCCL errors are not seen here: use
    /// [`crate::Comm::wait`] for collectives.
    pub fn wait(&self, deadline: Instant) -> Result<(), Error> {
        loop {
            if self.is_done()? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!("stream on device {}", self.device.ordinal),
                });
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // SAFETY: a live stream handle, destroyed once. Work still queued
        // completes; the driver frees the stream afterwards.
        let _ = unsafe { (self.device.cuda.fns.stream_destroy)(self.raw) };
    }
}
