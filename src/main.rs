//! preflight: is every node and backend ready for the distributed job?

// Hardware probes read sysfs and load NVML through safe wrappers only.
#![forbid(unsafe_code)]

mod checklist;
mod cli;
mod cluster;
mod collective;
mod commands;
mod engine;
mod exit;
mod facts;
mod kinds;
mod report;
mod result;
mod suggest;

use clap::Parser;

use cli::{Cli, Command};
use commands::Stage;

fn main() {
    let cli = Cli::parse();
    let outcome = match &cli.command {
        Command::Run(args) => commands::run(args, Stage::Full),
        Command::Check(args) => commands::run(args, Stage::Checklist),
        Command::Bench(args) => commands::run(args, Stage::Bench),
        Command::List(args) => commands::list(args),
        Command::Explain(args) => commands::explain(args),
        Command::Validate(args) => commands::validate(args),
        Command::CollectiveWorker => std::process::exit(collective::worker::main()),
    };
    let code = match outcome {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("{failure}");
            failure.exit_code()
        }
    };
    std::process::exit(code.code());
}
