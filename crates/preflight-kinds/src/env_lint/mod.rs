//! `env_lint`: every set variable of the communication and accelerator
//! stacks is one they know, with a value they accept and that fits this
//! node. A misspelt variable is silently ignored by the library, and many
//! bad values only surface as a hang at the first collective.

mod catalog;
mod rules;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params};
use catalog::Catalog;
use preflight_facts::Facts;
use preflight_result::Finding;

pub const PREFIXES: &[&str] = &[
    "NCCL_",
    "TORCH_NCCL_",
    "TORCH_DISTRIBUTED_",
    "GLOO_",
    "CCL_",
    "FI_",
    "I_MPI_",
    "UCX_",
    "ZE_",
    "CUDA_",
    "HIP_",
    "ROCR_",
    "RCCL_",
    "HSA_",
    "HCCL_",
    "HABANA_",
    "PET_",
    "LWS_",
    "JOBSET_",
];

pub const KIND: KindInfo = KindInfo {
    name: "env_lint",
    scope: crate::Scope::Rank,
    area: "environment",
    summary: "Every set NCCL_, TORCH_NCCL_, GLOO_, CCL_, FI_, I_MPI_, UCX_, ZE_, CUDA_, HIP_, ROCR_, HCCL_, HABANA_, PET_, LWS_, JOBSET_ variable is known (else \"did you mean\"), has a valid value, and fits this node's interfaces and HCAs.",
    params: &[
        ParamDoc {
            name: "prefixes",
            ty: "list of strings",
            default: Some("all linted prefixes"),
            doc: "Lint only variables with these prefixes.",
        },
        ParamDoc {
            name: "variables",
            ty: "list of strings",
            default: Some("all set variables"),
            doc: "Lint only these variables (for a check about one setting, such as NCCL_IB_DISABLE).",
        },
        ParamDoc {
            name: "ignore",
            ty: "list of strings",
            default: Some("[]"),
            doc: "Variable names to leave alone (site-specific ones).",
        },
        ParamDoc {
            name: "allow_debug",
            ty: "bool",
            default: Some("false"),
            doc: "Accept NCCL_DEBUG=INFO/TRACE without a warning (for debugging runs).",
        },
        ParamDoc {
            name: "warn_unknown",
            ty: "bool",
            default: Some("false"),
            doc: "Warn about unknown variables that are close to no known name (they are listed in the message either way).",
        },
    ],
    hint_vars: &["variables", "suggestion"],
    parse: parse_params::<EnvLint>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvLint {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prefixes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    variables: Option<Vec<String>>,
    #[serde(default)]
    ignore: Vec<String>,
    #[serde(default)]
    allow_debug: bool,
    #[serde(default)]
    warn_unknown: bool,
}

impl Params for EnvLint {
    fn validate(&self) -> Result<(), String> {
        if let Some(list) = &self.prefixes {
            for p in list {
                if !PREFIXES.contains(&p.as_str()) {
                    return Err(format!(
                        "unknown prefix `{p}`; env_lint knows: {}",
                        PREFIXES.join(", ")
                    ));
                }
            }
        }
        Catalog::get().map(|_| ())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Note,
    Warn,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    pub level: Level,
    pub variable: String,
    pub message: String,
    /// The fix, when there is one name or value to suggest.
    pub suggestion: Option<String>,
    /// The variable is one the catalog does not know (a warning only
    /// where the check asks for it: `warn_unknown`).
    pub uncatalogued: bool,
}

impl EnvLint {
    fn linted(&self, name: &str) -> bool {
        let prefixes: Vec<&str> = match &self.prefixes {
            Some(list) => list.iter().map(String::as_str).collect(),
            None => PREFIXES.to_vec(),
        };
        let chosen = self
            .variables
            .as_ref()
            .is_none_or(|list| list.iter().any(|v| v == name));
        chosen
            && prefixes.iter().any(|p| name.starts_with(p))
            && !self.ignore.iter().any(|i| i == name)
    }

    pub fn lint(&self, facts: &Facts, catalog: &Catalog) -> (usize, Vec<Issue>) {
        let names: Vec<String> = facts
            .env_names()
            .filter(|n| self.linted(n))
            .map(String::from)
            .collect();
        let mut issues = Vec::new();
        for name in &names {
            let value = facts.env(name).unwrap_or("");
            rules::lint_one(name, value, facts, catalog, self.allow_debug, &mut issues);
        }
        for name in self.variables.iter().flatten() {
            if facts.env(name).is_none() && self.linted(name) {
                rules::lint_unset(name, facts, &mut issues);
            }
        }
        if !self.warn_unknown {
            for issue in &mut issues {
                if issue.level == Level::Warn && issue.uncatalogued {
                    issue.level = Level::Note;
                }
            }
        }
        (names.len(), issues)
    }

    fn check(&self, facts: &Facts) -> Finding {
        let catalog = match Catalog::get() {
            Ok(c) => c,
            Err(e) => return Finding::error(e),
        };
        let (count, issues) = self.lint(facts, catalog);
        let worst = issues.iter().map(|i| i.level).max();
        let shown = |level: Level| {
            issues
                .iter()
                .filter(|i| i.level >= level)
                .map(|i| i.message.clone())
                .collect::<Vec<_>>()
        };
        let variables = issues
            .iter()
            .filter(|i| i.level > Level::Note)
            .map(|i| i.variable.clone())
            .collect::<Vec<_>>()
            .join(", ");
        // Unset when no rule suggests a value: the hint then leaves its
        // "(suggested: ...)" out.
        let suggestion = issues
            .iter()
            .filter(|i| i.level > Level::Note)
            .find_map(|i| i.suggestion.clone())
            .unwrap_or_default();
        let finding = match worst {
            Some(Level::Fail) => Finding::fail(shown(Level::Warn).join("; ")),
            Some(Level::Warn) => Finding::warn(shown(Level::Warn).join("; ")),
            _ => {
                let notes = shown(Level::Note);
                if count == 0 {
                    let mut message = match &self.variables {
                        Some(list) => format!("{} not set", list.join(", ")),
                        None => "no communication or accelerator variables are set".into(),
                    };
                    if !notes.is_empty() {
                        message = notes.join("; ");
                    }
                    Finding::pass(message)
                } else if notes.is_empty() {
                    Finding::pass(format!("{count} variable(s) checked, all valid"))
                } else {
                    Finding::pass(format!("{count} variable(s) checked; {}", notes.join("; ")))
                }
            }
        };
        // What was read: the variables at fault, or how many were valid.
        let measured = if variables.is_empty() {
            format!(
                "{} valid",
                preflight_ground::values::count(count, "variable")
            )
        } else {
            format!("at fault: {variables}")
        };
        let at_fault_names = issues
            .iter()
            .filter(|i| i.level > Level::Note)
            .map(|i| i.variable.clone());
        let mut finding = finding
            .measured(measured)
            .var("variables", variables)
            .var("suggestion", suggestion)
            .about_variables(at_fault_names);
        // One result per variable at fault, each with its own status: a
        // warning (NCCL_DEBUG=INFO) never sits inside another's failure.
        // A check of one named variable is that variable's already.
        let one_variable = self.variables.as_ref().is_some_and(|v| v.len() == 1);
        let mut at_fault: Vec<&str> = Vec::new();
        for i in issues
            .iter()
            .filter(|i| i.level > Level::Note && !one_variable)
        {
            if !at_fault.contains(&i.variable.as_str()) {
                at_fault.push(&i.variable);
            }
        }
        for variable in at_fault {
            let mine: Vec<&Issue> = issues
                .iter()
                .filter(|i| i.level > Level::Note && i.variable == variable)
                .collect();
            let message = mine
                .iter()
                .map(|i| i.message.as_str())
                .collect::<Vec<_>>()
                .join("; ");
            let part = if mine.iter().any(|i| i.level == Level::Fail) {
                Finding::fail(message)
            } else {
                Finding::warn(message)
            };
            let suggestion = mine
                .iter()
                .find_map(|i| i.suggestion.clone())
                .unwrap_or_default();
            let part = part
                .measured(match facts.env(variable) {
                    Some(value) => format!("{variable}={value}"),
                    None => format!("{variable} unset"),
                })
                .var("variables", variable)
                .var("suggestion", suggestion)
                .about_variables([variable]);
            finding = finding.part(variable, part);
        }
        finding
    }
}

impl Probe for EnvLint {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn write(root: &Path, path: &str, text: &str) {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A node with lo, eth0 (up), eth1 (down), ib0 (up); mlx5_0 port 1
    /// ACTIVE with GIDs 0-1 populated and 2 empty; mlx5_1 port 1 DOWN.
    fn fixture() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for (name, state, carrier, ty) in [
            ("lo", "unknown", "1", "772"),
            ("eth0", "up", "1", "1"),
            ("eth1", "down", "0", "1"),
            ("ib0", "up", "1", "32"),
        ] {
            write(r, &format!("sys/class/net/{name}/operstate"), state);
            write(r, &format!("sys/class/net/{name}/carrier"), carrier);
            write(r, &format!("sys/class/net/{name}/type"), ty);
        }
        let gid = "fe80:0000:0000:0000:0000:0000:0000:0001";
        let zero = "0000:0000:0000:0000:0000:0000:0000:0000";
        let p = "sys/class/infiniband/mlx5_0/ports/1";
        write(r, &format!("{p}/state"), "4: ACTIVE");
        write(r, &format!("{p}/link_layer"), "Ethernet");
        write(r, &format!("{p}/gids/0"), gid);
        write(r, &format!("{p}/gids/1"), gid);
        write(r, &format!("{p}/gids/2"), zero);
        write(r, "sys/class/infiniband/mlx5_1/ports/1/state", "1: DOWN");
        dir
    }

    fn lint(root: &Path, pairs: &[(&str, &str)]) -> Vec<Issue> {
        let env = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let facts = Facts::new(root.to_path_buf(), env, vec![]);
        let check = EnvLint {
            prefixes: None,
            variables: None,
            ignore: vec!["NCCL_SITE_SPECIFIC".into()],
            allow_debug: false,
            warn_unknown: false,
        };
        check.lint(&facts, Catalog::get().unwrap()).1
    }

    #[test]
    fn table_of_variables_and_value_rules() {
        use Level::*;
        let dir = fixture();
        // (variables, expected worst level or None for clean, text the
        // message must contain)
        type Row<'a> = (&'a [(&'a str, &'a str)], Option<Level>, &'a str);
        let table: &[Row] = &[
            (&[("NCCL_SOCKET_IFNAME", "eth0")], None, ""),
            (&[("NCCL_SOCKET_IFNAME", "eth")], None, ""),
            (&[("NCCL_SOCKET_IFNAME", "^lo,eth1")], None, ""),
            (
                &[("NCCL_SOCKET_IFNAME", "=eth")],
                Some(Fail),
                "no interface named `eth`",
            ),
            (&[("NCCL_SOCKET_IFNAME", "eth1")], Some(Fail), "down"),
            (
                &[("NCCL_SOCKET_IFNAME", "enp0")],
                Some(Fail),
                "no interface matching",
            ),
            (&[("GLOO_SOCKET_IFNAME", "eth0")], None, ""),
            (
                &[("GLOO_SOCKET_IFNAME", "^lo")],
                Some(Fail),
                "does not support `^`",
            ),
            (
                &[("GLOO_SOCKET_IFNAME", "eht0")],
                Some(Fail),
                "did you mean `eth0`",
            ),
            (&[("CCL_KVS_IFACE", "eth0")], None, ""),
            (
                &[("CCL_KVS_IFACE", "eth9")],
                Some(Fail),
                "no interface named",
            ),
            (&[("FI_TCP_IFACE", "eth1")], Some(Fail), "down"),
            (
                &[("NCCL_SOCKET_IFACE", "eth0")],
                Some(Fail),
                "did you mean NCCL_SOCKET_IFNAME",
            ),
            (
                &[("NCCL_IB_HCAS", "mlx5_0")],
                Some(Fail),
                "did you mean NCCL_IB_HCA",
            ),
            (
                &[("NCCL_DEBUG_SUBSYSTEM", "ALL")],
                Some(Fail),
                "did you mean NCCL_DEBUG_SUBSYS",
            ),
            (
                &[("CUDA_VISIBLE_DEVICE", "0")],
                Some(Fail),
                "did you mean CUDA_VISIBLE_DEVICES",
            ),
            (
                &[("GLOO_SOCKET_IF_NAME", "eth0")],
                Some(Fail),
                "did you mean GLOO_SOCKET_IFNAME",
            ),
            (&[("PET_NNODE", "3")], Some(Fail), "did you mean PET_NNODES"),
            (
                &[("LWS_WORKER_IDX", "1")],
                Some(Fail),
                "did you mean LWS_WORKER_INDEX",
            ),
            (&[("PET_NODE_RANK", "1"), ("LWS_GROUP_SIZE", "3")], None, ""),
            (
                &[("NCCL_TOTALLY_NEW_KNOB", "1")],
                Some(Note),
                "not in the catalog",
            ),
            (&[("NCCL_SITE_SPECIFIC", "1")], None, ""),
            (&[("PATH", "/bin"), ("HOME", "/root")], None, ""),
            (&[("NCCL_DEBUG", "WARN")], None, ""),
            (&[("NCCL_DEBUG", "info")], Some(Warn), "production"),
            (&[("NCCL_DEBUG", "TRACE")], Some(Warn), "production"),
            (&[("NCCL_DEBUG", "VERBOSE")], Some(Fail), "not one of"),
            (&[("NCCL_PROTO", "LL,LL128,Simple")], None, ""),
            (&[("NCCL_PROTO", "^LL128")], None, ""),
            (
                &[("NCCL_PROTO", "LL256")],
                Some(Fail),
                "`LL256` is not one of",
            ),
            (&[("NCCL_ALGO", "Ring,Tree")], None, ""),
            (&[("NCCL_ALGO", "allreduce:tree;broadcast:ring")], None, ""),
            (&[("NCCL_ALGO", "Rings")], Some(Fail), "not one of"),
            (&[("CCL_ATL_TRANSPORT", "ofi")], None, ""),
            (
                &[("CCL_ATL_TRANSPORT", "mpi")],
                Some(Warn),
                "no MPI launcher started this process",
            ),
            (&[("CCL_ATL_TRANSPORT", "mpi"), ("PMI_RANK", "0")], None, ""),
            (
                &[("CCL_ATL_TRANSPORT", "mpi"), ("OMPI_COMM_WORLD_RANK", "0")],
                None,
                "",
            ),
            (&[("ZE_AFFINITY_MASK", "0.1,2")], None, ""),
            (
                &[("ZE_AFFINITY_MASK", "0-3")],
                Some(Fail),
                "ranges are not part of the syntax",
            ),
            (
                &[("ZE_AFFINITY_MASK", "gpu0")],
                Some(Fail),
                "expected a device index N or a sub-device N.M",
            ),
            (
                &[("ZE_AFFINITY_MASK", "1,0,1")],
                Some(Warn),
                "names `1` twice",
            ),
            (
                &[("CCL_ATL_TRANSPORT", "tcp")],
                Some(Fail),
                "not one of ofi, mpi",
            ),
            (&[("CCL_LOG_LEVEL", "warn")], None, ""),
            (&[("CCL_LOG_LEVEL", "fatal")], Some(Fail), "hangs"),
            (&[("TORCH_DISTRIBUTED_DEBUG", "DETAIL")], None, ""),
            (
                &[("TORCH_DISTRIBUTED_DEBUG", "ON")],
                Some(Fail),
                "not one of",
            ),
            (&[("NCCL_IB_HCA", "mlx5_0")], None, ""),
            (&[("NCCL_IB_HCA", "mlx5")], None, ""),
            (&[("NCCL_IB_HCA", "=mlx5_0:1")], None, ""),
            (&[("NCCL_IB_HCA", "^mlx5_1")], None, ""),
            (
                &[("NCCL_IB_HCA", "=mlx5")],
                Some(Fail),
                "no HCA named `mlx5`",
            ),
            (
                &[("NCCL_IB_HCA", "mlx4_0")],
                Some(Fail),
                "no HCA matching `mlx4_0`",
            ),
            (&[("NCCL_IB_HCA", "mlx5_0:2")], Some(Fail), "has no port 2"),
            (
                &[("NCCL_IB_HCA", "mlx5_1:1")],
                Some(Fail),
                "DOWN, not ACTIVE",
            ),
            (&[("NCCL_IB_HCA", "^mlx9")], Some(Warn), "no HCA matching"),
            (&[("NCCL_IB_GID_INDEX", "1")], None, ""),
            (
                &[("NCCL_IB_GID_INDEX", "2")],
                Some(Fail),
                "entry 2 is empty",
            ),
            (
                &[("NCCL_IB_GID_INDEX", "7")],
                Some(Fail),
                "table has 3 entries",
            ),
            (
                &[("NCCL_IB_GID_INDEX", "three")],
                Some(Fail),
                "not an integer",
            ),
            (&[("NCCL_IB_DISABLE", "1")], Some(Warn), "mlx5_0:1"),
            (&[("NCCL_IB_DISABLE", "0")], None, ""),
            (&[("NCCL_IB_DISABLE", "yes")], Some(Fail), "not one of"),
            (&[("NCCL_P2P_DISABLE", "1")], Some(Warn), "peer-to-peer"),
            (
                &[("NCCL_BLOCKING_WAIT", "1")],
                Some(Warn),
                "TORCH_NCCL_BLOCKING_WAIT",
            ),
            (
                &[("NCCL_ASYNC_ERROR_HANDLING", "1")],
                Some(Warn),
                "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            ),
            (
                &[
                    ("NCCL_ASYNC_ERROR_HANDLING", "1"),
                    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"),
                ],
                Some(Warn),
                "which wins",
            ),
            (
                &[("TORCH_DISTRIBUTED_BACKEND", "nccl")],
                Some(Warn),
                "needs a NVIDIA or AMD device",
            ),
            (&[("TORCH_DISTRIBUTED_BACKEND", "gloo")], None, ""),
            (
                &[("TORCH_DISTRIBUTED_BACKEND", "xla")],
                Some(Fail),
                "not one of",
            ),
            (&[("CUDA_VISIBLE_DEVICES", "0,1")], None, ""),
            (&[("CUDA_VISIBLE_DEVICES", "GPU-8f6a")], None, ""),
            (&[("CUDA_VISIBLE_DEVICES", "")], Some(Warn), "sees no GPU"),
            (
                &[("CUDA_VISIBLE_DEVICES", "gpu0")],
                Some(Fail),
                "not a device index",
            ),
            (
                &[("CUDA_VISIBLE_DEVICES", "0,1,-2,3")],
                Some(Warn),
                "only the first 2 entries count",
            ),
            (&[("ZE_AFFINITY_MASK", "0,1")], None, ""),
            (&[("NCCL_IB_TIMEOUT", "22")], None, ""),
            (&[("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")], None, ""),
            (
                &[("TORCH_NCCL_ASYNC_ERROR_HANDLING", "yes")],
                Some(Fail),
                "not one of",
            ),
            (&[("CUDA_DEVICE_ORDER", "PCI_BUS_ID")], None, ""),
            (&[("CUDA_DEVICE_ORDER", "PCI")], Some(Fail), "not one of"),
            (&[("NCCL_IB_TIMEOUT", "long")], Some(Fail), "not an integer"),
        ];
        for (vars, want, text) in table {
            let issues = lint(dir.path(), vars);
            let worst = issues.iter().map(|i| i.level).max();
            assert_eq!(worst, *want, "{vars:?}: {issues:?}");
            if !text.is_empty() {
                assert!(
                    issues.iter().any(|i| i.message.contains(text)),
                    "{vars:?}: expected `{text}` in {issues:?}"
                );
            }
        }
    }

    #[test]
    fn no_hcas_and_ib_hca_set_fails() {
        let dir = tempfile::tempdir().unwrap();
        let issues = lint(dir.path(), &[("NCCL_IB_HCA", "mlx5_0")]);
        assert_eq!(issues[0].level, Level::Fail);
        assert!(issues[0].message.contains("no RDMA devices"));
        assert!(
            lint(
                dir.path(),
                &[("NCCL_IB_HCA", "mlx5_0"), ("NCCL_IB_DISABLE", "1")]
            )
            .is_empty()
        );
    }
}
