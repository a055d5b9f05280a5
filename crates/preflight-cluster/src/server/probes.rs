//! The reachability round, once the barrier has closed: one rank of each
//! node is told whom to probe (`reachability::partners`), and its results
//! are awaited within a short window; a node that opened no probe
//! listener cannot be probed, and its peers' probes to it say why.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::events::Gathered;
use super::verdict::deaf_nodes;
use super::{Event, ServerConfig};
use crate::protocol::{self, Msg};
use crate::reachability::{self, Target};
use preflight_result::cluster::{NodeView, Probe};

/// What the round leaves for the verdict.
pub(super) struct Probed {
    /// Nodes asked to probe (whose plan was sent).
    pub asked: usize,
    /// Nodes that could not be probed, and why.
    pub deaf: Vec<(usize, String)>,
}

/// Probes among `nodes` when `probing` (none after a signal); then the
/// events still queued (a second claimant of a rank, a loss) are taken.
pub(super) async fn round(
    cfg: &ServerConfig,
    g: &mut Gathered,
    rx: &mut mpsc::UnboundedReceiver<Event>,
    nodes: &[(NodeView, u32)],
    probing: bool,
) -> Probed {
    let n = if probing { nodes.len() } else { 0 };
    let now = Instant::now();
    // Room for a probe's two tries (the second with twice the time): a
    // healthy cluster's replies all come long before the window ends.
    let probe_deadline = (now + Duration::from_millis(3500))
        .min((cfg.deadline + Duration::from_millis(800)).max(now + Duration::from_millis(300)));
    let probe_timeout = (probe_deadline
        .saturating_duration_since(now)
        .saturating_sub(Duration::from_millis(150))
        / 3)
    .min(Duration::from_secs(1))
    .max(Duration::from_millis(50));
    let mut asked = 0;
    if n > 1 {
        for (i, (_, rep)) in nodes.iter().enumerate() {
            let Some((conn, _)) = g.state.arrivals.get(rep) else {
                continue;
            };
            let targets: Vec<Target> = reachability::partners(i, n)
                .into_iter()
                .filter_map(|j| {
                    let rep_j = nodes[j].1;
                    let addr = g.state.arrivals.get(&rep_j)?.1.probe_addr.clone()?;
                    Some(Target { node: j, addr })
                })
                .collect();
            if let Some(w) = g.writers.get(conn) {
                g.planned
                    .insert(*conn, (i, targets.iter().map(|t| t.node).collect()));
                let msg = Msg::ProbePlan {
                    node: i,
                    targets,
                    timeout_ms: probe_timeout.as_millis() as u64,
                };
                if protocol::write(&mut *w.lock().await, &msg, probe_deadline)
                    .await
                    .is_ok()
                {
                    asked += 1;
                }
            }
        }
        g.replies = 0;
        while g.replies < asked {
            match tokio::time::timeout_at(probe_deadline, rx.recv()).await {
                Ok(Some(ev)) => g.handle(ev),
                Ok(None) | Err(_) => break,
            }
        }
    }
    // Late arrivals (a second claimant of a rank) and losses still count.
    while let Ok(ev) = rx.try_recv() {
        g.handle(ev);
    }
    // A node that opened no probe listener cannot be probed: its peers'
    // probes to it are errors that carry its reason.
    let deaf = deaf_nodes(&g.state, nodes);
    if n > 1 {
        for i in 0..n {
            for j in reachability::partners(i, n) {
                if let Some((_, why)) = deaf.iter().find(|(d, _)| *d == j) {
                    g.probes.push(Probe {
                        from: i,
                        to: j,
                        status: "error".into(),
                        rtt_ms: None,
                        detail: Some(why.clone()),
                    });
                }
            }
        }
    }
    Probed { asked, deaf }
}
