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
