//! Kubernetes' termination message: what `kubectl describe pod` shows of
//! a container that ended, from the file it wrote last
//! (`terminationMessagePath`, /dev/termination-log by default). The
//! kubelet keeps 4,096 bytes of it: the verdict's line first, then the
//! nodes the cluster stage named and the checks that failed, each on a
//! line, as many as fit whole.

use crate::style::Style;
use preflight_result::Status;
use preflight_result::report::Report;

/// What the kubelet keeps of one container's message.
pub const MAX_BYTES: usize = 4096;

/// The message, within `MAX_BYTES`.
pub fn message(report: &Report) -> String {
    let mut lines = vec![preflight_ground::values::one_line(
        &super::human::verdict_line(report, &Style { color: false }),
        512,
    )];
    if let Some(c) = &report.cluster {
        for culprit in &c.culprits {
            lines.push(preflight_ground::values::one_line(
                &format!(
                    "{} (ranks {}): {}",
                    culprit.node,
                    preflight_ground::values::rank_ranges(&culprit.ranks),
                    culprit.reasons.join("; ")
                ),
                600,
            ));
        }
    }
    // The cluster's failed checks, then this node's: each once, though a
    // cluster check is in both (the kubelet's bytes are few).
    let cluster_checks = report.cluster.iter().flat_map(|c| c.checks.iter());
    let mut said = std::collections::BTreeSet::new();
    for x in cluster_checks
        .chain(report.checks.iter())
        .filter(|x| matches!(x.status, Status::Fail | Status::Error))
    {
        let line = preflight_ground::values::one_line(&format!("{}: {}", x.id, x.message), 600);
        if said.insert(line.clone()) {
            lines.push(line);
        }
    }
    let mut out = String::new();
    let mut left = lines.len();
    for l in lines {
        left -= 1;
        // Room kept for the count of what did not fit.
        let tail = if left > 0 { 32 } else { 0 };
        if out.len() + l.len() + 1 + tail > MAX_BYTES {
            out.push_str(&format!("(+{} more in the report)\n", left + 1));
            break;
        }
        out.push_str(&l);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use preflight_result::CheckResult;
    use preflight_result::report::Node;

    #[test]
    fn a_long_report_is_cut_to_whole_lines_within_the_kubelets_limit() {
        let mut checks: Vec<CheckResult> = (0..200)
            .map(|i| {
                let id = format!("site.check_{i}");
                CheckResult::built_in(
                    &id,
                    "command",
                    "system",
                    Status::Fail,
                    format!("{id} failed\nbecause"),
                    None,
                )
            })
            .collect();
        checks[0].message = "é".repeat(3000);
        let node = Node {
            hostname: "h".into(),
            root: "/".into(),
            pid: 1,
            rank: None,
        };
        let r = Report::new(
            "run",
            node,
            std::time::SystemTime::now(),
            Default::default(),
            checks,
            false,
        );
        let m = message(&r);
        assert!(m.len() <= MAX_BYTES, "{}", m.len());
        assert!(m.starts_with("NOT READY"), "{m}");
        assert!(m.trim_end().ends_with("more in the report)"), "{m}");
        assert!(m.lines().all(|l| l.len() <= 600));
    }
}
