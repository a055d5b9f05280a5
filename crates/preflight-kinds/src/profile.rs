//! `profile`: this node against the profile that applies to it (the one
//! given with `--profile`, else the shipped one its accelerators match):
//! each difference named by its PCI address, port or count, and the
//! profile named. A node that matches no profile is not judged here: it
//! is compared with its peers in the cluster stage, as before.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Probe, ProbeFuture, parse_params, problems_finding};
use preflight_facts::Facts;
use preflight_facts::profile::{self, Inventory};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "profile",
    scope: crate::Scope::Node,
    area: "hardware",
    summary: "This node against its profile (`--profile FILE`, else the shipped profile its accelerators match: 8x H100, H200 or A100 SXM, 8x MI300X, 8x Gaudi 2 or 3, 4x Max 1550): the accelerators' count and kind, each one usable, their PCIe links, the RDMA ports' state, rate and link layer, the memory. Each difference names the device, port or count, and the profile. A node no profile matches is skipped: its peers are its measure.",
    params: &[ParamDoc {
        name: "speed",
        ty: "bool",
        default: Some("true"),
        doc: "Compare the PCIe links' generation as well as their width. Turn off for GPUs that lower their link speed when idle.",
    }],
    hint_vars: &["profile"],
    parse: parse_params::<ProfileCheck>,
};

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileCheck {
    #[serde(default = "yes")]
    speed: bool,
}

impl super::Params for ProfileCheck {}

fn judge(facts: &Facts, speed: bool) -> Finding {
    let node = Inventory::of(facts);
    let Some(p) = facts.profile() else {
        let found: Vec<String> = node
            .accelerators
            .iter()
            .map(|a| format!("{} {:04x}", a.vendor.name(), a.device))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        return Finding::skip(if found.is_empty() {
            "no accelerator, so no profile: this node is compared with its peers".to_string()
        } else {
            format!(
                "no profile matches {} accelerators ({}): this node is compared with its peers; `preflight baseline capture` writes one",
                node.accelerators.len(),
                found.join(", ")
            )
        });
    };
    let differences = profile::diff(p, &node, speed);
    let named = p.named();
    if differences.is_empty() {
        let what = if p.description.is_empty() {
            String::new()
        } else {
            format!(": {}", p.description)
        };
        return Finding::pass(format!("matches {named}{what}"))
            .measured("matches")
            .var("profile", named);
    }
    let mut said = vec![format!("against {named}: {}", differences[0])];
    said.extend(differences[1..].iter().cloned());
    problems_finding(&said)
        .measured(format!("{} differences", differences.len()))
        .expected(named.clone())
        .var("profile", named)
}

impl Probe for ProfileCheck {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            let speed = self.speed;
            tokio::task::spawn_blocking(move || judge(&facts, speed))
                .await
                .unwrap_or_else(|e| Finding::error(format!("probe crashed: {e}")))
        })
    }
}
