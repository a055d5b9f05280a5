//! After the verdict: a process that checks in from now on (a second
//! claimant of a rank, a rank that started late) is not in the verdict
//! and cannot change it. It is told so, and exits not ready, while the
//! ranks in the verdict exit with its code. This lasts as long as the
//! store, which the collective stage still uses.

use std::collections::HashMap;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Event, reply};
use crate::barrier::{self, BarrierState};
use crate::checkin::CheckIn;
use preflight_result::cluster::ClusterReport;

/// What a process that checks in after the verdict is told.
pub(super) struct Closed {
    verdict: String,
    world_size: u32,
    held: HashMap<u32, String>,
}

impl Closed {
    pub(super) fn new(report: &ClusterReport, state: &BarrierState, world_size: u32) -> Closed {
        Closed {
            verdict: format!(
                "{}: {} of {} checked in",
                report.verdict.name(),
                state.arrivals.len(),
                preflight_ground::values::count(world_size as usize, "rank")
            ),
            world_size,
            held: state
                .arrivals
                .iter()
                .map(|(rank, (_, c))| (*rank, barrier::who(c)))
                .collect(),
        }
    }

    /// Answers every late check-in until the events end (the accept loop
    /// is stopped) or `until`.
    pub(super) async fn answer(&self, rx: &mut mpsc::UnboundedReceiver<Event>, until: Instant) {
        let answering = async {
            while let Some(ev) = rx.recv().await {
                if let Event::Arrived {
                    checkin, writer, ..
                } = ev
                {
                    let _ = reply::send(&writer, &reply::rejected(self.too_late(&checkin)), until)
                        .await;
                }
            }
        };
        let _ = tokio::time::timeout_at(until, answering).await;
    }

    fn too_late(&self, c: &CheckIn) -> String {
        let rank = c.identity.rank;
        let why = match self.held.get(&rank) {
            Some(holder) => format!(
                "rank {rank} had checked in from {holder}: this process is a second claimant of rank {rank}"
            ),
            None if rank >= self.world_size => format!(
                "rank {rank} is outside the world of {}",
                preflight_ground::values::count(self.world_size as usize, "rank")
            ),
            None => format!("rank {rank} was reported missing"),
        };
        format!(
            "too late: rank 0 had already sent the verdict ({}) when this process checked in; {why}, and this process is not part of the job's verdict",
            self.verdict
        )
    }
}
