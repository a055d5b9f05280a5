//! What a run is asked to do, as plain values: the command line builds
//! them (`commands::run_args`, in one place), and so do the Slurm modes
//! from the site's settings and the rank simulator from its own, without
//! writing a command line to parse again.

use std::path::PathBuf;

use preflight_collective::rank::Libraries;
use preflight_facts::Backend;
use preflight_ground::values::Span;
use preflight_kinds::ports::PortRange;
use preflight_report::format::Format;
use preflight_report::style::ColorChoice;

/// `run`, `check` or `bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `preflight check`: this node's checklist only.
    Checklist,
    /// `preflight run`: everything that applies.
    Full,
    /// `preflight bench`: the rendezvous and the collective stage's full
    /// sweep, no checklist.
    Bench,
}

impl Stage {
    pub fn command(self) -> &'static str {
        match self {
            Stage::Checklist => "check",
            Stage::Full => "run",
            Stage::Bench => "bench",
        }
    }
}

/// How the report reads to people.
#[derive(Debug, Clone)]
pub struct DisplaySettings {
    pub color: ColorChoice,
    /// Only problems and the verdict.
    pub quiet: bool,
    /// Measured and expected values and durations for every check.
    pub verbose: bool,
}

/// Which checks: the shipped checklist, added files, and selection.
#[derive(Debug, Clone)]
pub struct ChecklistSettings {
    /// Files, or directories of *.yaml and *.yml, whose checks are added
    /// (one with a shipped check's id replaces it).
    pub checks: Vec<PathBuf>,
    pub no_shipped: bool,
    pub only: Vec<String>,
    pub skip: Vec<String>,
    pub with: Vec<String>,
    /// Where /sys, /proc, /dev and /etc are read.
    pub root: PathBuf,
    pub backends: BackendList,
    /// The init method the job passes to init_process_group.
    pub init_method: Option<String>,
}

impl ChecklistSettings {
    /// The shipped checklist plus `checks`, nothing selected, this
    /// machine's root and every backend.
    pub fn shipped_with(checks: Vec<PathBuf>) -> ChecklistSettings {
        ChecklistSettings {
            checks,
            no_shipped: false,
            only: Vec::new(),
            skip: Vec::new(),
            with: Vec::new(),
            root: PathBuf::from("/"),
            backends: BackendList(Backend::ALL.to_vec(), false),
            init_method: None,
        }
    }

    /// Whether `--only` or `--with` names this check: an opt-in check
    /// runs only then.
    pub fn named(&self, c: &preflight_checklist::Check) -> bool {
        self.only.iter().chain(&self.with).any(|s| c.selected_by(s))
    }
}

/// The backends selected; `explicit` when named rather than `auto`: a
/// backend named is required (missing: not ready), while `auto` skips the
/// ones a node lacks.
#[derive(Debug, Clone)]
pub struct BackendList(pub Vec<Backend>, pub bool);

/// Node mode and the rendezvous address (`run` only; these win over the
/// launcher's variables).
#[derive(Debug, Clone, Default)]
pub struct ClusterSettings {
    pub nnodes: Option<u32>,
    pub node_rank: Option<u32>,
    pub nproc_per_node: Option<Nproc>,
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
    pub probe_ports: Option<PortRange>,
    pub require_secret: bool,
}

/// Ranks to start on this node: a number, or one per local accelerator
/// (`None`).
#[derive(Debug, Clone, Copy)]
pub struct Nproc(pub Option<u32>);

impl ClusterSettings {
    pub fn flags(&self) -> preflight_cluster::identity::Flags {
        preflight_cluster::identity::Flags {
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            nproc_per_node: self.nproc_per_node.map(|n| n.0),
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            probe_ports: self.probe_ports,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveMode {
    Off,
    Short,
    Full,
}

/// The collective stage as asked for; `run::collective_config` fills in
/// each command's defaults.
#[derive(Debug, Clone)]
pub struct CollectiveSettings {
    pub collective: Option<CollectiveMode>,
    pub max_size: Option<usize>,
    /// 2 or 4.
    pub step_factor: usize,
    pub warmup: Option<u32>,
    pub iters: Option<u32>,
    pub step_timeout: Span,
    /// A library backend's library where the operator names one.
    pub libraries: Libraries,
}

/// Everything `run`, `check` and `bench` take.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub checklist: ChecklistSettings,
    pub display: DisplaySettings,
    /// A profile file, or a fleet's directory of them.
    pub profile: Option<PathBuf>,
    pub format: Format,
    pub output: Option<PathBuf>,
    pub json_report: Option<PathBuf>,
    /// Kubernetes' termination message (`off` turns it off).
    pub termination_log: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub fresh: bool,
    pub max_concurrent: Option<u16>,
    pub no_slow_now: bool,
    pub post: Option<reqwest::Url>,
    /// The whole run's deadline, longer than zero.
    pub timeout: Span,
    pub strict: bool,
    pub cluster: ClusterSettings,
    pub collective: CollectiveSettings,
}

impl RunSettings {
    /// As the command line would give them with no flag but a deadline:
    /// the shipped checklist, human output, every stage's defaults.
    pub fn new(timeout: Span) -> RunSettings {
        RunSettings {
            checklist: ChecklistSettings::shipped_with(Vec::new()),
            display: DisplaySettings {
                color: ColorChoice::Auto,
                quiet: false,
                verbose: false,
            },
            profile: None,
            format: Format::Human,
            output: None,
            json_report: None,
            termination_log: None,
            state_dir: None,
            fresh: false,
            max_concurrent: None,
            no_slow_now: false,
            post: None,
            timeout,
            strict: false,
            cluster: ClusterSettings::default(),
            collective: CollectiveSettings {
                collective: None,
                max_size: None,
                step_factor: 2,
                warmup: None,
                iters: None,
                step_timeout: Span(std::time::Duration::from_secs(10)),
                libraries: Libraries::default(),
            },
        }
    }
}
