//! `infiniband`: the RDMA ports a job's NCCL will use are up at full rate,
//! with a usable GID for RoCE, clean error counters, and the process may
//! pin enough memory to register buffers.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params, problems_finding,
};
use preflight_facts::infiniband::{self, HcaFilter, Port};
use preflight_facts::limits::{self, Limit};
use preflight_facts::{Facts, Hca};
use preflight_ground::values::{Bytes, format_bytes};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "infiniband",
    scope: crate::Scope::Node,
    area: "network",
    summary: "InfiniBand and RoCE ports (those NCCL_IB_HCA selects) are ACTIVE and LinkUp at the expected rate and link layer (the check's, else the node profile's `rdma`), with the RoCE v2 GID at NCCL_IB_GID_INDEX, error counters under thresholds, IPoIB up and enough locked memory.",
    params: &[
        ParamDoc {
            name: "state",
            ty: "bool",
            default: Some("true"),
            doc: "Every selected port must be ACTIVE and LinkUp, and every HCA NCCL_IB_HCA names present. Turn off in checks that look at one other thing.",
        },
        ParamDoc {
            name: "active_per_gpu",
            ty: "bool",
            default: Some("false"),
            doc: "At least one active selected port per accelerator on the node (GPUDirect RDMA's usual design).",
        },
        ParamDoc {
            name: "expect_active",
            ty: "integer",
            default: Some("unset"),
            doc: "At least this many selected ports must be ACTIVE (often one per GPU). Set, a node without RDMA fails instead of skipping.",
        },
        ParamDoc {
            name: "min_rate",
            ty: "number (Gb/s)",
            default: Some("unset"),
            doc: "Every selected port's rate must be at least this, e.g. 400 for NDR.",
        },
        ParamDoc {
            name: "link_layer",
            ty: "InfiniBand|Ethernet",
            default: Some("(any)"),
            doc: "The link layer every selected port must have (Ethernet for RoCE).",
        },
        ParamDoc {
            name: "gid_index",
            ty: "integer",
            default: Some("$NCCL_IB_GID_INDEX"),
            doc: "RoCE ports: the GID index NCCL will use, which must be populated and of gid_type. Unset and NCCL_IB_GID_INDEX unset: not checked.",
        },
        ParamDoc {
            name: "gid_type",
            ty: "string",
            default: Some("RoCE v2"),
            doc: "The GID type the RoCE GID must have (\"RoCE v2\" routes across subnets; \"IB/RoCE v1\" does not).",
        },
        ParamDoc {
            name: "max_counters",
            ty: "map of counter to integer",
            default: Some("{}"),
            doc: "Error counters (symbol_error, link_downed, port_rcv_errors, ...) and the most each may read.",
        },
        ParamDoc {
            name: "ipoib",
            ty: "bool",
            default: Some("false"),
            doc: "IPoIB interfaces must exist and be up.",
        },
        ParamDoc {
            name: "min_memlock",
            ty: "size or \"unlimited\"",
            default: Some("unset"),
            doc: "The locked-memory limit (ulimit -l) must be unlimited or at least this: RDMA memory registration fails past it.",
        },
    ],
    hint_vars: &["ports", "active", "affected"],
    parse: parse_params::<Infiniband>,
};

fn yes() -> bool {
    true
}

fn roce_v2() -> String {
    "RoCE v2".into()
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Infiniband {
    #[serde(default = "yes")]
    state: bool,
    #[serde(default)]
    active_per_gpu: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expect_active: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    link_layer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gid_index: Option<u32>,
    #[serde(default = "roce_v2")]
    gid_type: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    max_counters: BTreeMap<String, u64>,
    #[serde(default)]
    ipoib: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_memlock: Option<String>,
}

fn memlock_want(text: &str) -> Result<Option<u64>, String> {
    if text.trim() == "unlimited" {
        return Ok(None);
    }
    Bytes::parse(text).map(|b| Some(b.0))
}

impl Params for Infiniband {
    fn validate(&self) -> Result<(), String> {
        if let Some(m) = &self.min_memlock {
            memlock_want(m).map_err(|e| format!("`min_memlock`: {e}"))?;
        }
        if let Some(l) = &self.link_layer
            && l != "InfiniBand"
            && l != "Ethernet"
        {
            return Err(format!(
                "`link_layer` must be InfiniBand or Ethernet, found `{l}`"
            ));
        }
        Ok(())
    }
}

fn port_name(hca: &Hca, port: &Port) -> String {
    format!("{} port {}", hca.name, port.number)
}

impl Infiniband {
    fn gid_index(&self, facts: &Facts) -> Result<Option<u32>, String> {
        if let Some(i) = self.gid_index {
            return Ok(Some(i));
        }
        match facts.env("NCCL_IB_GID_INDEX") {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("NCCL_IB_GID_INDEX=`{v}` is not a GID index")),
        }
    }

    fn memlock(&self, facts: &Facts, problems: &mut Vec<String>) -> Result<(), String> {
        let Some(want_text) = &self.min_memlock else {
            return Ok(());
        };
        let want = memlock_want(want_text)?;
        let Some(limit) = limits::soft_limit_of(facts, "Max locked memory", "memlock")? else {
            problems.push(
                "locked memory limit not configured (no memlock line in /etc/security/limits.conf or limits.d): the default 8 MiB breaks RDMA registration"
                    .into(),
            );
            return Ok(());
        };
        let ok = match want {
            None => limit == Limit::Unlimited,
            Some(bytes) => limit.at_least(bytes),
        };
        if !ok {
            let shown = match limit {
                Limit::Unlimited => "unlimited".to_string(),
                Limit::Value(v) => format_bytes(v),
            };
            problems.push(format!(
                "locked memory is limited to {shown} (ulimit -l), expected {}: RDMA memory registration fails",
                want.map_or("unlimited".to_string(), format_bytes)
            ));
        }
        Ok(())
    }

    /// IPoIB interfaces from the node's interface facts: up, with carrier.
    fn ipoib(&self, facts: &Facts, problems: &mut Vec<String>) -> usize {
        let ipoib: Vec<_> = facts
            .interfaces()
            .iter()
            .filter(|i| i.link_type == "infiniband")
            .collect();
        if ipoib.is_empty() {
            problems.push("no IPoIB interface (no net device of type 32 in /sys/class/net)".into());
        }
        for interface in &ipoib {
            if !interface.is_up() {
                let carrier = match interface.carrier {
                    Some(false) => ", no carrier",
                    _ => "",
                };
                problems.push(format!(
                    "IPoIB interface {} is {}{carrier}",
                    interface.name, interface.operstate
                ));
            }
        }
        ipoib.len()
    }

    fn check(&self, facts: &Facts) -> Result<Finding, String> {
        let hcas = facts.hcas();
        let wanted = facts
            .profile()
            .and_then(|p| Some((p.named(), p.expect.rdma.as_ref()?.ports)));
        if let (true, None, Some((named, ports))) = (hcas.is_empty(), self.expect_active, wanted) {
            return Ok(Finding::fail(format!(
                "no RDMA device (/sys/class/infiniband is empty or absent), where {named} has {ports} active ports"
            )));
        }
        if hcas.is_empty() {
            return Ok(match self.expect_active {
                Some(n) => Finding::fail(format!(
                    "no RDMA device (/sys/class/infiniband is empty or absent), expected {n} active ports"
                ))
                .measured("0")
                .expected(format!(">= {n}")),
                None => Finding::skip("no RDMA device (/sys/class/infiniband is empty or absent)"),
            });
        }
        let mut problems = Vec::new();
        // Whether a problem is NCCL_IB_HCA's.
        let mut about_hca = false;
        let filter = facts.env("NCCL_IB_HCA").map(|v| (v, HcaFilter::parse(v)));
        if let (Some((value, f)), true) = (&filter, self.state)
            && !f.exclude
        {
            for spec in &f.specs {
                let present = hcas.iter().any(|h| {
                    h.ports
                        .iter()
                        .any(|p| f.spec_matches(spec, &h.name, p.number))
                });
                if !present {
                    let what = match spec.port {
                        Some(p) => format!("{}:{p}", spec.name),
                        None => spec.name.clone(),
                    };
                    about_hca = true;
                    problems.push(format!(
                        "NCCL_IB_HCA={value} names {what}, which is not present (present: {})",
                        hcas.iter()
                            .map(|h| h.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
        let all: Vec<(&Hca, &Port)> = hcas
            .iter()
            .flat_map(|h| h.ports.iter().map(move |p| (h, p)))
            .collect();
        let is_selected = |h: &Hca, p: &Port| {
            filter
                .as_ref()
                .is_none_or(|(_, f)| f.selects(&h.name, p.number))
        };
        let selected: Vec<(&Hca, &Port)> = all
            .iter()
            .copied()
            .filter(|(h, p)| is_selected(h, p))
            .collect();
        if let (Some((value, _)), true) = (&filter, selected.is_empty() && self.state) {
            about_hca = true;
            problems.push(format!("NCCL_IB_HCA={value} selects no port on this node"));
        }
        let gid_index = match self.gid_index(facts) {
            Ok(index) => index,
            Err(e) => return Ok(Finding::error(e).about_variables(["NCCL_IB_GID_INDEX"])),
        };
        let class_dir = facts.host_path("/sys/class/infiniband");
        // An attribute that cannot be read is not a down port: the check
        // cannot say, and says which file.
        let unreadable: Vec<String> = all
            .iter()
            .flat_map(|(h, p)| {
                [("state", &p.state), ("phys_state", &p.phys_state)]
                    .into_iter()
                    .filter(|(_, value)| value.is_empty())
                    .map(move |(file, _)| {
                        format!("/sys/class/infiniband/{}/ports/{}/{file}", h.name, p.number)
                    })
            })
            .collect();
        if self.state && !unreadable.is_empty() {
            return Err(format!("unreadable or empty: {}", unreadable.join(", ")));
        }
        // The node's profile sets the rate, link layer and count of the
        // fabric's ports where the check does not; it speaks of the ports
        // of its link layer only (a storage NIC on another is not its).
        let profile = facts
            .profile()
            .and_then(|p| Some((p.named(), p.expect.rdma.clone()?)));
        let of_profile = |port: &Port| {
            profile.as_ref().is_some_and(|(_, r)| {
                r.link_layer
                    .as_deref()
                    .is_none_or(|l| port.link_layer.eq_ignore_ascii_case(l))
            })
        };
        let mut profile_active = 0u32;
        let mut profile_slow: Vec<String> = Vec::new();
        let mut active = Vec::new();
        // A down port or a failing link is the node's problem whether or
        // not this job's NCCL_IB_HCA selects it; only a port an operator
        // disabled on purpose is left alone.
        for (hca, port) in &all {
            let name = port_name(hca, port);
            let chosen = is_selected(hca, port);
            let aside = if chosen {
                ""
            } else {
                ", not selected by NCCL_IB_HCA"
            };
            let up = port.state == "ACTIVE" && port.phys_state == "LinkUp";
            if up && chosen {
                active.push(name.clone());
            }
            if up
                && of_profile(port)
                && let Some((_, r)) = &profile
                && port.rate.is_some_and(|x| x >= r.rate)
            {
                profile_active += 1;
            }
            if !up && self.state && port.phys_state != "Disabled" {
                let bus = hca
                    .pci
                    .as_deref()
                    .map(|b| format!(" ({b}{aside})"))
                    .unwrap_or_default();
                problems.push(format!(
                    "{name}{bus}: state {}, phys_state {}",
                    or_unknown(&port.state),
                    or_unknown(&port.phys_state)
                ));
            }
            for (counter, max) in &self.max_counters {
                if let Some(v) = port.counters.get(counter).filter(|v| *v > max) {
                    problems.push(format!("{name}: {counter} is {v} (at most {max})"));
                }
            }
            if !chosen {
                continue;
            }
            if let Some(min) = self.min_rate
                && up
                && port.rate.is_none_or(|r| r < min)
            {
                problems.push(format!(
                    "{name}: rate {}, expected at least {min} Gb/sec",
                    or_unknown(&port.rate_text)
                ));
            }
            if let (None, Some((named, r)), true) = (self.min_rate, &profile, of_profile(port))
                && up
                && port.rate.is_none_or(|x| x < r.rate)
            {
                // Named only when too few ports run at the rate, as the
                // profile's own comparison does.
                profile_slow.push(format!(
                    "{name}: rate {}, where {named} has {} Gb/sec",
                    or_unknown(&port.rate_text),
                    r.rate
                ));
            }
            if let Some(want) = &self.link_layer
                && &port.link_layer != want
            {
                problems.push(format!(
                    "{name}: link layer {}, expected {want}",
                    or_unknown(&port.link_layer)
                ));
            }
            if let (Some(index), "Ethernet") = (gid_index, port.link_layer.as_str()) {
                let (gid, ty) = infiniband::gid(&class_dir, &hca.name, port.number, index);
                match (gid, ty) {
                    (None, _) => problems.push(format!(
                        "{name}: GID index {index} is empty (no address on the RoCE interface?)"
                    )),
                    (Some(_), Some(t)) if t != self.gid_type => problems.push(format!(
                        "{name}: GID index {index} is {t}, expected {}",
                        self.gid_type
                    )),
                    (Some(_), None) => problems.push(format!(
                        "{name}: GID index {index} has no type in gid_attrs/types"
                    )),
                    _ => {}
                }
            }
        }
        let affected: Vec<String> = all
            .iter()
            .map(|(h, p)| port_name(h, p))
            .filter(|name| problems.iter().any(|p| p.starts_with(name.as_str())))
            .collect();
        let per_gpu = self
            .active_per_gpu
            .then(|| facts.accelerators().len() as u32);
        if let Some(want) = self.expect_active.into_iter().chain(per_gpu).max()
            && (active.len() as u32) < want
        {
            let why = if per_gpu == Some(want) {
                format!(" (one per accelerator: {want} on the bus)")
            } else {
                String::new()
            };
            problems.push(format!(
                "{} active port{}, expected at least {want}{why}",
                active.len(),
                if active.len() == 1 { "" } else { "s" }
            ));
        }
        if let (None, Some((named, r))) = (self.expect_active, &profile)
            && profile_active < r.ports as u32
        {
            problems.append(&mut profile_slow);
            problems.push(format!(
                "{profile_active} {}port{} active at {} Gb/sec, where {named} has {}",
                r.link_layer
                    .as_deref()
                    .map(|l| format!("{l} "))
                    .unwrap_or_default(),
                if profile_active == 1 { "" } else { "s" },
                r.rate,
                r.ports
            ));
        }
        let ipoib = if self.ipoib {
            self.ipoib(facts, &mut problems)
        } else {
            0
        };
        self.memlock(facts, &mut problems)?;
        let finding = if problems.is_empty() {
            let mut msg = format!(
                "{} of {} port{} active",
                active.len(),
                selected.len(),
                if selected.len() == 1 { "" } else { "s" }
            );
            if let Some((_, port)) = selected.first() {
                msg.push_str(&format!(", {} {}", port.link_layer, port.rate_text));
            }
            if self.ipoib {
                msg.push_str(&format!(", {ipoib} IPoIB up"));
            }
            Finding::pass(msg)
        } else {
            problems_finding(&problems).about_variables(about_hca.then_some("NCCL_IB_HCA"))
        };
        let finding = finding
            .measured(format!("{} active", active.len()))
            .var("active", active.join(", "))
            .var(
                "affected",
                if affected.is_empty() {
                    "none".to_string()
                } else {
                    affected.join(", ")
                },
            )
            .var(
                "ports",
                selected
                    .iter()
                    .map(|(h, p)| port_name(h, p))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
        Ok(match self.expect_active {
            Some(n) => finding.expected(format!(">= {n} active")),
            None => finding,
        })
    }
}

fn or_unknown(text: &str) -> &str {
    if text.is_empty() { "unknown" } else { text }
}

impl Probe for Infiniband {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts).unwrap_or_else(Finding::error))
    }
}
