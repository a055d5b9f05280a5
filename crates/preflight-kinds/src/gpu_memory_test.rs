//! `gpu_memory_test`: patterns written over nine-tenths of every NVIDIA
//! GPU's free memory by kernels of our own and checked where they lie. A
//! cell that fails under a pattern ECC does not flag (a bit stuck at one
//! value, a word that takes its neighbour's write, an address line that
//! sends writes to the wrong word) corrupts a job's weights with no error
//! anywhere; the finding names each bad address range and its GPU by
//! index, bus id and serial, with what was written and what was read.
//!
//! The kernels are PTX text in nccl-sys (`Kernels`), compiled by the
//! driver: a fill kernel writes a pattern, a verify kernel counts the
//! words that differ and keeps the first of them in a small record, the
//! only thing the host reads. On an H200 they test 95 % of its memory at
//! about 3 TB/s; the copies through the host they replace managed 0.35
//! GB/s. The budget is the node's, never more than the run has left.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl_sys::{Cuda, Device, DeviceBuffer, Found, Kernels, Pattern};
use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use preflight_facts::Facts;
use preflight_facts::cuda::{self, GpuName};
use preflight_ground::values::{Bytes, Span, format_bytes, format_duration};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "gpu_memory_test",
    scope: crate::Scope::Node,
    area: "accelerators",
    summary: "Patterns (walking ones and zeros, seeded random, each word's own address, moving inversions) written and checked by GPU kernels over nine-tenths of every NVIDIA GPU's free memory, all GPUs at once, within a time budget the run's deadline caps; each bad address range named with its GPU's index, bus id and serial.",
    params: &[
        ParamDoc {
            name: "fraction",
            ty: "number",
            default: Some("0.9"),
            doc: "The share of each GPU's free memory tested (above 0, at most 0.95: the driver keeps some for itself).",
        },
        ParamDoc {
            name: "patterns",
            ty: "list of walking_ones|random|address|inversions",
            default: Some("[walking_ones, random, address, inversions]"),
            doc: "walking_ones: each 32-bit word one bit set, moving by one word to the next, then the same inverted (walking zeros); random: seeded pseudo-random words; address: each word its own device address (a write that lands on the wrong word shows); inversions: a random pattern checked and inverted chunk by chunk upward, then the inverse checked and restored downward (moving inversions).",
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
            default: Some("1GiB"),
            doc: "The span of one kernel launch in moving inversions, which walk the memory chunk by chunk up, then down.",
        },
        ParamDoc {
            name: "budget",
            ty: "duration",
            default: Some("60s"),
            doc: "The most the test takes on the node, and never more than the run has left less a margin to report in: passes that would not end in time are left out, and the result, a warning, says how far it got.",
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
    Address,
    Inversions,
}

fn fraction_default() -> f64 {
    0.9
}
fn all_patterns() -> Vec<PatternName> {
    vec![
        PatternName::WalkingOnes,
        PatternName::Random,
        PatternName::Address,
        PatternName::Inversions,
    ]
}
fn one() -> u64 {
    1
}
fn chunk_default() -> Bytes {
    Bytes(1 << 30)
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
        if !(self.fraction > 0.0 && self.fraction <= 0.95) {
            return Err("`fraction` must be above 0 and at most 0.95".into());
        }
        if self.patterns.is_empty() {
            return Err("`patterns` needs at least one pattern".into());
        }
        if self.chunk.0 < 4096 || self.chunk.0 > 1 << 40 || !self.chunk.0.is_multiple_of(4) {
            return Err("`chunk` must be 4KiB to 1TiB, a multiple of 4 bytes".into());
        }
        if self.budget.0.is_zero() {
            return Err("`budget` must be above 0".into());
        }
        Ok(())
    }
}

/// A pass's kernels may take this long, plus a second per 10 GB, before
/// the GPU is said to hang: every GPU's memory is a hundred times faster.
const STEP_DEADLINE: Duration = Duration::from_secs(5);
const SLOWEST_GBPS: f64 = 10.0;
/// Kept of the run's time to report in.
const REPORT_MARGIN: Duration = Duration::from_secs(3);
/// Bad words kept per verify (the record's slots), and per GPU.
const SLOTS: u32 = 64;
const MOST_BAD_WORDS: usize = 4096;
/// Ranges listed per GPU.
const MOST_RANGES: usize = 8;

/// One bad word: its device address, what was written, what came back.
#[derive(Debug, Clone, Copy)]
struct BadWord {
    address: u64,
    wrote: u32,
    read: u32,
    pattern: &'static str,
}

/// One pass: the words written over the whole tested memory, and how
/// they are checked.
#[derive(Debug, Clone, Copy)]
enum Pass {
    /// Fill, then verify.
    Plain(Pattern),
    /// Fill a random pattern; upward chunk by chunk, check it and write
    /// its inverse; downward, check the inverse and write it back; check.
    MovingInversions(Pattern),
}

impl Pass {
    /// How many times the pass moves the tested memory's bytes: a fill
    /// and a verify; moving inversions add a read and a write each way.
    fn traffic(self) -> u64 {
        match self {
            Pass::Plain(_) => 2,
            Pass::MovingInversions(_) => 6,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Pass::Plain(p) => p.name(),
            Pass::MovingInversions(_) => "moving inversions",
        }
    }
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

/// One GPU's memory under test.
struct Tested<'d> {
    name: GpuName,
    stream: nccl_sys::Stream<'d>,
    kernels: Kernels<'d>,
    found: Found<'d>,
    memory: DeviceBuffer<'d, u32>,
    /// Each bad word once, by address (at most MOST_BAD_WORDS).
    bad: BTreeMap<u64, BadWord>,
    /// More bad words than were kept.
    overflow: bool,
    /// Its free memory before the test, bytes.
    free: u64,
}

impl Tested<'_> {
    fn failed(&self, e: nccl_sys::Error) -> String {
        format!("{}: {e}", self.name)
    }

    /// Runs one pass's kernels and waits for them; the words found wrong
    /// are kept under `pattern`'s name.
    fn pass(&mut self, pass: Pass, chunk: usize) -> Result<(), String> {
        let all = 0..self.memory.len();
        let words = self.memory.len();
        let bytes = 4 * words as u64;
        let allowed =
            STEP_DEADLINE + Duration::from_secs_f64(bytes as f64 / (SLOWEST_GBPS * 1e9) * 3.0);
        let deadline = Instant::now() + allowed;
        let k = &self.kernels;
        let queued = match pass {
            Pass::Plain(p) => k
                .fill(&self.stream, &self.memory, all.clone(), p)
                .and_then(|()| k.verify(&self.stream, &self.memory, all, p, &self.found)),
            Pass::MovingInversions(p) => (|| {
                k.fill(&self.stream, &self.memory, all.clone(), p)?;
                let chunks: Vec<std::ops::Range<usize>> = (0..words)
                    .step_by(chunk.max(1))
                    .map(|at| at..(at + chunk).min(words))
                    .collect();
                for c in &chunks {
                    k.verify_invert(&self.stream, &self.memory, c.clone(), p, &self.found)?;
                }
                for c in chunks.iter().rev() {
                    k.verify_invert(
                        &self.stream,
                        &self.memory,
                        c.clone(),
                        p.inverse(),
                        &self.found,
                    )?;
                }
                k.verify(&self.stream, &self.memory, all, p, &self.found)
            })(),
        };
        queued.map_err(|e| self.failed(e))?;
        match k.wait(&self.stream, deadline) {
            Ok(()) => {}
            Err(nccl_sys::Error::Timeout { .. }) => {
                return Err(format!(
                    "{}: its memory test kernels over {} did not finish within {}: the GPU hangs",
                    self.name,
                    format_bytes(bytes),
                    format_duration(allowed)
                ));
            }
            Err(e) => return Err(self.failed(e)),
        }
        let found = self.found.take().map_err(|e| self.failed(e))?;
        for b in found.kept {
            if self.bad.len() >= MOST_BAD_WORDS && !self.bad.contains_key(&b.address) {
                self.overflow = true;
                continue;
            }
            self.bad.entry(b.address).or_insert(BadWord {
                address: b.address,
                wrote: b.expected,
                read: b.read,
                pattern: pass.name(),
            });
        }
        if found.count > u64::from(SLOTS) {
            self.overflow = true;
        }
        Ok(())
    }
}

impl GpuMemoryTest {
    /// The passes, each over the whole tested memory.
    fn passes(&self) -> Vec<Pass> {
        let mut out = Vec::new();
        for p in &self.patterns {
            match p {
                PatternName::WalkingOnes => {
                    out.push(Pass::Plain(Pattern::WalkingOnes));
                    out.push(Pass::Plain(Pattern::WalkingZeros));
                }
                PatternName::Random => out.push(Pass::Plain(Pattern::Random(self.seed))),
                PatternName::Address => out.push(Pass::Plain(Pattern::Address)),
                PatternName::Inversions => out.push(Pass::MovingInversions(Pattern::Random(
                    self.seed.wrapping_add(0x1_0000),
                ))),
            }
        }
        out
    }

    fn check(&self, facts: &Facts, serials: &BTreeMap<String, String>) -> Finding {
        match cuda::open(facts, "no GPU memory to test") {
            Ok((cuda, count)) => {
                // Nothing measures copy rates while the memory is under test.
                let _engines = cuda::copy_engines();
                let budget = match facts.time_left(REPORT_MARGIN) {
                    Some(left) if left < self.budget.0 => left,
                    _ => self.budget.0,
                };
                self.test(&cuda, count, serials, budget)
            }
            Err(no) => super::no_driver(no),
        }
    }

    /// Every GPU at once, each on its own thread (a CUDA context is
    /// current per thread): the budget is the node's, not each GPU's.
    fn test(
        &self,
        cuda: &Cuda,
        count: usize,
        serials: &BTreeMap<String, String>,
        budget: Duration,
    ) -> Finding {
        let end = Instant::now() + budget;
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
        self.judge(&outcomes, passes.len(), budget)
    }

    /// One GPU's test, from its buffers to its last pass. A pass starts
    /// only where the one before it says it will end within the budget.
    fn one_gpu(
        &self,
        cuda: &Cuda,
        index: usize,
        serials: &BTreeMap<String, String>,
        passes: &[Pass],
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
        out.tested = 4 * tested.memory.len() as u64;
        out.free = tested.free;
        let chunk = (self.chunk.0 / 4) as usize;
        let mut longest = Duration::ZERO;
        for pass in passes {
            let now = Instant::now();
            if now + longest > end {
                out.stopped_by_budget = true;
                break;
            }
            match tested.pass(*pass, chunk) {
                Ok(()) => {
                    out.passes += 1;
                    out.moved += pass.traffic() * out.tested;
                }
                Err(m) => {
                    out.failure = Some(m);
                    break;
                }
            }
            // Moving inversions move twice a plain pass's bytes and more.
            longest = longest.max(now.elapsed() * 3);
            out.took += now.elapsed();
        }
        out.bad = std::mem::take(&mut tested.bad);
        out.overflow = tested.overflow;
        out
    }

    /// The GPU's tested memory (`fraction` of what is free, a little less
    /// where another process takes some meanwhile), its stream, kernels
    /// and record.
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
        let fail = |what: &str, e: nccl_sys::Error| format!("{name}: {what}: {e}");
        let stream = d.stream().map_err(|e| fail("stream", e))?;
        let kernels = Kernels::load(d).map_err(|e| fail("the memory test's kernels", e))?;
        let found = Found::new(d, SLOTS).map_err(|e| fail("the kernels' record", e))?;
        let mut words = (free as f64 * self.fraction) as usize / 4;
        let mut tries = 0;
        let memory = loop {
            if words == 0 {
                return Err(format!(
                    "{name}: {} free, too little to test",
                    format_bytes(free as u64)
                ));
            }
            match d.alloc::<u32>(words) {
                Ok(m) => break m,
                Err(_) if tries < 3 => {
                    tries += 1;
                    words = words / 20 * 19;
                }
                Err(e) => return Err(fail("memory", e)),
            }
        };
        Ok(Tested {
            stream,
            kernels,
            found,
            memory,
            bad: BTreeMap::new(),
            overflow: false,
            name,
            free: free as u64,
        })
    }

    fn judge(&self, outcomes: &[Outcome], of: usize, budget: Duration) -> Finding {
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
                    preflight_ground::values::count(o.bad.len(), "bad word"),
                    if o.overflow { " or more" } else { "" },
                    preflight_ground::values::count(found.len(), "range"),
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
        // The share of its free memory each GPU had under test, the least.
        let share = outcomes
            .iter()
            .filter(|o| o.free > 0)
            .map(|o| o.tested as f64 / o.free as f64)
            .fold(f64::INFINITY, f64::min);
        let share = if share.is_finite() {
            format!(" ({:.0} % of free)", share * 100.0)
        } else {
            String::new()
        };
        let took = outcomes.iter().map(|o| o.took).max().unwrap_or_default();
        let moved: f64 = outcomes.iter().map(|o| o.moved as f64).sum();
        let rate = if took.as_secs_f64() > 0.0 {
            format!(
                ", {:.0} GB/s written and read",
                moved / took.as_secs_f64() / 1e9
            )
        } else {
            String::new()
        };
        let measured = format!(
            "{} over {} on {} ({} of {} passes in {}{rate})",
            preflight_ground::values::count(bad_ranges, "bad range"),
            format_bytes(tested),
            preflight_ground::values::count(outcomes.len(), "GPU"),
            done,
            of,
            format_duration(took)
        );
        let finding = if !problems.is_empty() {
            super::problems_finding(&problems)
        } else if outcomes.iter().any(|o| o.stopped_by_budget) {
            Finding::warn(format!(
                "no bad address in the {done} of {of} passes that fit in {} over {} per GPU{share}: {}",
                format_duration(budget),
                format_bytes(per_gpu),
                if budget < self.budget.0 {
                    "the run's deadline left no more; give the run a longer --timeout"
                } else {
                    "raise `budget` or lower `fraction` for all of them"
                }
            ))
        } else {
            Finding::pass(format!(
                "no bad address: {} passes over {} per GPU{share} on {} in {}",
                of,
                format_bytes(per_gpu),
                preflight_ground::values::count(outcomes.len(), "GPU"),
                format_duration(took)
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
    /// Why its test stopped short: a kernel that hung, a driver error.
    failure: Option<String>,
    stopped_by_budget: bool,
    /// Its free memory before the test, bytes.
    free: u64,
    /// The passes' time.
    took: Duration,
    /// Bytes the passes wrote and read.
    moved: u64,
}

impl Probe for GpuMemoryTest {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            // Serials from NVML or the recording, by bus id; a GPU without
            // one is still named by index and bus id.
            let report = facts.gpu_report(self.nvidia_smi_xml.as_deref()).await;
            // A job's processes on the GPUs: nine-tenths of their memory
            // is not ours to take. The test runs on an idle node.
            if facts.is_live()
                && let Some(Ok(r)) = &report
            {
                let busy = super::busy_gpus(r);
                if !busy.is_empty() {
                    return Finding::skip(format!(
                        "GPUs in use by running processes ({}): their memory is the job's, not the test's; it runs on an idle node",
                        busy.join(", ")
                    ));
                }
            }
            let serials: BTreeMap<String, String> = match report {
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
        // The budget, a pass's kernels over the largest GPU's memory (141
        // GB at the slowest rate a GPU is allowed), and the buffers.
        Some(self.budget.0 + STEP_DEADLINE + Duration::from_secs(60))
    }
}
