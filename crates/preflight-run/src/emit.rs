//! Writing a command's report: the document in the format asked for, to
//! stdout or a file, with the cluster and collective views where the
//! stages ran; and the exit code it carries.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::Failure;
use super::{RunSettings, Stage};
use preflight_facts::Facts;
use preflight_ground::exit::ExitCode;
use preflight_report::format::Format;
use preflight_report::human::Detail;
use preflight_report::style::Style;
use preflight_report::{self as report, Destination, Human};
use preflight_result::CheckResult;
use preflight_result::cluster::ClusterReport;
use preflight_result::report::Interrupted;
use preflight_result::report::{Node, Report};

/// Set to 0 for the local ranks whose output nobody reads: they must not
/// write `--output` files over the first rank's.
pub const SPEAKER: &str = "PREFLIGHT_NODE_SPEAKER";

/// The least time `--post` gets, even after a run that used its deadline.
const POST_FLOOR: Duration = Duration::from_secs(2);

/// What the stages found, before it is written anywhere.
pub struct Outcome {
    pub facts: Arc<Facts>,
    pub results: Vec<CheckResult>,
    /// The cluster's report and this process's rank, where a rendezvous ran.
    pub cluster: Option<(ClusterReport, u32)>,
    pub started_at: SystemTime,
    pub elapsed: Duration,
    /// A signal cut the run short.
    pub interrupted: Option<Interrupted>,
    /// Where the time went, by phase.
    pub timings: Option<preflight_result::report::Timings>,
}

/// A node agent that could not start its ranks still reports, in the
/// format asked for, why.
pub fn emit_cluster_only(
    args: &RunSettings,
    facts: Arc<Facts>,
    cluster: ClusterReport,
) -> Result<ExitCode, Failure> {
    emit(
        args,
        Stage::Full,
        Outcome {
            facts,
            results: Vec::new(),
            cluster: Some((cluster, 0)),
            started_at: SystemTime::now(),
            elapsed: Duration::ZERO,
            interrupted: None,
            timings: None,
        },
    )
}

/// The report document of a run, and this process's rank (0 alone).
pub fn report_of(args: &RunSettings, stage: Stage, o: Outcome) -> (Report, u32) {
    let node = Node {
        hostname: o.facts.hostname().to_string(),
        root: args.checklist.root.display().to_string(),
        pid: std::process::id(),
        rank: o.cluster.as_ref().map(|(_, rank)| *rank),
    };
    let mut report = Report::new(
        stage.command(),
        node,
        o.started_at,
        o.elapsed,
        o.results,
        args.strict,
    );
    let mut rank = 0;
    if let Some((c, r)) = o.cluster {
        report = report.with_cluster(c);
        rank = r;
    }
    if let Some(how) = o.interrupted {
        report = report.signalled(how);
    }
    report.timings = o.timings;
    (report, rank)
}

/// Text for people in the locale's character set: ASCII unless it is
/// UTF-8.
fn plain(text: String) -> String {
    if preflight_report::style::utf8_locale(|k| std::env::var(k).ok()) {
        text
    } else {
        preflight_report::style::ascii(&text)
    }
}

pub fn emit(args: &RunSettings, stage: Stage, outcome: Outcome) -> Result<ExitCode, Failure> {
    let facts = Arc::clone(&outcome.facts);
    let facts = facts.as_ref();
    let elapsed = outcome.elapsed;
    let (mut report, rank) = report_of(args, stage, outcome);
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
        if let (true, Some(how), Some(c)) = (rank != 0, &report.interrupted, &report.cluster) {
            return format!(
                "{}  rank {rank} of {} · {}\n",
                style.verdict(report.verdict),
                c.world_size,
                how.describe()
            );
        }
        if rank != 0
            && let Some(c) = &report.cluster
        {
            // Its own problems, the cluster's included (a rank that never
            // reached rank 0 is the only one that knows why), with their
            // hints; then its verdict, last: srun and torchrun logs are
            // read from the tail.
            let mut text = report::human::problems(report.checks.iter(), &style)
                .trim_start_matches('\n')
                .to_string();
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&report::cluster::one_line(c, rank, &style));
            text.push('\n');
            return text;
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
        // Human; `--format` takes no other (`format::RUN`).
        _ if args.output.is_some() => plain(human(Style { color: false })),
        _ => plain(human(Style::for_stdout(args.display.color))),
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
    // After the report asked for: a JSON copy that cannot be written does
    // not cost the metrics.
    if let (Some(path), false) = (&args.json_report, muted) {
        report::write_report(&Destination::File(path.clone()), &report::json(&report)).map_err(
            |e| {
                Failure::Usage(format!(
                    "cannot write the JSON report to {}: {e}",
                    path.display()
                ))
            },
        )?;
    }
    if let (Some(path), false) = (termination_log(args, facts), muted) {
        // What the pod's status shows: worth a try, never a change of
        // verdict.
        if let Err(e) = std::fs::write(&path, report::termination::message(&report)) {
            eprintln!(
                "preflight: cannot write the termination message to {}: {e}",
                path.display()
            );
        }
    }
    Ok(report.verdict.exit_code())
}

/// Where the kubelet reads a container's termination message.
const TERMINATION_LOG: &str = "/dev/termination-log";

/// --termination-log, else the kubelet's file in a pod (the API server's
/// address is in every container's environment, the file mounted).
fn termination_log(args: &RunSettings, facts: &Facts) -> Option<std::path::PathBuf> {
    match &args.termination_log {
        Some(p) if p.as_os_str() == "off" => None,
        Some(p) => Some(p.clone()),
        None => (facts.env("KUBERNETES_SERVICE_HOST").is_some()
            && std::path::Path::new(TERMINATION_LOG).exists())
        .then(|| TERMINATION_LOG.into()),
    }
}
