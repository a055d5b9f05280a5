//! `--format json`: the report document as serde writes it, pretty-printed.

use preflight_result::report::Report;

pub fn json(report: &Report) -> String {
    let mut text =
        serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}
