//! `preflight completions SHELL`: a completion script for bash, zsh or
//! fish, generated from the command line's own definition (the packages
//! install one for each shell where that shell looks).

use clap::ValueEnum;
use clap_complete::Shell as Generator;

use super::Failure;
use preflight_ground::exit::ExitCode;
use preflight_report::output::write_stdout;

/// The shells a package installs a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

impl Shell {
    fn generator(self) -> Generator {
        match self {
            Shell::Bash => Generator::Bash,
            Shell::Zsh => Generator::Zsh,
            Shell::Fish => Generator::Fish,
        }
    }
}

/// The script for `shell`, completing `command`'s subcommands and flags,
/// the internal (hidden) ones left out.
pub fn script(shell: Shell, command: clap::Command) -> String {
    let mut command = without_hidden(&command);
    let mut out = Vec::new();
    let name = command.get_name().to_string();
    clap_complete::generate(shell.generator(), &mut command, name, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

pub fn completions(shell: Shell, command: clap::Command) -> Result<ExitCode, Failure> {
    write_stdout(&script(shell, command))
        .map_err(|e| Failure::Usage(format!("cannot write the completion script: {e}")))?;
    Ok(ExitCode::Ready)
}

/// `command` with its hidden subcommands and flags left out, at every
/// level: clap_complete offers everything it is given (a flag `check`
/// refuses included), and clap has no way to remove one, so the tree is
/// rebuilt from the visible parts.
fn without_hidden(command: &clap::Command) -> clap::Command {
    let mut copy = clap::Command::new(command.get_name().to_string())
        .args(
            command
                .get_arguments()
                .filter(|a| !a.is_hide_set())
                .cloned(),
        )
        .subcommand_required(command.is_subcommand_required_set());
    if let Some(about) = command.get_about() {
        copy = copy.about(about.clone());
    }
    if let Some(version) = command.get_version() {
        copy = copy.version(version.to_string());
    }
    copy.subcommands(
        command
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(without_hidden),
    )
}
