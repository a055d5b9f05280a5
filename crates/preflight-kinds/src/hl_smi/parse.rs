//! What Habana's `hl-smi` prints about the node's Gaudi devices, read as
//! it prints it (fixtures/habana-tools/README.md names the source of each
//! field):
//! - query mode, `hl-smi -Q FIELDS -f csv,nounits`: a header of field
//!   names (a unit in brackets after some: `power.draw [W]`), then one row
//!   per device, the values separated by `, `; `N/A` where a device does
//!   not say;
//! - the full report, `hl-smi -q`: a `[N] AIP (accelN) BUS` line opens
//!   each device; keys padded to a colon, sections by indentation, and
//!   some values on the line after their key (`Thermal Slowdown` then
//!   `: Not Active`);
//! - the integrated NIC's ports, `hl-smi -n link -i BUS`: `port  N:` and
//!   `UP` or `DOWN` per port. A recording holds several devices, each
//!   under a `=== BUS ===` line (what a loop over `-i` prints with `echo`).
//!
//! Anything else on a line these readers expect is an error naming the
//! line, never a device skipped.

use std::collections::BTreeMap;

/// One row of query mode: field name (unit stripped) to value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub values: BTreeMap<String, String>,
}

impl Row {
    pub fn get(&self, field: &str) -> Option<&str> {
        self.values
            .get(field)
            .map(String::as_str)
            .filter(|v| !v.is_empty() && *v != "N/A")
    }

    /// A count or size: the number before any unit (`226 W`, `0`).
    pub fn number(&self, field: &str) -> Result<Option<u64>, String> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        let digits = v.split_whitespace().next().unwrap_or("");
        digits
            .parse()
            .map(Some)
            .map_err(|_| format!("`{field}` is `{v}`, not a number"))
    }
}

/// `hl-smi -Q ... -f csv[,nounits]`, with its header.
pub fn parse_query(source: &str, text: &str) -> Result<Vec<Row>, String> {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else {
        return Err(format!("{source}: empty (no header line)"));
    };
    let fields: Vec<String> = header
        .split(',')
        .map(|f| {
            let f = f.trim();
            f.split_once(" [").map_or(f, |(name, _)| name).to_string()
        })
        .collect();
    // hl-smi's field names: lower case, dotted (`ecc.errors.dram-corrected
    // .aggregate.total`); a row read as the header (`noheader`) is not.
    if fields.iter().any(|f| {
        !f.starts_with(|c: char| c.is_ascii_lowercase())
            || !f.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
            })
    }) {
        return Err(format!(
            "{source}:1: `{}` is not a header of hl-smi field names (record with `-f csv`, not `noheader`)",
            header.trim()
        ));
    }
    let mut rows = Vec::new();
    for (n, line) in lines {
        let values: Vec<&str> = line.split(", ").map(str::trim).collect();
        if values.len() != fields.len() {
            return Err(format!(
                "{source}:{}: {} values where the header names {} fields",
                n + 1,
                values.len(),
                fields.len()
            ));
        }
        rows.push(Row {
            values: fields
                .iter()
                .cloned()
                .zip(values.into_iter().map(String::from))
                .collect(),
        });
    }
    Ok(rows)
}

/// One device of `hl-smi -q`: its place and the keys read, each as
/// `Section/Key` (top-level keys alone).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub index: u32,
    pub accel: String,
    pub bus: String,
    pub keys: Vec<(String, String)>,
}

impl Report {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.keys
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The keys of one section, in order: (key, value).
    pub fn section<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.keys.iter().filter_map(move |(k, v)| {
            k.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('/'))
                .map(|rest| (rest.rsplit('/').next().unwrap_or(rest), v.as_str()))
        })
    }

    pub fn name(&self) -> String {
        format!("AIP {} ({})", self.index, self.bus)
    }
}

/// `[0] AIP (accel0) 0000:43:00.0`.
fn device_line(line: &str) -> Option<(u32, String, String)> {
    let rest = line.strip_prefix('[')?;
    let (index, rest) = rest.split_once(']')?;
    let rest = rest.trim().strip_prefix("AIP (")?;
    let (accel, bus) = rest.split_once(')')?;
    Some((
        index.trim().parse().ok()?,
        accel.to_string(),
        bus.trim().to_string(),
    ))
}

/// `hl-smi -q`: every device's report.
pub fn parse_report(source: &str, text: &str) -> Result<Vec<Report>, String> {
    let mut devices: Vec<Report> = Vec::new();
    // (indentation, name) of the sections open at this line.
    let mut sections: Vec<(usize, String)> = Vec::new();
    // A key whose value is on the next line.
    let mut pending: Option<(usize, String)> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        if line.trim().is_empty() {
            continue;
        }
        if let Some((index, accel, bus)) = device_line(line) {
            devices.push(Report {
                index,
                accel,
                bus,
                keys: Vec::new(),
            });
            sections.clear();
            pending = None;
            continue;
        }
        let Some(device) = devices.last_mut() else {
            // The log's own header (timestamp, versions, AIP count).
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        let body = line.trim();
        if let Some(value) = body.strip_prefix(':') {
            let Some((_, key)) = pending.take() else {
                return Err(format!(
                    "{source}:{}: a value with no key before it: `{body}`",
                    n + 1
                ));
            };
            sections.retain(|(_, s)| *s != key);
            device
                .keys
                .push((path(&sections, &key), value.trim().to_string()));
            continue;
        }
        while sections.last().is_some_and(|(i, _)| *i >= indent) {
            sections.pop();
        }
        match body.split_once(" :").or_else(|| body.split_once(':')) {
            Some((key, value)) if !value.trim().is_empty() || body.ends_with(':') => {
                let key = key.trim();
                // `[ 1] On Chip 0` and `[1] soc`: the label is the key.
                let key = key
                    .strip_prefix('[')
                    .and_then(|k| k.split_once(']'))
                    .map_or(key, |(_, k)| k.trim());
                device
                    .keys
                    .push((path(&sections, key), value.trim().to_string()));
                pending = None;
            }
            _ => {
                // A section, or a key whose value follows on the next line.
                pending = Some((indent, body.to_string()));
                sections.push((indent, body.to_string()));
            }
        }
    }
    if devices.is_empty() {
        return Err(format!(
            "{source}: no `[N] AIP (accelN) BUS` line: not an `hl-smi -q` report"
        ));
    }
    Ok(devices)
}

fn path(sections: &[(usize, String)], key: &str) -> String {
    let mut p: Vec<&str> = sections.iter().map(|(_, s)| s.as_str()).collect();
    p.push(key);
    p.join("/")
}

/// One port's state in `hl-smi -n link`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    Up,
    Down,
}

/// The ports of each device: bus to (port, state), in the order printed.
pub fn parse_links(
    source: &str,
    text: &str,
    only_bus: Option<&str>,
) -> Result<BTreeMap<String, Vec<(u32, PortState)>>, String> {
    let mut out: BTreeMap<String, Vec<(u32, PortState)>> = BTreeMap::new();
    let mut bus = only_bus.map(str::to_string);
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(b) = line.strip_prefix("===").and_then(|l| l.strip_suffix("===")) {
            bus = Some(b.trim().to_string());
            out.entry(b.trim().to_string()).or_default();
            continue;
        }
        let bad = || format!("{source}:{}: `{line}` is not `port N: UP|DOWN`", n + 1);
        let (port, state) = line
            .strip_prefix("port")
            .and_then(|l| l.split_once(':'))
            .ok_or_else(bad)?;
        let port: u32 = port.trim().parse().map_err(|_| bad())?;
        let state = match state.trim() {
            "UP" => PortState::Up,
            "DOWN" => PortState::Down,
            _ => return Err(bad()),
        };
        let Some(b) = &bus else {
            return Err(format!(
                "{source}:{}: a port before any `=== BUS ===` line",
                n + 1
            ));
        };
        out.entry(b.clone()).or_default().push((port, state));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_rows_with_units_in_the_header_or_the_values() {
        let text = "name, uuid, power.draw [W], memory.used [MiB]\nHL-205, 00P1-X, 103, 512\n";
        let rows = parse_query("q", text).unwrap();
        assert_eq!(rows[0].get("power.draw"), Some("103"));
        assert_eq!(rows[0].number("memory.used").unwrap(), Some(512));
        let units = "index, power.draw\n0, 226 W\n1, N/A\n";
        let rows = parse_query("q", units).unwrap();
        assert_eq!(rows[0].number("power.draw").unwrap(), Some(226));
        assert_eq!(rows[1].number("power.draw").unwrap(), None);
        assert!(
            parse_query("q", "index, name\n0\n")
                .unwrap_err()
                .starts_with("q:2: 1 values")
        );
        assert!(parse_query("q", "0, HL-325L, 1.22.1\n").is_err());
    }

    #[test]
    fn report_values_on_the_next_line_and_sections() {
        let text = "================ HL-SMI LOG ================\n\nAttached AIPs                           : 8\n\n[0] AIP (accel0) 0000:43:00.0\n        Module status                   : Operational\n        Module ID                       : 0\n        Fan Speed\n                                        : N/A\n        Clocks Throttle Reasons\n                HW Slowdown             : Not Active\n                        Thermal Slowdown\n                                        : Active\n                        Power Slowdown\n                                        : Not Active\n        Temperature\n                [ 1] On Chip 0          :  29 C\n        Replaced Rows\n                Single Bit ECC          : 0\n                Pending                 : No\n";
        let r = parse_report("q", text).unwrap();
        assert_eq!(r[0].bus, "0000:43:00.0");
        assert_eq!(r[0].get("Module status"), Some("Operational"));
        assert_eq!(r[0].get("Fan Speed"), Some("N/A"));
        let throttle: Vec<_> = r[0].section("Clocks Throttle Reasons").collect();
        assert_eq!(
            throttle,
            vec![
                ("HW Slowdown", "Not Active"),
                ("Thermal Slowdown", "Active"),
                ("Power Slowdown", "Not Active")
            ]
        );
        assert_eq!(r[0].get("Temperature/On Chip 0"), Some("29 C"));
        assert_eq!(r[0].get("Replaced Rows/Pending"), Some("No"));
        assert!(parse_report("q", "Attached AIPs : 0\n").is_err());
    }

    #[test]
    fn links_per_device() {
        let text = "=== 0000:bb:00.0 ===\nport  0:\tUP\nport 10:        DOWN\n=== 0000:bc:00.0 ===\nport  0:\tUP\n";
        let l = parse_links("l", text, None).unwrap();
        assert_eq!(
            l["0000:bb:00.0"],
            vec![(0, PortState::Up), (10, PortState::Down)]
        );
        assert_eq!(l["0000:bc:00.0"].len(), 1);
        assert!(parse_links("l", "port 0: UP\n", None).is_err());
        assert!(
            parse_links("l", "port 0: MAYBE\n", Some("b"))
                .unwrap_err()
                .contains("l:1")
        );
    }
}
