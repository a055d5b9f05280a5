//! The collective backends a job may use, by name: what `--backends` and a
//! check's `when: {backend: ...}` name.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Tcp,
    Nccl,
    Oneccl,
}

impl Backend {
    pub const ALL: [Backend; 3] = [Backend::Tcp, Backend::Nccl, Backend::Oneccl];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Tcp => "tcp",
            Backend::Nccl => "nccl",
            Backend::Oneccl => "oneccl",
        }
    }
}
