//! The command line: the command tree and its dispatch. The commands are
//! listed once, in [`Command`]; the docs' tables are tested against it.

use clap::{Parser, Subcommand};

use crate::commands::{
    self, BaselineArgs, ExplainArgs, ListArgs, ReportArgs, RunArgs, SlurmArgs, Stage, ValidateArgs,
};

/// Is every node and backend ready for the distributed job? Names the node,
/// port, interface or variable that is not, and how to fix it.
#[derive(Debug, Parser)]
#[command(name = "preflight", version, max_term_width = 100)]
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
    /// The programs slurmd runs: healthcheck (HealthCheckProgram), prolog,
    /// epilog. Settings come from /etc/preflight (PREFLIGHT_CONFIG_DIR);
    /// a node that is not ready is drained with a reason naming the check.
    Slurm(SlurmArgs),
    /// Merge JSON reports (a run's, or many nodes' gathered by Ansible or
    /// Slurm) into one cluster report: HTML, Markdown or JSON.
    Report(ReportArgs),
    /// Node profiles: `capture` writes one from a known-good node, `diff`
    /// shows this node against one (exit 1 when it differs).
    Baseline(BaselineArgs),
    /// A running job on this node: each rank's state from /proc, and the
    /// rank that holds the others up, named only on evidence (exit 0:
    /// nothing holds it up, 1: a rank named, 3: could not tell). Changes
    /// nothing in the job.
    Diagnose(commands::DiagnoseArgs),
    /// A Kubernetes mutating admission webhook (HTTPS, `POST /mutate`):
    /// pods labelled preflight.dev/gate=gang get an init container that runs
    /// `preflight run` from the pod's own environment, =node one that runs
    /// `preflight check`; every other pod is allowed unchanged.
    Webhook(commands::WebhookArgs),
    /// Print a fresh 128-bit job secret (32 hex digits) for PREFLIGHT_TOKEN
    /// or PREFLIGHT_TOKEN_FILE: make one per job, give it to every node.
    Token,
    /// Print a completion script for SHELL (bash, zsh or fish), e.g.
    /// `preflight completions bash > /etc/bash_completion.d/preflight`.
    Completions {
        #[arg(value_enum)]
        shell: commands::Shell,
    },
    /// Internal: write the manual pages into DIR (tools/release.sh).
    #[command(hide = true)]
    ManPages {
        #[arg(value_name = "DIR")]
        dir: std::path::PathBuf,
    },
    /// Internal: one library backend of one rank, started by `run` and
    /// `bench` (see crates/preflight-collective/src/worker.rs).
    #[command(hide = true)]
    CollectiveWorker,
}

/// The command tree as the user sees it: `check` and `bench` share
/// `run`'s argument struct, with the flags each ignores hidden (and
/// refused), so each command's help, man page and completions list
/// exactly the flags it takes.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
        .after_help(preflight_ground::exit::help_text())
        .mut_subcommand("check", |c| commands::hide_ignored(Stage::Checklist, c))
        .mut_subcommand("bench", |c| commands::hide_ignored(Stage::Bench, c))
}

/// Parses the command line, runs the command, and returns the process's
/// exit code; a command that cannot do its job says why on stderr.
pub fn main() -> i32 {
    let matches = command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // A flag the command would ignore is the operator's mistake to hear of.
    let run = |args: &RunArgs, stage: Stage, name: &str| {
        let sub = matches.subcommand_matches(name);
        match sub.map(|m| commands::unused_flags(stage, m)) {
            Some(Err(e)) => Err(commands::Failure::Usage(e)),
            _ => commands::run(args, stage),
        }
    };
    let outcome = match &cli.command {
        Command::Run(args) => run(args, Stage::Full, "run"),
        Command::Check(args) => run(args, Stage::Checklist, "check"),
        Command::Bench(args) => run(args, Stage::Bench, "bench"),
        Command::List(args) => commands::list(args),
        Command::Explain(args) => commands::explain(args),
        Command::Validate(args) => commands::validate(args),
        Command::Slurm(args) => commands::slurm(args),
        Command::Report(args) => commands::report(args),
        Command::Baseline(args) => commands::baseline(args),
        Command::Diagnose(args) => commands::diagnose(args),
        Command::Webhook(args) => commands::webhook(args),
        Command::Token => commands::token(),
        Command::Completions { shell } => commands::completions(*shell, command()),
        Command::ManPages { dir } => commands::man_pages(command(), dir),
        Command::CollectiveWorker => return preflight_collective::worker::main(),
    };
    let code = match outcome {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("{failure}");
            failure.exit_code()
        }
    };
    code.code()
}
