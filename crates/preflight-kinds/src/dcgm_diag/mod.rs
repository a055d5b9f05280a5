//! `dcgm_diag`: NVIDIA DCGM's diagnostic (`dcgmi diag -r LEVEL -j`), each
//! failing test on each GPU reported on its own with what DCGM's error
//! severity asks for. The document is read by its structure (see
//! `parse`), whatever DCGM's version; an unknown status word, a
//! document with no results, or one cut short is never a pass.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::command::{RunError, excerpt, run_program};
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
pub mod parse;
use parse::{DiagReport, DiagResult, DiagStatus, Severity};
use preflight_facts::{Facts, GpuReport};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "dcgm_diag",
    scope: crate::Scope::Node,
    area: "accelerators",
    summary: "NVIDIA DCGM's diagnostic (`dcgmi diag -r LEVEL -j`, level 1 to 4): every failing test on every GPU, with the action DCGM's error severity asks for (monitor, isolate, triage, fix the configuration, reset). Skipped with the reason on MIG GPUs and where DCGM is not installed.",
    params: &[
        ParamDoc {
            name: "level",
            ty: "1-4",
            default: Some("1"),
            doc: "DCGM's run level: 1 quick (seconds), 2 medium (about 2 minutes), 3 long (about 15 minutes), 4 extended. The check's timeout, unless set, follows it: 2 min, 10 min, 45 min, 3 h.",
        },
        ParamDoc {
            name: "gpus",
            ty: "list of integers",
            default: Some("(every GPU)"),
            doc: "The GPU indices to test (`dcgmi diag -i`).",
        },
        ParamDoc {
            name: "dcgm_json",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `dcgmi diag -r LEVEL -j` output to read instead of running dcgmi (relative to the working directory), read as dcgmi's standard output: text before the JSON is allowed.",
        },
        ParamDoc {
            name: "nvidia_smi_xml",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `nvidia-smi -q -x`, for the MIG mode of the GPUs (unset: NVML, else nvidia-smi, on the real machine).",
        },
        ParamDoc {
            name: "dcgmi",
            ty: "path",
            default: Some("dcgmi"),
            doc: "The dcgmi program (on PATH unless a path).",
        },
    ],
    hint_vars: &["action", "severity"],
    parse: parse_params::<DcgmDiag>,
};

fn default_level() -> u8 {
    1
}

fn default_dcgmi() -> PathBuf {
    PathBuf::from("dcgmi")
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DcgmDiag {
    #[serde(default = "default_level")]
    level: u8,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    gpus: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dcgm_json: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nvidia_smi_xml: Option<PathBuf>,
    #[serde(default = "default_dcgmi")]
    dcgmi: PathBuf,
}

impl Params for DcgmDiag {
    fn validate(&self) -> Result<(), String> {
        if !(1..=4).contains(&self.level) {
            return Err(format!("`level` must be 1 to 4, found {}", self.level));
        }
        if self.dcgmi.as_os_str().is_empty() {
            return Err("`dcgmi` is empty".into());
        }
        Ok(())
    }
}

/// DCGM's output read, or why it could not be.
enum Output {
    Read(DiagReport),
    /// Nothing to read: the skip reason.
    Skip(String),
    /// Not run for want of the run's time: why, a warning.
    Short(String),
    Error(String),
}

/// What each severity asks of the operator (dcgmlib/dcgm_errors.h says
/// what each means), and how it counts.
fn judged(severity: Option<Severity>, status: &DiagStatus) -> (fn(String) -> Finding, String) {
    let triage = "triage: read DCGM's error id and run `dcgmi diag -r 3` on the node".to_string();
    match severity {
        Some(Severity::Monitor) => (
            Finding::warn,
            "monitor: the GPU works, watch it for a repeat".into(),
        ),
        Some(Severity::Isolate) => (
            Finding::fail,
            "isolate the GPU: drain the node and have the GPU serviced".into(),
        ),
        Some(Severity::Config) => (
            Finding::warn,
            "fix the node's configuration as DCGM says".into(),
        ),
        Some(Severity::Reset) => (
            Finding::fail,
            "drain the node and reset the GPU (`nvidia-smi -r -i INDEX`)".into(),
        ),
        Some(Severity::Unknown | Severity::Triage) => (Finding::fail, triage),
        // A failure with no severity (DCGM before 3.3, or severity NONE)
        // is still a failure; a warning stays a warning.
        Some(Severity::None) | None if *status == DiagStatus::Warn => (
            Finding::warn,
            "monitor: the GPU works, watch it for a repeat".into(),
        ),
        Some(Severity::None) | None => (Finding::fail, triage),
    }
}

/// How much a severity asks of the operator, least to most.
fn urgency(s: Severity) -> u8 {
    match s {
        Severity::None => 0,
        Severity::Monitor => 1,
        Severity::Config => 2,
        Severity::Unknown => 3,
        Severity::Triage => 4,
        Severity::Isolate => 5,
        Severity::Reset => 6,
    }
}

fn subject(r: &DiagResult) -> String {
    let test: String = r
        .test
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    match (r.gpu, &r.entity) {
        (Some(g), _) => format!("gpu{g}.{test}"),
        (None, Some(e)) => format!("{}.{test}", e.to_ascii_lowercase().replace(' ', "")),
        (None, None) => test,
    }
}

fn who(r: &DiagResult, report: &DiagReport) -> String {
    match (r.gpu, &r.entity) {
        (Some(g), _) => match report.serials.get(&g) {
            Some(serial) => format!("GPU {g} (serial {serial})"),
            None => format!("GPU {g}"),
        },
        (None, Some(e)) => e.clone(),
        (None, None) => "the node".to_string(),
    }
}

/// The finding for a report DCGM wrote.
pub fn judge(report: &DiagReport, level: u8) -> Finding {
    if let Some(e) = &report.runtime_error {
        if e.contains("MIG") {
            return Finding::skip(format!("DCGM does not run its diagnostic on MIG GPUs: {e}"));
        }
        return Finding::error(format!("DCGM could not run the diagnostic: {e}"));
    }
    if report.results.is_empty() {
        let said = if report.preamble.is_empty() {
            String::new()
        } else {
            format!(" (dcgmi said: {})", excerpt(&report.preamble))
        };
        return Finding::error(format!(
            "DCGM's document holds no test results and no reason{said}"
        ));
    }
    let mut finding = None::<Finding>;
    let mut parts = Vec::new();
    for r in &report.results {
        let test = match &r.category {
            Some(c) => format!("{} ({c})", r.test),
            None => r.test.clone(),
        };
        let said: Vec<&str> = r.warnings.iter().map(|w| w.text.as_str()).collect();
        let said = if said.is_empty() {
            String::new()
        } else {
            format!(": {}", said.join("; "))
        };
        let part = match &r.status {
            DiagStatus::Pass | DiagStatus::Skip | DiagStatus::NotRun => continue,
            DiagStatus::Unknown(word) => Finding::error(format!(
                "{} {test}: DCGM reported `{word}`, a status preflight does not know{said}",
                who(r, report)
            ))
            .var("action", "triage: read DCGM's output by hand"),
            status => {
                // The worst by what it asks, not by DCGM's number (CONFIG
                // is 5, ISOLATE 2): a failed remap beside persistence off
                // is the failed remap's.
                let severity = r
                    .warnings
                    .iter()
                    .filter_map(|w| w.severity)
                    .max_by_key(|s| urgency(*s));
                let unknown_number = r
                    .warnings
                    .iter()
                    .find(|w| w.severity.is_none() && w.severity_number.is_some());
                let (make, action) = match unknown_number {
                    // A severity number newer than this reader: triage.
                    Some(_) => judged(Some(Severity::Unknown), status),
                    None => judged(severity, status),
                };
                let shown = match (severity, unknown_number) {
                    (_, Some(w)) => format!("severity {}", w.severity_number.unwrap_or(-1)),
                    (Some(s), None) => s.name().to_string(),
                    (None, None) => "no severity".to_string(),
                };
                make(format!("{} {test}: {shown}{said}", who(r, report)))
                    .measured(shown.clone())
                    .var("severity", shown)
                    .var("action", action)
            }
        };
        parts.push((subject(r), part));
    }
    let versions = match (&report.dcgm_version, &report.driver_version) {
        (Some(d), Some(v)) => format!(" (DCGM {d}, driver {v})"),
        (Some(d), None) => format!(" (DCGM {d})"),
        (None, Some(v)) => format!(" (driver {v})"),
        (None, None) => String::new(),
    };
    let gpus: std::collections::BTreeSet<i64> =
        report.results.iter().filter_map(|r| r.gpu).collect();
    let skipped = report
        .results
        .iter()
        .filter(|r| matches!(r.status, DiagStatus::Skip | DiagStatus::NotRun))
        .count();
    let count = report.results.len();
    let summary = format!(
        "level {level}: {count} result{} on {} GPU{}{}{versions}",
        if count == 1 { "" } else { "s" },
        gpus.len(),
        if gpus.len() == 1 { "" } else { "s" },
        if skipped > 0 {
            format!(", {skipped} skipped")
        } else {
            String::new()
        },
    );
    if parts.is_empty() {
        let ran = report.results.iter().any(|r| r.status == DiagStatus::Pass);
        if !ran {
            return Finding::skip(format!("{summary}: no test ran (every one skipped)"));
        }
        return Finding::pass(format!("{summary}, all passed")).measured("passed");
    }
    for (subject, part) in parts {
        finding = Some(
            finding
                .unwrap_or_else(|| Finding::fail(summary.clone()))
                .part(subject, part),
        );
    }
    finding.unwrap_or_else(|| Finding::fail(summary))
}

/// The GPUs in MIG mode among those the diagnostic would test.
fn mig_gpus(report: &GpuReport, chosen: &[u32]) -> Vec<String> {
    report
        .gpus
        .iter()
        .filter(|g| g.mig_enabled == Some(true))
        .filter(|g| chosen.is_empty() || g.index.is_some_and(|i| chosen.contains(&i)))
        .map(|g| g.name())
        .collect()
}

impl DcgmDiag {
    fn argv(&self) -> Vec<String> {
        let mut argv = vec![
            self.dcgmi.display().to_string(),
            "diag".into(),
            "-r".into(),
            self.level.to_string(),
            "-j".into(),
        ];
        if !self.gpus.is_empty() {
            let ids: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
            argv.extend(["-i".into(), ids.join(",")]);
        }
        argv
    }

    async fn output(&self, facts: &Facts) -> Output {
        if let Some(path) = &self.dcgm_json {
            let path = path.clone();
            let read = tokio::task::spawn_blocking(move || {
                let shown = path.display().to_string();
                let text = preflight_facts::read_bounded(&path, parse::MAX_DOCUMENT as u64)
                    .map_err(|e| format!("cannot read {shown}: {e}"))?;
                parse::parse(&text).map_err(|e| format!("{shown}: {e}"))
            })
            .await
            .unwrap_or_else(|e| Err(format!("reading the recording crashed: {e}")));
            return match read {
                Ok(r) => Output::Read(r),
                Err(e) => Output::Error(e),
            };
        }
        if !facts.is_live() {
            return Output::Skip(
                "no DCGM output under --root: set dcgm_json to a recorded `dcgmi diag -r LEVEL -j`"
                    .into(),
            );
        }
        // DCGM's levels take what they take: one that cannot end before
        // the run's deadline is not started, rather than cut off there
        // with nothing to show.
        let argv = self.argv();
        let installed = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(&argv[0]).is_file()));
        if installed && let Some(why) = too_short(facts.time_left(REPORT_MARGIN), self.level) {
            return Output::Short(why);
        }
        let ran = match run_program(&argv, parse::MAX_DOCUMENT).await {
            Ok(ran) => ran,
            Err(RunError::NotFound) => {
                return Output::Skip(format!(
                    "{} is not installed (NVIDIA DCGM: datacenter-gpu-manager)",
                    argv[0]
                ));
            }
            Err(RunError::Failed(e)) => return Output::Error(e),
        };
        match parse::parse(&ran.stdout) {
            // dcgmi exits non-zero with a valid document when a test
            // fails (226, 205): the document decides.
            Ok(r) => Output::Read(r),
            Err(e) => {
                let said = format!("{}\n{}", ran.stdout.trim(), ran.stderr.trim());
                let lower = said.to_ascii_lowercase();
                let what = excerpt(said.trim());
                if lower.contains("host engine") || lower.contains("establish a connection") {
                    Output::Skip(format!(
                        "DCGM's host engine (nv-hostengine) cannot be reached or started: {what}"
                    ))
                } else {
                    Output::Error(format!(
                        "`{}` ({}): {e}: {what}",
                        argv.join(" "),
                        ran.status
                    ))
                }
            }
        }
    }
}

/// Kept of the run's time to report in.
const REPORT_MARGIN: Duration = Duration::from_secs(3);

/// About how long each level runs (NVIDIA's DCGM documentation: level 1
/// seconds, 2 about two minutes, 3 about fifteen, 4 an hour or more).
fn typical_time(level: u8) -> Duration {
    Duration::from_secs(match level {
        1 => 20,
        2 => 120,
        3 => 15 * 60,
        _ => 3600,
    })
}

/// Why `level` is not started with `left` of the run's time; `None`
/// where it fits (or no deadline is known).
fn too_short(left: Option<Duration>, level: u8) -> Option<String> {
    let left = left?;
    let typical = typical_time(level);
    (left < typical).then(|| {
        format!(
            "not started: the run has {} left, and DCGM's level {level} takes about {}: give the run a longer --timeout, or run it between jobs (`preflight check --only` this check)",
            preflight_ground::values::format_duration(left),
            preflight_ground::values::format_duration(typical)
        )
    })
}

/// DCGM runs one diagnostic at a time and refuses a second ("already
/// running"): the checks of one run that would start dcgmi take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Probe for DcgmDiag {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            let _turn = if self.dcgm_json.is_none() {
                Some(ONE_AT_A_TIME.lock().await)
            } else {
                None
            };
            if self.dcgm_json.is_none() && !super::nvidia_present(&facts).await {
                return Finding::skip("no NVIDIA GPU present");
            }
            let gpus = if self.nvidia_smi_xml.is_some() || self.dcgm_json.is_none() {
                facts.gpu_report(self.nvidia_smi_xml.as_deref()).await
            } else {
                None
            };
            if let Some(Ok(report)) = &gpus {
                let mig = mig_gpus(report, &self.gpus);
                if !mig.is_empty() {
                    return Finding::skip(format!(
                        "MIG mode is enabled on {}: dcgmi diag does not run on MIG GPUs",
                        mig.join(", ")
                    ));
                }
            }
            match self.output(&facts).await {
                Output::Read(report) => judge(&report, self.level),
                Output::Skip(reason) => Finding::skip(reason),
                Output::Short(why) => Finding::warn(why),
                Output::Error(e) => Finding::error(e),
            }
        })
    }

    fn default_timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(match self.level {
            1 => 120,
            2 => 600,
            3 => 45 * 60,
            _ => 3 * 3600,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_longer_than_the_run_has_left_is_not_started() {
        let short = too_short(Some(Duration::from_secs(50)), 2).unwrap();
        assert!(
            short.starts_with(
                "not started: the run has 50s left, and DCGM's level 2 takes about 2m"
            ),
            "{short}"
        );
        assert_eq!(too_short(Some(Duration::from_secs(50)), 1), None);
        assert_eq!(too_short(None, 4), None);
    }

    #[test]
    fn argv_names_level_and_gpus() {
        let d = DcgmDiag {
            level: 3,
            gpus: vec![0, 5],
            dcgm_json: None,
            nvidia_smi_xml: None,
            dcgmi: default_dcgmi(),
        };
        assert_eq!(d.argv().join(" "), "dcgmi diag -r 3 -j -i 0,5");
        assert_eq!(d.default_timeout(), Some(Duration::from_secs(2700)));
    }

    /// Several warnings on one result: the worst by what it asks, and a
    /// document where every test was skipped is no pass.
    #[test]
    fn the_worst_warning_decides_and_skips_alone_pass_nothing() {
        use preflight_result::Status;
        let doc = r#"{"DCGM Diagnostic":{"test_categories":[{"category":"Deployment","tests":[{"name":"software","results":[
            {"entity_group":"GPU","entity_id":0,"status":"Fail","warnings":[
              {"error_severity":2,"warning":"row remap failed"},{"error_severity":5,"warning":"persistence off"}]}]}]}]}}"#;
        let f = judge(&parse::parse(doc).unwrap(), 1);
        let parts = &f.extra.as_ref().unwrap().parts;
        assert_eq!(parts[0].1.status, Status::Fail);
        assert!(
            parts[0].1.message.contains("ISOLATE"),
            "{}",
            parts[0].1.message
        );
        let skipped = r#"{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[{"name":"memory","results":[
            {"entity_id":0,"status":"Skip"}]}]}]}}"#;
        assert_eq!(
            judge(&parse::parse(skipped).unwrap(), 1).status,
            Status::Skip
        );
        // A document cut short and followed by dcgmi's words is an error,
        // never an inner object read as the whole.
        let cut = "{\n \"DCGM Diagnostic\" : {\n  \"test_categories\" : [ {\n   \"category\" : \"Deployment\", \"tests\" : [ { \"name\" : \"software\", \"results\" : [ { \"entity_id\" : 0, \"status\" : \"Pass\" } ] } ] },\n   { \"category\" : \"Hard\nError: dcgmi was terminated\n";
        assert!(
            parse::parse(cut)
                .unwrap_err()
                .contains("cut short or invalid")
        );
        // A statusless result naming another GPU is not merged away.
        let merged = r#"{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[{"name":"memory","results":[
            {"entity_id":0,"status":"Pass"},{"entity_id":1,"warnings":[{"warning":"bad","error_severity":2}]}]}]}]}}"#;
        assert_ne!(
            judge(&parse::parse(merged).unwrap(), 1).status,
            Status::Pass
        );
        // A test with no result and no summary is not a pass either.
        let silent = r#"{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[{"name":"memory"}]}]}}"#;
        assert_ne!(
            judge(&parse::parse(silent).unwrap(), 1).status,
            Status::Pass
        );
    }

    #[test]
    fn every_severity_has_its_status_and_action() {
        use preflight_result::Status;
        let f = |s| {
            let (make, action) = judged(s, &DiagStatus::Fail);
            (make(String::new()).status, action)
        };
        assert_eq!(f(Some(Severity::Monitor)).0, Status::Warn);
        assert_eq!(f(Some(Severity::Isolate)).0, Status::Fail);
        assert_eq!(f(Some(Severity::Unknown)).0, Status::Fail);
        assert!(f(Some(Severity::Triage)).1.starts_with("triage"));
        assert_eq!(f(Some(Severity::Config)).0, Status::Warn);
        assert!(f(Some(Severity::Reset)).1.contains("reset the GPU"));
        assert_eq!(f(None).0, Status::Fail);
    }
}
