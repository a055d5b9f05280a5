//! The profiles preflight ships (`profiles/` in the source tree), each
//! citing the vendor's figures it states. They say only what the platform
//! fixes (accelerators, their PCIe link, the links between them); the
//! NICs and memory a site chose are captured from its own known-good node.

use std::sync::{Arc, OnceLock};

use super::{Profile, parse};

const FILES: &[(&str, &str)] = &[
    (
        "hgx-h100-8.yaml",
        include_str!("../../../../profiles/hgx-h100-8.yaml"),
    ),
    (
        "hgx-h200-8.yaml",
        include_str!("../../../../profiles/hgx-h200-8.yaml"),
    ),
    (
        "hgx-a100-8.yaml",
        include_str!("../../../../profiles/hgx-a100-8.yaml"),
    ),
    (
        "mi300x-8.yaml",
        include_str!("../../../../profiles/mi300x-8.yaml"),
    ),
    (
        "gaudi3-8.yaml",
        include_str!("../../../../profiles/gaudi3-8.yaml"),
    ),
    (
        "gaudi2-8.yaml",
        include_str!("../../../../profiles/gaudi2-8.yaml"),
    ),
    (
        "max1550-4.yaml",
        include_str!("../../../../profiles/max1550-4.yaml"),
    ),
];

/// Every shipped profile, read once. A shipped file that does not read is
/// a bug the tests catch; it is left out rather than stopping a node.
pub fn shipped() -> &'static [Arc<Profile>] {
    static ALL: OnceLock<Vec<Arc<Profile>>> = OnceLock::new();
    ALL.get_or_init(|| {
        FILES
            .iter()
            .filter_map(|(name, text)| parse(&format!("shipped:{name}"), text).ok())
            .map(Arc::new)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_file_reads_and_names_its_sources() {
        for (name, text) in super::FILES {
            if let Err(e) = super::parse(name, text) {
                panic!("{name}: {e:?}");
            }
            assert!(text.contains("Sources:"), "{name} cites no source");
        }
        assert_eq!(super::shipped().len(), super::FILES.len());
    }
}
