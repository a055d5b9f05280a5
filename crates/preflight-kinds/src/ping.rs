//! `ping`: ICMP echo to hosts, with loss and round-trip limits. Uses an
//! unprivileged ICMP datagram socket where net.ipv4.ping_group_range allows
//! this user, a raw socket otherwise (root or CAP_NET_RAW), and reports
//! `error` with both reasons when neither is permitted: never a silent pass.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};

use super::resolve::resolve_blocking;
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params};
use preflight_facts::Facts;
use preflight_ground::values::{Span, format_duration};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "ping",
    scope: crate::Scope::Node,
    area: "network",
    summary: "ICMP echo to hosts (unprivileged ICMP socket, raw socket as fallback) within loss and round-trip limits.",
    params: &[
        ParamDoc {
            name: "hosts",
            ty: "list of strings",
            default: Some("[]"),
            doc: "Host names or addresses (IPv4 or IPv6) to ping.",
        },
        ParamDoc {
            name: "hosts_var",
            ty: "string",
            default: Some("unset"),
            doc: "Also ping the host in this variable (e.g. MASTER_ADDR), when set.",
        },
        ParamDoc {
            name: "count",
            ty: "integer",
            default: Some("3"),
            doc: "Echo requests per host.",
        },
        ParamDoc {
            name: "interval",
            ty: "duration",
            default: Some("100ms"),
            doc: "Time between requests.",
        },
        ParamDoc {
            name: "reply_timeout",
            ty: "duration",
            default: Some("1s"),
            doc: "How long to wait for the last reply.",
        },
        ParamDoc {
            name: "max_loss_percent",
            ty: "number",
            default: Some("0"),
            doc: "More loss than this fails.",
        },
        ParamDoc {
            name: "max_rtt",
            ty: "duration",
            default: Some("unset"),
            doc: "An average round trip above this fails.",
        },
    ],
    hint_vars: &["loss", "rtt", "socket"],
    parse: parse_params::<Ping>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Ping {
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hosts_var: Option<String>,
    #[serde(default = "three")]
    count: u32,
    #[serde(default = "default_interval")]
    interval: Span,
    #[serde(default = "default_reply_timeout")]
    reply_timeout: Span,
    #[serde(default)]
    max_loss_percent: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_rtt: Option<Span>,
}

fn three() -> u32 {
    3
}
fn default_interval() -> Span {
    Span(Duration::from_millis(100))
}
fn default_reply_timeout() -> Span {
    Span(Duration::from_secs(1))
}

impl Params for Ping {
    fn validate(&self) -> Result<(), String> {
        if self.hosts.is_empty() && self.hosts_var.is_none() {
            return Err("give `hosts`, `hosts_var`, or both".into());
        }
        if !(1..=100).contains(&self.count) {
            return Err("`count` must be 1-100".into());
        }
        if !(0.0..=100.0).contains(&self.max_loss_percent) {
            return Err("`max_loss_percent` must be 0-100".into());
        }
        if self.reply_timeout.0.is_zero() {
            return Err("`reply_timeout` must be longer than zero".into());
        }
        Ok(())
    }
}

/// Which socket the kernel let us open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Datagram,
    Raw,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Datagram => "unprivileged ICMP socket",
            Kind::Raw => "raw socket",
        }
    }
}

/// Why no echo was sent or counted.
enum PingError {
    /// Neither socket is open to this (unprivileged) user.
    Denied,
    Failed(String),
}

impl From<String> for PingError {
    fn from(text: String) -> PingError {
        PingError::Failed(text)
    }
}

/// An ICMP socket for the target's family, as a std UdpSocket for its safe
/// send/recv API.
fn open(v6: bool) -> Result<(UdpSocket, Kind), PingError> {
    let (domain, protocol) = if v6 {
        (Domain::IPV6, Protocol::ICMPV6)
    } else {
        (Domain::IPV4, Protocol::ICMPV4)
    };
    let dgram = Socket::new(domain, Type::DGRAM, Some(protocol));
    let dgram_err = match dgram {
        Ok(s) => return Ok((s.into(), Kind::Datagram)),
        Err(e) => e,
    };
    match Socket::new(domain, Type::RAW, Some(protocol)) {
        Ok(s) => Ok((s.into(), Kind::Raw)),
        Err(raw_err) if super::is_denied(&raw_err) && super::is_denied(&dgram_err) => {
            Err(PingError::Denied)
        }
        Err(raw_err) => Err(PingError::Failed(format!(
            "cannot open an ICMP socket: unprivileged datagram socket: {dgram_err} (net.ipv4.ping_group_range does not include this user's group); raw socket: {raw_err} (needs root or CAP_NET_RAW)"
        ))),
    }
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Echo request type: 8 for ICMP, 128 for ICMPv6 (whose checksum covers a
/// pseudo-header, so the kernel fills it in).
fn echo_request(v6: bool, id: u16, seq: u16, token: &[u8; 8]) -> Vec<u8> {
    let mut packet = vec![if v6 { 128u8 } else { 8 }, 0, 0, 0];
    packet.extend_from_slice(&id.to_be_bytes());
    packet.extend_from_slice(&seq.to_be_bytes());
    packet.extend_from_slice(token);
    packet.extend_from_slice(&[0x5a; 24]);
    if !v6 {
        let sum = checksum(&packet);
        packet[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    packet
}

/// The sequence number of an echo reply carrying our token, if it is one.
fn parse_reply(buf: &[u8], v6: bool, kind: Kind, token: &[u8; 8]) -> Option<u16> {
    let icmp = match kind {
        // Raw ICMPv6 sockets, like datagram ones, deliver no IP header.
        Kind::Datagram => buf,
        Kind::Raw if v6 => buf,
        Kind::Raw => {
            let header = usize::from(buf.first()? & 0x0f) * 4;
            buf.get(header..)?
        }
    };
    let reply = if v6 { 129 } else { 0 };
    if icmp.len() < 16 || icmp[0] != reply || icmp[1] != 0 || &icmp[8..16] != token {
        return None;
    }
    Some(u16::from_be_bytes([icmp[6], icmp[7]]))
}

struct Stats {
    sent: u32,
    rtts: Vec<Duration>,
}

impl Stats {
    fn loss_percent(&self) -> f64 {
        if self.sent == 0 {
            return 100.0;
        }
        100.0 * f64::from(self.sent - self.rtts.len() as u32) / f64::from(self.sent)
    }

    fn avg(&self) -> Option<Duration> {
        (!self.rtts.is_empty()).then(|| self.rtts.iter().sum::<Duration>() / self.rtts.len() as u32)
    }
}

impl Ping {
    fn ping_one(&self, target: IpAddr) -> Result<(Stats, Kind), PingError> {
        let v6 = target.is_ipv6();
        let (socket, kind) = open(v6)?;
        let token: [u8; 8] = {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            (nanos ^ u64::from(std::process::id()) << 32).to_be_bytes()
        };
        let id = std::process::id() as u16;
        let destination = SocketAddr::new(target, 0);
        let mut sent_at: Vec<Option<Instant>> = vec![None; self.count as usize];
        let mut stats = Stats {
            sent: 0,
            rtts: Vec::new(),
        };
        let mut buf = [0u8; 1500];
        let mut next_send = Instant::now();
        let mut seq: u16 = 0;
        let mut deadline = None;
        loop {
            let now = Instant::now();
            if usize::from(seq) < sent_at.len() && now >= next_send {
                let packet = echo_request(v6, id, seq, &token);
                socket
                    .send_to(&packet, destination)
                    .map_err(|e| format!("cannot send to {target}: {e}"))?;
                sent_at[usize::from(seq)] = Some(Instant::now());
                stats.sent += 1;
                seq += 1;
                next_send = now + self.interval.0;
                if usize::from(seq) == sent_at.len() {
                    deadline = Some(Instant::now() + self.reply_timeout.0);
                }
            }
            if stats.rtts.len() == sent_at.len() {
                break;
            }
            let wake = match deadline {
                Some(d) => d,
                None => next_send,
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            let wait = wake
                .saturating_duration_since(now)
                .max(Duration::from_millis(1));
            socket
                .set_read_timeout(Some(wait))
                .map_err(|e| format!("socket timeout: {e}"))?;
            match socket.recv_from(&mut buf) {
                Ok((n, from)) => {
                    if kind == Kind::Raw && from.ip() != target {
                        continue;
                    }
                    if let Some(s) = parse_reply(&buf[..n], v6, kind, &token)
                        && let Some(Some(at)) = sent_at.get_mut(usize::from(s)).map(Option::take)
                    {
                        stats.rtts.push(at.elapsed());
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                // ICMP errors (host unreachable) surface here on datagram
                // sockets; they are loss.
                Err(_) => {}
            }
        }
        Ok((stats, kind))
    }

    fn check(&self, facts: &Facts) -> Finding {
        let mut hosts = self.hosts.clone();
        if let Some(v) = self.hosts_var.as_deref().and_then(|v| facts.env(v))
            && !v.trim().is_empty()
            && !hosts.iter().any(|h| h == v.trim())
        {
            hosts.push(v.trim().to_string());
        }
        if hosts.is_empty() {
            return Finding::skip(format!(
                "{} is not set",
                self.hosts_var.as_deref().unwrap_or("no host")
            ));
        }
        self.ping_hosts(&hosts)
    }

    fn ping_hosts(&self, hosts: &[String]) -> Finding {
        let mut problems = Vec::new();
        let mut lines = Vec::new();
        let mut worst_loss: f64 = 0.0;
        let mut worst_rtt = None;
        let mut socket_kind = None;
        for host in hosts {
            let ips = match resolve_blocking(host, Duration::from_secs(3)) {
                Ok(ips) => ips,
                Err(e) => {
                    problems.push(format!("{host}: {e}"));
                    continue;
                }
            };
            // IPv4 first, as the resolver orders them.
            let target = ips[0];
            let (stats, kind) = match self.ping_one(target) {
                Ok(r) => r,
                Err(PingError::Denied) => {
                    return super::needs_privilege(
                        "an ICMP echo",
                        "root, CAP_NET_RAW or a group in net.ipv4.ping_group_range",
                    );
                }
                Err(PingError::Failed(e)) => return Finding::error(e),
            };
            socket_kind = Some(kind);
            let loss = stats.loss_percent();
            worst_loss = worst_loss.max(loss);
            let avg = stats.avg();
            if let Some(a) = avg {
                worst_rtt = Some(worst_rtt.map_or(a, |w: Duration| w.max(a)));
            }
            let rtt_text = avg.map_or("no reply".to_string(), |a| format!("avg {}", format_rtt(a)));
            let line = format!(
                "{host} ({target}): {}/{} replies, {loss:.0}% loss, {rtt_text}",
                stats.rtts.len(),
                stats.sent
            );
            let too_lossy = loss > self.max_loss_percent;
            let too_slow = matches!((self.max_rtt, avg), (Some(max), Some(a)) if a > max.0);
            if too_lossy || too_slow {
                let mut why = line.clone();
                if too_lossy && stats.rtts.is_empty() {
                    why.push_str(" (ICMP dropped by a firewall, or the host is down)");
                } else if too_lossy {
                    why.push_str(&format!(" (limit {}%)", self.max_loss_percent));
                }
                if too_slow {
                    why.push_str(&format!(
                        " (limit {})",
                        self.max_rtt.map(|m| m.to_string()).unwrap_or_default()
                    ));
                }
                problems.push(why);
            } else {
                lines.push(line);
            }
        }
        let socket = socket_kind.map_or("none", Kind::name);
        let vars = |f: Finding| {
            f.measured(format!(
                "{worst_loss:.0}% loss{}",
                worst_rtt.map_or(String::new(), |r| format!(", rtt {}", format_rtt(r)))
            ))
            .var("loss", format!("{worst_loss:.0}%"))
            .var("rtt", worst_rtt.map_or("none".into(), format_rtt))
            .var("socket", socket)
        };
        if problems.is_empty() {
            vars(Finding::pass(format!(
                "{} (via {socket})",
                lines.join("; ")
            )))
        } else {
            vars(Finding::fail(format!(
                "{} (via {socket})",
                problems.join("; ")
            )))
        }
    }
}

/// The ping check of one host (3 echoes, 1 s for the last reply), as
/// its finding says it: for `diagnose`, which quotes it of a node the
/// evidence points at.
pub fn quote(host: &str) -> String {
    let p = Ping {
        hosts: vec![host.to_string()],
        hosts_var: None,
        count: three(),
        interval: default_interval(),
        reply_timeout: default_reply_timeout(),
        max_loss_percent: 0.0,
        max_rtt: None,
    };
    let f = p.ping_hosts(&p.hosts);
    format!("ping check {}: {}", f.status.name(), f.message)
}

fn format_rtt(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.2}ms", d.as_secs_f64() * 1000.0)
    } else {
        format_duration(d)
    }
}

impl Probe for Ping {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_request_checksums_to_zero() {
        let token = [1, 2, 3, 4, 5, 6, 7, 8];
        let p = echo_request(false, 0x1234, 7, &token);
        assert_eq!(checksum(&p), 0);
        let mut reply = p.clone();
        reply[0] = 0;
        assert_eq!(parse_reply(&reply, false, Kind::Datagram, &token), Some(7));
        assert_eq!(parse_reply(&p, false, Kind::Datagram, &token), None);
        let mut v6 = echo_request(true, 1, 9, &token);
        assert_eq!(v6[0], 128);
        v6[0] = 129;
        assert_eq!(parse_reply(&v6, true, Kind::Raw, &token), Some(9));
    }
}
