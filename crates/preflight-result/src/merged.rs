//! Many reports made one: node reports (gathered by an Ansible play or a
//! Slurm `report_dir`) and run reports (rank 0's, or other ranks') merged
//! into the cluster report that `preflight report` renders
//! (`preflight.merged-report/v1`). Pure data: reading the files is the
//! command's, drawing them the renderers'.
//!
//! The rules: one cluster view, the newest run report's (rank 0's full one
//! when given, else a rank's cut-down copy, said so in a warning); one
//! report per node, the newest (reports of one run from several ranks of a
//! node agree, and their worst status per check is kept); the verdict is
//! the worst of the cluster view's and every node's.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::cause::is_job_setting;
use super::cluster::{ClusterReport, Culprit};
use super::collective::CollectiveReport;
use super::report::{Report, TOOL, Tool};
use super::{About, CheckResult, Status, Verdict};

pub const SCHEMA: &str = "preflight.merged-report/v1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MergedReport {
    pub schema: Cow<'static, str>,
    pub tool: Tool,
    /// RFC 3339, UTC: the newest and the oldest report's start, so that
    /// a reader knows how fresh the picture is (the merge itself adds no
    /// time of its own: the same inputs give the same document).
    pub newest_report_at: String,
    pub oldest_report_at: String,
    pub verdict: Verdict,
    pub exit_code: i32,
    pub counts: NodeCounts,
    /// The nodes to act on, each with why: the cluster view's culprits and
    /// every node whose own report failed a check of the node's state (a
    /// job setting, such as a variable, is never a node's fault).
    pub culprits: Vec<Culprit>,
    pub nodes: Vec<MergedNode>,
    /// The node × check matrix's columns: checks that failed, warned or
    /// erred somewhere first, then the rest; a check skipped on every node
    /// is left out (`skipped_everywhere` counts them).
    pub check_ids: Vec<String>,
    pub skipped_everywhere: usize,
    /// Every problem once, with the nodes that have it.
    pub problems: Vec<Problem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<CollectiveReport>,
    /// Each bandwidth threshold checked, with its result.
    #[serde(default)]
    pub thresholds: Vec<ThresholdResult>,
    pub sources: Vec<Source>,
    /// Files left out and why, reports superseded, a cut-down cluster view.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct NodeCounts {
    pub nodes: usize,
    pub ready: usize,
    pub not_ready: usize,
    pub incomplete: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MergedNode {
    pub name: String,
    pub hostname: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    pub ranks: Vec<u32>,
    pub verdict: Verdict,
    /// Whether `checks` holds every check the node ran (its own report was
    /// given) or only its failures (known from rank 0's summary alone).
    pub complete: bool,
    /// Where this row comes from, in words.
    pub from: String,
    pub checks: BTreeMap<String, Cell>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    pub status: Status,
    /// `environment` and `launch` are the job's settings, not the node's.
    #[serde(default)]
    pub area: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<String>,
    #[serde(default, skip_serializing_if = "About::is_empty")]
    pub about: About,
}

impl From<&CheckResult> for Cell {
    fn from(c: &CheckResult) -> Cell {
        Cell {
            status: c.status,
            area: c.area.clone(),
            message: c.message.clone(),
            hint: c.hint.clone(),
            caused_by: c.caused_by.clone(),
            about: c.about.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Problem {
    pub id: String,
    /// The worst status among the nodes that have it.
    pub status: Status,
    pub area: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<String>,
    /// What it is about on every node that has it.
    #[serde(default, skip_serializing_if = "About::is_empty")]
    pub about: About,
    /// Node name (`cluster` for a check across nodes) and its message.
    pub nodes: Vec<(String, String)>,
}

impl super::cause::Attributable for Problem {
    fn id(&self) -> &str {
        &self.id
    }
    fn area(&self) -> &str {
        &self.area
    }
    fn status(&self) -> Status {
        self.status
    }
    fn about(&self) -> &About {
        &self.about
    }
    fn caused_by_mut(&mut self) -> &mut Option<String> {
        &mut self.caused_by
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThresholdResult {
    pub check: String,
    pub status: Status,
    pub threshold: super::collective::Threshold,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Source {
    pub file: String,
    pub command: String,
    pub hostname: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub started_at: String,
    pub verdict: Verdict,
    /// What the merge took from it: the cluster view, a node's row, or
    /// nothing (superseded by a newer report of the same node).
    pub used_for: String,
}

/// The name of a check across nodes in `Problem::nodes`.
pub const CLUSTER: &str = "cluster";

/// Two reports of one run: started the same second, or ranks of one job's
/// rendezvous (its address, token fingerprint and world) started within
/// the rendezvous's own time of each other (a rank's start second can
/// fall either side of a second boundary, or come late, up to rank 0's
/// wait).
fn same_run(a: &Report, b: &Report) -> bool {
    if a.started_at == b.started_at {
        return true;
    }
    let (Some(x), Some(y)) = (&a.cluster, &b.cluster) else {
        return false;
    };
    let (Ok(p), Ok(q)) = (
        humantime::parse_rfc3339(&a.started_at),
        humantime::parse_rfc3339(&b.started_at),
    ) else {
        return false;
    };
    let apart = p.duration_since(q).or_else(|_| q.duration_since(p));
    // Whole seconds on both sides, and the slower rank's wait.
    let skew = std::time::Duration::from_millis(x.duration_ms.max(y.duration_ms) + 2000);
    apart.is_ok_and(|d| d <= skew)
        && x.master == y.master
        && x.token == y.token
        && x.world_size == y.world_size
}

/// Merges `reports` (file name, report), in any order.
pub fn merge(reports: Vec<(String, Report)>, mut warnings: Vec<String>) -> MergedReport {
    let mut reports = reports;
    // Newest first: RFC 3339 UTC timestamps of one format sort as text;
    // among one run's reports, the lowest rank first.
    reports.sort_by(|(fa, a), (fb, b)| {
        b.started_at
            .cmp(&a.started_at)
            .then(a.node.rank.cmp(&b.node.rank))
            .then(fa.cmp(fb))
    });
    let view_at = reports
        .iter()
        .position(|(_, r)| r.cluster.as_ref().is_some_and(is_full_view))
        .or_else(|| reports.iter().position(|(_, r)| r.cluster.is_some()));
    let newest_report_at = reports
        .first()
        .map(|(_, r)| r.started_at.clone())
        .unwrap_or_default();
    let oldest_report_at = reports
        .iter()
        .map(|(_, r)| r.started_at.clone())
        .min()
        .unwrap_or_default();
    let mut sources: Vec<Source> = reports
        .iter()
        .map(|(file, r)| Source {
            file: file.clone(),
            command: r.command.to_string(),
            hostname: r.node.hostname.clone(),
            rank: r.node.rank,
            started_at: r.started_at.clone(),
            verdict: r.verdict,
            used_for: String::new(),
        })
        .collect();
    let mut cluster = None;
    let mut collective = None;
    let mut nodes: Vec<MergedNode> = Vec::new();
    let mut view_started = None;
    if let Some(i) = view_at {
        let (file, r) = &reports[i];
        let c = r.cluster.clone().expect("a run report");
        if !is_full_view(&c) {
            warnings.push(format!(
                "rank 0's report is not among the inputs: the cluster view is rank {}'s copy ({file}), which lists its own node only",
                r.node.rank.unwrap_or(0)
            ));
        }
        for v in &c.nodes {
            nodes.push(MergedNode {
                name: v.name.clone(),
                hostname: v.hostname.clone(),
                addr: Some(v.addr.clone()),
                ranks: v.ranks.clone(),
                verdict: Verdict::from_name(&v.local_verdict),
                complete: false,
                from: "rank 0's summary (failures only)".into(),
                checks: v
                    .failed
                    .iter()
                    .map(|f| {
                        let cell = Cell {
                            status: f.status,
                            area: f.area.clone(),
                            message: f.message.clone(),
                            hint: f.hint.clone(),
                            caused_by: None,
                            about: f.about.clone(),
                        };
                        (f.id.clone(), cell)
                    })
                    .collect(),
            });
        }
        sources[i].used_for = "cluster view".into();
        view_started = Some(r.started_at.clone());
        collective = r.collective.clone();
        cluster = Some(c);
    }
    // One report per node: the newest, and the same run's other ranks on
    // that node folded in.
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (file, r)) in reports.iter().enumerate() {
        let own = own_checks(r);
        let hostname = &r.node.hostname;
        if let Some(&first) = taken.get(hostname) {
            let kept = &reports[first].1;
            if !same_run(kept, r) {
                let at = &kept.started_at;
                sources[i].used_for = format!("nothing: superseded by {hostname}'s report of {at}");
                warnings.push(format!(
                    "{file}: an older report of {hostname} ({}), superseded by the one of {at}",
                    r.started_at
                ));
                continue;
            }
        } else {
            taken.insert(hostname.clone(), i);
        }
        // A run report of another run than the cluster view's still gives
        // its node's own checks.
        let at = match nodes
            .iter()
            .position(|n| &n.hostname == hostname || &n.name == hostname)
        {
            Some(at) => at,
            None => {
                nodes.push(MergedNode {
                    name: hostname.clone(),
                    hostname: hostname.clone(),
                    addr: None,
                    ranks: Vec::new(),
                    verdict: Verdict::Ready,
                    complete: true,
                    from: String::new(),
                    checks: BTreeMap::new(),
                });
                nodes.len() - 1
            }
        };
        let node = &mut nodes[at];
        if !node.complete {
            // Rank 0's summary gave the failures only: the node's own
            // report replaces them.
            node.checks.clear();
            node.complete = true;
        }
        if let Some(rank) = r.node.rank
            && !node.ranks.contains(&rank)
        {
            node.ranks.push(rank);
            node.ranks.sort_unstable();
        }
        for c in own {
            let cell = Cell::from(c);
            match node.checks.get(&c.id) {
                Some(old) if severity(old.status) >= severity(c.status) => {}
                _ => {
                    node.checks.insert(c.id.clone(), cell);
                }
            }
        }
        let cells: Vec<&Cell> = node.checks.values().collect();
        node.verdict = node.verdict.worst(node_verdict(&cells, r.strict));
        let what = format!("{} {file} ({})", r.command, r.started_at);
        if node.from.is_empty() || node.from.starts_with("rank 0") {
            node.from = what;
        }
        let used = if sources[i].used_for.is_empty() {
            format!("node {hostname}")
        } else {
            format!("{} and node {hostname}", sources[i].used_for)
        };
        sources[i].used_for = used;
        if let (Some(view), Some(vi)) = (&view_started, view_at)
            && r.cluster.is_some()
            && &r.started_at < view
            && !same_run(&reports[vi].1, r)
        {
            warnings.push(format!(
                "{file}: a run of {} whose cluster view is older than the one shown; its node checks are used",
                r.started_at
            ));
        }
    }
    let cluster_checks: Vec<CheckResult> = cluster
        .as_ref()
        .map(|c| c.checks.clone())
        .unwrap_or_default();
    let problems = problems(&nodes, &cluster_checks);
    let (check_ids, skipped_everywhere) = columns(&nodes);
    let culprits = culprits(&nodes, cluster.as_ref());
    let mut verdict = cluster.as_ref().map_or(Verdict::Ready, |c| c.verdict);
    for n in &nodes {
        verdict = verdict.worst(n.verdict);
    }
    if nodes.is_empty() {
        verdict = Verdict::Incomplete;
    }
    let counts = NodeCounts {
        nodes: nodes.len(),
        ready: nodes.iter().filter(|n| n.verdict == Verdict::Ready).count(),
        not_ready: nodes
            .iter()
            .filter(|n| n.verdict == Verdict::NotReady)
            .count(),
        incomplete: nodes
            .iter()
            .filter(|n| n.verdict == Verdict::Incomplete)
            .count(),
    };
    let thresholds = reports
        .get(view_at.unwrap_or(usize::MAX))
        .map(|(_, r)| {
            r.checks
                .iter()
                .filter_map(|c| {
                    Some(ThresholdResult {
                        check: c.id.clone(),
                        status: c.status,
                        threshold: c.threshold.clone()?,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    MergedReport {
        schema: Cow::Borrowed(SCHEMA),
        tool: TOOL,
        newest_report_at,
        oldest_report_at,
        verdict,
        exit_code: verdict.exit_code().code(),
        counts,
        culprits,
        nodes,
        check_ids,
        skipped_everywhere,
        problems,
        cluster,
        collective,
        thresholds,
        sources,
        warnings,
    }
}

/// Rank 0's own copy: every node, not a rank's cut-down verdict.
fn is_full_view(c: &ClusterReport) -> bool {
    c.full_report.is_none() && c.nodes.len() >= c.node_count
}

/// A report's checks of its own node: the cluster stage's (the same on
/// every rank) are the cluster view's.
fn own_checks(r: &Report) -> Vec<&CheckResult> {
    let cluster: BTreeSet<&str> = r
        .cluster
        .iter()
        .flat_map(|c| c.checks.iter().map(|x| x.id.as_str()))
        .collect();
    r.checks
        .iter()
        .filter(|c| !cluster.contains(c.id.as_str()))
        .collect()
}

/// Order of badness, for the worst of several statuses.
fn severity(s: Status) -> u8 {
    match s {
        Status::Skip => 0,
        Status::Pass => 1,
        Status::Warn => 2,
        Status::Error => 3,
        Status::Fail => 4,
    }
}

fn node_verdict(cells: &[&Cell], strict: bool) -> Verdict {
    if cells
        .iter()
        .any(|c| c.status == Status::Fail || (strict && c.status == Status::Warn))
    {
        Verdict::NotReady
    } else if cells.iter().any(|c| c.status == Status::Error) {
        Verdict::Incomplete
    } else {
        Verdict::Ready
    }
}

fn is_problem(s: Status) -> bool {
    matches!(s, Status::Fail | Status::Warn | Status::Error)
}

fn problems(nodes: &[MergedNode], cluster_checks: &[CheckResult]) -> Vec<Problem> {
    let mut by_id: BTreeMap<String, Problem> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut add = |id: &str, node: &str, status: Status, cell: &Cell| {
        let p = by_id.entry(id.to_string()).or_insert_with(|| {
            order.push(id.to_string());
            Problem {
                id: id.to_string(),
                status,
                area: cell.area.clone(),
                hint: cell.hint.clone(),
                caused_by: cell.caused_by.clone(),
                about: About::default(),
                nodes: Vec::new(),
            }
        });
        p.about.merge(&cell.about);
        if severity(status) > severity(p.status) {
            p.status = status;
        }
        if p.hint.is_none() {
            p.hint = cell.hint.clone();
        }
        p.nodes.push((node.to_string(), cell.message.clone()));
    };
    for c in cluster_checks.iter().filter(|c| is_problem(c.status)) {
        add(&c.id, CLUSTER, c.status, &Cell::from(c));
    }
    for n in nodes {
        for (id, cell) in n.checks.iter().filter(|(_, c)| is_problem(c.status)) {
            add(id, &n.name, cell.status, cell);
        }
    }
    let mut out: Vec<Problem> = order
        .into_iter()
        .filter_map(|id| by_id.remove(&id))
        .collect();
    // A check across nodes that restates nodes' own failures follows from
    // them (each node's report already linked what only it can).
    super::cause::attribute(&mut out, super::cause::Scope::AcrossNodes);
    // Root causes before their consequences, the worst first.
    out.sort_by_key(|p| (p.caused_by.is_some(), std::cmp::Reverse(severity(p.status))));
    out
}

fn columns(nodes: &[MergedNode]) -> (Vec<String>, usize) {
    let mut worst: BTreeMap<&str, Status> = BTreeMap::new();
    for n in nodes {
        for (id, c) in &n.checks {
            let w = worst.entry(id).or_insert(c.status);
            if severity(c.status) > severity(*w) {
                *w = c.status;
            }
        }
    }
    let skipped = worst.values().filter(|s| **s == Status::Skip).count();
    let mut ids: Vec<(&str, Status)> = worst
        .into_iter()
        .filter(|(_, s)| *s != Status::Skip)
        .collect();
    ids.sort_by_key(|(id, s)| (std::cmp::Reverse(severity(*s).max(1)), *id));
    (
        ids.into_iter().map(|(id, _)| id.to_string()).collect(),
        skipped,
    )
}

fn culprits(nodes: &[MergedNode], cluster: Option<&ClusterReport>) -> Vec<Culprit> {
    let mut out: Vec<Culprit> = cluster.map(|c| c.culprits.clone()).unwrap_or_default();
    for n in nodes {
        if out.iter().any(|c| c.node == n.name) {
            continue;
        }
        let reasons: Vec<String> = n
            .checks
            .iter()
            .filter(|(_, c)| c.status == Status::Fail && c.caused_by.is_none())
            .filter(|(_, c)| !is_job_setting(&c.area))
            .map(|(id, c)| format!("{id}: {}", c.message))
            .collect();
        if !reasons.is_empty() {
            out.push(Culprit {
                node: n.name.clone(),
                ranks: n.ranks.clone(),
                reasons,
            });
        }
    }
    out
}
