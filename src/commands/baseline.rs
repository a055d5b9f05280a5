//! `preflight baseline`: node profiles from known-good nodes, and a node
//! against a profile.
//!
//! - `capture [--root DIR] [--output FILE] [--name NAME] [--from
//!   REPORT... [--fraction F]]`: this node, as it is now, written as a
//!   profile (YAML, to stdout unless `--output`); with `--from`, the
//!   measured floors of a healthy run's reports too (`preflight_run::floors`).
//! - `diff PROFILE [--root DIR]`: this node against the profile, each
//!   difference named (the PCI address, the port, the count); exit 0 when
//!   it matches, 1 when it does not, 2 for a profile that does not read.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::Failure;
use preflight_facts::Facts;
use preflight_facts::profile::{self, Inventory};
use preflight_ground::exit::ExitCode;
use preflight_report::output::{Destination, write_report, write_stdout};

#[derive(Debug, Args)]
pub struct BaselineArgs {
    #[command(subcommand)]
    pub action: BaselineAction,
}

#[derive(Debug, Subcommand)]
pub enum BaselineAction {
    /// Write a profile of this node as it is now (a known-good node): its
    /// accelerators, their PCIe link, its active RDMA ports, its memory.
    Capture {
        /// Read /sys, /proc and /etc under this directory instead of /.
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
        /// Write the profile to FILE instead of stdout.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// The profile's name.
        #[arg(long, default_value = "site-node")]
        name: String,
        /// Also the measured floors, from the JSON reports of a healthy
        /// `preflight run` (files, or directories of *.json): bus bandwidth
        /// per backend and operation at the largest size, and the pairs
        /// between nodes.
        #[arg(long, value_name = "REPORT", num_args = 1..)]
        from: Vec<PathBuf>,
        /// The floors as this fraction of the median measured.
        #[arg(long, default_value_t = 0.8, requires = "from")]
        fraction: f64,
    },
    /// This node against PROFILE: every difference named; exit 0 when it
    /// matches, 1 when it does not.
    Diff {
        /// A profile file (YAML: `profile`, `match`, `expect`), or a
        /// directory of them (the one this node's facts match).
        profile: PathBuf,
        /// Read /sys, /proc and /etc under this directory instead of /.
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
        /// Compare the PCIe links' width only, not their speed (GPUs that
        /// lower their link speed when idle).
        #[arg(long)]
        no_speed: bool,
    },
}

fn node(root: &std::path::Path) -> Result<Inventory, Failure> {
    if !root.is_dir() {
        return Err(Failure::Usage(format!(
            "--root {}: not a directory",
            root.display()
        )));
    }
    let facts = Facts::from_process(root.to_path_buf(), Vec::new());
    Ok(Inventory::of(&facts))
}

pub fn baseline(args: &BaselineArgs) -> Result<ExitCode, Failure> {
    match &args.action {
        BaselineAction::Capture {
            root,
            output,
            name,
            from,
            fraction,
        } => {
            let mut text = profile::capture(&node(root)?, name).map_err(Failure::Usage)?;
            if !from.is_empty() {
                text.push_str(
                    &preflight_run::floors::floors(from, *fraction).map_err(Failure::Usage)?,
                );
            }
            // What it wrote must read back as a profile.
            profile::parse("captured", &text).map_err(|e| {
                let said: Vec<String> = e.iter().map(ToString::to_string).collect();
                Failure::Usage(format!(
                    "the captured profile does not read: {}",
                    said.join("; ")
                ))
            })?;
            let to = match output {
                Some(path) => Destination::File(path.clone()),
                None => Destination::Stdout,
            };
            write_report(&to, &text)
                .map_err(|e| Failure::Usage(format!("cannot write the profile: {e}")))?;
            Ok(ExitCode::Ready)
        }
        BaselineAction::Diff {
            profile: path,
            root,
            no_speed,
        } => {
            let given = profile::load_given(path).map_err(|e| {
                let said: Vec<String> = e.iter().map(ToString::to_string).collect();
                Failure::Usage(said.join("\nerror: "))
            })?;
            let node = node(root)?;
            let Some(p) = profile::select(&node, Some(&given)) else {
                write_stdout(&format!(
                    "{}: no profile in {} matches this node (nor a shipped one)\n",
                    node.host,
                    path.display()
                ))
                .map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
                return Ok(ExitCode::NotReady);
            };
            let differences = profile::diff(&p, &node, !no_speed);
            let mut text = String::new();
            if differences.is_empty() {
                text.push_str(&format!("{}: matches {}\n", node.host, p.named()));
            } else {
                text.push_str(&format!(
                    "{}: {} difference{} from {}\n",
                    node.host,
                    differences.len(),
                    if differences.len() == 1 { "" } else { "s" },
                    p.named()
                ));
                for d in &differences {
                    text.push_str(&format!("  {d}\n"));
                }
            }
            let e = &p.expect;
            let elsewhere: Vec<&str> = [
                (e.nvlink.is_some(), "nvlink (nvidia.nvlink)"),
                (e.xgmi.is_some(), "xgmi (amd.xgmi)"),
                (e.scale_out.is_some(), "scale_out (habana.nic_ports)"),
                (
                    e.floors.is_some(),
                    "floors (collective.floors, in preflight run)",
                ),
            ]
            .into_iter()
            .filter_map(|(set, what)| set.then_some(what))
            .collect();
            if !elsewhere.is_empty() {
                text.push_str(&format!(
                    "  (not compared here, the checks read them from the profile: {})\n",
                    elsewhere.join(", ")
                ));
            }
            write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
            Ok(if differences.is_empty() {
                ExitCode::Ready
            } else {
                ExitCode::NotReady
            })
        }
    }
}
