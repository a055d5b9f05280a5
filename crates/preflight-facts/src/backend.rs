//! The collective backends a job may use, by name: what `--backends` and a
//! check's `when: {backend: ...}` name. The checks, the check-in's
//! versions and the collective stage's registry (`collective::registry`)
//! read the list here; a new backend adds its line.

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

    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The library's versioned file name before its version
    /// (libnccl.so.2.18.5 says 2.18.5); `None` for the built-in backend.
    pub fn library_prefix(self) -> Option<&'static str> {
        match self {
            Backend::Tcp => None,
            Backend::Nccl => Some("libnccl.so."),
            Backend::Oneccl => Some("libccl.so."),
        }
    }

    /// Every name, as a sentence lists them: `tcp, nccl or oneccl`.
    pub fn choices() -> String {
        let names: Vec<&str> = Backend::ALL.iter().map(|b| b.name()).collect();
        match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_go_both_ways_and_read_as_a_sentence() {
        for b in Backend::ALL {
            assert_eq!(Backend::from_name(b.name()), Some(b));
        }
        assert_eq!(Backend::from_name("gloo"), None);
        assert_eq!(Backend::choices(), "tcp, nccl or oneccl");
    }
}
