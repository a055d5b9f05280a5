//! The GPU memory test's pattern kernels: PTX text shipped in this crate
//! (`patterns.ptx`), compiled by the driver for the GPU it finds
//! (cuModuleLoadData), looked up by name (cuModuleGetFunction) and
//! launched on a stream (cuLaunchKernel). A node needs no nvcc and no CUDA
//! runtime, only the driver it already has.
//!
//! The launches are safe whatever the caller passes: the kernels are this
//! crate's own text, every range is checked against its buffer before a
//! launch, the record of bad words is a buffer this crate sized for the
//! slots it passes, and every buffer, stream and record must be of the
//! module's device. A launch is asynchronous: the buffers it uses are freed
//! only after their device's work has finished (see [`DeviceBuffer`]), and
//! work that misses its deadline ([`Kernels::wait`]) marks the device hung,
//! which leaves them allocated for ever rather than freed under a kernel.

use std::ffi::{c_uint, c_void};
use std::fmt;
use std::ops::Range;
use std::time::Instant;

use crate::Error;
use crate::cuda::{CuDevPtr, Device, DeviceBuffer, Stream};

/// The kernels' text, NUL-terminated as cuModuleLoadData wants it.
pub const PTX: &str = concat!(include_str!("patterns.ptx"), "\0");

/// The kernels this crate launches, each with its parameters in order
/// (name, PTX type), as `patterns.ptx` declares them: the tests hold the
/// text to this list, and the launches below to the same list.
pub const KERNELS: &[(&str, &[(&str, &str)])] = &[
    (
        FILL,
        &[
            ("buffer", "u64"),
            ("words", "u64"),
            ("first", "u64"),
            ("kind", "u32"),
            ("seed", "u64"),
        ],
    ),
    (VERIFY, VERIFY_PARAMS),
    (VERIFY_INVERT, VERIFY_PARAMS),
];

const FILL: &str = "preflight_fill";
const VERIFY: &str = "preflight_verify";
const VERIFY_INVERT: &str = "preflight_verify_invert";
const VERIFY_PARAMS: &[(&str, &str)] = &[
    ("buffer", "u64"),
    ("words", "u64"),
    ("first", "u64"),
    ("kind", "u32"),
    ("seed", "u64"),
    ("found", "u64"),
    ("slots", "u32"),
];

/// Threads per block, and the most blocks a launch asks for: the kernels
/// stride over the rest.
const BLOCK: c_uint = 256;
const MOST_BLOCKS: usize = 1 << 16;
/// The record's header (the count) and each kept word, bytes.
const HEADER: usize = 16;
const SLOT: usize = 16;

type CuModule = *mut c_void;
type CuFunction = *mut c_void;

/// What a word holds: the kernels' `kind` and `seed`, and the same word
/// computed on the host ([`Pattern::word`]) for whoever checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// 1 << (i % 32).
    WalkingOnes,
    /// !(1 << (i % 32)).
    WalkingZeros,
    /// The low 32 bits of splitmix64 of the seed and the word's index.
    Random(u64),
    /// The inverse of `Random`.
    InvertedRandom(u64),
    /// The word's own device address, its two halves xor'ed: every word
    /// of a range different, so a write that lands on the wrong address
    /// shows.
    Address,
}

impl Pattern {
    fn kind(self) -> u32 {
        match self {
            Pattern::WalkingOnes => 0,
            Pattern::WalkingZeros => 1,
            Pattern::Random(_) => 2,
            Pattern::InvertedRandom(_) => 3,
            Pattern::Address => 4,
        }
    }

    fn seed(self) -> u64 {
        match self {
            Pattern::Random(s) | Pattern::InvertedRandom(s) => s,
            _ => 0,
        }
    }

    /// What [`Kernels::verify_invert`] leaves where this pattern was.
    pub fn inverse(self) -> Pattern {
        match self {
            Pattern::WalkingOnes => Pattern::WalkingZeros,
            Pattern::WalkingZeros => Pattern::WalkingOnes,
            Pattern::Random(s) => Pattern::InvertedRandom(s),
            Pattern::InvertedRandom(s) => Pattern::Random(s),
            // Not an address pattern any more, but its inverse: verified
            // only by the kernels, which compute it the same way.
            Pattern::Address => Pattern::Address,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pattern::WalkingOnes => "walking ones",
            Pattern::WalkingZeros => "walking zeros",
            Pattern::Random(_) => "random",
            Pattern::InvertedRandom(_) => "inverted random",
            Pattern::Address => "own address",
        }
    }

    /// The word the kernels put at word `index` of the tested memory,
    /// whose device address is `address`.
    pub fn word(self, index: u64, address: u64) -> u32 {
        match self {
            Pattern::WalkingOnes => 1 << (index % 32),
            Pattern::WalkingZeros => !(1u32 << (index % 32)),
            Pattern::Random(seed) => random_word(seed, index),
            Pattern::InvertedRandom(seed) => !random_word(seed, index),
            Pattern::Address => (address as u32) ^ ((address >> 32) as u32),
        }
    }
}

/// splitmix64 of the seed and the word's index, as the kernels compute it.
pub fn random_word(seed: u64, i: u64) -> u32 {
    let mut z = seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(i.wrapping_add(1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u32
}

/// One word a verify found wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadWord {
    pub address: u64,
    pub expected: u32,
    pub read: u32,
}

/// What a record held: how many words differed, and the first of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mismatches {
    pub count: u64,
    pub kept: Vec<BadWord>,
}

/// Where the verify kernels count and keep the words they find wrong: a
/// small device buffer the host reads alone, never the tested memory.
pub struct Found<'d> {
    buffer: DeviceBuffer<'d, u8>,
    slots: u32,
}

impl fmt::Debug for Found<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Found({} slots)", self.slots)
    }
}

impl<'d> Found<'d> {
    /// A record keeping up to `slots` bad words, cleared.
    pub fn new(device: &'d Device<'d>, slots: u32) -> Result<Found<'d>, Error> {
        let mut buffer = device.alloc::<u8>(HEADER + SLOT * slots as usize)?;
        buffer.copy_from_host(&vec![0u8; HEADER + SLOT * slots as usize])?;
        Ok(Found { buffer, slots })
    }

    /// What the kernels recorded since the last read, then cleared: call
    /// once the stream they ran on is done ([`Kernels::wait`]).
    pub fn take(&mut self) -> Result<Mismatches, Error> {
        let mut bytes = vec![0u8; self.buffer.len()];
        self.buffer.copy_to_host(&mut bytes)?;
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        let long = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        let count = long(0);
        let kept = (0..(count.min(u64::from(self.slots)) as usize))
            .map(|k| {
                let at = HEADER + SLOT * k;
                BadWord {
                    address: long(at),
                    expected: word(at + 8),
                    read: word(at + 12),
                }
            })
            .collect();
        if count > 0 {
            bytes.fill(0);
            self.buffer.copy_from_host(&bytes)?;
        }
        Ok(Mismatches { count, kept })
    }
}

/// The pattern kernels, loaded on one device.
pub struct Kernels<'d> {
    device: &'d Device<'d>,
    module: CuModule,
    fill: CuFunction,
    verify: CuFunction,
    verify_invert: CuFunction,
}

impl fmt::Debug for Kernels<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kernels(device {})", self.device.ordinal())
    }
}

impl<'d> Kernels<'d> {
    /// Compiles the kernels for `device` and looks each one up.
    pub fn load(device: &'d Device<'d>) -> Result<Kernels<'d>, Error> {
        let fns = &device.cuda.fns;
        let (Some(load), Some(get)) = (fns.module_load_data, fns.module_get_function) else {
            return Err(Error::MissingSymbol {
                path: device.cuda.path().to_string(),
                symbol: "cuModuleLoadData",
            });
        };
        if fns.launch_kernel.is_none() {
            return Err(Error::MissingSymbol {
                path: device.cuda.path().to_string(),
                symbol: "cuLaunchKernel",
            });
        }
        device.make_current()?;
        let mut module: CuModule = std::ptr::null_mut();
        // SAFETY: `PTX` is NUL-terminated text that outlives the call; a
        // valid out-pointer; a current context.
        let rc = unsafe { load(&mut module, PTX.as_ptr().cast()) };
        device.cuda.check("cuModuleLoadData", rc)?;
        let mut kernels = Kernels {
            device,
            module,
            fill: std::ptr::null_mut(),
            verify: std::ptr::null_mut(),
            verify_invert: std::ptr::null_mut(),
        };
        for (name, slot) in [
            (FILL, &mut kernels.fill as *mut CuFunction),
            (VERIFY, &mut kernels.verify),
            (VERIFY_INVERT, &mut kernels.verify_invert),
        ] {
            let c =
                std::ffi::CString::new(name).map_err(|e| Error::InvalidArgument(e.to_string()))?;
            // SAFETY: a loaded module, a NUL-terminated name, and `slot`
            // points at a field of `kernels`, alive across the call.
            let rc = unsafe { get(slot, module, c.as_ptr()) };
            device.cuda.check("cuModuleGetFunction", rc)?;
        }
        Ok(kernels)
    }

    fn same_device(&self, what: &str, ordinal: usize) -> Result<(), Error> {
        if ordinal != self.device.ordinal() {
            return Err(Error::InvalidArgument(format!(
                "{what} of device {ordinal}, kernels of device {}",
                self.device.ordinal()
            )));
        }
        Ok(())
    }

    /// The range's start address and length, checked against `memory`.
    fn span(
        &self,
        stream: &Stream<'_>,
        memory: &DeviceBuffer<'_, u32>,
        words: &Range<usize>,
    ) -> Result<(CuDevPtr, u64), Error> {
        self.same_device("a stream", stream.device_ordinal())?;
        self.same_device("memory", memory.device_ordinal())?;
        if words.start > words.end || words.end > memory.len() {
            return Err(Error::InvalidArgument(format!(
                "words {}..{} of a {}-word buffer",
                words.start,
                words.end,
                memory.len()
            )));
        }
        Ok((
            memory.address() + 4 * words.start as u64,
            (words.end - words.start) as u64,
        ))
    }

    /// Queues on `stream` the writing of `pattern` over `words` of
    /// `memory` (word `i` of the range is word `words.start + i` of the
    /// pattern).
    pub fn fill(
        &self,
        stream: &Stream<'_>,
        memory: &DeviceBuffer<'_, u32>,
        words: Range<usize>,
        pattern: Pattern,
    ) -> Result<(), Error> {
        let (at, n) = self.span(stream, memory, &words)?;
        let (first, kind, seed) = (words.start as u64, pattern.kind(), pattern.seed());
        let mut args: [*mut c_void; 5] = [
            (&at as *const u64).cast_mut().cast(),
            (&n as *const u64).cast_mut().cast(),
            (&first as *const u64).cast_mut().cast(),
            (&kind as *const u32).cast_mut().cast(),
            (&seed as *const u64).cast_mut().cast(),
        ];
        self.launch(self.fill, stream, n, &mut args)
    }

    /// Queues on `stream` the check of `words` of `memory` against
    /// `pattern`, each word that differs counted in `found` (and the
    /// first of them kept).
    pub fn verify(
        &self,
        stream: &Stream<'_>,
        memory: &DeviceBuffer<'_, u32>,
        words: Range<usize>,
        pattern: Pattern,
        found: &Found<'_>,
    ) -> Result<(), Error> {
        self.checking(self.verify, stream, memory, words, pattern, found)
    }

    /// As [`Kernels::verify`], then each word written with the inverse of
    /// what it should have held: a step of moving inversions.
    pub fn verify_invert(
        &self,
        stream: &Stream<'_>,
        memory: &DeviceBuffer<'_, u32>,
        words: Range<usize>,
        pattern: Pattern,
        found: &Found<'_>,
    ) -> Result<(), Error> {
        self.checking(self.verify_invert, stream, memory, words, pattern, found)
    }

    fn checking(
        &self,
        function: CuFunction,
        stream: &Stream<'_>,
        memory: &DeviceBuffer<'_, u32>,
        words: Range<usize>,
        pattern: Pattern,
        found: &Found<'_>,
    ) -> Result<(), Error> {
        self.same_device("a record", found.buffer.device_ordinal())?;
        let (at, n) = self.span(stream, memory, &words)?;
        let (first, kind, seed) = (words.start as u64, pattern.kind(), pattern.seed());
        let (record, slots) = (found.buffer.address(), found.slots);
        let mut args: [*mut c_void; 7] = [
            (&at as *const u64).cast_mut().cast(),
            (&n as *const u64).cast_mut().cast(),
            (&first as *const u64).cast_mut().cast(),
            (&kind as *const u32).cast_mut().cast(),
            (&seed as *const u64).cast_mut().cast(),
            (&record as *const u64).cast_mut().cast(),
            (&slots as *const u32).cast_mut().cast(),
        ];
        self.launch(function, stream, n, &mut args)
    }

    fn launch(
        &self,
        function: CuFunction,
        stream: &Stream<'_>,
        words: u64,
        args: &mut [*mut c_void],
    ) -> Result<(), Error> {
        if words == 0 {
            return Ok(());
        }
        let Some(launch) = self.device.cuda.fns.launch_kernel else {
            return Err(Error::MissingSymbol {
                path: self.device.cuda.path().to_string(),
                symbol: "cuLaunchKernel",
            });
        };
        let blocks = (words.div_ceil(u64::from(BLOCK)) as usize).min(MOST_BLOCKS) as c_uint;
        self.device.make_current()?;
        // SAFETY: `function` is one of this module's kernels; `args` holds
        // one pointer per parameter the PTX declares for it, in order and
        // of its type (`KERNELS`, held to the text by the tests), each
        // alive across the call, which copies them; the ranges they name
        // were checked against their buffers, of this device; the stream
        // is this device's.
        let rc = unsafe {
            launch(
                function,
                blocks,
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                stream.raw(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.device.cuda.check("cuLaunchKernel", rc)
    }

    /// Waits for `stream`'s kernels until `deadline`; past it the device
    /// is marked hung (its buffers are never freed under a kernel that may
    /// still run).
    pub fn wait(&self, stream: &Stream<'_>, deadline: Instant) -> Result<(), Error> {
        let r = stream.wait(deadline);
        if matches!(r, Err(Error::Timeout { .. })) {
            self.device.hung.set(true);
        }
        r
    }
}

impl Drop for Kernels<'_> {
    fn drop(&mut self) {
        if self.device.is_hung() {
            // A kernel of it may still run.
            return;
        }
        if let Some(unload) = self.device.cuda.fns.module_unload {
            let _ = self.device.make_current();
            let _ = self.device.synchronize();
            // SAFETY: the module loaded in `load`, unloaded once, its
            // kernels done.
            let _ = unsafe { unload(self.module) };
        }
    }
}

/// The kernels' parameters as `ptx` declares them: each `.entry`'s name
/// with its (name, type) list, the name's `NAME_` prefix taken off.
pub fn declared(ptx: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    let mut rest = ptx;
    while let Some(at) = rest.find(".entry ") {
        rest = &rest[at + ".entry ".len()..];
        let Some(open) = rest.find('(') else { break };
        let name = rest[..open].trim().to_string();
        let Some(close) = rest.find(')') else { break };
        let params = rest[open + 1..close]
            .split(',')
            .filter_map(|p| {
                let words: Vec<&str> = p.split_whitespace().collect();
                match words.as_slice() {
                    [".param", ty, pname] => Some((
                        pname
                            .strip_prefix(&format!("{name}_"))
                            .unwrap_or(pname)
                            .to_string(),
                        ty.trim_start_matches('.').to_string(),
                    )),
                    _ => None,
                }
            })
            .collect();
        out.push((name, params));
        rest = &rest[close..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text declares exactly the kernels and parameters this crate
    /// launches, in order and of their types: a renamed or reordered
    /// parameter cannot reach a GPU unseen.
    #[test]
    fn the_ptx_declares_what_the_launches_pass() {
        let found = declared(PTX);
        let want: Vec<(String, Vec<(String, String)>)> = KERNELS
            .iter()
            .map(|(n, ps)| {
                (
                    n.to_string(),
                    ps.iter()
                        .map(|(p, t)| (p.to_string(), t.to_string()))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(found, want);
        assert!(PTX.ends_with("}\n\0"));
        assert!(PTX.contains(".address_size 64"));
    }

    /// The host's words are the kernels' (the stand-in's kernels and the
    /// findings use them): spot values of each pattern.
    #[test]
    fn each_pattern_word_as_the_kernels_compute_it() {
        assert_eq!(Pattern::WalkingOnes.word(33, 0), 2);
        assert_eq!(Pattern::WalkingZeros.word(31, 0), 0x7fff_ffff);
        assert_eq!(
            Pattern::InvertedRandom(7).word(5, 0),
            !Pattern::Random(7).word(5, 0)
        );
        assert_ne!(Pattern::Random(1).word(0, 0), Pattern::Random(2).word(0, 0));
        assert_eq!(
            Pattern::Address.word(0, 0x7f00_1234_5678),
            0x1234_5678 ^ 0x7f00
        );
        assert_eq!(Pattern::Random(3).inverse(), Pattern::InvertedRandom(3));
    }
}
