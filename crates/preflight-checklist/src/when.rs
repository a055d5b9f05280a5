//! Applicability: the `when:` block of a check. Every condition given must
//! hold; the first one that does not becomes the check's skip reason.

use serde::{Deserialize, Serialize};

use preflight_facts::{Backend, Facts, Vendor};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    /// An accelerator of this vendor is present on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<VendorCondition>,
    /// The job spans more than one node (true) or exactly one (false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_node: Option<bool>,
    /// This process is (true) or is not (false) the job's rank 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<bool>,
    /// This collective backend is requested (`--backends`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// These environment variables are set (non-empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// This path exists (under `--root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VendorCondition {
    Nvidia,
    Amd,
    Intel,
    Habana,
    /// Any accelerator at all.
    Any,
    /// No accelerator: CPU-only nodes.
    None,
}

impl When {
    /// Whether the condition can differ between ranks of one node (this
    /// rank is the master; this rank's environment has a variable): a
    /// node check under it is evaluated by each rank, never shared.
    pub fn per_rank(&self) -> bool {
        self.master.is_some() || !self.env.is_empty()
    }

    /// `None` when the check applies, else why it does not.
    pub fn unmet(&self, facts: &Facts) -> Option<String> {
        if let Some(want) = self.vendor {
            let vendors = facts.accelerator_vendors();
            let reason = match want {
                VendorCondition::Any if vendors.is_empty() => Some("no accelerator present".into()),
                VendorCondition::None if !vendors.is_empty() => Some(format!(
                    "accelerators present ({})",
                    vendors
                        .iter()
                        .map(|v| v.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                VendorCondition::Nvidia => missing_vendor(&vendors, Vendor::Nvidia),
                VendorCondition::Amd => missing_vendor(&vendors, Vendor::Amd),
                VendorCondition::Intel => missing_vendor(&vendors, Vendor::Intel),
                VendorCondition::Habana => missing_vendor(&vendors, Vendor::Habana),
                _ => None,
            };
            if reason.is_some() {
                return reason;
            }
        }
        if let Some(want) = self.multi_node {
            let launch = facts.launch();
            if launch.multi_node() != want {
                return Some(if want {
                    "single-node job".into()
                } else {
                    "multi-node job".into()
                });
            }
        }
        if let Some(want) = self.master {
            let launch = facts.launch();
            if launch.is_master() != want {
                return Some(if want {
                    format!("not the master rank (rank {})", launch.rank.unwrap_or(0))
                } else {
                    "this is the master rank".into()
                });
            }
        }
        if let Some(backend) = self.backend
            && !facts.backends.contains(&backend)
        {
            return Some(format!("backend {} not requested", backend.name()));
        }
        for name in &self.env {
            if facts.env(name).is_none_or(str::is_empty) {
                return Some(format!("{name} is not set"));
            }
        }
        if let Some(path) = &self.exists
            && !facts.host_path(path).exists()
        {
            return Some(format!("{path} does not exist"));
        }
        None
    }
}

fn missing_vendor(present: &[Vendor], want: Vendor) -> Option<String> {
    (!present.contains(&want)).then(|| format!("no {} {} present", want.name(), want.device()))
}
