//! The arguments of `run`, `check` and `bench` on the command line, made
//! into the run's settings (`preflight_run::settings`) here and nowhere else.

use std::path::PathBuf;

use clap::Args;

use super::format;
use crate::commands::ChecklistArgs;
use preflight_collective::rank::Libraries;
use preflight_collective::registry::LIBRARIES;
use preflight_ground::exit::ExitCode;
use preflight_ground::values::{Span, parse_size};
use preflight_run::Failure;
use preflight_run::settings::{
    ClusterSettings, CollectiveMode, CollectiveSettings, DisplaySettings, Nproc, RunSettings, Stage,
};

/// `run`, `check` and `bench`: the run, from these arguments' settings.
pub fn run(args: &RunArgs, stage: Stage) -> Result<ExitCode, Failure> {
    preflight_run::run(&args.settings(), stage)
}

#[derive(Debug, Args, Clone)]
pub struct DisplayArgs {
    /// Colour: auto (a terminal and NO_COLOR unset), always, never.
    #[arg(long, value_enum, default_value = "auto", value_name = "WHEN")]
    pub color: super::Color,
    /// Print only problems and the verdict.
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Print measured and expected values and durations for every check.
    #[arg(short, long)]
    pub verbose: bool,
}

use preflight_report::format::Format;

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub checklist: ChecklistArgs,
    #[command(flatten)]
    pub display: DisplayArgs,
    /// Hold this node to the profile in FILE (what a node of its kind
    /// must have: `preflight baseline capture` writes one) instead of the
    /// shipped profile its accelerators match; or, given a directory, to
    /// the one of its *.yaml profiles the node's facts match (else a
    /// shipped one).
    #[arg(long, value_name = "FILE|DIR")]
    pub profile: Option<PathBuf>,
    /// Report format.
    #[arg(long, value_parser = format::parser(format::RUN), default_value = "human")]
    pub format: Format,
    /// Write the report to FILE (atomically) instead of stdout; stdout then
    /// gets the one-line verdict.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Also write the JSON report to FILE (atomically), whatever --format
    /// says: the copy `preflight report` merges, beside metrics or JUnit.
    #[arg(long, value_name = "FILE")]
    pub json_report: Option<PathBuf>,
    /// Kubernetes' termination message: the verdict's line and the first
    /// findings (4,096 bytes at most), for `kubectl describe pod`. By
    /// default /dev/termination-log when running in a pod (the kubelet
    /// mounts it); `off` writes none.
    #[arg(long, value_name = "PATH|off")]
    pub termination_log: Option<PathBuf>,
    /// Where kept passes live (checks with `cache:`): /var/lib/preflight
    /// for root, else $XDG_STATE_HOME/preflight (~/.local/state/preflight).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Reuse no kept pass: every check runs (a pass is still kept).
    #[arg(long)]
    pub fresh: bool,
    /// At most N checks run at once (default 16): fewer spread the load
    /// of heavy checks on a busy node.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub max_concurrent: Option<u16>,
    /// Checks tagged slow are not run now: each reuses its kept pass, or
    /// is skipped saying so (the Slurm health check while a job holds the
    /// node's GPUs).
    #[arg(long)]
    pub no_slow_now: bool,
    /// After the run, POST the JSON report to this http(s) URL (a
    /// collector), through the job's proxy, retried within the deadline; a
    /// failed upload is a warning, never a change of verdict.
    #[arg(long, value_name = "URL", value_parser = PostUrl)]
    pub post: Option<reqwest::Url>,
    /// Deadline for the whole run; checks still running then are reported
    /// as timed out, and a collective stage not finished then is
    /// incomplete.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_span)]
    pub timeout: Span,
    /// Warnings make the node not ready, and unevaluated warn-severity
    /// checks make it incomplete.
    #[arg(long)]
    pub strict: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub collective: CollectiveArgs,
}

/// The collective stage (`preflight run` and `preflight bench`).
#[derive(Debug, Args, Clone)]
pub struct CollectiveArgs {
    /// off; short (run's default: every operation verified, a few sizes);
    /// full (the size sweep; bench's default).
    #[arg(long, value_enum, value_name = "MODE")]
    pub collective: Option<Collective>,
    /// Largest sweep size, e.g. 64MiB (default: 1MiB for run, 64MiB for
    /// bench).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub max_size: Option<usize>,
    /// Sweep sizes grow by this factor: 2 or 4.
    #[arg(long, value_name = "2|4", default_value = "2", value_parser = parse_factor)]
    pub step_factor: usize,
    /// Untimed iterations per sweep step [default: 5 for the full sweep
    /// (bench), 2 for run's short one].
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Timed iterations per sweep step [default: 20 for the full sweep
    /// (bench, as nccl-tests), 5 for run's short one].
    #[arg(long, value_name = "N")]
    pub iters: Option<u32>,
    /// Stall limit of each step: nothing moved for this long is a hang,
    /// which ends that backend's sweep, named, and the run goes on. A step
    /// that moves but is slow gets a budget of 4 times what the size before
    /// predicts, between this and 6 times this, then ends as slow, with its
    /// rate.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_span)]
    pub step_timeout: Span,
    /// `--nccl-lib`, `--oneccl-lib`, ...: one flag per library backend.
    #[command(flatten)]
    pub libraries: LibraryArgs,
}

/// One `--NAME-lib PATH` flag per library backend, from the backends'
/// registry: a new backend brings its flag with it.
#[derive(Debug, Clone, Default)]
pub struct LibraryArgs(pub Libraries);

impl clap::FromArgMatches for LibraryArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut args = LibraryArgs::default();
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        for l in LIBRARIES {
            if let Some(path) = matches.get_one::<PathBuf>(l.flag) {
                self.0.0.retain(|(name, _)| *name != l.name);
                self.0.0.push((l.name, path.clone()));
            }
        }
        Ok(())
    }
}

impl clap::Args for LibraryArgs {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for l in LIBRARIES {
            cmd = cmd.arg(
                clap::Arg::new(l.flag)
                    .long(l.flag)
                    .value_name("PATH")
                    .value_parser(clap::value_parser!(PathBuf))
                    .help(l.flag_help),
            );
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// `--collective`: the mode is the run's (`CollectiveMode`); its
/// spelling on the command line is this layer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Collective {
    Off,
    Short,
    Full,
}

impl From<Collective> for CollectiveMode {
    fn from(c: Collective) -> CollectiveMode {
        match c {
            Collective::Off => CollectiveMode::Off,
            Collective::Short => CollectiveMode::Short,
            Collective::Full => CollectiveMode::Full,
        }
    }
}

fn parse_factor(text: &str) -> Result<usize, String> {
    match text.trim() {
        "2" => Ok(2),
        "4" => Ok(4),
        _ => Err("2 or 4".into()),
    }
}

/// Node mode and the rendezvous address (`preflight run` only; these win
/// over the launcher's variables).
#[derive(Debug, Args, Clone)]
pub struct ClusterArgs {
    /// Node mode: the number of nodes; this process starts its node's ranks.
    #[arg(long, value_name = "N")]
    pub nnodes: Option<u32>,
    /// Node mode: this node's index, 0 to N-1; node 0 serves the rendezvous.
    #[arg(long, value_name = "K")]
    pub node_rank: Option<u32>,
    /// Node mode: ranks to start on this node, or auto (one per local
    /// accelerator, else one).
    #[arg(long, value_name = "M|auto", value_parser = parse_nproc)]
    pub nproc_per_node: Option<Nproc>,
    /// Where rank 0 serves the rendezvous (default: MASTER_ADDR, else the
    /// first host of SLURM_JOB_NODELIST, else 127.0.0.1).
    #[arg(long, value_name = "HOST")]
    pub master_addr: Option<String>,
    /// The rendezvous port (default: MASTER_PORT, else 29500; a one-node
    /// job without either picks a free port).
    #[arg(long, value_name = "PORT")]
    pub master_port: Option<u16>,
    /// Ports for the reachability probe listener, e.g. 29600-29699 (a taken
    /// port moves on to the next); default: PREFLIGHT_PROBE_PORTS, else an
    /// ephemeral port.
    #[arg(long, value_name = "FIRST-LAST", value_parser = preflight_kinds::ports::PortRange::parse)]
    pub probe_ports: Option<preflight_kinds::ports::PortRange>,
    /// Refuse a job across nodes whose token is not a secret (unset, or
    /// derived from SLURM_JOB_ID / TORCHELASTIC_RUN_ID, which anyone can
    /// read); also PREFLIGHT_REQUIRE_SECRET=1
    #[arg(long)]
    pub require_secret: bool,
}

fn parse_nproc(text: &str) -> Result<Nproc, String> {
    if text.trim() == "auto" {
        return Ok(Nproc(None));
    }
    match text.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(Nproc(Some(n))),
        _ => Err("a number of ranks (1 or more), or auto".into()),
    }
}

impl RunArgs {
    /// The run's settings: the one place the command line becomes them.
    pub fn settings(&self) -> RunSettings {
        let d = &self.display;
        let c = &self.cluster;
        let k = &self.collective;
        RunSettings {
            checklist: self.checklist.settings(),
            display: DisplaySettings {
                color: d.color.into(),
                quiet: d.quiet,
                verbose: d.verbose,
            },
            profile: self.profile.clone(),
            format: self.format,
            output: self.output.clone(),
            json_report: self.json_report.clone(),
            termination_log: self.termination_log.clone(),
            state_dir: self.state_dir.clone(),
            fresh: self.fresh,
            max_concurrent: self.max_concurrent,
            no_slow_now: self.no_slow_now,
            post: self.post.clone(),
            timeout: self.timeout,
            strict: self.strict,
            cluster: ClusterSettings {
                nnodes: c.nnodes,
                node_rank: c.node_rank,
                nproc_per_node: c.nproc_per_node,
                master_addr: c.master_addr.clone(),
                master_port: c.master_port,
                probe_ports: c.probe_ports,
                require_secret: c.require_secret,
            },
            collective: CollectiveSettings {
                collective: k.collective.map(CollectiveMode::from),
                max_size: k.max_size,
                step_factor: k.step_factor,
                warmup: k.warmup,
                iters: k.iters,
                step_timeout: k.step_timeout,
                libraries: k.libraries.0.clone(),
            },
        }
    }
}

fn parse_span(text: &str) -> Result<Span, String> {
    let span = Span::parse(text)?;
    if span.0.is_zero() {
        return Err("the deadline must be longer than zero".into());
    }
    Ok(span)
}

/// The flags of the shared argument struct that `stage` would ignore
/// (clap ids): `check` meets no other rank and runs no collective; `bench`
/// runs no checklist. They are hidden from that command's help, man page
/// and completions, and refused when given (`unused_flags`).
pub fn ignored_flags(stage: Stage) -> Vec<&'static str> {
    const CLUSTER: &[&str] = &[
        "nnodes",
        "node_rank",
        "nproc_per_node",
        "master_addr",
        "master_port",
        "probe_ports",
        "require_secret",
    ];
    const COLLECTIVE: &[&str] = &[
        "collective",
        "max_size",
        "step_factor",
        "warmup",
        "iters",
        "step_timeout",
    ];
    const CHECKLIST: &[&str] = &[
        "checks",
        "no_shipped",
        "only",
        "skip",
        "with",
        "strict",
        "init_method",
        "profile",
        "state_dir",
        "fresh",
        "max_concurrent",
        "no_slow_now",
    ];
    match stage {
        Stage::Checklist => CLUSTER
            .iter()
            .chain(COLLECTIVE)
            .copied()
            .chain(LIBRARIES.iter().map(|l| l.flag))
            .collect(),
        Stage::Bench => CHECKLIST.to_vec(),
        Stage::Full => Vec::new(),
    }
}

/// `command` (run, check or bench's definition) with the flags its stage
/// ignores hidden: its help lists exactly what it takes.
pub fn hide_ignored(stage: Stage, command: clap::Command) -> clap::Command {
    ignored_flags(stage)
        .into_iter()
        .fold(command, |c, id| c.mut_arg(id, |a| a.hide(true)))
}

/// Refuses a flag `stage` would ignore, given on the command line: an
/// error (exit 2) that says why, never silently dropped.
pub fn unused_flags(stage: Stage, given: &clap::ArgMatches) -> Result<(), String> {
    use clap::parser::ValueSource;
    let set = |id: &str| {
        given.try_get_raw(id).ok().flatten().is_some()
            && given.value_source(id) == Some(ValueSource::CommandLine)
    };
    let why = match stage {
        Stage::Checklist => {
            "`check` runs this node's checklist only: it meets no other rank and runs no collective (use `preflight run`)"
        }
        Stage::Bench => {
            "`bench` runs no checklist, only the rendezvous and the collective sweep (use `preflight run`)"
        }
        Stage::Full => "",
    };
    let named: Vec<String> = ignored_flags(stage)
        .into_iter()
        .filter(|id| set(id))
        .map(|id| format!("--{}", id.replace('_', "-")))
        .collect();
    if named.is_empty() {
        Ok(())
    } else {
        Err(format!("{} does nothing here: {why}", named.join(", ")))
    }
}

/// `--post`'s parser: clap would quote the rejected value in its error,
/// password and all; this says only what `post::parse_url` says, which
/// shows the URL with its password as `***`.
#[derive(Clone)]
struct PostUrl;

impl clap::builder::TypedValueParser for PostUrl {
    type Value = reqwest::Url;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<reqwest::Url, clap::Error> {
        let text = value.to_str().ok_or_else(|| {
            cmd.clone().error(
                clap::error::ErrorKind::InvalidUtf8,
                "--post: the URL is not UTF-8",
            )
        })?;
        preflight_run::post::parse_url(text).map_err(|e| {
            cmd.clone()
                .error(clap::error::ErrorKind::ValueValidation, e)
        })
    }
}
