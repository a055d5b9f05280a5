//! diagnose on other nodes, over ssh (`ssh HOST preflight diagnose
//! --format json ...`) or as a step of the job's own Slurm allocation
//! (`srun --overlap --jobid J --nodelist NODE ...`): every node at once
//! (at most `AT_ONCE`), each within a deadline; what each answers, or why
//! it could not (unreachable, no preflight there, an answer that is not a
//! diagnosis), which is said and never guessed at.

use std::time::Duration;

use tokio::io::AsyncReadExt;

use preflight_result::diagnosis::{Diagnosis, SCHEMA, Unreachable};

/// The largest answer a node may give: a node of thousands of ranks'
/// diagnosis is megabytes at most.
const MAX_ANSWER: u64 = 64 << 20;

/// Nodes asked at once: a job of a thousand nodes does not start a
/// thousand ssh or srun processes on one host.
const AT_ONCE: usize = 64;

/// What srun takes from its environment as the new step's requests: a
/// diagnosis step asks for one CPU on its node, nothing else.
const STEP_REQUESTS: &[&str] = &[
    "SLURM_CPUS_PER_TASK",
    "SLURM_CPUS_PER_GPU",
    "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE",
    "SLURM_GPUS_PER_SOCKET",
    "SLURM_GPUS_PER_TASK",
    "SLURM_MEM_PER_CPU",
    "SLURM_MEM_PER_GPU",
    "SLURM_MEM_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TRES_PER_TASK",
    "SLURM_DISTRIBUTION",
];

/// How the other nodes are reached.
#[derive(Debug, Clone)]
pub enum Via {
    /// Options before the host (`-i KEY`, `-o Port=2222`), each a word.
    Ssh { options: Vec<String> },
    /// A step of this Slurm job on the node, beside the job's own
    /// (`--overlap`): no ssh, the job's user, the job's nodes.
    Srun { job: String },
}

/// How to reach the other nodes.
#[derive(Debug, Clone)]
pub struct Remote {
    pub via: Via,
    /// preflight on the other nodes.
    pub program: String,
    /// How long a node may take, ssh or srun included.
    pub within: Duration,
}

/// What each other node is asked: its own `preflight diagnose`, with the
/// settings this one runs under, spelt here and nowhere else.
#[derive(Debug, Clone)]
pub struct Ask {
    /// `--py-spy`: `auto`, `off` or a path on that node.
    pub py_spy: String,
    /// `--nccl-ras`: `auto`, `off` or HOST:PORT.
    pub nccl_ras: String,
    pub watch: Duration,
    pub ask_dumps: bool,
    pub job: Option<String>,
    pub this_namespace: bool,
}

impl Ask {
    /// Its arguments, after `diagnose --format json`.
    pub fn args(&self) -> Vec<String> {
        let mut out: Vec<String> = vec![
            "--py-spy".into(),
            self.py_spy.clone(),
            "--nccl-ras".into(),
            self.nccl_ras.clone(),
            "--watch".into(),
            format!("{}ms", self.watch.as_millis()),
        ];
        if self.ask_dumps {
            out.push("--ask-dumps".into());
        }
        if let Some(j) = &self.job {
            out.extend(["--job".into(), j.clone()]);
        }
        if self.this_namespace {
            out.push("--this-namespace".into());
        }
        out
    }

    /// How long a node may take: its window and the dumps it waits for,
    /// and 28 s for ssh or srun to start it and for its own reads.
    pub fn within(&self) -> Duration {
        let dumps = if self.ask_dumps {
            crate::ASK_WITHIN
        } else {
            Duration::ZERO
        };
        self.watch + Duration::from_secs(28) + dumps
    }
}

/// A word for the remote shell, whatever it holds.
fn quote(w: &str) -> String {
    format!("'{}'", w.replace('\'', "'\\''"))
}

fn command(remote: &Remote, host: &str, args: &[String]) -> tokio::process::Command {
    let words = std::iter::once(remote.program.as_str())
        .chain(["diagnose", "--format", "json"])
        .chain(args.iter().map(String::as_str));
    match &remote.via {
        Via::Ssh { options } => {
            let mut c = tokio::process::Command::new("ssh");
            c.args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=5"])
                .args(options)
                .arg(host)
                .arg("--")
                .arg(words.map(quote).collect::<Vec<_>>().join(" "));
            c
        }
        Via::Srun { job } => {
            let mut c = tokio::process::Command::new("srun");
            // Explicit shape: a watchdog in the batch script inherits the
            // job's SLURM_NTASKS and the like, which would ask for more.
            // Nor the batch step's requests of GPUs, memory and CPUs.
            for var in STEP_REQUESTS {
                c.env_remove(var);
            }
            c.args(["--overlap", "--quiet", "--jobid", job, "--nodelist", host])
                .args(["--nodes=1", "--ntasks=1", "--cpus-per-task=1"])
                .args(["--kill-on-bad-exit=1", "--"])
                .args(words);
            c
        }
    }
}

async fn ask(remote: &Remote, host: &str, args: &[String]) -> Result<Diagnosis, String> {
    let how = match remote.via {
        Via::Ssh { .. } => "ssh",
        Via::Srun { .. } => "srun",
    };
    let mut child = command(remote, host, args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {how}: {e}"))?;
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(format!("{how}'s output could not be read"));
    };
    // A node's answer is bounded, whatever it sends.
    let run = async {
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let (mut out, mut err) = (out.take(MAX_ANSWER + 1), err.take(64 << 10));
        // What is kept is bounded; the rest of stderr is read and dropped,
        // so that a chatty node is not stalled on a full pipe.
        let drain_err = async {
            err.read_to_end(&mut stderr).await?;
            tokio::io::copy(&mut err.into_inner(), &mut tokio::io::sink()).await
        };
        let (a, b) = tokio::join!(out.read_to_end(&mut stdout), drain_err);
        a?;
        b?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, stdout, stderr))
    };
    let (status, stdout, stderr) = tokio::time::timeout(remote.within, run)
        .await
        .map_err(|_| format!("no answer within {} s", remote.within.as_secs()))?
        .map_err(|e| format!("{how}: {e}"))?;
    if stdout.len() as u64 > MAX_ANSWER {
        return Err(format!("an answer over {} MiB", MAX_ANSWER >> 20));
    }
    // diagnose's own exits: 0, 1, 3; anything else is ssh's, srun's or a
    // failure.
    if !matches!(status.code(), Some(0 | 1 | 3)) {
        let err = String::from_utf8_lossy(&stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!("{} ({status})", last.trim()));
    }
    let d: Diagnosis = serde_json::from_slice(&stdout)
        .map_err(|e| format!("its answer is not a diagnosis: {e}"))?;
    if d.schema != SCHEMA {
        return Err(format!("its answer is a {} document", d.schema));
    }
    Ok(d)
}

/// Every host asked at once; each one's diagnosis, or why not.
pub fn ask_all(
    remote: &Remote,
    hosts: &[String],
    args: &[String],
) -> (Vec<Diagnosis>, Vec<Unreachable>) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        let why = "cannot start the async runtime".to_string();
        return (
            Vec::new(),
            hosts
                .iter()
                .map(|h| Unreachable {
                    host: h.clone(),
                    why: why.clone(),
                })
                .collect(),
        );
    };
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        let at_once = std::sync::Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
        for (i, h) in hosts.iter().enumerate() {
            let (remote, h, args) = (remote.clone(), h.clone(), args.to_vec());
            let at_once = at_once.clone();
            set.spawn(async move {
                let Ok(_turn) = at_once.acquire().await else {
                    return (i, h, Err("its query was never started".to_string()));
                };
                let a = ask(&remote, &h, &args).await;
                (i, h, a)
            });
        }
        let mut answers = Vec::new();
        while let Some(joined) = set.join_next().await {
            if let Ok(a) = joined {
                answers.push(a);
            }
        }
        // A query that ended without an answer is said, as any other.
        for (i, h) in hosts.iter().enumerate() {
            if !answers.iter().any(|(k, _, _)| *k == i) {
                answers.push((
                    i,
                    h.clone(),
                    Err("its query ended without an answer".into()),
                ));
            }
        }
        answers.sort_by_key(|(i, _, _)| *i);
        let mut nodes = Vec::new();
        let mut unreachable = Vec::new();
        for (_, host, a) in answers {
            match a {
                Ok(d) => nodes.push(d),
                Err(why) => unreachable.push(Unreachable { host, why }),
            }
        }
        (nodes, unreachable)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_is_asked_with_this_ones_settings() {
        let mut a = Ask {
            py_spy: "off".into(),
            nccl_ras: "auto".into(),
            watch: Duration::from_millis(1500),
            ask_dumps: false,
            job: None,
            this_namespace: false,
        };
        assert_eq!(
            a.args(),
            ["--py-spy", "off", "--nccl-ras", "auto", "--watch", "1500ms"]
        );
        assert_eq!(a.within(), Duration::from_millis(29_500));
        a.ask_dumps = true;
        a.job = Some("4242".into());
        a.this_namespace = true;
        assert_eq!(
            a.args()[6..],
            ["--ask-dumps", "--job", "4242", "--this-namespace"]
        );
        assert_eq!(
            a.within(),
            Duration::from_millis(29_500) + crate::ASK_WITHIN
        );
    }

    #[test]
    fn a_word_is_one_word_to_the_remote_shell() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote("$(rm -rf /)"), "'$(rm -rf /)'");
    }
}
