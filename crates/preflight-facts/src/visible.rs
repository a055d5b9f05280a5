//! Visibility masks: which of a vendor's devices a job's runtime will see.
//! Each runtime has its own variable and its own syntax; the parsing here
//! follows what the runtime does, including where it silently stops.

use super::pci::Vendor;

/// One entry of a mask, resolved against the devices the driver exposes.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Index(usize),
    /// A UUID (or unique UUID prefix) as CUDA and ROCr accept.
    Uuid(String),
    /// MIG instances and other entries we cannot resolve from files.
    Opaque(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Mask {
    pub variable: &'static str,
    pub value: String,
    pub entries: Vec<Entry>,
}

/// The variables that restrict a vendor's devices, in the order their
/// runtimes apply them. HIP honours CUDA_VISIBLE_DEVICES too.
pub fn variables(vendor: Vendor) -> &'static [&'static str] {
    match vendor {
        Vendor::Nvidia => &["CUDA_VISIBLE_DEVICES"],
        Vendor::Amd => &[
            "ROCR_VISIBLE_DEVICES",
            "HIP_VISIBLE_DEVICES",
            "CUDA_VISIBLE_DEVICES",
        ],
        Vendor::Intel => &["ZE_AFFINITY_MASK"],
        Vendor::Habana => &["HABANA_VISIBLE_DEVICES"],
    }
}

/// Parses a mask. `None` for Habana's `all`, which hides nothing.
pub fn parse(variable: &'static str, value: &str) -> Option<Mask> {
    let trimmed = value.trim();
    if variable == "HABANA_VISIBLE_DEVICES" && trimmed.eq_ignore_ascii_case("all") {
        return None;
    }
    let mut entries = Vec::new();
    for raw in trimmed.split(',').map(str::trim) {
        if raw.is_empty() {
            continue;
        }
        // Level Zero writes device.subdevice (tile); the device is what
        // must exist.
        let head = if variable == "ZE_AFFINITY_MASK" {
            raw.split('.').next().unwrap_or(raw)
        } else {
            raw
        };
        let entry = if let Ok(i) = head.parse::<i64>() {
            // CUDA treats a negative index as the end of the list.
            match usize::try_from(i) {
                Ok(i) => Entry::Index(i),
                Err(_) => break,
            }
        } else if head.starts_with("GPU-") {
            Entry::Uuid(head.to_string())
        } else {
            Entry::Opaque(head.to_string())
        };
        entries.push(entry);
    }
    Some(Mask {
        variable,
        value: value.to_string(),
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_masks() {
        let m = parse("CUDA_VISIBLE_DEVICES", "0,3, GPU-5a9b").unwrap();
        assert_eq!(
            m.entries,
            vec![
                Entry::Index(0),
                Entry::Index(3),
                Entry::Uuid("GPU-5a9b".into())
            ]
        );
        assert!(
            parse("CUDA_VISIBLE_DEVICES", "")
                .unwrap()
                .entries
                .is_empty()
        );
        assert!(
            parse("CUDA_VISIBLE_DEVICES", "-1")
                .unwrap()
                .entries
                .is_empty()
        );
        assert_eq!(
            parse("CUDA_VISIBLE_DEVICES", "1,-1,2").unwrap().entries,
            vec![Entry::Index(1)]
        );
    }

    #[test]
    fn level_zero_tiles_and_habana_all() {
        let m = parse("ZE_AFFINITY_MASK", "0.0,1.1,2").unwrap();
        assert_eq!(
            m.entries,
            vec![Entry::Index(0), Entry::Index(1), Entry::Index(2)]
        );
        assert!(parse("HABANA_VISIBLE_DEVICES", "all").is_none());
    }
}
