//! `preflight report FILE|DIR...`: JSON reports of `run`, `check`, `bench`
//! or the `slurm` modes, from one node or many, merged into one cluster
//! report (HTML, Markdown or JSON). A file that is not a report is named
//! and left out with a warning; the exit code is the merged verdict's.

use std::path::{Path, PathBuf};

use clap::Args;

use super::Failure;
use super::format::{self, Format};
use preflight_ground::exit::ExitCode;
use preflight_report::{self as report, Destination};
use preflight_result::merged::{self, MergedReport};
use preflight_result::report::{Report, SCHEMA};

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// JSON reports (`--format json` of run, check, bench or a slurm
    /// mode), or directories of them (every *.json in it).
    #[arg(value_name = "FILE|DIR", required = true)]
    pub inputs: Vec<PathBuf>,
    #[arg(long, value_parser = format::parser(format::REPORT), default_value = "markdown")]
    pub format: Format,
    /// Write to FILE (atomically) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// The largest report read: rank 0's report of a very large job is tens
/// of megabytes; anything far beyond is not a report.
const MAX_BYTES: u64 = 512 << 20;

pub fn report(args: &ReportArgs) -> Result<ExitCode, Failure> {
    let mut warnings = Vec::new();
    let mut reports = Vec::new();
    for file in files(&args.inputs)? {
        match read(&file) {
            Ok(r) => reports.push((file.display().to_string(), r)),
            Err(why) => {
                let w = format!("{}: left out: {why}", file.display());
                eprintln!("preflight report: warning: {w}");
                warnings.push(w);
            }
        }
    }
    if reports.is_empty() {
        return Err(Failure::Usage(format!(
            "no report could be read from {}",
            args.inputs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let merged = merged::merge(reports, warnings);
    let text = render(&merged, args.format);
    let destination = match &args.output {
        Some(p) => Destination::File(p.clone()),
        None => Destination::Stdout,
    };
    report::write_report(&destination, &text).map_err(|e| {
        let place = args
            .output
            .as_ref()
            .map_or("stdout".to_string(), |p| p.display().to_string());
        Failure::Usage(format!("cannot write the report to {place}: {e}"))
    })?;
    Ok(merged.verdict.exit_code())
}

pub fn render(merged: &MergedReport, format: Format) -> String {
    match format {
        Format::Html => report::html(merged),
        Format::Json => {
            let mut text = serde_json::to_string_pretty(merged)
                .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
            text.push('\n');
            text
        }
        // Markdown; `--format` takes no other (`format::REPORT`).
        _ => report::markdown(merged),
    }
}

/// Files as named, and every *.json of a named directory, in name order.
pub(super) fn files(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, Failure> {
    let mut out = Vec::new();
    for input in inputs {
        let meta = std::fs::metadata(input)
            .map_err(|e| Failure::Usage(format!("{}: {e}", input.display())))?;
        if !meta.is_dir() {
            out.push(input.clone());
            continue;
        }
        let entries = std::fs::read_dir(input)
            .map_err(|e| Failure::Usage(format!("{}: {e}", input.display())))?;
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
pub(super) fn read(path: &Path) -> Result<Report, String> {
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
