//! Value types that checklists write as text and that must be valid at load
//! time: durations and regular expressions. Their errors point at the value.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// A duration written with a unit: `500ms`, `5s`, `2m`, `1h 30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub Duration);

impl Span {
    /// A day: any longer deadline is a typo, and would overflow clocks.
    pub const LONGEST: Duration = Duration::from_secs(24 * 3600);

    pub fn parse(text: &str) -> Result<Span, String> {
        let trimmed = text.trim();
        if !trimmed.is_empty() && trimmed.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return Err(format!(
                "invalid duration `{text}`: a duration needs a unit, e.g. `{trimmed}s` or `{trimmed}ms`"
            ));
        }
        let span = humantime::parse_duration(trimmed)
            .map(Span)
            .map_err(|e| format!("invalid duration `{text}`: {e} (examples: 500ms, 5s, 2m, 1h)"))?;
        if span.0 > Span::LONGEST {
            return Err(format!(
                "duration `{text}` is longer than {}: no preflight wait should be",
                format_duration(Span::LONGEST)
            ));
        }
        Ok(span)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

/// Short human form: `250ms`, `5s`, `1m30s`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if !ms.is_multiple_of(1000) && ms < 60_000 {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let secs = d.as_secs();
    match (secs / 3600, (secs % 3600) / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Span::parse(&text).map_err(de::Error::custom)
    }
}

impl Serialize for Span {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

/// A regular expression compiled when the checklist is loaded. Multi-line:
/// `^` and `$` match at line boundaries, as operators expect when matching
/// command output or config files line by line.
#[derive(Debug, Clone)]
pub struct Pattern(pub regex::Regex);

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, String> {
        regex::RegexBuilder::new(text)
            .multi_line(true)
            .build()
            .map(Pattern)
            .map_err(|e| {
                // The regex crate renders a multi-line diagram; its last line
                // holds the reason, which reads well after file:line:col.
                let reason = e.to_string();
                let reason = reason
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim()
                    .trim_start_matches("error: ")
                    .to_string();
                format!("invalid regex `{text}`: {reason}")
            })
    }

    pub fn is_match(&self, text: &str) -> bool {
        self.0.is_match(text)
    }

    pub fn find<'t>(&self, text: &'t str) -> Option<&'t str> {
        self.0.find(text).map(|m| m.as_str())
    }

    /// The whole line (trimmed) around the first match: what an operator
    /// needs to see and edit.
    pub fn find_line<'t>(&self, text: &'t str) -> Option<&'t str> {
        let found = self.0.find(text)?;
        let start = text[..found.start()].rfind('\n').map_or(0, |i| i + 1);
        let end = text[found.end()..]
            .find('\n')
            .map_or(text.len(), |i| found.end() + i);
        Some(text[start..end].trim())
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Pattern::parse(&text).map_err(de::Error::custom)
    }
}

impl Serialize for Pattern {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A size in bytes, written as an integer or with a binary unit: `64M`,
/// `16GiB`, `512k`. K, M, G and T mean powers of 1024 whether written
/// `G`, `GB` or `GiB`, as `docker --shm-size` and `ulimit` read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl Bytes {
    pub fn parse(text: &str) -> Result<Bytes, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let number: f64 = number
            .parse()
            .map_err(|_| format!("invalid size `{text}`: write e.g. 64M, 16GiB or 1073741824"))?;
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            other => {
                return Err(format!(
                    "invalid size `{text}`: unknown unit `{other}` (use K, M, G or T)"
                ));
            }
        };
        Ok(Bytes((number * (1u64 << shift) as f64) as u64))
    }
}

/// The median of some figures (the mean of the middle two for an even
/// count); `None` for none.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// Short binary form: `64 MiB`, `1.5 GiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        return format!("{value:.0} {}", UNITS[unit]);
    }
    let text = format!("{value:.1}");
    format!(
        "{} {}",
        text.strip_suffix(".0").unwrap_or(&text),
        UNITS[unit]
    )
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_bytes(self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(n) => Ok(Bytes(n)),
            Raw::Text(t) => Bytes::parse(&t).map_err(de::Error::custom),
        }
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

/// "1 node", "3 nodes".
pub fn count(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else if word.ends_with('s')
        || word.ends_with('x')
        || word.ends_with("sh")
        || word.ends_with("ch")
    {
        // "processes", "matches": English adds -es after a hiss.
        format!("{n} {word}es")
    } else {
        format!("{n} {word}s")
    }
}

/// The first `max` items joined by `sep`, and how many more there are:
/// a message that names nodes stays readable, and its size bounded, at
/// any number of nodes.
pub fn listed(items: &[String], sep: &str, max: usize) -> String {
    let mut out = items
        .iter()
        .take(max)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(sep);
    if items.len() > max {
        out.push_str(&format!("{sep}and {} more", items.len() - max));
    }
    out
}

/// `0-3,8`
pub fn rank_ranges(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let start = ranks[i];
        let mut end = start;
        while i + 1 < ranks.len() && ranks[i + 1] == end + 1 {
            i += 1;
            end = ranks[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

/// "65536", "64K", "64KiB", "1M", "1MiB", "1G".
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("`{text}`: a size such as 65536, 64KiB or 64MiB"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("`{text}`: unknown unit (B, KiB, MiB, GiB)")),
    };
    n.checked_mul(mult)
        .filter(|s| *s <= 4 << 30)
        .ok_or_else(|| format!("`{text}`: at most 4 GiB"))
}

/// Bytes as lowercase hex, two digits each.
/// Text on one line, at most `max` bytes (cut on a character, `...`
/// said), control characters as spaces: for a drain reason, a log line, a
/// termination message.
pub fn one_line(text: &str, max: usize) -> String {
    let mut s: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if s.len() > max {
        let mut end = max.saturating_sub(3);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex text back to bytes; `None` for anything else, whatever a peer sent
/// (odd lengths, non-hex digits, multi-byte characters: never a panic).
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    let value = |d: u8| (d as char).to_digit(16).filter(|_| d.is_ascii());
    digits
        .chunks(2)
        .map(|pair| Some((value(pair[0])? * 16 + value(pair[1])?) as u8))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(super::unhex(&super::hex(&bytes)), Some(bytes));
        for bad in ["abc", "zz", "é0", "0é", "+1", "€€", "0\u{300}"] {
            assert_eq!(super::unhex(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(Bytes::parse("64M").unwrap().0, 64 << 20);
        assert_eq!(Bytes::parse("16GiB").unwrap().0, 16 << 30);
        assert_eq!(Bytes::parse("1.5G").unwrap().0, 3 << 29);
        assert_eq!(Bytes::parse("4096").unwrap().0, 4096);
        assert!(Bytes::parse("12 parsecs").is_err());
        assert_eq!(format_bytes(64 << 20), "64 MiB");
        assert_eq!(format_bytes(65536), "64 KiB");
        assert_eq!(format_bytes(8), "8 B");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
    }

    use super::*;

    #[test]
    fn durations_need_units() {
        assert_eq!(Span::parse("5s").unwrap().0, Duration::from_secs(5));
        assert_eq!(Span::parse("250ms").unwrap().0, Duration::from_millis(250));
        assert_eq!(Span::parse("1m 30s").unwrap().0, Duration::from_secs(90));
        assert!(Span::parse("5").unwrap_err().contains("needs a unit"));
        assert!(
            Span::parse("5 parsecs")
                .unwrap_err()
                .contains("invalid duration")
        );
    }

    #[test]
    fn durations_format_shortly() {
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(5)), "5s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
    }

    #[test]
    fn find_line_quotes_the_whole_line() {
        let p = Pattern::parse(r"^127\.0\.1\.1\s").unwrap();
        assert_eq!(
            p.find_line("127.0.0.1 a\n127.0.1.1 node\n::1 b\n"),
            Some("127.0.1.1 node")
        );
        assert_eq!(p.find_line("127.0.0.1 a\n"), None);
    }

    #[test]
    fn regex_errors_are_one_line() {
        let e = Pattern::parse("[a-").unwrap_err();
        assert!(e.starts_with("invalid regex `[a-`: "), "{e}");
        assert!(!e.contains('\n'));
    }
}
