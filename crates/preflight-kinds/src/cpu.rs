//! `cpu`: the CPUs a job gets: how many are online, their frequency
//! governor, and the container's cgroup CPU quota and memory limit, which
//! throttle data loaders and kill ranks with no message from the job.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params, problems_finding,
};
use preflight_facts::{Facts, cgroup};
use preflight_ground::values::{Bytes, format_bytes};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "cpu",
    scope: crate::Scope::Rank,
    area: "cpu",
    summary: "Online CPUs, the frequency governor, and cgroup CPU quota and memory limit meet expectations.",
    params: &[
        ParamDoc {
            name: "min_cpus",
            ty: "integer",
            default: Some("unset"),
            doc: "At least this many CPUs must be online (/sys/devices/system/cpu/online).",
        },
        ParamDoc {
            name: "governor",
            ty: "string",
            default: Some("unset"),
            doc: "Every CPU's scaling_governor must be this (e.g. performance). Machines without cpufreq (VMs) pass.",
        },
        ParamDoc {
            name: "cpus_per_rank",
            ty: "number",
            default: Some("unset"),
            doc: "The cgroup CPU quota must allow this many CPUs per local rank (LOCAL_WORLD_SIZE, else 1).",
        },
        ParamDoc {
            name: "min_cgroup_memory",
            ty: "size",
            default: Some("unset"),
            doc: "The cgroup memory limit must be unlimited or at least this.",
        },
    ],
    hint_vars: &["online", "governor", "cgroup"],
    parse: parse_params::<Cpu>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Cpu {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_cpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    governor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cpus_per_rank: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_cgroup_memory: Option<Bytes>,
}

impl Params for Cpu {
    fn validate(&self) -> Result<(), String> {
        if self.min_cpus.is_none()
            && self.governor.is_none()
            && self.cpus_per_rank.is_none()
            && self.min_cgroup_memory.is_none()
        {
            return Err(
                "cpu needs an expectation: min_cpus, governor, cpus_per_rank or min_cgroup_memory"
                    .into(),
            );
        }
        Ok(())
    }
}

/// "0-63,128-191" to the number of CPUs.
pub fn count_cpu_list(text: &str) -> Option<u32> {
    let mut n = 0;
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<u32>().ok()?.checked_sub(a.parse::<u32>().ok()?)? + 1,
            None => {
                part.parse::<u32>().ok()?;
                1
            }
        };
    }
    Some(n)
}

impl Cpu {
    fn governors(&self, facts: &Facts) -> Vec<(String, String)> {
        let dir = facts.host_path("/sys/devices/system/cpu");
        let mut found: Vec<(String, String)> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        let is_cpu = name.strip_prefix("cpu").is_some_and(|n| {
                            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                        });
                        if !is_cpu {
                            return None;
                        }
                        let g = std::fs::read_to_string(e.path().join("cpufreq/scaling_governor"))
                            .ok()?;
                        Some((name, g.trim().to_string()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        found.sort_by_key(|(n, _)| n[3..].parse::<u32>().unwrap_or(0));
        found
    }

    fn check(&self, facts: &Facts) -> Result<Finding, String> {
        let mut problems = Vec::new();
        let mut notes = Vec::new();
        let online_path = "/sys/devices/system/cpu/online";
        let online = std::fs::read_to_string(facts.host_path(online_path))
            .map_err(|e| format!("cannot read {online_path}: {e}"))?;
        let online_n = count_cpu_list(&online)
            .ok_or_else(|| format!("{online_path}: `{}` is not a CPU list", online.trim()))?;
        notes.push(format!("{online_n} CPUs online"));
        if let Some(min) = self.min_cpus
            && online_n < min
        {
            problems.push(format!(
                "{online_n} CPUs online ({}), expected at least {min}",
                online.trim()
            ));
        }
        let mut governor_seen = String::from("none");
        if let Some(want) = &self.governor {
            let govs = self.governors(facts);
            if govs.is_empty() {
                notes.push("no cpufreq governor".into());
            } else {
                let mut others: Vec<(String, Vec<String>)> = Vec::new();
                for (cpu, g) in &govs {
                    if g != want {
                        match others.iter_mut().find(|(name, _)| name == g) {
                            Some((_, cpus)) => cpus.push(cpu.clone()),
                            None => others.push((g.clone(), vec![cpu.clone()])),
                        }
                    }
                }
                governor_seen = govs[0].1.clone();
                for (g, cpus) in &others {
                    let shown = if cpus.len() > 4 {
                        format!("{} CPUs ({}, ...)", cpus.len(), cpus[..4].join(", "))
                    } else {
                        cpus.join(", ")
                    };
                    problems.push(format!("governor {g} on {shown}, expected {want}"));
                }
                if others.is_empty() {
                    notes.push(format!("governor {want}"));
                }
            }
        }
        let mut cgroup_text = String::from("not checked");
        let cgroup_file = facts.host_path("/proc/self/cgroup");
        let wants_cgroup = self.cpus_per_rank.is_some() || self.min_cgroup_memory.is_some();
        if wants_cgroup && !facts.is_live() && !cgroup_file.exists() {
            // Membership belongs to a process; a fixture tree has none.
            notes.push("no /proc/self/cgroup under --root: cgroup limits not checked".into());
        } else if wants_cgroup {
            let limits = cgroup::limits(&cgroup_file, &facts.host_path("/sys/fs/cgroup"))?;
            cgroup_text = format!(
                "cgroup {}: cpu {}, memory {}",
                limits.version,
                limits.cpus.map_or("max".into(), |c| format!("{c:.1} CPUs")),
                limits.memory.map_or("max".into(), format_bytes)
            );
            notes.push(cgroup_text.clone());
            if let (Some(per), Some(cpus)) = (self.cpus_per_rank, limits.cpus) {
                let ranks = facts.launch().local_world_size.unwrap_or(1);
                let want = per * ranks as f64;
                if cpus + 1e-9 < want {
                    problems.push(format!(
                        "the cgroup CPU quota is {cpus:.1} CPUs, expected at least {want:.1} ({per} per rank x {ranks} local ranks)"
                    ));
                }
            }
            if let (Some(min), Some(mem)) = (self.min_cgroup_memory, limits.memory)
                && mem < min.0
            {
                problems.push(format!(
                    "the cgroup memory limit is {}, expected at least {min}",
                    format_bytes(mem)
                ));
            }
        }
        let finding = if problems.is_empty() {
            Finding::pass(notes.join(", "))
        } else {
            problems_finding(&problems)
        };
        Ok(finding
            .measured(notes.join(", "))
            .var("online", online_n.to_string())
            .var("governor", governor_seen)
            .var("cgroup", cgroup_text))
    }
}

impl Probe for Cpu {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts).unwrap_or_else(Finding::error))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_lists() {
        assert_eq!(super::count_cpu_list("0-63,128-191\n"), Some(128));
        assert_eq!(super::count_cpu_list("0"), Some(1));
        assert_eq!(super::count_cpu_list("5-3"), None);
        assert_eq!(super::count_cpu_list("x"), None);
    }
}
