//! What an Xid asks the operator to do, from NVIDIA's Xid catalog
//! (docs.nvidia.com/deploy/xid-errors, the "Resolution Bucket (Immediate
//! Action)" column: RESTART_APP, RESET_GPU, RESTART_BM, CHECK_MECHANICALS,
//! CONTACT_SUPPORT, IGNORE and the workflows that end in one of them), and a kernel log's Xid lines grouped so that a node that
//! logged the same Xid 800,000 times is one finding with a count.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::kmsg::Xid;

/// What an Xid needs before the GPU takes a new job, least to most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Informational: nothing to do.
    Ignore,
    /// The application's fault or a fault it survives by restarting.
    RestartApp,
    /// Reset the GPU (`nvidia-smi -r`) once its work is drained.
    ResetGpu,
    /// Reboot the node (NVIDIA's RESTART_BM: restart the bare-metal host).
    Reboot,
    /// Someone must look at the hardware (CHECK_MECHANICALS: power
    /// cables, seating).
    CheckHardware,
    /// The hardware needs service: drain and open a case with NVIDIA or
    /// the system vendor.
    ContactSupport,
}

impl Action {
    /// The words put into messages and drain reasons.
    pub fn words(self) -> &'static str {
        match self {
            Action::Ignore => "no action",
            Action::RestartApp => "restart the application",
            Action::ResetGpu => "reset the GPU",
            Action::Reboot => "reboot",
            Action::CheckHardware => "check the hardware (power cables, seating)",
            Action::ContactSupport => "contact support",
        }
    }
}

/// The NVLink Xids: 74 (NVLink error) and the NVLink5 family 144-150
/// (Blackwell and later).
pub const NVLINK_XIDS: [u32; 8] = [74, 144, 145, 146, 147, 148, 149, 150];

/// The catalog: a short name and NVIDIA's recommended action. Xids that
/// NVIDIA sends through a workflow (48: read the ECC Xids that follow;
/// 74 and 144-150: the NVLink workflow) carry the workflow's usual end.
const CATALOG: &[(u32, &str, Action)] = &[
    (8, "GPU stopped processing", Action::RestartApp),
    (13, "graphics engine exception", Action::RestartApp),
    (31, "GPU memory page fault", Action::RestartApp),
    (
        32,
        "invalid or corrupted push buffer stream",
        Action::RestartApp,
    ),
    (38, "driver firmware error", Action::Ignore),
    (39, "copy engine error", Action::RestartApp),
    (40, "copy engine error", Action::RestartApp),
    (41, "copy engine error", Action::RestartApp),
    (43, "GPU stopped processing", Action::Ignore),
    // WORKFLOW_XID_45: follow the Xid it accompanies.
    (45, "preemptive cleanup", Action::Ignore),
    (46, "GPU timeout", Action::ResetGpu),
    // WORKFLOW_XID_48: reset, then read the SRAM threshold.
    (48, "double-bit ECC error", Action::ResetGpu),
    (
        54,
        "auxiliary power is not connected",
        Action::CheckHardware,
    ),
    (56, "display engine error", Action::ContactSupport),
    (
        57,
        "video memory link training failure",
        Action::ContactSupport,
    ),
    (58, "video memory error", Action::ContactSupport),
    (
        61,
        "internal micro-controller breakpoint",
        Action::ContactSupport,
    ),
    (62, "internal micro-controller halt", Action::ResetGpu),
    // The remap itself; a pending remap is `remapped_rows`' finding.
    (63, "GPU memory remapping event", Action::Ignore),
    (64, "GPU memory remapping failure", Action::ResetGpu),
    (68, "video decoder exception", Action::RestartApp),
    (69, "graphics engine class error", Action::RestartApp),
    (73, "NVENC2 error", Action::ContactSupport),
    // WORKFLOW_NVLINK_ERR: reset (or reboot); replace if it recurs.
    (74, "NVLink error", Action::ResetGpu),
    (79, "fallen off the bus", Action::Reboot),
    (92, "high single-bit ECC error rate", Action::Ignore),
    (94, "contained memory error", Action::RestartApp),
    (95, "uncontained memory error", Action::ResetGpu),
    (109, "context switch timeout", Action::ResetGpu),
    (110, "security fault", Action::ResetGpu),
    (119, "GSP RPC timeout", Action::ResetGpu),
    (120, "GSP error", Action::ResetGpu),
    (121, "C2C error", Action::Ignore),
    (122, "SPI PMU RPC read failure", Action::ContactSupport),
    (123, "SPI PMU RPC write failure", Action::ContactSupport),
    (124, "SPI PMU RPC erase failure", Action::ContactSupport),
    (136, "link training failed", Action::ResetGpu),
    (137, "NVLink privilege error", Action::Ignore),
    (140, "unrecovered ECC error", Action::ResetGpu),
    (143, "GPU initialization error", Action::ResetGpu),
    // WORKFLOW_NVLINK5_ERR.
    (144, "NVLink SAW error", Action::ResetGpu),
    (145, "NVLink RLW error", Action::ResetGpu),
    (146, "NVLink TLW error", Action::ResetGpu),
    (147, "NVLink TREX error", Action::ResetGpu),
    (148, "NVLink NVLPW_CTRL error", Action::ResetGpu),
    (149, "NVLink NETIR error", Action::ResetGpu),
    (150, "NVLink MSE error", Action::ResetGpu),
    // RESTART_VM: restart the (virtual) machine.
    (151, "key rotation error", Action::Reboot),
    // XID_154: the line names the action (see `recovery_action`).
    (154, "GPU recovery action changed", Action::ResetGpu),
    (155, "NVLink software-defined error", Action::ResetGpu),
    (156, "resource retirement event", Action::ResetGpu),
    (157, "resource retirement failure", Action::Ignore),
    (158, "GPU fatal timeout", Action::ResetGpu),
    // CHECK_UVM: the unified memory driver; resetting reloads it.
    (159, "CHI non-data error", Action::ResetGpu),
    (160, "channel retirement event", Action::Ignore),
    (161, "channel retirement failure", Action::Ignore),
];

/// An Xid's name and action. An Xid this catalog does not hold is never
/// taken lightly: its action is to reset the GPU, and its name says to
/// read NVIDIA's catalog.
pub fn describe(code: u32) -> (&'static str, Action) {
    CATALOG
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, name, action)| (*name, *action))
        .unwrap_or((
            "not in preflight's catalog: see NVIDIA's Xid catalog",
            Action::ResetGpu,
        ))
}

/// Xid 154 says in its text what the driver wants done ("GPU recovery
/// action changed from 0x0 (None) to 0x2 (Node Reboot Required)"): that
/// word wins over the catalog's.
fn recovery_action(detail: &str) -> Option<Action> {
    let lower = detail.to_ascii_lowercase();
    let to = &lower[lower.rfind(" to ")?..];
    if to.contains("reboot") {
        Some(Action::Reboot)
    } else if to.contains("drain") || to.contains("reset") {
        Some(Action::ResetGpu)
    } else if to.contains("none") {
        Some(Action::Ignore)
    } else {
        None
    }
}

/// One Xid on one GPU, however many times the log holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub bus: String,
    pub code: u32,
    pub name: &'static str,
    pub action: Action,
    pub count: u64,
    /// Seconds since boot of the first and last line, where timestamped.
    pub first: Option<f64>,
    pub last: Option<f64>,
    /// The first line's own words.
    pub detail: String,
}

/// Groups a log's Xids by GPU and code, each with its action: those in
/// `nvlink` take `nvlink_action` instead of the catalog's. Worst action
/// first, then by GPU and code.
pub fn group(xids: &[Xid], nvlink: &[u32], nvlink_action: Option<Action>) -> Vec<Group> {
    let mut groups: BTreeMap<(&str, u32), Group> = BTreeMap::new();
    for x in xids {
        let entry = groups.entry((x.bus.as_str(), x.code)).or_insert_with(|| {
            let (name, mut action) = describe(x.code);
            if let Some(a) = nvlink_action.filter(|_| nvlink.contains(&x.code)) {
                action = a;
            }
            Group {
                bus: x.bus.clone(),
                code: x.code,
                name,
                action,
                count: 0,
                first: x.at,
                last: x.at,
                detail: x.detail.clone(),
            }
        });
        entry.count += 1;
        if x.code == 154
            && let Some(a) = recovery_action(&x.detail)
        {
            // The latest change is what the driver wants now.
            entry.action = a;
        }
        if let Some(at) = x.at {
            entry.first = Some(entry.first.map_or(at, |f| f.min(at)));
            entry.last = Some(entry.last.map_or(at, |l| l.max(at)));
        }
    }
    let mut out: Vec<Group> = groups.into_values().collect();
    out.sort_by(|a, b| {
        b.action
            .cmp(&a.action)
            .then_with(|| a.bus.cmp(&b.bus))
            .then(a.code.cmp(&b.code))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(bus: &str, code: u32, at: f64, detail: &str) -> Xid {
        Xid {
            bus: bus.into(),
            code,
            detail: detail.into(),
            at: Some(at),
        }
    }

    #[test]
    fn repeated_xids_are_one_group_with_count_first_and_last() {
        let mut log: Vec<Xid> = (0..800_000)
            .map(|i| xid("0000:18:00", 95, 100.0 + i as f64, "Uncontained"))
            .collect();
        log.push(xid("0000:3a:00", 79, 50.0, "GPU has fallen off the bus."));
        let g = group(&log, &NVLINK_XIDS, None);
        assert_eq!(g.len(), 2);
        // Worst first: a reboot before a reset.
        assert_eq!((g[0].code, g[0].action), (79, Action::Reboot));
        assert_eq!(g[1].count, 800_000);
        assert_eq!(g[1].first, Some(100.0));
        assert_eq!(g[1].last, Some(800_099.0));
        assert_eq!(g[1].action, Action::ResetGpu);
    }

    #[test]
    fn nvlink_xids_take_the_configured_action_and_unknown_ones_are_never_light() {
        let log = [
            xid("0000:18:00", 74, 1.0, "NVLINK: Link 3"),
            xid("0000:18:00", 145, 2.0, "NVLink RLW"),
            xid("0000:18:00", 9999, 3.0, "new"),
        ];
        let g = group(&log, &[74], Some(Action::ContactSupport));
        let action = |code| g.iter().find(|x| x.code == code).unwrap().action;
        assert_eq!(action(74), Action::ContactSupport);
        assert_eq!(action(145), Action::ResetGpu);
        assert_eq!(action(9999), Action::ResetGpu);
        assert!(describe(9999).0.contains("NVIDIA's Xid catalog"));
    }

    #[test]
    fn xid_154_says_its_own_action() {
        let log = [xid(
            "0000:18:00",
            154,
            1.0,
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        )];
        assert_eq!(group(&log, &[], None)[0].action, Action::Reboot);
    }
}
