//! `--format` on the command line: each command takes the formats it
//! writes (`report::format`'s lists), so that its `--help`, its man page
//! and its completions name those and no other.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

use preflight_report::format::ALL;
pub use preflight_report::format::{DIAGNOSE, Format, LIST, REPORT, RUN};

/// `--format`'s parser for a command that writes `formats`.
pub fn parser(formats: &'static [Format]) -> impl TypedValueParser<Value = Format> {
    PossibleValuesParser::new(
        formats
            .iter()
            .map(|f| PossibleValue::new(f.name()).help(f.help())),
    )
    .map(|name: String| {
        ALL.into_iter()
            .find(|f| f.name() == name)
            .unwrap_or(Format::Human)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_takes_only_its_own_formats() {
        let cmd = clap::Command::new("t").arg(
            clap::Arg::new("format")
                .long("format")
                .value_parser(parser(REPORT)),
        );
        let m = cmd
            .clone()
            .try_get_matches_from(["t", "--format", "html"])
            .unwrap();
        assert_eq!(m.get_one::<Format>("format"), Some(&Format::Html));
        let e = cmd
            .try_get_matches_from(["t", "--format", "junit"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("possible values: html, markdown, json"), "{e}");
    }
}
