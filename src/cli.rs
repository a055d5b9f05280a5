//! The command line: `preflight run|check|list|explain|validate`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::checklist::values::Span;
use crate::checklist::when::Backend;
use crate::report::Format;
use crate::report::style::ColorChoice;

const AFTER_HELP: &str = "\
Exit codes:
  0  ready: no check failed (warnings allowed unless --strict)
  1  not ready: a check failed (or warned, under --strict)
  2  bad invocation or invalid checklist
  3  incomplete: nothing failed, but a required check could not be evaluated";

/// Is every node and backend ready for the distributed job? Names the node,
/// port, interface or variable that is not, and how to fix it.
#[derive(Debug, Parser)]
#[command(name = "preflight", version, after_help = AFTER_HELP, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The full preflight of this node: the checklist, then the cluster and
    /// collective stages as they apply.
    Run(RunArgs),
    /// The checklist only, never a rendezvous: what a Slurm
    /// HealthCheckProgram or a cron job calls.
    Check(RunArgs),
    /// Every check that would run here: id, kind, severity, tags, and
    /// whether it applies on this node (and why not).
    List(ListArgs),
    /// What a check verifies, its parameters and defaults, why it matters
    /// and how to fix a failure.
    Explain(ExplainArgs),
    /// Lint checklist files without running them.
    Validate(ValidateArgs),
    /// The rendezvous and the collective stage's full sweep (default up to
    /// 64 MiB), no checklist: an nccl-tests replacement that needs no MPI.
    Bench(RunArgs),
    /// Internal: one library backend of one rank, started by `run` and
    /// `bench` (see src/collective/worker.rs).
    #[command(hide = true)]
    CollectiveWorker,
}

/// Which checks: the shipped checklist, added files, and selection.
#[derive(Debug, Args, Clone)]
pub struct ChecklistArgs {
    /// Add the checks of this YAML file, or of every *.yaml and *.yml in
    /// this directory; a check with a shipped check's id replaces it.
    /// Repeatable.
    #[arg(long = "checks", value_name = "PATH")]
    pub checks: Vec<PathBuf>,
    /// Leave out the shipped checklist: run only the --checks files.
    #[arg(long)]
    pub no_shipped: bool,
    /// Run only checks with this id or tag. Repeatable.
    #[arg(long = "only", value_name = "ID|TAG")]
    pub only: Vec<String>,
    /// Leave out checks with this id or tag. Repeatable; wins over --only.
    #[arg(long = "skip", value_name = "ID|TAG")]
    pub skip: Vec<String>,
    /// Read /sys, /proc, /dev and /etc under this directory instead of /
    /// (fixture trees; `command` checks still run on the real machine).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Collective backends the job will use, for checks that apply to one
    /// backend (`when: {backend: nccl}`): comma-separated tcp, nccl,
    /// oneccl, or auto for all.
    #[arg(long, value_name = "LIST", default_value = "auto", value_parser = parse_backends)]
    pub backends: BackendList,
    /// The init method the job passes to init_process_group (e.g.
    /// tcp://10.0.0.1:29500): launch_env fails when its host or port differs
    /// from MASTER_ADDR/MASTER_PORT.
    #[arg(long, value_name = "URL")]
    pub init_method: Option<String>,
}

/// The backends selected; `explicit` when named rather than `auto`: a
/// backend named on the command line is required (missing: not ready),
/// while `auto` skips the ones a node lacks.
#[derive(Debug, Clone)]
pub struct BackendList(pub Vec<Backend>, pub bool);

fn parse_backends(text: &str) -> Result<BackendList, String> {
    if text.trim() == "auto" {
        return Ok(BackendList(Backend::ALL.to_vec(), false));
    }
    let mut list = Vec::new();
    for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let backend = Backend::ALL
            .into_iter()
            .find(|b| b.name() == name)
            .ok_or_else(|| format!("unknown backend `{name}`; valid: tcp, nccl, oneccl, auto"))?;
        if !list.contains(&backend) {
            list.push(backend);
        }
    }
    if list.is_empty() {
        return Err("name at least one backend, or auto".into());
    }
    Ok(BackendList(list, true))
}

#[derive(Debug, Args, Clone)]
pub struct DisplayArgs {
    /// Colour: auto (a terminal and NO_COLOR unset), always, never.
    #[arg(long, value_enum, default_value = "auto", value_name = "WHEN")]
    pub color: ColorChoice,
    /// Print only problems and the verdict.
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Print measured and expected values and durations for every check.
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub checklist: ChecklistArgs,
    #[command(flatten)]
    pub display: DisplayArgs,
    /// Report format.
    #[arg(long, value_enum, default_value = "human")]
    pub format: Format,
    /// Write the report to FILE (atomically) instead of stdout; stdout then
    /// gets the one-line verdict.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
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
    pub collective: Option<CollectiveMode>,
    /// Largest sweep size, e.g. 64MiB (default: 1MiB for run, 64MiB for
    /// bench).
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub max_size: Option<usize>,
    /// Sweep sizes grow by this factor: 2 or 4.
    #[arg(long, value_name = "2|4", default_value = "2", value_parser = parse_factor)]
    pub step_factor: usize,
    /// Untimed iterations per sweep step.
    #[arg(long, value_name = "N", default_value = "2")]
    pub warmup: u32,
    /// Timed iterations per sweep step.
    #[arg(long, value_name = "N", default_value = "5")]
    pub iters: u32,
    /// Deadline of each step (all its iterations): a hang at one size ends
    /// that backend's sweep, named, and the run goes on.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_span)]
    pub step_timeout: Span,
    /// The NCCL (or RCCL) library for the nccl backend, instead of the
    /// search: PREFLIGHT_NCCL_LIB, then libnccl.so.2 and librccl.so.1 by
    /// the loader, then Python's site-packages (nvidia/nccl/lib).
    #[arg(long, value_name = "PATH")]
    pub nccl_lib: Option<PathBuf>,
    /// The oneCCL C library (libccl.so.2, oneCCL 2022 or later) for the
    /// oneccl backend, instead of the search: PREFLIGHT_ONECCL_LIB, then
    /// the loader, then $CCL_ROOT/lib.
    #[arg(long, value_name = "PATH")]
    pub oneccl_lib: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CollectiveMode {
    Off,
    Short,
    Full,
}

fn parse_factor(text: &str) -> Result<usize, String> {
    match text.trim() {
        "2" => Ok(2),
        "4" => Ok(4),
        _ => Err("2 or 4".into()),
    }
}

/// "65536", "64K", "64KiB", "1M", "1MiB", "1G".
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("`{text}`: a size such as 65536, 64KiB or 64MiB"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("`{text}`: unknown unit (B, KiB, MiB, GiB)")),
    };
    n.checked_mul(mult)
        .filter(|s| *s <= 4 << 30)
        .ok_or_else(|| format!("`{text}`: at most 4 GiB"))
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
    #[arg(long, value_name = "FIRST-LAST", value_parser = crate::kinds::ports::PortRange::parse)]
    pub probe_ports: Option<crate::kinds::ports::PortRange>,
}

#[derive(Debug, Clone, Copy)]
pub struct Nproc(pub Option<u32>);

fn parse_nproc(text: &str) -> Result<Nproc, String> {
    if text.trim() == "auto" {
        return Ok(Nproc(None));
    }
    match text.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(Nproc(Some(n))),
        _ => Err("a number of ranks (1 or more), or auto".into()),
    }
}

impl ClusterArgs {
    pub fn flags(&self) -> crate::cluster::identity::Flags {
        crate::cluster::identity::Flags {
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            nproc_per_node: self.nproc_per_node.map(|n| n.0),
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            probe_ports: self.probe_ports,
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

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The check's id (see `preflight list`), or a kind's name.
    pub id: String,
    #[command(flatten)]
    pub checklist: ChecklistArgs,
}

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Checklist files or directories.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Print only errors.
    #[arg(short, long)]
    pub quiet: bool,
}
