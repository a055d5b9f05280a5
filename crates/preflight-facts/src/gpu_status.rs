//! The NVIDIA GPUs' health as the driver reports it, from one of two
//! sources with the same shape: `nvidia-smi -q -x` XML (run live, or a
//! recorded file) and NVML (see `nvml.rs`).

use super::pci::normalize_bus_id;

const MIB: u64 = 1024 * 1024;

#[derive(Debug, Clone, Default)]
pub struct Process {
    pub pid: String,
    pub name: String,
    pub used_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct GpuStatus {
    pub bus_id: String,
    pub uuid: Option<String>,
    /// The board's serial number (NVML, nvidia-smi's `serial`): what a
    /// return to the vendor names.
    pub serial: Option<String>,
    pub persistence: Option<bool>,
    pub used_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// Volatile (since the driver loaded) uncorrectable ECC errors.
    pub ecc_uncorrectable: Option<u64>,
    /// Retired pages waiting for a reset (pre-Ampere page retirement).
    pub retirement_pending: Option<bool>,
    /// Ampere and later: a row remap waits for a GPU reset.
    pub remap_pending: Option<bool>,
    /// Ampere and later: a remap failed; the GPU needs service.
    pub remap_failure: Option<bool>,
    /// NVSwitch fabric registration (Fabric Manager): state and status.
    pub fabric_state: Option<String>,
    pub fabric_status: Option<String>,
    pub processes: Vec<Process>,
    /// The driver's index (nvidia-smi's `-i`, NVML's index).
    pub index: Option<u32>,
    /// MIG mode is on (dcgmi diag does not run on MIG GPUs).
    pub mig_enabled: Option<bool>,
    /// Why the clocks are held down right now (NVIDIA's "clocks event
    /// reasons", once "throttle reasons"), by their short names
    /// (`hw_slowdown`, `sw_power_cap`, ...). `None`: not reported.
    pub clock_events: Option<Vec<String>>,
    /// The driver asks for a GPU reset before the GPU is used again.
    pub reset_required: Option<bool>,
    /// The driver recommends draining the node's work and resetting.
    pub drain_and_reset: Option<bool>,
    /// R565 and later, in place of the two above: what the driver asks
    /// for (`None`, `Reset`, `Reboot`, `Drain P2P`, `Drain and Reset`).
    pub recovery_action: Option<String>,
}

impl GpuStatus {
    /// The GPU as operators name it: the driver's index (nvidia-smi -i)
    /// and its bus id.
    pub fn name(&self) -> String {
        match self.index {
            Some(i) => format!("GPU {i} ({})", self.bus_id),
            None => self.bus_id.clone(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct GpuReport {
    /// Where the data came from, for messages.
    pub source: String,
    pub driver_version: Option<String>,
    pub gpus: Vec<GpuStatus>,
}

fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|c| c.has_tag_name(name))
}

fn text_at(node: roxmltree::Node, path: &[&str]) -> Option<String> {
    let mut at = node;
    for name in path {
        at = child(at, name)?;
    }
    let text = at.text()?.trim();
    (!text.is_empty() && text != "N/A").then(|| text.to_string())
}

fn yes_no(text: Option<String>) -> Option<bool> {
    match text?.as_str() {
        "Yes" | "Enabled" => Some(true),
        "No" | "Disabled" => Some(false),
        _ => None,
    }
}

/// "81559 MiB" to bytes.
fn mib(text: Option<String>) -> Option<u64> {
    let text = text?;
    let mut parts = text.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("MiB") | None => Some(value * MIB),
        Some("GiB") => Some(value * 1024 * MIB),
        Some("KiB") => Some(value * 1024),
        _ => None,
    }
}

/// Sums the uncorrectable counters under `volatile`, whichever layout the
/// driver writes: `sram_uncorrectable`/`dram_uncorrectable` (R470+), their
/// `_parity`/`_secded` split (R550+) or `double_bit/total` (older).
fn uncorrectable(ecc: roxmltree::Node) -> Option<u64> {
    let volatile = child(ecc, "volatile")?;
    let mut total = None;
    for n in volatile.descendants().filter(|n| n.is_element()) {
        let name = n.tag_name().name();
        let counts = name.contains("uncorrectable")
            || (name == "total" && n.parent().is_some_and(|p| p.has_tag_name("double_bit")));
        if !counts || n.children().any(|c| c.is_element()) {
            continue;
        }
        if let Some(v) = n.text().and_then(|t| t.trim().parse::<u64>().ok()) {
            total = Some(total.unwrap_or(0) + v);
        }
    }
    total
}

/// The active reasons under `<clocks_event_reasons>` (R535 and later) or
/// `<clocks_throttle_reasons>` (earlier), by their short names.
fn clock_events(gpu: roxmltree::Node) -> Option<Vec<String>> {
    let (block, prefix) = child(gpu, "clocks_event_reasons")
        .map(|b| (b, "clocks_event_reason_"))
        .or_else(|| {
            child(gpu, "clocks_throttle_reasons").map(|b| (b, "clocks_throttle_reason_"))
        })?;
    let mut active = Vec::new();
    for reason in block.children().filter(|c| c.is_element()) {
        let name = reason.tag_name().name();
        let short = name.strip_prefix(prefix).unwrap_or(name);
        if reason.text().map(str::trim) == Some("Active") {
            active.push(short.to_string());
        }
    }
    Some(active)
}

/// Several `nvidia-smi -q -x` documents one after another, as
/// `nvidia-smi -q -x -l 1` prints them: one report per sample.
pub fn parse_xml_samples(source: &str, text: &str) -> Result<Vec<GpuReport>, String> {
    const END: &str = "</nvidia_smi_log>";
    let mut samples = Vec::new();
    let mut rest = text;
    while let Some(end) = rest.find(END) {
        let (doc, after) = rest.split_at(end + END.len());
        samples.push(parse_xml(source, doc.trim_start())?);
        rest = after;
    }
    if samples.is_empty() || !rest.trim().is_empty() {
        // What is left is a document cut short, or not one at all: the
        // parser says which, with its place.
        samples.push(parse_xml(source, rest.trim_start())?);
    }
    Ok(samples)
}

pub fn parse_xml(source: &str, text: &str) -> Result<GpuReport, String> {
    // nvidia-smi writes a DOCTYPE line (nvsmi_device_v12.dtd).
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = roxmltree::Document::parse_with_options(text, options)
        .map_err(|e| format!("{source}: invalid XML: {e}"))?;
    let root = doc.root_element();
    if !root.has_tag_name("nvidia_smi_log") {
        return Err(format!(
            "{source}: not nvidia-smi -q -x output (root element <{}>)",
            root.tag_name().name()
        ));
    }
    let mut gpus = Vec::new();
    // nvidia-smi lists the GPUs in its own index order (`-i N`), which
    // the minor number need not follow.
    for (index, gpu) in root
        .children()
        .filter(|c| c.has_tag_name("gpu"))
        .enumerate()
    {
        let bus = gpu
            .attribute("id")
            .map(String::from)
            .or_else(|| text_at(gpu, &["pci", "pci_bus_id"]))
            .ok_or_else(|| format!("{source}: a <gpu> has no bus id"))?;
        let processes = child(gpu, "processes")
            .map(|p| {
                p.children()
                    .filter(|c| c.has_tag_name("process_info"))
                    .map(|c| Process {
                        pid: text_at(c, &["pid"]).unwrap_or_default(),
                        name: text_at(c, &["process_name"]).unwrap_or_default(),
                        used_bytes: mib(text_at(c, &["used_memory"])),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let retired = child(gpu, "retired_pages");
        gpus.push(GpuStatus {
            bus_id: normalize_bus_id(&bus),
            uuid: text_at(gpu, &["uuid"]),
            serial: text_at(gpu, &["serial"]).filter(|s| !s.eq_ignore_ascii_case("N/A")),
            persistence: yes_no(text_at(gpu, &["persistence_mode"])),
            used_bytes: mib(text_at(gpu, &["fb_memory_usage", "used"])),
            free_bytes: mib(text_at(gpu, &["fb_memory_usage", "free"])),
            ecc_uncorrectable: child(gpu, "ecc_errors").and_then(uncorrectable),
            retirement_pending: retired.and_then(|r| {
                yes_no(text_at(r, &["pending_retirement"]))
                    .or_else(|| yes_no(text_at(r, &["pending_blacklist"])))
            }),
            remap_pending: yes_no(text_at(gpu, &["remapped_rows", "remapped_row_pending"])),
            remap_failure: yes_no(text_at(gpu, &["remapped_rows", "remapped_row_failure"])),
            fabric_state: text_at(gpu, &["fabric", "state"]),
            fabric_status: text_at(gpu, &["fabric", "status"]),
            processes,
            index: u32::try_from(index).ok(),
            mig_enabled: yes_no(text_at(gpu, &["mig_mode", "current_mig"])),
            clock_events: clock_events(gpu),
            reset_required: yes_no(text_at(gpu, &["gpu_reset_status", "reset_required"])),
            drain_and_reset: yes_no(text_at(
                gpu,
                &["gpu_reset_status", "drain_and_reset_recommended"],
            )),
            recovery_action: text_at(gpu, &["gpu_recovery_action"]),
        });
    }
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    Ok(GpuReport {
        source: source.to_string(),
        driver_version: text_at(root, &["driver_version"]),
        gpus,
    })
}

/// Runs `nvidia-smi -q -x`. The caller's timeout bounds it; dropping the
/// future kills the child, so a hung nvidia-smi does not outlive the check.
pub async fn run_nvidia_smi(args: &[&str]) -> Result<GpuReport, String> {
    let shown = format!("nvidia-smi {}", args.join(" "));
    let output = tokio::process::Command::new("nvidia-smi")
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => "nvidia-smi is not installed".to_string(),
            _ => format!("cannot run nvidia-smi: {e}"),
        })?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let out = String::from_utf8_lossy(&output.stdout);
        let why = if err.trim().is_empty() { out } else { err };
        return Err(format!(
            "{shown} failed ({}): {}",
            output.status,
            why.trim()
        ));
    }
    parse_xml(&shown, &String::from_utf8_lossy(&output.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = r#"<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
  <driver_version>535.129.03</driver_version>
  <attached_gpus>1</attached_gpus>
  <gpu id="00000000:1B:00.0">
    <product_name>NVIDIA H100 80GB HBM3</product_name>
    <persistence_mode>Enabled</persistence_mode>
    <uuid>GPU-a1</uuid>
    <fb_memory_usage><total>81559 MiB</total><reserved>346 MiB</reserved><used>3 MiB</used><free>81209 MiB</free></fb_memory_usage>
    <ecc_errors><volatile><sram_correctable>0</sram_correctable><sram_uncorrectable>1</sram_uncorrectable><dram_correctable>4</dram_correctable><dram_uncorrectable>2</dram_uncorrectable></volatile>
      <aggregate><sram_uncorrectable>9</sram_uncorrectable></aggregate></ecc_errors>
    <retired_pages><pending_retirement>N/A</pending_retirement></retired_pages>
    <remapped_rows><remapped_row_corr>0</remapped_row_corr><remapped_row_unc>0</remapped_row_unc><remapped_row_pending>Yes</remapped_row_pending><remapped_row_failure>No</remapped_row_failure></remapped_rows>
    <fabric><state>Completed</state><status>Success</status></fabric>
    <processes><process_info><pid>4242</pid><type>C</type><process_name>python</process_name><used_memory>1024 MiB</used_memory></process_info></processes>
  </gpu>
</nvidia_smi_log>"#;

    #[test]
    fn parses_recorded_output() {
        let r = parse_xml("x.xml", XML).unwrap();
        assert_eq!(r.driver_version.as_deref(), Some("535.129.03"));
        let g = &r.gpus[0];
        assert_eq!(g.bus_id, "0000:1b:00.0");
        assert_eq!(g.persistence, Some(true));
        assert_eq!(g.free_bytes, Some(81209 * MIB));
        assert_eq!(g.ecc_uncorrectable, Some(3));
        assert_eq!(g.retirement_pending, None);
        assert_eq!(g.remap_pending, Some(true));
        assert_eq!(g.remap_failure, Some(false));
        assert_eq!(g.fabric_state.as_deref(), Some("Completed"));
        assert_eq!(g.processes[0].pid, "4242");
    }

    #[test]
    fn bad_xml_is_an_error_not_a_panic() {
        assert!(parse_xml("x", "<nvidia_smi_log><gpu>").is_err());
        assert!(
            parse_xml("x", "<html/>")
                .unwrap_err()
                .contains("not nvidia-smi")
        );
    }
}
