//! Exit codes, defined once. Schedulers and health-check hooks gate on
//! them. `--help`, the man pages and the docs' tables all come from, or
//! are tested against, [`MEANINGS`].

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    Ready = 0,
    NotReady = 1,
    Usage = 2,
    Incomplete = 3,
}

impl ExitCode {
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// What one exit code means, as the docs' tables put it (Markdown code
/// spans in `when`; `--help` and the man pages drop the backticks).
pub struct Meaning {
    pub code: &'static str,
    /// The report's `verdict` where the code is one.
    pub verdict: &'static str,
    pub when: &'static str,
}

/// The codes of `run`, `check`, `bench` and most commands (`diagnose` and
/// the `slurm` modes say what their own mean).
pub const MEANINGS: &[Meaning] = &[
    Meaning {
        code: "0",
        verdict: "ready",
        when: "no check failed (warnings allowed unless `--strict`)",
    },
    Meaning {
        code: "1",
        verdict: "not_ready",
        when: "a check failed, or warned under `--strict`",
    },
    Meaning {
        code: "2",
        verdict: "",
        when: "bad invocation or invalid configuration, and only that: a checklist, a profile, the settings (the error names file:line:column and key), a variable (named)",
    },
    Meaning {
        code: "3",
        verdict: "incomplete",
        when: "nothing failed, but a `severity: fail` check (any check, under `--strict`) ended in `error`; or the run could not start what it needs (its async runtime, its own program to start a node's ranks); or a signal interrupted the run",
    },
    Meaning {
        code: "128+N",
        verdict: "",
        when: "a second signal N while the first one's report was being written (no report)",
    },
];

impl Meaning {
    /// The verdict, if any, and `when`, as plain text: what `--help` and
    /// the man pages print beside the code.
    pub fn sentence(&self) -> String {
        let when = self.when.replace('`', "");
        if self.verdict.is_empty() {
            when
        } else {
            format!("{}: {when}", self.verdict)
        }
    }
}

/// Where a meaning's wrapped lines start in `--help`.
const INDENT: &str = "         ";

/// The epilogue of `preflight --help`: each meaning wrapped under its
/// code, narrower than the help's 100 columns, so that clap leaves the
/// lines as they are.
pub fn help_text() -> String {
    const WIDTH: usize = 90;
    let mut text = String::from("Exit codes:");
    for m in MEANINGS {
        let mut line = format!("  {:<6} ", m.code);
        for word in m.sentence().split(' ') {
            if line.len() + word.len() > WIDTH && line.len() > INDENT.len() {
                text.push('\n');
                text.push_str(line.trim_end());
                line = INDENT.to_string();
            }
            line.push_str(word);
            line.push(' ');
        }
        text.push('\n');
        text.push_str(line.trim_end());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_wraps_each_meaning_under_its_code() {
        let text = help_text();
        assert!(text.lines().all(|l| l.len() <= 90), "{text}");
        let codes: Vec<&str> = text
            .lines()
            .skip(1)
            .filter(|l| !l.starts_with(INDENT))
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(codes, ["0", "1", "2", "3", "128+N"]);
    }
}
