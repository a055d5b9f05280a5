//! `preflight list`: what would run here, and why a check would not.

use clap::Args;

use super::ChecklistArgs;
use crate::report::style::ColorChoice;

use std::fmt::Write;

use serde::Serialize;

use super::{Failure, all_checks, facts, select_all};
use crate::exit::ExitCode;
use crate::report::output::write_stdout;
use crate::report::style::Style;
use crate::result::Severity;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ListFormat {
    Human,
    Json,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub checklist: ChecklistArgs,
    /// Colour: auto, always, never.
    #[arg(long, value_enum, default_value = "auto", value_name = "WHEN")]
    pub color: ColorChoice,
    #[arg(long, value_enum, default_value = "human")]
    pub format: ListFormat,
}

#[derive(Serialize)]
struct Entry<'a> {
    id: &'a str,
    kind: &'a str,
    area: &'a str,
    severity: Severity,
    tags: &'a [String],
    applies: bool,
    /// Why the check does not apply here.
    reason: Option<String>,
    source: &'a str,
    params: serde_json::Value,
}

pub fn list(args: &ListArgs) -> Result<ExitCode, Failure> {
    let checks = select_all(all_checks(&args.checklist)?, &args.checklist)?;
    let facts = facts(&args.checklist, None)?;
    let entries: Vec<Entry> = checks
        .iter()
        .map(|c| {
            let named = args.checklist.named(c);
            let reason = if c.opt_in && !named {
                Some(format!(
                    "opt-in: runs only with --only or --with {}",
                    c.tags.first().unwrap_or(&c.id)
                ))
            } else if c.evaluator() != crate::checklist::Evaluator::Node {
                // `check` never runs it; `run` does, across the nodes.
                Some("preflight run only: it compares nodes (check meets none)".to_string())
            } else {
                c.when.unmet(&facts)
            };
            Entry {
                id: &c.id,
                kind: c.kind.name,
                area: &c.area,
                severity: c.severity,
                tags: &c.tags,
                applies: reason.is_none(),
                reason,
                source: &c.source,
                params: c.probe.params(),
            }
        })
        .collect();
    let text = match args.format {
        ListFormat::Json => {
            let mut t = serde_json::to_string_pretty(&entries).unwrap_or_default();
            t.push('\n');
            t
        }
        ListFormat::Human => table(&entries, &Style::for_stdout(args.color)),
    };
    write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
    Ok(ExitCode::Ready)
}

fn table(entries: &[Entry], style: &Style) -> String {
    let rows: Vec<[String; 5]> = entries
        .iter()
        .map(|e| {
            [
                e.id.to_string(),
                e.kind.to_string(),
                match e.severity {
                    Severity::Fail => "fail".into(),
                    Severity::Warn => "warn".into(),
                },
                e.tags.join(","),
                match &e.reason {
                    None => "yes".into(),
                    Some(r) => format!("no: {r}"),
                },
            ]
        })
        .collect();
    let header = ["ID", "KIND", "SEVERITY", "TAGS", "APPLIES"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: [&str; 5]| {
        let mut l = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{:<w$}  ", cell, w = widths[i]);
            }
        }
        l
    };
    let _ = writeln!(out, "{}", style.bold(&line(header)));
    for row in &rows {
        let _ = writeln!(
            out,
            "{}",
            line([&row[0], &row[1], &row[2], &row[3], &row[4]])
        );
    }
    let applying = entries.iter().filter(|e| e.applies).count();
    let _ = writeln!(
        out,
        "\n{}, {applying} apply on this node",
        crate::values::count(entries.len(), "check")
    );
    out
}
