//! Value types that checklists write as text and that must be valid at load
//! time: durations and regular expressions. Their errors point at the value.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// A duration written with a unit: `500ms`, `5s`, `2m`, `1h 30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub Duration);

impl Span {
    pub fn parse(text: &str) -> Result<Span, String> {
        let trimmed = text.trim();
        if !trimmed.is_empty() && trimmed.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return Err(format!(
                "invalid duration `{text}`: a duration needs a unit, e.g. `{trimmed}s` or `{trimmed}ms`"
            ));
        }
        humantime::parse_duration(trimmed)
            .map(Span)
            .map_err(|e| format!("invalid duration `{text}`: {e} (examples: 500ms, 5s, 2m, 1h)"))
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
    if ms % 1000 != 0 && ms < 60_000 {
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

#[cfg(test)]
mod tests {
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
