//! A check, a kind or a built-in result in words, as `preflight explain`
//! prints it: everything an operator needs to trust or fix a check.

use std::fmt::Write;

use crate::{Check, Scope};
use preflight_ground::values::format_duration;
use preflight_kinds::KindInfo;
use preflight_result::built_in::BuiltIn;

/// A check in words: what it verifies, how it is configured, why, the
/// fix, and whether it applies here (`unmet`: why not, where it does not).
pub fn check(check: &Check, unmet: Option<String>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", check.id);
    let _ = writeln!(
        out,
        "  kind {}, severity {}, timeout {}, area {}{}",
        check.kind.name,
        match check.severity {
            preflight_result::Severity::Fail => "fail",
            preflight_result::Severity::Warn => "warn",
        },
        format_duration(check.timeout),
        check.area,
        if check.tags.is_empty() {
            String::new()
        } else {
            format!(", tags {}", check.tags.join(", "))
        }
    );
    let _ = writeln!(out, "  defined at {}", check.source);
    let _ = writeln!(out, "  evaluated {}", evaluated(check.scope));

    let _ = writeln!(out, "\nWhat it verifies\n{}", wrap(check.kind.summary, 2));
    if let serde_json::Value::Object(params) = check.probe.params() {
        for (name, value) in params {
            let shown = match value {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            let _ = writeln!(out, "    {name}: {shown}");
        }
    }
    if let Some(description) = &check.description {
        let _ = writeln!(out, "\nWhy it matters\n{}", wrap(description, 2));
    }
    let _ = writeln!(out, "\nHow to fix a failure");
    match &check.hint {
        Some(hint) => {
            let _ = writeln!(out, "{}", wrap(&hint.template, 2));
        }
        None => {
            let _ = writeln!(
                out,
                "  (no hint given: the failure message names what is wrong)"
            );
        }
    }
    let when = serde_json::to_value(&check.when).unwrap_or_default();
    let conditions = match &when {
        serde_json::Value::Object(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "always".to_string(),
    };
    let _ = writeln!(
        out,
        "\nApplies when\n  {conditions}\n  on this node (`check`): {}",
        match unmet {
            None => "yes".to_string(),
            Some(reason) => format!("no ({reason})"),
        }
    );
    out.push('\n');
    out.push_str(&kind(check.kind));
    out
}

/// A result the stages print themselves: no checklist entry, no
/// parameters; what it verifies, why, the fix, and where it comes from.
pub fn built_in(b: &BuiltIn) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", b.id);
    let _ = writeln!(
        out,
        "  built into preflight {}: {}, severity {}, area {}",
        b.commands.replace(", ", " and "),
        b.kind,
        match b.severity {
            preflight_result::Severity::Fail => "fail",
            preflight_result::Severity::Warn => "warn",
        },
        b.area
    );
    let _ = writeln!(out, "\nWhat it verifies\n{}", wrap(&b.verifies, 2));
    let _ = writeln!(out, "\nWhy it matters\n{}", wrap(b.why, 2));
    let _ = writeln!(out, "\nHow to fix a failure\n{}", wrap(&b.hint, 2));
    let _ = writeln!(
        out,
        "\nApplies when\n  every run of preflight {} (on this node: not by `check`, which meets no other rank)",
        b.commands.replace(", ", " and ")
    );
    out
}

/// Where and how often a job evaluates a check of `scope`.
fn evaluated(scope: Scope) -> &'static str {
    match scope {
        Scope::Node => "once per node (scope node: in a job, by local rank 0 for the node's ranks)",
        Scope::Rank => "on every rank (scope rank: each rank's own state)",
        Scope::Cluster => {
            "across the job (scope cluster: rank 0 compares every node's check-in, or every rank reads the collective stage's shared report)"
        }
    }
}

/// A kind in words: what it verifies, where it is evaluated, its
/// parameters and the placeholders its hints may use.
pub fn kind(kind: &KindInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Kind `{}`\n  {}\n  Evaluated {}.\n\nParameters",
        kind.name,
        kind.summary,
        evaluated(kind.scope)
    );
    let width = kind.params.iter().map(|p| p.name.len()).max().unwrap_or(0);
    for p in kind.params {
        let default = match p.default {
            None => "required".to_string(),
            Some("unset") => "optional".to_string(),
            Some(d) => format!("default {d}"),
        };
        let _ = writeln!(
            out,
            "  {:<width$}  {} ({default})\n  {:<width$}  {}",
            p.name, p.ty, "", p.doc
        );
    }
    let mut vars: Vec<&str> = crate::hint_vars().to_vec();
    vars.extend_from_slice(kind.hint_vars);
    let _ = writeln!(
        out,
        "\nHint placeholders\n  {}, {{env.NAME}}",
        vars.iter()
            .map(|v| format!("{{{v}}}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out
}

/// Folds prose to 78 columns at word boundaries, indented.
fn wrap(text: &str, indent: usize) -> String {
    let pad = " ".repeat(indent);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && indent + line.len() + 1 + word.len() > 78 {
            lines.push(format!("{pad}{line}"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(format!("{pad}{line}"));
    }
    lines.join("\n")
}
