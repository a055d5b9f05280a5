//! `preflight diagnose`: the running distributed jobs on this node, each
//! rank's state as the kernel shows it, and the ranks that hold the others
//! up, named only on evidence. It changes nothing in the job: it reads
//! /proc (no signal, no ptrace stop, nothing written to the job's store).
//!
//! `find` (the jobs and their ranks, from each process's environment),
//! `observe` (each rank over the watch window: the bytes it moves, its
//! task, its CPU time, its sockets), `judge` (the verdict: a job that
//! moved is progressing; one that stood still is judged), `merge` (one
//! verdict across the job's nodes, each asked over ssh or srun). The
//! Python stacks and the job's store are read while the window runs.

mod find;
mod flight;
mod judge;
mod merge;
mod observe;
mod remote;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use preflight_facts::nccl_ras::{self, RasStatus};
use preflight_facts::py_spy::{self, PyFrame};
use preflight_facts::tcp_store::{self, Numbering};
use preflight_facts::torch_install;
use preflight_result::diagnosis::{Culprit, RasReport, StoreRead};

pub use find::{Filter, Job, jobs};
pub use flight::ASK_WITHIN;
pub use judge::judge;
pub use merge::merge;
pub use observe::observe;
pub use remote::{Ask, Remote, Via, ask_all};

use preflight_result::diagnosis::{Diagnosis, SCHEMA};

/// "rank 2", "ranks 0-1,3".
pub(crate) fn rank_list(ranks: &[u32]) -> String {
    match ranks {
        [one] => format!("rank {one}"),
        _ => format!("ranks {}", preflight_ground::values::rank_ranges(ranks)),
    }
}

/// How long py-spy may take for every rank at once.
const STACKS_WITHIN: Duration = Duration::from_secs(3);

/// Each process's main-thread stack from py-spy, all at once, or why not.
pub type Stacks = BTreeMap<u32, Result<Vec<PyFrame>, String>>;

fn stacks(py_spy: &Path, pids: &[u32]) -> Stacks {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Stacks::new();
    };
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for &pid in pids {
            let exe = py_spy.to_path_buf();
            set.spawn(async move { (pid, py_spy::dump(&exe, pid, STACKS_WITHIN).await) });
        }
        let mut out = Stacks::new();
        while let Some(Ok((pid, stack))) = set.join_next().await {
            out.insert(pid, stack);
        }
        out
    })
}

/// How long the whole reading of the job's store may take.
const STORE_WITHIN: Duration = Duration::from_secs(2);

/// The keys a rank's Gloo address is published under, in the store's own
/// spelling (a leading `/` for the client's prefix, then torchrun's agent
/// store prefix where the job used one (`/worker/attempt_N/`, its own
/// leading `/` kept), `default_pg`, the group `0`, the
/// device where the group has a backend per device, and Gloo's context
/// `0`): torch up to 2.1 (`default_pg/0/0/R`, and 2.0's
/// `default_pg/0/cpu/0/R`), then 2.2 and later, whose group prefix ends in
/// `/` (`default_pg/0//0/R`, and from 2.3 `default_pg/0//cpu//0/R`, as
/// torch 2.15 lists them), with the agent's attempt dropped from 2.6.
/// Several spellings per rank: each is a CHECK, and only one exists.
fn address_keys(job: &Job, numbering: Numbering) -> Vec<(u32, String)> {
    let prefixes = store_prefixes(job);
    let groups: &[&str] = match numbering {
        Numbering::Old => &["default_pg/0/0/", "default_pg/0/cpu/0/"],
        Numbering::New => &["default_pg/0//0/", "default_pg/0//cpu//0/"],
    };
    let mut out = Vec::new();
    for r in 0..job.world.min(4096) {
        for p in &prefixes {
            for g in groups {
                out.push((r, format!("/{p}{g}{r}")));
            }
        }
    }
    out
}

/// Where torch's keys start in the job's store, after the client's `/`:
/// torchrun's agent store prefix where the job used one (dropped from
/// torch 2.6, so both), else nothing.
fn store_prefixes(job: &Job) -> Vec<String> {
    match job.agent_attempt {
        Some(n) => vec![format!("/worker/attempt_{n}/"), String::new()],
        None => vec![String::new()],
    }
}

/// The torch the job's ranks loaded: the first rank's that names one.
fn torch_of(proc_dir: &Path, job: &Job) -> Option<torch_install::TorchInstall> {
    job.ranks
        .iter()
        .find_map(|r| torch_install::of_process(&proc_dir.join(r.pid.to_string())))
}

/// Which ranks of `job` reached init_process_group, from its store, in
/// the numbering of the torch the job runs (`torch`); not read at all
/// where that torch is not known, since a query in the wrong numbering
/// stalls or changes a store. Where the job sets TORCH_NCCL_DESYNC_DEBUG,
/// its ranks' desync keys too, as their recorders (`flight::desync`).
fn read_store(
    job: &Job,
    torch: Option<&torch_install::TorchInstall>,
) -> (Option<StoreRead>, flight::Reads) {
    let mut desync = flight::Reads::new();
    let read = read_store_keys(job, torch, &mut desync);
    (read, desync)
}

fn read_store_keys(
    job: &Job,
    torch: Option<&torch_install::TorchInstall>,
    desync: &mut flight::Reads,
) -> Option<StoreRead> {
    let (host, port) = job.store.as_ref()?;
    let failed = |error: String| {
        Some(StoreRead {
            error: Some(error),
            ..StoreRead::default()
        })
    };
    let Some((major, minor)) = torch.and_then(|t| t.major_minor()) else {
        return failed(
            "not read: no rank shows which torch it runs (no torch/lib/libtorch*.so in its memory maps, or no torch/version.py beside it), and a query in the wrong numbering can stall or change a store"
                .into(),
        );
    };
    let numbering = Numbering::of_torch(major, minor);
    let addr = match preflight_facts::resolve::within(host, *port, STORE_WITHIN) {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    let deadline = std::time::Instant::now() + STORE_WITHIN;
    let keys = address_keys(job, numbering);
    let traces = if job.desync_debug {
        flight::desync_keys(&store_prefixes(job), numbering, job.world)
    } else {
        Vec::new()
    };
    let wire: Vec<String> = keys
        .iter()
        .map(|(_, k)| k.clone())
        .chain(traces.iter().map(|t| t.key.clone()))
        .collect();
    Some(match tcp_store::read(addr, numbering, &wire, deadline) {
        Ok(view) => {
            *desync = flight::desync(&traces, &view.values[keys.len().min(view.values.len())..]);
            let mut arrived: Vec<u32> = keys
                .iter()
                .zip(&view.values)
                .filter(|(_, (_, v))| v.is_some())
                .map(|((r, _), _)| *r)
                .collect();
            arrived.dedup();
            StoreRead {
                server: view.numbering.name().into(),
                keys: view.keys,
                arrived,
                error: None,
            }
        }
        Err(e) => StoreRead {
            server: numbering.name().into(),
            error: Some(e),
            ..StoreRead::default()
        },
    })
}

/// The job's desync keys again, at the window's end, where it sets
/// TORCH_NCCL_DESYNC_DEBUG and its torch is known: what its ranks started
/// and ended since the first read is the job moving.
fn read_desync(job: &Job, torch: Option<&torch_install::TorchInstall>) -> flight::Reads {
    let (Some((host, port)), Some((major, minor)), true) = (
        job.store.as_ref(),
        torch.and_then(|t| t.major_minor()),
        job.desync_debug,
    ) else {
        return flight::Reads::new();
    };
    let numbering = Numbering::of_torch(major, minor);
    let Ok(addr) = preflight_facts::resolve::within(host, *port, STORE_WITHIN) else {
        return flight::Reads::new();
    };
    let traces = flight::desync_keys(&store_prefixes(job), numbering, job.world);
    let wire: Vec<String> = traces.iter().map(|t| t.key.clone()).collect();
    let deadline = std::time::Instant::now() + STORE_WITHIN;
    match tcp_store::read(addr, numbering, &wire, deadline) {
        Ok(view) => flight::desync(&traces, &view.values),
        Err(_) => flight::Reads::new(),
    }
}

/// How long NCCL's RAS may take to gather its report.
const RAS_WITHIN: Duration = Duration::from_secs(8);

/// Where to ask NCCL's RAS: `off`, an address, or `auto`: the
/// NCCL_RAS_ADDR a rank was given, else NCCL's default, asked only
/// where something listens there.
#[derive(Debug, Clone)]
pub enum Ras {
    Off,
    Auto,
    At(String),
}

/// Where to ask RAS, and whether to stay quiet where nothing listens.
fn ras_addr(setting: &Ras, found: &[Job]) -> Option<(String, bool)> {
    match setting {
        Ras::Off => None,
        Ras::At(a) => Some((a.clone(), false)),
        Ras::Auto => Some((
            found
                .iter()
                .find_map(|j| j.ras_addr.clone())
                .unwrap_or_else(|| nccl_ras::DEFAULT_ADDR.to_string()),
            true,
        )),
    }
}

/// RAS's report at the window's end, weighed against its report at the
/// start (`before`): a rank behind in a collective's count is named only
/// where both reports have it behind at the same count (one report is a
/// moment, in which a healthy rank can be a collective behind), and
/// counts that grew are the job moving.
fn ras(
    at: Option<&(String, bool)>,
    before: Option<Result<RasStatus, String>>,
) -> Option<RasReport> {
    let (addr, quiet) = at?.clone();
    let before = before.and_then(Result::ok);
    match nccl_ras::status(&addr, RAS_WITHIN) {
        Ok(st) => Some(RasReport {
            moved: before
                .as_ref()
                .map(|b| st.counted_since(b))
                .filter(|n| *n > 0)
                .map(|n| format!("NCCL RAS counted {n} more collectives across the window")),
            culprits: quote_pings(
                st.named
                    .into_iter()
                    .filter(|r| {
                        !r.why.starts_with("behind")
                            || before.as_ref().is_some_and(|b| b.named.contains(r))
                    })
                    .map(|r| {
                        let dead = r.why.contains("considers it dead");
                        Culprit {
                            next_step: if dead {
                                format!(
                                    "drain {}: its NCCL process stopped answering its peers",
                                    r.host
                                )
                            } else {
                                "read its stack and its NCCL log (NCCL_DEBUG=WARN): the evidence is against the rank, not its node".into()
                            },
                            evidence: if dead { "node" } else { "rank" }.into(),
                            rank: r.rank,
                            node: r.host,
                            pid: r.pid,
                            reason: format!("NCCL RAS: {}", r.why),
                            stack: Vec::new(),
                        }
                    })
                    .collect(),
            ),
            address: addr,
            format: st.format,
            nccl_version: st.nccl_version,
            communicators: st.communicators,
            findings: st.findings,
            error: None,
        }),
        // Nothing listens: no NCCL job with RAS here.
        Err(e) if quiet && e.starts_with("no NCCL RAS") => None,
        Err(e) => Some(RasReport {
            address: addr,
            error: Some(e),
            ..RasReport::default()
        }),
    }
}

/// Nodes whose ping check is quoted at most: each is a thread for a
/// second or so.
const MOST_PINGED: usize = 16;

/// Each node RAS names, pinged as preflight's ping check does (every node
/// at once), what it finds added to the reasons: a dead peer whose node
/// answers lost its process; one whose node does not, the node or the
/// path.
fn quote_pings(mut culprits: Vec<Culprit>) -> Vec<Culprit> {
    let mut hosts: Vec<String> = culprits
        .iter()
        .map(|c| c.node.clone())
        .filter(|h| h != "unknown" && !h.is_empty())
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts.truncate(MOST_PINGED);
    let quotes: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = hosts
            .iter()
            .map(|h| s.spawn(move || (h.clone(), preflight_kinds::ping::quote(h))))
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    for c in &mut culprits {
        if let Some((_, q)) = quotes.iter().find(|(h, _)| *h == c.node) {
            c.reason.push_str(&format!("; {q}"));
        }
    }
    culprits
}

/// Every job on the node (under `proc_dir`) that `filter` keeps, each
/// rank watched for `window` at most (its Python stack read with
/// `py_spy`, where given, and the job's store read, while the window
/// runs), judged; and NCCL's RAS, as `ras` says. With `ask_dumps`, each
/// rank that takes requests for a Flight Recorder dump is asked for one
/// (`flight::ask`), and it is waited for.
pub fn diagnose(
    proc_dir: &Path,
    node: &str,
    filter: &Filter,
    window: Duration,
    py_spy: Option<PathBuf>,
    ras_at: &Ras,
    ask_dumps: bool,
) -> Diagnosis {
    let found = jobs(proc_dir, filter);
    let pids: Vec<u32> = found
        .iter()
        .flat_map(|j| j.ranks.iter().map(|r| r.pid))
        .collect();
    let torches: Vec<Option<torch_install::TorchInstall>> =
        found.iter().map(|j| torch_of(proc_dir, j)).collect();
    let recorders = |asked: &[flight::Asked]| -> Vec<flight::Reads> {
        let by = std::time::Instant::now() + flight::READ_WITHIN;
        found
            .iter()
            .zip(asked)
            .map(|(j, a)| flight::read(proc_dir, j, by, a))
            .collect()
    };
    // At the start, what is there already; at the end, the dumps asked for.
    let before = recorders(&vec![flight::Asked::new(); found.len()]);
    let ras_at = ras_addr(ras_at, &found);
    let (watched, stacks, stores, ras_before) = std::thread::scope(|s| {
        let ras_before = s.spawn(|| {
            ras_at
                .as_ref()
                .map(|(a, _)| nccl_ras::status(a, RAS_WITHIN))
        });
        let stacks = s.spawn(|| py_spy.map(|p| stacks(&p, &pids)).unwrap_or_default());
        let stores = s.spawn(|| {
            found
                .iter()
                .zip(&torches)
                .map(|(j, t)| read_store(j, t.as_ref()))
                .collect::<Vec<_>>()
        });
        let watched = observe(proc_dir, &pids, window);
        (
            watched,
            stacks.join().unwrap_or_default(),
            stores.join().unwrap_or_default(),
            ras_before.join().ok().flatten(),
        )
    });
    // Asked for only now: the dump a rank writes is bytes it moves, which
    // the window must not see.
    let asked: Vec<flight::Asked> = found
        .iter()
        .map(|j| {
            if ask_dumps {
                flight::ask(proc_dir, j)
            } else {
                flight::Asked::new()
            }
        })
        .collect();
    let after = recorders(&asked);
    let ms = watched.elapsed.as_millis() as u64;
    let judged: Vec<_> = found
        .iter()
        .zip(
            stores
                .into_iter()
                .chain(std::iter::repeat((None, flight::Reads::new()))),
        )
        .zip(&torches)
        .zip(before.into_iter().zip(after))
        .map(|(((j, (store, desync)), torch), (mut before, mut after))| {
            // A rank's desync keys stand for its recorder where none was
            // read (or none could be: a rank asked that wrote no dump is
            // often the one stopped): as the window began (the store's
            // first read), and as it ended.
            for (rank, read) in desync {
                flight::stand_in(&mut before, rank, read);
            }
            for (rank, read) in read_desync(j, torch.as_ref()) {
                flight::stand_in(&mut after, rank, read);
            }
            let flight = flight::weigh(&before, &after);
            let mut d = judge(j, &watched.watched, &stacks, store, flight, node, ms);
            d.torch = torch.as_ref().map(|t| t.version.clone());
            d
        })
        .collect();
    let nccl_ras = ras(ras_at.as_ref(), ras_before);
    let ras_named = nccl_ras.as_ref().is_some_and(|r| !r.culprits.is_empty());
    // Collectives RAS counted: a job that could not be judged here (every
    // rank waits, as a GPU job's do while its kernels run) moved.
    // RAS speaks for one job's communicators: taken as a job's progress
    // only where it is the node's one job.
    let mut judged = judged;
    if let Some(m) = nccl_ras
        .as_ref()
        .and_then(|r| r.moved.clone())
        .filter(|_| judged.len() == 1)
    {
        for j in judged.iter_mut().filter(|j| j.verdict == "unknown") {
            j.moved.push(m.clone());
            j.summary = format!("the job moves: {m}");
            j.verdict = "progressing".into();
        }
    }
    let verdict = if judged.iter().any(|j| j.verdict == "held") || ras_named {
        "held"
    } else if judged.is_empty() {
        "no_job"
    } else if judged.iter().all(|j| j.verdict == "progressing") {
        "progressing"
    } else {
        "unknown"
    };
    Diagnosis {
        schema: SCHEMA.into(),
        node: node.into(),
        watch_ms: ms,
        jobs: judged,
        nccl_ras,
        verdict: verdict.into(),
    }
}
