//! `memory`: host memory a job needs before it starts: available RAM,
//! a /dev/shm large enough for NCCL and oneCCL (container defaults of 64 MB
//! break them), hugepages, and enough file descriptors for a rank's
//! sockets to its peers.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params, problems_and_unchecked,
};
use preflight_facts::limits::{self, Limit};
use preflight_facts::{Facts, meminfo};
use preflight_ground::values::{Bytes, format_bytes};
use preflight_result::{Finding, Status};

pub const KIND: KindInfo = KindInfo {
    name: "memory",
    scope: crate::Scope::Node,
    area: "memory",
    summary: "Available RAM, the size of /dev/shm, free hugepages and the open-files limit (against the world size) meet thresholds; the RAM in all meets the node profile's `memory`, where one applies.",
    params: &[
        ParamDoc {
            name: "min_available",
            ty: "size",
            default: Some("unset"),
            doc: "MemAvailable in /proc/meminfo must be at least this.",
        },
        ParamDoc {
            name: "min_shm",
            ty: "size",
            default: Some("unset"),
            doc: "/dev/shm must be at least this large (statvfs on the real machine; the size= mount option in /proc/mounts under a fixture root).",
        },
        ParamDoc {
            name: "min_shm_free",
            ty: "size",
            default: Some("unset"),
            doc: "/dev/shm must have at least this free (statvfs on the real machine; under a fixture root, its size less the files under DIR/dev/shm). A failure names the largest files there with their owners: leftovers of a crashed job.",
        },
        ParamDoc {
            name: "min_hugepages",
            ty: "integer",
            default: Some("unset"),
            doc: "HugePages_Free must be at least this.",
        },
        ParamDoc {
            name: "min_nofile",
            ty: "integer",
            default: Some("unset"),
            doc: "The soft open-files limit (ulimit -n) must be at least this.",
        },
        ParamDoc {
            name: "nofile_per_rank",
            ty: "integer",
            default: Some("unset"),
            doc: "The open-files limit must be at least this many times WORLD_SIZE: each rank may hold sockets to every peer.",
        },
    ],
    hint_vars: &["available", "shm", "shm_free", "shm_files", "nofile"],
    parse: parse_params::<Memory>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_available: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_shm: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_shm_free: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_hugepages: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_nofile: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nofile_per_rank: Option<u64>,
}

impl Params for Memory {
    fn validate(&self) -> Result<(), String> {
        if self.min_available.is_none()
            && self.min_shm.is_none()
            && self.min_shm_free.is_none()
            && self.min_hugepages.is_none()
            && self.min_nofile.is_none()
            && self.nofile_per_rank.is_none()
        {
            return Err("memory needs a threshold: min_available, min_shm, min_shm_free, min_hugepages, min_nofile or nofile_per_rank".into());
        }
        Ok(())
    }
}

/// A tmpfs `size=` option: bytes, with k/m/g suffixes, or a percentage of
/// RAM.
fn tmpfs_size(option: &str, mem_total: Option<u64>) -> Option<u64> {
    if let Some(pct) = option.strip_suffix('%') {
        let pct: u64 = pct.parse().ok()?;
        return mem_total.map(|t| t / 100 * pct);
    }
    Bytes::parse(option).ok().map(|b| b.0)
}

/// The size of /dev/shm: statvfs on the real machine; under a fixture
/// root the mount table, since statvfs there would measure the fixture's
/// own disk. tmpfs without size= gets half of RAM.
pub fn shm_size(facts: &Facts, mem_total: Option<u64>) -> Result<u64, String> {
    if facts.is_live() {
        let st = nix::sys::statvfs::statvfs("/dev/shm")
            .map_err(|e| format!("cannot statvfs /dev/shm: {e}"))?;
        return Ok(st.blocks() * st.fragment_size());
    }
    let mounts = std::fs::read_to_string(facts.host_path("/proc/mounts"))
        .map_err(|e| format!("cannot read /proc/mounts: {e}"))?;
    let line = mounts
        .lines()
        .rfind(|l| l.split_whitespace().nth(1) == Some("/dev/shm"))
        .ok_or("/dev/shm is not mounted (no line in /proc/mounts)")?;
    let options = line.split_whitespace().nth(3).unwrap_or("");
    match options.split(',').find_map(|o| o.strip_prefix("size=")) {
        Some(size) => {
            tmpfs_size(size, mem_total).ok_or(format!("/proc/mounts: bad /dev/shm size `{size}`"))
        }
        None => mem_total
            .map(|t| t / 2)
            .ok_or_else(|| "/dev/shm has no size= and MemTotal is unknown".to_string()),
    }
}

/// Free space in /dev/shm: statvfs on the real machine (what this user
/// may still allocate); under a fixture root, its size less what the
/// files under DIR/dev/shm take.
fn shm_free(facts: &Facts, size: u64) -> Result<u64, String> {
    if facts.is_live() {
        let st = nix::sys::statvfs::statvfs("/dev/shm")
            .map_err(|e| format!("cannot statvfs /dev/shm: {e}"))?;
        return Ok(st.blocks_available() * st.fragment_size());
    }
    let used: u64 = shm_files(facts).iter().map(|f| f.bytes).sum();
    Ok(size.saturating_sub(used))
}

/// A file in /dev/shm: a segment of NCCL (`nccl-*`), oneCCL, PyTorch's
/// data loaders (`torch_*`), or a crashed job's leftover.
struct ShmFile {
    path: String,
    bytes: u64,
    uid: u32,
}

/// The files under /dev/shm, largest first; at most a few thousand are
/// looked at, and directories two levels deep (a hostile or huge tree
/// cannot stall the check).
fn shm_files(facts: &Facts) -> Vec<ShmFile> {
    use std::os::unix::fs::MetadataExt;
    const MAX_ENTRIES: usize = 4096;
    let base = facts.host_path("/dev/shm");
    let mut out = Vec::new();
    let mut dirs = vec![(base.clone(), 0)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > MAX_ENTRIES {
                break;
            }
            let Ok(meta) = e.metadata() else { continue };
            let path = e.path();
            if meta.is_dir() {
                if depth < 2 {
                    dirs.push((path, depth + 1));
                }
                continue;
            }
            // tmpfs files may be sparse: what they hold is their blocks.
            // A fixture's stand-in files are sparse on purpose: their
            // length says what they stand for.
            let bytes = if facts.is_live() {
                meta.blocks() * 512
            } else {
                meta.len()
            };
            let shown = path
                .strip_prefix(&base)
                .map(|p| format!("/dev/shm/{}", p.display()))
                .unwrap_or_else(|_| path.display().to_string());
            out.push(ShmFile {
                path: shown,
                bytes,
                uid: meta.uid(),
            });
        }
    }
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.path.cmp(&b.path)));
    out
}

/// What one aspect of the check (available RAM, /dev/shm, hugepages, open
/// files) found when it could not compare: unreadable, or nothing to read
/// on this node.
enum Unchecked {
    Unreadable(String),
    NothingToRead(String),
}

impl Memory {
    /// Every aspect is checked on its own: a problem found in one is
    /// reported whatever happened to the others, and an aspect that could
    /// not be read is named beside the problems.
    fn check(&self, facts: &Facts) -> Finding {
        let mut problems = Vec::new();
        let mut notes = Vec::new();
        let mut unchecked: Vec<Unchecked> = Vec::new();
        let mut finding_vars: Vec<(&'static str, String)> = Vec::new();
        // The node's profile sets how much memory the node must have in
        // all (a lost DIMM), beside what this check asks of what is free.
        let profile = facts
            .profile()
            .and_then(|p| Some((p.named(), p.expect.memory?.min_total)));
        let needs_meminfo = self.min_available.is_some()
            || profile.is_some()
            || self.min_hugepages.is_some()
            || self.min_shm.is_some()
            || self.min_shm_free.is_some();
        let meminfo = if needs_meminfo {
            std::fs::read_to_string(facts.host_path("/proc/meminfo"))
                .map_err(|e| format!("cannot read /proc/meminfo: {e}"))
        } else {
            Ok(String::new())
        };
        let field = |name: &str| -> Result<u64, String> {
            let text = meminfo.as_ref().map_err(Clone::clone)?;
            meminfo::field(text, name).ok_or(format!("/proc/meminfo has no {name}"))
        };
        if let Some(min) = self.min_available {
            match field("MemAvailable") {
                Ok(avail) => {
                    finding_vars.push(("available", format_bytes(avail)));
                    notes.push(format!("{} available", format_bytes(avail)));
                    if avail < min.0 {
                        problems.push(format!(
                            "only {} of RAM available, expected at least {min}",
                            format_bytes(avail)
                        ));
                    }
                }
                Err(e) => unchecked.push(Unchecked::Unreadable(e)),
            }
        }
        if let Some((named, min)) = &profile {
            match field("MemTotal") {
                Ok(total) if total < min.0 => problems.push(format!(
                    "{} of RAM in all, where {named} has at least {min}",
                    format_bytes(total)
                )),
                Ok(total) => notes.push(format!("{} in all", format_bytes(total))),
                Err(e) => unchecked.push(Unchecked::Unreadable(e)),
            }
        }
        if self.min_shm.is_some() || self.min_shm_free.is_some() {
            match shm_size(facts, field("MemTotal").ok()) {
                Ok(size) => {
                    finding_vars.push(("shm", format_bytes(size)));
                    if let Some(min) = self.min_shm
                        && size < min.0
                    {
                        problems.push(format!(
                            "/dev/shm is {}, expected at least {min}: NCCL and oneCCL fail or fall back",
                            format_bytes(size)
                        ));
                    }
                    match self.min_shm_free.map(|min| (min, shm_free(facts, size))) {
                        None => notes.push(format!("/dev/shm {}", format_bytes(size))),
                        Some((_, Err(e))) => {
                            notes.push(format!("/dev/shm {}", format_bytes(size)));
                            unchecked.push(Unchecked::Unreadable(e));
                        }
                        Some((min, Ok(free))) => {
                            notes.push(format!(
                                "/dev/shm {} ({} free)",
                                format_bytes(size),
                                format_bytes(free)
                            ));
                            finding_vars.push(("shm_free", format_bytes(free)));
                            if free < min.0 {
                                let files = shm_files(facts);
                                let largest: Vec<String> = files
                                    .iter()
                                    .take(5)
                                    .map(|f| {
                                        format!(
                                            "{} {} ({})",
                                            f.path,
                                            format_bytes(f.bytes),
                                            facts.user_name(f.uid)
                                        )
                                    })
                                    .collect();
                                let held = if largest.is_empty() {
                                    String::new()
                                } else {
                                    format!(
                                        "; largest files: {}{}",
                                        largest.join(", "),
                                        if files.len() > largest.len() {
                                            format!(" and {} more", files.len() - largest.len())
                                        } else {
                                            String::new()
                                        }
                                    )
                                };
                                finding_vars.push(("shm_files", largest.join(", ")));
                                problems.push(format!(
                                    "/dev/shm has {} free of {}, expected at least {min}: NCCL cannot create its segments (\"Error while creating shared memory segment\", \"No space left on device\"){held}",
                                    format_bytes(free),
                                    format_bytes(size)
                                ));
                            }
                        }
                    }
                }
                Err(e) => unchecked.push(Unchecked::Unreadable(e)),
            }
        }
        if let Some(min) = self.min_hugepages {
            match field("HugePages_Free") {
                Ok(free) => {
                    notes.push(format!("{free} free hugepages"));
                    if free < min {
                        problems.push(format!("{free} free hugepages, expected at least {min}"));
                    }
                }
                Err(e) => unchecked.push(Unchecked::Unreadable(e)),
            }
        }
        if self.min_nofile.is_some() || self.nofile_per_rank.is_some() {
            match limits::soft_limit_of(facts, "Max open files", "nofile") {
                Err(e) => unchecked.push(Unchecked::Unreadable(e)),
                Ok(None) => unchecked.push(Unchecked::NothingToRead(
                    "no /proc/self/limits under --root and no nofile policy in /etc/security"
                        .into(),
                )),
                Ok(Some(limit)) => {
                    let world = facts.launch().world_size;
                    let from_world = self.nofile_per_rank.zip(world).map(|(k, w)| k * w);
                    let want = self.min_nofile.into_iter().chain(from_world).max();
                    finding_vars.push(("nofile", limit.describe()));
                    notes.push(format!("ulimit -n {}", limit.describe()));
                    if let Some(want) = want
                        && !limit.at_least(want)
                    {
                        let why = match (from_world, world) {
                            (Some(f), Some(w)) if f == want => {
                                format!(
                                    " ({} per rank x WORLD_SIZE={w})",
                                    self.nofile_per_rank.unwrap_or(0)
                                )
                            }
                            _ => String::new(),
                        };
                        problems.push(format!(
                            "open files limited to {} (ulimit -n), expected at least {want}{why}",
                            match limit {
                                Limit::Unlimited => "unlimited".into(),
                                Limit::Value(v) => v.to_string(),
                            }
                        ));
                    }
                }
            }
        }
        let reasons = |only_unreadable: bool| -> Vec<&str> {
            unchecked
                .iter()
                .filter_map(|u| match u {
                    Unchecked::Unreadable(r) => Some(r.as_str()),
                    Unchecked::NothingToRead(r) => (!only_unreadable).then_some(r.as_str()),
                })
                .collect()
        };
        let mut finding = if !problems.is_empty() {
            problems_and_unchecked(&problems, &reasons(false))
        } else if !reasons(true).is_empty() {
            // Nothing wrong in what could be read, and something could not
            // be read: not evaluated, never a silent pass.
            Finding::error(reasons(true).join("; "))
        } else if !unchecked.is_empty() {
            Finding::skip(reasons(false).join("; "))
        } else {
            Finding::pass(notes.join(", "))
        };
        let measured = match finding.status {
            Status::Pass | Status::Fail => true,
            Status::Error => !notes.is_empty(),
            Status::Warn | Status::Skip => false,
        };
        if measured {
            finding = finding.measured(notes.join(", "));
        }
        for (k, v) in finding_vars {
            finding = finding.var(k, v);
        }
        finding
    }
}

impl Probe for Memory {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tmpfs_sizes() {
        assert_eq!(super::tmpfs_size("65536k", None), Some(64 << 20));
        assert_eq!(super::tmpfs_size("50%", Some(1000)), Some(500));
        assert_eq!(super::tmpfs_size("1g", None), Some(1 << 30));
    }
}
