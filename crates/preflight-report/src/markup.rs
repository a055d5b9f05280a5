//! Text inside XML or HTML (the JUnit report, the HTML page and its SVG):
//! the five characters that could open markup or end an attribute, and the
//! control characters XML 1.0 forbids even escaped.

pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 forbids most control characters even when escaped.
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\r' | '\t') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}
