//! The report formats: one list for every command, each command taking
//! the formats it writes (`commands::format` spells them on the command
//! line), so that its `--help`, its man page and its completions name
//! those and no other.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// For people: a terminal, a log.
    Human,
    /// The versioned document (`preflight.report/v1` and its kin).
    Json,
    /// One test case per check, for CI systems.
    Junit,
    /// Text exposition format, for node_exporter's textfile collector.
    Prometheus,
    /// One self-contained page: no scripts, fonts or styles from elsewhere.
    Html,
    /// Tables for tickets and chat, cut to the failing rows.
    Markdown,
}

pub const ALL: [Format; 6] = [
    Format::Human,
    Format::Json,
    Format::Junit,
    Format::Prometheus,
    Format::Html,
    Format::Markdown,
];

/// `run`, `check`, `bench` and the Slurm modes.
pub const RUN: &[Format] = &[
    Format::Human,
    Format::Json,
    Format::Junit,
    Format::Prometheus,
];
/// `diagnose`.
pub const DIAGNOSE: &[Format] = &[Format::Human, Format::Json, Format::Prometheus];
/// `list`.
pub const LIST: &[Format] = &[Format::Human, Format::Json];
/// `report`.
pub const REPORT: &[Format] = &[Format::Html, Format::Markdown, Format::Json];

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Human => "human",
            Format::Json => "json",
            Format::Junit => "junit",
            Format::Prometheus => "prometheus",
            Format::Html => "html",
            Format::Markdown => "markdown",
        }
    }

    pub fn help(self) -> &'static str {
        match self {
            Format::Human => "for people: a terminal, a log",
            Format::Json => "the versioned JSON document",
            Format::Junit => "one test case per check, for CI systems",
            Format::Prometheus => "node_exporter's textfile collector (write it with --output)",
            Format::Html => "one self-contained page: no scripts, fonts or styles from elsewhere",
            Format::Markdown => "tables for tickets and chat, cut to the failing rows",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_has_one_name_and_each_list_is_of_known_formats() {
        let mut names: Vec<&str> = ALL.iter().map(|f| f.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
        for list in [RUN, DIAGNOSE, LIST, REPORT] {
            for f in list {
                assert!(ALL.contains(f));
            }
        }
    }
}
