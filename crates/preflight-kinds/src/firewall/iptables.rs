//! iptables-save / ip6tables-save output (the `filter` table) into the
//! model, for hosts without nft or with rules in the legacy backend.

use std::net::IpAddr;

use super::ruleset::{AddrField, Chain, Cond, Family, Hook, Rule, Table, Verdict};

/// Splits a rule line like a shell would, for quoted comments.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut has = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                has = true;
            }
            c if c.is_whitespace() && !quoted => {
                if has {
                    out.push(std::mem::take(&mut current));
                    has = false;
                }
            }
            c => {
                current.push(c);
                has = true;
            }
        }
    }
    if has {
        out.push(current);
    }
    out
}

fn port_ranges(text: &str) -> Option<Vec<(u16, u16)>> {
    text.split(',')
        .map(|part| match part.split_once(':') {
            Some((a, b)) => {
                let a = if a.is_empty() { 0 } else { a.parse().ok()? };
                let b = if b.is_empty() {
                    u16::MAX
                } else {
                    b.parse().ok()?
                };
                Some((a, b))
            }
            None => {
                let p = part.parse().ok()?;
                Some((p, p))
            }
        })
        .collect()
}

fn networks(text: &str) -> Option<Vec<(IpAddr, u8)>> {
    text.split(',')
        .map(|part| {
            let (addr, len) = match part.split_once('/') {
                Some((a, l)) => (a, Some(l)),
                None => (part, None),
            };
            let ip: IpAddr = addr.parse().ok()?;
            let full = if ip.is_ipv4() { 32 } else { 128 };
            let len = match len {
                // Dotted masks come out of iptables-save as prefix lengths.
                Some(l) => l.parse().ok()?,
                None => full,
            };
            Some((ip, len))
        })
        .collect()
}

fn rule(chain_line: &[String], text: &str) -> Rule {
    let mut conds = Vec::new();
    let mut verdict = Verdict::Continue;
    let mut negate = false;
    let mut i = 0;
    let arg = |i: usize| chain_line.get(i + 1).map(String::as_str).unwrap_or("");
    let mut push = |c: Option<Cond>, negate: &mut bool, what: &str| {
        let c = c.unwrap_or_else(|| Cond::Unknown(what.to_string()));
        conds.push(if *negate { Cond::Not(Box::new(c)) } else { c });
        *negate = false;
    };
    while i < chain_line.len() {
        let w = chain_line[i].as_str();
        match w {
            "!" => {
                negate = true;
                i += 1;
                continue;
            }
            "-p" | "--protocol" => {
                let p = arg(i).to_ascii_lowercase();
                if p != "all" {
                    push(Some(Cond::IsTcp(p == "tcp" || p == "6")), &mut negate, w);
                }
                i += 2;
            }
            "--dport" | "--destination-port" | "--dports" | "--destination-ports" => {
                push(port_ranges(arg(i)).map(Cond::DPort), &mut negate, w);
                i += 2;
            }
            "-s" | "--source" => {
                push(
                    networks(arg(i)).map(|n| Cond::Addr(AddrField::Source, n)),
                    &mut negate,
                    w,
                );
                i += 2;
            }
            "-d" | "--destination" => {
                push(
                    networks(arg(i)).map(|n| Cond::Addr(AddrField::Destination, n)),
                    &mut negate,
                    w,
                );
                i += 2;
            }
            "-i" | "--in-interface" | "-o" | "--out-interface" => {
                push(Some(Cond::Iface(vec![arg(i).to_string()])), &mut negate, w);
                i += 2;
            }
            "--state" | "--ctstate" => {
                let states = arg(i).split(',').map(|s| s.to_ascii_lowercase()).collect();
                push(Some(Cond::CtState(states)), &mut negate, w);
                i += 2;
            }
            // Module loads and annotations that do not filter by themselves.
            "-m" | "--match" | "--comment" => i += 2,
            "--syn" => i += 1,
            "-j" | "--jump" | "-g" | "--goto" => {
                let target = arg(i);
                verdict = match target {
                    "ACCEPT" => Verdict::Accept,
                    "DROP" => Verdict::Drop,
                    "REJECT" => Verdict::Reject,
                    "RETURN" => Verdict::Return,
                    "LOG" | "NFLOG" | "MARK" | "CONNMARK" | "CT" | "NOTRACK" => Verdict::Continue,
                    other if w == "-g" || w == "--goto" => Verdict::Goto(other.to_string()),
                    other => Verdict::Jump(other.to_string()),
                };
                i += 2;
                // The target's own options (--reject-with ...) follow.
                while i < chain_line.len() && chain_line[i].starts_with("--") {
                    i += 2;
                }
            }
            other if other.starts_with('-') => {
                // An option we do not model, with its value if it has one.
                let has_value = chain_line.get(i + 1).is_some_and(|n| !n.starts_with('-'));
                let what = if has_value {
                    format!("{other} {}", arg(i))
                } else {
                    other.to_string()
                };
                push(None, &mut negate, &what);
                i += if has_value { 2 } else { 1 };
            }
            _ => i += 1,
        }
    }
    Rule {
        conds,
        verdict,
        text: text.to_string(),
    }
}

/// The filter table of one iptables-save dump.
pub fn parse(dump: &str, family: Family, tool: &str) -> Vec<Table> {
    let mut tables = Vec::new();
    let mut current: Option<Table> = None;
    for line in dump.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('*') {
            current = (name == "filter").then(|| Table {
                family,
                label: format!("{tool} table filter"),
                chains: Vec::new(),
            });
        } else if line == "COMMIT" {
            if let Some(t) = current.take() {
                tables.push(t);
            }
        } else if let Some(decl) = line.strip_prefix(':') {
            let Some(t) = current.as_mut() else { continue };
            let mut parts = decl.split_whitespace();
            let name = parts.next().unwrap_or("").to_string();
            let policy = match parts.next() {
                Some("DROP") => Some(Verdict::Drop),
                Some("ACCEPT") => Some(Verdict::Accept),
                _ => None,
            };
            let hook = match name.as_str() {
                "INPUT" => Some(Hook::Input),
                "OUTPUT" => Some(Hook::Output),
                _ => None,
            };
            t.chains.push(Chain {
                name,
                hook,
                policy,
                rules: Vec::new(),
            });
        } else if line.starts_with("-A ") {
            let Some(t) = current.as_mut() else { continue };
            let w = words(line);
            let chain = w.get(1).cloned().unwrap_or_default();
            let r = rule(&w[2.min(w.len())..], line);
            if let Some(c) = t.chains.iter_mut().find(|c| c.name == chain) {
                c.rules.push(r);
            }
        }
    }
    tables
}

#[cfg(test)]
mod tests {
    use super::super::ruleset::{Packet, blocks};
    use super::*;

    const DUMP: &str = "*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i lo -j ACCEPT
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A INPUT -i eth0 -p tcp -m tcp --dport 29500 -j DROP
-A INPUT -p tcp -m multiport --dports 29501:29503,40 -m comment --comment \"no torch\" -j REJECT --reject-with tcp-reset
-A INPUT -s 10.9.0.0/16 -p tcp -j DROP
COMMIT
";

    fn input(port: u16, peer: Option<&str>) -> Packet {
        Packet {
            hook: Hook::Input,
            port,
            peer: peer.map(|p| p.parse().unwrap()),
        }
    }

    #[test]
    fn reads_rules_and_quotes_them() {
        let t = parse(DUMP, Family::V4, "iptables");
        let b = blocks(&t, &input(29500, None));
        assert_eq!(
            b[0].rule,
            "-A INPUT -i eth0 -p tcp -m tcp --dport 29500 -j DROP"
        );
        let b = blocks(&t, &input(29502, None));
        assert!(b[0].rule.contains("--dports 29501:29503,40"));
        assert!(!b[0].uncertain);
        assert!(blocks(&t, &input(29504, None)).is_empty());
        let b = blocks(&t, &input(29504, Some("10.9.1.1")));
        assert!(b[0].rule.contains("-s 10.9.0.0/16"));
        assert!(blocks(&t, &input(29504, Some("10.8.1.1"))).is_empty());
    }
}
