//! `preflight report --format markdown`: the merged cluster report as
//! tables for a ticket or a chat, the largest of them cut to their failing
//! rows with a count of the rest.

use std::fmt::Write;

use preflight_ground::values::{count, format_bytes, rank_ranges};
use preflight_result::Status;
use preflight_result::merged::{MergedReport, Problem};

/// Rows kept of a table cut to its failing rows.
const ROWS: usize = 50;

pub fn markdown(m: &MergedReport) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "# preflight cluster report: {}\n", verdict_words(m));
    let c = &m.counts;
    let _ = writeln!(
        w,
        "**{}** (exit {}) · {}: {} ready, {} not ready, {} incomplete · {} · reports from {} to {}\n",
        m.verdict.name(),
        m.exit_code,
        count(c.nodes, "node"),
        c.ready,
        c.not_ready,
        c.incomplete,
        count(m.sources.len(), "report"),
        inline(&m.oldest_report_at),
        inline(&m.newest_report_at),
    );
    culprits(w, m);
    problems(w, &m.problems);
    matrix(w, m);
    reachability(w, m);
    collective(w, m);
    if !m.warnings.is_empty() {
        let _ = writeln!(w, "## Warnings\n");
        for x in &m.warnings {
            let _ = writeln!(w, "- {}", prose(x));
        }
        w.push('\n');
    }
    let _ = writeln!(w, "## Sources\n");
    let _ = writeln!(
        w,
        "| file | command | host | rank | started | verdict | used for |\n|---|---|---|---|---|---|---|"
    );
    for s in &m.sources {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} |",
            cell(&s.file),
            cell(&s.command),
            cell(&s.hostname),
            s.rank.map(|r| r.to_string()).unwrap_or_default(),
            cell(&s.started_at),
            s.verdict.name(),
            cell(&s.used_for)
        );
    }
    out
}

pub fn verdict_words(m: &MergedReport) -> &'static str {
    match m.verdict {
        preflight_result::Verdict::Ready => "READY",
        preflight_result::Verdict::NotReady => "NOT READY",
        preflight_result::Verdict::Incomplete => "INCOMPLETE",
    }
}

/// The mark of a status, readable without colour.
pub fn mark(s: Status) -> &'static str {
    match s {
        Status::Pass => "✓",
        Status::Warn => "!",
        Status::Fail => "✗",
        Status::Skip => "–",
        Status::Error => "?",
    }
}

fn culprits(w: &mut String, m: &MergedReport) {
    if m.culprits.is_empty() {
        return;
    }
    let _ = writeln!(w, "## Culprits\n\n| node | ranks | why |\n|---|---|---|");
    for c in m.culprits.iter().take(ROWS) {
        let _ = writeln!(
            w,
            "| {} | {} | {} |",
            cell(&c.node),
            rank_ranges(&c.ranks),
            cell(&c.reasons.join("; "))
        );
    }
    more(w, m.culprits.len(), "culprit", "");
    w.push('\n');
}

fn problems(w: &mut String, problems: &[Problem]) {
    if problems.is_empty() {
        return;
    }
    let _ = writeln!(w, "## Problems\n");
    for p in problems {
        let _ = writeln!(
            w,
            "### {} {} {}\n",
            mark(p.status),
            p.status.name().to_uppercase(),
            code(&p.id)
        );
        if let Some(cause) = &p.caused_by {
            let _ = writeln!(w, "Caused by {}: fix that first.\n", code(cause));
        }
        for (node, message) in p.nodes.iter().take(ROWS) {
            let _ = writeln!(w, "- **{}**: {}", inline(node), prose(message));
        }
        more(w, p.nodes.len(), "node", "");
        if let Some(h) = &p.hint {
            let _ = writeln!(w, "\nHint: {}", prose(h));
        }
        w.push('\n');
    }
}

/// Nodes with a problem × checks with a problem; the rest counted.
fn matrix(w: &mut String, m: &MergedReport) {
    let ids: Vec<&String> = m
        .check_ids
        .iter()
        .filter(|id| {
            m.nodes
                .iter()
                .any(|n| n.checks.get(*id).is_some_and(|c| bad(c.status)))
        })
        .collect();
    let rows: Vec<_> = m
        .nodes
        .iter()
        .filter(|n| n.checks.values().any(|c| bad(c.status)))
        .collect();
    let _ = writeln!(w, "## Nodes\n");
    if rows.is_empty() {
        let _ = writeln!(
            w,
            "No node has a problem ({} checked, {} in all).\n",
            count(m.nodes.len(), "node"),
            count(m.check_ids.len(), "check")
        );
        return;
    }
    let _ = write!(w, "| node | ranks | verdict |");
    for id in &ids {
        let _ = write!(w, " {} |", cell_code(id));
    }
    let _ = write!(w, "\n|---|---|---|");
    w.push_str(&"---|".repeat(ids.len()));
    w.push('\n');
    let mut dotted = false;
    for n in rows.iter().take(ROWS) {
        let _ = write!(
            w,
            "| {} | {} | {} |",
            cell(&n.name),
            rank_ranges(&n.ranks),
            n.verdict.name()
        );
        for id in &ids {
            let text = match n.checks.get(*id) {
                Some(c) => format!("{} {}", mark(c.status), c.status.name()),
                None if n.complete => "not run".into(),
                None => {
                    dotted = true;
                    "·".into()
                }
            };
            let _ = write!(w, " {text} |");
        }
        w.push('\n');
    }
    more(w, rows.len(), "node", " with a problem");
    let quiet = m.nodes.len() - rows.len();
    // Each clause only where it says something: no "0 more nodes", no
    // legend for a mark the table does not show.
    let mut said = Vec::new();
    if quiet > 0 {
        said.push(format!("{} without a problem", count(quiet, "more node")));
    }
    let others = m.check_ids.len() - ids.len();
    if others > 0 {
        said.push(format!(
            "{} passed or were skipped on every node{}",
            count(others, "other check"),
            if m.skipped_everywhere > 0 {
                format!(" ({} skipped everywhere)", m.skipped_everywhere)
            } else {
                String::new()
            }
        ));
    }
    if dotted {
        said.push("`·`: not failed (rank 0's summary lists failures only)".into());
    }
    if !said.is_empty() {
        let mut text = said.join("; ");
        if let Some(first) = text.get(..1) {
            text = first.to_uppercase() + &text[1..];
        }
        let _ = writeln!(w, "\n{text}.\n");
    }
}

fn reachability(w: &mut String, m: &MergedReport) {
    let Some(c) = &m.cluster else { return };
    let r = &c.reachability;
    if r.probes.is_empty() {
        return;
    }
    let failed: Vec<_> = r.probes.iter().filter(|p| p.status != "ok").collect();
    let _ = writeln!(
        w,
        "## Reachability ({}, {})\n",
        inline(&r.mode),
        count(r.probes.len(), "probe")
    );
    for f in &r.findings {
        let _ = writeln!(w, "- {}", prose(f));
    }
    if failed.is_empty() {
        let _ = writeln!(w, "Every probe reached its peer.\n");
        return;
    }
    let _ = writeln!(w, "\n| from | to | outcome | detail |\n|---|---|---|---|");
    let name = |i: usize| r.nodes.get(i).map_or("?", String::as_str).to_string();
    for p in failed.iter().take(ROWS) {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} |",
            cell(&name(p.from)),
            cell(&name(p.to)),
            cell(&p.status),
            cell(p.detail.as_deref().unwrap_or(""))
        );
    }
    more(w, failed.len(), "failed probe", "");
    let _ = writeln!(
        w,
        "\n{} reached their peer.\n",
        count(r.probes.len() - failed.len(), "other probe")
    );
}

fn collective(w: &mut String, m: &MergedReport) {
    let Some(c) = &m.collective else { return };
    let _ = writeln!(
        w,
        "## Collective ({}, {})\n",
        inline(&c.mode),
        count(c.world_size as usize, "rank")
    );
    for b in &c.backends {
        let _ = writeln!(w, "### {}: {}\n", inline(&b.name), inline(&b.verdict));
        if !b.available {
            let _ = writeln!(w, "{}\n", prose(&b.reason));
            continue;
        }
        if let Some(lib) = &b.library {
            let _ = writeln!(w, "{}\n", prose(lib));
        }
        for note in &b.notes {
            let _ = writeln!(w, "- {}", prose(note));
        }
        let bad_ops: Vec<_> = b.ops.iter().filter(|o| o.status != "verified").collect();
        for o in &bad_ops {
            let _ = writeln!(
                w,
                "- {} {}: {}",
                inline(&o.op),
                inline(&o.status),
                prose(o.detail.as_deref().unwrap_or(""))
            );
        }
        if let Some(e) = &b.ended {
            let _ = writeln!(w, "- ended early: {}", prose(e));
        }
        if b.sweep.is_empty() {
            w.push('\n');
            continue;
        }
        // Per operation: the largest sizes, where bandwidth is judged.
        if !w.ends_with("\n\n") {
            w.push('\n');
        }
        let _ = writeln!(
            w,
            "| op | size | time (µs) | algbw (GB/s) | busbw (GB/s) |\n|---|---:|---:|---:|---:|"
        );
        let ops = preflight_result::collective::ops_in_order(&b.sweep);
        let mut left = 0;
        for op in ops {
            let rows: Vec<_> = b.sweep.iter().filter(|r| r.op == op).collect();
            let keep = rows.len().min(3);
            left += rows.len() - keep;
            for r in &rows[rows.len() - keep..] {
                let _ = writeln!(
                    w,
                    "| {} | {} | {:.1} | {:.3} | {:.3} |",
                    op.name(),
                    format_bytes(r.bytes as u64),
                    r.time_us,
                    r.algbw,
                    r.busbw
                );
            }
        }
        if left > 0 {
            let _ = writeln!(
                w,
                "\n{} at smaller sizes in the HTML and JSON reports.",
                count(left, "more row")
            );
        }
        for t in m
            .thresholds
            .iter()
            .filter(|t| t.threshold.backend == b.name)
        {
            let _ = writeln!(
                w,
                "\nThreshold {}: {} at {} ≥ {:.3} GB/s: {} {}",
                code(&t.check),
                t.threshold.op,
                t.threshold
                    .bytes
                    .map_or("the largest size".into(), |b| format_bytes(b as u64)),
                t.threshold.min_busbw,
                mark(t.status),
                t.status.name()
            );
        }
        w.push('\n');
    }
    if !c.stragglers.is_empty() {
        let _ = writeln!(w, "### Stragglers\n");
        for s in &c.stragglers {
            let _ = writeln!(w, "- {}", prose(s));
        }
        w.push('\n');
    }
    if let Some(sp) = &c.second_pass {
        let _ = writeln!(w, "### Second pass\n");
        let took = if sp.ran {
            format!(" ({:.1} s)", sp.ms as f64 / 1000.0)
        } else {
            String::new()
        };
        let _ = writeln!(w, "{}{took}\n", prose(&sp.reason));
        let said = [
            ("slow node", &sp.slow_nodes),
            ("slow link", &sp.slow_links),
            ("cleared", &sp.cleared),
            ("not confirmed", &sp.unconfirmed),
        ];
        for (what, list) in said {
            for x in list {
                let _ = writeln!(w, "- {what}: {}", prose(x));
            }
        }
        if let Some(s) = &sp.skipped {
            let _ = writeln!(w, "- left out: {}", prose(s));
        }
        if !sp.pairs.is_empty() {
            let rates: Vec<String> = sp
                .pairs
                .iter()
                .map(|p| {
                    format!(
                        "{}↔{} {:.3}",
                        inline(&p.a.to_string()),
                        inline(&p.b.to_string()),
                        p.gbps
                    )
                })
                .collect();
            let _ = writeln!(w, "- measured again (GB/s each way): {}", rates.join(", "));
        }
        w.push('\n');
    }
    if !c.pairs.is_empty() {
        let mut pairs = c.pairs.clone();
        pairs.sort_by(|a, b| a.gbps.total_cmp(&b.gbps));
        let _ = writeln!(
            w,
            "Slowest pairs (GB/s each way): {}\n",
            pairs
                .iter()
                .take(5)
                .map(|p| format!(
                    "{}↔{} {:.3}",
                    inline(&p.a.to_string()),
                    inline(&p.b.to_string()),
                    p.gbps
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

fn bad(s: Status) -> bool {
    matches!(s, Status::Fail | Status::Warn | Status::Error)
}

/// `… and 10 more culprits` under a table cut at ROWS rows; `after`
/// follows the counted noun (`nodes` ` with a problem`).
fn more(w: &mut String, total: usize, noun: &str, after: &str) {
    if total > ROWS {
        let rest = count(total - ROWS, &format!("more {noun}"));
        let _ = writeln!(w, "\n… and {rest}{after}");
    }
}

/// Text inside a table cell: no pipe ends the cell, no newline the row.
fn cell(text: &str) -> String {
    inline(text).replace('|', "\\|")
}

/// A code span inside a table cell: GFM splits cells on pipes before it
/// reads code spans, and gives the escaped pipe back inside them.
fn cell_code(text: &str) -> String {
    code(text).replace('|', "\\|")
}

/// Every value in this report comes from a report file, and any node (or
/// anyone who can write one) may have put markup in it: a link, an image,
/// raw HTML a renderer would run. Each value is written as plain text:
/// what could start markup is escaped, and nothing it holds can close the
/// markup around it. A word that GitHub's renderer would turn into a link
/// by itself (`https://...`, `www....`, `name@host.tld`), which no escape
/// prevents, is written as a code span: shown, never followed.
fn inline(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut rest = text;
    let mut first = true;
    while !rest.is_empty() {
        let start = rest
            .char_indices()
            .filter(|(i, c)| {
                !c.is_whitespace() && (*i == 0 || rest[..*i].ends_with(char::is_whitespace))
            })
            .map(|(i, _)| i)
            .find(|&i| links_itself(word_at(rest, i)));
        let Some(start) = start else {
            out.push_str(&escape_text(rest, first));
            break;
        };
        out.push_str(&escape_text(&rest[..start], first));
        let word = word_at(rest, start);
        out.push_str(&code(word));
        rest = &rest[start + word.len()..];
        first = false;
    }
    out
}

/// The run of non-blank characters at `i`.
fn word_at(text: &str, i: usize) -> &str {
    let tail = &text[i..];
    &tail[..tail.find(char::is_whitespace).unwrap_or(tail.len())]
}

/// Whether a renderer with GitHub's autolinks would make `word` a link.
fn links_itself(word: &str) -> bool {
    // Anywhere in the word: GitHub links `(https://...` and `*www....` too.
    let lower = word.to_ascii_lowercase();
    ["http://", "https://", "ftp://", "www."]
        .iter()
        .any(|p| lower.contains(p))
        || word
            .split_once('@')
            .is_some_and(|(user, host)| !user.is_empty() && host.contains('.'))
}

/// `inline` without the autolinks; `at_start`: the text begins a line.
fn escape_text(text: &str, at_start: bool) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let flat: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    // At the start of a line's text (a list item's, a paragraph's), these
    // would open a heading, a nested list or an ordered list.
    let chars: Vec<char> = flat.chars().collect();
    // Indented by up to three spaces, these still open a block.
    let lead = if at_start {
        chars
            .iter()
            .take_while(|c| **c == ' ' || **c == '\t')
            .count()
    } else {
        usize::MAX
    };
    let digits = chars
        .get(lead..)
        .unwrap_or_default()
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    let word = |i: Option<usize>| {
        i.and_then(|i| chars.get(i))
            .is_some_and(|c| c.is_alphanumeric())
    };
    for (i, &ch) in chars.iter().enumerate() {
        match ch {
            // Inside a word (`timed_out`, `node_1`) an underscore is text
            // in CommonMark, and stays readable.
            '_' if word(i.checked_sub(1)) && word(Some(i + 1)) => out.push(ch),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\\' | '`' | '*' | '_' | '[' | ']' | '~' | '|' | '!' => {
                out.push('\\');
                out.push(ch);
            }
            '#' | '+' | '-' | '=' if i == lead => {
                out.push('\\');
                out.push(ch);
            }
            '.' | ')' if at_start && i == lead + digits && digits > 0 => {
                out.push('\\');
                out.push(ch);
            }
            c => out.push(c),
        }
    }
    out
}

/// Prose that quotes commands in single backticks (hints, messages): each
/// quoted part as a code span, the rest as text. Unbalanced backticks are
/// text too.
fn prose(text: &str) -> String {
    let parts: Vec<&str> = text.split('`').collect();
    if parts.len().is_multiple_of(2) {
        return inline(text);
    }
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| match (i % 2, part.is_empty()) {
            (0, _) => inline(part),
            (_, true) => String::new(),
            _ => code(part),
        })
        .collect()
}

/// A code span that shows `text` as it is: fenced by more backticks than
/// any run inside it (CommonMark), padded where it starts or ends with one.
/// A renderer shows a code span's content literally, markup and all.
fn code(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    let longest = flat.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if flat.starts_with('`') || flat.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{flat}{pad}{fence}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_become_text_that_nothing_in_them_can_escape() {
        assert_eq!(
            inline(r"<script>alert(1)</script> & \[x\](http://e) ![i](u)"),
            r"&lt;script&gt;alert(1)&lt;/script&gt; &amp; `\[x\](http://e)` \!\[i\](u)"
        );
        assert_eq!(inline("# h"), r"\# h");
        assert_eq!(inline("12. x"), r"12\. x");
        assert_eq!(inline("  # h"), r"  \# h");
        assert_eq!(inline(" 3) x"), r" 3\) x");
        assert_eq!(
            inline("see https://e.invalid/x and www.e.invalid or a@b.invalid now"),
            "see `https://e.invalid/x` and `www.e.invalid` or `a@b.invalid` now"
        );
        assert_eq!(inline("a-b 1.5"), "a-b 1.5");
        assert_eq!(inline("timed_out _x_"), r"timed_out \_x\_");
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("`x"), "`` `x ``");
        assert_eq!(code("<b>"), "`<b>`");
        assert_eq!(prose("run `kill 1` now"), "run `kill 1` now");
        assert_eq!(prose("odd ` tick"), r"odd \` tick");
        assert_eq!(cell_code("a|b"), r"`a\|b`");
    }
}
