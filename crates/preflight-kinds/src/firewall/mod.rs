//! `firewall`: reads the active packet filter and reports rules or default
//! policies that would drop or reject new TCP connections to the
//! rendezvous ports or between the cluster's addresses, quoting the rule.
//! nft first (`nft -j list ruleset`), iptables-save/ip6tables-save where
//! nft is absent. No tool is a skip, with the reason, and so is a user
//! without the privilege to read the ruleset (root or CAP_NET_ADMIN): the
//! job's user cannot tell, and the node's root health check can. Any other
//! failure to read is an error: an unreadable firewall is never a pass.

mod iptables;
mod nft;
mod ruleset;

use std::net::IpAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ports::{PortRange, describe, with_env_port};
use super::resolve::resolve;
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use preflight_facts::Facts;
use preflight_ground::values::Span;
use preflight_result::Finding;
use ruleset::{Block, Family, Hook, Packet, Table, blocks};

pub const KIND: KindInfo = KindInfo {
    name: "firewall",
    scope: crate::Scope::Node,
    area: "network",
    summary: "The active nftables/iptables ruleset does not drop or reject TCP to the rendezvous ports or between cluster addresses; blocking rules are quoted.",
    params: &[
        ParamDoc {
            name: "ports",
            ty: "list of ports or ranges",
            default: Some("[\"29500-29510\"]"),
            doc: "TCP ports that peers must reach on this node.",
        },
        ParamDoc {
            name: "port_var",
            ty: "string",
            default: Some("MASTER_PORT"),
            doc: "Also check the port in this variable, when set.",
        },
        ParamDoc {
            name: "probe_ports_var",
            ty: "string",
            default: Some("PREFLIGHT_PROBE_PORTS"),
            doc: "Also check the ports in this variable, when set: the range the cluster stage's reachability probes listen on (a range over 1024 ports is checked at its two ends).",
        },
        ParamDoc {
            name: "peers",
            ty: "list of strings",
            default: Some("[]"),
            doc: "Cluster addresses or names: rules about particular hosts are judged against these, and outgoing connections to them are checked too.",
        },
        ParamDoc {
            name: "peers_var",
            ty: "string",
            default: Some("MASTER_ADDR"),
            doc: "Also count the host in this variable as a peer, when set.",
        },
        ParamDoc {
            name: "data_ports",
            ty: "bool",
            default: Some("true"),
            doc: "Also check a port of the kernel's ephemeral range, where NCCL and Gloo open their data connections between nodes.",
        },
        ParamDoc {
            name: "backend",
            ty: "auto|nft|iptables",
            default: Some("auto"),
            doc: "Which tool reads the ruleset: auto uses nft where installed, else iptables-save and ip6tables-save.",
        },
        ParamDoc {
            name: "tool_timeout",
            ty: "duration",
            default: Some("5s"),
            doc: "How long each tool may run.",
        },
    ],
    hint_vars: &["rule", "ports", "tool"],
    parse: parse_params::<Firewall>,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    #[default]
    Auto,
    Nft,
    Iptables,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Firewall {
    #[serde(default = "default_ports")]
    ports: Vec<PortRange>,
    #[serde(default = "master_port")]
    port_var: String,
    #[serde(default = "probe_ports_var")]
    probe_ports_var: String,
    #[serde(default)]
    peers: Vec<String>,
    #[serde(default = "master_addr")]
    peers_var: String,
    #[serde(default = "yes")]
    data_ports: bool,
    #[serde(default)]
    backend: Backend,
    #[serde(default = "default_tool_timeout")]
    tool_timeout: Span,
}

fn default_ports() -> Vec<PortRange> {
    vec![PortRange {
        first: 29500,
        last: 29510,
    }]
}
fn master_port() -> String {
    "MASTER_PORT".into()
}
fn probe_ports_var() -> String {
    super::ports::PROBE_PORTS_VAR.into()
}
fn master_addr() -> String {
    "MASTER_ADDR".into()
}
fn yes() -> bool {
    true
}
fn default_tool_timeout() -> Span {
    Span(Duration::from_secs(5))
}

impl Params for Firewall {
    fn validate(&self) -> Result<(), String> {
        let count: usize = self
            .ports
            .iter()
            .map(|r| r.last as usize - r.first as usize + 1)
            .sum();
        if count > 4096 {
            return Err(format!(
                "`ports`: {count} ports is too many; list at most 4096"
            ));
        }
        Ok(())
    }
}

enum ToolError {
    Missing,
    /// This user may not read the ruleset: the command and what it said.
    Denied(String),
    Failed(String),
}

/// Reading a ruleset is a privileged operation: root or CAP_NET_ADMIN.
const PRIVILEGE: &str = "root or CAP_NET_ADMIN";

/// A tool's stderr on one line: it goes into a check's message, under the
/// check, not as lines of its own.
fn one_line(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

async fn run_tool(program: &str, args: &[&str], limit: Duration) -> Result<String, ToolError> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ToolError::Missing),
        Err(e) => return Err(ToolError::Failed(format!("cannot run {program}: {e}"))),
    };
    let shown = format!("{program} {}", args.join(" "));
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Err(_) => Err(ToolError::Failed(format!(
            "`{shown}` did not finish within {}",
            preflight_ground::values::format_duration(limit)
        ))),
        Ok(Err(e)) => Err(ToolError::Failed(format!("`{shown}`: {e}"))),
        Ok(Ok(out)) if !out.status.success() => {
            let err = one_line(&out.stderr);
            if [
                "Operation not permitted",
                "Permission denied",
                "must be root",
            ]
            .iter()
            .any(|s| err.contains(s))
                // Root that may not read it (a container without
                // CAP_NET_ADMIN) is the node's problem, not a user's limit.
                && !nix::unistd::geteuid().is_root()
            {
                Err(ToolError::Denied(format!("`{shown}` ({err})")))
            } else {
                Err(ToolError::Failed(format!(
                    "`{shown}` failed ({}): {err}",
                    out.status
                )))
            }
        }
        Ok(Ok(out)) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
    }
}

impl Firewall {
    /// The ruleset and the tool that read it; `Err` is the finding to report.
    async fn ruleset(&self) -> Result<(Vec<Table>, &'static str), Finding> {
        let limit = self.tool_timeout.0;
        if self.backend != Backend::Iptables {
            match run_tool("nft", &["-j", "list", "ruleset"], limit).await {
                Ok(json) => {
                    let listing = run_tool("nft", &["-a", "list", "ruleset"], limit)
                        .await
                        .unwrap_or_default();
                    let tables = nft::parse(&json, &listing).map_err(Finding::error)?;
                    // iptables-nft stores matches nft cannot show (xt
                    // multiport, comment...): read those tables back in
                    // iptables' own terms, where it is installed.
                    if json.contains("\"xt\"")
                        && let Ok(translated) = self.iptables_tables(limit).await
                    {
                        let mut tables: Vec<Table> = tables
                            .into_iter()
                            .filter(|t| {
                                !matches!(t.label.as_str(), "table ip filter" | "table ip6 filter")
                            })
                            .collect();
                        tables.extend(translated);
                        return Ok((tables, "nft + iptables-save"));
                    }
                    return Ok((tables, "nft"));
                }
                Err(ToolError::Failed(e)) => return Err(Finding::error(e)),
                Err(ToolError::Denied(e)) => {
                    return Err(super::needs_privilege(
                        &format!("reading the ruleset {e}"),
                        PRIVILEGE,
                    ));
                }
                Err(ToolError::Missing) if self.backend == Backend::Nft => {
                    return Err(Finding::skip(
                        "nft is not installed: cannot read the ruleset",
                    ));
                }
                Err(ToolError::Missing) => {}
            }
        }
        match self.iptables_tables(limit).await {
            Ok(tables) => Ok((tables, "iptables-save")),
            Err(ToolError::Missing) => Err(Finding::skip(
                "neither nft nor iptables-save is installed: cannot read the firewall ruleset",
            )),
            Err(ToolError::Failed(e)) => Err(Finding::error(e)),
            Err(ToolError::Denied(e)) => Err(super::needs_privilege(
                &format!("reading the ruleset {e}"),
                PRIVILEGE,
            )),
        }
    }

    /// Rules loaded through the legacy (x_tables) backend are invisible to
    /// nft. The kernel lists their tables in /proc/net/ip{,6}_tables_names
    /// only when some exist, so most hosts pay nothing for this.
    async fn legacy_tables(&self, facts: &Facts) -> Result<Vec<Table>, Finding> {
        let mut tables = Vec::new();
        for (names, tool, family, label) in [
            (
                "/proc/net/ip_tables_names",
                "iptables-legacy-save",
                Family::V4,
                "iptables-legacy",
            ),
            (
                "/proc/net/ip6_tables_names",
                "ip6tables-legacy-save",
                Family::V6,
                "ip6tables-legacy",
            ),
        ] {
            let listed = std::fs::read_to_string(facts.host_path(names)).unwrap_or_default();
            if !listed.lines().any(|l| l.trim() == "filter") {
                continue;
            }
            match run_tool(tool, &[], self.tool_timeout.0).await {
                Ok(dump) => tables.extend(iptables::parse(&dump, family, label)),
                Err(ToolError::Missing) => {
                    return Err(Finding::error(format!(
                        "legacy iptables rules are loaded ({names}) but {tool} is not installed to read them"
                    )));
                }
                Err(ToolError::Failed(e)) => return Err(Finding::error(e)),
                Err(ToolError::Denied(e)) => {
                    return Err(super::needs_privilege(
                        &format!("reading the legacy iptables rules {e}"),
                        PRIVILEGE,
                    ));
                }
            }
        }
        Ok(tables)
    }

    async fn iptables_tables(&self, limit: Duration) -> Result<Vec<Table>, ToolError> {
        let mut tables = Vec::new();
        let mut found = false;
        for (tool, family) in [
            ("iptables-save", Family::V4),
            ("ip6tables-save", Family::V6),
        ] {
            match run_tool(tool, &[], limit).await {
                Ok(dump) => {
                    found = true;
                    let label = tool.trim_end_matches("-save");
                    tables.extend(iptables::parse(&dump, family, label));
                }
                Err(ToolError::Missing) => {}
                Err(e) => return Err(e),
            }
        }
        if found {
            Ok(tables)
        } else {
            Err(ToolError::Missing)
        }
    }

    async fn run(&self, facts: &Facts) -> Finding {
        let (mut tables, tool) = match self.ruleset().await {
            Ok(r) => r,
            Err(f) => return f,
        };
        let mut tool = tool.to_string();
        if self.backend == Backend::Auto && tool.starts_with("nft") {
            match self.legacy_tables(facts).await {
                Ok(legacy) if !legacy.is_empty() => {
                    tables.extend(legacy);
                    tool.push_str(" + iptables-legacy-save");
                }
                Ok(_) => {}
                Err(f) => return f,
            }
        }
        let env_port = facts.env(&self.port_var);
        let mut ports = with_env_port(&self.ports, env_port);
        // The reachability probes listen in this range: a rule that drops
        // it makes the node unreachable to its peers, and is the evidence
        // that names this node rather than the peer that failed to reach it.
        if let Some(v) = facts
            .env(&self.probe_ports_var)
            .map(str::trim)
            .filter(|v| !v.is_empty())
        {
            let range = match PortRange::parse(v) {
                Ok(r) => r,
                Err(e) => {
                    return Finding::error(format!("{}=`{v}`: {e}", self.probe_ports_var));
                }
            };
            let probe: Vec<u16> = if range.last - range.first < 1024 {
                range.ports().collect()
            } else {
                vec![range.first, range.last]
            };
            for p in probe {
                if !ports.contains(&p) {
                    ports.push(p);
                }
            }
        }
        // Data connections go to ports the kernel hands out; one sample
        // stands for the range, since rules rarely split it.
        let sample = self
            .data_ports
            .then(|| facts.ephemeral_ports().map_or(32768, |(lo, _)| lo))
            .filter(|p| !ports.contains(p));
        if let Some(p) = sample {
            ports.push(p);
        }
        let describe = |list: &[u16]| {
            let named: Vec<u16> = list
                .iter()
                .copied()
                .filter(|p| Some(*p) != sample)
                .collect();
            match (named.is_empty(), sample.filter(|s| list.contains(s))) {
                (_, None) => describe(&named),
                (true, Some(s)) => format!("the data ports (ephemeral range, sampled at {s})"),
                (false, Some(s)) => format!(
                    "{} and the data ports (ephemeral range, sampled at {s})",
                    describe(&named)
                ),
            }
        };
        let mut peer_names = self.peers.clone();
        if let Some(v) = facts
            .env(&self.peers_var)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            && !peer_names.iter().any(|p| p == v)
        {
            peer_names.push(v.to_string());
        }
        let mut peers: Vec<IpAddr> = Vec::new();
        for name in &peer_names {
            if let Ok(ips) = resolve(name, Duration::from_secs(3)).await {
                peers.extend(ips.into_iter().filter(|ip| !ip.is_loopback()));
            }
        }
        let chains: usize = tables.iter().map(|t| t.chains.len()).sum();

        // (direction, block) -> ports
        let mut found: Vec<(Hook, Block, Vec<u16>, Vec<IpAddr>)> = Vec::new();
        let mut record = |hook: Hook, peer: Option<IpAddr>, port: u16, list: Vec<Block>| {
            for b in list {
                match found.iter_mut().find(|(h, x, _, _)| *h == hook && *x == b) {
                    Some((_, _, ports, peers)) => {
                        if !ports.contains(&port) {
                            ports.push(port);
                        }
                        if let Some(p) = peer
                            && !peers.contains(&p)
                        {
                            peers.push(p);
                        }
                    }
                    None => found.push((hook, b, vec![port], peer.into_iter().collect())),
                }
            }
        };
        let peer_options: Vec<Option<IpAddr>> = if peers.is_empty() {
            vec![None]
        } else {
            peers.iter().copied().map(Some).collect()
        };
        for &port in &ports {
            for &peer in &peer_options {
                let p = Packet {
                    hook: Hook::Input,
                    port,
                    peer,
                };
                record(Hook::Input, peer, port, blocks(&tables, &p));
                if peer.is_some() {
                    let p = Packet {
                        hook: Hook::Output,
                        port,
                        peer,
                    };
                    record(Hook::Output, peer, port, blocks(&tables, &p));
                }
            }
        }
        let listed = describe(&ports);
        if found.is_empty() {
            let scope = if peers.is_empty() {
                String::new()
            } else {
                format!(
                    " with peers {}",
                    peers
                        .iter()
                        .map(IpAddr::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return Finding::pass(format!(
                "{tool}: {chains} chain(s), nothing drops or rejects TCP {listed}{scope}"
            ))
            .measured("open")
            .var("tool", tool.clone())
            .var("ports", listed);
        }
        let messages: Vec<String> = found
            .iter()
            .map(|(hook, b, ports, peers)| {
                let direction = match hook {
                    Hook::Input => "incoming",
                    Hook::Output => "outgoing",
                };
                let to = if peers.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({} {})",
                        if *hook == Hook::Input { "from" } else { "to" },
                        peers
                            .iter()
                            .map(IpAddr::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                format!(
                    "`{}` ({}, chain {}) {} {direction} TCP to {}{to}",
                    b.rule,
                    b.table,
                    b.chain,
                    if b.uncertain { "may block" } else { "blocks" },
                    describe(ports)
                )
            })
            .collect();
        let first = &found[0];
        Finding::fail(format!("{tool}: {}", messages.join("; ")))
            .measured("blocked")
            .expected("open")
            .var("rule", first.1.rule.clone())
            .var("ports", describe(&first.2))
            .var("tool", tool)
    }
}

impl Probe for Firewall {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move { self.run(&facts).await })
    }
}

/// The ruleset readers on untrusted text (`fuzz/`): nft's JSON or
/// iptables-save's dump, `choice` picking.
#[cfg(feature = "fuzzing")]
pub fn parse_for_fuzzing(choice: u8, text: &str) {
    if choice.is_multiple_of(2) {
        let _ = nft::parse(text, "");
        let _ = nft::texts(text);
    } else {
        let tables = iptables::parse(text, Family::V4, "iptables");
        // What the check asks of the tables must hold on any of them.
        for hook in [Hook::Input, Hook::Output] {
            let packet = Packet {
                hook,
                port: 29500,
                peer: Some(std::net::IpAddr::from([10, 0, 0, 2])),
            };
            let _ = blocks(&tables, &packet);
        }
    }
}
