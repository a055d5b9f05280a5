//! A run: `preflight run`, `check` and `bench` from their settings: the
//! checklist stage, then (for `run` and `bench`) the cluster and
//! collective stages, and the report. `check` never leaves this node.
//! The command line, the Slurm modes and the rank simulator each build
//! the settings (`settings`) and call `run` or `execute`.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub mod emit;
mod failure;
pub mod floors;
mod node;
pub mod post;
pub mod selection;
pub mod settings;
pub mod site;
pub mod slurm;
mod waiting;

pub use emit::Outcome;
use emit::emit;
pub use failure::Failure;
use preflight_checklist::{self as checklist, Check, Evaluator};
use preflight_cluster::auth::Token;
use preflight_cluster::identity::{self, Identity, NodePlan};
use preflight_cluster::{self as cluster, RankInput};
use preflight_collective::config as coll;
use preflight_collective::rank::RankInfo;
use preflight_collective::stage;
use preflight_collective::sweep::Hooks;
use preflight_engine::{self as engine, Progress};
use preflight_facts::Facts;
use preflight_ground::exit::ExitCode;
use preflight_report as report;
use preflight_report::format::Format;
use preflight_result::cluster::ClusterReport;
use preflight_result::report::Interrupted;
use preflight_result::{CheckResult, Verdict};
use selection::{all_checks, facts, select};
pub use settings::{CollectiveMode, RunSettings, Stage};
use waiting::Watch;

/// The collective stage's settings for this command.
pub fn collective_config(args: &RunSettings, stage: Stage) -> coll::Config {
    let c = &args.collective;
    let mode = match (c.collective, stage) {
        (_, Stage::Checklist) => coll::Mode::Off,
        (Some(CollectiveMode::Off), _) => coll::Mode::Off,
        (Some(CollectiveMode::Short), _) => coll::Mode::Short,
        (Some(CollectiveMode::Full), _) | (None, Stage::Bench) => coll::Mode::Full,
        (None, Stage::Full) => coll::Mode::Short,
    };
    let default_max = if stage == Stage::Bench {
        64 << 20
    } else {
        1 << 20
    };
    coll::Config {
        mode,
        backends: args
            .checklist
            .backends
            .0
            .iter()
            .map(|b| b.name().to_string())
            .collect(),
        required: if args.checklist.backends.1 {
            args.checklist
                .backends
                .0
                .iter()
                .map(|b| b.name().to_string())
                .collect()
        } else {
            Vec::new()
        },
        max_size: c.max_size.unwrap_or(default_max),
        step_factor: c.step_factor,
        // Measured (bench/RESULTS.md, issue 14): at 20 timed iterations the
        // spread of busbw between runs at 8 KiB to 256 KiB falls from 69 %
        // to 29 %; the short stage is a pass/fail check and stays quick.
        warmup: c
            .warmup
            .unwrap_or(if mode == coll::Mode::Full { 5 } else { 2 }),
        iters: c
            .iters
            .unwrap_or(if mode == coll::Mode::Full { 20 } else { 5 }),
        step_timeout: c.step_timeout.0,
        until: None,
    }
}

/// Set to 1: as `--require-secret`, for sites that set it for every job.
const REQUIRE_SECRET_VAR: &str = "PREFLIGHT_REQUIRE_SECRET";

/// `run`, `check` and `bench`: the checklist, then the cluster and
/// collective stages as they apply, then the report.
pub fn run(args: &RunSettings, stage: Stage) -> Result<ExitCode, Failure> {
    match execute(args, stage, None)? {
        Executed::Agent(code) => Ok(code),
        Executed::Done(o) => emit(args, stage, *o),
    }
}

pub enum Executed {
    Done(Box<Outcome>),
    /// A node agent, which started its node's ranks and has reported.
    Agent(ExitCode),
}

/// The stages, with the job's environment (`env`, else this process's).
pub fn execute(
    args: &RunSettings,
    stage: Stage,
    env: Option<BTreeMap<String, String>>,
) -> Result<Executed, Failure> {
    let process_start = tokio::time::Instant::now();
    if let Err(e) = preflight_ground::interrupt::install() {
        eprintln!(
            "preflight: warning: cannot take over SIGTERM, SIGINT and SIGHUP ({e}): a signal ends this run without a report"
        );
    }
    preflight_ground::interrupt::enter("startup");
    if stage != Stage::Checklist {
        preflight_cluster::raise_open_files();
    }
    let plan = Plan::new(args, stage, env)?;
    let identity = match plan.role(args)? {
        Role::Node(node_plan) => {
            return node::agent(
                node_plan,
                args,
                plan.facts,
                plan.cluster_checks,
                process_start,
                plan.linger,
            )
            .map(Executed::Agent);
        }
        Role::Rank(id) => Some(id),
        Role::Alone => None,
    };
    // A secret too easy to guess is refused before anything serves. A
    // node's leader judges it for its node's other ranks: a rank that
    // proves the same secret to its leader needs not judge it again.
    let follows = identity
        .as_ref()
        .is_some_and(|id| cluster::leader::hierarchical(id) && id.local_rank > 0 && id.rank != 0);
    let judge = || plan.token.judge().map_err(Failure::Usage);
    if !follows {
        judge()?;
    }
    let started_at = SystemTime::now();
    let start = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Runtime(format!("cannot start the async runtime: {e}")))?;
    // A node agent's ranks other than its first are nobody's to read.
    let speaks = plan.facts.env(emit::SPEAKER) != Some("0");
    let watch = Watch::new(args, identity.is_some() && speaks);
    // Rank 0 serves before its checklist runs, so the others find the port
    // open as early as possible.
    let server = identity.as_ref().map(|id| {
        runtime.block_on(cluster::start_server(
            id,
            cluster::ServerInput {
                facts: &plan.facts,
                cluster_checks: plan.cluster_checks.clone(),
                timeout: args.timeout.0,
                strict: args.strict,
                started: process_start,
                linger: plan.linger,
                token: plan.token.clone(),
                waiting: watch.sender.clone(),
            },
        ))
    });
    // Before the checklist: a node's ranks other than its leader leave
    // the node's checks to it.
    let node = identity.as_ref().map(|id| {
        runtime.block_on(cluster::NodeLink::settle(
            id,
            &plan.token,
            process_start,
            args.timeout.0,
        ))
    });
    if let Some(cluster::NodeLink::Unled(why)) = &node {
        judge()?;
        eprintln!("preflight: warning: {why}: this rank evaluates its node's checks itself");
    }
    let led = node.as_ref().is_some_and(cluster::NodeLink::led);
    preflight_ground::interrupt::enter("checks");
    let checks_start = Instant::now();
    let mut results = checklist_stage(&runtime, args, &plan, identity.as_ref(), led);
    let mut timings = preflight_result::report::Timings {
        checks_ms: checks_start.elapsed().as_millis() as u64,
        evaluated: results
            .iter()
            .filter(|r| r.status != preflight_result::Status::Skip && !r.cached)
            .count(),
        shared: results.iter().filter(|r| r.shared).count(),
        ..Default::default()
    };
    let rank = identity.as_ref().map(|id| id.rank);
    let cluster = identity.zip(server).and_then(|(identity, mut server)| {
        let place = Place {
            rank: identity.rank,
            local_rank: identity.local_rank,
            local_world: identity.local_world_size,
        };
        if preflight_ground::interrupt::get().is_some() {
            // Rank 0's server closed its barrier at the signal and told
            // the ranks here; the others never checked in.
            return sent_verdict(&runtime, &mut server).map(|r| (r, place.rank));
        }
        preflight_ground::interrupt::enter("rendezvous");
        let rendezvous_start = Instant::now();
        let (mut report, link) = cluster_stage(
            &runtime,
            Rendezvous {
                args,
                plan: &plan,
                identity,
                node: node.unwrap_or(cluster::NodeLink::Alone),
                started: process_start,
                watch: &watch,
            },
            &mut server,
            &mut results,
        )?;
        timings.rendezvous_ms = Some(rendezvous_start.elapsed().as_millis() as u64);
        if let Some(link) = link
            && preflight_ground::interrupt::get().is_none()
        {
            let collective_start = Instant::now();
            collective_stage(&runtime, args, &plan, &mut report, link, place);
            timings.collective_ms = Some(collective_start.elapsed().as_millis() as u64);
        }
        Some((report, place.rank))
    });
    preflight_ground::interrupt::enter(Interrupted::REPORT_PHASE);
    // Probes stuck in blocking reads past their timeout must not hold the
    // process open: the verdict is already known.
    runtime.shutdown_background();
    let interrupted = preflight_ground::interrupt::get().map(|i| {
        // Children end with their tasks (kill_on_drop); what they started
        // in turn ends here.
        preflight_ground::interrupt::kill_descendants();
        #[cfg(feature = "test-hooks")]
        if let Some(ms) = plan
            .facts
            .env(preflight_ground::test_hooks::INTERRUPT_DELAY_MS)
            .and_then(|v| v.parse().ok())
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
        Interrupted {
            signal: i.signal.to_string(),
            phase: i.phase,
            rank,
            host: plan.facts.hostname().to_string(),
            remote: false,
        }
    });
    timings.shared = results.iter().filter(|r| r.shared).count();
    timings.cpu_ms = cpu_ms();
    Ok(Executed::Done(Box::new(Outcome {
        facts: plan.facts,
        results,
        cluster,
        started_at,
        elapsed: start.elapsed(),
        interrupted,
        timings: Some(timings),
    })))
}

/// CPU time of this process and of the programs it ran and waited for,
/// user and system, ms.
fn cpu_ms() -> u64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let ms = |who| {
        getrusage(who).map_or(0, |u| {
            let t = |tv: nix::sys::time::TimeVal| {
                (tv.tv_sec().max(0) as u64) * 1000 + (tv.tv_usec().max(0) as u64) / 1000
            };
            t(u.user_time()) + t(u.system_time())
        })
    };
    ms(UsageWho::RUSAGE_SELF) + ms(UsageWho::RUSAGE_CHILDREN)
}

/// After a signal: how long rank 0's part of the rendezvous may go on. Its
/// server closes the barrier at once and sends every rank that checked in,
/// itself included, the verdict that says so.
const RANK0_GRACE: Duration = Duration::from_millis(800);

/// After a signal in the collective stage: how long rank 0 keeps serving
/// the store, so that the ranks it tells hear it before its sockets close.
const TELL_PEERS: Duration = Duration::from_millis(300);

/// The verdict rank 0's server sent when a signal closed its barrier; none
/// on the other ranks, which serve nothing.
fn sent_verdict(
    runtime: &tokio::runtime::Runtime,
    server: &mut cluster::Server,
) -> Option<ClusterReport> {
    let Ok(Some(handle)) = server else {
        return None;
    };
    runtime
        .block_on(tokio::time::timeout(RANK0_GRACE, handle))
        .ok()?
        .ok()
}

/// What `run` settles before any stage: the settings, the checks split by
/// the stage that evaluates them, and this node's facts.
struct Plan {
    stage: Stage,
    coll: coll::Config,
    /// How long rank 0 keeps its store up after the verdict.
    linger: Duration,
    facts: Arc<Facts>,
    checklist_hash: String,
    node_checks: Vec<Arc<Check>>,
    cluster_checks: Vec<Arc<Check>>,
    collective_checks: Vec<Arc<Check>>,
    /// The job's token: none for `check`, which never meets a peer.
    token: Token,
}

/// Where this rank sits: its rank, and its place among its node's ranks.
#[derive(Debug, Clone, Copy)]
struct Place {
    rank: u32,
    local_rank: u32,
    local_world: u32,
}

/// Who this process is in the job.
enum Role {
    /// `check`: this node alone, never a rendezvous.
    Alone,
    /// One rank of the job.
    Rank(Identity),
    /// A node agent that starts its node's ranks.
    Node(NodePlan),
}

impl Plan {
    fn new(
        args: &RunSettings,
        stage: Stage,
        env: Option<BTreeMap<String, String>>,
    ) -> Result<Plan, Failure> {
        let coll = collective_config(args, stage);
        // A bad setting is the operator's to fix before anything runs, not
        // a failure found halfway through the stage.
        if coll.mode != coll::Mode::Off {
            let same_host = std::env::var(preflight_collective::tcp::SAME_HOST_VAR).ok();
            preflight_collective::tcp::same_host_mode(same_host.as_deref())
                .map_err(Failure::Usage)?;
        }
        let linger = if coll.mode == coll::Mode::Off {
            Duration::ZERO
        } else {
            coll.budget()
        };
        let checks = match stage {
            // bench: no checklist at all.
            Stage::Bench => Vec::new(),
            _ => select(all_checks(&args.checklist)?, &args.checklist)?,
        };
        // The firewall check reads the probe range where the stage does.
        let env = match (args.cluster.probe_ports, stage) {
            (Some(range), Stage::Full) => {
                let mut env = env.unwrap_or_else(preflight_facts::process_env);
                env.insert(
                    preflight_kinds::ports::PROBE_PORTS_VAR.into(),
                    range.to_string(),
                );
                Some(env)
            }
            _ => env,
        };
        let given = match &args.profile {
            Some(path) => Some(
                preflight_facts::profile::load_given(path).map_err(|errors| {
                    let said: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    Failure::Usage(said.join("\nerror: "))
                })?,
            ),
            None => None,
        };
        let facts = Arc::new(facts(&args.checklist, env)?.with_profile(given));
        // A secret too short or readable by others is refused before
        // anything runs; `check` meets no peer and needs none.
        // How easy the secret is to guess is judged once the rank knows
        // whether its node's leader judged it for it (`execute`).
        let token = match stage {
            Stage::Checklist => Token::none(),
            _ => Token::resolve_unjudged(facts.env_vars()).map_err(Failure::Usage)?,
        };
        let checklist_hash = checklist::checklist_hash(&checks);
        let (mut node_checks, mut cluster_checks, mut collective_checks) =
            (Vec::new(), Vec::new(), Vec::new());
        for check in checks {
            match (stage, check.evaluator()) {
                (_, Evaluator::Node) => node_checks.push(check),
                // `check` meets no other node: the checks across nodes are
                // `run`'s, and not listed (`list` says which they are).
                (Stage::Checklist, _) => {}
                (_, Evaluator::Cluster) => cluster_checks.push(check),
                // Busbw thresholds: every rank evaluates them over the same
                // report; rank 0 keeps them out of the barrier's checks.
                (_, Evaluator::Collective) => {
                    cluster_checks.push(Arc::clone(&check));
                    collective_checks.push(check);
                }
            }
        }
        Ok(Plan {
            stage,
            coll,
            linger,
            facts,
            checklist_hash,
            node_checks,
            cluster_checks,
            collective_checks,
            token,
        })
    }

    fn role(&self, args: &RunSettings) -> Result<Role, Failure> {
        if self.stage == Stage::Checklist {
            return Ok(Role::Alone);
        }
        let role = match identity::resolve(&args.cluster.flags(), self.facts.env_vars())
            .map_err(Failure::Usage)?
        {
            identity::Role::Node(plan) => Role::Node(plan),
            identity::Role::Rank(id) => Role::Rank(id),
        };
        // The nodes the job spans, where the launcher says (a node count, or
        // a local world size to divide by); `None`: only its rank count is
        // known.
        let local_size_given = preflight_facts::launch::local_size_vars()
            .iter()
            .any(|v| self.facts.env(v).is_some());
        let nodes = match &role {
            Role::Node(plan) => Some(plan.nnodes),
            Role::Rank(id) => id.nnodes.or_else(|| {
                local_size_given.then(|| id.world_size.div_ceil(id.local_world_size.max(1)))
            }),
            Role::Alone => Some(1),
        };
        let ranks = match &role {
            Role::Rank(id) => id.world_size,
            _ => 1,
        };
        // A one-node agent makes a secret of its own for its ranks; every
        // other job needs one given, one node or many: a one-node job's
        // rendezvous is on loopback, which every user of the host reaches.
        let makes_its_own = matches!(&role, Role::Node(plan) if plan.nnodes == 1);
        let required =
            args.cluster.require_secret || self.facts.env(REQUIRE_SECRET_VAR) == Some("1");
        if required && !makes_its_own && !self.token.is_secret() {
            let spans = match nodes {
                Some(n) if n > 1 => format!("spans {n} nodes"),
                Some(_) => {
                    "runs on one node, where every local user reaches its rendezvous".to_string()
                }
                None => format!(
                    "has {ranks} ranks (on one node or several: its launcher gives no local world size)"
                ),
            };
            return Err(Failure::Usage(format!(
                "--require-secret: this job {spans} and its token {}: set PREFLIGHT_TOKEN or PREFLIGHT_TOKEN_FILE to a secret on every node (`preflight token` prints a fresh one)",
                if self.token.is_none() {
                    "is unset".to_string()
                } else {
                    format!(
                        "comes from {}, which any user of the cluster can read",
                        self.token.source
                    )
                }
            )));
        }
        Ok(role)
    }
}

/// The checklist on this node, with progress on a terminal.
fn checklist_stage(
    runtime: &tokio::runtime::Runtime,
    args: &RunSettings,
    plan: &Plan,
    identity: Option<&Identity>,
    led: bool,
) -> Vec<CheckResult> {
    let show_progress = args.format == Format::Human
        && !args.display.quiet
        && args.output.is_none()
        && identity.is_none_or(|id| id.rank == 0)
        && std::io::stderr().is_terminal();
    // With a rendezvous ahead, the checklist may not use the whole deadline:
    // a rank whose slow check ran to the end would never check in, and the
    // cluster would blame the wrong node.
    let checklist_deadline = match identity {
        Some(_) => checklist_share(args.timeout.0),
        None => args.timeout.0,
    };
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(preflight_checklist::kept::default_dir);
    let kept = plan
        .node_checks
        .iter()
        .any(|c| c.cache.is_some())
        .then(|| preflight_checklist::kept::Store::open(&state_dir, &plan.facts, args.fresh));
    let options = engine::Options {
        kept: kept.as_ref(),
        max_concurrent: args
            .max_concurrent
            .map_or(engine::MAX_PARALLEL, usize::from),
        no_slow_now: args.no_slow_now,
        led,
    };
    let results = runtime.block_on(engine::run(
        &plan.node_checks,
        &plan.facts,
        checklist_deadline,
        &options,
        |event| {
            if let (
                true,
                Progress::Finished {
                    done,
                    total,
                    result,
                    running,
                },
            ) = (show_progress, event)
            {
                eprint!("{}", report::progress_line(done, total, result, &running));
            }
        },
    ));
    if show_progress {
        eprint!("\r\x1b[K");
    }
    results
}

/// What a rank takes into the rendezvous.
struct Rendezvous<'a> {
    args: &'a RunSettings,
    plan: &'a Plan,
    identity: Identity,
    /// Its place among its node's ranks, settled before the checklist.
    node: cluster::NodeLink,
    /// When this process started: the run's deadline counts from here.
    started: tokio::time::Instant,
    watch: &'a Watch,
}

/// Check-in, barrier and verdict; the connection to rank 0 comes back when
/// every rank is here and a collective stage is to run. A rank whose
/// leader evaluated its node's checks takes the leader's findings into
/// `results` in place of the lines it left to it.
fn cluster_stage(
    runtime: &tokio::runtime::Runtime,
    r: Rendezvous<'_>,
    server: &mut cluster::Server,
    results: &mut Vec<CheckResult>,
) -> Option<(ClusterReport, Option<cluster::Link>)> {
    let Rendezvous {
        args,
        plan,
        identity,
        node,
        started: process_start,
        watch,
    } = r;
    let own_world = identity.world_size;
    let rank0 = identity.rank == 0;
    let led = node.led();
    let node_findings = if matches!(node, cluster::NodeLink::Leader(_)) {
        preflight_checklist::shared::node_findings(&plan.node_checks, results)
    } else {
        Vec::new()
    };
    let input = RankInput {
        identity,
        facts: Arc::clone(&plan.facts),
        local: results.to_vec(),
        local_verdict: Verdict::of(results, args.strict),
        checklist_hash: plan.checklist_hash.clone(),
        timeout: args.timeout.0,
        started: process_start,
        token: plan.token.clone(),
        collective: plan.coll.mode != coll::Mode::Off,
        waiting: watch.sender.clone(),
        node,
        node_findings,
    };
    let deadline = process_start + args.timeout.0;
    // A signal ends the stage: at once on a rank, which has nothing to tell
    // anyone; rank 0's own part is given a moment to receive the verdict
    // its server sent.
    let staged = runtime.block_on(async {
        tokio::select! {
            staged = cluster::rank_stage(input, server) => Some(staged),
            _ = async {
                preflight_ground::interrupt::wait().await;
                if rank0 {
                    tokio::time::sleep(RANK0_GRACE).await;
                }
            } => None,
            _ = watch.show(deadline) => None,
        }
    });
    watch.done();
    if led {
        let shared = staged.as_ref().and_then(|s| s.node_findings.as_deref());
        *results = preflight_checklist::shared::fill(std::mem::take(results), shared);
    }
    let (report, link) = match staged {
        Some(s) => (s.report, s.link),
        None => return sent_verdict(runtime, server).map(|r| (r, None)),
    };
    // Only when every rank is here and agrees on the world: all ranks see
    // the same barrier in the same verdict, so all of them run the stage or
    // none. A rank also holds the verdict's world to its own WORLD_SIZE
    // before sizing anything by it: rank 0's word is not enough.
    let link = link.filter(|_| {
        report.barrier.complete
            && report.barrier.world_size_mismatch.is_empty()
            && report.world_size == own_world
            && plan.coll.mode != coll::Mode::Off
    });
    Some((report, link))
}

/// Real collectives on every backend, then the checks over their report;
/// their results can only add to the cluster's verdict.
fn collective_stage(
    runtime: &tokio::runtime::Runtime,
    args: &RunSettings,
    plan: &Plan,
    report: &mut ClusterReport,
    mut link: cluster::Link,
    place: Place,
) {
    let facts = &plan.facts;
    let rank = place.rank;
    let hosts = match runtime.block_on(link.hosts(report)) {
        Ok(h) => h,
        Err(e) => {
            report
                .warnings
                .push(format!("{e}: ranks are named without their hosts"));
            vec![String::new(); report.world_size as usize]
        }
    };
    // Rows as they are measured, on rank 0's terminal: a full sweep takes
    // a while, and nccl-tests users watch it grow.
    let watching = args.format == Format::Human
        && !args.display.quiet
        && args.output.is_none()
        && rank == 0
        && std::io::stderr().is_terminal();
    let live = watching.then_some(|backend: &str, row: &preflight_result::collective::Row| {
        eprint!("{}", report::collective::live_row(backend, row));
    });
    let info = RankInfo {
        rank,
        world: report.world_size,
        local_rank: place.local_rank,
        local_world: place.local_world,
        libraries: args.collective.libraries.clone(),
        host: format!("{} {}", facts.hostname(), link.local_ip),
        route_ip: link.local_ip.clone(),
        gloo_ifname: facts.env("GLOO_SOCKET_IFNAME").map(str::to_string),
        same_host: facts
            .env(preflight_collective::tcp::SAME_HOST_VAR)
            .map(str::to_string),
        interfaces: facts.interfaces().to_vec(),
        root: args.checklist.root.clone(),
        hooks: Hooks::from_env(|k| facts.env(k).map(str::to_string), rank),
        hosts: hosts.clone(),
        conn: &mut link.stream,
        token: plan.token.clone(),
        on_row: live
            .as_ref()
            .map(|f| f as preflight_collective::rank::OnRow<'_>),
    };
    // The stage ends by the run's deadline, rank 0's, as every rank reads
    // it from the verdict.
    let cfg = coll::Config {
        until: Some(link.until),
        ..plan.coll.clone()
    };
    let c = runtime.block_on(async {
        tokio::select! {
            c = stage::run(&cfg, info) => Some(c),
            _ = preflight_ground::interrupt::wait() => None,
        }
    });
    if watching {
        eprint!("\r\x1b[K");
    }
    let Some(c) = c else {
        if rank == 0 {
            // The server's connections tell the ranks meanwhile.
            runtime.block_on(async { tokio::time::sleep(TELL_PEERS).await });
        }
        return;
    };
    // Rank 0 was interrupted, and told this rank so.
    if let Some(notice) = &c.interrupted {
        report.interrupted = Some(notice.clone());
    }
    report.checks.extend(preflight_collective::checks::checks(
        &c,
        &plan.coll.required,
    ));
    if let Some(profile) = facts.profile() {
        report.checks.extend(preflight_collective::floors::judge(
            &c, profile, &hosts, rank,
        ));
    }
    report.checks.extend(checklist::evaluate_collective(
        &plan.collective_checks,
        &c,
        facts,
    ));
    report.verdict = report
        .verdict
        .worst(Verdict::of(&report.checks, args.strict));
    report.exit_code = report.verdict.exit_code().code();
    report.collective = Some(c);
}

/// The part of `--timeout` the checklist may use in `run`: all but a
/// reserve for the rendezvous, the barrier and the verdict (10 %, at least
/// 2 s, and never less than half of the whole).
fn checklist_share(timeout: std::time::Duration) -> std::time::Duration {
    let reserve = (timeout / 10).max(std::time::Duration::from_secs(2));
    timeout.saturating_sub(reserve).max(timeout / 2)
}

#[cfg(test)]
mod tests {
    use super::checklist_share;
    use std::time::Duration;

    #[test]
    fn the_checklist_leaves_time_for_the_rendezvous() {
        assert_eq!(
            checklist_share(Duration::from_secs(60)),
            Duration::from_secs(54)
        );
        assert_eq!(
            checklist_share(Duration::from_secs(10)),
            Duration::from_secs(8)
        );
        assert_eq!(
            checklist_share(Duration::from_secs(3)),
            Duration::from_millis(1500)
        );
    }
}
