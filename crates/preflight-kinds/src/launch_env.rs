//! `launch_env`: what the launcher hands each rank is consistent. Ranks,
//! sizes and the rendezvous address come from several launchers' variables
//! (torchrun, Slurm, Open MPI, PMI); when two say different things, or the
//! job's init method points elsewhere than MASTER_ADDR:MASTER_PORT, ranks
//! wait for a peer that never comes and the job hangs without an error.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::resolve::resolve_on_node;
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params};
use preflight_facts::{Facts, LAUNCHERS, Launcher, NNODES_VARS};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "launch_env",
    scope: crate::Scope::Rank,
    area: "launch",
    summary: "The launcher's variables (MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK and their Slurm, Open MPI and PMI equivalents) are valid and agree with each other and with the job's init method; in a Kubernetes pod, what its operator's contract (Kubeflow Trainer and PyTorchJob PET_, LeaderWorkerSet LWS_, Volcano VC_, JobSet JOB_COMPLETION_INDEX and JOBSET_) makes of the pod, and whether a WORLD_SIZE counts pods or processes.",
    params: &[
        ParamDoc {
            name: "init_method",
            ty: "string",
            default: Some("unset"),
            doc: "The init method the job uses (tcp://HOST:PORT, env://, file://...), when it is fixed in the job's code or config.",
        },
        ParamDoc {
            name: "init_method_var",
            ty: "string",
            default: Some("unset"),
            doc: "A variable holding the init method, or the job's arguments containing `--init-method URL` / `--dist-url URL`.",
        },
        ParamDoc {
            name: "require_master",
            ty: "bool",
            default: Some("false"),
            doc: "MASTER_ADDR and MASTER_PORT must be set whenever launcher variables are.",
        },
    ],
    hint_vars: &["problem"],
    parse: parse_params::<LaunchEnv>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchEnv {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    init_method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    init_method_var: Option<String>,
    #[serde(default)]
    require_master: bool,
}

impl Params for LaunchEnv {
    fn validate(&self) -> Result<(), String> {
        if self.init_method.is_some() && self.init_method_var.is_some() {
            return Err("give at most one of `init_method` and `init_method_var`".into());
        }
        Ok(())
    }
}

/// Integer-valued variables, beyond the sources' own.
const OTHER_INTEGERS: &[&str] = &["NODE_RANK", "GROUP_RANK", "SLURM_NODEID", "SLURM_JOB_ID"];

const ALL_VARS: &[&str] = &[
    "MASTER_ADDR",
    "NNODES",
    "SLURM_NNODES",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
];

#[derive(Default)]
struct Verdicts {
    problems: Vec<String>,
    warnings: Vec<String>,
    /// The variables the problems and warnings are about.
    variables: Vec<String>,
}

impl Verdicts {
    fn problem(&mut self, variables: &[&str], message: String) {
        self.variables
            .extend(variables.iter().map(|v| v.to_string()));
        self.problems.push(message);
    }

    fn warning(&mut self, variables: &[&str], message: String) {
        self.variables
            .extend(variables.iter().map(|v| v.to_string()));
        self.warnings.push(message);
    }
}

fn integer(facts: &Facts, name: &str, v: &mut Verdicts) -> Option<u64> {
    let value = facts.env(name)?;
    match value.trim().parse::<u64>() {
        Ok(n) => Some(n),
        Err(_) => {
            v.problem(
                &[name],
                format!("{name}=`{value}` is not a non-negative integer"),
            );
            None
        }
    }
}

/// A parsed `tcp://HOST:PORT`.
#[derive(Debug, PartialEq, Eq)]
pub struct TcpInit {
    pub host: String,
    pub port: Option<u16>,
}

/// The init method inside an argument string (`--init-method X`,
/// `--init_method=X`, `--dist-url X`), or the string itself.
pub fn find_init_method(text: &str) -> Option<String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    const FLAGS: &[&str] = &["--init-method", "--init_method", "--dist-url", "--dist_url"];
    for (i, w) in words.iter().enumerate() {
        for flag in FLAGS {
            if w == flag {
                return words
                    .get(i + 1)
                    .map(|s| s.trim_matches(['"', '\'']).to_string());
            }
            if let Some(rest) = w.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
                return Some(rest.trim_matches(['"', '\'']).to_string());
            }
        }
    }
    let trimmed = text.trim();
    trimmed.contains("://").then(|| trimmed.to_string())
}

pub fn parse_tcp(url: &str) -> Result<Option<TcpInit>, String> {
    let Some(rest) = url.strip_prefix("tcp://") else {
        return if ["env://", "file://"].iter().any(|p| url.starts_with(p)) {
            Ok(None)
        } else {
            Err(format!(
                "init method `{url}` is not tcp://HOST:PORT, env:// or file://"
            ))
        };
    };
    let rest = rest.split(['/', '?']).next().unwrap_or("");
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (h, after) = v6.split_once(']').unwrap_or((v6, ""));
        (h.to_string(), after.strip_prefix(':'))
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (rest.to_string(), None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("init method `{url}` has an invalid port `{p}`"))?,
        ),
    };
    if host.is_empty() {
        return Err(format!("init method `{url}` has no host"));
    }
    Ok(Some(TcpInit { host, port }))
}

/// Whether two host names mean the same machine: equal, both loopback, or
/// resolving to a common address. A name that does not resolve is itself
/// the problem: every rank but 0 would hang connecting to it.
fn same_host(facts: &Facts, a: &str, b: &str) -> Result<bool, String> {
    if a.eq_ignore_ascii_case(b) {
        return Ok(true);
    }
    let limit = Duration::from_secs(2);
    let x = resolve_on_node(facts, a, limit).map_err(|e| e.to_string())?;
    let y = resolve_on_node(facts, b, limit).map_err(|e| e.to_string())?;
    Ok(x.iter().any(|ip| y.contains(ip))
        || (x.iter().all(|i| i.is_loopback()) && y.iter().all(|i| i.is_loopback())))
}

impl LaunchEnv {
    fn check(&self, facts: &Facts) -> Finding {
        let present: Vec<&str> = ALL_VARS
            .iter()
            .chain(preflight_facts::pod::POD_VARS)
            .copied()
            .filter(|n| facts.env(n).is_some())
            .collect();
        if present.is_empty() && self.init_method.is_none() && facts.init_method.is_none() {
            return Finding::skip("no launcher variables are set (not inside a job)");
        }
        let mut v = Verdicts::default();
        // A Kubernetes pod of a job operator's: what its contract makes of
        // this pod, or why it cannot be read.
        let pod = match preflight_facts::pod::discover(facts.env_vars()) {
            Some(Ok(job)) => Some(format!(
                "{}: pod {} of {} ({})",
                job.operator,
                job.plan.node_rank,
                job.plan.nnodes,
                job.notes.join("; ")
            )),
            Some(Err(e)) => {
                let vars: Vec<&str> = preflight_facts::pod::POD_VARS
                    .iter()
                    .copied()
                    .filter(|n| e.contains(n))
                    .collect();
                v.problem(&vars, e);
                None
            }
            None => None,
        };

        self.check_master(facts, &mut v);

        // Each launcher's own rank, size, local rank and local size.
        struct View {
            source: &'static Launcher,
            rank: Option<u64>,
            size: Option<u64>,
            local_rank: Option<u64>,
        }
        let mut views = Vec::new();
        for source in LAUNCHERS {
            let rank = integer(facts, source.rank, &mut v);
            let size = integer(facts, source.size, &mut v);
            let local_rank = source.local_rank.and_then(|n| integer(facts, n, &mut v));
            let local_size = source.local_size.and_then(|n| integer(facts, n, &mut v));
            if size == Some(0) {
                v.problem(
                    &[source.size],
                    format!("{}=0: a job has at least one rank", source.size),
                );
            }
            // A size without a rank is a partial launch, never a world of
            // one; Slurm's batch step has a task count but no task.
            if let (None, Some(s)) = (rank, size)
                && source.name != "Slurm"
                && facts.env(source.rank).is_none()
            {
                v.problem(
                    &[source.size, source.rank],
                    format!(
                        "{}={s} is set but {} is not: {} gives every process both",
                        source.size, source.rank, source.name
                    ),
                );
            }
            if let (Some(r), Some(s)) = (rank, size)
                && s > 0
                && r >= s
            {
                v.problem(
                    &[source.rank, source.size],
                    format!("{}={r} is not below {}={s}", source.rank, source.size),
                );
            }
            if let (Some(lr), Some(ls), Some(lrn), Some(lsn)) =
                (local_rank, local_size, source.local_rank, source.local_size)
                && lr >= ls
            {
                v.problem(&[lrn, lsn], format!("{lrn}={lr} is not below {lsn}={ls}"));
            }
            if let (Some(ls), Some(s), Some(lsn)) = (local_size, size, source.local_size)
                && ls > s
            {
                v.problem(
                    &[lsn, source.size],
                    format!("{lsn}={ls} is larger than {}={s}", source.size),
                );
            }
            if rank.is_some() || size.is_some() {
                views.push(View {
                    source,
                    rank,
                    size,
                    local_rank,
                });
            }
        }
        for name in OTHER_INTEGERS {
            integer(facts, name, &mut v);
        }
        let nnodes = NNODES_VARS
            .iter()
            .find_map(|n| Some((*n, facts.env(n)?.trim().parse::<u64>().ok()?)));
        if let Some((nn, count)) = nnodes {
            for name in ["NODE_RANK", "GROUP_RANK", "SLURM_NODEID"] {
                if let Some(i) = facts.env(name).and_then(|x| x.trim().parse::<u64>().ok())
                    && i >= count
                {
                    v.problem(&[name, nn], format!("{name}={i} is not below {nn}={count}"));
                }
            }
        }
        if let (Some(n), Some(g)) = (
            facts
                .env("NODE_RANK")
                .and_then(|x| x.trim().parse::<u64>().ok()),
            facts
                .env("GROUP_RANK")
                .and_then(|x| x.trim().parse::<u64>().ok()),
        ) && n != g
        {
            v.problem(
                &["NODE_RANK", "GROUP_RANK"],
                format!("NODE_RANK={n} but GROUP_RANK={g}"),
            );
        }

        // Launchers nested in one another (torchrun started once per node
        // by srun) legitimately count differently: compare ranks only
        // between sources that agree on the job's size.
        for (i, a) in views.iter().enumerate() {
            for b in &views[i + 1..] {
                match (a.size, b.size) {
                    (Some(x), Some(y)) if x != y => {
                        if x % y != 0 && y % x != 0 {
                            v.problem(
                                &[a.source.size, b.source.size],
                                format!(
                                    "{}={x} but {}={y}: the launchers disagree on the job's size",
                                    a.source.size, b.source.size
                                ),
                            );
                        }
                        continue;
                    }
                    _ => {}
                }
                if let (Some(x), Some(y)) = (a.rank, b.rank)
                    && x != y
                {
                    v.problem(
                        &[a.source.rank, b.source.rank],
                        format!(
                            "{}={x} but {}={y}: {} and {} disagree on this process's rank",
                            a.source.rank, b.source.rank, a.source.name, b.source.name
                        ),
                    );
                }
                if let (Some(x), Some(y), Some(xn), Some(yn)) = (
                    a.local_rank,
                    b.local_rank,
                    a.source.local_rank,
                    b.source.local_rank,
                ) && x != y
                {
                    v.problem(&[xn, yn], format!("{xn}={x} but {yn}={y}"));
                }
            }
        }

        self.check_init_method(facts, &mut v);

        let summary = present
            .iter()
            .filter(|n| {
                [
                    "MASTER_ADDR",
                    "MASTER_PORT",
                    "RANK",
                    "WORLD_SIZE",
                    "SLURM_PROCID",
                    "SLURM_NTASKS",
                ]
                .contains(n)
            })
            .map(|n| format!("{n}={}", facts.env(n).unwrap_or("")))
            .collect::<Vec<_>>()
            .join(" ");
        if !v.problems.is_empty() {
            let mut all = v.problems.clone();
            all.extend(v.warnings.iter().map(|w| format!("warning: {w}")));
            return Finding::fail(all.join("; "))
                .measured(summary)
                .var("problem", v.problems.join("; "))
                .about_variables(v.variables);
        }
        if !v.warnings.is_empty() {
            return Finding::warn(v.warnings.join("; "))
                .measured(summary)
                .var("problem", v.warnings.join("; "))
                .about_variables(v.variables);
        }
        Finding::pass(format!(
            "{} launcher variable(s) consistent: {summary}{}",
            present.len(),
            pod.map(|p| format!("; {p}")).unwrap_or_default()
        ))
        .measured(summary)
    }

    fn check_master(&self, facts: &Facts, v: &mut Verdicts) {
        match facts.env("MASTER_ADDR") {
            None if self.require_master => {
                v.problem(&["MASTER_ADDR"], "MASTER_ADDR is not set".into())
            }
            None => {}
            Some(addr) => {
                let a = addr.trim();
                if a.is_empty() {
                    v.problem(&["MASTER_ADDR"], "MASTER_ADDR is set but empty".into());
                } else if a.contains("://") {
                    v.problem(
                        &["MASTER_ADDR"],
                        format!("MASTER_ADDR=`{addr}` is a URL: give a bare host name or address"),
                    );
                } else if a.contains(' ') || a.contains(',') {
                    v.problem(
                        &["MASTER_ADDR"],
                        format!("MASTER_ADDR=`{addr}` is not one host (a Slurm node list? use `scontrol show hostnames $SLURM_JOB_NODELIST | head -n1`)"),
                    );
                } else if a.matches(':').count() == 1 {
                    v.problem(
                        &["MASTER_ADDR"],
                        format!(
                            "MASTER_ADDR=`{addr}` includes a port: put the port in MASTER_PORT"
                        ),
                    );
                }
            }
        }
        match facts.env("MASTER_PORT") {
            None if self.require_master => {
                v.problem(&["MASTER_PORT"], "MASTER_PORT is not set".into())
            }
            None => {}
            Some(port) => match port.trim().parse::<u32>() {
                Ok(p) if (1..=65535).contains(&p) => {
                    if let Some((lo, hi)) = facts.ephemeral_ports()
                        && (lo as u32..=hi as u32).contains(&p)
                    {
                        v.warning(
                            &["MASTER_PORT"],
                            format!(
                                "MASTER_PORT={p} is inside the kernel's ephemeral range {lo}-{hi}: an outgoing connection can take it before rank 0 binds it"
                            ),
                        );
                    }
                }
                _ => v.problem(
                    &["MASTER_PORT"],
                    format!("MASTER_PORT=`{port}` is not a port number (1-65535)"),
                ),
            },
        }
    }

    fn check_init_method(&self, facts: &Facts, v: &mut Verdicts) {
        // The check's own URL, else the one given on the command line, else
        // the variable that holds the job's arguments.
        let from_var = || {
            let var = self.init_method_var.as_ref()?;
            let method = find_init_method(facts.env(var)?)?;
            Some((method, format!("init method in {var}")))
        };
        let found = match (&self.init_method, &facts.init_method) {
            (Some(m), _) => Some((m.clone(), "init method".to_string())),
            (None, Some(m)) => Some((m.clone(), "--init-method".to_string())),
            (None, None) => from_var(),
        };
        let Some((text, origin)) = found else {
            return;
        };
        let tcp = match parse_tcp(&text) {
            Ok(Some(tcp)) => tcp,
            Ok(None) => return,
            Err(e) => {
                v.problem(&[], e);
                return;
            }
        };
        if let Some(port) = facts
            .env("MASTER_PORT")
            .and_then(|p| p.trim().parse::<u16>().ok())
        {
            match tcp.port {
                Some(p) if p != port => v.problem(
                    &["MASTER_PORT"],
                    format!(
                        "{origin} `{text}` uses port {p} but MASTER_PORT={port}: ranks that follow MASTER_PORT wait on a port nobody listens on"
                    ),
                ),
                _ => {}
            }
        }
        if let Some(addr) = facts
            .env("MASTER_ADDR")
            .map(str::trim)
            .filter(|a| !a.is_empty())
        {
            match same_host(facts, &tcp.host, addr) {
                Ok(true) => {}
                Ok(false) => v.problem(
                    &["MASTER_ADDR"],
                    format!(
                        "{origin} `{text}` names host {} but MASTER_ADDR={addr}",
                        tcp.host
                    ),
                ),
                Err(e) => v.problem(
                    &["MASTER_ADDR"],
                    format!(
                        "{origin} `{text}` names host {}, which cannot be compared with MASTER_ADDR={addr}: {e}",
                        tcp.host
                    ),
                ),
            }
        }
    }
}

impl Probe for LaunchEnv {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use preflight_result::Status;

    fn run(pairs: &[(&str, &str)], check: LaunchEnv) -> Finding {
        let env = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let facts = Facts::new("/".into(), env, vec![]);
        check.check(&facts)
    }

    fn plain() -> LaunchEnv {
        LaunchEnv {
            init_method: None,
            init_method_var: None,
            require_master: false,
        }
    }

    #[test]
    fn a_pods_contract_is_said_and_a_world_it_cannot_read_fails() {
        let f = run(
            &[
                ("LWS_LEADER_ADDRESS", "lws-0.lws.default"),
                ("LWS_GROUP_SIZE", "3"),
                ("LWS_WORKER_INDEX", "2"),
            ],
            plain(),
        );
        assert_eq!(f.status, Status::Pass, "{}", f.message);
        assert!(
            f.message.contains("LeaderWorkerSet: pod 2 of 3"),
            "{}",
            f.message
        );
        let f = run(
            &[
                ("PET_NNODES", "3"),
                ("PET_NODE_RANK", "1"),
                ("PET_NPROC_PER_NODE", "2"),
                ("MASTER_ADDR", "pj-master-0"),
                ("MASTER_PORT", "23456"),
                ("RANK", "1"),
                ("WORLD_SIZE", "4"),
            ],
            plain(),
        );
        assert_eq!(f.status, Status::Fail, "{}", f.message);
        assert!(
            f.message.contains("WORLD_SIZE=4 is neither PET_NNODES=3"),
            "{}",
            f.message
        );
    }

    #[test]
    fn an_init_method_host_that_does_not_resolve_fails() {
        // Names resolve from the tree's /etc/hosts under a fixture root, so
        // no DNS query leaves the machine.
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(root.path().join("etc/hosts"), "127.0.0.1 localhost\n").unwrap();
        let env = [
            ("MASTER_ADDR", "localhost"),
            ("MASTER_PORT", "29500"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let facts = Facts::new(root.path().to_path_buf(), env, vec![])
            .with_init_method(Some("tcp://oldmaster:29500".into()));
        let f = plain().check(&facts);
        assert_eq!(f.status, Status::Fail, "{}", f.message);
        assert!(
            f.message.contains("--init-method `tcp://oldmaster:29500` names host oldmaster, which cannot be compared with MASTER_ADDR=localhost: `oldmaster` is not in"),
            "{}",
            f.message
        );
    }

    #[test]
    fn nothing_set_skips() {
        assert_eq!(run(&[], plain()).status, Status::Skip);
    }

    #[test]
    fn consistent_torchrun_passes() {
        let f = run(
            &[
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29500"),
                ("RANK", "1"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "1"),
                ("LOCAL_WORLD_SIZE", "4"),
            ],
            plain(),
        );
        assert_eq!(f.status, Status::Pass, "{}", f.message);
    }

    #[test]
    fn sources_that_disagree_fail_naming_both() {
        let f = run(
            &[
                ("RANK", "1"),
                ("WORLD_SIZE", "4"),
                ("SLURM_PROCID", "2"),
                ("SLURM_NTASKS", "4"),
            ],
            plain(),
        );
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.message.contains("RANK=1 but SLURM_PROCID=2"),
            "{}",
            f.message
        );
    }

    #[test]
    fn nested_launchers_are_not_compared() {
        let f = run(
            &[
                ("RANK", "5"),
                ("WORLD_SIZE", "8"),
                ("SLURM_PROCID", "1"),
                ("SLURM_NTASKS", "2"),
            ],
            plain(),
        );
        assert_eq!(f.status, Status::Pass, "{}", f.message);
    }

    #[test]
    fn a_size_without_a_rank_is_a_partial_launch() {
        let f = run(&[("WORLD_SIZE", "4")], plain());
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.message
                .contains("WORLD_SIZE=4 is set but RANK is not: torchrun gives every process both"),
            "{}",
            f.message
        );
        // Slurm's batch step: a task count without a task.
        let f = run(&[("SLURM_NTASKS", "4")], plain());
        assert!(!f.message.contains("is set but"), "{}", f.message);
    }

    #[test]
    fn ranges_and_syntax() {
        let f = run(
            &[
                ("RANK", "4"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "x"),
                ("MASTER_PORT", "70000"),
                ("MASTER_ADDR", "node1:29500"),
            ],
            plain(),
        );
        assert_eq!(f.status, Status::Fail);
        for part in [
            "RANK=4 is not below WORLD_SIZE=4",
            "LOCAL_RANK=`x` is not a non-negative integer",
            "MASTER_PORT=`70000`",
            "includes a port",
        ] {
            assert!(f.message.contains(part), "{part}: {}", f.message);
        }
    }

    #[test]
    fn node_rank_below_node_count() {
        let f = run(&[("NODE_RANK", "2"), ("NNODES", "2")], plain());
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.message.contains("NODE_RANK=2 is not below NNODES=2"),
            "{}",
            f.message
        );
    }

    #[test]
    fn init_method_port_mismatch_fails() {
        let f = run(
            &[("MASTER_ADDR", "localhost"), ("MASTER_PORT", "29511")],
            LaunchEnv {
                init_method: Some("tcp://localhost:29500".into()),
                ..plain()
            },
        );
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.message.contains("uses port 29500 but MASTER_PORT=29511"),
            "{}",
            f.message
        );
    }

    #[test]
    fn init_method_found_in_arguments() {
        assert_eq!(
            find_init_method("train.py --init-method tcp://10.0.0.1:23456 --epochs 3").as_deref(),
            Some("tcp://10.0.0.1:23456")
        );
        assert_eq!(
            find_init_method("--dist-url=tcp://h:1").as_deref(),
            Some("tcp://h:1")
        );
        assert_eq!(
            parse_tcp("tcp://[::1]:29500").unwrap(),
            Some(TcpInit {
                host: "::1".into(),
                port: Some(29500)
            })
        );
        assert_eq!(parse_tcp("env://").unwrap(), None);
        assert!(parse_tcp("tcp://h:0").is_err());
    }
}
