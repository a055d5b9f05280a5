//! `preflight report FILE|DIR...`: JSON reports of `run`, `check`, `bench`
//! or the `slurm` modes, from one node or many, merged into one cluster
//! report (HTML, Markdown or JSON). A file that is not a report is named
//! and left out with a warning; the exit code is the merged verdict's.

use std::path::PathBuf;

use clap::Args;

use super::Failure;
use super::format::{self, Format};
use preflight_ground::exit::ExitCode;
use preflight_report::input::{files, read};
use preflight_report::{self as report, Destination};
use preflight_result::merged::{self, MergedReport};

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

pub fn report(args: &ReportArgs) -> Result<ExitCode, Failure> {
    let mut warnings = Vec::new();
    let mut reports = Vec::new();
    for file in files(&args.inputs).map_err(Failure::Usage)? {
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
