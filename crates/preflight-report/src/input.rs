//! Reports read back: the JSON reports of `run`, `check`, `bench` or the
//! `slurm` modes, for `preflight report` and `baseline capture --from`.
//! Bounded in size; a file that is not one of this version's reports says
//! what it is instead.

use std::path::{Path, PathBuf};

use preflight_result::merged;
use preflight_result::report::{Report, SCHEMA};

/// The largest report read: rank 0's report of a very large job is tens
/// of megabytes; anything far beyond is not a report.
const MAX_BYTES: u64 = 512 << 20;

/// Files as named, and every *.json of a named directory, in name order.
pub fn files(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for input in inputs {
        let meta = std::fs::metadata(input).map_err(|e| format!("{}: {e}", input.display()))?;
        if !meta.is_dir() {
            out.push(input.clone());
            continue;
        }
        let entries = std::fs::read_dir(input).map_err(|e| format!("{}: {e}", input.display()))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
            .collect();
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// One report, or why it is not one.
pub fn read(path: &Path) -> Result<Report, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.len() > MAX_BYTES {
        return Err(format!(
            "{} bytes, more than a report ({} MiB at most)",
            meta.len(),
            MAX_BYTES >> 20
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
    let schema = value
        .get("schema")
        .and_then(|s| s.as_str())
        .unwrap_or_default();
    match schema {
        SCHEMA => serde_json::from_value(value).map_err(|e| {
            format!("a {SCHEMA} document with a field this preflight cannot read: {e}")
        }),
        merged::SCHEMA => Err(format!(
            "a merged report ({schema}): give the reports it was made from"
        )),
        s if s.starts_with("preflight.report/") => Err(format!(
            "schema {s}: written by another preflight version; this one reads {SCHEMA}"
        )),
        "" => Err("not a preflight report (no `schema`)".into()),
        s => Err(format!("not a preflight report (schema {s})")),
    }
}
