//! `xpu_smi`: Intel Data Center GPU Max as Intel's `xpu-smi` reports it,
//! one subject per check: its diagnostic at a level (as `dcgm_diag` reads
//! DCGM's: every failing component named, an unknown result never a
//! pass), the health of temperatures, power and memory, the Xe Links
//! between cards, and frequency throttling. A recording per output stands
//! in for the tool in tests and replays.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::tool_output::Tool;
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
pub mod parse;
use parse::{Health, Tile};
use preflight_facts::{Facts, Vendor};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "xpu_smi",
    scope: crate::Scope::Node,
    area: "accelerators",
    summary: "Intel Data Center GPU Max through `xpu-smi`, one `subject` per check: `diag` (its diagnostic at `level` 1 to 3, each failing component named, an unknown result never a pass), `health` (core and memory temperature, power and memory health, and every card listed), `xe_link` (the Xe Link ports' health and the tile matrix: every pair of cards joined by Xe Link, none on PCIe alone, no link with fewer lanes than its peers) and `throttle` (frequency throttled by power, current or temperature).",
    params: &[
        ParamDoc {
            name: "subject",
            ty: "diag|health|xe_link|throttle",
            default: None,
            doc: "What the check reads: `xpu-smi diag -l LEVEL -j`, `xpu-smi health -l -j`, with `xpu-smi topology -m` for xe_link.",
        },
        ParamDoc {
            name: "level",
            ty: "1-3",
            default: Some("1"),
            doc: "diag: 1 quick (software, permissions, a light computation), 2 adds PCIe, 3 adds performance, memory errors and Xe Link throughput (minutes). The check's timeout, unless set, follows it: 2 min, 10 min, 45 min.",
        },
        ParamDoc {
            name: "xpu_smi_diag",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `xpu-smi diag -l LEVEL -j`.",
        },
        ParamDoc {
            name: "xpu_smi_health",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `xpu-smi health -l -j`.",
        },
        ParamDoc {
            name: "xpu_smi_topology",
            ty: "path",
            default: Some("unset"),
            doc: "xe_link: a recorded `xpu-smi topology -m`.",
        },
        ParamDoc {
            name: "xpu_smi",
            ty: "path",
            default: Some("xpu-smi"),
            doc: "The xpu-smi program (on PATH unless a path).",
        },
    ],
    hint_vars: &["action"],
    parse: parse_params::<XpuSmi>,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
enum Subject {
    Diag,
    Health,
    XeLink,
    Throttle,
}

fn default_level() -> u8 {
    1
}

fn default_program() -> PathBuf {
    PathBuf::from("xpu-smi")
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct XpuSmi {
    subject: Subject,
    #[serde(default = "default_level")]
    level: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    xpu_smi_diag: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    xpu_smi_health: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    xpu_smi_topology: Option<PathBuf>,
    #[serde(default = "default_program")]
    xpu_smi: PathBuf,
}

impl Params for XpuSmi {
    fn validate(&self) -> Result<(), String> {
        if !(1..=3).contains(&self.level) {
            return Err(format!("`level` must be 1 to 3, found {}", self.level));
        }
        let diag = self.subject == Subject::Diag;
        if self.level != 1 && !diag {
            return Err("`level` applies to `subject: diag` only".into());
        }
        if self.xpu_smi_diag.is_some() && !diag {
            return Err("`xpu_smi_diag` applies to `subject: diag` only".into());
        }
        if self.xpu_smi_health.is_some() && diag {
            return Err(
                "`xpu_smi_health` applies to `subject: health, xe_link or throttle` only".into(),
            );
        }
        if self.xpu_smi_topology.is_some() && self.subject != Subject::XeLink {
            return Err("`xpu_smi_topology` applies to `subject: xe_link` only".into());
        }
        if self.xpu_smi.as_os_str().is_empty() {
            return Err("`xpu_smi` is empty".into());
        }
        Ok(())
    }
}

/// The readable name of a diagnostic component (the CLI's table names).
fn component_name(kind: &str) -> String {
    let short = kind.strip_prefix("XPUM_DIAG_").unwrap_or(kind);
    let mut words: Vec<String> = short
        .split('_')
        .map(|w| {
            let lower = w.to_ascii_lowercase();
            let mut c = lower.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect();
    for w in &mut words {
        if w == "Pcie" {
            *w = "PCIe".into();
        }
    }
    words.join(" ")
}

pub fn judge_diag(diag: &parse::Diag, level: u8) -> Finding {
    let devices = if diag.devices.is_empty() {
        String::new()
    } else {
        format!(" on device {}", diag.devices)
    };
    let summary = format!(
        "level {}: {} components{devices}",
        diag.level.unwrap_or(u64::from(level)),
        diag.components.len()
    );
    let mut finding: Option<Finding> = None;
    let mut unknown = Vec::new();
    for c in &diag.components {
        let name = component_name(&c.kind);
        // Over every device xpu-smi puts each GPU's words on a line of
        // their own: one line in a report.
        let message = c.message.split_whitespace().collect::<Vec<_>>().join(" ");
        let part = match c.result.as_str() {
            "Pass" => continue,
            "Fail" => {
                let action = if message.contains("root privilege") {
                    "run the diagnostic as root (the Slurm prolog and health check do)"
                } else if c.kind.contains("MEMORY_ERROR") {
                    "drain the node and have the GPU serviced"
                } else if c.kind.contains("XE_LINK") {
                    "check the Xe Link ports (`xpu-smi topology -m`, `xpu-smi health -l`) and the bridge cabling"
                } else {
                    "read the message, then run `xpu-smi diag -l 3` on the node"
                };
                Finding::fail(format!("{name}: {message}")).var("action", action)
            }
            other => {
                unknown.push(format!("{name}: `{other}`"));
                Finding::error(format!(
                    "{name}: xpu-smi reported `{other}`, not Pass or Fail: {message}"
                ))
                .var("action", "read xpu-smi's output by hand")
            }
        };
        let subject = c
            .kind
            .strip_prefix("XPUM_DIAG_")
            .unwrap_or(&c.kind)
            .to_ascii_lowercase();
        finding = Some(
            finding
                .unwrap_or_else(|| Finding::fail(summary.clone()))
                .part(subject, part),
        );
    }
    if let Some(f) = finding {
        return f;
    }
    match diag.result.as_str() {
        "Pass" if !diag.components.is_empty() => {
            Finding::pass(format!("{summary}, all passed")).measured("passed")
        }
        "Pass" => Finding::error(format!("{summary}: xpu-smi says Pass with no component")),
        // A failure no component carries, or a result still unknown.
        other => Finding::error(format!(
            "{summary}: xpu-smi's result is `{other}` with no failing component{}",
            if unknown.is_empty() {
                String::new()
            } else {
                format!(" ({})", unknown.join(", "))
            }
        )),
    }
}

/// The health components a subject judges.
fn components(subject: Subject) -> &'static [&'static str] {
    match subject {
        Subject::Health => &["core_temperature", "memory_temperature", "power", "memory"],
        Subject::XeLink => &["xe_link_port"],
        Subject::Throttle => &["frequency"],
        Subject::Diag => &[],
    }
}

/// Names cards by xpu-smi's number and the node's bus (xpu-smi counts
/// the node's Intel GPUs in PCI order), with the tiles sysfs shows.
struct Cards(Vec<(String, usize, u16)>);

/// Max Series OAM modules (1550, 1350), which carry Xe Link; the PCIe
/// cards (1100) have it only with a bridge.
const XE_LINK_MODULES: &[u16] = &[0x0bd5, 0x0bd6];

impl Cards {
    fn of(facts: &Facts) -> Cards {
        let mut cards: Vec<(String, usize, u16)> = facts
            .accelerators()
            .iter()
            .filter(|a| a.vendor == Vendor::Intel)
            .map(|a| (a.pci.address.clone(), a.tiles, a.pci.device))
            .collect();
        cards.sort();
        Cards(cards)
    }

    fn card(&self, id: u64) -> String {
        match self.0.get(id as usize) {
            Some((b, _, _)) => format!("GPU {id} ({b})"),
            None => format!("GPU {id}"),
        }
    }
}

/// What a subject found: problems, readings judged, and what could not
/// be (an `Unknown`): never a pass.
#[derive(Default)]
struct Judged {
    problems: Vec<String>,
    judged: usize,
    unjudged: Vec<String>,
}

/// A frequency warning that only says the site's own range: every reason
/// in it ("Tile 0 frequency throttled due to software supplied frequency
/// range. Tile 1 ...") is that one.
fn only_the_sites_range(description: &str) -> bool {
    let reasons = description.matches("throttled due to").count();
    reasons > 0
        && description
            .matches("software supplied frequency range")
            .count()
            == reasons
}

fn judge_health(subject: Subject, health: &[Health], cards: &Cards, j: &mut Judged) {
    for h in health {
        for name in components(subject) {
            let card = cards.card(h.device);
            let words = name.replace('_', " ");
            let Some((status, description)) = h.component(name) else {
                j.unjudged.push(format!("{card}: no {words} health"));
                continue;
            };
            match status {
                // No Xe Link at all is a card's make, judged by the matrix.
                "Unknown" if description.contains("lacks Xe Link capability") => continue,
                "Unknown" => {
                    j.unjudged
                        .push(format!("{card}: {words} Unknown: {description}"));
                    continue;
                }
                "OK" => {}
                "Warning" if *name == "frequency" && only_the_sites_range(description) => {}
                "Warning" | "Critical" => j
                    .problems
                    .push(format!("{card}: {words} {status}: {description}")),
                other => j.unjudged.push(format!(
                    "{card}: {words} is `{other}`, a status preflight does not know: {description}"
                )),
            }
            j.judged += 1;
        }
    }
}

/// The Xe Link matrix: every card's tiles listed, every pair of cards
/// joined directly, no pair of tiles of different cards on PCIe alone, no
/// direct link with fewer lanes than the node's usual. Cards without Xe
/// Link (`capable` false: xpu-smi says they lack it) have none to judge.
fn judge_matrix(cells: &[(Tile, Tile, String)], cards: &Cards, capable: bool, j: &mut Judged) {
    let lanes = |c: &str| -> Option<u32> { c.strip_prefix("XL")?.parse().ok() };
    let tile_name = |t: Tile| format!("{}/{}", cards.card(u64::from(t.0)), t.1);
    let mut tiles: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for (a, b, _) in cells {
        tiles.entry(a.0).or_default().insert(a.1);
        tiles.entry(b.0).or_default().insert(b.1);
    }
    for (i, (_, want, _)) in cards.0.iter().enumerate() {
        let have = tiles.get(&(i as u32)).map_or(0, BTreeSet::len);
        if have < *want {
            j.problems.push(format!(
                "{}: the matrix lists {have} of its {want} tiles",
                cards.card(i as u64)
            ));
        }
    }
    let cross: Vec<&(Tile, Tile, String)> = cells.iter().filter(|(a, b, _)| a.0 < b.0).collect();
    if !cross.iter().any(|(_, _, c)| c.starts_with("XL")) {
        // Cards without Xe Link have none to judge.
        if capable && tiles.len() > 1 {
            j.judged += cross.len();
            j.problems.push(format!(
                "no Xe Link between any two of the {} cards: every pair of their tiles is on PCIe",
                tiles.len()
            ));
        }
        return;
    }
    j.judged += cross.len();
    let usual = super::most_common(cross.iter().filter_map(|(_, _, c)| lanes(c)));
    let mut direct: BTreeSet<(u32, u32)> = BTreeSet::new();
    let card_pairs: BTreeSet<(u32, u32)> = cross.iter().map(|(a, b, _)| (a.0, b.0)).collect();
    for (a, b, c) in &cross {
        match (lanes(c), c.as_str()) {
            (Some(n), _) => {
                direct.insert((a.0, b.0));
                if let Some(u) = usual.filter(|u| n < *u) {
                    j.problems.push(format!(
                        "{} to {}: Xe Link with {n} lanes where links here have {u}",
                        tile_name(*a),
                        tile_name(*b)
                    ));
                }
            }
            (None, "XL*") => {}
            (None, "NODE" | "SYS") => j.problems.push(format!(
                "{} to {}: `{c}` (PCIe only) where the node's cards are joined by Xe Link",
                tile_name(*a),
                tile_name(*b)
            )),
            (None, other) => {
                j.unjudged
                    .push(format!("{} to {}: `{other}`", tile_name(*a), tile_name(*b)))
            }
        }
    }
    for (a, b) in card_pairs {
        if !direct.contains(&(a, b)) {
            j.problems.push(format!(
                "{} and {}: no direct Xe Link between any of their tiles",
                cards.card(u64::from(a)),
                cards.card(u64::from(b))
            ));
        }
    }
}

impl XpuSmi {
    fn tool(&self, args: &[&str], param: &'static str) -> Tool<'static> {
        let mut argv = vec![self.xpu_smi.display().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        Tool {
            argv,
            param,
            package: "Intel XPU Manager: xpu-smi",
        }
    }

    fn recorded(&self) -> bool {
        self.xpu_smi_diag.is_some()
            || self.xpu_smi_health.is_some()
            || self.xpu_smi_topology.is_some()
    }

    async fn judge(&self, facts: &Facts, cards: &Cards) -> Result<Finding, Finding> {
        if self.subject == Subject::Diag {
            let level = self.level.to_string();
            let tool = self.tool(&["diag", "-l", &level, "-j"], "xpu_smi_diag");
            let (t, source) = tool
                .output(self.xpu_smi_diag.as_deref(), facts)
                .await
                .text()?;
            let diag = parse::parse_diag(&source, &t).map_err(Finding::error)?;
            if let Some(l) = diag.level.filter(|l| *l != u64::from(self.level)) {
                return Err(Finding::error(format!(
                    "{source} is a level {l} diagnostic where the check asks for level {}",
                    self.level
                )));
            }
            return Ok(judge_diag(&diag, self.level));
        }
        let read_health = self.xpu_smi_health.is_some() || !self.recorded();
        let (health, source) = if read_health {
            let tool = self.tool(&["health", "-l", "-j"], "xpu_smi_health");
            let (t, source) = tool
                .output(self.xpu_smi_health.as_deref(), facts)
                .await
                .text()?;
            (
                parse::parse_health(&source, &t).map_err(Finding::error)?,
                source,
            )
        } else {
            (Vec::new(), String::new())
        };
        let mut j = Judged::default();
        judge_health(self.subject, &health, cards, &mut j);
        if self.subject == Subject::Health && read_health && health.len() < cards.0.len() {
            j.problems.push(format!(
                "xpu-smi lists {} of the node's {} Intel GPUs (a ZE_AFFINITY_MASK in its environment hides cards from it, or a card failed to initialise)",
                health.len(),
                cards.0.len()
            ));
        }
        let mut sources = vec![source];
        if self.subject == Subject::XeLink && (self.xpu_smi_topology.is_some() || !self.recorded())
        {
            let tool = self.tool(&["topology", "-m"], "xpu_smi_topology");
            let (t, source) = tool
                .output(self.xpu_smi_topology.as_deref(), facts)
                .await
                .text()?;
            let cells = parse::parse_matrix(&source, &t).map_err(Finding::error)?;
            // Xe Link is expected where xpu-smi's health does not say every
            // card lacks it; without health, where the cards are OAM
            // modules (or unknown: a recording on another node).
            let capable = if health.is_empty() {
                cards.0.is_empty() || cards.0.iter().any(|c| XE_LINK_MODULES.contains(&c.2))
            } else {
                health.iter().any(|h| {
                    h.component("xe_link_port")
                        .is_none_or(|(_, d)| !d.contains("lacks Xe Link capability"))
                })
            };
            judge_matrix(&cells, cards, capable, &mut j);
            sources.push(source);
        }
        sources.retain(|s| !s.is_empty());
        let what = match self.subject {
            Subject::Health => "temperature, power and memory health",
            Subject::XeLink => "Xe Link ports and tile pairs",
            _ => "frequency throttling",
        };
        if j.judged == 0 && j.problems.is_empty() {
            return Ok(Finding::skip(format!(
                "no Intel GPU reports its {what}{}",
                if j.unjudged.is_empty() {
                    " (no Xe Link, or nothing read)".to_string()
                } else {
                    format!(": {}", j.unjudged.join("; "))
                }
            )));
        }
        let measured = format!(
            "{} readings of {} GPUs",
            j.judged,
            health.len().max(cards.0.len())
        );
        let from = sources.join(" and ");
        Ok(super::judged(&j.problems, &j.unjudged, measured, |m| {
            format!("{what}: {m}, from {from}")
        }))
    }
}

/// xpu-smi runs one diagnostic per device at a time: the checks of one
/// run that would start it take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Probe for XpuSmi {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            let _turn = if self.subject == Subject::Diag && self.xpu_smi_diag.is_none() {
                Some(ONE_AT_A_TIME.lock().await)
            } else {
                None
            };
            let present = super::vendor_present(&facts, Vendor::Intel).await;
            if !self.recorded() && !present {
                return Finding::skip("no Intel data-center GPU present");
            }
            let cards = Cards::of(&facts);
            match self.judge(&facts, &cards).await {
                Ok(f) | Err(f) => f,
            }
        })
    }

    fn default_timeout(&self) -> Option<Duration> {
        (self.subject == Subject::Diag).then(|| {
            Duration::from_secs(match self.level {
                1 => 120,
                2 => 600,
                _ => 45 * 60,
            })
        })
    }
}

/// The fuzz target's way in (`fuzz/`): a recording read as a diagnostic,
/// as health, or as the Xe Link matrix, judged with no node behind it. A
/// failed component, or a result other than Pass, never makes a pass.
#[cfg(feature = "fuzzing")]
pub fn judge_for_fuzzing(which: u8, text: &str) {
    use preflight_result::Status;
    let cards = Cards(Vec::new());
    match which % 3 {
        0 => {
            let Ok(diag) = parse::parse_diag("f", text) else {
                return;
            };
            let f = judge_diag(&diag, 1);
            if diag.result != "Pass" || diag.components.iter().any(|c| c.result != "Pass") {
                assert_ne!(f.status, Status::Pass, "{diag:?}");
            }
        }
        1 => {
            if let Ok(health) = parse::parse_health("f", text) {
                for subject in [Subject::Health, Subject::XeLink, Subject::Throttle] {
                    let mut j = Judged::default();
                    judge_health(subject, &health, &cards, &mut j);
                    // Every component not OK is a problem or unjudged.
                    let odd = health.iter().any(|h| {
                        components(subject).iter().any(|c| {
                            h.component(c).is_some_and(|(s, d)| {
                                s != "OK"
                                    && !d.contains("lacks Xe Link capability")
                                    && !(s == "Warning" && only_the_sites_range(d))
                            })
                        })
                    });
                    if odd {
                        assert!(
                            !j.problems.is_empty() || !j.unjudged.is_empty(),
                            "{health:?}"
                        );
                    }
                }
            }
        }
        _ => {
            if let Ok(cells) = parse::parse_matrix("f", text) {
                judge_matrix(&cells, &cards, true, &mut Judged::default());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_names_read_as_the_cli_shows_them() {
        assert_eq!(
            component_name("XPUM_DIAG_INTEGRATION_PCIE"),
            "Integration PCIe"
        );
        assert_eq!(
            component_name("XPUM_DIAG_SOFTWARE_ENV_VARIABLES"),
            "Software Env Variables"
        );
    }

    #[test]
    fn an_unknown_result_is_never_a_pass() {
        let d = parse::Diag {
            result: "Unknown".into(),
            level: Some(1),
            devices: "0".into(),
            components: vec![],
        };
        assert_eq!(judge_diag(&d, 1).status, preflight_result::Status::Error);
        let d = parse::Diag {
            result: "Pass".into(),
            level: Some(1),
            devices: "0".into(),
            components: vec![parse::Component {
                kind: "XPUM_DIAG_LIGHT_COMPUTATION".into(),
                result: "Unknown".into(),
                message: String::new(),
            }],
        };
        assert_ne!(judge_diag(&d, 1).status, preflight_result::Status::Pass);
    }
}
