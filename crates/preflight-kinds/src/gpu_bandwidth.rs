//! `gpu_bandwidth`: every NVIDIA GPU's copy rates, host to device, device
//! to host and device to device, from page-locked memory and timed by the
//! GPU's own events, one GPU at a time and then all at once. A GPU behind
//! a degraded PCIe path, or several behind a starved switch, pass every
//! other check and halve what the job loads and saves.
//!
//! Each figure is judged three ways: against the GPU's own link (the
//! generation and width it is capable of, from sysfs), against the node's
//! other GPUs (the odd one out), and against the node profile's floors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nccl_sys::{Copy, Cuda, Device, DeviceBuffer, PinnedBuffer, Stream, timed_together};
use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params};
use preflight_facts::Facts;
use preflight_facts::cuda::{self, GpuName};
use preflight_facts::pci::{format_speed, link_gbps};
use preflight_ground::values::{Bytes, format_bytes, median};
use preflight_result::Finding;
use preflight_result::gpu_copies::{GpuCopies, GpuCopy};

pub const KIND: KindInfo = KindInfo {
    name: "gpu_bandwidth",
    scope: crate::Scope::Node,
    area: "accelerators",
    summary: "Every NVIDIA GPU's copy bandwidth (host to device, device to host, device to device; pinned memory, timed by the GPU's events, the best of several runs), one GPU at a time and all at once, against its own PCIe link, the node's other GPUs and the node profile's floors (`h2d_gbps`, `d2h_gbps`).",
    params: &[
        ParamDoc {
            name: "sizes",
            ty: "list of sizes",
            default: Some("[1MiB, 16MiB, 256MiB]"),
            doc: "Copy sizes; each direction's figure is the best rate over them and the runs. Each GPU holds two device buffers and one pinned host buffer of the largest.",
        },
        ParamDoc {
            name: "runs",
            ty: "integer",
            default: Some("3"),
            doc: "Copies per size and direction; the best counts.",
        },
        ParamDoc {
            name: "all_at_once",
            ty: "bool",
            default: Some("true"),
            doc: "Also copy on every GPU at once (the largest size), where GPUs behind one PCIe switch share its uplink: a GPU that then falls below peer_fraction of the others' median fails.",
        },
        ParamDoc {
            name: "link_fraction",
            ty: "number",
            default: Some("0.7"),
            doc: "Host-to-device and device-to-host must reach this fraction of the GPU's PCIe link (its maximum generation and width in sysfs, after line encoding).",
        },
        ParamDoc {
            name: "peer_fraction",
            ty: "number",
            default: Some("0.8"),
            doc: "Each figure must reach this fraction of the median of the node's GPUs.",
        },
        ParamDoc {
            name: "deadline",
            ty: "duration",
            default: Some("5s"),
            doc: "How long the copies of one phase may take: a GPU whose copies have not finished by then hangs, and is named.",
        },
    ],
    hint_vars: &["gpus"],
    parse: parse_params::<GpuBandwidth>,
};

fn default_sizes() -> Vec<Bytes> {
    vec![Bytes(1 << 20), Bytes(16 << 20), Bytes(256 << 20)]
}
fn three() -> u32 {
    3
}
fn yes() -> bool {
    true
}
fn link_default() -> f64 {
    0.7
}
fn peer_default() -> f64 {
    0.8
}
fn five_seconds() -> preflight_ground::values::Span {
    preflight_ground::values::Span(Duration::from_secs(5))
}

/// The largest copy a check may ask for: GPUs and pinned host memory are
/// shared with whatever else the node runs.
const MOST: u64 = 4 << 30;

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GpuBandwidth {
    #[serde(default = "default_sizes")]
    sizes: Vec<Bytes>,
    #[serde(default = "three")]
    runs: u32,
    #[serde(default = "yes")]
    all_at_once: bool,
    #[serde(default = "link_default")]
    link_fraction: f64,
    #[serde(default = "peer_default")]
    peer_fraction: f64,
    #[serde(default = "five_seconds")]
    deadline: preflight_ground::values::Span,
}

impl Params for GpuBandwidth {
    fn validate(&self) -> Result<(), String> {
        if self.sizes.is_empty() {
            return Err("`sizes` needs at least one size".into());
        }
        if let Some(b) = self
            .sizes
            .iter()
            .find(|b| b.0 == 0 || b.0 > MOST || !b.0.is_multiple_of(4))
        {
            return Err(format!(
                "`sizes`: {} is not a copy size (a multiple of 4 bytes, up to {})",
                b.0,
                format_bytes(MOST)
            ));
        }
        if !(1..=100).contains(&self.runs) {
            return Err("`runs` must be 1 to 100".into());
        }
        for (name, f) in [
            ("link_fraction", self.link_fraction),
            ("peer_fraction", self.peer_fraction),
        ] {
            if !(f > 0.0 && f <= 1.0) {
                return Err(format!("`{name}` must be above 0 and at most 1"));
            }
        }
        if self.deadline.0.is_zero() {
            return Err("`deadline` must be above 0".into());
        }
        Ok(())
    }
}

/// The three directions, as the report and the messages name them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Direction {
    ToDevice,
    ToHost,
    OnDevice,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::ToDevice => "host-to-device",
            Direction::ToHost => "device-to-host",
            Direction::OnDevice => "device-to-device",
        }
    }
}

const DIRECTIONS: [Direction; 3] = [Direction::ToDevice, Direction::ToHost, Direction::OnDevice];

/// One GPU's buffers for the copies.
struct Bench<'d> {
    stream: Stream<'d>,
    host: PinnedBuffer<'d>,
    a: DeviceBuffer<'d, u8>,
    b: DeviceBuffer<'d, u8>,
}

impl<'d> Bench<'d> {
    fn new(device: &'d Device<'d>, bytes: usize) -> Result<Bench<'d>, nccl_sys::Error> {
        Ok(Bench {
            stream: device.stream()?,
            host: device.pinned(bytes)?,
            a: device.alloc::<u8>(bytes)?,
            b: device.alloc::<u8>(bytes)?,
        })
    }

    fn copy(&self, direction: Direction, len: usize) -> Copy<'_> {
        match direction {
            Direction::ToDevice => Copy::ToDevice {
                from: &self.host,
                from_at: 0,
                to: &self.a,
                to_at: 0,
                len,
            },
            Direction::ToHost => Copy::ToHost {
                from: &self.a,
                from_at: 0,
                to: &self.host,
                to_at: 0,
                len,
            },
            Direction::OnDevice => Copy::OnDevice {
                from: &self.a,
                from_at: 0,
                to: &self.b,
                to_at: 0,
                len,
            },
        }
    }
}

/// A copy shorter than this says little: the GPU's events resolve about
/// half a microsecond.
const SHORTEST: Duration = Duration::from_micros(100);

/// GB/s of `bytes` in `time`; `None` for a time of zero.
fn gbps(bytes: usize, time: Duration) -> Option<f64> {
    (!time.is_zero()).then(|| bytes as f64 / time.as_secs_f64() / 1e9)
}

/// The best rate of copies of `len` bytes: of those long enough to time,
/// where any is.
fn best(len: usize, times: &[Duration]) -> Option<f64> {
    let timed: Vec<Duration> = times.iter().copied().filter(|t| *t >= SHORTEST).collect();
    let of = if timed.is_empty() { times } else { &timed };
    of.iter().filter_map(|t| gbps(len, *t)).reduce(f64::max)
}

/// One GPU's host-to-device and device-to-host rates with every GPU
/// copying at once.
type Together = Result<[Option<f64>; 2], nccl_sys::Error>;

/// What one GPU reached; `None` for a direction not measured.
#[derive(Debug, Clone, Default)]
struct Figures {
    best: [Option<f64>; 3],
    together: [Option<f64>; 2],
}

impl GpuBandwidth {
    fn sizes(&self) -> Vec<usize> {
        self.sizes.iter().map(|b| b.0 as usize).collect()
    }

    /// One GPU at a time: each direction's best rate over sizes and runs.
    fn alone(&self, bench: &Bench<'_>, deadline: Instant) -> Result<Figures, nccl_sys::Error> {
        let mut figures = Figures::default();
        for len in self.sizes() {
            for (d, direction) in DIRECTIONS.iter().enumerate() {
                let copies: Vec<Copy<'_>> = (0..self.runs)
                    .map(|_| bench.copy(*direction, len))
                    .collect();
                let times = bench.stream.timed(&copies, deadline)?;
                if let Some(best) = best(len, &times) {
                    figures.best[d] = Some(figures.best[d].map_or(best, |b: f64| b.max(best)));
                }
            }
        }
        Ok(figures)
    }

    /// Every GPU at once, host to device then device to host: each GPU's
    /// typical rate while the others copy too.
    fn together(
        &self,
        benches: &[(usize, &Bench<'_>)],
        deadline: Instant,
    ) -> Vec<(usize, Together)> {
        let len = self.sizes().into_iter().max().unwrap_or(0);
        let copies: Vec<Vec<Copy<'_>>> = benches
            .iter()
            .map(|(_, b)| {
                let mut c: Vec<Copy<'_>> = (0..self.runs)
                    .map(|_| b.copy(Direction::ToDevice, len))
                    .collect();
                c.extend((0..self.runs).map(|_| b.copy(Direction::ToHost, len)));
                c
            })
            .collect();
        let work: Vec<(&Stream<'_>, &[Copy<'_>])> = benches
            .iter()
            .zip(&copies)
            .map(|((_, b), c)| (&b.stream, c.as_slice()))
            .collect();
        let runs = self.runs as usize;
        benches
            .iter()
            .zip(timed_together(&work, deadline))
            .map(|((i, _), r)| {
                // The median copy: sharing slows every copy while the
                // others run, and a last copy run after the others have
                // ended moves no median.
                let rates = r.map(|times| {
                    let (h2d, d2h) = times.split_at(runs.min(times.len()));
                    let typical =
                        |t: &[Duration]| median(t.iter().filter_map(|t| gbps(len, *t)).collect());
                    [typical(h2d), typical(d2h)]
                });
                (*i, rates)
            })
            .collect()
    }

    fn check(&self, facts: &Facts) -> Finding {
        let (cuda, count) = match cuda::open(facts, "no GPU to copy to") {
            Ok(c) => c,
            Err(no) => return super::no_driver(no),
        };
        let Some(_engines) = cuda::copy_engines_now() else {
            return Finding::skip(
                "the GPU memory test is copying on these GPUs now: a figure taken beside it would be what it leaves",
            );
        };
        match self.measure(&cuda, count, facts) {
            Ok(f) => f,
            Err(e) => Finding::error(e),
        }
    }

    fn measure(&self, cuda: &Cuda, count: usize, facts: &Facts) -> Result<Finding, String> {
        let devices: Vec<Device<'_>> = (0..count)
            .map(|i| cuda.device(i))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let names: Vec<GpuName> = devices
            .iter()
            .map(|d| {
                d.pci_bus_id()
                    .map(|bus| GpuName::new(d.ordinal(), &bus))
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<_, _>>()?;
        let largest = self.sizes().into_iter().max().unwrap_or(0);
        let benches: Vec<Bench<'_>> = devices
            .iter()
            .zip(&names)
            .map(|(d, n)| Bench::new(d, largest).map_err(|e| format!("{n}: {e}")))
            .collect::<Result<_, _>>()?;
        let mut problems = Vec::new();
        let mut hung = Vec::new();
        let mut figures: Vec<Option<Figures>> = Vec::new();
        for (bench, name) in benches.iter().zip(&names) {
            // Each GPU its own deadline: one that hangs leaves the next
            // its full time.
            match self.alone(bench, Instant::now() + self.deadline.0) {
                Ok(f) => figures.push(Some(f)),
                Err(nccl_sys::Error::Timeout { .. }) => {
                    // All of a GPU's copies in the deadline: slower than
                    // this is as good as hung.
                    let bytes: usize = self.sizes().iter().sum::<usize>() * 3 * self.runs as usize;
                    problems.push(format!(
                        "{name}: its copies ({}) did not finish within {}: below {:.2} GB/s, or hung",
                        format_bytes(bytes as u64),
                        preflight_ground::values::format_duration(self.deadline.0),
                        bytes as f64 / self.deadline.0.as_secs_f64() / 1e9
                    ));
                    hung.push(name.to_string());
                    figures.push(None);
                }
                Err(e) => return Err(format!("{name}: {e}")),
            }
        }
        let live: Vec<(usize, &Bench<'_>)> = benches
            .iter()
            .enumerate()
            .filter(|(i, _)| figures[*i].is_some())
            .collect();
        if self.all_at_once && live.len() > 1 {
            let deadline = Instant::now() + self.deadline.0;
            for (i, r) in self.together(&live, deadline) {
                match r {
                    Ok(rates) => {
                        if let Some(f) = figures[i].as_mut() {
                            f.together = rates;
                        }
                    }
                    Err(nccl_sys::Error::Timeout { .. }) => {
                        problems.push(format!(
                            "{}: its copies did not finish within {} with every GPU copying at once",
                            names[i],
                            preflight_ground::values::format_duration(self.deadline.0)
                        ));
                        hung.push(names[i].to_string());
                    }
                    Err(e) => return Err(format!("{}: {e}", names[i])),
                }
            }
        }
        Ok(self.judge(facts, &names, &figures, problems, hung))
    }

    fn judge(
        &self,
        facts: &Facts,
        names: &[GpuName],
        figures: &[Option<Figures>],
        mut problems: Vec<String>,
        mut blamed: Vec<String>,
    ) -> Finding {
        let mut unjudged = Vec::new();
        let profile = facts.profile();
        let floors = profile.as_ref().and_then(|p| p.expect.floors.as_ref());
        let medians: Vec<Option<f64>> = (0..3)
            .map(|d| median(figures.iter().flatten().filter_map(|f| f.best[d]).collect()))
            .collect();
        let together_medians: Vec<Option<f64>> = (0..2)
            .map(|d| {
                median(
                    figures
                        .iter()
                        .flatten()
                        .filter_map(|f| f.together[d])
                        .collect(),
                )
            })
            .collect();
        let peers = figures.iter().flatten().count();
        for (name, f) in names.iter().zip(figures) {
            let Some(f) = f else { continue };
            let mut said = Vec::new();
            let link = facts
                .pci_devices()
                .iter()
                .find(|p| p.address == name.bus_id)
                .and_then(|p| {
                    let l = &p.link;
                    let mut gts = l.max_speed.or(l.current_speed)?;
                    let mut width = l.max_width.or(l.current_width)?;
                    // A GPU capable of more than its slot runs at the
                    // slot's rate: the slower end holds it.
                    if let Some(up) = &p.upstream {
                        gts = up.max_speed.map_or(gts, |u| u.min(gts));
                        width = up.max_width.map_or(width, |u| u.min(width));
                    }
                    Some((gts, width))
                });
            if link.is_none() {
                unjudged.push(format!("{name}: no PCIe link in sysfs to hold it to"));
            }
            let mut slow_alone = [false; 3];
            for (d, direction) in DIRECTIONS.iter().enumerate() {
                let Some(rate) = f.best[d] else { continue };
                let mut why = Vec::new();
                if *direction != Direction::OnDevice
                    && let Some((gts, width)) = link
                {
                    let full = link_gbps(gts, width);
                    if rate < self.link_fraction * full {
                        why.push(format!(
                            "{:.0}% of its x{width} {} link's {full:.1}",
                            rate / full * 100.0,
                            format_speed(gts)
                        ));
                    }
                }
                if peers > 1
                    && let Some(m) = medians[d]
                    && rate < self.peer_fraction * m
                {
                    why.push(format!("the node's GPUs reach {m:.1}, median"));
                }
                let floor = match direction {
                    Direction::ToDevice => floors.and_then(|f| f.h2d_gbps),
                    Direction::ToHost => floors.and_then(|f| f.d2h_gbps),
                    Direction::OnDevice => None,
                };
                if let (Some(floor), Some(p)) = (floor, profile.as_ref())
                    && rate < floor
                {
                    why.push(format!("below {}'s floor of {floor:.1}", p.named()));
                }
                if !why.is_empty() {
                    slow_alone[d] = true;
                    said.push(format!(
                        "{} {rate:.1} GB/s ({})",
                        direction.name(),
                        why.join("; ")
                    ));
                }
            }
            // Slow on its own already says it; slow only beside the
            // others is what a shared switch or uplink does.
            for (d, direction) in DIRECTIONS[..2].iter().enumerate() {
                if !slow_alone[d]
                    && let (Some(rate), Some(m)) = (f.together[d], together_medians[d])
                    && rate < self.peer_fraction * m
                {
                    said.push(format!(
                        "{} {rate:.1} GB/s with every GPU copying at once, where the others reach {m:.1} (median), though alone it reaches {:.1}: a shared PCIe switch or uplink",
                        direction.name(),
                        f.best[d].unwrap_or(0.0)
                    ));
                }
            }
            if !said.is_empty() {
                if !blamed.contains(&name.to_string()) {
                    blamed.push(name.to_string());
                }
                problems.push(format!("{name}: {}", said.join(", ")));
            }
        }
        let copies = GpuCopies {
            gpus: names
                .iter()
                .zip(figures)
                .filter_map(|(n, f)| {
                    let f = f.as_ref()?;
                    Some(GpuCopy {
                        index: n.index as u32,
                        bus_id: n.bus_id.clone(),
                        h2d_gbps: f.best[0]?,
                        d2h_gbps: f.best[1]?,
                        d2d_gbps: f.best[2]?,
                        together_h2d_gbps: f.together[0],
                        together_d2h_gbps: f.together[1],
                    })
                })
                .collect(),
        };
        let lowest = |d: usize| {
            figures
                .iter()
                .flatten()
                .filter_map(|f| f.best[d])
                .fold(f64::INFINITY, f64::min)
        };
        let mut measured = if copies.gpus.is_empty() {
            "no GPU measured".to_string()
        } else {
            format!(
                "lowest of {}: host-to-device {:.1}, device-to-host {:.1}, device-to-device {:.1} GB/s",
                preflight_ground::values::count(copies.gpus.len(), "GPU"),
                lowest(0),
                lowest(1),
                lowest(2)
            )
        };
        let all: f64 = copies.gpus.iter().filter_map(|g| g.together_h2d_gbps).sum();
        if all > 0.0 {
            measured.push_str(&format!(
                "; all at once {all:.1} GB/s host-to-device in all"
            ));
        }
        let finding = if !problems.is_empty() {
            let unchecked: Vec<&str> = unjudged.iter().map(String::as_str).collect();
            super::problems_and_unchecked(&problems, &unchecked)
        } else if !unjudged.is_empty() {
            Finding::warn(format!("{measured}; not judged: {}", unjudged.join("; ")))
        } else {
            Finding::pass(format!(
                "{measured}; each GPU within its link and its peers"
            ))
        };
        finding
            .measured(measured)
            .expected(format!(
                "host copies at {:.0}% of each link, every figure at {:.0}% of the node's median{}",
                self.link_fraction * 100.0,
                self.peer_fraction * 100.0,
                if floors.is_some_and(|f| f.h2d_gbps.is_some() || f.d2h_gbps.is_some()) {
                    ", the profile's floors"
                } else {
                    ""
                }
            ))
            .var(
                "gpus",
                if blamed.is_empty() {
                    "none".to_string()
                } else {
                    blamed.join(", ")
                },
            )
            .copies(copies)
    }
}

impl Probe for GpuBandwidth {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            // A job's processes on the GPUs: the rates would be what the
            // job leaves, and the copies would slow the job (the periodic
            // check runs beside jobs).
            if facts.is_live()
                && let Some(Ok(r)) = facts.gpu_report(None).await
            {
                let busy = super::busy_gpus(&r);
                if !busy.is_empty() {
                    return Finding::skip(format!(
                        "GPUs in use by running processes ({}): their copy rates would be the job's leftovers, and the copies would slow the job",
                        busy.join(", ")
                    ));
                }
            }
            blocking(move || self.check(&facts)).await
        })
    }

    fn default_timeout(&self) -> Option<Duration> {
        // Each of up to 16 GPUs alone, then all at once, each up to
        // `deadline`, and the buffers: a hung GPU is named, not lost to
        // the check's own timeout.
        Some(self.deadline.0 * 17 + Duration::from_secs(10))
    }
}
