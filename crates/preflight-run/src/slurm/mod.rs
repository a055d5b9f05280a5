//! The Slurm modes, `preflight slurm healthcheck|prolog|epilog`: the programs slurmd runs
//! (HealthCheckProgram, Prolog, Epilog), with the site configuration
//! (`site`) instead of arguments, a report file for later collection, and
//! the node's state in Slurm as the outcome: a node that is not ready is
//! drained with a reason naming what is wrong; a node preflight drained
//! is resumed once it is ready again; a node anyone else drained is left
//! alone.

mod job;
mod reason;
pub mod scontrol;
mod timed_out;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Failure;
use super::emit::report_of;
use super::settings::{ChecklistSettings, CollectiveMode, RunSettings};
use super::site::{Resolved, Settings};
use super::{Executed, Stage, execute};
use preflight_ground::exit::ExitCode;
use preflight_ground::values::Span;
use preflight_report::format::Format;
use preflight_result::report::Report;
use preflight_result::{Status, Verdict};
use reason::{Action, node_action};
use scontrol::Slurm;

/// Which program slurmd runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlurmMode {
    /// HealthCheckProgram: this node's checklist.
    Healthcheck,
    /// Prolog: this node's checklist and, with `cluster` (or the setting),
    /// the cluster stage across the job's allocation.
    Prolog { cluster: bool },
    /// Epilog: the checks for what a job leaves behind.
    Epilog,
}

impl SlurmMode {
    fn name(self) -> &'static str {
        match self {
            SlurmMode::Healthcheck => "healthcheck",
            SlurmMode::Prolog { .. } => "prolog",
            SlurmMode::Epilog => "epilog",
        }
    }

    fn settings(self, s: &Settings) -> &Resolved {
        match self {
            SlurmMode::Healthcheck => &s.healthcheck,
            SlurmMode::Prolog { .. } => &s.prolog,
            SlurmMode::Epilog => &s.epilog,
        }
    }
}

/// Where the tools the checks run live (nft, iptables-save, dmesg,
/// nvidia-smi, ...) on the distributions we ship for.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `preflight slurm MODE`, with the site configuration in `config_dir`
/// (else PREFLIGHT_CONFIG_DIR, else /etc/preflight).
pub fn slurm(mode: SlurmMode, config_dir: Option<&Path>) -> Result<ExitCode, Failure> {
    // slurmd runs Prolog, Epilog and HealthCheckProgram with no search
    // path at all: every check that runs a tool would find none and skip
    // (the firewall unread, the node's evidence lost). Restarted with
    // one: the environment is set before any thread reads it.
    if std::env::var_os("PATH").is_none_or(|p| p.is_empty()) {
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe()
            .map_err(|e| Failure::Usage(format!("PATH is unset and this program's path is unreadable ({e}): set PATH in the script slurmd runs")))?;
        let err = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env("PATH", SYSTEM_PATH)
            .exec();
        return Err(Failure::Usage(format!(
            "PATH is unset and restarting with PATH={SYSTEM_PATH} failed: {err}"
        )));
    }
    let settings = Settings::load(&Settings::dir_from_env(config_dir))?;
    let env: BTreeMap<String, String> = preflight_facts::process_env();
    let get = |k: &str| env.get(k).cloned();
    let own = node_name(&env)?;
    let slurm = Slurm::find(settings.scontrol.as_deref(), &get).map_err(Failure::Usage)?;
    let resolved = mode.settings(&settings);
    let cluster = matches!(mode, SlurmMode::Prolog { cluster: true })
        || (matches!(mode, SlurmMode::Prolog { .. }) && settings.prolog_cluster);
    let job_id = get("SLURM_JOB_ID").filter(|j| !j.is_empty());
    let (stage, job_env) = if cluster {
        let env = job::environment(&settings, &slurm, &env, &own).map_err(Failure::Usage)?;
        (Stage::Full, Some(env))
    } else {
        (Stage::Checklist, None)
    };
    // The health check while a job holds the node: its slow checks would
    // take the GPUs from under the job; they reuse a kept pass or wait.
    let busy = mode == SlurmMode::Healthcheck
        && slurm.node(&own).is_ok_and(|n| {
            n.state.split('+').any(|f| {
                matches!(
                    f.trim_end_matches('*'),
                    "ALLOCATED" | "MIXED" | "COMPLETING"
                )
            })
        });
    // `%n`: the node's own, where the directory is on a shared filesystem.
    let state = settings.state_dir.display().to_string().replace("%n", &own);
    let run_args = run_settings(&settings, resolved, stage, busy, &state)?;
    let outcome = match execute(&run_args, stage, job_env)? {
        Executed::Done(o) => *o,
        Executed::Agent(_) => {
            return Err(Failure::Usage(
                "the prolog's job environment made a node agent, not a rank".into(),
            ));
        }
    };
    let (mut report, rank) = report_of(&run_args, stage, outcome);
    let file = report_file(&settings.report_dir, &own, mode, job_id.as_deref());
    let action = match (&report.cluster, mode) {
        (Some(c), _) => {
            job::cluster_action(c, rank, &settings.drain_prefix, settings.prolog_on_squat)
        }
        (None, SlurmMode::Healthcheck) => {
            node_action(&report, resolved.incomplete, &settings.drain_prefix, true)
        }
        (None, _) => node_action(&report, resolved.incomplete, &settings.drain_prefix, false),
    };
    if let (Action::RunNoted(why), Some(c)) = (&action, report.cluster.as_mut())
        && c.verdict != Verdict::Ready
    {
        c.warnings
            .push(format!("the job runs without preflight's gate: {why}"));
    }
    let mut problems: Vec<String> = Vec::new();
    if let Err(e) = write_report(&file, &report) {
        problems.push(e);
    }
    let done = act(
        &slurm,
        &own,
        job_id.as_deref(),
        &action,
        &settings.drain_prefix,
    );
    let diagnosis = match mode {
        SlurmMode::Epilog => timed_out::act(
            settings.epilog_diagnosis.as_deref(),
            &slurm,
            &get,
            &own,
            &settings.drain_prefix,
        ),
        _ => timed_out::Outcome::default(),
    };
    let mut text = summary(mode, &own, &report, &action, &done, &file);
    text.push('\n');
    for l in &diagnosis.lines {
        text.push_str(&format!("  diagnosis: {}\n", scontrol::one_line(l, 600)));
    }
    // Every problem on its own line, for the log (the reason holds one).
    for c in report
        .checks
        .iter()
        .filter(|c| matches!(c.status, Status::Fail | Status::Error | Status::Warn))
    {
        text.push_str(&format!(
            "  {} {}: {}\n",
            c.status.name(),
            c.id,
            scontrol::one_line(&c.message, 400)
        ));
    }
    let _ = preflight_report::output::write_stdout(&text);
    for p in problems.iter().chain(done.as_ref().err()) {
        eprintln!("preflight slurm {}: {p}", mode.name());
    }
    // A Slurm call that failed is exit 2, whatever the verdict: a drain
    // that did not happen must not look like one that did.
    Ok(match (&action, &done) {
        // A comment that could not be set is in the log; the job still
        // runs, and the node is never drained for a stranger's doing.
        (Action::RunNoted(_), _) => ExitCode::Ready,
        (_, Err(_)) => ExitCode::Usage,
        _ if diagnosis.failed => ExitCode::Usage,
        (Action::Drain(_), _) => ExitCode::NotReady,
        _ if diagnosis.drained_self => ExitCode::NotReady,
        _ if mode == SlurmMode::Healthcheck => report.verdict.exit_code(),
        _ => ExitCode::Ready,
    })
}

/// The node's name in Slurm: SLURMD_NODENAME, which slurmd gives every
/// program it runs; else the short hostname.
fn node_name(env: &BTreeMap<String, String>) -> Result<String, Failure> {
    if let Some(n) = env.get("SLURMD_NODENAME").filter(|n| !n.is_empty()) {
        return Ok(n.clone());
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().split('.').next().unwrap_or_default().to_string())
        .filter(|h| !h.is_empty())
        .ok_or_else(|| {
            Failure::Usage(
                "SLURMD_NODENAME is unset and the hostname is unreadable: which node is this?"
                    .into(),
            )
        })
}

/// The run's settings from the site settings: the shipped checklist, the
/// site's `checks.d`, the mode's selection and deadline, JSON. What the
/// command line's parser would refuse is refused here, naming the file.
fn run_settings(
    settings: &Settings,
    mode: &Resolved,
    stage: Stage,
    busy: bool,
    state_dir: &str,
) -> Result<RunSettings, Failure> {
    let bad =
        |what: String| Failure::Usage(format!("the site settings ({}): {what}", settings.source));
    if mode.timeout.is_zero() {
        return Err(bad("a mode's timeout must be longer than zero".into()));
    }
    if let Some(n) = settings.max_concurrent.filter(|n| !(1..=256).contains(n)) {
        return Err(bad(format!("max_concurrent {n}: 1 to 256")));
    }
    let checks = settings.checks_dir();
    let mut run = RunSettings::new(Span(mode.timeout));
    run.format = Format::Json;
    run.checklist = ChecklistSettings::shipped_with(if checks.is_dir() {
        vec![checks]
    } else {
        Vec::new()
    });
    run.checklist.only = mode.only.clone();
    run.checklist.skip = mode.skip.clone();
    run.checklist.with = mode.with.clone();
    run.profile = settings.profile_file();
    run.strict = mode.strict;
    run.no_slow_now = busy;
    run.state_dir = Some(PathBuf::from(state_dir));
    run.max_concurrent = settings.max_concurrent;
    if stage == Stage::Full {
        run.collective.collective = Some(CollectiveMode::Off);
    }
    Ok(run)
}

/// `DIR/healthcheck.json`, `DIR/prolog-JOB.json`, `DIR/epilog-JOB.json`;
/// `%n` in DIR is the node's name, as in slurm.conf (for a report
/// directory on a shared filesystem).
fn report_file(dir: &Path, node: &str, mode: SlurmMode, job: Option<&str>) -> PathBuf {
    let dir = PathBuf::from(dir.display().to_string().replace("%n", node));
    let job: String = job
        .unwrap_or("nojob")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        .take(64)
        .collect();
    match mode {
        SlurmMode::Healthcheck => dir.join("healthcheck.json"),
        m => dir.join(format!("{}-{job}.json", m.name())),
    }
}

fn write_report(file: &Path, report: &Report) -> Result<(), String> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    preflight_report::write_report(
        &preflight_report::Destination::File(file.to_path_buf()),
        &preflight_report::json(report),
    )
    .map_err(|e| format!("cannot write the report to {}: {e}", file.display()))
}

/// Carries out `action` on this node (or, for a job that cannot start,
/// on the job); what was done, in words.
fn act(
    slurm: &Slurm,
    own: &str,
    job: Option<&str>,
    action: &Action,
    prefix: &str,
) -> Result<String, String> {
    match action {
        Action::Drain(reason) => slurm
            .drain(own, reason)
            .map(|()| format!("drained: {reason}")),
        Action::ResumeIfOurs => {
            let n = slurm.node(own)?;
            match &n.reason {
                Some(r) if n.out_of_service() && r.starts_with(prefix) => slurm
                    .resume(own)
                    .map(|()| format!("resumed (was drained: {r})")),
                Some(r) if n.out_of_service() => {
                    Ok(format!("left {} (reason not preflight's: {r})", n.state))
                }
                _ => Ok(format!("state {}", n.state)),
            }
        }
        Action::Keep(why) => Ok(why.clone()),
        Action::RunNoted(reason) => match job {
            Some(j) => slurm
                .comment_job(j, reason)
                .map(|()| format!("job {j} runs, its comment names the strangers: {reason}")),
            None => Ok(format!("the job runs: {reason}")),
        },
        Action::StopJob { reason, hold } => match job {
            Some(j) => slurm.stop_job(j, reason, *hold),
            None => Err(format!(
                "the job cannot start ({reason}), but SLURM_JOB_ID is unset"
            )),
        },
    }
}

fn summary(
    mode: SlurmMode,
    own: &str,
    report: &Report,
    action: &Action,
    done: &Result<String, String>,
    file: &Path,
) -> String {
    let verdict = match report.verdict {
        Verdict::Ready => "ready",
        Verdict::NotReady => "NOT READY",
        Verdict::Incomplete => "INCOMPLETE",
    };
    // A failed Slurm call's words go to stderr once; the summary only
    // says that it failed.
    let what = match done {
        Ok(d) => d.clone(),
        Err(_) => format!(
            "{} failed (stderr says why)",
            match action {
                Action::Drain(_) => "drain",
                Action::ResumeIfOurs => "resume",
                Action::StopJob { .. } => "taking the job off this allocation",
                Action::RunNoted(_) => "the job's comment",
                Action::Keep(_) => "nothing",
            }
        ),
    };
    format!(
        "preflight slurm {} on {own}: {verdict} ({}, {} ms); {what}; report {}",
        mode.name(),
        preflight_ground::values::count(report.checks.len(), "check"),
        report.duration_ms,
        file.display()
    )
}
