//! `gpu_memory_test`: patterns written over a fraction of every NVIDIA
//! GPU's free memory, moved device to device, read back and compared. A
//! cell that fails under a pattern ECC does not flag (a bit stuck at one
//! value, a word that takes its neighbour's write) corrupts a job's
//! weights with no error anywhere; the finding names each bad address
//! range and its GPU by index, bus id and serial.
//!
//! No kernel of our own: the GPU's copy engines write and move the
//! patterns, the host generates and compares them. A read-back that
//! differs is read again straight from the tested memory, so that a fault
//! of the staging buffer is not laid at the tested range's door.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl_sys::{Copy, Cuda, Device, DeviceBuffer, PinnedBuffer};
use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use crate::facts::Facts;
use crate::facts::cuda::{self, GpuName};
use crate::result::Finding;
use crate::values::{Bytes, Span, format_bytes, format_duration};

pub const KIND: KindInfo = KindInfo {
    name: "gpu_memory_test",
    scope: crate::kinds::Scope::Node,
    area: "accelerators",
    summary: "Patterns (walking ones and zeros, seeded random, moving inversions) written over a fraction of every NVIDIA GPU's free memory, moved device to device, read back and compared within a time budget; each bad address range named with its GPU's index, bus id and serial.",
    params: &[
        ParamDoc {
            name: "fraction",
            ty: "number",
            default: Some("0.05"),
            doc: "The share of each GPU's free memory tested (above 0, at most 0.9: the copies need a staging chunk beside it).",
        },
        ParamDoc {
            name: "patterns",
            ty: "list of walking_ones|random|inversions",
            default: Some("[walking_ones, random, inversions]"),
            doc: "walking_ones: each 32-bit word one bit set, moving by one word to the next, then the same inverted (walking zeros); random: seeded pseudo-random words; inversions: a random pattern read back and inverted chunk by chunk upward, then the inverse read back and restored downward (moving inversions).",
        },
        ParamDoc {
            name: "seed",
            ty: "integer",
            default: Some("1"),
            doc: "The random patterns' seed: the same seed writes the same words, so a finding can be reproduced.",
        },
        ParamDoc {
            name: "chunk",
            ty: "size",
            default: Some("64MiB"),
            doc: "Bytes moved per copy (and held in pinned host memory per GPU).",
        },
        ParamDoc {
            name: "budget",
            ty: "duration",
            default: Some("60s"),
            doc: "The most the test takes on the node: passes not begun by then are left out, and the result says how far it got.",
        },
        ParamDoc {
            name: "nvidia_smi_xml",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `nvidia-smi -q -x` for the GPUs' serials (relative to the working directory). Unset: NVML on the real machine.",
        },
    ],
    hint_vars: &["gpus"],
    parse: parse_params::<GpuMemoryTest>,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PatternName {
    WalkingOnes,
    Random,
    Inversions,
}

fn fraction_default() -> f64 {
    0.05
}
fn all_patterns() -> Vec<PatternName> {
    vec![
        PatternName::WalkingOnes,
        PatternName::Random,
        PatternName::Inversions,
    ]
}
fn one() -> u64 {
    1
}
fn chunk_default() -> Bytes {
    Bytes(64 << 20)
}
fn budget_default() -> Span {
    Span(Duration::from_secs(60))
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GpuMemoryTest {
    #[serde(default = "fraction_default")]
    fraction: f64,
    #[serde(default = "all_patterns")]
    patterns: Vec<PatternName>,
    #[serde(default = "one")]
    seed: u64,
    #[serde(default = "chunk_default")]
    chunk: Bytes,
    #[serde(default = "budget_default")]
    budget: Span,
    #[serde(default)]
    nvidia_smi_xml: Option<PathBuf>,
}

impl Params for GpuMemoryTest {
    fn validate(&self) -> Result<(), String> {
        if !(self.fraction > 0.0 && self.fraction <= 0.9) {
            return Err("`fraction` must be above 0 and at most 0.9".into());
        }
        if self.patterns.is_empty() {
            return Err("`patterns` needs at least one pattern".into());
        }
        if self.chunk.0 < 4096 || self.chunk.0 > 1 << 30 || !self.chunk.0.is_multiple_of(4) {
            return Err("`chunk` must be 4KiB to 1GiB, a multiple of 4 bytes".into());
        }
        if self.budget.0.is_zero() {
            return Err("`budget` must be above 0".into());
        }
        Ok(())
    }
}

/// How long one step's copies may take before the GPU is said to hang.
const STEP_DEADLINE: Duration = Duration::from_secs(5);
/// Bad words kept per GPU; the ranges say the rest.
const MOST_BAD_WORDS: usize = 4096;
/// Ranges listed per GPU.
const MOST_RANGES: usize = 8;

/// The word a pass expects at word index `i` of the tested memory.
#[derive(Debug, Clone, Copy)]
enum Words {
    WalkingOnes,
    WalkingZeros,
    Random(u64),
    Inverted(u64),
}

impl Words {
    fn name(self) -> &'static str {
        match self {
            Words::WalkingOnes => "walking ones",
            Words::WalkingZeros => "walking zeros",
            Words::Random(_) => "random",
            Words::Inverted(_) => "inverted random",
        }
    }

    fn at(self, i: u64) -> u32 {
        match self {
            Words::WalkingOnes => 1 << (i % 32),
            Words::WalkingZeros => !(1u32 << (i % 32)),
            Words::Random(seed) => random_word(seed, i),
            Words::Inverted(seed) => !random_word(seed, i),
        }
    }

    fn fill(self, first_word: u64, out: &mut [u8]) {
        for (k, w) in out.chunks_exact_mut(4).enumerate() {
            w.copy_from_slice(&self.at(first_word + k as u64).to_le_bytes());
        }
    }
}

/// splitmix64 of the seed and the word's index: any word computed alone,
/// so a chunk is generated and checked wherever it lies.
fn random_word(seed: u64, i: u64) -> u32 {
    let mut z = seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(i.wrapping_add(1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u32
}

/// One bad word: its device address, what was written, what came back.
#[derive(Debug, Clone, Copy)]
struct BadWord {
    address: u64,
    wrote: u32,
    read: u32,
    pattern: &'static str,
}

/// One GPU's memory under test.
struct Tested<'d> {
    name: GpuName,
    stream: nccl_sys::Stream<'d>,
    memory: DeviceBuffer<'d, u8>,
    staging: DeviceBuffer<'d, u8>,
    host: PinnedBuffer<'d>,
    chunk: usize,
    /// Each bad word once, by address (at most MOST_BAD_WORDS).
    bad: BTreeMap<u64, BadWord>,
    /// More bad words than were kept.
    overflow: bool,
}

/// Why a GPU's test stopped short.
enum Stop {
    Budget,
    Failed(String),
}

impl Tested<'_> {
    fn chunks(&self) -> usize {
        self.memory.len().div_ceil(self.chunk)
    }

    fn span(&self, k: usize) -> (usize, usize) {
        let at = k * self.chunk;
        (at, self.chunk.min(self.memory.len() - at))
    }

    fn run(&self, copies: &[Copy<'_>]) -> Result<(), Stop> {
        self.stream
            .timed(copies, Instant::now() + STEP_DEADLINE)
            .map(drop)
            .map_err(|e| match e {
                nccl_sys::Error::Timeout { .. } => Stop::Failed(format!(
                    "{}: its copies did not finish within {}: the GPU or its link hangs",
                    self.name,
                    format_duration(STEP_DEADLINE)
                )),
                e => Stop::Failed(format!("{}: {e}", self.name)),
            })
    }

    fn host_bytes(&mut self) -> Result<&mut [u8], Stop> {
        let name = self.name.to_string();
        self.host
            .bytes_mut()
            .map_err(|e| Stop::Failed(format!("{name}: {e}")))
    }

    fn write(&mut self, k: usize, words: Words) -> Result<(), Stop> {
        let (at, len) = self.span(k);
        words.fill((at / 4) as u64, &mut self.host_bytes()?[..len]);
        self.run(&[Copy::ToDevice {
            from: &self.host,
            from_at: 0,
            to: &self.memory,
            to_at: at,
            len,
        }])
    }

    /// Moves chunk `k` to the staging buffer and reads it back; where it
    /// differs, reads the chunk itself again to say where the fault is.
    fn verify(&mut self, k: usize, words: Words) -> Result<(), Stop> {
        let (at, len) = self.span(k);
        self.run(&[
            Copy::OnDevice {
                from: &self.memory,
                from_at: at,
                to: &self.staging,
                to_at: 0,
                len,
            },
            Copy::ToHost {
                from: &self.staging,
                from_at: 0,
                to: &self.host,
                to_at: 0,
                len,
            },
        ])?;
        let moved = differing(&self.host_bytes()?[..len], (at / 4) as u64, words);
        if moved.is_empty() {
            return Ok(());
        }
        self.run(&[Copy::ToHost {
            from: &self.memory,
            from_at: at,
            to: &self.host,
            to_at: 0,
            len,
        }])?;
        let direct = differing(&self.host_bytes()?[..len], (at / 4) as u64, words);
        // Wrong when read straight back: the tested memory's fault. Right
        // then, wrong only after the move: the staging buffer's.
        let (base, found) = if direct.is_empty() {
            (self.staging.address(), moved)
        } else {
            (self.memory.address() + at as u64, direct)
        };
        for (offset, wrote, read) in found {
            let address = base + offset;
            if self.bad.len() >= MOST_BAD_WORDS && !self.bad.contains_key(&address) {
                self.overflow = true;
                continue;
            }
            self.bad.entry(address).or_insert(BadWord {
                address,
                wrote,
                read,
                pattern: words.name(),
            });
        }
        Ok(())
    }
}

/// (byte offset, written, read) of each word of `bytes` that is not what
/// `words` puts at word `first` onwards.
fn differing(bytes: &[u8], first: u64, words: Words) -> Vec<(u64, u32, u32)> {
    bytes
        .chunks_exact(4)
        .enumerate()
        .filter_map(|(k, w)| {
            let read = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            let wrote = words.at(first + k as u64);
            (read != wrote).then_some((4 * k as u64, wrote, read))
        })
        .take(MOST_BAD_WORDS)
        .collect()
}

/// Bad words within 64 bytes of each other make one range.
fn ranges(bad: &BTreeMap<u64, BadWord>) -> Vec<(u64, u64, BadWord)> {
    let mut out: Vec<(u64, u64, BadWord)> = Vec::new();
    for b in bad.values().copied() {
        match out.last_mut() {
            Some((_, end, _)) if b.address <= *end + 64 => *end = (*end).max(b.address + 3),
            _ => out.push((b.address, b.address + 3, b)),
        }
    }
    out
}

impl GpuMemoryTest {
    /// The passes, each writing the whole tested memory and reading it back.
    fn passes(&self) -> Vec<(PatternName, Words)> {
        let mut out = Vec::new();
        for p in &self.patterns {
            match p {
                PatternName::WalkingOnes => {
                    out.push((*p, Words::WalkingOnes));
                    out.push((*p, Words::WalkingZeros));
                }
                PatternName::Random => out.push((*p, Words::Random(self.seed))),
                PatternName::Inversions => {
                    out.push((*p, Words::Random(self.seed.wrapping_add(0x1_0000))))
                }
            }
        }
        out
    }

    fn check(&self, facts: &Facts, serials: &BTreeMap<String, String>) -> Finding {
        match cuda::open(facts, "no GPU memory to test") {
            Ok((cuda, count)) => {
                let _engines = cuda::copy_engines();
                self.test(&cuda, count, serials)
            }
            Err(no) => super::no_driver(no),
        }
    }

    /// Every GPU at once, each on its own thread (a CUDA context is
    /// current per thread): the budget is the node's, not each GPU's.
    fn test(&self, cuda: &Cuda, count: usize, serials: &BTreeMap<String, String>) -> Finding {
        let end = Instant::now() + self.budget.0;
        let passes = self.passes();
        let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..count)
                .map(|i| {
                    let passes = &passes;
                    scope.spawn(move || self.one_gpu(cuda, i, serials, passes, end))
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    h.join().unwrap_or_else(|_| Outcome {
                        name: GpuName::new(i, "unknown"),
                        failure: Some(format!("GPU {i}: its test crashed")),
                        ..Outcome::default()
                    })
                })
                .collect()
        });
        self.judge(&outcomes, passes.len())
    }

    /// One GPU's test, from its buffers to its last pass.
    fn one_gpu(
        &self,
        cuda: &Cuda,
        index: usize,
        serials: &BTreeMap<String, String>,
        passes: &[(PatternName, Words)],
        end: Instant,
    ) -> Outcome {
        let mut out = Outcome {
            name: GpuName::new(index, "unknown"),
            ..Outcome::default()
        };
        let device = match cuda.device(index) {
            Ok(d) => d,
            Err(e) => {
                out.failure = Some(format!("GPU {index}: {e}"));
                return out;
            }
        };
        let mut tested = match self.buffers(&device, serials) {
            Ok(t) => t,
            Err(e) => {
                out.failure = Some(e);
                return out;
            }
        };
        out.name = tested.name.clone();
        for (pattern, words) in passes {
            match self.pass(&mut tested, *pattern, *words, end) {
                Ok(()) => out.passes += 1,
                Err(Stop::Budget) => {
                    out.stopped_by_budget = true;
                    break;
                }
                Err(Stop::Failed(m)) => {
                    out.failure = Some(m);
                    break;
                }
            }
        }
        out.tested = tested.memory.len() as u64;
        out.bad = std::mem::take(&mut tested.bad);
        out.overflow = tested.overflow;
        out
    }

    /// The GPU's tested memory, staging chunk and pinned chunk.
    fn buffers<'d>(
        &self,
        d: &'d Device<'d>,
        serials: &BTreeMap<String, String>,
    ) -> Result<Tested<'d>, String> {
        let bus = d
            .pci_bus_id()
            .map_err(|e| format!("GPU {}: {e}", d.ordinal()))?;
        let mut name = GpuName::new(d.ordinal(), &bus);
        name.serial = serials.get(&name.bus_id).cloned();
        let (free, _) = d.mem_info().map_err(|e| format!("{name}: {e}"))?;
        let chunk = self.chunk.0 as usize;
        let size = ((free as f64 * self.fraction) as usize / 4 * 4).min(free - chunk.min(free));
        if size < 4 {
            return Err(format!(
                "{name}: {} free, too little to test",
                format_bytes(free as u64)
            ));
        }
        let chunk = chunk.min(size);
        let alloc = |what: &str, e: nccl_sys::Error| format!("{name}: {what}: {e}");
        Ok(Tested {
            stream: d.stream().map_err(|e| alloc("stream", e))?,
            memory: d.alloc::<u8>(size).map_err(|e| alloc("memory", e))?,
            staging: d.alloc::<u8>(chunk).map_err(|e| alloc("staging", e))?,
            host: d.pinned(chunk).map_err(|e| alloc("pinned memory", e))?,
            chunk,
            bad: BTreeMap::new(),
            overflow: false,
            name,
        })
    }

    /// One pass over one GPU's tested memory.
    fn pass(
        &self,
        g: &mut Tested<'_>,
        pattern: PatternName,
        words: Words,
        end: Instant,
    ) -> Result<(), Stop> {
        let budget = |()| {
            if Instant::now() > end {
                Err(Stop::Budget)
            } else {
                Ok(())
            }
        };
        for k in 0..g.chunks() {
            budget(())?;
            g.write(k, words)?;
        }
        if pattern != PatternName::Inversions {
            for k in 0..g.chunks() {
                budget(())?;
                g.verify(k, words)?;
            }
            return Ok(());
        }
        let Words::Random(seed) = words else {
            return Ok(());
        };
        // Moving inversions: upward, check and invert each chunk; then
        // downward, check the inverse and restore.
        for k in 0..g.chunks() {
            budget(())?;
            g.verify(k, words)?;
            g.write(k, Words::Inverted(seed))?;
        }
        for k in (0..g.chunks()).rev() {
            budget(())?;
            g.verify(k, Words::Inverted(seed))?;
            g.write(k, words)?;
        }
        Ok(())
    }

    fn judge(&self, outcomes: &[Outcome], of: usize) -> Finding {
        let mut problems = Vec::new();
        let mut blamed = Vec::new();
        let mut bad_ranges = 0;
        for o in outcomes {
            if let Some(m) = &o.failure {
                problems.push(m.clone());
            }
            if !o.bad.is_empty() {
                let found = ranges(&o.bad);
                bad_ranges += found.len();
                let listed: Vec<String> = found
                    .iter()
                    .take(MOST_RANGES)
                    .map(|(from, to, b)| {
                        format!(
                            "{from:#x}-{to:#x} (wrote {:#010x}, read {:#010x}, {})",
                            b.wrote, b.read, b.pattern
                        )
                    })
                    .collect();
                let more = found.len().saturating_sub(MOST_RANGES);
                problems.push(format!(
                    "{}: {}{} in {}: {}{}",
                    o.name,
                    crate::values::count(o.bad.len(), "bad word"),
                    if o.overflow { " or more" } else { "" },
                    crate::values::count(found.len(), "range"),
                    listed.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                ));
            }
            if o.failure.is_some() || !o.bad.is_empty() {
                blamed.push(o.name.to_string());
            }
        }
        let done = outcomes.iter().map(|o| o.passes).min().unwrap_or(0);
        let tested: u64 = outcomes
            .iter()
            .filter(|o| o.passes > 0)
            .map(|o| o.tested)
            .sum();
        let per_gpu = outcomes.iter().map(|o| o.tested).max().unwrap_or(0);
        let measured = format!(
            "{} over {} on {} ({} of {} passes)",
            crate::values::count(bad_ranges, "bad range"),
            format_bytes(tested),
            crate::values::count(outcomes.len(), "GPU"),
            done,
            of
        );
        let finding = if !problems.is_empty() {
            super::problems_finding(&problems)
        } else if outcomes.iter().any(|o| o.stopped_by_budget) {
            Finding::warn(format!(
                "no bad address in the {done} of {of} passes the {} budget allowed over {} per GPU: raise `budget` or lower `fraction` for all of them",
                format_duration(self.budget.0),
                format_bytes(per_gpu)
            ))
        } else {
            Finding::pass(format!(
                "no bad address: {} passes over {} per GPU on {}",
                of,
                format_bytes(per_gpu),
                crate::values::count(outcomes.len(), "GPU")
            ))
        };
        finding
            .measured(measured)
            .expected("0 bad ranges".to_string())
            .var(
                "gpus",
                if blamed.is_empty() {
                    "none".to_string()
                } else {
                    blamed.join(", ")
                },
            )
    }
}

/// What one GPU's test came to.
#[derive(Default)]
struct Outcome {
    name: GpuName,
    /// Bytes under test.
    tested: u64,
    /// Passes completed.
    passes: usize,
    bad: BTreeMap<u64, BadWord>,
    overflow: bool,
    /// Why its test stopped short: a copy that hung, a driver error.
    failure: Option<String>,
    stopped_by_budget: bool,
}

impl Probe for GpuMemoryTest {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            // Serials from NVML or the recording, by bus id; a GPU without
            // one is still named by index and bus id.
            let serials: BTreeMap<String, String> =
                match facts.gpu_report(self.nvidia_smi_xml.as_deref()).await {
                    Some(Ok(r)) => r
                        .gpus
                        .into_iter()
                        .filter_map(|g| Some((g.bus_id, g.serial?)))
                        .collect(),
                    _ => BTreeMap::new(),
                };
            tokio::task::spawn_blocking(move || self.check(&facts, &serials))
                .await
                .unwrap_or_else(|e| Finding::error(format!("probe crashed: {e}")))
        })
    }

    fn default_timeout(&self) -> Option<Duration> {
        // The budget, a pass's last step and the buffers.
        Some(self.budget.0 + STEP_DEADLINE * 3 + Duration::from_secs(10))
    }
}
