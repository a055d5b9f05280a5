//! `preflight run` and `preflight check`: run the checklist stage and report.
//! `run` is the full preflight; the cluster and collective stages slot in
//! after the checklist as `Stage` grows, and `check` never leaves this node.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::{Failure, all_checks, facts, select};
use crate::cli::RunArgs;
use crate::engine::{self, Progress};
use crate::exit::ExitCode;
use crate::report::human::Detail;
use crate::report::style::Style;
use crate::report::{self, Destination, Format, Human, Node, Report};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `preflight check`: this node's checklist only.
    Checklist,
    /// `preflight run`: everything that applies.
    Full,
}

impl Stage {
    fn command(self) -> &'static str {
        match self {
            Stage::Checklist => "check",
            Stage::Full => "run",
        }
    }
}

pub fn run(args: &RunArgs, stage: Stage) -> Result<ExitCode, Failure> {
    let checks = select(all_checks(&args.checklist)?, &args.checklist)?;
    let facts = Arc::new(facts(&args.checklist)?);
    let started_at = SystemTime::now();
    let start = Instant::now();

    let show_progress = args.format == Format::Human
        && !args.display.quiet
        && args.output.is_none()
        && std::io::stderr().is_terminal();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Usage(format!("cannot start the async runtime: {e}")))?;
    let results = runtime.block_on(engine::run(&checks, &facts, args.timeout.0, |event| {
        if let (
            true,
            Progress::Finished {
                done,
                total,
                result,
            },
        ) = (show_progress, event)
        {
            eprint!("{}", report::progress_line(done, total, result));
        }
    }));
    // Probes stuck in blocking reads past their timeout must not hold the
    // process open: the verdict is already known.
    runtime.shutdown_background();
    if show_progress {
        eprint!("\r\x1b[K");
    }

    let node = Node {
        hostname: facts.hostname().to_string(),
        root: args.checklist.root.display().to_string(),
        pid: std::process::id(),
    };
    let report = Report::new(
        stage.command(),
        node,
        started_at,
        start.elapsed(),
        results,
        args.strict,
    );
    let human = |style: Style| {
        let detail = if args.display.quiet {
            Detail::Quiet
        } else if args.display.verbose {
            Detail::Verbose
        } else {
            Detail::Normal
        };
        Human { style, detail }.render(&report)
    };
    let text = match args.format {
        Format::Json => report.json(),
        Format::Junit => report::junit(&report),
        Format::Human if args.output.is_some() => human(Style { color: false }),
        Format::Human => human(Style::for_stdout(args.display.color)),
    };
    match &args.output {
        None => report::write_report(&Destination::Stdout, &text),
        Some(path) => {
            report::write_report(&Destination::File(path.clone()), &text).map_err(|e| {
                Failure::Usage(format!(
                    "cannot write the report to {}: {e}",
                    path.display()
                ))
            })?;
            if args.display.quiet {
                Ok(())
            } else {
                let style = Style::for_stdout(args.display.color);
                report::write_report(
                    &Destination::Stdout,
                    &format!("{}\n", report::human::verdict_line(&report, &style)),
                )
            }
        }
    }
    .map_err(|e| Failure::Usage(format!("cannot write the report: {e}")))?;
    Ok(report.verdict.exit_code())
}
