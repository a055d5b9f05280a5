//! Kept passes: a check that says `cache: DURATION` has its pass kept in
//! the state directory, with the fingerprint of what it depends on (the
//! node's: `facts::fingerprint`, and the check's own definition). Within
//! the duration, with both unchanged, the next run reuses it instead of
//! running the check again, and says so.
//!
//! Only a pass is kept. A state file that is not a plain file of this
//! user's, cannot be read, or says it was measured in the future is not
//! trusted: the check runs, and its message says why the kept pass was
//! not taken.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Check;
use preflight_facts::Facts;
use preflight_ground::values::hex;
use preflight_result::{CheckResult, Status};

const SCHEMA: &str = "preflight.kept/v1";
/// A kept pass is a report line: a file larger than this is not one.
const MAX_FILE: u64 = 256 << 10;
/// Clocks differ a little between the run that kept a pass and this one.
const CLOCK_SLACK: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    schema: String,
    check: String,
    definition: String,
    fingerprint: String,
    /// Unix seconds.
    measured_at: u64,
    valid_until: u64,
    result: CheckResult,
}

/// What to do about one check.
#[derive(Debug)]
pub enum Lookup {
    /// Its kept pass, marked as reused.
    Reuse(Box<CheckResult>),
    /// Run it; `why` says why a kept pass there was not taken.
    Run { why: Option<String> },
}

/// The kept passes of this node, for this run.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    fingerprint: String,
    /// `--fresh`: nothing is reused (passes are still kept).
    fresh: bool,
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `2026-11-28 17:40 UTC`
fn clock(secs: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(secs);
    let text = humantime::format_rfc3339_seconds(t).to_string();
    format!("{} {} UTC", &text[..10], &text[11..16])
}

fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// A check's definition, as far as its result depends on it: its kind,
/// severity, parameters, timeout and cache.
pub fn definition(check: &Check) -> String {
    let mut h = Sha256::new();
    for part in [
        check.id.as_str(),
        check.kind.name,
        &format!("{:?}", check.severity),
        &check.probe.params().to_string(),
        &format!("{:?} {:?}", check.timeout, check.cache),
    ] {
        h.update(part.as_bytes());
        h.update(b"|");
    }
    hex(&h.finalize()[..8])
}

/// The default state directory: /var/lib/preflight for root, else the
/// user's state home.
pub fn default_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/preflight");
    }
    match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("preflight"),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
            .join(".local/state/preflight"),
    }
}

impl Store {
    pub fn open(state_dir: &Path, facts: &Facts, fresh: bool) -> Store {
        Store {
            dir: state_dir.join("kept"),
            fingerprint: preflight_facts::fingerprint::of(facts),
            fresh,
        }
    }

    fn file(&self, check: &Check) -> PathBuf {
        // Check ids are `[A-Za-z0-9_.-]`: a file name as they are.
        self.dir.join(format!("{}.json", check.id))
    }

    /// The kept pass of `check`, if one may be reused now.
    pub fn lookup(&self, check: &Check, now: SystemTime) -> Lookup {
        let Some(_) = check.cache else {
            return Lookup::Run { why: None };
        };
        if self.fresh {
            return Lookup::Run { why: None };
        }
        let path = self.file(check);
        let kept = match read(&path) {
            Ok(Some(k)) => k,
            Ok(None) => return Lookup::Run { why: None },
            Err(why) => {
                return Lookup::Run {
                    why: Some(format!("a kept pass was not trusted: {why}")),
                };
            }
        };
        let now = unix(now);
        let stale = |why: &str| Lookup::Run {
            why: Some(format!("the kept pass no longer holds: {why}")),
        };
        if kept.schema != SCHEMA || kept.check != check.id {
            return Lookup::Run {
                why: Some(format!(
                    "a kept pass was not trusted: {} is not this check's",
                    path.display()
                )),
            };
        }
        if kept.measured_at > now + CLOCK_SLACK.as_secs() {
            return Lookup::Run {
                why: Some(format!(
                    "a kept pass was not trusted: {} says it was measured in the future ({})",
                    path.display(),
                    rfc3339(kept.measured_at)
                )),
            };
        }
        if kept.result.status != Status::Pass {
            return Lookup::Run {
                why: Some(format!(
                    "a kept pass was not trusted: {} holds no pass",
                    path.display()
                )),
            };
        }
        if kept.definition != definition(check) {
            return stale("the check's definition changed");
        }
        if kept.fingerprint != self.fingerprint {
            return stale("the node changed (boot, driver, firmware, devices or a hardware event)");
        }
        if now >= kept.valid_until {
            return Lookup::Run { why: None };
        }
        let mut r = kept.result;
        let ago =
            preflight_ground::values::format_duration(Duration::from_secs(now - kept.measured_at));
        r.message = format!(
            "{} (measured {ago} ago, reused until {})",
            r.message,
            clock(kept.valid_until)
        );
        r.duration = Duration::ZERO;
        r.cached = true;
        r.measured_at = Some(rfc3339(kept.measured_at));
        r.reused_until = Some(rfc3339(kept.valid_until));
        Lookup::Reuse(Box::new(r))
    }

    /// Keeps `result` of `check` if it is a pass of a check that asks for
    /// it; a result that is not a pass removes what was kept.
    pub fn keep(&self, check: &Check, result: &CheckResult, now: SystemTime) -> Result<(), String> {
        let Some(cache) = check.cache else {
            return Ok(());
        };
        let path = self.file(check);
        if result.status != Status::Pass || result.cached {
            if result.status != Status::Pass {
                let _ = std::fs::remove_file(&path);
            }
            return Ok(());
        }
        let now = unix(now);
        let kept = Kept {
            schema: SCHEMA.into(),
            check: check.id.clone(),
            definition: definition(check),
            fingerprint: self.fingerprint.clone(),
            measured_at: now,
            valid_until: now.saturating_add(cache.as_secs()),
            result: result.clone(),
        };
        let text = serde_json::to_string(&kept).map_err(|e| e.to_string())?;
        create_dir(&self.dir)?;
        // A file of this user's alone (mode 600), renamed into place: a
        // reader never sees half of one.
        let cannot = |e: std::io::Error| format!("cannot keep the pass in {}: {e}", path.display());
        let mut temp = tempfile::NamedTempFile::new_in(&self.dir).map_err(cannot)?;
        std::io::Write::write_all(&mut temp, text.as_bytes()).map_err(cannot)?;
        temp.persist(&path).map_err(|e| cannot(e.error))?;
        Ok(())
    }
}

/// The state directory, this user's only.
fn create_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

/// A kept pass from `path`: none where there is no file; an error where
/// the file is there but is not one to trust.
fn read(path: &Path) -> Result<Option<Kept>, String> {
    use preflight_facts::guarded_file::{self, Refused};
    let me = nix::unistd::geteuid().as_raw();
    let judged = guarded_file::read(path, MAX_FILE, |meta| {
        if meta.uid() != me {
            return Err(format!(
                "{} belongs to uid {}, not to this user (uid {me})",
                path.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "{} can be written by others (mode {:04o})",
                path.display(),
                meta.mode() & 0o777
            ));
        }
        Ok(())
    });
    let text = match judged {
        Ok(Ok(t)) => t,
        Ok(Err(why)) => return Err(why),
        Err(Refused::Missing) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| format!("{} is corrupt ({e})", path.display()))
}
