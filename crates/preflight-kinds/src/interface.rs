//! `interface`: the node's own name and the rendezvous host resolve, the
//! hostname does not resolve to loopback in a multi-node job (Gloo binds
//! to it and peers get "connect [127.0.1.1] refused"), and the interface
//! the kernel routes to MASTER_ADDR is up, has carrier, and is the one that
//! NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME select.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ifname_spec::{Spec, Syntax};
use super::resolve::resolve_on_node;
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params};
use preflight_facts::{Facts, Interface};
use preflight_ground::values::Span;
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "interface",
    scope: crate::Scope::Node,
    area: "network",
    summary: "The hostname and MASTER_ADDR resolve (not to loopback in a multi-node job); the interface routed to MASTER_ADDR is up with carrier, adequate MTU and speed, and agrees with NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME.",
    params: &[
        ParamDoc {
            name: "target_var",
            ty: "string",
            default: Some("MASTER_ADDR"),
            doc: "The variable holding the rendezvous host whose route is checked.",
        },
        ParamDoc {
            name: "target",
            ty: "string",
            default: Some("unset"),
            doc: "A fixed host to route to instead of the variable.",
        },
        ParamDoc {
            name: "check_hostname",
            ty: "bool",
            default: Some("true"),
            doc: "Check that this node's hostname resolves, and not to loopback in a multi-node job.",
        },
        ParamDoc {
            name: "check_route",
            ty: "bool",
            default: Some("true"),
            doc: "Check the route to the target, its interface, and the socket-interface variables.",
        },
        ParamDoc {
            name: "min_mtu",
            ty: "integer",
            default: Some("unset"),
            doc: "The routed interface's MTU must be at least this.",
        },
        ParamDoc {
            name: "min_speed_mbps",
            ty: "integer",
            default: Some("unset"),
            doc: "The routed interface's link speed (Mbit/s) must be at least this, where it reports one.",
        },
        ParamDoc {
            name: "resolve_timeout",
            ty: "duration",
            default: Some("3s"),
            doc: "How long name resolution may take.",
        },
    ],
    hint_vars: &["interface", "source", "suggest", "problem", "remedy"],
    parse: parse_params::<InterfaceCheck>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceCheck {
    #[serde(default = "master_addr")]
    target_var: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    #[serde(default = "yes")]
    check_hostname: bool,
    #[serde(default = "yes")]
    check_route: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_speed_mbps: Option<u64>,
    #[serde(default = "default_resolve_timeout")]
    resolve_timeout: Span,
}

fn master_addr() -> String {
    "MASTER_ADDR".into()
}

fn yes() -> bool {
    true
}

fn default_resolve_timeout() -> Span {
    Span(Duration::from_secs(3))
}

impl Params for InterfaceCheck {
    fn validate(&self) -> Result<(), String> {
        if !self.check_hostname && !self.check_route {
            return Err(
                "`check_hostname` and `check_route` are both false: nothing to check".into(),
            );
        }
        Ok(())
    }
}

/// The source address the kernel would use towards `target`: a connected
/// UDP socket sends nothing but makes the kernel pick route and source.
pub fn source_address(target: IpAddr) -> std::io::Result<IpAddr> {
    let bind: SocketAddr = if target.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let socket = UdpSocket::bind(bind)?;
    socket.connect(SocketAddr::new(target, 9))?;
    Ok(socket.local_addr()?.ip())
}

/// The interface that carries this node's route to `host`, when the name
/// resolves to an address off this node and the route is this machine's
/// own (not a tree's under --root, whose routes nobody can ask).
pub fn route_interface(facts: &Facts, host: &str) -> Option<String> {
    if facts.root != std::path::Path::new("/") {
        return None;
    }
    let ips = resolve_on_node(facts, host, std::time::Duration::from_secs(2)).ok()?;
    let target = *ips.first()?;
    if target.is_loopback() {
        return None;
    }
    let source = source_address(target).ok()?;
    facts
        .interfaces()
        .iter()
        .find(|i| i.addresses.contains(&source) && !i.is_loopback())
        .map(|i| i.name.clone())
}

fn is_loopback(ip: &IpAddr) -> bool {
    ip.is_loopback()
}

/// Problems are collected so that one run names all of them.
struct Report {
    problems: Vec<String>,
    notes: Vec<String>,
    interface: Option<String>,
    source: Option<String>,
    suggest: Option<String>,
    /// The fix when the target itself is the problem (a name that does
    /// not resolve, one that resolves to loopback): the route's advice
    /// would not apply.
    remedy: Option<String>,
    /// What a name resolved to, where that is the finding (the
    /// hostname's first address; a target on loopback).
    resolved: Option<String>,
    /// The job's variables the problems are about.
    variables: Vec<String>,
    /// Host names found resolving to loopback first.
    loopback_hostnames: Vec<String>,
}

impl InterfaceCheck {
    fn check(&self, facts: &Facts) -> Finding {
        let limit = self.resolve_timeout.0;
        let mut r = Report {
            remedy: None,
            resolved: None,
            problems: Vec::new(),
            notes: Vec::new(),
            interface: None,
            source: None,
            suggest: None,
            variables: Vec::new(),
            loopback_hostnames: Vec::new(),
        };
        let multi_node = facts.launch().multi_node();

        if self.check_hostname {
            let host = facts.hostname().to_string();
            match resolve_on_node(facts, &host, limit) {
                Err(e) => r.problems.push(format!("hostname {host}: {e}")),
                Ok(ips) => {
                    r.resolved = Some(ips[0].to_string());
                    let shown = ips
                        .iter()
                        .map(IpAddr::to_string)
                        .collect::<Vec<_>>()
                        .join(", ");
                    // Gloo binds to the first address the hostname
                    // resolves to, so a loopback first is enough to break it.
                    if is_loopback(&ips[0]) {
                        let gloo_pinned = facts.env("GLOO_SOCKET_IFNAME").is_some();
                        if multi_node && !gloo_pinned {
                            let only = if ips.iter().all(is_loopback) {
                                "only"
                            } else {
                                "first"
                            };
                            r.problems.push(format!(
                                "hostname {host} resolves {only} to loopback ({shown}): Gloo binds there and peers get `connect [{}] refused`",
                                ips[0]
                            ));
                            r.loopback_hostnames.push(host.clone());
                        } else {
                            r.notes
                                .push(format!("hostname {host} -> {shown} (loopback)"));
                        }
                    } else {
                        r.notes.push(format!("hostname {host} -> {shown}"));
                    }
                }
            }
        }

        let target = match &self.target {
            Some(t) => Some((t.clone(), "target".to_string())),
            None => facts
                .env(&self.target_var)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (v.trim().to_string(), self.target_var.clone())),
        };
        match target {
            _ if !self.check_route => {}
            None => r
                .notes
                .push(format!("{} is not set: no route to check", self.target_var)),
            Some((host, label)) => self.check_route(facts, &host, &label, multi_node, &mut r),
        }
        let about = |f: Finding, r: &Report| {
            let mut f = f.about_variables(r.variables.iter().cloned());
            for name in &r.loopback_hostnames {
                f = f.loopback_hostname(name.clone());
            }
            f
        };

        let vars = |f: Finding, r: &Report| {
            f.var(
                "interface",
                r.interface.clone().unwrap_or_else(|| "unknown".into()),
            )
            .var(
                "source",
                r.source.clone().unwrap_or_else(|| "unknown".into()),
            )
            .var(
                "suggest",
                r.suggest.clone().unwrap_or_else(|| "unknown".into()),
            )
            .var("problem", r.problems.join("; "))
            .var(
                "remedy",
                r.remedy.clone().unwrap_or_else(|| "unknown".into()),
            )
        };
        // What was measured: the route's interface where a route was
        // asked for, else what the hostname resolves to.
        let measured = if self.check_route {
            r.interface
                .clone()
                .or(r.resolved.clone())
                .unwrap_or_else(|| "no route".into())
        } else {
            r.resolved.clone().unwrap_or_else(|| "unresolved".into())
        };
        if r.problems.is_empty() {
            vars(Finding::pass(r.notes.join("; ")), &r).measured(measured)
        } else {
            about(vars(Finding::fail(r.problems.join("; ")), &r), &r).measured(measured)
        }
    }

    fn check_route(
        &self,
        facts: &Facts,
        host: &str,
        label: &str,
        multi_node: bool,
        r: &mut Report,
    ) {
        // A problem with the target itself is about its variable, when a
        // variable (not the check's own `target`) gave it.
        let about_target = |r: &mut Report| {
            if label == self.target_var {
                r.variables.push(label.to_string());
            }
        };
        let ips = match resolve_on_node(facts, host, self.resolve_timeout.0) {
            Ok(ips) => ips,
            Err(e) => {
                r.problems.push(format!("{label}={host}: {e}"));
                about_target(r);
                r.remedy = Some(format!(
                    "Add `{host}` to DNS or /etc/hosts on every node, or set {label} to rank 0's address"
                ));
                return;
            }
        };
        let target = ips[0];
        if target.is_loopback() {
            if multi_node {
                r.problems.push(format!(
                    "{label}={host} is a loopback address ({target}) in a multi-node job: other nodes cannot reach it"
                ));
                about_target(r);
                r.remedy = Some(format!(
                    "`{host}` resolves to {target} on this node: set {label} to rank 0's cluster address on every rank, or map rank 0's hostname to that address in /etc/hosts (Debian maps it to 127.0.1.1)"
                ));
                r.resolved = Some(format!("{target} (loopback)"));
                return;
            } else {
                r.notes
                    .push(format!("{label}={host} is loopback (single node)"));
            }
            r.interface = Some("lo".into());
            return;
        }
        let source = match source_address(target) {
            Ok(s) => s,
            Err(e) => {
                r.problems.push(format!(
                    "no route from this node to {label}={host} ({target}): {e}"
                ));
                about_target(r);
                return;
            }
        };
        r.source = Some(source.to_string());
        let interfaces = facts.interfaces();
        let Some(interface) = interfaces.iter().find(|i| i.addresses.contains(&source)) else {
            r.problems.push(format!(
                "the route to {target} uses source {source}, which no interface of this node carries"
            ));
            return;
        };
        r.interface = Some(interface.name.clone());
        r.suggest = Some(interface.name.clone());
        r.notes.push(format!(
            "{label}={host} ({target}) via {} from {source}",
            interface.describe()
        ));
        if !interface.is_up() {
            r.problems.push(format!(
                "the route to {label} ({target}) uses {}, which is not up",
                interface.describe()
            ));
        }
        if let (Some(min), Some(mtu)) = (self.min_mtu, interface.mtu)
            && mtu < min
        {
            r.problems
                .push(format!("{} has MTU {mtu}, below {min}", interface.name));
        }
        if let (Some(min), Some(speed)) = (self.min_speed_mbps, interface.speed_mbps)
            && speed < min
        {
            r.problems.push(format!(
                "{} runs at {speed} Mb/s, below {min} Mb/s",
                interface.name
            ));
        }
        if interface.is_loopback() {
            return;
        }
        for var in ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"] {
            if let Some(value) = facts.env(var) {
                agree(var, value, interface, interfaces, target, r);
            }
        }
    }
}

/// Whether the variable selects the routed interface; when not, says which
/// interface it does select and what to set instead.
fn agree(
    var: &str,
    value: &str,
    routed: &Interface,
    interfaces: &[Interface],
    target: IpAddr,
    r: &mut Report,
) {
    let Some(syntax) = Syntax::of(var) else {
        return;
    };
    let spec = match Spec::parse(var, syntax, value) {
        Ok(spec) => spec,
        Err(e) => {
            r.problems.push(e);
            r.variables.push(var.to_string());
            return;
        }
    };
    if spec.selects(&routed.name) {
        return;
    }
    r.variables.push(var.to_string());
    let chosen: Vec<String> = spec
        .selected(interfaces)
        .iter()
        .map(|i| i.name.clone())
        .collect();
    let uses = if chosen.is_empty() {
        "no interface of this node".to_string()
    } else {
        chosen.join(", ")
    };
    r.problems.push(format!(
        "{var}=`{value}` selects {uses}, but the route to {target} goes through {}: set {var}={}",
        routed.name, routed.name
    ));
}

impl Probe for InterfaceCheck {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}
