//! A backend-neutral model of a packet filter ruleset, just rich enough to
//! answer one question: would a new TCP connection to port P, from or to a
//! cluster peer, be dropped or rejected? Conditions preflight cannot
//! evaluate count as "may match" for drop/reject rules (reported) and as
//! "no match" for accept rules (never assumed to let traffic through).

use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
    /// nft `inet`: both.
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Input,
    Output,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
    Reject,
    Jump(String),
    Goto(String),
    Return,
    /// Counters, logs, marks: the rule does not decide.
    Continue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrField {
    Source,
    Destination,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cond {
    /// TCP destination port in one of the ranges.
    DPort(Vec<(u16, u16)>),
    /// The layer-4 protocol is TCP (false: some other protocol).
    IsTcp(bool),
    Addr(AddrField, Vec<(IpAddr, u8)>),
    /// Input or output interface named one of these.
    Iface(Vec<String>),
    /// Connection-tracking state is one of these (lowercase).
    CtState(Vec<String>),
    Not(Box<Cond>),
    /// A condition preflight does not model, described.
    Unknown(String),
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub conds: Vec<Cond>,
    pub verdict: Verdict,
    /// The rule as its tool prints it.
    pub text: String,
}

#[derive(Debug, Clone)]
pub struct Chain {
    pub name: String,
    /// Base chains hook into the packet path; others are jumped to.
    pub hook: Option<Hook>,
    pub policy: Option<Verdict>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
pub struct Table {
    pub family: Family,
    /// `inet filter` / `ip filter (iptables)`, for messages.
    pub label: String,
    pub chains: Vec<Chain>,
}

/// The connection being asked about.
#[derive(Debug, Clone, Copy)]
pub struct Packet {
    pub hook: Hook,
    pub port: u16,
    /// The remote end: source on input, destination on output.
    pub peer: Option<IpAddr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tri {
    Yes,
    No,
    Maybe,
}

fn in_net(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let len = u32::from(len.min(32));
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let len = u32::from(len.min(128));
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

fn eval(cond: &Cond, p: &Packet) -> Tri {
    match cond {
        Cond::DPort(ranges) => {
            if ranges.iter().any(|&(a, b)| (a..=b).contains(&p.port)) {
                Tri::Yes
            } else {
                Tri::No
            }
        }
        Cond::IsTcp(tcp) => {
            if *tcp {
                Tri::Yes
            } else {
                Tri::No
            }
        }
        Cond::Addr(field, nets) => {
            let remote = matches!(
                (field, p.hook),
                (AddrField::Source, Hook::Input) | (AddrField::Destination, Hook::Output)
            );
            if !remote {
                // Our own address: we do not know which one the peer uses.
                return Tri::Maybe;
            }
            match p.peer {
                // A rule about particular hosts says nothing about peers we
                // were not told about.
                None => Tri::No,
                Some(ip) if nets.iter().any(|&(n, l)| in_net(ip, n, l)) => Tri::Yes,
                Some(_) => Tri::No,
            }
        }
        Cond::Iface(names) => {
            // Traffic between nodes never crosses loopback; any other name
            // is assumed to be the cluster interface.
            if names.iter().all(|n| n == "lo") {
                Tri::No
            } else {
                Tri::Yes
            }
        }
        Cond::CtState(states) => {
            if states.iter().any(|s| s == "new") {
                Tri::Yes
            } else {
                Tri::No
            }
        }
        Cond::Not(inner) => match eval(inner, p) {
            Tri::Yes => Tri::No,
            Tri::No => Tri::Yes,
            Tri::Maybe => Tri::Maybe,
        },
        Cond::Unknown(_) => Tri::Maybe,
    }
}

fn rule_matches(rule: &Rule, p: &Packet) -> Tri {
    let mut result = Tri::Yes;
    for cond in &rule.conds {
        match eval(cond, p) {
            Tri::No => return Tri::No,
            Tri::Maybe => result = Tri::Maybe,
            Tri::Yes => {}
        }
    }
    result
}

/// Why a connection would not get through.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Block {
    pub table: String,
    pub chain: String,
    /// The rule text, or `policy drop`.
    pub rule: String,
    /// The rule has conditions preflight cannot evaluate.
    pub uncertain: bool,
}

#[derive(Clone)]
enum Outcome {
    Accepted,
    Blocked(Block),
}

/// What walking a chain gave: its outcome (`None`: it fell off its end or
/// hit `return`) and the blocks that may apply on the way (in the order
/// met, each once).
#[derive(Clone, Default)]
struct Walked {
    outcome: Option<Outcome>,
    maybe: Vec<Block>,
}

/// One table's walk for one packet. A chain's answer does not depend on
/// who jumped to it, so each is walked once and remembered: a ruleset
/// whose chains jump to the same chains again and again (fan-out at every
/// level) costs its size, not its number of paths, which the fuzzer showed
/// growing exponentially (a 258-byte ruleset took 50 s). A jump back into
/// a chain on the current path is a loop, which iptables and nft refuse
/// to load: it is cut, as a return.
struct Walk<'a> {
    table: &'a Table,
    p: &'a Packet,
    done: std::collections::HashMap<&'a str, Walked>,
    path: Vec<&'a str>,
}

/// Deeper than any ruleset loads (the kernel's own limit on nested
/// jumps is far below): a bound, not a rule.
const MAX_DEPTH: usize = 64;

impl<'a> Walk<'a> {
    fn new(table: &'a Table, p: &'a Packet) -> Walk<'a> {
        Walk {
            table,
            p,
            done: std::collections::HashMap::new(),
            path: Vec::new(),
        }
    }

    fn chain(&mut self, chain: &'a Chain) -> Walked {
        if let Some(w) = self.done.get(chain.name.as_str()) {
            return w.clone();
        }
        if self.path.contains(&chain.name.as_str()) || self.path.len() >= MAX_DEPTH {
            return Walked::default();
        }
        self.path.push(&chain.name);
        let mut maybe = Maybe::default();
        let outcome = self.rules(chain, &mut maybe);
        self.path.pop();
        let w = Walked {
            outcome,
            maybe: maybe.list,
        };
        self.done.insert(&chain.name, w.clone());
        w
    }

    /// The chain's rules in order; `None`: it returned.
    fn rules(&mut self, chain: &'a Chain, maybe: &mut Maybe) -> Option<Outcome> {
        let (table, p) = (self.table, self.p);
        for rule in &chain.rules {
            let m = rule_matches(rule, p);
            if m == Tri::No {
                continue;
            }
            let block = || Block {
                table: table.label.clone(),
                chain: chain.name.clone(),
                rule: rule.text.clone(),
                uncertain: m == Tri::Maybe,
            };
            match &rule.verdict {
                Verdict::Accept if m == Tri::Yes => return Some(Outcome::Accepted),
                Verdict::Accept => {}
                Verdict::Drop | Verdict::Reject if m == Tri::Yes => {
                    return Some(Outcome::Blocked(block()));
                }
                Verdict::Drop | Verdict::Reject => maybe.push(block()),
                Verdict::Jump(target) | Verdict::Goto(target) => {
                    let Some(next) = table.chains.iter().find(|c| &c.name == target) else {
                        continue;
                    };
                    let sub = self.chain(next);
                    for b in sub.maybe {
                        maybe.push(b);
                    }
                    match sub.outcome {
                        None => {
                            if matches!(rule.verdict, Verdict::Goto(_)) && m == Tri::Yes {
                                return None;
                            }
                        }
                        // Only a certain jump makes the sub-chain's answer ours.
                        Some(decided) if m == Tri::Yes => return Some(decided),
                        Some(Outcome::Blocked(b)) => maybe.push(Block {
                            uncertain: true,
                            ..b
                        }),
                        Some(Outcome::Accepted) => {}
                    }
                }
                Verdict::Return if m == Tri::Yes => return None,
                Verdict::Return | Verdict::Continue => {}
            }
        }
        None
    }
}

/// Blocks that may apply, each once, in the order met.
#[derive(Default)]
struct Maybe {
    list: Vec<Block>,
    seen: std::collections::HashSet<Block>,
}

impl Maybe {
    fn push(&mut self, b: Block) {
        if self.seen.insert(b.clone()) {
            self.list.push(b);
        }
    }
}

/// Every base chain on the packet's hook and family must let it through;
/// the first definite block is returned, else the uncertain ones.
pub fn blocks(tables: &[Table], p: &Packet) -> Vec<Block> {
    let v6 = p.peer.is_some_and(|ip| ip.is_ipv6());
    let mut uncertain = Maybe::default();
    for table in tables {
        let applies = match table.family {
            Family::Both => true,
            Family::V4 => !v6,
            Family::V6 => v6,
        };
        if !applies {
            continue;
        }
        let mut walk = Walk::new(table, p);
        for chain in table.chains.iter().filter(|c| c.hook == Some(p.hook)) {
            let w = walk.chain(chain);
            match w.outcome {
                Some(Outcome::Blocked(b)) if !b.uncertain => return vec![b],
                Some(Outcome::Blocked(b)) => uncertain.push(b),
                Some(Outcome::Accepted) => {}
                None => {
                    if matches!(chain.policy, Some(Verdict::Drop | Verdict::Reject)) {
                        return vec![Block {
                            table: table.label.clone(),
                            chain: chain.name.clone(),
                            rule: "policy drop".into(),
                            uncertain: false,
                        }];
                    }
                }
            }
            for b in w.maybe {
                uncertain.push(b);
            }
        }
    }
    uncertain.list
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(conds: Vec<Cond>, verdict: Verdict, text: &str) -> Rule {
        Rule {
            conds,
            verdict,
            text: text.into(),
        }
    }

    fn table(policy: Verdict, rules: Vec<Rule>) -> Table {
        Table {
            family: Family::Both,
            label: "inet t".into(),
            chains: vec![Chain {
                name: "input".into(),
                hook: Some(Hook::Input),
                policy: Some(policy),
                rules,
            }],
        }
    }

    fn input(port: u16, peer: Option<&str>) -> Packet {
        Packet {
            hook: Hook::Input,
            port,
            peer: peer.map(|p| p.parse().unwrap()),
        }
    }

    /// Chains c0..c{depth}, each jumping twice to the next (once for a
    /// condition preflight cannot judge), the last dropping the port:
    /// 2^depth paths through the table.
    fn fan_out(depth: usize) -> Table {
        let mut t = table(
            Verdict::Accept,
            vec![rule(Vec::new(), Verdict::Jump("c0".into()), "jump c0")],
        );
        for i in 0..depth {
            let next = format!("c{}", i + 1);
            let unknown = Cond::Unknown("mark 0x1".into());
            t.chains.push(Chain {
                name: format!("c{i}"),
                hook: None,
                policy: None,
                rules: vec![
                    rule(vec![unknown], Verdict::Jump(next.clone()), "mark jump"),
                    rule(Vec::new(), Verdict::Jump(next), "jump"),
                ],
            });
        }
        t.chains.push(Chain {
            name: format!("c{depth}"),
            hook: None,
            policy: None,
            rules: vec![rule(
                vec![Cond::DPort(vec![(29500, 29500)])],
                Verdict::Drop,
                "tcp dport 29500 drop",
            )],
        });
        t
    }

    /// Found by the fuzzer (fuzz/artifacts/firewall, a 258-byte
    /// iptables-save text with `-A INPUT -j INPUT` in it took 50 s): every
    /// chain is walked once, so 2^40 paths cost 41 chains, and a loop,
    /// which iptables and nft refuse to load, is cut.
    #[test]
    fn chains_are_walked_once_whatever_the_paths_and_loops_are_cut() {
        let t = fan_out(40);
        let b = blocks(std::slice::from_ref(&t), &input(29500, None));
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!((b[0].chain.as_str(), b[0].uncertain), ("c40", false));
        assert!(blocks(&[t], &input(29501, None)).is_empty());

        let mut looped = table(
            Verdict::Accept,
            vec![
                rule(Vec::new(), Verdict::Jump("input".into()), "jump input"),
                rule(Vec::new(), Verdict::Jump("input".into()), "jump input"),
                rule(
                    vec![Cond::DPort(vec![(29500, 29500)])],
                    Verdict::Drop,
                    "tcp dport 29500 drop",
                ),
            ],
        );
        let b = blocks(std::slice::from_ref(&looped), &input(29500, None));
        assert_eq!(b[0].rule, "tcp dport 29500 drop");
        looped.chains[0].rules.pop();
        assert!(blocks(&[looped], &input(29500, None)).is_empty());
    }

    #[test]
    fn a_drop_for_the_port_blocks_and_others_pass() {
        let t = table(
            Verdict::Accept,
            vec![
                rule(
                    vec![Cond::Iface(vec!["lo".into()])],
                    Verdict::Accept,
                    "iif lo accept",
                ),
                rule(
                    vec![Cond::CtState(vec!["established".into(), "related".into()])],
                    Verdict::Accept,
                    "ct state established,related accept",
                ),
                rule(
                    vec![Cond::DPort(vec![(29500, 29500)])],
                    Verdict::Drop,
                    "tcp dport 29500 drop",
                ),
            ],
        );
        let b = blocks(std::slice::from_ref(&t), &input(29500, None));
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].rule, "tcp dport 29500 drop");
        assert!(!b[0].uncertain);
        assert!(blocks(&[t], &input(29501, None)).is_empty());
    }

    #[test]
    fn policy_drop_unless_accepted_for_the_peer() {
        let t = table(
            Verdict::Drop,
            vec![rule(
                vec![Cond::Addr(
                    AddrField::Source,
                    vec![("10.0.0.0".parse().unwrap(), 24)],
                )],
                Verdict::Accept,
                "ip saddr 10.0.0.0/24 accept",
            )],
        );
        assert!(blocks(std::slice::from_ref(&t), &input(29500, Some("10.0.0.7"))).is_empty());
        let b = blocks(&[t], &input(29500, Some("10.9.0.7")));
        assert_eq!(b[0].rule, "policy drop");
    }

    #[test]
    fn unknown_conditions_are_uncertain_blocks() {
        let t = table(
            Verdict::Accept,
            vec![rule(
                vec![
                    Cond::IsTcp(true),
                    Cond::Unknown("xt match multiport".into()),
                ],
                Verdict::Reject,
                "meta l4proto tcp xt match multiport reject",
            )],
        );
        let b = blocks(&[t], &input(29501, None));
        assert_eq!(b.len(), 1);
        assert!(b[0].uncertain);
    }

    #[test]
    fn jumps_are_followed() {
        let mut t = table(
            Verdict::Accept,
            vec![rule(
                vec![Cond::IsTcp(true)],
                Verdict::Jump("cluster".into()),
                "jump cluster",
            )],
        );
        t.chains.push(Chain {
            name: "cluster".into(),
            hook: None,
            policy: None,
            rules: vec![rule(
                vec![Cond::Not(Box::new(Cond::DPort(vec![(22, 22)])))],
                Verdict::Drop,
                "tcp dport != 22 drop",
            )],
        });
        let b = blocks(std::slice::from_ref(&t), &input(29500, None));
        assert_eq!(b[0].chain, "cluster");
        assert!(blocks(&[t], &input(22, None)).is_empty());
    }
}
