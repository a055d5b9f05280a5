//! `disk_free`: the file systems a job writes (checkpoints, /tmp, caches)
//! have room. A full disk fails a run hours in, at its first checkpoint.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params, problems_finding,
};
use preflight_facts::Facts;
use preflight_ground::values::{Bytes, format_bytes};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "disk_free",
    scope: crate::Scope::Node,
    area: "storage",
    summary: "Each path's file system has at least the given free space (for the job's user: statvfs f_bavail).",
    params: &[
        ParamDoc {
            name: "paths",
            ty: "list of paths",
            default: None,
            doc: "Paths the job writes, read under --root. A path not created yet is measured at its nearest existing parent.",
        },
        ParamDoc {
            name: "min_free",
            ty: "size",
            default: None,
            doc: "The least free space each must have, e.g. 50GiB.",
        },
    ],
    hint_vars: &["path", "free"],
    parse: parse_params::<DiskFree>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DiskFree {
    paths: Vec<String>,
    min_free: Bytes,
}

impl Params for DiskFree {
    fn validate(&self) -> Result<(), String> {
        if self.paths.is_empty() {
            return Err("`paths` must name at least one path".into());
        }
        Ok(())
    }
}

fn existing_ancestor(path: &Path) -> Option<PathBuf> {
    path.ancestors().find(|p| p.exists()).map(Path::to_path_buf)
}

impl DiskFree {
    fn check(&self, facts: &Facts) -> Finding {
        let mut problems = Vec::new();
        let mut notes = Vec::new();
        let mut low = Vec::new();
        let mut frees = Vec::new();
        for path in &self.paths {
            let real = facts.host_path(path);
            let Some(at) = existing_ancestor(&real) else {
                problems.push(format!("{path}: no existing parent to measure"));
                continue;
            };
            match nix::sys::statvfs::statvfs(&at) {
                Ok(st) => {
                    let free = st.blocks_available() * st.fragment_size();
                    frees.push(format!("{path} {}", format_bytes(free)));
                    notes.push(format!("{path}: {} free", format_bytes(free)));
                    if free < self.min_free.0 {
                        problems.push(format!(
                            "{path}: {} free, expected at least {}",
                            format_bytes(free),
                            self.min_free
                        ));
                        low.push(path.clone());
                    }
                }
                Err(e) if super::is_denied(&std::io::Error::from(e)) => {
                    return super::needs_privilege(
                        &format!("measuring {path}"),
                        "access to it (root)",
                    );
                }
                Err(e) => {
                    return Finding::error(format!("cannot statvfs {path}: {e}"));
                }
            }
        }
        let finding = if problems.is_empty() {
            Finding::pass(notes.join(", "))
        } else {
            problems_finding(&problems)
        };
        finding
            .measured(frees.join(", "))
            .expected(format!(">= {} free", self.min_free))
            .var("path", low.join(", "))
            .var("free", frees.join(", "))
    }
}

impl Probe for DiskFree {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}
