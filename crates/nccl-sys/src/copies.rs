//! Copies between page-locked host memory and a GPU, and on the GPU,
//! queued on a stream and timed by the GPU's own events: what a copy
//! bandwidth or a memory pattern check needs, with no kernel of our own.
//!
//! Safety without the caller's good manners: a queued copy reads or writes
//! its buffers until the stream reaches it, so [`Stream::timed`] returns
//! only once every copy it queued has finished; when the deadline passes
//! first, the buffers it used are abandoned (left allocated, never freed
//! or handed out again under a copy that may still land), and the host
//! buffer's bytes are refused from then on.

use std::cell::Cell;
use std::ffi::{c_uint, c_void};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::Error;
use crate::cuda::{CUDA_ERROR_NOT_READY, CuEvent, Device, DeviceBuffer, Stream};

/// cuMemHostAlloc's CU_MEMHOSTALLOC_PORTABLE: pinned for every context.
const PORTABLE: c_uint = 1;

/// Page-locked host memory (cuMemHostAlloc): what the copy engines reach
/// at the link's rate, where pageable memory goes through a staging copy.
pub struct PinnedBuffer<'d> {
    device: &'d Device<'d>,
    ptr: *mut u8,
    len: usize,
    abandoned: Cell<bool>,
}

impl fmt::Debug for PinnedBuffer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PinnedBuffer({} bytes)", self.len)
    }
}

impl<'c> Device<'c> {
    /// `len` bytes of zeroed page-locked host memory.
    pub fn pinned(&self, len: usize) -> Result<PinnedBuffer<'_>, Error> {
        self.make_current()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer, a current context; 0 bytes is rounded
        // up so every buffer has a real pointer.
        let rc = unsafe { (self.cuda.fns.mem_host_alloc)(&mut ptr, len.max(1), PORTABLE) };
        self.cuda.check("cuMemHostAlloc", rc)?;
        if ptr.is_null() {
            return Err(Error::InvalidArgument(
                "cuMemHostAlloc returned no memory".into(),
            ));
        }
        // SAFETY: the driver allocated at least `len` bytes at `ptr`.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, len) };
        Ok(PinnedBuffer {
            device: self,
            ptr: ptr.cast(),
            len,
            abandoned: Cell::new(false),
        })
    }
}

impl PinnedBuffer<'_> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, once no copy can be writing them. `&mut self`: no view
    /// can be held while a [`Copy`] names the buffer.
    pub fn bytes(&mut self) -> Result<&[u8], Error> {
        self.usable()?;
        // SAFETY: `len` initialised bytes (zeroed at allocation), owned by
        // this buffer; no queued copy uses them (`usable`).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    pub fn bytes_mut(&mut self) -> Result<&mut [u8], Error> {
        self.usable()?;
        // SAFETY: as `bytes`, and `&mut self` makes the view exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    fn usable(&self) -> Result<(), Error> {
        if self.abandoned.get() {
            return Err(Error::InvalidArgument(
                "a copy that missed its deadline may still write this buffer".into(),
            ));
        }
        Ok(())
    }
}

impl Drop for PinnedBuffer<'_> {
    fn drop(&mut self) {
        // A hung device's copies may still land here, and cuMemFreeHost
        // may wait for them.
        if self.abandoned.get() || self.device.hung.get() {
            return;
        }
        let _ = self.device.make_current();
        // SAFETY: `ptr` came from cuMemHostAlloc, is freed once, and no
        // queued copy uses it (`Stream::timed` returned after them all).
        let _ = unsafe { (self.device.cuda.fns.mem_free_host)(self.ptr.cast()) };
    }
}

/// One copy, by byte offsets into its buffers.
#[derive(Debug, Clone, Copy)]
pub enum Copy<'a> {
    /// Host to device (cuMemcpyHtoDAsync).
    ToDevice {
        from: &'a PinnedBuffer<'a>,
        from_at: usize,
        to: &'a DeviceBuffer<'a, u8>,
        to_at: usize,
        len: usize,
    },
    /// Device to host (cuMemcpyDtoHAsync).
    ToHost {
        from: &'a DeviceBuffer<'a, u8>,
        from_at: usize,
        to: &'a PinnedBuffer<'a>,
        to_at: usize,
        len: usize,
    },
    /// Within one device (cuMemcpyDtoDAsync).
    OnDevice {
        from: &'a DeviceBuffer<'a, u8>,
        from_at: usize,
        to: &'a DeviceBuffer<'a, u8>,
        to_at: usize,
        len: usize,
    },
    /// `len` bytes of `word` repeated, written by the device itself
    /// (cuMemsetD32Async); offset and length are multiples of 4.
    Fill {
        to: &'a DeviceBuffer<'a, u8>,
        to_at: usize,
        len: usize,
        word: u32,
    },
}

fn within(what: &str, at: usize, len: usize, size: usize) -> Result<(), Error> {
    match at.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::InvalidArgument(format!(
            "{what}: bytes {at}..+{len} outside a buffer of {size}"
        ))),
    }
}

impl Copy<'_> {
    fn check(&self, device: usize) -> Result<(), Error> {
        let on = |b: &DeviceBuffer<'_, u8>| {
            if b.device_ordinal() == device {
                Ok(())
            } else {
                Err(Error::InvalidArgument(format!(
                    "a buffer of device {} in a copy on device {device}",
                    b.device_ordinal()
                )))
            }
        };
        match *self {
            Copy::ToDevice {
                from,
                from_at,
                to,
                to_at,
                len,
            } => {
                on(to)?;
                within("host source", from_at, len, from.len)?;
                within("device destination", to_at, len, to.len())
            }
            Copy::ToHost {
                from,
                from_at,
                to,
                to_at,
                len,
            } => {
                on(from)?;
                within("device source", from_at, len, from.len())?;
                within("host destination", to_at, len, to.len)
            }
            Copy::OnDevice {
                from,
                from_at,
                to,
                to_at,
                len,
            } => {
                on(from)?;
                on(to)?;
                within("device source", from_at, len, from.len())?;
                within("device destination", to_at, len, to.len())?;
                // An overlapping copy's result is undefined on a GPU.
                let (a, b) = (from.ptr + from_at as u64, to.ptr + to_at as u64);
                if len > 0 && a < b + len as u64 && b < a + len as u64 {
                    return Err(Error::InvalidArgument(format!(
                        "a device-to-device copy of {len} bytes onto itself"
                    )));
                }
                Ok(())
            }
            Copy::Fill { to, to_at, len, .. } => {
                on(to)?;
                if to_at % 4 != 0 || len % 4 != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "a fill of {len} bytes at {to_at}: both multiples of 4"
                    )));
                }
                within("device destination", to_at, len, to.len())
            }
        }
    }

    /// Queues the copy on `stream`; `check` has held it to its buffers.
    fn queue(&self, stream: &Stream<'_>) -> Result<(), Error> {
        let fns = &stream.device.cuda.fns;
        let s = stream.raw;
        // Every arm: the ranges lie within their buffers (`check`), which
        // outlive the copy: `timed_together` returns only after the stream
        // finished it, or abandons the buffers.
        let (func, rc) = match *self {
            Copy::ToDevice {
                from,
                from_at,
                to,
                to_at,
                len,
            } => {
                // SAFETY: see above; `from` is host memory of `from.len` bytes.
                let rc = unsafe {
                    (fns.memcpy_htod_async)(
                        to.ptr + to_at as u64,
                        from.ptr.add(from_at).cast::<c_void>(),
                        len,
                        s,
                    )
                };
                ("cuMemcpyHtoDAsync", rc)
            }
            Copy::ToHost {
                from,
                from_at,
                to,
                to_at,
                len,
            } => {
                // SAFETY: see above; `to` is host memory of `to.len` bytes.
                let rc = unsafe {
                    (fns.memcpy_dtoh_async)(
                        to.ptr.add(to_at).cast::<c_void>(),
                        from.ptr + from_at as u64,
                        len,
                        s,
                    )
                };
                ("cuMemcpyDtoHAsync", rc)
            }
            Copy::OnDevice {
                from,
                from_at,
                to,
                to_at,
                len,
            } => {
                // SAFETY: see above; both are device buffers of this device.
                let rc = unsafe {
                    (fns.memcpy_dtod_async)(
                        to.ptr + to_at as u64,
                        from.ptr + from_at as u64,
                        len,
                        s,
                    )
                };
                ("cuMemcpyDtoDAsync", rc)
            }
            Copy::Fill {
                to,
                to_at,
                len,
                word,
            } => {
                // SAFETY: see above; `len / 4` words from a 4-byte offset.
                let rc = unsafe { (fns.memset_d32_async)(to.ptr + to_at as u64, word, len / 4, s) };
                ("cuMemsetD32Async", rc)
            }
        };
        stream.device.cuda.check(func, rc)
    }

    fn abandon(&self) {
        match *self {
            Copy::ToDevice { from, to, .. } => {
                from.abandoned.set(true);
                to.abandoned.set(true);
            }
            Copy::ToHost { from, to, .. } => {
                from.abandoned.set(true);
                to.abandoned.set(true);
            }
            Copy::OnDevice { from, to, .. } => {
                from.abandoned.set(true);
                to.abandoned.set(true);
            }
            Copy::Fill { to, .. } => to.abandoned.set(true),
        }
    }
}

/// A stream's copies queued between their events; or the error that
/// stopped the queueing, with the events of what was queued before it.
type Queued<'s> = Result<Events<'s>, (Error, Option<Events<'s>>)>;

/// Events of one `timed` call; destroyed when the stream is past them.
struct Events<'s> {
    stream: &'s Stream<'s>,
    raw: Vec<CuEvent>,
}

impl Events<'_> {
    fn record(&mut self) -> Result<(), Error> {
        let fns = &self.stream.device.cuda.fns;
        let mut e: CuEvent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flags 0 is CU_EVENT_DEFAULT (timed).
        let rc = unsafe { (fns.event_create)(&mut e, 0) };
        self.stream.device.cuda.check("cuEventCreate", rc)?;
        self.raw.push(e);
        // SAFETY: a live event and stream of the current context.
        let rc = unsafe { (fns.event_record)(e, self.stream.raw) };
        self.stream.device.cuda.check("cuEventRecord", rc)
    }

    /// The time between event `i` and `i + 1`, both reached.
    fn between(&self, i: usize) -> Result<Duration, Error> {
        let mut ms: f32 = 0.0;
        // SAFETY: two recorded events the stream has passed.
        let rc = unsafe {
            (self.stream.device.cuda.fns.event_elapsed_time)(&mut ms, self.raw[i], self.raw[i + 1])
        };
        self.stream.device.cuda.check("cuEventElapsedTime", rc)?;
        Duration::try_from_secs_f64(f64::from(ms.max(0.0)) / 1e3)
            .map_err(|e| Error::InvalidArgument(format!("cuEventElapsedTime said {ms} ms: {e}")))
    }

    /// Drops the events without destroying them: the stream may still
    /// reach them.
    fn leak(mut self) {
        self.raw.clear();
    }
}

impl Drop for Events<'_> {
    fn drop(&mut self) {
        for e in self.raw.drain(..) {
            // SAFETY: each event was created here and is destroyed once.
            let _ = unsafe { (self.stream.device.cuda.fns.event_destroy)(e) };
        }
    }
}

impl Stream<'_> {
    /// Queues `copies` in order, each between two events, and waits for
    /// them until `deadline`: each copy's time as the GPU measured it.
    /// On [`Error::Timeout`] the buffers the copies name are abandoned
    /// (see the module's documentation).
    pub fn timed(&self, copies: &[Copy<'_>], deadline: Instant) -> Result<Vec<Duration>, Error> {
        timed_together(&[(self, copies)], deadline)
            .pop()
            .unwrap_or_else(|| Ok(Vec::new()))
    }
}

/// Copies queued on several streams (one per GPU) before any is waited
/// for, so that they run at once: a link shared by GPUs (a PCIe switch's
/// uplink) only shows so. Each stream's result as [`Stream::timed`]'s.
///
/// Every stream is held at a [`Gate`] until all are queued: an event then
/// times its copy alone, never a pause of the host between queueing two
/// calls (a loaded node, a preempted thread), which a stream that had
/// run dry would count, and the streams start together.
pub fn timed_together(
    work: &[(&Stream<'_>, &[Copy<'_>])],
    deadline: Instant,
) -> Vec<Result<Vec<Duration>, Error>> {
    let gate = Gate::new(deadline);
    let mut queued: Vec<Queued<'_>> = Vec::new();
    for (stream, copies) in work {
        queued.push(stream.queue_timed(copies, &gate));
    }
    gate.open();
    // Every stream that had anything queued is waited for before any
    // result is read, so that nothing below (a panic included) lets a
    // buffer go while a copy may still use it.
    let waited: Vec<Result<(), Error>> = work
        .iter()
        .zip(&queued)
        .map(|((stream, copies), q)| {
            let anything = match q {
                Ok(_) => true,
                Err((_, events)) => events.is_some(),
            };
            if !anything {
                return Ok(());
            }
            let w = stream.wait_for_copies(deadline);
            if w.is_err() {
                // Whatever the error, the copies' fate is unknown.
                for c in *copies {
                    c.abandon();
                }
                if matches!(w, Err(Error::Timeout { .. })) {
                    stream.device.hung.set(true);
                }
            }
            w
        })
        .collect();
    work.iter()
        .zip(queued)
        .zip(waited)
        .map(|(((_, copies), q), w)| {
            let (events, failed) = match q {
                Ok(e) => (Some(e), None),
                Err((e, events)) => (events, Some(e)),
            };
            if let Err(e) = w {
                // The stream may still reach its events.
                if let Some(events) = events {
                    events.leak();
                }
                return Err(e);
            }
            match (events, failed) {
                (_, Some(e)) => Err(e),
                (Some(events), None) => (0..copies.len()).map(|i| events.between(i)).collect(),
                (None, None) => Ok(Vec::new()),
            }
        })
        .collect()
}

impl<'s> Stream<'s> {
    /// Checks and queues the copies between events. `Err` with the events
    /// of what was queued before a call failed (to be waited for).
    #[allow(clippy::type_complexity)]
    fn queue_timed(
        &'s self,
        copies: &[Copy<'_>],
        gate: &Gate,
    ) -> Result<Events<'s>, (Error, Option<Events<'s>>)> {
        let device = self.device_ordinal();
        for c in copies {
            c.check(device).map_err(|e| (e, None))?;
        }
        self.device.make_current().map_err(|e| (e, None))?;
        gate.hold(self).map_err(|e| (e, None))?;
        let mut events = Events {
            stream: self,
            raw: Vec::with_capacity(copies.len() + 1),
        };
        if let Err(e) = events.record() {
            return Err((e, Some(events)));
        }
        for c in copies {
            if let Err(e) = c.queue(self).and_then(|()| events.record()) {
                return Err((e, Some(events)));
            }
        }
        Ok(events)
    }

    /// Polls the stream, sleeping between polls: a copy takes
    /// milliseconds, and the events hold its time whenever it is read.
    fn wait_for_copies(&self, deadline: Instant) -> Result<(), Error> {
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: a live stream handle.
            let rc = unsafe { (self.device.cuda.fns.stream_query)(self.raw) };
            if rc != CUDA_ERROR_NOT_READY {
                return self.device.cuda.check("cuStreamQuery", rc);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!("copies on device {}", self.device_ordinal()),
                });
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

/// What holds streams until the host has queued all their work (see
/// [`timed_together`]): a host function at the head of each stream that
/// waits for [`Gate::open`], as nvbandwidth holds its streams behind a
/// spinning kernel, with no kernel of our own. It opens when dropped, and
/// by itself at its deadline, so no stream is held past either.
struct Gate {
    state: Arc<GateState>,
}

struct GateState {
    open: Mutex<bool>,
    opened: Condvar,
    until: Instant,
}

impl Gate {
    fn new(until: Instant) -> Gate {
        Gate {
            state: Arc::new(GateState {
                open: Mutex::new(false),
                opened: Condvar::new(),
                until,
            }),
        }
    }

    /// Holds `stream` (its context current) at the gate. A driver older
    /// than CUDA 10 has no host functions: its streams run as queued.
    fn hold(&self, stream: &Stream<'_>) -> Result<(), Error> {
        let cuda = &stream.device.cuda;
        let Some(launch) = cuda.fns.launch_host_func else {
            return Ok(());
        };
        // One strong count for the call, taken back by it.
        let data = Arc::into_raw(Arc::clone(&self.state))
            .cast_mut()
            .cast::<c_void>();
        // SAFETY: a live stream of the current context; `wait_at_gate`
        // matches CUhostFn and owns `data` when the driver calls it, which
        // it does once for each launch that succeeds.
        let rc = unsafe { launch(stream.raw, wait_at_gate, data) };
        let launched = cuda.check("cuLaunchHostFunc", rc);
        if launched.is_err() {
            // SAFETY: the launch failed, so the driver never calls
            // `wait_at_gate` with `data`: its count is still ours.
            drop(unsafe { Arc::from_raw(data.cast::<GateState>().cast_const()) });
        }
        launched
    }

    fn open(&self) {
        *self
            .state
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        self.state.opened.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// The host function a held stream runs: it returns when the gate opens
/// or its deadline passes. Nothing here can panic (a poisoned lock is
/// still read), so nothing unwinds into the driver.
unsafe extern "C" fn wait_at_gate(data: *mut c_void) {
    // SAFETY: `data` is the strong count `Gate::hold` gave this call.
    let state = unsafe { Arc::from_raw(data.cast::<GateState>().cast_const()) };
    let mut open = state.open.lock().unwrap_or_else(PoisonError::into_inner);
    while !*open {
        let now = Instant::now();
        if now >= state.until {
            break;
        }
        open = state
            .opened
            .wait_timeout(open, state.until - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}
