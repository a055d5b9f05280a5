//! nftables: `nft -j list ruleset` (structure) and `nft -a list ruleset`
//! (the rules' own text, found by handle, for quoting) into the model.

use std::collections::HashMap;
use std::net::IpAddr;

use serde_json::Value;

use super::ruleset::{AddrField, Chain, Cond, Family, Hook, Rule, Table, Verdict};

/// Rule text by (family, table, chain, handle), from `nft -a` output.
pub fn texts(listing: &str) -> HashMap<(String, String, String, u64), String> {
    let mut map = HashMap::new();
    let (mut family, mut table, mut chain) = (String::new(), String::new(), String::new());
    for line in listing.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("table ") {
            let mut words = rest.split_whitespace();
            family = words.next().unwrap_or("").to_string();
            table = words.next().unwrap_or("").to_string();
        } else if let Some(rest) = t.strip_prefix("chain ") {
            chain = rest.split_whitespace().next().unwrap_or("").to_string();
        } else if let Some((rule, handle)) = t.rsplit_once(" # handle ")
            && let Ok(h) = handle.trim().parse::<u64>()
        {
            map.insert(
                (family.clone(), table.clone(), chain.clone(), h),
                rule.trim().to_string(),
            );
        }
    }
    map
}

fn ports(v: &Value) -> Option<Vec<(u16, u16)>> {
    let port = |v: &Value| v.as_u64().and_then(|n| u16::try_from(n).ok());
    if let Some(p) = port(v) {
        return Some(vec![(p, p)]);
    }
    if let Some(r) = v.get("range").and_then(Value::as_array) {
        return Some(vec![(port(r.first()?)?, port(r.get(1)?)?)]);
    }
    if let Some(items) = v.get("set").and_then(Value::as_array).or(v.as_array()) {
        let mut all = Vec::new();
        for item in items {
            all.extend(ports(item)?);
        }
        return Some(all);
    }
    None
}

fn nets(v: &Value) -> Option<Vec<(IpAddr, u8)>> {
    if let Some(s) = v.as_str() {
        let ip: IpAddr = s.parse().ok()?;
        let len = if ip.is_ipv4() { 32 } else { 128 };
        return Some(vec![(ip, len)]);
    }
    if let Some(p) = v.get("prefix") {
        let ip: IpAddr = p.get("addr")?.as_str()?.parse().ok()?;
        let len = u8::try_from(p.get("len")?.as_u64()?).ok()?;
        return Some(vec![(ip, len)]);
    }
    if let Some(items) = v.get("set").and_then(Value::as_array).or(v.as_array()) {
        let mut all = Vec::new();
        for item in items {
            all.extend(nets(item)?);
        }
        return Some(all);
    }
    None
}

fn strings(v: &Value) -> Option<Vec<String>> {
    if let Some(s) = v.as_str() {
        return Some(vec![s.to_ascii_lowercase()]);
    }
    let items = v.get("set").and_then(Value::as_array).or(v.as_array())?;
    items
        .iter()
        .map(|i| i.as_str().map(str::to_ascii_lowercase))
        .collect()
}

fn condition(m: &Value) -> Cond {
    let unknown = || Cond::Unknown(m.to_string());
    let (Some(left), Some(right)) = (m.get("left"), m.get("right")) else {
        return unknown();
    };
    let op = m.get("op").and_then(Value::as_str).unwrap_or("==");
    let base = if let Some(payload) = left.get("payload") {
        let protocol = payload
            .get("protocol")
            .and_then(Value::as_str)
            .unwrap_or("");
        let field = payload.get("field").and_then(Value::as_str).unwrap_or("");
        match (protocol, field) {
            ("tcp", "dport") => ports(right).map(Cond::DPort),
            ("ip" | "ip6", "saddr") => nets(right).map(|n| Cond::Addr(AddrField::Source, n)),
            ("ip" | "ip6", "daddr") => nets(right).map(|n| Cond::Addr(AddrField::Destination, n)),
            // Matching a field of another protocol means "not TCP".
            ("udp" | "sctp" | "icmp" | "icmpv6" | "udplite", _) => Some(Cond::IsTcp(false)),
            _ => None,
        }
    } else if let Some(key) = left
        .get("meta")
        .and_then(|m| m.get("key"))
        .and_then(Value::as_str)
    {
        match key {
            "l4proto" => {
                strings(right).map(|s| Cond::IsTcp(s.iter().any(|p| p == "tcp" || p == "6")))
            }
            "iifname" | "oifname" | "iif" | "oif" => strings(right).map(Cond::Iface),
            _ => None,
        }
    } else if left
        .get("ct")
        .and_then(|c| c.get("key"))
        .and_then(Value::as_str)
        == Some("state")
    {
        strings(right).map(Cond::CtState)
    } else {
        None
    };
    match base {
        None => unknown(),
        Some(c) if op == "!=" => Cond::Not(Box::new(c)),
        Some(c) if matches!(op, "==" | "in") => c,
        Some(_) => unknown(),
    }
}

fn verdict_of(expr: &Value) -> Option<Verdict> {
    let obj = expr.as_object()?;
    let (key, value) = obj.iter().next()?;
    Some(match key.as_str() {
        "accept" => Verdict::Accept,
        "drop" => Verdict::Drop,
        "reject" => Verdict::Reject,
        "return" => Verdict::Return,
        "jump" => Verdict::Jump(value.get("target")?.as_str()?.to_string()),
        "goto" => Verdict::Goto(value.get("target")?.as_str()?.to_string()),
        "xt" if value.get("type").and_then(Value::as_str) == Some("target") => {
            match value.get("name").and_then(Value::as_str)? {
                "REJECT" => Verdict::Reject,
                "DROP" => Verdict::Drop,
                "ACCEPT" => Verdict::Accept,
                _ => return None,
            }
        }
        _ => return None,
    })
}

fn family(name: &str) -> Option<Family> {
    match name {
        "ip" => Some(Family::V4),
        "ip6" => Some(Family::V6),
        "inet" => Some(Family::Both),
        // bridge, arp and netdev tables do not filter this host's TCP.
        _ => None,
    }
}

/// The tables of a `nft -j list ruleset` document.
pub fn parse(json: &str, listing: &str) -> Result<Vec<Table>, String> {
    let doc: Value =
        serde_json::from_str(json).map_err(|e| format!("cannot read nft's JSON: {e}"))?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("nft's JSON has no `nftables` list")?;
    let texts = texts(listing);
    let mut tables: Vec<(String, String, Table)> = Vec::new();
    let str_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    for item in items {
        if let Some(t) = item.get("table") {
            let (fam, name) = (str_of(t, "family"), str_of(t, "name"));
            if let Some(f) = family(&fam) {
                tables.push((
                    fam.clone(),
                    name.clone(),
                    Table {
                        family: f,
                        label: format!("table {fam} {name}"),
                        chains: Vec::new(),
                    },
                ));
            }
        } else if let Some(c) = item.get("chain") {
            let (fam, table, name) = (str_of(c, "family"), str_of(c, "table"), str_of(c, "name"));
            let Some((_, _, t)) = tables.iter_mut().find(|(f, n, _)| *f == fam && *n == table)
            else {
                continue;
            };
            let is_filter = c
                .get("type")
                .and_then(Value::as_str)
                .is_none_or(|t| t == "filter");
            let hook = match c.get("hook").and_then(Value::as_str) {
                Some("input") if is_filter => Some(Hook::Input),
                Some("output") if is_filter => Some(Hook::Output),
                _ => None,
            };
            let policy = match c.get("policy").and_then(Value::as_str) {
                Some("drop") => Some(Verdict::Drop),
                Some("accept") => Some(Verdict::Accept),
                _ => None,
            };
            t.chains.push(Chain {
                name,
                hook,
                policy,
                rules: Vec::new(),
            });
        } else if let Some(r) = item.get("rule") {
            let (fam, table, chain) = (str_of(r, "family"), str_of(r, "table"), str_of(r, "chain"));
            let Some((_, _, t)) = tables.iter_mut().find(|(f, n, _)| *f == fam && *n == table)
            else {
                continue;
            };
            let Some(ch) = t.chains.iter_mut().find(|c| c.name == chain) else {
                continue;
            };
            let mut conds = Vec::new();
            let mut verdict = Verdict::Continue;
            for expr in r
                .get("expr")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(m) = expr.get("match") {
                    conds.push(condition(m));
                } else if let Some(v) = verdict_of(expr) {
                    verdict = v;
                } else if let Some(xt) = expr.get("xt") {
                    if xt.get("type").and_then(Value::as_str) == Some("match") {
                        conds.push(Cond::Unknown(format!(
                            "xt match {}",
                            xt.get("name").and_then(Value::as_str).unwrap_or("?")
                        )));
                    }
                } else if expr.get("limit").is_some() {
                    conds.push(Cond::Unknown("limit".into()));
                }
            }
            let handle = r.get("handle").and_then(Value::as_u64).unwrap_or(0);
            let text = texts
                .get(&(fam.clone(), table.clone(), chain.clone(), handle))
                .cloned()
                .unwrap_or_else(|| format!("rule handle {handle}"));
            ch.rules.push(Rule {
                conds,
                verdict,
                text,
            });
        }
    }
    Ok(tables.into_iter().map(|(_, _, t)| t).collect())
}

#[cfg(test)]
mod tests {
    use super::super::ruleset::{Packet, blocks};
    use super::*;

    /// Recorded from nft 1.0.6 in a test namespace.
    const JSON: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
 {"table": {"family": "inet", "name": "t", "handle": 1}},
 {"chain": {"family": "inet", "table": "t", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 2, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lo"}}, {"accept": null}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 3, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"accept": null}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 4, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 29500}}, {"drop": null}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 6, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": {"set": [8080, {"range": [29501, 29505]}]}}}, {"reject": {"type": "icmpx", "expr": "port-unreachable"}}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 7, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"prefix": {"addr": "10.1.0.0", "len": 16}}}}, {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}}, {"drop": null}]}},
 {"table": {"family": "ip", "name": "filter", "handle": 2}},
 {"chain": {"family": "ip", "table": "filter", "name": "OUTPUT", "handle": 4, "type": "filter", "hook": "output", "prio": 0, "policy": "drop"}}]}"#;

    const LISTING: &str = "table inet t { # handle 1
\tchain input { # handle 1
\t\ttype filter hook input priority filter; policy accept;
\t\tiifname \"lo\" accept # handle 2
\t\tct state established,related accept # handle 3
\t\ttcp dport 29500 drop # handle 4
\t\ttcp dport { 8080, 29501-29505 } reject # handle 6
\t\tip saddr 10.1.0.0/16 tcp dport 22 drop # handle 7
\t}
}
";

    fn packet(hook: Hook, port: u16, peer: Option<&str>) -> Packet {
        Packet {
            hook,
            port,
            peer: peer.map(|p| p.parse().unwrap()),
        }
    }

    #[test]
    fn reads_recorded_ruleset() {
        let tables = parse(JSON, LISTING).unwrap();
        assert_eq!(tables.len(), 2);
        let b = blocks(&tables, &packet(Hook::Input, 29500, None));
        assert_eq!(b[0].rule, "tcp dport 29500 drop");
        assert_eq!(b[0].table, "table inet t");
        let b = blocks(&tables, &packet(Hook::Input, 29503, None));
        assert_eq!(b[0].rule, "tcp dport { 8080, 29501-29505 } reject");
        assert!(blocks(&tables, &packet(Hook::Input, 29506, None)).is_empty());
        assert!(blocks(&tables, &packet(Hook::Input, 22, Some("10.2.0.1"))).is_empty());
        let b = blocks(&tables, &packet(Hook::Input, 22, Some("10.1.3.4")));
        assert_eq!(b[0].rule, "ip saddr 10.1.0.0/16 tcp dport 22 drop");
        let b = blocks(&tables, &packet(Hook::Output, 29500, Some("10.1.3.4")));
        assert_eq!(b[0].rule, "policy drop");
        assert_eq!(b[0].chain, "OUTPUT");
    }

    #[test]
    fn bad_json_is_an_error() {
        assert!(parse("not json", "").is_err());
        assert!(parse("{}", "").is_err());
    }
}
