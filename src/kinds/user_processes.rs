//! `user_processes`: no process of the job's user is left on the node
//! (what a Slurm epilog checks after the job: a daemonised child escapes
//! proctrack/linuxproc and holds GPU memory, ports or files into the next
//! job). Reads /proc/PID/status under --root.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params};
use crate::facts::{Facts, procs};
use crate::result::Finding;

/// Processes named in a message; the count says how many more there are.
const LISTED: usize = 8;

pub const KIND: KindInfo = KindInfo {
    name: "user_processes",
    area: "system",
    summary: "No process of the job's user (by uid, from a variable such as SLURM_JOB_UID) is left on the node. Skipped when the variable is unset or names root.",
    params: &[
        ParamDoc {
            name: "uid_var",
            ty: "string",
            default: Some("SLURM_JOB_UID"),
            doc: "The variable holding the user's numeric uid.",
        },
        ParamDoc {
            name: "ignore",
            ty: "list of strings",
            default: Some("[systemd, (sd-pam), sshd]"),
            doc: "Command names (/proc/PID/comm) that may stay: a user's session manager, an ssh login of the same user.",
        },
    ],
    hint_vars: &["uid", "pids"],
    parse: parse_params::<UserProcesses>,
};

fn default_var() -> String {
    "SLURM_JOB_UID".into()
}

fn default_ignore() -> Vec<String> {
    ["systemd", "(sd-pam)", "sshd"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserProcesses {
    #[serde(default = "default_var")]
    uid_var: String,
    #[serde(default = "default_ignore")]
    ignore: Vec<String>,
}

impl Params for UserProcesses {
    fn validate(&self) -> Result<(), String> {
        if self.uid_var.trim().is_empty() {
            return Err("`uid_var` names no variable".into());
        }
        Ok(())
    }
}

impl UserProcesses {
    fn check(&self, facts: &Facts) -> Finding {
        let Some(raw) = facts.env(&self.uid_var).filter(|v| !v.trim().is_empty()) else {
            return Finding::skip(format!(
                "{} is unset: no job user to look for (Slurm sets it for a prolog and an epilog)",
                self.uid_var
            ));
        };
        let Ok(uid) = raw.trim().parse::<u32>() else {
            return Finding::error(format!("{}=`{raw}` is not a numeric uid", self.uid_var));
        };
        if uid == 0 {
            return Finding::skip(format!(
                "{}=0: root's processes are the node's own",
                self.uid_var
            ));
        }
        let ours = std::process::id();
        let left: Vec<(u32, String)> = procs::owned_by(&facts.host_path("/proc"), uid)
            .into_iter()
            .filter(|(pid, name)| *pid != ours && !self.ignore.iter().any(|i| i == name))
            .collect();
        let pids = left
            .iter()
            .map(|(p, _)| p.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let finding = if left.is_empty() {
            Finding::pass(format!("no process of uid {uid} is left"))
        } else {
            let named: Vec<String> = left
                .iter()
                .take(LISTED)
                .map(|(p, n)| format!("{p} {n}"))
                .collect();
            let more = left.len().saturating_sub(LISTED);
            Finding::fail(format!(
                "{} of uid {uid} left after the job: {}{}",
                crate::values::count(left.len(), "process"),
                named.join(", "),
                if more > 0 {
                    format!(" (+{more} more)")
                } else {
                    String::new()
                }
            ))
            .expected("none")
        };
        finding
            .measured(crate::values::count(left.len(), "process"))
            .var("uid", uid.to_string())
            .var("pids", pids)
    }
}

impl Probe for UserProcesses {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}
