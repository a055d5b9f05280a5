//! What `dcgmi diag -r LEVEL -j` printed, read by structure rather than by
//! version: DCGM's JSON has no stable schema, and the version number does
//! not say the shape.
//!
//! The shapes in the field (read from NVIDIA/DCGM's `dcgmi/Diag.cpp` at
//! every release, and from captures):
//! - DCGM 4: `{"DCGM Diagnostic": {"test_categories": [{"category",
//!   "tests": [{"name", "results": [{"entity_group", "entity_group_id",
//!   "entity_id", "status", "warnings": [{"error_category", "error_id",
//!   "error_severity", "warning"}], "info": [..]}], "test_summary"}]}]},
//!   "entity_groups": [{"entities": [{"entity_id", "serial_num"}]}],
//!   "metadata": {"version", "Driver Version Detected"}}`.
//! - DCGM 3.3: the key `DCGM GPU Diagnostic`; `gpu_id` a string, or an
//!   integer (-1: every GPU) in the Deployment tests; from 3.3.3 the text
//!   of a Deployment warning under `warnings` (sic); `info` a string;
//!   `null` holes in `results`; the versions and `GPU Device Serials` at
//!   the top.
//! - DCGM 2 to 3.2: `gpu_ids` a string, `warnings` a string.
//! - nvvs run on its own: upper-case statuses, `gpu_ids` "0,1".
//! - Some builds put `tests` at the top level; `--iterations` wraps the
//!   documents in `{"iterations": [...]}`.
//! - A document that says only `runtime_error` (the diagnostic did not
//!   run), text before the JSON, and a document cut short.
//!
//! An unknown status word is kept as it is, never read as a pass.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// The largest document read: an 8-GPU level 4 run is tens of KiB.
pub const MAX_DOCUMENT: usize = 16 * 1024 * 1024;
/// Places where a document may start that are tried before giving up.
const MAX_STARTS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiagStatus {
    Pass,
    Skip,
    Warn,
    Fail,
    NotRun,
    /// A word this reader does not know, as DCGM wrote it.
    Unknown(String),
}

impl DiagStatus {
    fn parse(word: &str) -> DiagStatus {
        match word.trim().to_ascii_lowercase().as_str() {
            "pass" | "passed" => DiagStatus::Pass,
            "skip" | "skipped" => DiagStatus::Skip,
            "warn" | "warning" => DiagStatus::Warn,
            "fail" | "failed" => DiagStatus::Fail,
            "not run" | "not_run" | "notrun" => DiagStatus::NotRun,
            _ => DiagStatus::Unknown(word.to_string()),
        }
    }
}

/// `dcgmError_t`'s severity (dcgmlib/dcgm_errors.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    None = 0,
    Monitor = 1,
    Isolate = 2,
    Unknown = 3,
    Triage = 4,
    Config = 5,
    Reset = 6,
}

impl Severity {
    pub fn from_number(n: i64) -> Option<Severity> {
        Some(match n {
            0 => Severity::None,
            1 => Severity::Monitor,
            2 => Severity::Isolate,
            3 => Severity::Unknown,
            4 => Severity::Triage,
            5 => Severity::Config,
            6 => Severity::Reset,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Severity::None => "NONE",
            Severity::Monitor => "MONITOR",
            Severity::Isolate => "ISOLATE",
            Severity::Unknown => "UNKNOWN",
            Severity::Triage => "TRIAGE",
            Severity::Config => "CONFIG",
            Severity::Reset => "RESET",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Warning {
    /// `None`: DCGM gave no severity (before 3.3), or a number this reader
    /// does not know (kept in `severity_number`).
    pub severity: Option<Severity>,
    pub severity_number: Option<i64>,
    pub category: Option<i64>,
    pub error_id: Option<i64>,
    pub text: String,
}

/// One test's result on one entity (or on the whole system).
#[derive(Debug, Clone, PartialEq)]
pub struct DiagResult {
    pub category: Option<String>,
    pub test: String,
    /// The GPU's index; `None` for a result about the whole system.
    pub gpu: Option<i64>,
    /// Other entities DCGM tests (a CPU, a switch), by group and id.
    pub entity: Option<String>,
    pub status: DiagStatus,
    pub warnings: Vec<Warning>,
    pub info: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiagReport {
    pub dcgm_version: Option<String>,
    pub driver_version: Option<String>,
    /// DCGM could not run the diagnostic, in its words.
    pub runtime_error: Option<String>,
    pub results: Vec<DiagResult>,
    /// GPU serial numbers by index, where DCGM gave them.
    pub serials: BTreeMap<i64, String>,
    /// Text printed before the document (a connection error, a banner).
    pub preamble: String,
}

/// Reads dcgmi's standard output. `Err`: no JSON document in it, or one
/// cut short, with what was found.
pub fn parse(text: &str) -> Result<DiagReport, String> {
    if text.len() > MAX_DOCUMENT {
        return Err(format!(
            "the output is {} bytes, more than the {} a diagnostic document can be",
            text.len(),
            MAX_DOCUMENT
        ));
    }
    let (start, doc) = first_document(text)?;
    let preamble = text[..start].trim().to_string();
    let mut report = DiagReport {
        preamble,
        ..DiagReport::default()
    };
    let Value::Object(top) = doc else {
        return Err("the JSON is not an object".into());
    };
    match top.get("iterations") {
        Some(Value::Array(docs)) => {
            for d in docs {
                if let Value::Object(d) = d {
                    read_document(d, &mut report);
                }
            }
        }
        _ => read_document(&top, &mut report),
    }
    Ok(report)
}

/// The first JSON object in the text, and where it starts. Text before it
/// (dcgmi's connection errors, banners) and after it is allowed; a
/// document that starts and does not end is an error, never one of the
/// complete objects inside it taken for the whole.
fn first_document(text: &str) -> Result<(usize, Value), String> {
    for (tried, (at, _)) in text.match_indices('{').enumerate() {
        if tried == MAX_STARTS {
            break;
        }
        let mut stream = serde_json::Deserializer::from_str(&text[at..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v @ Value::Object(_))) => return Ok((at, v)),
            Some(Err(e)) if e.is_eof() => {
                return Err(format!("the JSON document is cut short ({e})"));
            }
            // A start that read past its own line was a document, broken
            // (cut short and followed by other text, or garbled): never
            // look inside it for a smaller object to take instead. A brace
            // in a banner line fails on that line.
            Some(Err(e)) if e.line() > 1 => {
                return Err(format!("the JSON document is cut short or invalid ({e})"));
            }
            _ => {}
        }
    }
    Err("no JSON document in the output".to_string())
}

fn text_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn int_of(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn read_document(top: &Map<String, Value>, report: &mut DiagReport) {
    let body = ["DCGM Diagnostic", "DCGM GPU Diagnostic"]
        .iter()
        .find_map(|k| top.get(*k).and_then(Value::as_object))
        .unwrap_or(top);
    let metadata = top.get("metadata").and_then(Value::as_object);
    let version = metadata
        .and_then(|m| text_of(m.get("version")))
        .or_else(|| text_of(top.get("version")))
        .or_else(|| text_of(body.get("version")));
    report.dcgm_version = report.dcgm_version.take().or(version);
    let driver = metadata
        .and_then(|m| text_of(m.get("Driver Version Detected")))
        .or_else(|| text_of(top.get("Driver Version Detected")))
        .or_else(|| text_of(body.get("Driver Version Detected")));
    report.driver_version = report.driver_version.take().or(driver);
    if let Some(e) =
        text_of(body.get("runtime_error")).or_else(|| text_of(top.get("runtime_error")))
    {
        report.runtime_error = Some(e);
    }
    read_serials(top, body, report);
    if let Some(Value::Array(categories)) = body.get("test_categories") {
        for c in categories.iter().filter_map(Value::as_object) {
            let name = text_of(c.get("category"));
            if let Some(Value::Array(tests)) = c.get("tests") {
                for t in tests.iter().filter_map(Value::as_object) {
                    read_test(name.as_deref(), t, report);
                }
            }
        }
    }
    if let Some(Value::Array(tests)) = body.get("tests") {
        for t in tests.iter().filter_map(Value::as_object) {
            read_test(None, t, report);
        }
    }
}

fn read_serials(top: &Map<String, Value>, body: &Map<String, Value>, report: &mut DiagReport) {
    if let Some(Value::Array(groups)) = top.get("entity_groups") {
        for g in groups.iter().filter_map(Value::as_object) {
            let is_gpu = text_of(g.get("entity_group")).is_none_or(|n| n == "GPU");
            let Some(Value::Array(entities)) = g.get("entities") else {
                continue;
            };
            for e in entities
                .iter()
                .filter_map(Value::as_object)
                .filter(|_| is_gpu)
            {
                if let (Some(id), Some(serial)) =
                    (int_of(e.get("entity_id")), text_of(e.get("serial_num")))
                    && !serial.starts_with("<<<")
                {
                    report.serials.insert(id, serial);
                }
            }
        }
    }
    for m in [top, body] {
        if let Some(Value::Object(serials)) = m.get("GPU Device Serials") {
            for (id, serial) in serials {
                if let (Ok(id), Some(serial)) = (id.parse::<i64>(), text_of(Some(serial))) {
                    report.serials.insert(id, serial);
                }
            }
        }
    }
}

fn warnings_of(result: &Map<String, Value>) -> Vec<Warning> {
    let mut out = Vec::new();
    match result.get("warnings") {
        Some(Value::String(text)) if !text.trim().is_empty() => out.push(Warning {
            severity: None,
            severity_number: None,
            category: None,
            // 3.2 put the id beside the text.
            error_id: int_of(result.get("error_id")),
            text: text.trim().to_string(),
        }),
        Some(Value::Array(list)) => {
            for w in list {
                match w {
                    Value::Object(w) => {
                        let number = int_of(w.get("error_severity"));
                        out.push(Warning {
                            severity: number.and_then(Severity::from_number),
                            severity_number: number,
                            category: int_of(w.get("error_category")),
                            error_id: int_of(w.get("error_id")),
                            // 3.3.3 to 3.3.9 wrote the text under `warnings`.
                            text: text_of(w.get("warning"))
                                .or_else(|| text_of(w.get("warnings")))
                                .unwrap_or_default(),
                        });
                    }
                    Value::String(text) if !text.trim().is_empty() => out.push(Warning {
                        severity: None,
                        severity_number: None,
                        category: None,
                        error_id: None,
                        text: text.trim().to_string(),
                    }),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    out
}

fn info_of(result: &Map<String, Value>) -> Vec<String> {
    match result.get("info") {
        Some(Value::String(s)) if !s.trim().is_empty() => vec![s.trim().to_string()],
        Some(Value::Array(list)) => list.iter().filter_map(|v| text_of(Some(v))).collect(),
        _ => Vec::new(),
    }
}

/// The GPU a result is about: `entity_id` (DCGM 4, GPU group), `gpu_id`
/// (3.3; -1 is every GPU), `gpu_ids` (earlier, and nvvs: one id, or a list
/// for a test of the whole system). Other entities are named instead.
fn subject(result: &Map<String, Value>) -> (Option<i64>, Option<String>) {
    if let Some(id) = int_of(result.get("entity_id")) {
        let group = text_of(result.get("entity_group"));
        let group_id = int_of(result.get("entity_group_id"));
        let is_gpu = match (&group, group_id) {
            (Some(g), _) => g == "GPU",
            (None, Some(n)) => n == 1,
            (None, None) => true,
        };
        return if is_gpu {
            (Some(id), None)
        } else {
            let group = group.unwrap_or_else(|| format!("group {}", group_id.unwrap_or(-1)));
            (None, Some(format!("{group} {id}")))
        };
    }
    if let Some(id) = int_of(result.get("gpu_id")) {
        return ((id >= 0).then_some(id), None);
    }
    if let Some(ids) = text_of(result.get("gpu_ids")) {
        let list: Vec<&str> = ids
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if let [one] = list.as_slice()
            && let Ok(id) = one.parse::<i64>()
        {
            return ((id >= 0).then_some(id), None);
        }
        return (None, None);
    }
    if let Some(cpu) = text_of(result.get("cpu_id")) {
        return (None, Some(format!("CPU {cpu}")));
    }
    (None, None)
}

fn read_test(category: Option<&str>, test: &Map<String, Value>, report: &mut DiagReport) {
    let name = text_of(test.get("name")).unwrap_or_else(|| "(unnamed test)".into());
    let first = report.results.len();
    if let Some(Value::Array(results)) = test.get("results") {
        for r in results.iter().filter_map(Value::as_object) {
            let warnings = warnings_of(r);
            let (gpu, entity) = subject(r);
            let status = match r.get("status") {
                Some(Value::String(word)) => DiagStatus::parse(word),
                Some(other) => DiagStatus::Unknown(other.to_string()),
                // 3.3.1 wrote a Deployment test's further errors as
                // results with no status and no subject of their own: they
                // belong to the one before. One naming another GPU does not.
                None => {
                    let own = gpu.is_none() && entity.is_none();
                    let prev = report.results[first..]
                        .last_mut()
                        .filter(|p| own || (p.gpu, &p.entity) == (gpu, &entity));
                    match prev {
                        Some(prev) => {
                            prev.warnings.extend(warnings);
                            continue;
                        }
                        None if warnings.is_empty() => continue,
                        None => DiagStatus::Unknown("no status".into()),
                    }
                }
            };
            report.results.push(DiagResult {
                category: category.map(String::from),
                test: name.clone(),
                gpu,
                entity,
                status,
                warnings,
                info: info_of(r),
            });
        }
    }
    // The summary says what no entity's result says: the test's overall
    // status where it has no results, and (before DCGM 4.5) its errors
    // that belong to no entity. From 4.5 it repeats every entity's
    // errors: those already read are not counted twice.
    let summary = test.get("test_summary").and_then(Value::as_object);
    if summary.is_none() && report.results.len() == first {
        // A test that names itself and says nothing: not a pass.
        report.results.push(DiagResult {
            category: category.map(String::from),
            test: name,
            gpu: None,
            entity: None,
            status: DiagStatus::Unknown("no result and no summary".into()),
            warnings: Vec::new(),
            info: Vec::new(),
        });
        return;
    }
    if let Some(summary) = summary {
        let status = match summary.get("status") {
            Some(Value::String(word)) => Some(DiagStatus::parse(word)),
            Some(other) => Some(DiagStatus::Unknown(other.to_string())),
            None if !warnings_of(summary).is_empty() => {
                Some(DiagStatus::Unknown("no status".into()))
            }
            None => None,
        };
        let seen: Vec<String> = report.results[first..]
            .iter()
            .flat_map(|r| r.warnings.iter().map(|w| w.text.clone()))
            .collect();
        let warnings: Vec<Warning> = warnings_of(summary)
            .into_iter()
            .filter(|w| !seen.contains(&w.text))
            .collect();
        let none_read = report.results.len() == first;
        // A summary that failed where no result failed is not passed over
        // (a result's warning is not the failure the summary says).
        let failed = |s: &DiagStatus| matches!(s, DiagStatus::Fail | DiagStatus::Unknown(_));
        let unexplained = status.as_ref().is_some_and(failed)
            && !report.results[first..].iter().any(|r| failed(&r.status));
        if let Some(status) = status
            && (none_read || !warnings.is_empty() || unexplained)
        {
            report.results.push(DiagResult {
                category: category.map(String::from),
                test: name,
                gpu: None,
                entity: None,
                status,
                warnings,
                info: info_of(summary),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dcgm4_with_a_failing_gpu_and_a_config_warning() {
        let doc = r#"{"DCGM Diagnostic":{"test_categories":[
          {"category":"Deployment","tests":[{"name":"software","results":[
            {"entity_group":"GPU","entity_group_id":1,"entity_id":0,"status":"Fail",
             "warnings":[{"error_category":8,"error_id":29,"error_severity":5,"warning":"Persistence mode for GPU 0 is disabled."}]}],
            "test_summary":{"status":"Fail"}}]},
          {"category":"Hardware","tests":[{"name":"memory","results":[
            {"entity_group":"GPU","entity_group_id":1,"entity_id":0,"status":"Pass"},
            {"entity_group":"GPU","entity_group_id":1,"entity_id":1,"status":"Fail","info":["a","b"],
             "warnings":[{"error_category":10,"error_id":19,"error_severity":2,"warning":"GPU 1 bad memory"}]}],
            "test_summary":{"status":"Fail","warnings":[{"error_category":10,"error_id":19,"error_severity":2,"warning":"GPU 1 bad memory"}]}}]}]},
          "entity_groups":[{"entity_group":"GPU","entity_group_id":1,"entities":[{"entity_id":0,"serial_num":"1650"},{"entity_id":1,"serial_num":"<<<NOT_SUPPORTED>>>"}]}],
          "metadata":{"version":"4.5.0","Driver Version Detected":"580.82.09"}}"#;
        let r = parse(doc).unwrap();
        assert_eq!(r.dcgm_version.as_deref(), Some("4.5.0"));
        assert_eq!(r.driver_version.as_deref(), Some("580.82.09"));
        assert_eq!(r.serials.get(&0).map(String::as_str), Some("1650"));
        assert!(!r.serials.contains_key(&1));
        // The summary's repeat of GPU 1's error is not a fourth result.
        assert_eq!(r.results.len(), 3, "{:#?}", r.results);
        let mem = &r.results[2];
        assert_eq!((mem.test.as_str(), mem.gpu), ("memory", Some(1)));
        assert_eq!(mem.status, DiagStatus::Fail);
        assert_eq!(mem.warnings[0].severity, Some(Severity::Isolate));
        assert_eq!(mem.info, ["a", "b"]);
        assert_eq!(r.results[0].warnings[0].severity, Some(Severity::Config));
    }

    #[test]
    fn dcgm3_quirks_null_holes_int_and_string_ids_and_the_plural_key() {
        let doc = r#"
WARNING: something printed first
{"DCGM GPU Diagnostic":{"test_categories":[
  {"category":"Deployment","tests":[{"name":"Persistence Mode","results":[
     {"gpu_id":-1,"status":"Fail","warnings":[{"error_category":8,"error_id":29,"error_severity":5,"warnings":"persistence off"}]}]}]},
  {"category":"Stress","tests":[{"name":"Targeted Stress","results":[null,{"gpu_id":"1","status":"PASS","info":"fine"}]}]}]},
 "Driver Version Detected":"535.104.05","GPU Device Serials":{"0":"s0","1":"s1"},"version":"3.3.9"}
trailing"#;
        let r = parse(doc).unwrap();
        assert_eq!(r.preamble, "WARNING: something printed first");
        assert_eq!(r.dcgm_version.as_deref(), Some("3.3.9"));
        assert_eq!(r.results.len(), 2);
        assert_eq!(r.results[0].gpu, None);
        assert_eq!(r.results[0].warnings[0].text, "persistence off");
        assert_eq!(r.results[1].gpu, Some(1));
        assert_eq!(r.results[1].status, DiagStatus::Pass);
        assert_eq!(r.serials.get(&1).map(String::as_str), Some("s1"));
    }

    #[test]
    fn older_string_warnings_gpu_ids_and_statusless_results() {
        let doc = r#"{"DCGM GPU Diagnostic":{"test_categories":[{"category":"Hardware","tests":[
            {"name":"GPU Memory","results":[{"gpu_ids":"2","status":"Fail","warnings":"GPU 2 failed","error_id":19}]},
            {"name":"Denylist","results":[{"status":"Fail","warnings":[{"warning":"first"}]},{"warnings":[{"warning":"second"}]}]},
            {"name":"Software","results":[{"gpu_ids":"0,1","status":"Skipped"}]}]}]}}"#;
        let r = parse(doc).unwrap();
        assert_eq!(r.results[0].gpu, Some(2));
        assert_eq!(r.results[0].warnings[0].error_id, Some(19));
        assert_eq!(r.results[0].warnings[0].severity, None);
        assert_eq!(r.results[1].warnings.len(), 2);
        assert_eq!(
            (r.results[2].gpu, &r.results[2].status),
            (None, &DiagStatus::Skip)
        );
    }

    /// A test whose summary failed while every result passed (an error
    /// of no entity, its words lost) fails: never a pass.
    #[test]
    fn a_failed_summary_over_passing_results_is_a_failure() {
        let doc = r#"{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[
            {"name":"memory","results":[{"entity_id":0,"status":"Pass"}],"test_summary":{"status":"Fail"}}]}]}}"#;
        let r = parse(doc).unwrap();
        assert_eq!(r.results.len(), 2);
        assert_eq!(
            (r.results[1].gpu, &r.results[1].status),
            (None, &DiagStatus::Fail)
        );
    }

    #[test]
    fn top_level_tests_iterations_and_other_entities() {
        let doc = r#"{"iterations":[
            {"tests":[{"name":"pcie","results":[{"entity_id":0,"status":"Pass"}]}]},
            {"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[{"name":"cpu_eud","results":[
                {"entity_group":"CPU","entity_group_id":7,"entity_id":0,"status":"Degraded"}]}]}]}}]}"#;
        let r = parse(doc).unwrap();
        assert_eq!(r.results.len(), 2);
        assert_eq!(r.results[1].entity.as_deref(), Some("CPU 0"));
        assert_eq!(r.results[1].status, DiagStatus::Unknown("Degraded".into()));
    }

    #[test]
    fn runtime_errors_truncation_and_no_json() {
        let r = parse(r#"{"DCGM Diagnostic":{"runtime_error":"Error: Unable to complete diagnostic for group 0.","version":"4.2.3"}}"#).unwrap();
        assert_eq!(
            r.runtime_error.as_deref(),
            Some("Error: Unable to complete diagnostic for group 0.")
        );
        assert!(r.results.is_empty());
        let cut = parse(r#"{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tes"#)
            .unwrap_err();
        assert!(cut.contains("cut short"), "{cut}");
        // Cut after a complete result: that inner object is not the document.
        let cut = parse(r#"{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[{"name":"memory","results":[{"entity_id":0,"status":"Pass"},"#).unwrap_err();
        assert!(cut.contains("cut short"), "{cut}");
        let none = parse("Error: Unable to start an embedded host engine.").unwrap_err();
        assert_eq!(none, "no JSON document in the output");
        // A summary without results still speaks.
        let s = parse(r#"{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[{"name":"memory","test_summary":{"status":"Fail","warnings":[{"warning":"no GPU ran","error_severity":4}]}}]}]}}"#).unwrap();
        assert_eq!(s.results[0].status, DiagStatus::Fail);
        assert_eq!(s.results[0].warnings[0].severity, Some(Severity::Triage));
    }
}
