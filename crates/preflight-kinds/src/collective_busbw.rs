//! `collective_busbw`: the checklist's minimum bus bandwidth per backend,
//! operation and size, evaluated (with `scope: cluster`) against the
//! collective report that every rank holds after the stage. The check's
//! `severity` makes a shortfall a warning or a failure, as for any kind.
//!
//! The minimum is absolute (`min_busbw`, GB/s) or relative to the link
//! (`min_fraction_of_link`): a fraction of the slowest link speed among the
//! ranks' interfaces that the TCP backend used (from each rank's interface
//! facts, carried in the report). A link that reports no speed (loopback,
//! some virtual links), or a run in which every pair used a Unix socket
//! (all ranks on one host: no link in the path), cannot be compared: the
//! check is skipped with that reason.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::cluster::{ClusterProbe, NOT_HERE, View};
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use preflight_facts::Facts;
use preflight_result::Finding;
use preflight_result::collective::{CollectiveReport, RankLink, Threshold};

pub const KIND: KindInfo = KindInfo {
    name: "collective_busbw",
    scope: crate::Scope::Cluster,
    area: "collective",
    summary: "The collective stage's bus bandwidth for one backend, operation and size is at least a minimum (GB/s, nccl-tests' busbw).",
    params: &[
        ParamDoc {
            name: "backend",
            ty: "string",
            default: Some("tcp"),
            doc: "tcp, nccl or oneccl.",
        },
        ParamDoc {
            name: "op",
            ty: "string",
            default: Some("allreduce"),
            doc: "allreduce, allgather or broadcast.",
        },
        ParamDoc {
            name: "size",
            ty: "size",
            default: Some("the largest size measured"),
            doc: "Which row of the sweep, e.g. 1MiB.",
        },
        ParamDoc {
            name: "min_busbw",
            ty: "number",
            default: Some("none: set it, min_fraction_of_link, or both"),
            doc: "GB/s (10^9 B/s); below it the check fails (or warns, with severity: warn). With both set, the higher minimum applies.",
        },
        ParamDoc {
            name: "min_fraction_of_link",
            ty: "number",
            default: Some("none"),
            doc: "Minimum busbw as a fraction (0 < f <= 1) of the slowest link speed among the ranks (the interface each rank's TCP backend used, from its interface facts; Mb/s / 8000 = GB/s). Skipped, with the reason, when a rank's link reports no speed (loopback, some virtual links) or every pair used a Unix socket (one host).",
        },
    ],
    hint_vars: &[],
    parse: parse_params::<Busbw>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Busbw {
    #[serde(default = "default_backend")]
    backend: String,
    #[serde(default = "default_op")]
    op: String,
    #[serde(default)]
    size: Option<String>,
    #[serde(default)]
    min_busbw: Option<f64>,
    #[serde(default)]
    min_fraction_of_link: Option<f64>,
}

fn default_backend() -> String {
    "tcp".into()
}

fn default_op() -> String {
    "allreduce".into()
}

impl Params for Busbw {
    fn validate(&self) -> Result<(), String> {
        if !["allreduce", "allgather", "broadcast"].contains(&self.op.as_str()) {
            return Err("`op` must be allreduce, allgather or broadcast".into());
        }
        if preflight_facts::Backend::from_name(&self.backend).is_none() {
            return Err(format!(
                "`backend` must be {}",
                preflight_facts::Backend::choices()
            ));
        }
        if let Some(s) = &self.size {
            preflight_ground::values::parse_size(s).map_err(|e| format!("`size` {e}"))?;
        }
        if let Some(m) = self.min_busbw
            && !(m.is_finite() && m > 0.0)
        {
            return Err("`min_busbw` must be a positive number of GB/s".into());
        }
        if let Some(f) = self.min_fraction_of_link
            && !(f.is_finite() && f > 0.0 && f <= 1.0)
        {
            return Err(
                "`min_fraction_of_link` must be a fraction of the link speed, above 0 and at most 1"
                    .into(),
            );
        }
        if self.min_busbw.is_none() && self.min_fraction_of_link.is_none() {
            return Err(
                "set `min_busbw` (GB/s) or `min_fraction_of_link` (0 to 1), or both".into(),
            );
        }
        Ok(())
    }
}

pub const LATER: &str = "evaluated after the collective stage of `preflight run`/`bench`";

impl Probe for Busbw {
    fn evaluate(self: Arc<Self>, _facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async { Finding::skip(NOT_HERE) })
    }
    fn cluster(&self) -> Option<&dyn ClusterProbe> {
        Some(self)
    }
    fn collective(&self) -> Option<&dyn CollectiveProbe> {
        Some(self)
    }
}

impl ClusterProbe for Busbw {
    // Never asked at the barrier (`Check::evaluator` sends collective
    // kinds to the collective stage); the answer if it were.
    fn evaluate_cluster(&self, _view: &View<'_>) -> Finding {
        Finding::skip(LATER)
    }
}

pub trait CollectiveProbe: Send + Sync {
    fn evaluate_collective(&self, report: &CollectiveReport) -> Finding;
}

impl CollectiveProbe for Busbw {
    fn evaluate_collective(&self, report: &CollectiveReport) -> Finding {
        let Some(b) = report.backends.iter().find(|b| b.name == self.backend) else {
            return Finding::skip(format!(
                "backend {} was not selected (--backends)",
                self.backend
            ));
        };
        if !b.available {
            return Finding::skip(format!("{}: {}", b.name, b.reason));
        }
        let size = self
            .size
            .as_deref()
            .and_then(|s| preflight_ground::values::parse_size(s).ok());
        let rows: Vec<_> = b.sweep.iter().filter(|r| r.op.name() == self.op).collect();
        let row = match size {
            Some(s) => rows.iter().find(|r| r.bytes == s).copied(),
            None => rows.iter().max_by_key(|r| r.bytes).copied(),
        };
        // The relative minimum in GB/s, or why it cannot be had.
        let link = self
            .min_fraction_of_link
            .map(|f| slowest_link(report).map(|(gbps, who)| (f * gbps, f, who)));
        let mut minimum = self.min_busbw;
        let mut basis = Vec::new();
        if let Some(m) = self.min_busbw {
            basis.push(format!("{m:.3} GB/s"));
        }
        match &link {
            Some(Ok((gbps, f, who))) => {
                minimum = Some(minimum.map_or(*gbps, |m| m.max(*gbps)));
                basis.push(format!("{f} × {who}"));
            }
            // With no absolute minimum to fall back on there is nothing
            // to compare against.
            Some(Err(why)) if self.min_busbw.is_none() => {
                return Finding::skip(format!(
                    "min_fraction_of_link cannot be evaluated: {why}; use min_busbw (GB/s) for this path"
                ));
            }
            _ => {}
        }
        let minimum = minimum.unwrap_or(0.0);
        let expected = format!(">= {minimum:.3} GB/s");
        let threshold = Threshold {
            backend: b.name.clone(),
            op: self.op.clone(),
            bytes: size.or(row.map(|r| r.bytes)),
            min_busbw: minimum,
        };
        // Cut short by the run's deadline: a missing size, or the largest
        // of the sizes done, says nothing about the one meant.
        if b.verdict == "incomplete" && (row.is_none() || size.is_none()) {
            return Finding::error(format!(
                "{} {}: not measured at {}: {}",
                b.name,
                self.op,
                size.map(|s| preflight_ground::values::format_bytes(s as u64))
                    .unwrap_or_else(|| "the sweep's largest size".into()),
                b.ended.as_deref().unwrap_or("the sweep did not finish")
            ))
            .expected(expected)
            .threshold(threshold);
        }
        let Some(row) = row else {
            let what = size
                .map(|s| preflight_ground::values::format_bytes(s as u64))
                .unwrap_or_else(|| "any size".into());
            return Finding::fail(format!(
                "{} {} has no verified result at {what} (the sweep ended early, or does not reach that size: --max-size)",
                b.name, self.op
            ))
            .expected(expected)
            .threshold(threshold);
        };
        let measured = format!("{:.3} GB/s", row.busbw);
        // Where the minimum comes from, when that is more than its own
        // figure (a fraction of a link, or the larger of two).
        let from = if matches!(&link, Some(Ok(_))) {
            format!(": {}", basis.join(", "))
        } else {
            String::new()
        };
        let mut text = format!(
            "{} {} {} busbw {measured} (minimum {minimum:.3} GB/s{from})",
            b.name,
            self.op,
            preflight_ground::values::format_bytes(row.bytes as u64),
        );
        if let Some(Err(why)) = &link {
            text.push_str(&format!("; min_fraction_of_link not evaluated: {why}"));
        }
        let f = if row.busbw >= minimum {
            Finding::pass(text)
        } else {
            Finding::fail(text)
        };
        f.measured(measured).expected(expected).threshold(threshold)
    }
}

/// The slowest link among the ranks, in GB/s, with words naming it; or
/// why there is none to compare with.
fn slowest_link(report: &CollectiveReport) -> Result<(f64, String), String> {
    let links = &report.links;
    if let Some(r) = (0..report.world_size).find(|r| !links.iter().any(|l| l.rank == *r)) {
        return Err(format!(
            "rank {r}'s link is unknown (its TCP backend gave no result)"
        ));
    }
    if report.world_size > 1
        && links
            .iter()
            .all(|l| l.unix_peers.len() + 1 == report.world_size as usize)
    {
        return Err(
            "every pair used a Unix socket (all ranks on one host): no network link was in the path"
                .into(),
        );
    }
    let mut slowest: Option<(u64, &RankLink)> = None;
    for l in links {
        let name = l
            .interface
            .as_deref()
            .unwrap_or("(no interface holds its address)");
        let Some(mbps) = l.speed_mbps else {
            return Err(format!(
                "rank {}'s interface {name} reports no link speed (loopback or a virtual link)",
                l.rank
            ));
        };
        if slowest.is_none_or(|(m, _)| mbps < m) {
            slowest = Some((mbps, l));
        }
    }
    let Some((mbps, l)) = slowest else {
        return Err("no rank reported its link".into());
    };
    Ok((
        mbps as f64 / 8000.0,
        format!(
            "the slowest link, rank {}'s {} at {mbps} Mb/s ({:.3} GB/s)",
            l.rank,
            l.interface.as_deref().unwrap_or("?"),
            mbps as f64 / 8000.0
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use preflight_result::Status;
    use preflight_result::collective::{BackendReport, Dtype, Op, Row};

    /// Four ranks, one allreduce row of 64 MiB at `busbw` GB/s (time
    /// chosen to give it), and each rank's link.
    fn report(busbw: f64, links: Vec<RankLink>) -> CollectiveReport {
        let bytes = 64 << 20;
        let factor = Op::Allreduce.bus_factor(4);
        let time_us = bytes as f64 * factor / (busbw * 1e3);
        let row = Row::new(Op::Allreduce, bytes, Dtype::F32, time_us, 4);
        CollectiveReport {
            links,
            ..CollectiveReport::of(
                "full",
                4,
                vec![BackendReport::available("tcp", "pass", vec![row])],
            )
        }
    }

    fn link(rank: u32, iface: &str, mbps: Option<u64>, unix_peers: Vec<u32>) -> RankLink {
        RankLink {
            rank,
            interface: Some(iface.into()),
            speed_mbps: mbps,
            unix_peers,
            direct_peers: Vec::new(),
            direct_refused: None,
            connections: 3,
        }
    }

    /// Ranks 0..4 on eth0 at 10 Gb/s (1.25 GB/s) except rank 2 at
    /// `slow` Mb/s.
    fn nics(slow: Option<u64>) -> Vec<RankLink> {
        (0..4)
            .map(|r| {
                let speed = if r == 2 { slow } else { Some(10_000) };
                link(r, "eth0", speed, Vec::new())
            })
            .collect()
    }

    fn relative(fraction: f64, min_busbw: Option<f64>) -> Busbw {
        let b = Busbw {
            backend: "tcp".into(),
            op: "allreduce".into(),
            size: None,
            min_busbw,
            min_fraction_of_link: Some(fraction),
        };
        b.validate().expect("valid parameters");
        b
    }

    #[test]
    fn fraction_of_the_slower_nic_passes_and_fails() {
        // Rank 2 has 8 Gb/s = 1.0 GB/s: half of it is 0.5 GB/s.
        let r = report(0.6, nics(Some(8_000)));
        let f = relative(0.5, None).evaluate_collective(&r);
        assert_eq!(f.status, Status::Pass, "{}", f.message);
        assert!(
            f.message.contains("rank 2's eth0 at 8000 Mb/s"),
            "{}",
            f.message
        );
        assert_eq!(f.expected.as_deref(), Some(">= 0.500 GB/s"));

        let r = report(0.4, nics(Some(8_000)));
        let f = relative(0.5, None).evaluate_collective(&r);
        assert_eq!(f.status, Status::Fail, "{}", f.message);
        assert_eq!(f.measured.as_deref(), Some("0.400 GB/s"));
    }

    #[test]
    fn both_minimums_the_higher_one_applies() {
        // 0.5 × 1.25 GB/s = 0.625; the absolute 0.7 is higher.
        let r = report(0.65, nics(Some(10_000)));
        let f = relative(0.5, Some(0.7)).evaluate_collective(&r);
        assert_eq!(f.status, Status::Fail, "{}", f.message);
        assert_eq!(f.expected.as_deref(), Some(">= 0.700 GB/s"));
    }

    #[test]
    fn unknown_link_speed_is_skipped_with_the_reason() {
        let r = report(0.6, nics(None));
        let f = relative(0.5, None).evaluate_collective(&r);
        assert_eq!(f.status, Status::Skip, "{}", f.message);
        assert!(
            f.message
                .contains("rank 2's interface eth0 reports no link speed"),
            "{}",
            f.message
        );
        // With an absolute minimum as well, that one is still checked.
        let f = relative(0.5, Some(1.0)).evaluate_collective(&r);
        assert_eq!(f.status, Status::Fail, "{}", f.message);
        assert!(
            f.message.contains("min_fraction_of_link not evaluated"),
            "{}",
            f.message
        );
        // The minimum said once: an absolute one is its own basis.
        assert!(
            f.message.contains("busbw 0.600 GB/s (minimum 1.000 GB/s);"),
            "{}",
            f.message
        );
    }

    #[test]
    fn a_rank_without_a_link_or_one_host_over_unix_is_skipped() {
        let mut links = nics(Some(10_000));
        links.retain(|l| l.rank != 3);
        let f = relative(0.5, None).evaluate_collective(&report(0.6, links));
        assert_eq!(f.status, Status::Skip, "{}", f.message);
        assert!(
            f.message.contains("rank 3's link is unknown"),
            "{}",
            f.message
        );

        let one_host = (0..4)
            .map(|r| {
                link(
                    r,
                    "eth0",
                    Some(10_000),
                    (0..4).filter(|p| *p != r).collect(),
                )
            })
            .collect();
        let f = relative(0.5, None).evaluate_collective(&report(0.6, one_host));
        assert_eq!(f.status, Status::Skip, "{}", f.message);
        assert!(f.message.contains("Unix socket"), "{}", f.message);
    }

    #[test]
    fn a_sweep_cut_by_the_runs_deadline_cannot_be_judged() {
        let mut r = report(0.6, nics(Some(10_000)));
        r.backends[0].verdict = "incomplete".into();
        r.backends[0].ended =
            Some("the run's deadline (--timeout) came during allgather at 1 MiB".into());
        let absolute = |size: Option<&str>| Busbw {
            backend: "tcp".into(),
            op: "allreduce".into(),
            size: size.map(str::to_string),
            min_busbw: Some(0.5),
            min_fraction_of_link: None,
        };
        // Whatever the largest size done, it is not the sweep's largest.
        let f = absolute(None).evaluate_collective(&r);
        assert_eq!(f.status, Status::Error, "{}", f.message);
        assert!(f.message.contains("run's deadline"), "{}", f.message);
        // A size that was measured before the deadline is judged.
        let f = absolute(Some("64MiB")).evaluate_collective(&r);
        assert_eq!(f.status, Status::Pass, "{}", f.message);
        let f = absolute(Some("128MiB")).evaluate_collective(&r);
        assert_eq!(f.status, Status::Error, "{}", f.message);
    }

    #[test]
    fn parameters_are_validated() {
        let mut b = relative(0.5, None);
        b.min_fraction_of_link = Some(1.5);
        assert!(b.validate().unwrap_err().contains("min_fraction_of_link"));
        b.min_fraction_of_link = None;
        assert!(b.validate().unwrap_err().contains("min_busbw"));
    }
}
