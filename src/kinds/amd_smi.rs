//! `amd_smi`: AMD Instinct GPUs as AMD's `amd-smi` reports them (and
//! `rocm-smi` where amd-smi is missing, for XGMI), one subject per check:
//! ECC counts per RAS block, XGMI links between GPUs, throttling
//! (violation status), the PCIe link against its maximum, and the pages
//! waiting for a reset to be retired. A recording per output stands in
//! for the tool in tests and replays.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::tool_output::{Output, Tool};
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params, problems_finding};
use crate::facts::amd_smi::{self, Gpu, LinkState, XgmiGpu, number};
use crate::facts::{Facts, Vendor};
use crate::result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "amd_smi",
    area: "accelerators",
    summary: "AMD Instinct GPUs through `amd-smi` (`rocm-smi` for XGMI where amd-smi is missing), one `subject` per check: `ecc` (uncorrectable and deferred errors per RAS block), `xgmi` (every GPU's XGMI links up, as many as its peers', no XGMI error), `throttle` (power, thermal and PROCHOT violations active now), `pcie` (link width and speed at their maximum) and `reset` (bad pages pending retirement, the bad-page threshold exceeded).",
    params: &[
        ParamDoc {
            name: "subject",
            ty: "ecc|xgmi|throttle|pcie|reset",
            default: None,
            doc: "What the check reads: `amd-smi metric` for ecc, throttle and pcie (with `static --bus`), `amd-smi xgmi` for xgmi, `amd-smi bad-pages` (with `static --ras`) for reset.",
        },
        ParamDoc {
            name: "max_uncorrectable",
            ty: "integer",
            default: Some("0"),
            doc: "ecc: the most uncorrectable plus deferred errors a GPU may have counted.",
        },
        ParamDoc {
            name: "max_correctable",
            ty: "integer",
            default: Some("unset"),
            doc: "ecc: the most correctable errors a GPU may have counted.",
        },
        ParamDoc {
            name: "links",
            ty: "integer",
            default: Some("(what most GPUs on the node have)"),
            doc: "xgmi: XGMI links every GPU must have up (7 on an 8-GPU MI300X board).",
        },
        ParamDoc {
            name: "amd_smi_metric",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `amd-smi metric --json` (ecc, throttle, pcie; xgmi reads its `xgmi_err`).",
        },
        ParamDoc {
            name: "amd_smi_static",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `amd-smi static --json` (pcie reads `bus`, reset reads `ras`).",
        },
        ParamDoc {
            name: "amd_smi_xgmi",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `amd-smi xgmi --json` (ROCm 7) or `amd-smi xgmi -l --json` (6.4).",
        },
        ParamDoc {
            name: "amd_smi_bad_pages",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `amd-smi bad-pages --json`.",
        },
        ParamDoc {
            name: "rocm_smi_json",
            ty: "path",
            default: Some("unset"),
            doc: "xgmi on older ROCm: a recorded `rocm-smi --showxgmierr --showtopotype --json`.",
        },
        ParamDoc {
            name: "amd_smi",
            ty: "path",
            default: Some("amd-smi"),
            doc: "The amd-smi program (on PATH unless a path).",
        },
    ],
    hint_vars: &["gpus"],
    parse: parse_params::<AmdSmi>,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
enum Subject {
    Ecc,
    Xgmi,
    Throttle,
    Pcie,
    Reset,
}

fn default_program() -> PathBuf {
    PathBuf::from("amd-smi")
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmdSmi {
    subject: Subject,
    #[serde(default)]
    max_uncorrectable: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_correctable: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    links: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    amd_smi_metric: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    amd_smi_static: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    amd_smi_xgmi: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    amd_smi_bad_pages: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rocm_smi_json: Option<PathBuf>,
    #[serde(default = "default_program")]
    amd_smi: PathBuf,
}

impl Params for AmdSmi {
    fn validate(&self) -> Result<(), String> {
        use Subject::*;
        let only = |set: bool, name: &str, subjects: &str| {
            if set {
                Err(format!("`{name}` applies to `subject: {subjects}` only"))
            } else {
                Ok(())
            }
        };
        let s = self.subject;
        only(
            self.max_correctable.is_some() && s != Ecc,
            "max_correctable",
            "ecc",
        )?;
        only(self.links.is_some() && s != Xgmi, "links", "xgmi")?;
        only(
            self.amd_smi_static.is_some() && !matches!(s, Ecc | Pcie | Reset),
            "amd_smi_static",
            "ecc, pcie or reset",
        )?;
        only(
            self.amd_smi_xgmi.is_some() && s != Xgmi,
            "amd_smi_xgmi",
            "xgmi",
        )?;
        only(
            self.rocm_smi_json.is_some() && s != Xgmi,
            "rocm_smi_json",
            "xgmi",
        )?;
        only(
            self.amd_smi_bad_pages.is_some() && s != Reset,
            "amd_smi_bad_pages",
            "reset",
        )?;
        only(
            self.amd_smi_metric.is_some() && s == Reset,
            "amd_smi_metric",
            "ecc, xgmi, throttle or pcie",
        )?;
        if self.amd_smi.as_os_str().is_empty() {
            return Err("`amd_smi` is empty".into());
        }
        Ok(())
    }
}

/// GPUs by index, named with their bus: amd-smi's own where it says it,
/// else the node's AMD GPUs in bus order (amd-smi's order).
struct Names(Vec<String>);

impl Names {
    fn of(facts: &Facts) -> Names {
        let mut buses: Vec<String> = facts
            .accelerators()
            .iter()
            .filter(|a| a.vendor == Vendor::Amd)
            .map(|a| a.pci.address.clone())
            .collect();
        buses.sort();
        Names(buses)
    }

    fn gpu(&self, index: u32, bdf: Option<&str>) -> String {
        match bdf
            .map(str::to_ascii_lowercase)
            .or_else(|| self.0.get(index as usize).cloned())
        {
            Some(b) => format!("GPU {index} ({b})"),
            None => format!("GPU {index}"),
        }
    }
}

fn count(section: &serde_json::Map<String, Value>, key: &str) -> Option<u64> {
    section.get(key).and_then(number).map(|n| n as u64)
}

fn judge_ecc(check: &AmdSmi, gpus: &[Gpu], names: &Names) -> Finding {
    let mut problems = Vec::new();
    let mut read = 0;
    for g in gpus {
        let Some(ecc) = g.section("ecc") else {
            continue;
        };
        let ue = count(ecc, "total_uncorrectable_count");
        let deferred = count(ecc, "total_deferred_count").unwrap_or(0);
        let ce = count(ecc, "total_correctable_count");
        if ue.is_none() && ce.is_none() {
            continue;
        }
        read += 1;
        let name = names.gpu(g.index, g.bdf());
        let bad = ue.unwrap_or(0) + deferred;
        if bad > check.max_uncorrectable {
            let blocks: Vec<String> = g
                .section("ecc_blocks")
                .map(|b| {
                    b.iter()
                        .filter_map(|(block, counts)| {
                            let c = counts.as_object()?;
                            let n = count(c, "uncorrectable_count").unwrap_or(0)
                                + count(c, "deferred_count").unwrap_or(0);
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
            problems.push(format!(
                "{name}: {bad} uncorrectable ECC errors{deferred}{blocks} (at most {})",
                check.max_uncorrectable
            ));
        }
        if let (Some(ce), Some(max)) = (ce, check.max_correctable)
            && ce > max
        {
            problems.push(format!(
                "{name}: {ce} correctable ECC errors (at most {max})"
            ));
        }
    }
    if read == 0 {
        return Finding::skip("no AMD GPU reports its ECC counts");
    }
    let measured = format!("ECC counts of {read} GPUs");
    if problems.is_empty() {
        Finding::pass(format!("{measured}: none over the limits")).measured(measured)
    } else {
        problems_finding(&problems).measured(measured)
    }
}

/// RAS per block, against the node's other GPUs: a block whose error
/// counting (`static --ras`'s `ecc_block_state`) is off on one GPU while
/// on at most of the others counts nothing there, and its errors go
/// unseen. (What is off on every GPU is the product's design: MI300A's
/// UMC.)
fn with_ras_states(finding: Finding, statics: &[Gpu], names: &Names) -> Finding {
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
    if off.is_empty() {
        return finding;
    }
    let status = finding.status;
    let mut problems = off;
    if status == crate::result::Status::Fail {
        problems.insert(0, finding.message.clone());
    }
    let measured = finding.measured.clone().unwrap_or_default();
    problems_finding(&problems).measured(measured)
}

/// The most common value (the larger on a tie).
fn mode(values: impl Iterator<Item = usize>) -> Option<usize> {
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for v in values {
        *counts.entry(v).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(v, _)| v)
}

fn judge_xgmi(
    check: &AmdSmi,
    xgmi: &[XgmiGpu],
    errors: &[(String, String)],
    names: &Names,
    source: &str,
) -> Finding {
    let mut problems = Vec::new();
    let known: Vec<&XgmiGpu> = xgmi
        .iter()
        .filter(|g| g.links.iter().any(|(_, s)| *s != LinkState::Unknown))
        .collect();
    let up = |g: &XgmiGpu| g.links.iter().filter(|(_, s)| *s == LinkState::Up).count();
    let expected = check.links.or_else(|| mode(known.iter().map(|g| up(g))));
    let what = if xgmi.first().is_some_and(|g| g.by_port) {
        "port"
    } else {
        "link to GPU"
    };
    for g in &known {
        let name = names.gpu(g.index, g.bdf.as_deref());
        let down: Vec<String> = g
            .links
            .iter()
            .filter(|(_, s)| *s == LinkState::Down)
            .map(|(p, _)| p.to_string())
            .collect();
        let n = up(g);
        if !down.is_empty() {
            problems.push(format!(
                "{name}: XGMI {what}{} {} down ({n} up)",
                if down.len() == 1 { "" } else { "s" },
                down.join(", ")
            ));
        } else if let Some(e) = expected.filter(|e| n < *e) {
            problems.push(format!("{name}: {n} XGMI links up where {e} are expected"));
        }
    }
    for (who, status) in errors {
        problems.push(format!("{who}: XGMI error status {status}"));
    }
    let unknown = xgmi.len() - known.len();
    if known.is_empty() && problems.is_empty() {
        return Finding::skip(format!(
            "no GPU says its XGMI link state in {source} (N/A: virtualized, or no XGMI)"
        ));
    }
    let links: usize = known.iter().map(|g| up(g)).sum();
    let measured = format!("{links} XGMI links up on {} GPUs", known.len());
    if problems.is_empty() {
        let mut text = format!("{measured}, from {source}");
        if unknown > 0 {
            text.push_str(&format!("; {unknown} GPUs do not say (N/A)"));
        }
        Finding::pass(text).measured(measured)
    } else {
        problems_finding(&problems).measured(measured)
    }
}

/// The XGMI error status each GPU reports in `amd-smi metric`, where it is
/// not "no errors".
fn xgmi_errors(gpus: &[Gpu], names: &Names) -> Vec<(String, String)> {
    gpus.iter()
        .filter_map(|g| {
            let s = g.doc.get("xgmi_err")?.as_str()?;
            (s != "N/A" && s != "AMDSMI_XGMI_STATUS_NO_ERRORS")
                .then(|| (names.gpu(g.index, g.bdf()), s.to_string()))
        })
        .collect()
}

/// rocm-smi's XGMI view: the error count of each card, and any pair of
/// GPUs on PCIe where most pairs are on XGMI.
fn judge_rocm_smi(r: &amd_smi::RocmSmi, names: &Names, source: &str) -> Finding {
    let mut problems = Vec::new();
    for (card, count) in &r.xgmi_errors {
        if count != "0" {
            problems.push(format!(
                "{}: XGMI error count {count} (1: one error, 2: several)",
                names.gpu(*card, None)
            ));
        }
    }
    let xgmi = r.link_types.iter().filter(|(_, _, t)| t == "XGMI").count();
    if xgmi * 2 > r.link_types.len() {
        for (a, b, t) in &r.link_types {
            if t != "XGMI" {
                problems.push(format!(
                    "{} and {} reach each other over {t} where the other GPU pairs use XGMI",
                    names.gpu(*a, None),
                    names.gpu(*b, None)
                ));
            }
        }
    }
    if r.xgmi_errors.is_empty() && r.link_types.is_empty() {
        return Finding::skip(format!("{source} says nothing of XGMI"));
    }
    let measured = format!("{xgmi} of {} GPU pairs on XGMI", r.link_types.len());
    if problems.is_empty() {
        Finding::pass(format!("{measured}, no XGMI error, from {source}")).measured(measured)
    } else {
        problems_finding(&problems).measured(measured)
    }
}

fn judge_throttle(gpus: &[Gpu], names: &Names) -> Finding {
    let mut problems = Vec::new();
    let mut unknown = Vec::new();
    let mut read = 0;
    for g in gpus {
        let Some(t) = g.section("throttle") else {
            continue;
        };
        let name = names.gpu(g.index, g.bdf());
        let mut any = false;
        for (key, v) in t {
            let Some(reason) = key.strip_suffix("_violation_status") else {
                continue;
            };
            let Some(status) = v.as_str() else {
                continue;
            };
            match status {
                "N/A" => continue,
                "NOT ACTIVE" => {}
                "ACTIVE" => {
                    let activity = t
                        .get(&format!("{reason}_violation_activity"))
                        .and_then(number)
                        .map(|p| format!(" ({p}% of the time)"))
                        .unwrap_or_default();
                    problems.push(format!("{name}: {reason} violation active{activity}"));
                }
                other => unknown.push(format!("{name}: {reason} violation status `{other}`")),
            }
            any = true;
        }
        if any {
            read += 1;
        }
    }
    if read == 0 {
        return Finding::skip(
            "no AMD GPU reports its violation status (amd-smi 6.3 or later on MI300)",
        );
    }
    let measured = format!("violation status of {read} GPUs");
    if !problems.is_empty() {
        return problems_finding(&problems).measured(measured);
    }
    if !unknown.is_empty() {
        return Finding::error(format!(
            "a violation status preflight does not know: {}",
            unknown.join("; ")
        ));
    }
    Finding::pass(format!("{measured}: none active")).measured(measured)
}

fn judge_pcie(metric: &[Gpu], statics: &[Gpu], names: &Names) -> Finding {
    let mut problems = Vec::new();
    let mut read = 0;
    for g in metric {
        let Some(p) = g.section("pcie") else {
            continue;
        };
        let bus = statics
            .iter()
            .find(|s| s.index == g.index)
            .and_then(|s| s.section("bus"));
        let bdf = g.bdf().or_else(|| bus.and_then(|b| b.get("bdf")?.as_str()));
        let name = names.gpu(g.index, bdf);
        let (Some(width), Some(speed)) = (
            p.get("width").and_then(number),
            p.get("speed").and_then(number),
        ) else {
            continue;
        };
        read += 1;
        let max_width = bus.and_then(|b| b.get("max_pcie_width").and_then(number));
        let max_speed = bus.and_then(|b| b.get("max_pcie_speed").and_then(number));
        if let Some(m) = max_width.filter(|m| width < *m) {
            problems.push(format!("{name}: PCIe x{width} of x{m}"));
        }
        if let Some(m) = max_speed.filter(|m| speed < *m) {
            problems.push(format!("{name}: PCIe at {speed} GT/s of {m} GT/s"));
        }
    }
    if read == 0 {
        return Finding::skip("no AMD GPU reports its PCIe link");
    }
    let measured = format!("PCIe links of {read} GPUs");
    if problems.is_empty() {
        Finding::pass(format!("{measured} at their maximum")).measured(measured)
    } else {
        problems_finding(&problems).measured(measured)
    }
}

/// The pages of one `bad-pages` list with this status: a list, one
/// object, or a sentence (`No bad pages found.`).
fn pages_with(v: Option<&Value>, status: &str) -> usize {
    let one = |p: &Value| p.get("status").and_then(Value::as_str) == Some(status);
    match v {
        Some(Value::Array(list)) => list.iter().filter(|p| one(p)).count(),
        Some(p @ Value::Object(_)) => usize::from(one(p)),
        _ => 0,
    }
}

fn judge_reset(pages: &[Gpu], statics: &[Gpu], names: &Names) -> Finding {
    let mut problems = Vec::new();
    for g in pages {
        let name = names.gpu(g.index, g.bdf());
        let pending = pages_with(g.doc.get("pending"), "PENDING");
        let unreservable = pages_with(g.doc.get("un_res"), "UNRESERVABLE");
        if pending > 0 {
            problems.push(format!(
                "{name}: {pending} bad pages pending retirement until the GPU is reset"
            ));
        }
        if unreservable > 0 {
            problems.push(format!(
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
            problems.push(format!(
                "{}: more retired pages than the bad-page threshold: the GPU needs service",
                names.gpu(s.index, s.bdf())
            ));
        }
    }
    if pages.is_empty() && statics.is_empty() {
        return Finding::skip("no AMD GPU reports its bad pages");
    }
    let measured = format!("bad pages of {} GPUs", pages.len().max(statics.len()));
    if problems.is_empty() {
        Finding::pass(format!("{measured}: none pending")).measured(measured)
    } else {
        problems_finding(&problems).measured(measured)
    }
}

/// The output's text, or the finding that says why there is none.
fn text(output: Output) -> Result<(String, String), Finding> {
    match output {
        Output::Text { text, source } => Ok((text, source)),
        Output::Skip(reason) => Err(Finding::skip(reason)),
        Output::Error(e) => Err(Finding::error(e)),
    }
}

impl AmdSmi {
    fn tool(&self, args: &[&str], param: &'static str) -> Tool<'static> {
        let mut argv = vec![self.amd_smi.display().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        Tool {
            argv,
            param,
            package: "ROCm: amd-smi-lib",
        }
    }

    async fn gpus(
        &self,
        facts: &Facts,
        args: &[&str],
        param: &'static str,
        recorded: Option<&std::path::Path>,
    ) -> Result<Vec<Gpu>, Finding> {
        let (text, source) = text(self.tool(args, param).output(recorded, facts).await)?;
        amd_smi::parse_gpus(&source, &text).map_err(Finding::error)
    }

    fn recorded(&self) -> bool {
        self.amd_smi_metric.is_some()
            || self.amd_smi_static.is_some()
            || self.amd_smi_xgmi.is_some()
            || self.amd_smi_bad_pages.is_some()
            || self.rocm_smi_json.is_some()
    }

    /// rocm-smi's XGMI view: the recording, or rocm-smi on the live node.
    async fn rocm_smi(
        &self,
        facts: &Facts,
        names: &Names,
        recorded: Option<&std::path::Path>,
    ) -> Result<Finding, Finding> {
        let tool = Tool {
            argv: ["rocm-smi", "--showxgmierr", "--showtopotype", "--json"]
                .map(String::from)
                .to_vec(),
            param: "rocm_smi_json",
            package: "ROCm: rocm-smi-lib",
        };
        let (t, source) = text(tool.output(recorded, facts).await)?;
        let r = amd_smi::parse_rocm_smi(&source, &t).map_err(Finding::error)?;
        Ok(judge_rocm_smi(&r, names, &source))
    }

    async fn xgmi(&self, facts: &Facts, names: &Names) -> Result<Finding, Finding> {
        if let Some(path) = &self.rocm_smi_json {
            return self.rocm_smi(facts, names, Some(path)).await;
        }
        let live = !self.recorded();
        // ROCm 7 prints the link state with `xgmi`; 6.4 only with `-l`;
        // before 6.4 amd-smi has none, and rocm-smi says what there is.
        let mut read = None;
        for args in [&["xgmi", "--json"][..], &["xgmi", "-l", "--json"][..]] {
            let tool = self.tool(args, "amd_smi_xgmi");
            let (t, source) = match tool.output(self.amd_smi_xgmi.as_deref(), facts).await {
                Output::Skip(_) if live => return self.rocm_smi(facts, names, None).await,
                other => text(other)?,
            };
            if let Some(x) = amd_smi::parse_xgmi(&source, &t).map_err(Finding::error)? {
                read = Some((x, source));
                break;
            }
            if !live {
                return Err(Finding::skip(format!(
                    "{source} holds no XGMI link state (amd-smi before ROCm 6.4 prints only link metrics): record `amd-smi xgmi -l --json`, or rocm-smi's view in rocm_smi_json"
                )));
            }
        }
        let Some((xgmi, source)) = read else {
            return self.rocm_smi(facts, names, None).await;
        };
        let errors = if self.amd_smi_metric.is_some() || live {
            let metric = self
                .gpus(
                    facts,
                    &["metric", "--xgmi-err", "--json"],
                    "amd_smi_metric",
                    self.amd_smi_metric.as_deref(),
                )
                .await?;
            xgmi_errors(&metric, names)
        } else {
            Vec::new()
        };
        Ok(judge_xgmi(self, &xgmi, &errors, names, &source))
    }

    async fn judge(&self, facts: &Facts, names: &Names) -> Result<Finding, Finding> {
        let metric = |args: &'static [&'static str]| {
            self.gpus(
                facts,
                args,
                "amd_smi_metric",
                self.amd_smi_metric.as_deref(),
            )
        };
        let statics = |args: &'static [&'static str]| {
            self.gpus(
                facts,
                args,
                "amd_smi_static",
                self.amd_smi_static.as_deref(),
            )
        };
        Ok(match self.subject {
            Subject::Ecc => {
                let m = metric(&["metric", "--ecc", "--ecc-blocks", "--json"]).await?;
                let mut f = judge_ecc(self, &m, names);
                if self.amd_smi_static.is_some() || !self.recorded() {
                    let s = statics(&["static", "--ras", "--json"]).await?;
                    f = with_ras_states(f, &s, names);
                }
                f
            }
            Subject::Throttle => {
                judge_throttle(&metric(&["metric", "--throttle", "--json"]).await?, names)
            }
            Subject::Pcie => {
                let m = metric(&["metric", "--pcie", "--json"]).await?;
                let s = if self.amd_smi_static.is_some() || !self.recorded() {
                    statics(&["static", "--bus", "--json"]).await?
                } else {
                    Vec::new()
                };
                judge_pcie(&m, &s, names)
            }
            Subject::Reset => {
                let pages = if self.amd_smi_bad_pages.is_some() || !self.recorded() {
                    self.gpus(
                        facts,
                        &["bad-pages", "--json"],
                        "amd_smi_bad_pages",
                        self.amd_smi_bad_pages.as_deref(),
                    )
                    .await?
                } else {
                    Vec::new()
                };
                let s = if self.amd_smi_static.is_some() || !self.recorded() {
                    statics(&["static", "--ras", "--json"]).await?
                } else {
                    Vec::new()
                };
                judge_reset(&pages, &s, names)
            }
            Subject::Xgmi => return self.xgmi(facts, names).await,
        })
    }
}

impl Probe for AmdSmi {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            let present = super::vendor_present(&facts, Vendor::Amd).await;
            if !self.recorded() && !present {
                return Finding::skip("no AMD GPU present");
            }
            let names = Names::of(&facts);
            match self.judge(&facts, &names).await {
                Ok(f) | Err(f) => f,
            }
        })
    }
}

/// The fuzz target's way in (`fuzz/`): one recording read as `subject`
/// reads it, judged with no node behind it. A GPU that counted an
/// uncorrectable error, or a link down, never makes a pass.
#[cfg(feature = "fuzzing")]
pub fn judge_for_fuzzing(which: u8, text: &str) {
    use crate::result::Status;
    let names = Names(Vec::new());
    let check = |subject| AmdSmi {
        subject,
        max_uncorrectable: 0,
        max_correctable: None,
        links: None,
        amd_smi_metric: None,
        amd_smi_static: None,
        amd_smi_xgmi: None,
        amd_smi_bad_pages: None,
        rocm_smi_json: None,
        amd_smi: default_program(),
    };
    match which % 3 {
        0 => {
            let Ok(gpus) = amd_smi::parse_gpus("f", text) else {
                return;
            };
            let ecc = judge_ecc(&check(Subject::Ecc), &gpus, &names);
            let counted = gpus.iter().any(|g| {
                g.section("ecc")
                    .and_then(|e| count(e, "total_uncorrectable_count"))
                    .is_some_and(|n| n > 0)
            });
            if counted {
                assert_ne!(ecc.status, Status::Pass, "{gpus:?}");
            }
            let _ = judge_throttle(&gpus, &names);
            let _ = judge_pcie(&gpus, &gpus, &names);
            let _ = judge_reset(&gpus, &gpus, &names);
        }
        1 => {
            let Ok(Some(xgmi)) = amd_smi::parse_xgmi("f", text) else {
                return;
            };
            let f = judge_xgmi(&check(Subject::Xgmi), &xgmi, &[], &names, "f");
            if xgmi
                .iter()
                .any(|g| g.links.iter().any(|(_, s)| *s == LinkState::Down))
            {
                assert_ne!(f.status, Status::Pass, "{xgmi:?}");
            }
        }
        _ => {
            if let Ok(r) = amd_smi::parse_rocm_smi("f", text) {
                let _ = judge_rocm_smi(&r, &names, "f");
            }
        }
    }
}
