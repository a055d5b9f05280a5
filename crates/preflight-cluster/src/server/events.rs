//! What the barrier gathers from its connections' events: the check-ins
//! (and each connection's writer, for its verdict), the losses, the
//! strangers, and the probe results of the connections asked to probe.

use std::collections::HashMap;

use super::{Event, Writer};
use crate::barrier::{BarrierState, ConnId};
use preflight_result::cluster::Probe;

/// Which connection was asked to probe for which node, and whom.
pub(super) type Planned = HashMap<ConnId, (usize, Vec<usize>)>;

pub(super) struct Gathered {
    pub state: BarrierState,
    pub writers: HashMap<ConnId, Writer>,
    pub probes: Vec<Probe>,
    pub planned: Planned,
    /// Probe result sets received since the plan went out.
    pub replies: usize,
}

impl Gathered {
    pub(super) fn new(state: BarrierState) -> Gathered {
        Gathered {
            state,
            writers: HashMap::new(),
            probes: Vec::new(),
            planned: HashMap::new(),
            replies: 0,
        }
    }

    pub(super) fn handle(&mut self, ev: Event) {
        match ev {
            Event::Arrived {
                conn,
                checkin,
                writer,
            } => {
                // Duplicates and ranks outside the world are recorded by
                // the barrier and still get the verdict, so they exit with
                // it too.
                self.writers.insert(conn, writer);
                self.state.arrive(conn, *checkin);
            }
            Event::Lost { conn, reason } => {
                self.writers.remove(&conn);
                self.state.lose(conn, &reason);
            }
            Event::OtherJob { peer } => self.state.other_job(peer),
            Event::Dropped { peer, reason } => {
                // A flood of junk must not grow the report without bound.
                self.state.dropped_total += 1;
                if self.state.dropped.len() < 32 {
                    self.state.dropped.push(format!("{peer}: {reason}"));
                }
            }
            Event::Probes { conn, results } => {
                // One result set per node, from the rank asked to probe for
                // it, about the peers it was asked to probe: `from` is the
                // plan's, whatever the message says.
                if let Some((node, targets)) = self.planned.remove(&conn) {
                    self.probes.extend(
                        results
                            .into_iter()
                            .filter(|p| targets.contains(&p.to))
                            .map(|p| Probe { from: node, ..p }),
                    );
                    self.replies += 1;
                }
            }
            Event::AcceptFailed { reason } => {
                self.state.accept_failures += 1;
                self.state.accept_error.get_or_insert(reason);
            }
        }
    }
}
