//! `preflight validate FILE...`: lint checklists without running them. The
//! files are checked as one set, as `--checks` would load them.
//! `preflight validate --site [DIR]`: the site configuration the `slurm`
//! modes read (settings.yaml and checks.d/), including that every mode's
//! `only` and `skip` name a check or tag that exists.

use std::path::{Path, PathBuf};

use clap::Args;

use super::Failure;
use crate::run::selection::{all_checks, expand_paths, load_added, select};
use crate::run::settings::ChecklistSettings;
use crate::run::site::{OnSquat, Settings};
use preflight_checklist::{ChecklistError, ChecklistErrors};
use preflight_ground::exit::ExitCode;
use preflight_kinds::ports::PortRange;
use preflight_report::output::write_stdout;

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Checklist files or directories.
    #[arg(required_unless_present = "site", value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Validate the site configuration (settings.yaml and checks.d/*.yaml)
    /// that `preflight slurm` reads.
    #[arg(long)]
    pub site: bool,
    /// With --site: the configuration directory (default:
    /// PREFLIGHT_CONFIG_DIR, else /etc/preflight).
    #[arg(long, value_name = "DIR", requires = "site")]
    pub config_dir: Option<PathBuf>,
    /// Print only errors.
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn validate(args: &ValidateArgs) -> Result<ExitCode, Failure> {
    if args.site {
        return site(
            &Settings::dir_from_env(args.config_dir.as_deref()),
            args.quiet,
        );
    }
    let files = expand_paths(&args.files)?;
    if files.is_empty() {
        return Err(Failure::Usage(
            "no *.yaml or *.yml files to validate".into(),
        ));
    }
    let checks = load_added(&files)?;
    // Valid, but most likely not what its author meant.
    for file in &files {
        let name = format!("{}:", file.display());
        if !checks.iter().any(|c| c.source.starts_with(&name)) {
            eprintln!(
                "warning: {}: no checks (an empty file, or `checks:` with no list under it)",
                file.display()
            );
        }
    }
    preflight_checklist::assemble(Vec::new(), checks)
        .map_err(Failure::Checklist)
        .and_then(|checks| {
            if !args.quiet {
                let text = format!(
                    "ok: {}, {}\n",
                    preflight_ground::values::count(files.len(), "file"),
                    preflight_ground::values::count(checks.len(), "check")
                );
                write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
            }
            Ok(ExitCode::Ready)
        })
}

/// Fewer ports than this in a range a local user can bind whole in a
/// moment.
const FEW_PORTS: u32 = 16;

/// What a local user can do with the prolog's ranges.
fn range_warnings(settings: &Settings, ephemeral: Option<PortRange>) -> Vec<String> {
    let mut out = Vec::new();
    let ranges = [
        ("prolog.ports", Some(settings.prolog_ports)),
        ("prolog.probe_ports", settings.prolog_probe_ports),
    ];
    for (name, range) in ranges {
        let Some(r) = range else { continue };
        let count = u32::from(r.last - r.first) + 1;
        if count < FEW_PORTS {
            out.push(format!(
                "{name} {r} holds {count} ports: any local user can bind them all before a job; {}",
                if name == "prolog.ports" {
                    match settings.prolog_on_squat {
                        OnSquat::Run => "the job then runs unchecked (on_squat: run)",
                        OnSquat::Hold => "the job is then held (on_squat: hold): anyone can hold any job whose rank 0 lands on their node",
                    }
                } else {
                    "the probe listener then takes an ephemeral port, which a firewall may drop"
                }
            ));
        }
        if let Some(e) = ephemeral
            && r.first <= e.last
            && e.first <= r.last
        {
            out.push(format!(
                "{name} {r} is inside the kernel's ephemeral range {e} (net.ipv4.ip_local_port_range): any program's outgoing connection may take one of its ports"
            ));
        }
    }
    out
}

/// The site configuration as the `slurm` modes will read it.
/// Every error at once: the settings' (each bad entry replaced by its
/// default so the rest is still checked), the site checklists', and each
/// mode's selection against the checks there are.
fn site(dir: &Path, quiet: bool) -> Result<ExitCode, Failure> {
    let (settings, mut errors) = Settings::load_all(dir);
    let checks_dir = settings.checks_dir();
    let files = if checks_dir.is_dir() {
        expand_paths(std::slice::from_ref(&checks_dir))?
    } else {
        Vec::new()
    };
    let shipped = ChecklistSettings::shipped_with(files.clone());
    match all_checks(&shipped) {
        Ok(_) => {
            for (name, mode) in [
                ("healthcheck", &settings.healthcheck),
                ("prolog", &settings.prolog),
                ("epilog", &settings.epilog),
            ] {
                let selection = ChecklistSettings {
                    only: mode.only.clone(),
                    skip: mode.skip.clone(),
                    with: mode.with.clone(),
                    ..shipped.clone()
                };
                let problem = match select(all_checks(&shipped)?, &selection) {
                    Ok(c) if c.is_empty() => {
                        Some("`only` and `skip` leave no check to run".to_string())
                    }
                    Ok(_) => None,
                    Err(e) => Some(e.to_string().trim_start_matches("error: ").to_string()),
                };
                if let Some(message) = problem {
                    errors.push(ChecklistError {
                        file: settings.source.clone(),
                        location: None,
                        path: name.to_string(),
                        message,
                    });
                }
            }
        }
        Err(Failure::Checklist(ChecklistErrors(mut e))) => errors.append(&mut e),
        Err(other) => return Err(other),
    }
    // The site's profile, where it has one: its errors are located.
    let profile = settings.profile_file();
    if let Some(path) = &profile
        && let Err(e) = preflight_facts::profile::load_given(path)
    {
        errors.extend(e.into_iter().map(|e| ChecklistError {
            file: e.file,
            location: e.location,
            path: e.path,
            message: e.message,
        }));
    }
    if !errors.is_empty() {
        return Err(Failure::Checklist(ChecklistErrors(errors)));
    }
    // What a local user can do with the prolog's port ranges: said, not
    // refused (a site may have its reasons).
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| {
            let mut it = t.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some(PortRange {
                first: it.next()??,
                last: it.next()??,
            })
        });
    for w in range_warnings(&settings, ephemeral) {
        eprintln!("warning: {w}");
    }
    if !quiet {
        let text = format!(
            "ok: {} ({}), {} in {}{}\n",
            dir.display(),
            settings.source,
            preflight_ground::values::count(files.len(), "site checklist file"),
            checks_dir.display(),
            profile
                .map(|p| format!(", node profile {}", p.display()))
                .unwrap_or_default()
        );
        write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
    }
    Ok(ExitCode::Ready)
}
