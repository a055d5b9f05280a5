//! How each subject judges what amd-smi (or rocm-smi) said: the
//! problems, the GPUs read, and what could not be judged.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::AmdSmi;
use super::parse::{self, Gpu, LinkState, XgmiGpu, number};
use crate::problems_finding;
use preflight_facts::Facts;
use preflight_facts::Vendor;
use preflight_result::Finding;

/// GPUs by index, named with their bus: amd-smi's own where it says it,
/// else the node's AMD GPUs in bus order (amd-smi's order).
pub(super) struct Names(pub(super) Vec<String>);

impl Names {
    pub(super) fn of(facts: &Facts) -> Names {
        let mut buses: Vec<String> = facts
            .accelerators()
            .iter()
            .filter(|a| a.vendor == Vendor::Amd)
            .map(|a| a.pci.address.clone())
            .collect();
        buses.sort();
        Names(buses)
    }

    pub(super) fn gpu(&self, index: u32, bdf: Option<&str>) -> String {
        match bdf
            .map(str::to_ascii_lowercase)
            .or_else(|| self.0.get(index as usize).cloned())
        {
            Some(b) => format!("GPU {index} ({b})"),
            None => format!("GPU {index}"),
        }
    }
}

pub(super) fn count(section: &serde_json::Map<String, Value>, key: &str) -> Option<u64> {
    section.get(key).and_then(number).map(|n| n as u64)
}

/// What a subject found: the problems, the GPUs it read, and what it
/// could not judge (a GPU that said `N/A`, one the output leaves out, a
/// word preflight does not know): never a pass.
#[derive(Default)]
struct Judged {
    problems: Vec<String>,
    read: BTreeSet<u32>,
    unjudged: Vec<String>,
}

impl Judged {
    /// The node's AMD GPUs the output left out, by index.
    fn missing(&mut self, names: &Names, listed: &BTreeSet<u32>, what: &str) {
        for i in 0..names.0.len() as u32 {
            if !listed.contains(&i) {
                self.unjudged
                    .push(format!("{}: not in amd-smi's {what}", names.gpu(i, None)));
            }
        }
    }

    fn finding(self, measured: String, passed: impl FnOnce(&str) -> String) -> Finding {
        crate::judged(&self.problems, &self.unjudged, measured, passed)
    }
}

pub(super) fn judge_ecc(check: &AmdSmi, gpus: &[Gpu], names: &Names) -> Finding {
    let mut j = Judged::default();
    let listed: BTreeSet<u32> = gpus.iter().map(|g| g.index).collect();
    for g in gpus {
        let name = names.gpu(g.index, g.bdf());
        let ecc = g.section("ecc");
        let ue = ecc.and_then(|e| count(e, "total_uncorrectable_count"));
        let deferred = ecc
            .and_then(|e| count(e, "total_deferred_count"))
            .unwrap_or(0);
        let ce = ecc.and_then(|e| count(e, "total_correctable_count"));
        let Some(ue) = ue else {
            j.unjudged
                .push(format!("{name}: no uncorrectable count (N/A)"));
            continue;
        };
        j.read.insert(g.index);
        // A count past u64 (a hostile or broken document) stays huge.
        let bad = ue.saturating_add(deferred);
        if bad > check.max_uncorrectable {
            let blocks: Vec<String> = g
                .section("ecc_blocks")
                .map(|b| {
                    b.iter()
                        .filter_map(|(block, counts)| {
                            let c = counts.as_object()?;
                            let n = count(c, "uncorrectable_count")
                                .unwrap_or(0)
                                .saturating_add(count(c, "deferred_count").unwrap_or(0));
                            (n > 0).then(|| format!("{block} {n}"))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let deferred = if deferred > 0 {
                format!(" ({deferred} deferred)")
            } else {
                String::new()
            };
            let blocks = if blocks.is_empty() {
                String::new()
            } else {
                format!(" in {}", blocks.join(", "))
            };
            j.problems.push(format!(
                "{name}: {bad} uncorrectable ECC errors{deferred}{blocks} (at most {})",
                check.max_uncorrectable
            ));
        }
        if let (Some(ce), Some(max)) = (ce, check.max_correctable)
            && ce > max
        {
            j.problems.push(format!(
                "{name}: {ce} correctable ECC errors (at most {max})"
            ));
        }
    }
    j.missing(names, &listed, "ECC counts");
    if j.read.is_empty() && j.problems.is_empty() {
        return Finding::skip(format!(
            "no AMD GPU reports its ECC counts{}",
            if j.unjudged.is_empty() {
                String::new()
            } else {
                format!(" ({})", j.unjudged.join("; "))
            }
        ));
    }
    let measured = format!("ECC counts of {} GPUs", j.read.len());
    j.finding(measured, |m| format!("{m}: none over the limits"))
}

/// RAS per block, against the node's other GPUs: a block whose error
/// counting (`static --ras`'s `ecc_block_state`) is off on one GPU while
/// on at most of the others counts nothing there, and its errors go
/// unseen. (What is off on every GPU is the product's design: MI300A's
/// UMC.)
pub(super) fn ras_states(statics: &[Gpu], names: &Names) -> Vec<String> {
    let states: Vec<(&Gpu, &serde_json::Map<String, Value>)> = statics
        .iter()
        .filter_map(|g| {
            let s = g.section("ras")?.get("ecc_block_state")?.as_object()?;
            Some((g, s))
        })
        .collect();
    let mut enabled: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, s) in &states {
        for (block, state) in s.iter() {
            if state.as_str() == Some("ENABLED") {
                *enabled.entry(block.as_str()).or_default() += 1;
            }
        }
    }
    let mut off = Vec::new();
    for (g, s) in &states {
        for (block, on) in &enabled {
            let state = s.get(*block).and_then(Value::as_str).unwrap_or("absent");
            if state != "ENABLED" && on * 2 > states.len() {
                off.push(format!(
                    "{}: RAS error counting for {block} is {state} where {on} of {} GPUs have it enabled: its errors go uncounted",
                    names.gpu(g.index, g.bdf()),
                    states.len()
                ));
            }
        }
    }
    off
}

/// The ECC finding with the RAS states' problems added.
pub(super) fn with_ras_states(finding: Finding, off: Vec<String>) -> Finding {
    if off.is_empty() {
        return finding;
    }
    let mut problems = off;
    if finding.status == preflight_result::Status::Fail {
        problems.insert(0, finding.message.clone());
    }
    let measured = finding.measured.clone().unwrap_or_default();
    problems_finding(&problems).measured(measured)
}

/// Where the expected link count came from, for the message.
fn links_expected(
    check: &AmdSmi,
    profile: Option<(&str, usize)>,
    usual: Option<usize>,
) -> Option<(usize, String)> {
    match (check.links, profile, usual) {
        (Some(n), _, _) => Some((n, "as the check sets".into())),
        (None, Some((name, n)), _) => Some((n, format!("as {name} sets"))),
        (None, None, Some(n)) => Some((n, "as most GPUs here".into())),
        _ => None,
    }
}

pub(super) fn judge_xgmi(
    check: &AmdSmi,
    xgmi: &[XgmiGpu],
    errors: &[(String, String)],
    names: &Names,
    source: &str,
    profile: Option<(&str, usize)>,
) -> Finding {
    let mut j = Judged::default();
    let known: Vec<&XgmiGpu> = xgmi
        .iter()
        .filter(|g| g.links.iter().any(|(_, s)| *s != LinkState::Unknown))
        .collect();
    for g in xgmi
        .iter()
        .filter(|g| !known.iter().any(|k| k.index == g.index))
    {
        j.unjudged.push(format!(
            "{}: {}",
            names.gpu(g.index, g.bdf.as_deref()),
            if g.links.is_empty() {
                "no XGMI link listed"
            } else {
                "every XGMI link N/A"
            }
        ));
    }
    let listed: BTreeSet<u32> = xgmi.iter().map(|g| g.index).collect();
    j.missing(names, &listed, "XGMI output");
    let up = |g: &XgmiGpu| g.links.iter().filter(|(_, s)| *s == LinkState::Up).count();
    let expected = links_expected(
        check,
        profile,
        crate::most_common(known.iter().map(|g| up(g))),
    );
    let what = if xgmi.first().is_some_and(|g| g.by_port) {
        "port"
    } else {
        "link to GPU"
    };
    for g in &known {
        j.read.insert(g.index);
        let name = names.gpu(g.index, g.bdf.as_deref());
        let down: Vec<String> = g
            .links
            .iter()
            .filter(|(_, s)| *s == LinkState::Down)
            .map(|(p, _)| p.to_string())
            .collect();
        let n = up(g);
        if !down.is_empty() {
            j.problems.push(format!(
                "{name}: XGMI {what}{} {} down ({n} up)",
                if down.len() == 1 { "" } else { "s" },
                down.join(", ")
            ));
        } else if let Some((e, why)) = expected.as_ref().filter(|(e, _)| n < *e) {
            j.problems.push(format!(
                "{name}: {n} XGMI links up where {e} are expected {why}"
            ));
        }
    }
    for (who, status) in errors {
        j.problems
            .push(format!("{who}: XGMI error status {status}"));
    }
    if known.is_empty() && j.problems.is_empty() {
        return Finding::skip(format!(
            "no GPU says its XGMI link state in {source} (N/A: virtualized, or no XGMI)"
        ));
    }
    let links: usize = known.iter().map(|g| up(g)).sum();
    let measured = format!("{links} XGMI links up on {} GPUs", known.len());
    j.finding(measured, |m| format!("{m}, from {source}"))
}

/// The XGMI error status each GPU reports in `amd-smi metric`, where it is
/// not "no errors".
pub(super) fn xgmi_errors(gpus: &[Gpu], names: &Names) -> Vec<(String, String)> {
    gpus.iter()
        .filter_map(|g| {
            let s = g.doc.get("xgmi_err")?.as_str()?;
            (s != "N/A" && s != "AMDSMI_XGMI_STATUS_NO_ERRORS")
                .then(|| (names.gpu(g.index, g.bdf()), s.to_string()))
        })
        .collect()
}

/// rocm-smi's XGMI view: the error count of each card, and any pair of
/// GPUs not on XGMI where most pairs are; a node whose GPUs share no
/// XGMI at all has none to judge.
pub(super) fn judge_rocm_smi(r: &parse::RocmSmi, names: &Names, source: &str) -> Finding {
    let mut j = Judged::default();
    for (card, count) in &r.xgmi_errors {
        j.read.insert(*card);
        match count.as_str() {
            "0" => {}
            "1" | "2" => j.problems.push(format!(
                "{}: XGMI error count {count} ({})",
                names.gpu(*card, None),
                if count == "1" {
                    "one error"
                } else {
                    "several errors"
                }
            )),
            other => j.unjudged.push(format!(
                "{}: XGMI error count `{other}`",
                names.gpu(*card, None)
            )),
        }
    }
    let xgmi = r.link_types.iter().filter(|(_, _, t)| t == "XGMI").count();
    for (a, b, t) in &r.link_types {
        match t.as_str() {
            "XGMI" => {}
            "PCIE" if xgmi * 2 > r.link_types.len() => j.problems.push(format!(
                "{} and {} reach each other over PCIE where the other GPU pairs use XGMI",
                names.gpu(*a, None),
                names.gpu(*b, None)
            )),
            "PCIE" => {}
            other => j.unjudged.push(format!(
                "{} and {}: link type `{other}`",
                names.gpu(*a, None),
                names.gpu(*b, None)
            )),
        }
    }
    if r.xgmi_errors.is_empty() && r.link_types.is_empty() {
        return Finding::skip(format!("{source} says nothing of XGMI"));
    }
    if xgmi == 0 && j.problems.is_empty() && j.unjudged.is_empty() {
        return Finding::skip(format!(
            "no XGMI between these GPUs ({} pairs on PCIe), from {source}",
            r.link_types.len()
        ));
    }
    let measured = format!("{xgmi} of {} GPU pairs on XGMI", r.link_types.len());
    j.finding(measured, |m| format!("{m}, no XGMI error, from {source}"))
}

/// The violations that hold a GPU below what it should reach: heat and
/// PROCHOT. PPT (the package power limit) is power capping under load, as
/// NVIDIA's software power cap is: reported, never a fault; ROCm 7's
/// `low_utilization` and clock-below-host-limit statuses are a GPU at rest
/// or the site's choice.
const VIOLATIONS: &[&str] = &["prochot", "socket_thermal", "vr_thermal", "hbm_thermal"];

pub(super) fn judge_throttle(gpus: &[Gpu], names: &Names) -> Finding {
    let mut j = Judged::default();
    let listed: BTreeSet<u32> = gpus.iter().map(|g| g.index).collect();
    for g in gpus {
        let name = names.gpu(g.index, g.bdf());
        let Some(t) = g.section("throttle") else {
            j.unjudged
                .push(format!("{name}: no violation status (N/A)"));
            continue;
        };
        let mut any = false;
        for reason in VIOLATIONS {
            let Some(v) = t.get(&format!("{reason}_violation_status")) else {
                continue;
            };
            match v.as_str() {
                Some("N/A") => continue,
                Some("NOT ACTIVE") => {}
                Some("ACTIVE") => {
                    let activity = t
                        .get(&format!("{reason}_violation_activity"))
                        .and_then(number)
                        .map(|p| format!(" ({p}% of the time)"))
                        .unwrap_or_default();
                    j.problems
                        .push(format!("{name}: {reason} violation active{activity}"));
                }
                Some(other) => j
                    .unjudged
                    .push(format!("{name}: {reason} violation status `{other}`")),
                None => j
                    .unjudged
                    .push(format!("{name}: {reason} violation status {v}, not a word")),
            }
            any = true;
        }
        if any {
            j.read.insert(g.index);
        }
    }
    j.missing(names, &listed, "violation status");
    if j.read.is_empty() && j.problems.is_empty() {
        return Finding::skip(
            "no AMD GPU reports its violation status (amd-smi 6.3 or later on MI300)",
        );
    }
    let measured = format!("violation status of {} GPUs", j.read.len());
    j.finding(measured, |m| format!("{m}: none active"))
}

pub(super) fn judge_pcie(metric: &[Gpu], statics: &[Gpu], names: &Names) -> Finding {
    let mut j = Judged::default();
    let listed: BTreeSet<u32> = metric.iter().map(|g| g.index).collect();
    for g in metric {
        let bus = statics
            .iter()
            .find(|s| s.index == g.index)
            .and_then(|s| s.section("bus"));
        let bdf = g.bdf().or_else(|| bus.and_then(|b| b.get("bdf")?.as_str()));
        let name = names.gpu(g.index, bdf);
        let now = g.section("pcie").map(|p| {
            (
                p.get("width").and_then(number),
                p.get("speed").and_then(number),
            )
        });
        let max = bus.map(|b| {
            (
                b.get("max_pcie_width").and_then(number),
                b.get("max_pcie_speed").and_then(number),
            )
        });
        let (Some((Some(width), Some(speed))), Some((Some(max_width), Some(max_speed)))) =
            (now, max)
        else {
            j.unjudged.push(format!(
                "{name}: {}",
                if now.is_none_or(|(w, s)| w.is_none() || s.is_none()) {
                    "no current link (N/A)"
                } else {
                    "no maximum to compare with (`static --bus`)"
                }
            ));
            continue;
        };
        j.read.insert(g.index);
        if width < max_width {
            j.problems
                .push(format!("{name}: PCIe x{width} of x{max_width}"));
        }
        if speed < max_speed {
            j.problems
                .push(format!("{name}: PCIe at {speed} GT/s of {max_speed} GT/s"));
        }
    }
    j.missing(names, &listed, "PCIe metrics");
    if j.read.is_empty() && j.problems.is_empty() {
        return Finding::skip(format!(
            "no AMD GPU's PCIe link could be compared with its maximum{}",
            if j.unjudged.is_empty() {
                String::new()
            } else {
                format!(" ({})", j.unjudged.join("; "))
            }
        ));
    }
    let measured = format!("PCIe links of {} GPUs", j.read.len());
    j.finding(measured, |m| format!("{m} at their maximum"))
}

/// The pages of one `bad-pages` list with this status: a list, one
/// object, or a sentence (`No bad pages found.`); `None` for `N/A`.
fn pages_with(v: Option<&Value>, status: &str) -> Option<usize> {
    let one = |p: &Value| p.get("status").and_then(Value::as_str) == Some(status);
    match v {
        Some(Value::Array(list)) => Some(list.iter().filter(|p| one(p)).count()),
        Some(p @ Value::Object(_)) => Some(usize::from(one(p))),
        Some(Value::String(s)) if s.starts_with("No bad pages") => Some(0),
        _ => None,
    }
}

pub(super) fn judge_reset(pages: &[Gpu], statics: &[Gpu], names: &Names) -> Finding {
    let mut j = Judged::default();
    for g in pages {
        let name = names.gpu(g.index, g.bdf());
        let pending = pages_with(g.doc.get("pending"), "PENDING");
        let unreservable = pages_with(g.doc.get("un_res"), "UNRESERVABLE");
        let (Some(pending), Some(unreservable)) = (pending, unreservable) else {
            j.unjudged.push(format!("{name}: bad pages N/A"));
            continue;
        };
        j.read.insert(g.index);
        if pending > 0 {
            j.problems.push(format!(
                "{name}: {pending} bad pages pending retirement until the GPU is reset"
            ));
        }
        if unreservable > 0 {
            j.problems.push(format!(
                "{name}: {unreservable} bad pages that could not be retired"
            ));
        }
    }
    for s in statics {
        let exceeded = s.section("ras").and_then(|r| {
            r.get("bad_page_threshold_exceeded")?
                .as_str()
                .map(str::to_string)
        });
        if exceeded.as_deref() == Some("True") {
            j.problems.push(format!(
                "{}: more retired pages than the bad-page threshold: the GPU needs service",
                names.gpu(s.index, s.bdf())
            ));
        }
    }
    if !pages.is_empty() {
        let listed: BTreeSet<u32> = pages.iter().map(|g| g.index).collect();
        j.missing(names, &listed, "bad pages");
    }
    if pages.is_empty() && statics.is_empty() {
        return Finding::skip("no AMD GPU reports its bad pages");
    }
    let measured = format!("bad pages of {} GPUs", j.read.len().max(statics.len()));
    j.finding(measured, |m| format!("{m}: none pending"))
}
