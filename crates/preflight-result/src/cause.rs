//! One cause, shown once: a failure that only restates or follows from
//! another is marked as its consequence (`caused_by`), so that the report
//! shows the root cause with its remedy and the rest as "caused by".
//!
//! Every rule reads what the findings say they are about (`About`), never
//! their wording, so a message can be reworded without regrouping:
//! - a port's holder: the first failure to name a process holding a port
//!   is the cause; a later one naming the same process (rank 0 could not
//!   listen there) follows from it;
//! - a restatement: `cluster.node_checks` restates nodes' own failed
//!   checks; where every check it restates failed here too, it follows
//!   from the first of them;
//! - a job's variable: a failure about a variable that a failed check of
//!   the job's own settings (areas `environment`, `launch`) is about
//!   follows from that check;
//! - a loopback host name: a check across nodes (area `cluster`) whose
//!   findings are only host names resolving to loopback follows from the
//!   node's own check that found those names.

use super::{About, CheckResult, Status};

/// Areas whose checks are about the job's settings, not the node.
pub const JOB_AREAS: &[&str] = &["environment", "launch"];

/// The area of the checks across nodes.
const CLUSTER_AREA: &str = "cluster";

pub fn is_job_setting(area: &str) -> bool {
    JOB_AREAS.contains(&area)
}

fn failing(status: Status) -> bool {
    matches!(status, Status::Fail | Status::Error)
}

/// What the rules need of a finding: a node's check result, or a merged
/// report's problem.
pub trait Attributable {
    fn id(&self) -> &str;
    fn area(&self) -> &str;
    fn status(&self) -> Status;
    fn about(&self) -> &About;
    fn caused_by_mut(&mut self) -> &mut Option<String>;
}

impl Attributable for CheckResult {
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

/// Where the findings come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// One node's report: every rule applies.
    Node,
    /// A merged report's problems, each gathered from several nodes. A
    /// pid or a variable's value means something on one node only, so
    /// those rules were applied in each node's report; only the rules on
    /// what is the same across nodes (a check's id, a host's name) apply.
    AcrossNodes,
}

/// Marks each failure that follows from another failure in `items`.
pub fn attribute<T: Attributable>(items: &mut [T], scope: Scope) {
    let failed: Vec<&T> = items.iter().filter(|c| failing(c.status())).collect();
    // The first failure to name a holder is its cause.
    let mut held: Vec<(u32, String)> = Vec::new();
    for c in &failed {
        for pid in &c.about().holders {
            if !held.iter().any(|(p, _)| p == pid) {
                held.push((*pid, c.id().to_string()));
            }
        }
    }
    let restatable: Vec<String> = failed
        .iter()
        .filter(|c| c.about().restates.is_empty())
        .map(|c| c.id().to_string())
        .collect();
    let settings: Vec<(String, Vec<String>)> = failed
        .iter()
        .filter(|c| is_job_setting(c.area()))
        .map(|c| (c.id().to_string(), c.about().variables.clone()))
        .collect();
    let measured_names: Vec<(String, Vec<String>)> = failed
        .iter()
        .filter(|c| c.area() != CLUSTER_AREA && !c.about().loopback_hostnames.is_empty())
        .map(|c| (c.id().to_string(), c.about().loopback_hostnames.clone()))
        .collect();
    drop(failed);
    let per_node = scope == Scope::Node;
    for c in items.iter_mut() {
        if !failing(c.status()) || c.caused_by_mut().is_some() || is_job_setting(c.area()) {
            continue;
        }
        let id = c.id().to_string();
        let about = c.about();
        let by_holder = || {
            held.iter()
                .find(|(pid, root)| *root != id && about.holders.contains(pid))
                .map(|(_, root)| root.clone())
        };
        let by_restatement = || {
            let all_failed = about
                .restates
                .iter()
                .all(|r| restatable.iter().any(|f| f == r));
            (all_failed && !about.restates.is_empty()).then(|| about.restates[0].clone())
        };
        let by_variable = || {
            settings
                .iter()
                .find(|(_, vars)| vars.iter().any(|v| about.variables.contains(v)))
                .map(|(root, _)| root.clone())
        };
        let by_loopback_name = || {
            let only_names = c.area() == CLUSTER_AREA
                && !about.loopback_hostnames.is_empty()
                && about.variables.is_empty()
                && about.holders.is_empty();
            measured_names
                .iter()
                .filter(|_| only_names)
                .find(|(root, names)| {
                    *root != id && about.loopback_hostnames.iter().all(|n| names.contains(n))
                })
                .map(|(root, _)| root.clone())
        };
        let cause = by_restatement()
            .or_else(by_loopback_name)
            .or_else(|| per_node.then(by_holder).flatten())
            .or_else(|| per_node.then(by_variable).flatten());
        *c.caused_by_mut() = cause;
    }
}

/// The failures that are no other failure's consequence, in order.
pub fn roots(checks: &[CheckResult]) -> Vec<&CheckResult> {
    checks
        .iter()
        .filter(|c| failing(c.status) && c.caused_by.is_none())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, area: &str, status: Status, message: &str, about: About) -> CheckResult {
        CheckResult::built_in(id, "k", area, status, message.into(), None).about(about)
    }

    fn variables(names: &[&str]) -> About {
        About {
            variables: names.iter().map(|s| s.to_string()).collect(),
            ..About::default()
        }
    }

    fn holders(pids: &[u32]) -> About {
        About {
            holders: pids.to_vec(),
            ..About::default()
        }
    }

    fn restates(ids: &[&str]) -> About {
        About {
            restates: ids.iter().map(|s| s.to_string()).collect(),
            ..About::default()
        }
    }

    fn loopback(names: &[&str]) -> About {
        About {
            loopback_hostnames: names.iter().map(|s| s.to_string()).collect(),
            ..About::default()
        }
    }

    /// The fixtures of every rule, each with what it should be caused by.
    fn fixtures() -> Vec<(Vec<CheckResult>, Vec<Option<&'static str>>)> {
        vec![
            (
                vec![
                    result(
                        "net.master_port_free",
                        "network",
                        Status::Fail,
                        "1 of 1 port(s) on 0.0.0.0 taken: 29577 (held by pid 9065 `python3`)",
                        holders(&[9065]),
                    ),
                    result(
                        "cluster.rendezvous",
                        "cluster",
                        Status::Fail,
                        "port 29577 on 127.0.0.1 is in use by another program: held by pid 9065 `python3`",
                        holders(&[9065]),
                    ),
                    result(
                        "other.port",
                        "network",
                        Status::Fail,
                        "taken (held by pid 77 `x`)",
                        holders(&[77]),
                    ),
                ],
                vec![None, Some("net.master_port_free"), None],
            ),
            (
                vec![
                    result(
                        "env.lint",
                        "environment",
                        Status::Fail,
                        "GLOO_SOCKET_IFNAME=`eth9`: no interface named `eth9` on this node",
                        variables(&["GLOO_SOCKET_IFNAME"]),
                    ),
                    result(
                        "cluster.node_checks",
                        "cluster",
                        Status::Fail,
                        "vm: env.lint (fail: GLOO_SOCKET_IFNAME=`eth9`: no interface named `eth9`)",
                        restates(&["env.lint"]),
                    ),
                    result(
                        "collective.tcp",
                        "collective",
                        Status::Fail,
                        "tcp: init failed on rank 0 (vm 127.0.0.1): GLOO_SOCKET_IFNAME=eth9: no interface of that name",
                        variables(&["GLOO_SOCKET_IFNAME"]),
                    ),
                    // Its message names the variable, as a suggestion: it
                    // is not about it.
                    result(
                        "gpu.xid",
                        "accelerators",
                        Status::Fail,
                        "Xid 79 on GPU 3 (GLOO_SOCKET_IFNAME=eth9 is unrelated)",
                        About::default(),
                    ),
                ],
                vec![None, Some("env.lint"), Some("env.lint"), None],
            ),
            (
                vec![
                    result(
                        "env.lint",
                        "environment",
                        Status::Fail,
                        "NCCL_DEBUG=`x`: bad",
                        variables(&["NCCL_DEBUG"]),
                    ),
                    result(
                        "cluster.node_checks",
                        "cluster",
                        Status::Fail,
                        "h1: env.lint (fail: NCCL_DEBUG=`x`); h2: nvidia.xid (fail: Xid 79)",
                        restates(&["env.lint", "nvidia.xid"]),
                    ),
                    result(
                        "cluster.reachability",
                        "cluster",
                        Status::Fail,
                        "h2 drops incoming connections",
                        About::default(),
                    ),
                ],
                vec![None, None, None],
            ),
            (
                vec![
                    result(
                        "net.hostname",
                        "network",
                        Status::Fail,
                        "hostname `h1` resolves to 127.0.1.1 (loopback)",
                        loopback(&["h1"]),
                    ),
                    result(
                        "cluster.addresses",
                        "cluster",
                        Status::Fail,
                        "h1: hostname `h1` resolves to 127.0.1.1 (loopback) and GLOO_SOCKET_IFNAME is unset",
                        loopback(&["h1"]),
                    ),
                ],
                vec![None, Some("net.hostname")],
            ),
            (
                // Another node's name too, or a variable besides: more
                // than this node's own check found.
                vec![
                    result(
                        "net.hostname",
                        "network",
                        Status::Fail,
                        "hostname `h1` resolves to 127.0.1.1 (loopback)",
                        loopback(&["h1"]),
                    ),
                    result(
                        "cluster.addresses",
                        "cluster",
                        Status::Fail,
                        "h1: loopback; h2: loopback",
                        loopback(&["h1", "h2"]),
                    ),
                    result(
                        "cluster.addresses:again",
                        "cluster",
                        Status::Fail,
                        "h1: loopback; h2: NCCL_SOCKET_IFNAME=ib0 would not pick eth0",
                        About {
                            variables: vec!["NCCL_SOCKET_IFNAME".into()],
                            ..loopback(&["h1"])
                        },
                    ),
                ],
                vec![None, None, None],
            ),
        ]
    }

    fn causes(mut checks: Vec<CheckResult>) -> Vec<Option<String>> {
        attribute(&mut checks, Scope::Node);
        checks.into_iter().map(|c| c.caused_by).collect()
    }

    #[test]
    fn each_rule_finds_its_cause() {
        for (checks, want) in fixtures() {
            let ids: Vec<String> = checks.iter().map(|c| c.id.clone()).collect();
            let want: Vec<Option<String>> = want.into_iter().map(|w| w.map(String::from)).collect();
            assert_eq!(causes(checks), want, "{ids:?}");
        }
    }

    /// Rewording every message (or emptying it) changes no grouping: the
    /// rules read what a finding is about, not how it says so.
    #[test]
    fn rewording_every_message_changes_no_cause() {
        let rewordings: [fn(&str) -> String; 3] = [
            |_| String::new(),
            |m| m.chars().rev().collect(),
            |m| m.replace(|c: char| c.is_ascii_alphanumeric() || c == '=', "x"),
        ];
        for (checks, _) in fixtures() {
            let before = causes(checks.clone());
            for reword in rewordings {
                let mut reworded = checks.clone();
                for c in &mut reworded {
                    c.message = reword(&c.message);
                }
                assert_eq!(causes(reworded), before);
            }
        }
    }

    #[test]
    fn roots_are_the_failures_nothing_caused() {
        let (mut checks, _) = fixtures().swap_remove(1);
        attribute(&mut checks, Scope::Node);
        let r: Vec<&str> = roots(&checks).iter().map(|c| c.id.as_str()).collect();
        assert_eq!(r, ["env.lint", "gpu.xid"]);
    }

    /// Across nodes a pid or a variable means nothing: pid 9065 on one
    /// node is not pid 9065 on another.
    #[test]
    fn across_nodes_only_ids_and_names_link() {
        let (mut checks, _) = fixtures().swap_remove(0);
        attribute(&mut checks, Scope::AcrossNodes);
        assert!(checks.iter().all(|c| c.caused_by.is_none()), "{checks:?}");
        let (mut checks, _) = fixtures().swap_remove(3);
        attribute(&mut checks, Scope::AcrossNodes);
        assert_eq!(checks[1].caused_by.as_deref(), Some("net.hostname"));
    }
}
