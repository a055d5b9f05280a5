//! Resource limits from /proc/self/limits: the soft limit is what a rank
//! started from this shell inherits and hits first.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Unlimited,
    Value(u64),
}

impl Limit {
    pub fn at_least(self, want: u64) -> bool {
        match self {
            Limit::Unlimited => true,
            Limit::Value(v) => v >= want,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Limit::Unlimited => "unlimited".into(),
            Limit::Value(v) => v.to_string(),
        }
    }
}

/// The soft limit of the row whose name starts the line ("Max open files",
/// "Max locked memory"). `Err` names what is wrong with the table.
pub fn soft_limit(text: &str, name: &str) -> Result<Limit, String> {
    let line = text
        .lines()
        .find(|l| l.starts_with(name))
        .ok_or_else(|| format!("no `{name}` row"))?;
    let soft = line[name.len()..]
        .split_whitespace()
        .next()
        .ok_or_else(|| format!("`{name}` row has no values"))?;
    if soft == "unlimited" {
        return Ok(Limit::Unlimited);
    }
    soft.parse()
        .map(Limit::Value)
        .map_err(|_| format!("`{name}` soft limit `{soft}` is not a number"))
}

/// The soft limit a new login session gets from pam_limits' policy:
/// /etc/security/limits.conf, then limits.d/*.conf in name order, the
/// last `*` (or any-domain) `soft` or `-` line for the item winning. Used
/// under a fixture root, where no process's /proc/self/limits exists.
pub fn policy_soft(etc_security: &std::path::Path, item: &str) -> Option<Limit> {
    let mut files = vec![etc_security.join("limits.conf")];
    if let Ok(rd) = std::fs::read_dir(etc_security.join("limits.d")) {
        let mut extra: Vec<_> = rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "conf"))
            .collect();
        extra.sort();
        files.extend(extra);
    }
    let mut found = None;
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [domain, kind, name, value] = fields[..] else {
                continue;
            };
            if name != item || !(kind == "soft" || kind == "-") || domain.starts_with('@') {
                continue;
            }
            found = match value {
                "unlimited" | "infinity" | "-1" => Some(Limit::Unlimited),
                // limits.conf writes memlock in KiB.
                v => v
                    .parse::<u64>()
                    .ok()
                    .map(|n| Limit::Value(if item == "memlock" { n * 1024 } else { n }))
                    .or(found),
            };
        }
    }
    found
}

/// The soft limit of a resource for this run: /proc/self/limits (always on
/// the real machine; in a fixture tree if it carries one), else the
/// pam_limits policy under the root. `Ok(None)`: a fixture tree with
/// neither.
pub fn soft_limit_of(facts: &crate::Facts, row: &str, item: &str) -> Result<Option<Limit>, String> {
    let path = "/proc/self/limits";
    match std::fs::read_to_string(facts.host_path(path)) {
        Ok(text) => soft_limit(&text, row)
            .map(Some)
            .map_err(|e| format!("{path}: {e}")),
        Err(e) if facts.is_live() => Err(format!("cannot read {path}: {e}")),
        Err(_) => Ok(policy_soft(&facts.host_path("/etc/security"), item)),
    }
}

/// This process's open-files limit, soft and hard, as it is now.
pub fn open_files() -> Option<(u64, u64)> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \nMax open files            1024                 1048576              files     \nMax locked memory         unlimited            unlimited            bytes     \n";

    #[test]
    fn soft_limits() {
        assert_eq!(soft_limit(LIMITS, "Max open files"), Ok(Limit::Value(1024)));
        assert_eq!(
            soft_limit(LIMITS, "Max locked memory"),
            Ok(Limit::Unlimited)
        );
        assert!(soft_limit(LIMITS, "Max processes").is_err());
    }
}
