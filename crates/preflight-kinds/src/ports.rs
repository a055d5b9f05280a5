//! Port lists in checklists: single ports and inclusive ranges, written as
//! `29500` or `"29500-29510"`.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// The probe listener's port range when `--probe-ports` is not given: the
/// cluster stage listens there, and the firewall kind checks it.
pub const PROBE_PORTS_VAR: &str = "PREFLIGHT_PROBE_PORTS";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn parse(text: &str) -> Result<PortRange, String> {
        let port = |t: &str| -> Result<u16, String> {
            match t.trim().parse::<u32>() {
                Ok(p) if (1..=65535).contains(&p) => Ok(p as u16),
                Ok(p) => Err(format!("port {p} is outside 1-65535")),
                Err(_) => Err(format!(
                    "invalid port `{}`: write a number or a range like 29500-29510",
                    t.trim()
                )),
            }
        };
        let range = match text.split_once('-') {
            Some((a, b)) => PortRange {
                first: port(a)?,
                last: port(b)?,
            },
            None => {
                let p = port(text)?;
                PortRange { first: p, last: p }
            }
        };
        if range.first > range.last {
            return Err(format!("port range `{text}` runs backwards"));
        }
        Ok(range)
    }

    pub fn ports(self) -> impl Iterator<Item = u16> {
        self.first..=self.last
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(i64),
            Text(String),
        }
        let text = match Raw::deserialize(deserializer)? {
            Raw::Number(n) => n.to_string(),
            Raw::Text(t) => t,
        };
        PortRange::parse(&text).map_err(de::Error::custom)
    }
}

impl Serialize for PortRange {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

/// The ports of the ranges plus, when set and valid, the port in `var`.
pub fn with_env_port(ranges: &[PortRange], env_port: Option<&str>) -> Vec<u16> {
    let mut ports: Vec<u16> = ranges.iter().flat_map(|r| r.ports()).collect();
    if let Some(p) = env_port.and_then(|v| v.trim().parse::<u16>().ok())
        && p > 0
        && !ports.contains(&p)
    {
        ports.push(p);
    }
    ports
}

/// `29500-29510 and 31000` style summary of a port list.
pub fn describe(ports: &[u16]) -> String {
    let mut sorted = ports.to_vec();
    sorted.sort_unstable();
    let mut ranges: Vec<(u16, u16)> = Vec::new();
    for p in sorted {
        match ranges.last_mut() {
            Some((_, last)) if *last + 1 == p => *last = p,
            _ => ranges.push((p, p)),
        }
    }
    let parts: Vec<String> = ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                format!("port {a}")
            } else {
                format!("ports {a}-{b}")
            }
        })
        .collect();
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ports_and_ranges() {
        assert_eq!(
            PortRange::parse("29500-29510").unwrap(),
            PortRange {
                first: 29500,
                last: 29510
            }
        );
        assert_eq!(PortRange::parse("22").unwrap().to_string(), "22");
        assert!(PortRange::parse("0").is_err());
        assert!(PortRange::parse("70000").is_err());
        assert!(PortRange::parse("10-5").is_err());
        assert!(PortRange::parse("http").is_err());
        assert_eq!(
            with_env_port(&[PortRange::parse("1-2").unwrap()], Some("9")),
            vec![1, 2, 9]
        );
    }
}
