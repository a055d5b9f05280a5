//! The torches the tests run jobs under: Debian's python3-torch (1.13)
//! and a current torch from PyPI in a virtual environment
//! (PREFLIGHT_TORCH_VENV, default /opt/preflight-torch, which .ci/install
//! makes), and `on_each_torch!`, which makes a test of a case for each.
//! A torch that is missing is a skip, said, unless
//! PREFLIGHT_REQUIRE_LIBS=1 (CI), where it is a failure.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::common;

/// One torch to run jobs under: its interpreter and its torchrun.
#[derive(Debug, Clone)]
pub struct Torch {
    /// `debian` or `current`, for messages.
    pub name: &'static str,
    pub python: PathBuf,
    pub torchrun: PathBuf,
    /// 1.13 to 2.1 speak the old store numbering, 2.2 and later the new.
    pub old_store: bool,
}

impl Torch {
    fn found(name: &'static str, python: PathBuf, torchrun: PathBuf) -> Option<Torch> {
        let version = Command::new(&python)
            .args([
                "-c",
                "import torch.distributed, torch; print(torch.__version__)",
            ])
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        match version {
            Some(v) if torchrun.exists() => {
                let mut parts = v.split(|c: char| !c.is_ascii_digit());
                let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
                let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
                Some(Torch {
                    name,
                    python,
                    torchrun,
                    old_store: (major, minor) < (2, 2),
                })
            }
            _ => {
                common::skip_unless_required(&format!(
                    "{name} torch is not installed ({} with torch.distributed, and {})",
                    python.display(),
                    torchrun.display()
                ));
                None
            }
        }
    }

    /// Debian's python3-torch and its torchrun.
    pub fn debian() -> Option<Torch> {
        Torch::found(
            "debian",
            "/usr/bin/python3".into(),
            "/usr/bin/torchrun".into(),
        )
    }

    /// A current torch from PyPI, in PREFLIGHT_TORCH_VENV (default
    /// /opt/preflight-torch, where .ci/install puts it).
    pub fn current() -> Option<Torch> {
        let venv = PathBuf::from(
            std::env::var("PREFLIGHT_TORCH_VENV").unwrap_or_else(|_| "/opt/preflight-torch".into()),
        );
        Torch::found(
            "current",
            venv.join("bin/python"),
            venv.join("bin/torchrun"),
        )
    }
}

/// Each case, once on each torch: `debian` and `current`; `$body`
/// takes the `&Torch`.
macro_rules! on_each_torch {
    ($(#[$doc:meta])* $name:ident, $body:expr) => {
        $(#[$doc])*
        mod $name {
            #[test]
            fn on_debians_torch() {
                if let Some(t) = $crate::torch::Torch::debian() {
                    ($body)(&t);
                }
            }
            #[test]
            fn on_current_torch() {
                if let Some(t) = $crate::torch::Torch::current() {
                    ($body)(&t);
                }
            }
        }
    };
}
