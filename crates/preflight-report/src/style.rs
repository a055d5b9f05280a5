//! Colour for terminals: on when stdout is a terminal and NO_COLOR is unset
//! (`--color auto`), forced by `--color always`, off with `--color never`.

use std::io::IsTerminal;

use preflight_result::{Status, Verdict};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
}

impl Style {
    pub fn new(choice: ColorChoice, to_terminal: bool) -> Style {
        let color = match choice {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                to_terminal
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::env::var("TERM").map_or(true, |t| t != "dumb")
            }
        };
        Style { color }
    }

    pub fn for_stdout(choice: ColorChoice) -> Style {
        Style::new(choice, std::io::stdout().is_terminal())
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    pub fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }

    pub fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }

    /// The fixed-width mark of a status.
    pub fn mark(&self, status: Status) -> String {
        let (code, text) = match status {
            Status::Pass => ("32", "PASS"),
            Status::Warn => ("33", "WARN"),
            Status::Fail => ("1;31", "FAIL"),
            Status::Skip => ("2", "SKIP"),
            Status::Error => ("1;35", "ERR "),
        };
        self.paint(code, text)
    }

    pub fn verdict(&self, verdict: Verdict) -> String {
        let (code, text) = match verdict {
            Verdict::Ready => ("1;32", "READY"),
            Verdict::NotReady => ("1;31", "NOT READY"),
            Verdict::Incomplete => ("1;35", "INCOMPLETE"),
        };
        self.paint(code, text)
    }
}

/// Whether the locale's character set is UTF-8, from LC_ALL, LC_CTYPE and
/// LANG as the C library reads them (the first one set wins); unset is
/// the C locale, which is ASCII.
pub fn utf8_locale(env: impl Fn(&str) -> Option<String>) -> bool {
    ["LC_ALL", "LC_CTYPE", "LANG"]
        .iter()
        .find_map(|k| env(k).filter(|v| !v.is_empty()))
        .is_some_and(|v| {
            let v = v.to_ascii_lowercase();
            v.contains("utf-8") || v.contains("utf8")
        })
}

/// Text for a terminal or log that is not UTF-8: the marks and symbols
/// the report uses in ASCII, anything else from a message as `?`.
pub fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            c if c.is_ascii() => out.push(c),
            '·' | '•' => out.push('-'),
            '—' | '–' => out.push_str("--"),
            'µ' | 'μ' => out.push('u'),
            '≥' => out.push_str(">="),
            '≤' => out.push_str("<="),
            '×' => out.push('x'),
            '→' => out.push_str("->"),
            '←' => out.push_str("<-"),
            '↔' => out.push_str("<->"),
            '…' => out.push_str("..."),
            '✓' => out.push_str("ok"),
            '✗' => out.push('X'),
            '‘' | '’' => out.push('\''),
            '“' | '”' => out.push('"'),
            _ => out.push('?'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_locale_decides_utf8() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(utf8_locale(env(&[("LANG", "en_US.UTF-8")])));
        assert!(utf8_locale(env(&[("LC_ALL", "C.utf8"), ("LANG", "C")])));
        assert!(!utf8_locale(env(&[
            ("LC_ALL", "C"),
            ("LANG", "en_US.UTF-8")
        ])));
        assert!(!utf8_locale(env(&[])));
        assert!(!utf8_locale(env(&[("LANG", "de_DE.ISO-8859-1")])));
    }

    #[test]
    fn ascii_keeps_meaning() {
        assert_eq!(
            ascii("READY  1 pass · 0 warn  (5µs) ≥ 2 → ok…"),
            "READY  1 pass - 0 warn  (5us) >= 2 -> ok..."
        );
        assert!(ascii("GPU «x»").is_ascii());
    }
}
