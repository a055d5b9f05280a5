//! JUnit XML for CI systems: one testcase per check; fail as a failure,
//! error as an error, skip as skipped; warnings are failures under
//! `--strict` and otherwise passing cases with the warning in system-out.

use std::fmt::Write;

use super::markup::escape;
use preflight_result::Status;
use preflight_result::report::Report;

fn details(check: &preflight_result::CheckResult) -> String {
    let mut text = check.message.clone();
    if let Some(m) = &check.measured {
        text.push_str(&format!("\nmeasured: {m}"));
    }
    if let Some(e) = &check.expected {
        text.push_str(&format!("\nexpected: {e}"));
    }
    if let Some(h) = &check.hint {
        text.push_str(&format!("\nhint: {h}"));
    }
    text.push_str(&format!("\ndefined at: {}", check.source));
    text
}

pub fn junit(report: &Report) -> String {
    let failures = report
        .checks
        .iter()
        .filter(|c| c.status == Status::Fail || (report.strict && c.status == Status::Warn))
        .count();
    let n = &report.summary;
    let time = report.duration_ms as f64 / 1000.0;
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"preflight\" tests=\"{}\" failures=\"{failures}\" errors=\"{}\" skipped=\"{}\" time=\"{time:.3}\">",
        report.checks.len(),
        n.error,
        n.skip
    );
    let _ = writeln!(
        out,
        "  <testsuite name=\"preflight.{}\" hostname=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{}\" skipped=\"{}\" time=\"{time:.3}\" timestamp=\"{}\">",
        escape(&report.command),
        escape(&report.node.hostname),
        report.checks.len(),
        n.error,
        n.skip,
        escape(&report.started_at)
    );
    let _ = writeln!(
        out,
        "    <properties><property name=\"verdict\" value=\"{}\"/><property name=\"exit_code\" value=\"{}\"/></properties>",
        report.verdict.name(),
        report.exit_code
    );
    for check in &report.checks {
        let _ = write!(
            out,
            "    <testcase classname=\"preflight.{}\" name=\"{}\" time=\"{:.3}\"",
            escape(&check.area),
            escape(&check.id),
            check.duration.as_secs_f64()
        );
        let body = match check.status {
            Status::Pass => None,
            Status::Skip => Some(format!("<skipped message=\"{}\"/>", escape(&check.message))),
            Status::Fail => Some(format!(
                "<failure type=\"fail\" message=\"{}\">{}</failure>",
                escape(&check.message),
                escape(&details(check))
            )),
            Status::Warn if report.strict => Some(format!(
                "<failure type=\"warn\" message=\"{}\">{}</failure>",
                escape(&check.message),
                escape(&details(check))
            )),
            Status::Warn => Some(format!(
                "<system-out>warning: {}</system-out>",
                escape(&details(check))
            )),
            Status::Error => Some(format!(
                "<error type=\"error\" message=\"{}\">{}</error>",
                escape(&check.message),
                escape(&details(check))
            )),
        };
        match body {
            None => out.push_str("/>\n"),
            Some(body) => {
                let _ = writeln!(out, ">\n      {body}\n    </testcase>");
            }
        }
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escapes_markup_and_control_characters() {
        assert_eq!(
            escape("a<b & \"c\"\u{1}"),
            "a&lt;b &amp; &quot;c&quot;\u{fffd}"
        );
    }
}
