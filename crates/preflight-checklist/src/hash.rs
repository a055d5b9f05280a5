//! The checklist's fingerprint, equal on nodes that run the same checks
//! with the same parameters: the cluster stage compares it across nodes.

use std::sync::Arc;

use super::Check;
use preflight_ground::values::hex;

/// A stable hash of the checklist as configured: ids, kinds, severities and
/// parameters, so two nodes running different checklists are told apart.
pub fn checklist_hash(checks: &[Arc<Check>]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for c in checks {
        h.update(c.id.as_bytes());
        h.update(b"|");
        h.update(c.kind.name.as_bytes());
        h.update(b"|");
        h.update(format!("{:?}", c.severity).as_bytes());
        h.update(b"|");
        h.update(c.probe.params().to_string().as_bytes());
        h.update(b"\n");
    }
    hex(&h.finalize()[..6])
}
