//! The check results the collective stage adds to the report: one per
//! backend (`collective.tcp`, `collective.nccl`, `collective.oneccl`) and
//! `collective.stragglers` and `collective.slow_links` (the pairwise
//! round and its second pass), with hints.

use super::Op;
use super::registry::library;
use preflight_result::collective::CollectiveReport;
use preflight_result::{CheckResult, Status};

/// The checks this stage adds to the report.
pub fn checks(r: &CollectiveReport, required: &[String]) -> Vec<CheckResult> {
    let mut out = Vec::new();
    for b in &r.backends {
        let id = format!("collective.{}", b.name);
        let library = b
            .library
            .as_deref()
            .map(|l| format!(" ({l})"))
            .unwrap_or_default();
        let (status, message, hint) = match b.verdict.as_str() {
            "skip" if required.contains(&b.name) => (
                Status::Fail,
                format!(
                    "{}: required, but not available: {}{library}",
                    b.name, b.reason
                ),
                Some(missing_hint(&b.name)),
            ),
            "skip" => (
                Status::Skip,
                format!("{}: {}{library}", b.name, b.reason),
                None,
            ),
            "pass" => {
                let best = b
                    .sweep
                    .iter()
                    .filter(|x| x.op == Op::Allreduce)
                    .max_by_key(|x| x.bytes);
                // One rank moves nothing between ranks: no figure to give.
                let figure = best
                    .filter(|_| r.world_size > 1)
                    .map(|x| {
                        format!(
                            "; allreduce {} busbw {:.3} GB/s",
                            preflight_ground::values::format_bytes(x.bytes as u64),
                            x.busbw
                        )
                    })
                    .unwrap_or_default();
                let warnings: Vec<&str> = b
                    .notes
                    .iter()
                    .filter_map(|n| n.strip_prefix("warning: "))
                    .collect();
                let text = format!(
                    "{}: 5 operations verified on {}{figure}",
                    b.name,
                    preflight_ground::values::count(r.world_size as usize, "rank")
                );
                if warnings.is_empty() {
                    (Status::Pass, text, None)
                } else {
                    (
                        Status::Warn,
                        format!("{text}; {}", warnings.join("; ")),
                        Some("The backend works, but not as the node is built to: read the warning, then NCCL_DEBUG=INFO output on the rank named.".into()),
                    )
                }
            }
            "incomplete" => (
                Status::Error,
                format!(
                    "{}: {}",
                    b.name,
                    b.ended.clone().unwrap_or_else(|| "did not finish".into())
                ),
                Some("The stage ran out of time, which says nothing against the nodes by itself: give the run a longer --timeout, or a shorter stage (--collective short, a smaller --max-size, fewer --iters). If ranks were waiting for one rank, look at that node.".into()),
            ),
            _ => (
                Status::Fail,
                format!(
                    "{}: {}",
                    b.name,
                    b.ended.clone().unwrap_or_else(|| "failed".into())
                ),
                Some(failed_hint(&b.name)),
            ),
        };
        let about = preflight_result::About {
            variables: b.about_variables.clone(),
            ..Default::default()
        };
        out.push(synthetic(&id, status, message, hint).about(about));
    }
    if !r.stragglers.is_empty() {
        out.push(synthetic(
            STRAGGLERS,
            Status::Warn,
            r.stragglers.join("; "),
            Some(STRAGGLERS_HINT.into()),
        ));
    }
    if let Some(sp) = r.second_pass.as_ref().filter(|s| !s.slow_links.is_empty()) {
        out.push(synthetic(
            SLOW_LINKS,
            Status::Warn,
            sp.slow_links.join("; "),
            Some(SLOW_LINKS_HINT.into()),
        ));
    }
    out
}

const SLOW_LINKS: &str = "collective.slow_links";
const SLOW_LINKS_HINT: &str = "Drain neither node: the path between them is slow. Compare the route and interfaces each takes to the other (`ip route get`), the switch ports and cables between them, and any qdisc or firewall rule toward one of them (`tc qdisc show`, `tc filter show`).";
const STRAGGLERS: &str = "collective.stragglers";
const STRAGGLERS_HINT: &str =
    "Compare the named node's link speed, MTU and qdisc (`tc qdisc show`) with the others'.";

fn failed_hint(backend: &str) -> String {
    if backend == "tcp" {
        "Run `preflight bench` on the nodes named; check the NIC, MTU, GLOO_SOCKET_IFNAME and firewall between them.".into()
    } else {
        format!(
            "Run `preflight bench --backends {backend}` on the nodes named and read the library's log in the collective section (JSON: collective.backends[].log); check the network settings it names."
        )
    }
}

/// The results this stage prints that no checklist defines: one per
/// backend it knows, the stragglers and the slow links.
pub fn built_in_results() -> Vec<preflight_result::built_in::BuiltIn> {
    use preflight_result::Severity;
    use preflight_result::built_in::BuiltIn;
    let mut out: Vec<BuiltIn> = std::iter::once("tcp")
        .chain(super::registry::LIBRARIES.iter().map(|l| l.name))
        .map(|name| BuiltIn {
            id: format!("collective.{name}"),
            kind: "collective",
            area: "collective",
            severity: Severity::Fail,
            verifies: format!(
                "The {name} backend, across every rank of the job: init, then allreduce, broadcast, allgather, send/recv and barrier, each result verified, and the size sweep's times and bus bandwidth. Skipped where the node lacks it, unless --backends requires it."
            ),
            why: "A backend that fails or hangs at one size (the allreduce that passes up to 32 KB then hangs) fails the job's first collective, after its init has passed.",
            hint: failed_hint(name),
            commands: "run, bench",
        })
        .collect();
    out.push(BuiltIn {
        id: STRAGGLERS.into(),
        kind: "collective",
        area: "collective",
        severity: Severity::Warn,
        verifies: "The pairwise round of the collective stage: a rank that is slow in every pair it is in, against the median of the pairs without it; across nodes, confirmed by a second pass that measures the node again with nodes that ran at full rate (slow with every good partner).".into(),
        why: "One slow node sets the pace of every collective of the job.",
        hint: STRAGGLERS_HINT.into(),
        commands: "run, bench",
    });
    out.push(BuiltIn {
        id: SLOW_LINKS.into(),
        kind: "collective",
        area: "collective",
        severity: Severity::Warn,
        verifies: "The pairwise round's second pass: a node pair slow in the first pass and again when measured a second time, while each of its nodes reaches full rate with other nodes: the link between them, not either node.".into(),
        why: "A slow path between two nodes slows every collective that crosses it, and draining either node would not fix it.",
        hint: SLOW_LINKS_HINT.into(),
        commands: "run, bench",
    });
    out.push(BuiltIn {
        id: super::floors::FLOORS.into(),
        kind: "collective",
        area: "collective",
        severity: Severity::Fail,
        verifies: "The collective stage's figures against the measured floors of the node's profile (`floors`: bus bandwidth per backend, operation and size; every pair between two nodes), where the profile sets any. A floor the run did not measure cannot be judged.".into(),
        why: "A node of a known kind below what healthy nodes of its kind reach is slow before any job runs on it.",
        hint: super::floors::FLOORS_HINT.into(),
        commands: "run, bench",
    });
    out
}

/// What to do when a required backend is missing on a node.
fn missing_hint(backend: &str) -> String {
    match library(backend) {
        Some(l) => l.install_hint.into(),
        None => format!("Check that the {backend} backend can run on the node named."),
    }
}

fn synthetic(id: &str, status: Status, message: String, hint: Option<String>) -> CheckResult {
    CheckResult::built_in(id, "collective", "collective", status, message, hint)
}
