//! Colour for terminals: on when stdout is a terminal and NO_COLOR is unset
//! (`--color auto`), forced by `--color always`, off with `--color never`.

use std::io::IsTerminal;

use crate::result::{Status, Verdict};

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
