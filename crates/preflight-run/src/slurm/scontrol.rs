//! Talking to Slurm through `scontrol`: a node's state and reason, drain
//! and resume, a job's kind and its cancellation. Slurm starts health
//! checks, prologs and epilogs with almost no environment, so `scontrol`
//! and the configuration it needs are found without the environment's
//! help. Every call has a deadline, and a failing call is an error that
//! names the command and what it said, never silence.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use preflight_facts::procs;

/// Where `scontrol` lives on the distributions and site layouts seen.
const SCONTROL_DIRS: &[&str] = &[
    "/usr/bin",
    "/usr/local/bin",
    "/opt/slurm/bin",
    "/usr/local/slurm/bin",
    "/opt/slurm/current/bin",
];

/// slurm.conf's usual places, and where configless slurmd caches it.
const CONF_PATHS: &[&str] = &[
    "/etc/slurm/slurm.conf",
    "/etc/slurm-llnl/slurm.conf",
    "/usr/local/etc/slurm.conf",
    "/opt/slurm/etc/slurm.conf",
    "/run/slurm/conf/slurm.conf",
    "/var/spool/slurmd/conf-cache/slurm.conf",
    "/var/spool/slurm/d/conf-cache/slurm.conf",
];

/// How long one `scontrol` call may take: slurmctld answers in
/// milliseconds, and a health check has a minute in all.
const CALL_DEADLINE: Duration = Duration::from_secs(10);

/// Output kept per call: a node's or a job's line is a few hundred bytes.
const KEEP: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct Slurm {
    pub scontrol: PathBuf,
    /// Given to scontrol as SLURM_CONF; `None`: scontrol's built-in default.
    pub conf: Option<PathBuf>,
}

/// A node as slurmctld sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// `IDLE+DRAIN`, `MIXED`, `DOWN+DRAIN+NOT_RESPONDING`, ...
    pub state: String,
    /// The reason without Slurm's ` [user@time]` suffix, when set.
    pub reason: Option<String>,
}

impl NodeState {
    /// Drained, draining, or down: out of service until resumed.
    pub fn out_of_service(&self) -> bool {
        self.state.split('+').any(|f| {
            matches!(
                f.trim_end_matches('*'),
                "DRAIN" | "DRAINED" | "DRAINING" | "DOWN" | "FAIL"
            )
        })
    }
}

/// What `scontrol show job` says of a job.
#[derive(Debug, Clone)]
pub struct JobState {
    /// `RUNNING`, `COMPLETING`, `TIMEOUT`, ...
    pub state: String,
    /// `TimeLimit` for a job that ran out of time (while it completes).
    pub reason: Option<String>,
    pub batch_host: Option<String>,
    pub user_id: Option<u32>,
    pub nodes: Vec<String>,
}

impl JobState {
    /// Ended by its time limit: `TIMEOUT`, or `COMPLETING` for that reason
    /// (what an epilog sees).
    pub fn timed_out(&self) -> bool {
        self.state == "TIMEOUT" || self.reason.as_deref() == Some("TimeLimit")
    }
}

impl Slurm {
    /// `scontrol` from the setting, PATH, then the usual directories;
    /// slurm.conf from SLURM_CONF, the slurmd that started this process
    /// (`-f FILE` or its SLURM_CONF), then the usual paths.
    pub fn find(
        scontrol: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Slurm, String> {
        let scontrol = match scontrol {
            Some(p) if p.is_file() => p.to_path_buf(),
            Some(p) => {
                return Err(format!(
                    "scontrol: {} (the `scontrol` setting) does not exist",
                    p.display()
                ));
            }
            None => {
                let path = env("PATH").unwrap_or_default();
                let dirs: Vec<PathBuf> = std::env::split_paths(&path)
                    .chain(SCONTROL_DIRS.iter().map(PathBuf::from))
                    .collect();
                dirs.iter()
                    .map(|d| d.join("scontrol"))
                    .find(|p| p.is_file())
                    .ok_or_else(|| {
                        format!(
                            "scontrol not found on PATH or in {}: set `scontrol:` in the site settings",
                            SCONTROL_DIRS.join(", ")
                        )
                    })?
            }
        };
        let conf = env("SLURM_CONF")
            .filter(|c| !c.is_empty())
            .map(PathBuf::from)
            .or_else(slurmd_conf)
            .or_else(|| CONF_PATHS.iter().map(PathBuf::from).find(|p| p.is_file()));
        Ok(Slurm { scontrol, conf })
    }

    fn call(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(&self.scontrol);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(c) = &self.conf {
            cmd.env("SLURM_CONF", c);
        }
        let what = format!("scontrol {}", args.join(" "));
        let (status, out, err) =
            run_bounded(cmd, CALL_DEADLINE).map_err(|e| format!("{what}: {e}"))?;
        if status {
            Ok(out)
        } else {
            let said = err.trim();
            let said = if said.is_empty() { out.trim() } else { said };
            Err(format!("{what} failed: {}", one_line(said, 300)))
        }
    }

    pub fn node(&self, name: &str) -> Result<NodeState, String> {
        let out = self.call(&["show", "node", "-o", name])?;
        parse_node(&out).ok_or_else(|| {
            format!(
                "scontrol show node {name}: no State= in `{}`",
                one_line(&out, 200)
            )
        })
    }

    pub fn drain(&self, name: &str, reason: &str) -> Result<(), String> {
        self.call(&[
            "update",
            &format!("nodename={name}"),
            "state=drain",
            &format!("reason={reason}"),
        ])
        .map(|_| ())
    }

    pub fn resume(&self, name: &str) -> Result<(), String> {
        self.call(&["update", &format!("nodename={name}"), "state=resume"])
            .map(|_| ())
    }

    /// `NodeAddr` of a node: how slurmctld, and so the job's nodes, reach
    /// it (often its hostname, an address where names do not resolve).
    pub fn node_addr(&self, name: &str) -> Result<String, String> {
        let out = self.call(&["show", "node", "-o", name])?;
        field(&out, "NodeAddr")
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("scontrol show node {name}: no NodeAddr"))
    }

    /// A job as `scontrol show job -o` says it: its state, the reason,
    /// its batch host, its nodes (expanded).
    pub fn job(&self, id: &str) -> Result<JobState, String> {
        let out = self.call(&["show", "job", "-o", id])?;
        let get = |k: &str| field(&out, k).filter(|v| !v.is_empty() && v != "(null)");
        let state = get("JobState").ok_or_else(|| {
            format!(
                "scontrol show job {id}: no JobState in `{}`",
                one_line(&out, 200)
            )
        })?;
        let nodes = match get("NodeList") {
            Some(list) => self.hostnames(&list)?,
            None => Vec::new(),
        };
        Ok(JobState {
            state,
            reason: get("Reason"),
            batch_host: get("BatchHost"),
            user_id: get("UserId")
                .and_then(|u| {
                    u.split_once('(')
                        .and_then(|(_, id)| id.strip_suffix(')').map(str::to_string))
                })
                .and_then(|id| id.parse().ok()),
            nodes,
        })
    }

    /// A Slurm host list (`h[1-3],g7`) as names.
    pub fn hostnames(&self, list: &str) -> Result<Vec<String>, String> {
        Ok(self
            .call(&["show", "hostnames", list])?
            .split_whitespace()
            .map(str::to_string)
            .collect())
    }

    /// Says `reason` in a job's comment (`scontrol show job`, `sacct -o
    /// comment`), its owner's to read.
    pub fn comment_job(&self, job: &str, reason: &str) -> Result<(), String> {
        self.call(&[
            "update",
            &format!("jobid={job}"),
            &format!("comment={reason}"),
        ])
        .map(|_| ())
    }

    /// Takes a job off its allocation before it starts, with the reason
    /// in its comment so that its owner sees why (`scontrol show job`,
    /// `sacct -o comment`): a batch job is requeued (and held, with
    /// `hold`, until an operator releases it); an interactive one, which
    /// cannot be requeued, is cancelled. Says what was done.
    pub fn stop_job(&self, job: &str, reason: &str, hold: bool) -> Result<String, String> {
        let _ = self.call(&[
            "update",
            &format!("jobid={job}"),
            &format!("comment={reason}"),
        ]);
        let verb = if hold { "requeuehold" } else { "requeue" };
        let requeued = self.call(&[verb, job]);
        if requeued.is_ok() {
            return Ok(format!(
                "job {job} requeued{}: {reason}",
                if hold { " and held" } else { "" }
            ));
        }
        let scancel = self.scontrol.with_file_name("scancel");
        let mut cmd = Command::new(&scancel);
        cmd.arg(job)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(c) = &self.conf {
            cmd.env("SLURM_CONF", c);
        }
        match run_bounded(cmd, CALL_DEADLINE) {
            Ok((true, _, _)) => Ok(format!("job {job} cancelled: {reason}")),
            Ok((false, _, err)) => Err(format!(
                "{}; scancel {job} failed: {}",
                requeued.err().unwrap_or_default(),
                one_line(&err, 300)
            )),
            Err(e) => Err(format!("scancel {job}: {e}")),
        }
    }
}

/// The `-f FILE` or SLURM_CONF of the slurmd this process descends from.
fn slurmd_conf() -> Option<PathBuf> {
    let mut pid = std::process::id();
    for _ in 0..8 {
        let ppid = procs::parent(Path::new(&format!("/proc/{pid}")))?;
        if ppid <= 1 {
            return None;
        }
        pid = ppid;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_slurmd = args
            .first()
            .and_then(|a| Path::new(a).file_name())
            .is_some_and(|n| n == "slurmd" || n == "slurmstepd");
        if !is_slurmd {
            continue;
        }
        if let Some(i) = args.iter().position(|a| a == "-f") {
            return args.get(i + 1).map(PathBuf::from);
        }
        if let Some(f) = args
            .iter()
            .find_map(|a| a.strip_prefix("-f"))
            .filter(|f| !f.is_empty())
        {
            return Some(PathBuf::from(f));
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        return environ
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(b"SLURM_CONF="))
            .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()));
    }
    None
}

/// State and reason from `scontrol show node -o NAME`.
pub fn parse_node(out: &str) -> Option<NodeState> {
    let state = field(out, "State")?;
    // Reason= runs to the end of the line, with spaces; Slurm appends
    // ` [user@time]`.
    let reason = out.lines().find_map(|l| {
        let at = l
            .find(" Reason=")
            .map(|i| i + 1)
            .or_else(|| l.strip_prefix("Reason=").map(|_| 0))?;
        let text = l[at + "Reason=".len()..].trim_end();
        let text = match text.rfind(" [") {
            Some(i) if text.ends_with(']') && text[i..].contains('@') => &text[..i],
            _ => text,
        };
        Some(text.to_string()).filter(|t| !t.is_empty() && t != "(null)")
    });
    Some(NodeState { state, reason })
}

/// `Key=value` (the value up to the next space) from scontrol's one-line
/// output.
fn field(out: &str, key: &str) -> Option<String> {
    let needle = format!("{key}=");
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(needle.as_str()))
        .map(str::to_string)
}

pub use preflight_ground::values::one_line;

/// Runs `cmd` to its end or the deadline (then kills it): success, stdout,
/// stderr, each kept to `KEEP` bytes.
fn run_bounded(mut cmd: Command, deadline: Duration) -> Result<(bool, String, String), String> {
    let mut child = cmd.spawn().map_err(|e| format!("cannot start: {e}"))?;
    let reader = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            if let Some(mut r) = r {
                let mut buf = [0u8; 8192];
                while let Ok(n) = r.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if kept.len() < KEEP {
                        kept.extend_from_slice(&buf[..n.min(KEEP - kept.len())]);
                    }
                }
            }
            String::from_utf8_lossy(&kept).into_owned()
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "did not answer within {}s; killed",
                    deadline.as_secs()
                ));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    Ok((status.success(), out, err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_and_reason_from_scontrols_one_line_output() {
        let out = "NodeName=h2 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.2 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=debug Reason=preflight: net.x: a b=c 'q' [root@2026-11-25T06:30:04]\n";
        let n = parse_node(out).unwrap();
        assert_eq!(n.state, "IDLE+DRAIN");
        assert_eq!(n.reason.as_deref(), Some("preflight: net.x: a b=c 'q'"));
        assert!(n.out_of_service());
        assert_eq!(field(out, "NodeAddr").as_deref(), Some("10.0.0.2"));
        let idle = parse_node("NodeName=h1 State=IDLE Weight=1\n").unwrap();
        assert_eq!(idle.reason, None);
        assert!(!idle.out_of_service());
        assert!(parse_node("NodeName=h1 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-01-01T00:00:00]").unwrap().out_of_service());
        assert_eq!(parse_node("no state here"), None);
    }

    #[test]
    fn a_reason_is_one_bounded_line() {
        assert_eq!(one_line("a\nb\t c", 100), "a b c");
        let long = one_line(&"é".repeat(200), 50);
        assert!(long.len() <= 50 && long.ends_with("..."), "{long}");
    }

    #[test]
    fn a_call_that_hangs_is_killed_at_its_deadline() {
        let mut c = Command::new("sleep");
        c.arg("30").stdout(Stdio::piped()).stderr(Stdio::piped());
        let e = run_bounded(c, Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("did not answer"), "{e}");
    }
}
