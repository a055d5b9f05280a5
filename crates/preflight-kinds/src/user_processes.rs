//! `user_processes`: no process of the job's user is left on the node
//! (what a Slurm epilog checks after the job: a daemonised child escapes
//! proctrack/linuxproc and holds GPU memory, ports or files into the next
//! job). Reads /proc/PID/status under --root.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params};
use preflight_facts::{Facts, procs};
use preflight_result::Finding;

/// Processes named in a message; the count says how many more there are.
const LISTED: usize = 8;

pub const KIND: KindInfo = KindInfo {
    name: "user_processes",
    scope: crate::Scope::Node,
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
            return Finding::error(format!("{}=`{raw}` is not a numeric uid", self.uid_var))
                .about_variables([self.uid_var.clone()]);
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
                preflight_ground::values::count(left.len(), "process"),
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
            .measured(preflight_ground::values::count(left.len(), "process"))
            .var("uid", uid.to_string())
            .var("pids", pids)
    }
}

impl Probe for UserProcesses {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A /proc of `(pid, name, uid)` under a temporary root.
    fn root(procs: &[(u32, &str, u32)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (pid, name, uid) in procs {
            let p = dir.path().join(format!("proc/{pid}"));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(
                p.join("status"),
                format!("Name:\t{name}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
            )
            .unwrap();
        }
        dir
    }

    fn check(dir: &tempfile::TempDir, env: &[(&str, &str)], params: UserProcesses) -> Finding {
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let facts = Facts::new(dir.path().to_path_buf(), env, Vec::new());
        params.check(&facts)
    }

    fn defaults() -> UserProcesses {
        UserProcesses {
            uid_var: default_var(),
            ignore: default_ignore(),
        }
    }

    #[test]
    fn names_eight_and_counts_the_rest() {
        let procs: Vec<(u32, &str, u32)> = (100..112).map(|p| (p, "python3", 1000)).collect();
        let dir = root(&procs);
        let f = check(&dir, &[("SLURM_JOB_UID", "1000")], defaults());
        assert_eq!(f.status, preflight_result::Status::Fail);
        assert_eq!(
            f.message,
            "12 processes of uid 1000 left after the job: 100 python3, 101 python3, 102 python3, 103 python3, 104 python3, 105 python3, 106 python3, 107 python3 (+4 more)"
        );
    }

    #[test]
    fn the_default_ignore_list_and_other_users_leave_it_passing() {
        let dir = root(&[
            (10, "systemd", 1000),
            (11, "(sd-pam)", 1000),
            (12, "sshd", 1000),
            (13, "python3", 1001),
            (14, "bash", 0),
        ]);
        let f = check(&dir, &[("SLURM_JOB_UID", "1000")], defaults());
        assert_eq!(f.status, preflight_result::Status::Pass, "{}", f.message);
        // An ignore list of its own replaces the default.
        let f = check(
            &dir,
            &[("SLURM_JOB_UID", "1000")],
            UserProcesses {
                ignore: vec!["sshd".into()],
                ..defaults()
            },
        );
        assert_eq!(
            f.message,
            "2 processes of uid 1000 left after the job: 10 systemd, 11 (sd-pam)"
        );
    }

    #[test]
    fn root_unset_and_bad_uids() {
        let dir = root(&[(10, "python3", 0)]);
        use preflight_result::Status;
        assert_eq!(
            check(&dir, &[("SLURM_JOB_UID", "0")], defaults()).status,
            Status::Skip
        );
        assert_eq!(check(&dir, &[], defaults()).status, Status::Skip);
        assert_eq!(
            check(&dir, &[("SLURM_JOB_UID", " ")], defaults()).status,
            Status::Skip
        );
        let bad = check(&dir, &[("SLURM_JOB_UID", "alice")], defaults());
        assert_eq!(bad.status, Status::Error);
        assert_eq!(bad.message, "SLURM_JOB_UID=`alice` is not a numeric uid");
        // Another variable, as a site's epilog may use.
        let f = check(
            &dir,
            &[("JOB_UID", "0")],
            UserProcesses {
                uid_var: "JOB_UID".into(),
                ..defaults()
            },
        );
        assert!(f.message.starts_with("JOB_UID=0"), "{}", f.message);
    }
}
