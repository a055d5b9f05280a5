//! Writing a command's report: the document in the format asked for, to
//! stdout or a file, with the cluster and collective views where the
//! stages ran; and the exit code it carries.

use std::time::{Duration, SystemTime};

use super::Failure;
use super::run::args::{Format, RunArgs, Stage};
use crate::exit::ExitCode;
use crate::facts::Facts;
use crate::report::human::Detail;
use crate::report::style::Style;
use crate::report::{self, Destination, Human};
use crate::result::CheckResult;
use crate::result::cluster::ClusterReport;
use crate::result::report::{Node, Report};

/// Set to 0 for the local ranks whose output nobody reads: they must not
/// write `--output` files over the first rank's.
pub const SPEAKER: &str = "PREFLIGHT_NODE_SPEAKER";

/// The least time `--post` gets, even after a run that used its deadline.
const POST_FLOOR: Duration = Duration::from_secs(2);

/// A node agent that could not start its ranks still reports, in the
/// format asked for, why.
pub fn emit_cluster_only(
    args: &RunArgs,
    facts: &Facts,
    cluster: ClusterReport,
) -> Result<ExitCode, Failure> {
    emit(
        args,
        Stage::Full,
        facts,
        Vec::new(),
        Some((cluster, 0)),
        SystemTime::now(),
        Duration::ZERO,
    )
}

/// The report document of a run, and this process's rank (0 alone).
pub fn report_of(
    args: &RunArgs,
    stage: Stage,
    facts: &Facts,
    results: Vec<CheckResult>,
    cluster: Option<(ClusterReport, u32)>,
    started_at: SystemTime,
    elapsed: Duration,
) -> (Report, u32) {
    let node = Node {
        hostname: facts.hostname().to_string(),
        root: args.checklist.root.display().to_string(),
        pid: std::process::id(),
        rank: cluster.as_ref().map(|(_, rank)| *rank),
    };
    let mut report = Report::new(
        stage.command(),
        node,
        started_at,
        elapsed,
        results,
        args.strict,
    );
    let mut rank = 0;
    if let Some((c, r)) = cluster {
        report = report.with_cluster(c);
        rank = r;
    }
    (report, rank)
}

/// Text for people in the locale's character set: ASCII unless it is
/// UTF-8.
fn plain(text: String) -> String {
    if crate::report::style::utf8_locale(|k| std::env::var(k).ok()) {
        text
    } else {
        crate::report::style::ascii(&text)
    }
}

pub fn emit(
    args: &RunArgs,
    stage: Stage,
    facts: &Facts,
    results: Vec<CheckResult>,
    cluster: Option<(ClusterReport, u32)>,
    started_at: SystemTime,
    elapsed: Duration,
) -> Result<ExitCode, Failure> {
    let (mut report, rank) = report_of(args, stage, facts, results, cluster, started_at, elapsed);
    // A node agent's other local ranks: nobody reads them, and they must
    // not overwrite the first rank's report file.
    let muted = facts.env(SPEAKER) == Some("0");
    if let (Some(url), false) = (&args.post, muted) {
        // What is left of the deadline, and a moment even when nothing is:
        // the run's result is worth one short try.
        let budget = args.timeout.0.saturating_sub(elapsed).max(POST_FLOOR);
        if let Err(warning) = super::post::post(url, report::json(&report), budget, facts) {
            eprintln!("preflight: warning: {warning}");
            report.warnings.push(warning);
        }
    }
    let human = |style: Style| {
        if rank != 0
            && let Some(c) = &report.cluster
        {
            let mut line = format!("{}\n", report::cluster::one_line(c, rank, &style));
            // A rank that never reached rank 0 is the only one that knows
            // its own problems: it shows them under its line.
            if c.checks.iter().any(|x| x.id == "cluster.rendezvous") {
                let own = report
                    .checks
                    .iter()
                    .filter(|x| x.id != "cluster.rendezvous");
                line.push_str(&report::human::problems(own, &style));
            }
            return line;
        }
        let detail = if args.display.quiet {
            Detail::Quiet
        } else if args.display.verbose {
            Detail::Verbose
        } else {
            Detail::Normal
        };
        let mut text = Human { style, detail }.render(&report);
        if let (Some(c), false) = (&report.cluster, args.display.quiet) {
            // The cluster view goes right before the verdict line.
            let mut view = report::cluster::render(c, &style);
            if let Some(coll) = &report.collective {
                view.push_str(&report::collective::render(coll, &style));
            }
            let at = text.trim_end().rfind('\n').unwrap_or(0);
            text.insert_str(at, &format!("{}\n", view.trim_end_matches('\n')));
        }
        text
    };
    let text = match args.format {
        Format::Json => report::json(&report),
        Format::Junit => report::junit(&report),
        Format::Prometheus => report::prometheus(&report),
        Format::Human if args.output.is_some() => plain(human(Style { color: false })),
        Format::Human => plain(human(Style::for_stdout(args.display.color))),
    };
    match (&args.output, muted) {
        (_, true) => Ok(()),
        (None, false) => report::write_report(&Destination::Stdout, &text),
        (Some(path), false) => {
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
                    &plain(format!(
                        "{}\n",
                        report::human::verdict_line(&report, &style)
                    )),
                )
            }
        }
    }
    .map_err(|e| Failure::Usage(format!("cannot write the report: {e}")))?;
    Ok(report.verdict.exit_code())
}
