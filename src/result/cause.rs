//! One cause, shown once: a failure that only restates or follows from
//! another is marked as its consequence (`caused_by`), so that the report
//! shows the root cause with its remedy and the rest as "caused by".
//!
//! Two rules, both on what the results say, never on guesses about a
//! node: `cluster.node_checks` restates this node's own failed checks
//! when every check it lists failed here too; and a failure whose message
//! names a variable (`GLOO_SOCKET_IFNAME=eth9`) that a failed check of
//! the job's own settings (areas `environment`, `launch`) named first
//! follows from that check.

use super::{CheckResult, Status};

/// Areas whose checks are about the job's settings, not the node.
pub const JOB_AREAS: &[&str] = &["environment", "launch"];

pub fn is_job_setting(area: &str) -> bool {
    JOB_AREAS.contains(&area)
}

fn failing(c: &CheckResult) -> bool {
    matches!(c.status, Status::Fail | Status::Error)
}

/// `NAME=` assignments in a message: upper-case names of at least three
/// characters, as launchers and libraries spell their variables.
fn variables(message: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let bytes = message.as_bytes();
    for (i, _) in message.match_indices('=') {
        let start = message[..i]
            .rfind(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .map_or(0, |p| p + 1);
        let name = &message[start..i];
        let starts_upper = bytes.get(start).is_some_and(u8::is_ascii_uppercase);
        if name.len() >= 3 && starts_upper && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// The check ids `cluster.node_checks` lists: `node: id (fail: ...)`.
pub fn listed_ids(message: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for marker in [" (fail: ", " (error: "] {
        for (i, _) in message.match_indices(marker) {
            let start = message[..i].rfind([' ', ',']).map_or(0, |p| p + 1);
            let id = message[start..i].trim_start_matches(',');
            if !id.is_empty() {
                out.push(id);
            }
        }
    }
    out
}

/// The processes a message names as holding a port: `held by pid N`.
fn holders(message: &str) -> Vec<&str> {
    message
        .match_indices("held by pid ")
        .filter_map(|(i, m)| {
            let rest = &message[i + m.len()..];
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            (end > 0).then(|| &rest[..end])
        })
        .collect()
}

/// Marks each failure that follows from another failure in `checks`.
pub fn attribute(checks: &mut [CheckResult]) {
    let roots: Vec<(String, Vec<String>)> = checks
        .iter()
        .filter(|c| failing(c) && is_job_setting(&c.area))
        .map(|c| {
            (
                c.id.clone(),
                variables(&c.message)
                    .into_iter()
                    .map(String::from)
                    .collect(),
            )
        })
        .collect();
    let failed_here: Vec<String> = checks
        .iter()
        .filter(|c| failing(c) && c.id != "cluster.node_checks")
        .map(|c| c.id.clone())
        .collect();
    // The first failure to name a port's holder is the cause; a later one
    // naming the same process (rank 0 could not listen there) follows.
    let mut held: Vec<(String, String)> = Vec::new();
    for c in checks.iter().filter(|c| failing(c)) {
        for pid in holders(&c.message) {
            if !held.iter().any(|(p, _)| p == pid) {
                held.push((pid.to_string(), c.id.clone()));
            }
        }
    }
    for c in checks.iter_mut() {
        if !failing(c) || c.caused_by.is_some() || is_job_setting(&c.area) {
            continue;
        }
        if let Some((_, root)) = held
            .iter()
            .find(|(pid, root)| *root != c.id && holders(&c.message).contains(&pid.as_str()))
        {
            c.caused_by = Some(root.clone());
            continue;
        }
        if c.id == "cluster.node_checks" {
            let ids = listed_ids(&c.message);
            if !ids.is_empty() && ids.iter().all(|id| failed_here.iter().any(|f| f == id)) {
                c.caused_by = Some(ids[0].to_string());
            }
            continue;
        }
        let named = variables(&c.message);
        c.caused_by = roots
            .iter()
            .find(|(_, vars)| vars.iter().any(|v| named.contains(&v.as_str())))
            .map(|(id, _)| id.clone());
    }
}

/// The failures that are no other failure's consequence, in order.
pub fn roots(checks: &[CheckResult]) -> Vec<&CheckResult> {
    checks
        .iter()
        .filter(|c| failing(c) && c.caused_by.is_none())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, area: &str, status: Status, message: &str) -> CheckResult {
        CheckResult::built_in(id, "k", area, status, message.into(), None)
    }

    #[test]
    fn a_port_holder_named_twice_is_one_cause() {
        let mut checks = vec![
            result(
                "net.master_port_free",
                "network",
                Status::Fail,
                "1 of 1 port(s) on 0.0.0.0 taken: 29577 (held by pid 9065 `python3`)",
            ),
            result(
                "cluster.rendezvous",
                "cluster",
                Status::Fail,
                "port 29577 on 127.0.0.1 is in use by another program: held by pid 9065 `python3`",
            ),
            result(
                "other.port",
                "network",
                Status::Fail,
                "taken (held by pid 77 `x`)",
            ),
        ];
        attribute(&mut checks);
        let causes: Vec<Option<&str>> = checks.iter().map(|c| c.caused_by.as_deref()).collect();
        assert_eq!(causes, [None, Some("net.master_port_free"), None]);
    }

    #[test]
    fn a_bad_variable_is_the_cause_of_what_it_breaks() {
        let mut checks = vec![
            result(
                "env.lint",
                "environment",
                Status::Fail,
                "GLOO_SOCKET_IFNAME=`eth9`: no interface named `eth9` on this node",
            ),
            result(
                "cluster.node_checks",
                "cluster",
                Status::Fail,
                "vm: env.lint (fail: GLOO_SOCKET_IFNAME=`eth9`: no interface named `eth9`)",
            ),
            result(
                "collective.tcp",
                "collective",
                Status::Fail,
                "tcp: init failed on rank 0 (vm 127.0.0.1): GLOO_SOCKET_IFNAME=eth9: no interface of that name",
            ),
            result("gpu.xid", "accelerators", Status::Fail, "Xid 79 on GPU 3"),
        ];
        attribute(&mut checks);
        let causes: Vec<Option<&str>> = checks.iter().map(|c| c.caused_by.as_deref()).collect();
        assert_eq!(causes, [None, Some("env.lint"), Some("env.lint"), None]);
        let r: Vec<&str> = roots(&checks).iter().map(|c| c.id.as_str()).collect();
        assert_eq!(r, ["env.lint", "gpu.xid"]);
    }

    #[test]
    fn node_checks_naming_another_nodes_failure_stands_on_its_own() {
        let mut checks = vec![
            result(
                "env.lint",
                "environment",
                Status::Fail,
                "NCCL_DEBUG=`x`: bad",
            ),
            result(
                "cluster.node_checks",
                "cluster",
                Status::Fail,
                "h1: env.lint (fail: NCCL_DEBUG=`x`); h2: nvidia.xid (fail: Xid 79)",
            ),
            result(
                "cluster.reachability",
                "cluster",
                Status::Fail,
                "h2 drops incoming connections",
            ),
        ];
        attribute(&mut checks);
        assert!(checks.iter().all(|c| c.caused_by.is_none()), "{checks:?}");
        assert_eq!(listed_ids(&checks[1].message), ["env.lint", "nvidia.xid"]);
    }

    #[test]
    fn variables_are_upper_case_assignments() {
        assert_eq!(
            variables("MASTER_PORT=29500 and x=1, NCCL_IB_HCA=`mlx5`; A=b"),
            ["MASTER_PORT", "NCCL_IB_HCA"]
        );
    }
}
