//! NVLink per link, from NVML (state, remote end, error counters) or from
//! nvidia-smi's text (`nvidia-smi nvlink -s`, `-e`, `-R`) where NVML is
//! not there, or recorded.
//!
//! nvidia-smi's forms, from captures on driver R525 to R580:
//! - `GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)` (the UUID part may be
//!   missing), then indented `Link 0: 26.562 GB/s` or `Link 4: <inactive>`;
//! - `NVML: Unable to retrieve NVLink information as all links are
//!   inActive` (case varies): a PCIe card, or an SXM part whose links all
//!   failed;
//! - `NVML: Unable to retrieve NVLink information: Not Supported`: no
//!   NVLink at all;
//! - `-e`: `Link 0: Replay Errors: 0` (any `Label: number`);
//! - `-R`: `Link 0: Remote Device 00000000:CD:00.0: Link 25`.

use std::collections::BTreeMap;

use preflight_facts::pci::normalize_bus_id;

#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    pub link: u32,
    pub active: bool,
    /// GB/s per direction, where nvidia-smi states it.
    pub speed: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuLinks {
    pub index: u32,
    /// The GPU's PCI bus id, where the source says it (NVML).
    pub bus: Option<String>,
    pub product: Option<String>,
    pub uuid: Option<String>,
    /// NVML says the GPU has no NVLink at all (NOT_SUPPORTED).
    pub unsupported: bool,
    /// Every link inactive, said as one line ("all links are inActive").
    pub all_inactive: bool,
    pub links: Vec<Link>,
    /// Error counters by link: `replay`, `recovery`, `crc`, ... (the
    /// label without " Errors", lower case).
    pub errors: BTreeMap<u32, BTreeMap<String, u64>>,
    /// The remote end of each connected link, as a PCI bus id.
    pub remotes: Vec<(u32, String)>,
}

impl GpuLinks {
    pub fn active(&self) -> usize {
        self.links.iter().filter(|l| l.active).count()
    }

    pub fn name(&self) -> String {
        format!("GPU {}", self.index)
    }
}

/// `GPU 0: NAME (UUID: GPU-...)`.
fn header(line: &str) -> Option<GpuLinks> {
    let rest = line.strip_prefix("GPU ")?;
    let (index, rest) = rest.split_once(':')?;
    let index: u32 = index.trim().parse().ok()?;
    let rest = rest.trim();
    let (product, uuid) = match rest.rsplit_once("(UUID:") {
        Some((p, u)) => (
            p.trim(),
            Some(u.trim().trim_end_matches(')').trim().to_string()),
        ),
        None => (rest, None),
    };
    Some(GpuLinks {
        index,
        product: (!product.is_empty()).then(|| product.to_string()),
        uuid,
        ..GpuLinks::default()
    })
}

/// `Link N: REST`.
fn link_line(line: &str) -> Option<(u32, &str)> {
    let rest = line.trim().strip_prefix("Link ")?;
    let (n, rest) = rest.split_once(':')?;
    Some((n.trim().parse().ok()?, rest.trim()))
}

/// The GPUs of some nvidia-smi nvlink output, each line given to `line`
/// with the GPU it is under. A line under no GPU, or one not understood,
/// is an error naming its number: a format this reader does not know is
/// never a healthy node.
fn read(
    source: &str,
    text: &str,
    mut line: impl FnMut(&mut GpuLinks, &str) -> Option<()>,
) -> Result<Vec<GpuLinks>, String> {
    let mut gpus: Vec<GpuLinks> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(g) = header(trimmed) {
            gpus.push(g);
            continue;
        }
        let Some(gpu) = gpus.last_mut() else {
            return Err(format!(
                "{source}:{}: `{trimmed}` comes before any `GPU N:` line",
                n + 1
            ));
        };
        let lower = trimmed.to_ascii_lowercase();
        if lower.contains("unable to retrieve nvlink information") {
            if lower.contains("not supported") {
                gpu.unsupported = true;
            } else if lower.contains("all links are inactive") {
                gpu.all_inactive = true;
            } else {
                // "GPU is lost" and the like: not a state of the links.
                return Err(format!(
                    "{source}:{}: nvidia-smi could not read GPU {}'s NVLink: `{trimmed}`",
                    n + 1,
                    gpu.index
                ));
            }
            continue;
        }
        if line(gpu, trimmed).is_none() {
            return Err(format!("{source}:{}: not understood: `{trimmed}`", n + 1));
        }
    }
    Ok(gpus)
}

/// `nvidia-smi nvlink -s`.
pub fn parse_status(source: &str, text: &str) -> Result<Vec<GpuLinks>, String> {
    read(source, text, |gpu, line| {
        let (link, rest) = link_line(line)?;
        let (active, speed) = if rest.eq_ignore_ascii_case("<inactive>") {
            (false, None)
        } else {
            let speed: f64 = rest.strip_suffix("GB/s")?.trim().parse().ok()?;
            (true, Some(speed))
        };
        gpu.links.push(Link {
            link,
            active,
            speed,
        });
        Some(())
    })
}

/// `nvidia-smi nvlink -e`, merged into the status read before.
pub fn parse_errors(source: &str, text: &str, into: &mut [GpuLinks]) -> Result<(), String> {
    let read = read(source, text, |gpu, line| {
        let (link, rest) = link_line(line)?;
        let (label, value) = rest.rsplit_once(':')?;
        let value: u64 = value.trim().parse().ok()?;
        let label = label.trim().to_ascii_lowercase();
        let label = label
            .strip_suffix(" errors")
            .unwrap_or(&label)
            .replace(' ', "_");
        gpu.errors.entry(link).or_default().insert(label, value);
        Some(())
    })?;
    merge(read, into, |to, from| to.errors = from.errors);
    Ok(())
}

/// `nvidia-smi nvlink -R`, merged into the status read before. Its link
/// numbers are not joined with `-s`'s: only the remote ends are kept.
pub fn parse_remotes(source: &str, text: &str, into: &mut [GpuLinks]) -> Result<(), String> {
    let read = read(source, text, |gpu, line| {
        let (link, rest) = link_line(line)?;
        let rest = rest.strip_prefix("Remote Device")?.trim();
        // `00000000:CD:00.0: Link 25`: the bus id holds colons itself.
        let bus = match rest.rfind(": Link") {
            Some(at) => &rest[..at],
            None => rest,
        };
        gpu.remotes.push((link, normalize_bus_id(bus.trim())));
        Some(())
    })?;
    merge(read, into, |to, from| to.remotes = from.remotes);
    Ok(())
}

fn merge(read: Vec<GpuLinks>, into: &mut [GpuLinks], apply: impl Fn(&mut GpuLinks, GpuLinks)) {
    for g in read {
        if let Some(to) = into.iter_mut().find(|t| t.index == g.index) {
            apply(to, g);
        }
    }
}

/// NVML's view. `Err`: no NVML here (the caller falls back to nvidia-smi).
pub fn from_nvml() -> Result<Vec<GpuLinks>, String> {
    use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
    use nvml_wrapper::error::NvmlError;

    /// NVML_NVLINK_MAX_LINKS in nvml.h (18 up to Blackwell; 36 in the
    /// newest header). Past the GPU's last link NVML says InvalidArg.
    const MAX_LINKS: u32 = 36;
    preflight_facts::nvml::each_gpu(&preflight_facts::nvml::open()?, |index, bus, device| {
        let mut gpu = GpuLinks {
            index,
            bus: Some(bus),
            product: device.name().ok(),
            uuid: device.uuid().ok(),
            ..GpuLinks::default()
        };
        for link in 0..MAX_LINKS {
            let wrapper = device.link_wrapper_for(link);
            match wrapper.is_active() {
                Ok(active) => {
                    gpu.links.push(Link {
                        link,
                        active,
                        speed: None,
                    });
                    if !active {
                        continue;
                    }
                    if let Ok(remote) = wrapper.remote_pci_info() {
                        gpu.remotes.push((link, normalize_bus_id(&remote.bus_id)));
                    }
                    let mut counters = BTreeMap::new();
                    let mut crc = None::<u64>;
                    for (counter, name) in [
                        (ErrorCounter::DlReplay, "replay"),
                        (ErrorCounter::DlRecovery, "recovery"),
                        (ErrorCounter::DlCrcFlit, "crc"),
                        (ErrorCounter::DlCrcData, "crc"),
                    ] {
                        if let Ok(v) = wrapper.error_counter(counter) {
                            if name == "crc" {
                                crc = Some(crc.unwrap_or(0) + v);
                            } else {
                                counters.insert(name.to_string(), v);
                            }
                        }
                    }
                    if let Some(c) = crc {
                        counters.insert("crc".to_string(), c);
                    }
                    if !counters.is_empty() {
                        gpu.errors.insert(link, counters);
                    }
                }
                Err(NvmlError::NotSupported) if link == 0 => {
                    gpu.unsupported = true;
                    break;
                }
                Err(NvmlError::InvalidArg | NvmlError::NotSupported) => break,
                Err(e) => {
                    return Err(format!("NVML cannot read GPU {index}'s NVLink {link}: {e}"));
                }
            }
        }
        Ok(gpu)
    })
}

/// Whether a product is an SXM or OAM module, whose NVLinks are part of
/// the board (a PCIe card's come only with a bridge). By the names NVIDIA
/// gives them: an `-SXM` suffix (A100, V100), or a Hopper and Blackwell
/// module name that is neither PCIe nor NVL.
pub fn is_module(product: &str) -> bool {
    let upper = product.to_ascii_uppercase();
    if upper.contains("SXM") {
        return true;
    }
    if upper.contains("PCIE") || upper.contains(" NVL") {
        return false;
    }
    [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 94GB",
        "NVIDIA H200",
        "NVIDIA H20",
        "NVIDIA H800",
        "NVIDIA B100",
        "NVIDIA B200",
        "NVIDIA B300",
        "NVIDIA GB200",
        "NVIDIA GB300",
        "NVIDIA GH200",
    ]
    .iter()
    .any(|m| upper.starts_with(&m.to_ascii_uppercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_errors_and_remotes_in_nvidia_smis_forms() {
        let status = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a10e6e5-95f7-2785-ed63-6f6147f304f7)\n\
                      \t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n\
                      GPU 1: NVIDIA A100-PCIE-40GB (UUID: GPU-3fb1)\n\
                      NVML: Unable to retrieve Nvlink information as all links are inActive\n\
                      GPU 2: NVIDIA GeForce RTX 4090\n\
                      \t NVML: Unable to retrieve NVLink information: Not Supported\n\
                      GPU 3: NVIDIA A100-SXM4-80GB (UUID: GPU-370e)\n\t Link 0: 25 GB/s\n";
        let mut gpus = parse_status("s", status).unwrap();
        assert_eq!(gpus.len(), 4);
        assert_eq!(gpus[0].product.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(
            gpus[0].uuid.as_deref(),
            Some("GPU-5a10e6e5-95f7-2785-ed63-6f6147f304f7")
        );
        assert_eq!(gpus[0].active(), 1);
        assert_eq!(gpus[0].links[0].speed, Some(26.562));
        assert!(gpus[1].all_inactive && !gpus[1].unsupported);
        assert!(gpus[2].unsupported && gpus[2].uuid.is_none());
        assert_eq!(gpus[3].links[0].speed, Some(25.0));
        parse_errors(
            "e",
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a10)\n\t Link 0: Replay Errors: 0\n\t Link 0: Recovery Errors: 3\n\n\t Link 0: CRC Errors: 41\n",
            &mut gpus,
        )
        .unwrap();
        assert_eq!(gpus[0].errors[&0]["recovery"], 3);
        assert_eq!(gpus[0].errors[&0]["crc"], 41);
        parse_remotes(
            "r",
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a10)\n\t Link 0: Remote Device 00000000:CD:00.0: Link 25\n",
            &mut gpus,
        )
        .unwrap();
        assert_eq!(gpus[0].remotes, [(0, "0000:cd:00.0".to_string())]);
    }

    #[test]
    fn what_is_not_understood_is_an_error_with_its_line() {
        let e = parse_status("s.txt", "GPU 0: X\n\t Link 0: fast\n").unwrap_err();
        assert_eq!(e, "s.txt:2: not understood: `Link 0: fast`");
        let e = parse_status("s.txt", "Link 0: 25 GB/s\n").unwrap_err();
        assert!(
            e.starts_with("s.txt:1: `Link 0: 25 GB/s` comes before"),
            "{e}"
        );
    }

    #[test]
    fn modules_by_name() {
        assert!(is_module("NVIDIA H100 80GB HBM3"));
        assert!(is_module("NVIDIA A100-SXM4-80GB"));
        assert!(is_module("NVIDIA B200"));
        assert!(!is_module("NVIDIA H100 PCIe"));
        assert!(!is_module("NVIDIA H100 NVL"));
        assert!(!is_module("NVIDIA A100-PCIE-40GB"));
        assert!(!is_module("NVIDIA L40S"));
    }
}
