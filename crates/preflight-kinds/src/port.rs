//! `port`: the rendezvous ports can be bound on this node. When one is
//! taken, names the process that holds it: a leftover rank of a crashed
//! job is the usual culprit, and "address already in use" on rank 0 is all
//! the job itself says.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::port_holder::Ours;
use super::ports::{PortRange, with_env_port};
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params};
use preflight_facts::Facts;
use preflight_facts::ports::Bind;
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "port",
    scope: crate::Scope::Node,
    area: "network",
    summary: "TCP ports (MASTER_PORT, rendezvous ranges) can be bound on this node; a taken port names its holder's pid and command line.",
    params: &[
        ParamDoc {
            name: "ports",
            ty: "list of ports or ranges",
            default: Some("[]"),
            doc: "Ports to bind, e.g. [29500, \"29500-29510\"].",
        },
        ParamDoc {
            name: "port_var",
            ty: "string",
            default: Some("unset"),
            doc: "Also bind the port in this environment variable (e.g. MASTER_PORT), when set.",
        },
        ParamDoc {
            name: "address",
            ty: "IP address",
            default: Some("0.0.0.0"),
            doc: "The address to bind, as the job would (PyTorch's TCPStore binds every address).",
        },
    ],
    hint_vars: &["ports", "holder", "pid"],
    parse: parse_params::<PortCheck>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PortCheck {
    #[serde(default)]
    ports: Vec<PortRange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    port_var: Option<String>,
    #[serde(default = "any_address")]
    address: IpAddr,
}

fn any_address() -> IpAddr {
    IpAddr::from([0, 0, 0, 0])
}

impl Params for PortCheck {
    fn validate(&self) -> Result<(), String> {
        if self.ports.is_empty() && self.port_var.is_none() {
            return Err("give `ports`, `port_var`, or both".into());
        }
        let count: usize = self
            .ports
            .iter()
            .map(|r| r.last as usize - r.first as usize + 1)
            .sum();
        if count > 4096 {
            return Err(format!(
                "`ports`: {count} ports is too many to probe; list at most 4096"
            ));
        }
        Ok(())
    }
}

impl PortCheck {
    fn check(&self, facts: &Facts) -> Finding {
        let env_value = self.port_var.as_deref().and_then(|v| facts.env(v));
        if let (Some(var), Some(value)) = (&self.port_var, env_value)
            && !matches!(value.trim().parse::<u16>(), Ok(p) if p > 0)
        {
            return Finding::fail(format!("{var}=`{value}` is not a port number (1-65535)"))
                .var("ports", value.to_string())
                .about_variables([var.clone()]);
        }
        let ports = with_env_port(&self.ports, env_value);
        if ports.is_empty() {
            return Finding::skip(format!(
                "{} is not set and no ports are listed",
                self.port_var.as_deref().unwrap_or("the port variable")
            ));
        }
        let mut taken = Vec::new();
        // Ports this job's own launcher holds: said, not failed.
        let mut launchers: Vec<String> = Vec::new();
        let mut first_holder: Option<(String, String)> = None;
        let mut held: Vec<u32> = Vec::new();
        let binds: Vec<(u16, Bind)> = ports
            .iter()
            .map(|&port| (port, facts.ports.bind(SocketAddr::new(self.address, port))))
            .collect();
        // Every taken port's holders in one pass over /proc.
        let in_use: Vec<u16> = binds
            .iter()
            .filter(|(_, b)| matches!(b, Bind::InUse))
            .map(|(p, _)| *p)
            .collect();
        let mut holders = super::port_holder::holders_of(facts, &in_use).into_iter();
        for (port, bind) in binds {
            let address = SocketAddr::new(self.address, port);
            match bind {
                Bind::Free => {}
                Bind::InUse => {
                    let found = holders
                        .next()
                        .map_or_else(|| Ok(Vec::new()), |(_, found)| found);
                    let who = match found {
                        Ok(list) if list.is_empty() => {
                            "held by a socket not visible in /proc/net/tcp (another network namespace?)".to_string()
                        }
                        // This job holds it: preflight's own rendezvous (rank
                        // 0, a sibling rank, the node agent), or the launcher
                        // that started this rank (torchrun's agent listens on
                        // MASTER_PORT for its store). That is the port
                        // working, not a stranger on it.
                        Ok(list)
                            if list
                                .iter()
                                .all(|h| super::port_holder::this_jobs(facts, h).is_some()) =>
                        {
                            for h in &list {
                                if let Some(Ours::Launcher(who)) =
                                    super::port_holder::this_jobs(facts, h)
                                {
                                    launchers.push(format!(
                                        "{port} held by this job's launcher, {who}"
                                    ));
                                }
                            }
                            continue;
                        }
                        Ok(list) => {
                            if first_holder.is_none() {
                                first_holder = Some((list[0].describe(), list[0].pid.to_string()));
                            }
                            held.extend(list.iter().map(|h| h.pid));
                            format!(
                                "held by {}",
                                list.iter()
                                    .map(|h| h.describe())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        }
                        Err(reason) => reason,
                    };
                    taken.push(format!("{port} ({who})"));
                }
                Bind::NotAvailable => {
                    return Finding::fail(format!(
                        "cannot bind {address}: {} is not an address of this node",
                        self.address
                    ))
                    .var("ports", port.to_string());
                }
                Bind::Failed(e) => taken.push(format!("{port} (cannot bind: {e})")),
            }
        }
        let listed = super::ports::describe(&ports);
        if taken.is_empty() {
            let message = if launchers.is_empty() {
                format!("{listed} free on {}", self.address)
            } else {
                format!(
                    "{listed} free on {} or this job's: {}",
                    self.address,
                    launchers.join("; ")
                )
            };
            return Finding::pass(message).measured("free").var("ports", listed);
        }
        let (holder, pid) = first_holder.unwrap_or_else(|| ("unknown".into(), "unknown".into()));
        Finding::fail(format!(
            "{} of {} port(s) on {} taken: {}",
            taken.len(),
            ports.len(),
            self.address,
            taken.join("; ")
        ))
        .measured(format!("{} taken", taken.len()))
        .expected("free")
        .var(
            "ports",
            taken
                .iter()
                .map(|t| t.split(' ').next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join(", "),
        )
        .var("holder", holder)
        .var("pid", pid)
        .held_by(held)
    }
}

impl Probe for PortCheck {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}
