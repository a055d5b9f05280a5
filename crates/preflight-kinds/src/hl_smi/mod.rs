//! `hl_smi`: Gaudi devices as Habana's `hl-smi` reports them, one subject
//! per check: the devices (every one on the PCI bus answers, module ids
//! distinct, the visibility variables name devices that exist), ECC
//! counts, clock throttling, a reset the device waits for, and the
//! integrated NIC's ports (every port up; the scale-out ports that are
//! Linux interfaces up and at the generation's rate). A recording per
//! output stands in for the tool in tests and replays.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::tool_output::Tool;
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params, problems_finding};
pub mod parse;
use parse::{PortState, Report, Row};
use preflight_facts::{Facts, Vendor};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "hl_smi",
    scope: crate::Scope::Node,
    area: "accelerators",
    summary: "Intel Gaudi devices through `hl-smi`, one `subject` per check: `devices` (each device on the PCI bus listed, module ids distinct, HABANA_VISIBLE_DEVICES and HABANA_VISIBLE_MODULES naming devices that exist), `ecc` (uncorrectable and correctable counts), `throttle` (power and thermal slowdown), `reset` (module status, row replacement pending) and `nic_ports` (every port of the integrated NIC up; the scale-out ports that are Linux interfaces up and at 100 Gb/s on Gaudi 2, 200 Gb/s on Gaudi 3).",
    params: &[
        ParamDoc {
            name: "subject",
            ty: "devices|ecc|throttle|reset|nic_ports",
            default: None,
            doc: "What the check reads: `hl-smi -Q` for devices and ecc, `hl-smi -q` for throttle and reset, `hl-smi -n link` per device for nic_ports.",
        },
        ParamDoc {
            name: "devices",
            ty: "integer",
            default: Some("(as many as the PCI bus has)"),
            doc: "devices: how many Gaudi devices the node must have.",
        },
        ParamDoc {
            name: "max_uncorrectable",
            ty: "integer",
            default: Some("0"),
            doc: "ecc: the most uncorrectable errors a device may have counted (the larger of aggregate and volatile, of the device and of its HBM).",
        },
        ParamDoc {
            name: "max_correctable",
            ty: "integer",
            default: Some("unset"),
            doc: "ecc: the most correctable errors a device may have counted.",
        },
        ParamDoc {
            name: "ports",
            ty: "integer",
            default: Some("(what most devices on the node list)"),
            doc: "nic_ports: the ports hl-smi must list up on every device (21 internal ones on an HLS-2 or HLS-3).",
        },
        ParamDoc {
            name: "scale_out",
            ty: "boolean",
            default: Some("true"),
            doc: "nic_ports: judge the device's Linux interfaces (its scale-out ports): set false where the node scales out over host NICs and leaves them uncabled.",
        },
        ParamDoc {
            name: "speed_gbps",
            ty: "integer",
            default: Some("(the node's profile, else 100 on Gaudi 2, 200 on Gaudi 3)"),
            doc: "nic_ports: the rate every scale-out port that is a Linux interface must run at.",
        },
        ParamDoc {
            name: "hl_smi_query",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `hl-smi -Q FIELDS -f csv,nounits` with its header, FIELDS being: index, module_id, bus_id, name, serial, driver_version, ecc.errors.uncorrected.aggregate.total, ecc.errors.uncorrected.volatile.total, ecc.errors.corrected.aggregate.total, ecc.errors.corrected.volatile.total, ecc.errors.dram.aggregate.total, ecc.errors.dram.volatile.total, ecc.errors.dram-corrected.aggregate.total, ecc.errors.dram-corrected.volatile.total (joined by commas, no spaces).",
        },
        ParamDoc {
            name: "hl_smi_report",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `hl-smi -q`.",
        },
        ParamDoc {
            name: "hl_smi_links",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `hl-smi -n link -i BUS` of every device, each under a `=== BUS ===` line.",
        },
        ParamDoc {
            name: "hl_smi",
            ty: "path",
            default: Some("hl-smi"),
            doc: "The hl-smi program (on PATH unless a path).",
        },
    ],
    hint_vars: &["devices"],
    parse: parse_params::<HlSmi>,
};

/// The fields query mode is asked for (Habana's documented names); the
/// `hl_smi_query` parameter's documentation lists them (a test holds the
/// two equal).
pub const QUERY: &str = "index,module_id,bus_id,name,serial,driver_version,ecc.errors.uncorrected.aggregate.total,ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.aggregate.total,ecc.errors.corrected.volatile.total,ecc.errors.dram.aggregate.total,ecc.errors.dram.volatile.total,ecc.errors.dram-corrected.aggregate.total,ecc.errors.dram-corrected.volatile.total";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
enum Subject {
    Devices,
    Ecc,
    Throttle,
    Reset,
    NicPorts,
}

fn default_program() -> PathBuf {
    PathBuf::from("hl-smi")
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HlSmi {
    subject: Subject,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    devices: Option<u32>,
    #[serde(default)]
    max_uncorrectable: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_correctable: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ports: Option<usize>,
    #[serde(default = "yes")]
    scale_out: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    speed_gbps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hl_smi_query: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hl_smi_report: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hl_smi_links: Option<PathBuf>,
    #[serde(default = "default_program")]
    hl_smi: PathBuf,
}

impl Params for HlSmi {
    fn validate(&self) -> Result<(), String> {
        let only = super::only_for;
        use Subject::*;
        only(
            self.devices.is_some() && self.subject != Devices,
            "devices",
            "devices",
        )?;
        only(
            self.max_correctable.is_some() && self.subject != Ecc,
            "max_correctable",
            "ecc",
        )?;
        for (set, name) in [
            (self.speed_gbps.is_some(), "speed_gbps"),
            (self.ports.is_some(), "ports"),
            (!self.scale_out, "scale_out"),
        ] {
            only(set && self.subject != NicPorts, name, "nic_ports")?;
        }
        only(
            self.hl_smi_query.is_some() && !matches!(self.subject, Devices | Ecc),
            "hl_smi_query",
            "devices or ecc",
        )?;
        only(
            self.hl_smi_report.is_some() && !matches!(self.subject, Throttle | Reset),
            "hl_smi_report",
            "throttle or reset",
        )?;
        only(
            self.hl_smi_links.is_some() && self.subject != NicPorts,
            "hl_smi_links",
            "nic_ports",
        )?;
        if self.hl_smi.as_os_str().is_empty() {
            return Err("`hl_smi` is empty".into());
        }
        Ok(())
    }
}

/// The node's Gaudi devices on the PCI bus: bus id to PCI device id.
fn pci_devices(facts: &Facts) -> BTreeMap<String, u16> {
    facts
        .accelerators()
        .iter()
        .filter(|a| a.vendor == Vendor::Habana)
        .map(|a| (a.pci.address.to_ascii_lowercase(), a.pci.device))
        .collect()
}

fn row_name(row: &Row) -> String {
    match (row.get("index"), row.get("bus_id")) {
        (Some(i), Some(b)) => format!("AIP {i} ({})", b.to_ascii_lowercase()),
        (Some(i), None) => format!("AIP {i}"),
        (None, Some(b)) => b.to_ascii_lowercase(),
        (None, None) => "a device".into(),
    }
}

/// The comma-separated numbers of a visibility variable, or `all`.
fn listed(value: &str) -> Option<Vec<&str>> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("all") {
        return None;
    }
    Some(value.split(',').map(str::trim).collect())
}

fn judge_devices(check: &HlSmi, facts: &Facts, rows: &[Row], source: &str) -> Finding {
    let pci = pci_devices(facts);
    let mut problems = Vec::new();
    let mut about = Vec::new();
    let buses: BTreeSet<String> = rows
        .iter()
        .filter_map(|r| r.get("bus_id"))
        .map(str::to_ascii_lowercase)
        .collect();
    for bus in pci.keys() {
        if !buses.contains(bus) {
            problems.push(format!(
                "{bus} is a Gaudi device on the PCI bus that hl-smi does not list"
            ));
        }
    }
    if rows.is_empty() {
        problems.push(format!("{source} lists no Gaudi device"));
    }
    let expected = check.devices.map(|n| n as usize).unwrap_or(pci.len());
    if check.devices.is_some() && rows.len() != expected {
        problems.push(format!(
            "hl-smi lists {} devices where the node must have {expected}",
            rows.len()
        ));
    }
    let mut modules: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for r in rows {
        if let Some(m) = r.get("module_id") {
            modules.entry(m).or_default().push(row_name(r));
        }
    }
    for (m, holders) in &modules {
        if holders.len() > 1 {
            problems.push(format!(
                "module id {m} is reported by {}: a module id names one OAM slot",
                holders.join(" and ")
            ));
        }
    }
    let indices: BTreeSet<&str> = rows.iter().filter_map(|r| r.get("index")).collect();
    for (var, known, what) in [
        ("HABANA_VISIBLE_DEVICES", &indices, "device index"),
        (
            "HABANA_VISIBLE_MODULES",
            &modules.keys().copied().collect::<BTreeSet<&str>>(),
            "module id",
        ),
    ] {
        let Some(value) = facts.env(var) else {
            continue;
        };
        let Some(items) = listed(value) else {
            continue;
        };
        let mut seen = BTreeSet::new();
        for item in items {
            if !seen.insert(item) {
                problems.push(format!("{var}={value} names {what} {item} twice"));
                about.push(var);
            } else if !known.contains(item) {
                let have: Vec<&str> = known.iter().copied().collect();
                problems.push(format!(
                    "{var}={value} names {what} `{item}`, which hl-smi does not list (it lists {})",
                    if have.is_empty() {
                        "none".to_string()
                    } else {
                        have.join(", ")
                    }
                ));
                about.push(var);
            }
        }
    }
    let names: Vec<String> = rows.iter().map(row_name).collect();
    let measured = format!("{} devices", rows.len());
    let finding = if problems.is_empty() {
        let products: BTreeSet<&str> = rows.iter().filter_map(|r| r.get("name")).collect();
        let drivers: BTreeSet<&str> = rows
            .iter()
            .filter_map(|r| r.get("driver_version"))
            .collect();
        Finding::pass(format!(
            "{measured} ({}), driver {}, from {source}",
            products.into_iter().collect::<Vec<_>>().join(", "),
            drivers.into_iter().collect::<Vec<_>>().join(", ")
        ))
    } else {
        problems_finding(&problems).about_variables(about)
    };
    finding
        .measured(measured)
        .expected(format!("{expected} devices"))
        .var("devices", names.join(", "))
}

fn judge_ecc(check: &HlSmi, rows: &[Row]) -> Finding {
    let mut problems = Vec::new();
    let mut unjudged = Vec::new();
    let mut read = 0;
    for r in rows {
        // The device's own count and its HBM's, the larger of aggregate
        // and volatile (since the driver loaded, since the last reset).
        let count = |fields: [&str; 2]| -> Result<Option<u64>, String> {
            let mut most = None;
            for f in fields {
                if let Some(n) = r.number(f)? {
                    most = Some(most.map_or(n, |m: u64| m.max(n)));
                }
            }
            Ok(most)
        };
        let worst = |a: [&str; 2], b: [&str; 2]| -> Result<Option<u64>, String> {
            Ok(match (count(a)?, count(b)?) {
                (Some(x), Some(y)) => Some(x.max(y)),
                (x, y) => x.or(y),
            })
        };
        let ue = worst(
            [
                "ecc.errors.uncorrected.aggregate.total",
                "ecc.errors.uncorrected.volatile.total",
            ],
            [
                "ecc.errors.dram.aggregate.total",
                "ecc.errors.dram.volatile.total",
            ],
        );
        let ce = worst(
            [
                "ecc.errors.corrected.aggregate.total",
                "ecc.errors.corrected.volatile.total",
            ],
            [
                "ecc.errors.dram-corrected.aggregate.total",
                "ecc.errors.dram-corrected.volatile.total",
            ],
        );
        let (ue, ce) = match (ue, ce) {
            (Ok(ue), Ok(ce)) => (ue, ce),
            (Err(e), _) | (_, Err(e)) => return Finding::error(format!("{}: {e}", row_name(r))),
        };
        let Some(ue) = ue else {
            unjudged.push(format!("{}: no uncorrectable count (N/A)", row_name(r)));
            continue;
        };
        read += 1;
        if ue > check.max_uncorrectable {
            problems.push(format!(
                "{}: {ue} uncorrectable ECC errors (at most {})",
                row_name(r),
                check.max_uncorrectable
            ));
        }
        if let (Some(ce), Some(max)) = (ce, check.max_correctable)
            && ce > max
        {
            problems.push(format!(
                "{}: {ce} correctable ECC errors (at most {max})",
                row_name(r)
            ));
        }
    }
    if read == 0 && problems.is_empty() {
        return Finding::skip("no Gaudi device reports its ECC counts");
    }
    let measured = format!("ECC counts of {read} devices");
    super::judged(&problems, &unjudged, measured, |m| {
        format!("{m}: none over the limits")
    })
}

fn judge_throttle(reports: &[Report]) -> Finding {
    let mut problems = Vec::new();
    let mut unknown = Vec::new();
    let mut read = 0;
    for r in reports {
        let reasons: Vec<(&str, &str)> = r.section("Clocks Throttle Reasons").collect();
        if !reasons.is_empty() {
            read += 1;
        }
        for (reason, value) in reasons {
            match value {
                "Not Active" => {}
                "Active" => problems.push(format!("{}: {reason} active", r.name())),
                other => unknown.push(format!("{}: {reason} is `{other}`", r.name())),
            }
        }
    }
    if read == 0 {
        return Finding::skip("no Gaudi device reports its clock throttle reasons");
    }
    let measured = format!("throttle reasons of {read} devices");
    if !problems.is_empty() {
        return problems_finding(&problems).measured(measured);
    }
    if !unknown.is_empty() {
        return Finding::error(format!(
            "a throttle state preflight does not know: {}",
            unknown.join("; ")
        ));
    }
    Finding::pass(format!("{measured}: none active")).measured(measured)
}

fn judge_reset(reports: &[Report]) -> Finding {
    let mut problems = Vec::new();
    let mut unjudged = Vec::new();
    let mut read = 0;
    for r in reports {
        let status = r.get("Module status");
        let pending = r.get("Replaced Rows/Pending");
        if status.is_some() || pending.is_some() {
            read += 1;
        }
        if let Some(s) = status
            && !s.eq_ignore_ascii_case("operational")
        {
            problems.push(format!("{}: module status `{s}`", r.name()));
        }
        match pending.map(str::to_ascii_lowercase).as_deref() {
            None | Some("no") => {}
            Some("yes") => problems.push(format!(
                "{}: a row replacement is pending until the device is reset",
                r.name()
            )),
            Some(_) => unjudged.push(format!(
                "{}: replaced rows pending `{}`",
                r.name(),
                pending.unwrap_or_default()
            )),
        }
    }
    if read == 0 {
        return Finding::skip("no Gaudi device reports its module status or replaced rows");
    }
    let measured = format!("{read} devices");
    super::judged(&problems, &unjudged, measured, |m| {
        format!("{m} operational, no row replacement pending")
    })
}

/// A scale-out port that is a Linux interface of a Gaudi device.
struct Netdev {
    name: String,
    port: Option<u32>,
    up: bool,
    speed_mbps: Option<u64>,
}

fn netdevs(facts: &Facts, bus: &str) -> Vec<Netdev> {
    let dir = facts.host_path(format!("/sys/bus/pci/devices/{bus}/net"));
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .ok()
            .map(|t| t.trim().to_string())
    };
    let mut out: Vec<Netdev> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| {
                    let path = e.path();
                    Netdev {
                        name: e.file_name().to_string_lossy().into_owned(),
                        port: read(&path.join("dev_port")).and_then(|p| p.parse().ok()),
                        up: read(&path.join("operstate")).as_deref() == Some("up"),
                        speed_mbps: read(&path.join("speed"))
                            .and_then(|s| s.parse::<i64>().ok())
                            .filter(|s| *s > 0)
                            .map(|s| s as u64),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by(|a, b| a.port.cmp(&b.port).then(a.name.cmp(&b.name)));
    out
}

/// The scale-out rate of a Gaudi generation, by PCI device id (the
/// habanalabs driver's ids).
fn generation_rate(device: u16) -> Option<u32> {
    match device {
        0x1020 | 0x1021 => Some(100),
        0x1060..=0x1063 => Some(200),
        _ => None,
    }
}

fn judge_ports(
    check: &HlSmi,
    facts: &Facts,
    links: &BTreeMap<String, Vec<(u32, PortState)>>,
    source: &str,
) -> Finding {
    let pci = pci_devices(facts);
    let mut problems = Vec::new();
    let mut up = 0;
    let mut total = 0;
    for bus in pci.keys() {
        if !links.contains_key(bus) {
            problems.push(format!("{bus}: not in {source}: its ports were not read"));
        }
    }
    let usual = super::most_common(
        links
            .values()
            .map(|p| p.iter().filter(|(_, s)| *s == PortState::Up).count()),
    );
    let (expected, why) = match (check.ports, usual) {
        (Some(n), _) => (Some(n), "as the check sets"),
        (None, Some(n)) => (Some(n), "as most devices here"),
        (None, None) => (None, ""),
    };
    for (bus, ports) in links {
        total += ports.len();
        up += ports.iter().filter(|(_, s)| *s == PortState::Up).count();
        let down: Vec<String> = ports
            .iter()
            .filter(|(_, s)| *s == PortState::Down)
            .map(|(p, _)| p.to_string())
            .collect();
        if ports.is_empty() {
            problems.push(format!("{bus}: hl-smi lists no port"));
        } else if !down.is_empty() {
            problems.push(format!(
                "{bus}: port{} {} down ({} of {} up)",
                if down.len() == 1 { "" } else { "s" },
                down.join(", "),
                ports.len() - down.len(),
                ports.len()
            ));
        } else if let Some(e) = expected.filter(|e| ports.len() < *e) {
            problems.push(format!(
                "{bus}: hl-smi lists {} ports up where {e} are expected {why}",
                ports.len()
            ));
        }
    }
    let mut interfaces = 0;
    let profile = facts
        .profile()
        .and_then(|p| Some((p.named(), p.expect.scale_out?.gbps)));
    for (bus, device) in pci.iter().filter(|_| check.scale_out) {
        let (rate, why) = match (check.speed_gbps, &profile, generation_rate(*device)) {
            (Some(r), _, _) => (Some(r), "as the check sets".to_string()),
            (None, Some((name, r)), _) => (Some(*r), format!("as {name} sets")),
            (None, None, Some(r)) => (Some(r), "the generation's rate".to_string()),
            (None, None, None) => (None, String::new()),
        };
        let mut down = Vec::new();
        // (interface, Gb/s) below the rate.
        let mut slow = Vec::new();
        for n in netdevs(facts, bus) {
            interfaces += 1;
            let port = n.port.map(|p| format!(" (port {p})")).unwrap_or_default();
            if !n.up {
                down.push(format!("{}{port}", n.name));
            } else if let (Some(rate), Some(speed)) = (rate, n.speed_mbps)
                && speed < u64::from(rate) * 1000
            {
                slow.push((format!("{}{port}", n.name), speed / 1000));
            }
        }
        let several = |n: usize, one: &str, many: &str| if n == 1 { one } else { many }.to_string();
        if !down.is_empty() {
            problems.push(format!(
                "{bus}: {} {} {}",
                several(down.len(), "interface", "interfaces"),
                down.join(", "),
                several(down.len(), "is down", "are down")
            ));
        }
        if let (false, Some(rate)) = (slow.is_empty(), rate) {
            let speeds: BTreeSet<u64> = slow.iter().map(|(_, s)| *s).collect();
            let names: Vec<String> = slow
                .iter()
                .map(|(n, s)| {
                    if speeds.len() == 1 {
                        n.clone()
                    } else {
                        format!("{n} {s} Gb/s")
                    }
                })
                .collect();
            let at = match speeds.iter().next() {
                Some(s) if speeds.len() == 1 => format!(" at {s} Gb/s"),
                _ => String::new(),
            };
            problems.push(format!(
                "{bus}: {} {} {}{at}, not {rate} ({why})",
                several(slow.len(), "interface", "interfaces"),
                names.join(", "),
                several(slow.len(), "runs", "run")
            ));
        }
    }
    let measured = format!(
        "{up} of {total} ports up on {} devices; {interfaces} scale-out interfaces",
        links.len()
    );
    if problems.is_empty() {
        Finding::pass(format!("{measured}, from {source}")).measured(measured)
    } else {
        problems_finding(&problems).measured(measured)
    }
}

impl HlSmi {
    fn tool(&self, args: &[&str], param: &'static str) -> Tool<'static> {
        let mut argv = vec![self.hl_smi.display().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        Tool {
            argv,
            param,
            package: "Intel Gaudi software: habanalabs-firmware-tools",
        }
    }

    async fn query(&self, facts: &Facts) -> Result<(Vec<Row>, String), Finding> {
        let tool = self.tool(&["-Q", QUERY, "-f", "csv,nounits"], "hl_smi_query");
        let (text, source) = tool
            .output(self.hl_smi_query.as_deref(), facts)
            .await
            .text()?;
        parse::parse_query(&source, &text)
            .map(|rows| (rows, source))
            .map_err(Finding::error)
    }

    async fn report(&self, facts: &Facts) -> Result<Vec<Report>, Finding> {
        let tool = self.tool(&["-q"], "hl_smi_report");
        let (text, source) = tool
            .output(self.hl_smi_report.as_deref(), facts)
            .await
            .text()?;
        parse::parse_report(&source, &text).map_err(Finding::error)
    }

    async fn links(
        &self,
        facts: &Facts,
    ) -> Result<(BTreeMap<String, Vec<(u32, PortState)>>, String), Finding> {
        if self.hl_smi_links.is_some() {
            let tool = self.tool(&["-n", "link"], "hl_smi_links");
            let (text, source) = tool
                .output(self.hl_smi_links.as_deref(), facts)
                .await
                .text()?;
            return parse::parse_links(&source, &text, None)
                .map(|l| (l, source))
                .map_err(Finding::error);
        }
        let mut all = BTreeMap::new();
        for bus in pci_devices(facts).keys() {
            let tool = self.tool(&["-n", "link", "-i", bus], "hl_smi_links");
            let (text, source) = tool.output(None, facts).await.text()?;
            let one = parse::parse_links(&source, &text, Some(bus)).map_err(Finding::error)?;
            all.insert(bus.clone(), one.into_values().flatten().collect());
        }
        Ok((all, "`hl-smi -n link`".into()))
    }

    async fn judge(&self, facts: &Facts) -> Result<Finding, Finding> {
        Ok(match self.subject {
            Subject::Devices => {
                let (rows, source) = self.query(facts).await?;
                judge_devices(self, facts, &rows, &source)
            }
            Subject::Ecc => judge_ecc(self, &self.query(facts).await?.0),
            Subject::Throttle => judge_throttle(&self.report(facts).await?),
            Subject::Reset => judge_reset(&self.report(facts).await?),
            Subject::NicPorts => {
                let (links, source) = self.links(facts).await?;
                judge_ports(self, facts, &links, &source)
            }
        })
    }

    fn recorded(&self) -> bool {
        self.hl_smi_query.is_some() || self.hl_smi_report.is_some() || self.hl_smi_links.is_some()
    }
}

impl Probe for HlSmi {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            let present = super::vendor_present(&facts, Vendor::Habana).await;
            if !self.recorded() && !present {
                return Finding::skip("no Gaudi device present");
            }
            match self.judge(&facts).await {
                Ok(f) | Err(f) => f,
            }
        })
    }
}

/// The fuzz target's way in (`fuzz/`): a recording read as query rows,
/// as `hl-smi -q`, or as port states, judged over a node with no Gaudi
/// device. A port down, or a throttle reason active, never makes a pass.
#[cfg(feature = "fuzzing")]
pub fn judge_for_fuzzing(which: u8, text: &str) {
    use preflight_result::Status;
    let facts = Facts::new(
        PathBuf::from("/nonexistent-fuzz-root"),
        Default::default(),
        Vec::new(),
    );
    let check = |subject| HlSmi {
        subject,
        devices: None,
        max_uncorrectable: 0,
        max_correctable: None,
        ports: None,
        scale_out: true,
        speed_gbps: None,
        hl_smi_query: None,
        hl_smi_report: None,
        hl_smi_links: None,
        hl_smi: default_program(),
    };
    match which % 3 {
        0 => {
            if let Ok(rows) = parse::parse_query("f", text) {
                let _ = judge_devices(&check(Subject::Devices), &facts, &rows, "f");
                let f = judge_ecc(&check(Subject::Ecc), &rows);
                // An uncorrectable count, or none said: never a pass.
                let bad = rows.iter().any(|r| {
                    let said = [
                        "ecc.errors.uncorrected.aggregate.total",
                        "ecc.errors.uncorrected.volatile.total",
                        "ecc.errors.dram.aggregate.total",
                        "ecc.errors.dram.volatile.total",
                    ]
                    .map(|k| r.number(k).ok().flatten());
                    said.iter().all(Option::is_none) || said.iter().flatten().any(|n| *n > 0)
                });
                if bad {
                    assert_ne!(f.status, Status::Pass, "{rows:?}");
                }
            }
        }
        1 => {
            let Ok(reports) = parse::parse_report("f", text) else {
                return;
            };
            let f = judge_throttle(&reports);
            if reports.iter().any(|r| {
                r.section("Clocks Throttle Reasons")
                    .any(|(_, v)| v == "Active")
            }) {
                assert_ne!(f.status, Status::Pass, "{reports:?}");
            }
            let _ = judge_reset(&reports);
        }
        _ => {
            let Ok(links) = parse::parse_links("f", text, None) else {
                return;
            };
            let f = judge_ports(&check(Subject::NicPorts), &facts, &links, "f");
            if links.values().flatten().any(|(_, s)| *s == PortState::Down) {
                assert_ne!(f.status, Status::Pass, "{links:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_documented_fields_are_the_query() {
        let doc = super::KIND
            .params
            .iter()
            .find(|p| p.name == "hl_smi_query")
            .unwrap()
            .doc;
        assert!(doc.contains(&super::QUERY.replace(',', ", ")), "{doc}");
    }
}
