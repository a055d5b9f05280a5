//! /proc/meminfo: `Name:   value kB` lines, in bytes.

/// A field in bytes (the kernel writes kB, meaning KiB), or a bare count
/// (HugePages_Free). `None` when absent or malformed.
pub fn field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(name))?;
    let mut parts = line.split(':').nth(1)?.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => Some(value * 1024),
        None => Some(value),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fields() {
        let text = "MemTotal:       2113602476 kB\nMemAvailable:   1987654321 kB\nHugePages_Free:        4\n";
        assert_eq!(super::field(text, "MemAvailable"), Some(1987654321 * 1024));
        assert_eq!(super::field(text, "HugePages_Free"), Some(4));
        assert_eq!(super::field(text, "Mem"), None);
    }
}
