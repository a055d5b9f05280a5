//! The checklist as `preflight list` shows it: each check and built-in
//! result, whether it applies here and why not, and what the figures
//! count.

use std::fmt::Write;

use serde::Serialize;

use crate::style::Style;
use preflight_result::Severity;

/// One line of the list: a check, or a result the stages print
/// themselves, and whether it applies here.
#[derive(Debug, Serialize)]
pub struct Entry<'a> {
    pub id: &'a str,
    pub kind: &'a str,
    pub area: &'a str,
    pub severity: Severity,
    pub tags: Vec<String>,
    pub applies: bool,
    /// Why the check does not apply here.
    pub reason: Option<String>,
    pub source: &'a str,
    pub params: serde_json::Value,
}

/// What `list` counts, so its figures and `check`'s or `run`'s agree.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    pub on_each_node: usize,
    pub opt_in: usize,
    pub applying: usize,
    pub across_nodes: usize,
    pub built_in: usize,
}

/// The list as a table, the counts under it.
pub fn table(entries: &[Entry], counts: &Counts, style: &Style) -> String {
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
    // What each figure counts, so it can be set beside `check`'s header
    // (the checks on each node less the opt-in ones) and `run`'s.
    let c = counts;
    let _ = write!(
        out,
        "\n{}: {} on each node ({} of them by `check`, {} opt-in; {} apply here), {} across nodes (`run` only)",
        preflight_ground::values::count(c.on_each_node + c.across_nodes, "check"),
        c.on_each_node,
        c.on_each_node - c.opt_in,
        c.opt_in,
        c.applying,
        c.across_nodes,
    );
    if c.built_in > 0 {
        let _ = write!(
            out,
            "; and {} built into `run` and `bench`",
            preflight_ground::values::count(c.built_in, "result")
        );
    }
    out.push('\n');
    out
}
