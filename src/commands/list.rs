//! `preflight list`: what would run here, and why a check would not.

use clap::Args;

use super::ChecklistArgs;
use super::Color;
use super::format::{self, Format};

use super::Failure;
use preflight_ground::exit::ExitCode;
use preflight_report::listing::{Counts, Entry, table};
use preflight_report::output::write_stdout;
use preflight_report::style::Style;
use preflight_run::selection::{all_checks, built_in_results, facts, not_here, select_all};

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub checklist: ChecklistArgs,
    /// Colour: auto, always, never.
    #[arg(long, value_enum, default_value = "auto", value_name = "WHEN")]
    pub color: Color,
    #[arg(long, value_parser = format::parser(format::LIST), default_value = "human")]
    pub format: Format,
}

pub fn list(args: &ListArgs) -> Result<ExitCode, Failure> {
    let checklist = args.checklist.settings();
    let checks = select_all(all_checks(&checklist)?, &checklist)?;
    let facts = facts(&checklist, None)?;
    let mut entries: Vec<Entry> = checks
        .iter()
        .map(|c| {
            let reason = not_here(c, &checklist, &facts);
            Entry {
                id: &c.id,
                kind: c.kind.name,
                area: &c.area,
                severity: c.severity,
                tags: c.tags.clone(),
                applies: reason.is_none(),
                reason,
                source: &c.source,
                params: c.probe.params(),
            }
        })
        .collect();
    let node = |c: &&std::sync::Arc<preflight_checklist::Check>| {
        c.evaluator() == preflight_checklist::Evaluator::Node
    };
    let counts = Counts {
        on_each_node: checks.iter().filter(node).count(),
        opt_in: checks
            .iter()
            .filter(node)
            .filter(|c| c.opt_in && !checklist.named(c))
            .count(),
        applying: entries.iter().filter(|e| e.applies).count(),
        across_nodes: checks.iter().filter(|c| !node(c)).count(),
        built_in: 0,
    };
    // The results the stages print themselves, unless a selection leaves
    // them out (they have no tags but their area).
    let built = built_in_results();
    let selecting = !checklist.only.is_empty() || !checklist.skip.is_empty();
    if !selecting {
        for b in &built {
            entries.push(Entry {
                id: &b.id,
                kind: b.kind,
                area: b.area,
                severity: b.severity,
                tags: vec![b.area.to_string()],
                applies: false,
                reason: Some(format!(
                    "built into preflight {}",
                    b.commands.replace(", ", " and ")
                )),
                source: "built-in",
                params: serde_json::Value::Null,
            });
        }
    }
    let counts = Counts {
        built_in: if selecting { 0 } else { built.len() },
        ..counts
    };
    let text = match args.format {
        Format::Json => {
            let mut t = serde_json::to_string_pretty(&entries).unwrap_or_default();
            t.push('\n');
            t
        }
        // Human; `--format` takes no other (`format::LIST`).
        _ => table(&entries, &counts, &Style::for_stdout(args.color.into())),
    };
    write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
    Ok(ExitCode::Ready)
}
