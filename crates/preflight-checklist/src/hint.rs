//! Hints: what to do on failure, with `{placeholders}` filled from the
//! finding. Placeholders are checked when the checklist loads, so a typo in
//! a hint is an error with a location, not a blank in a 3 a.m. report.

use preflight_facts::Facts;
use preflight_result::Finding;

/// Placeholders every hint may use, besides the kind's own and `{env.NAME}`.
pub const COMMON_VARS: &[&str] = &["measured", "expected", "id", "host"];

#[derive(Debug, Clone)]
enum Piece {
    Text(String),
    Var(String),
}

#[derive(Debug, Clone)]
pub struct Hint {
    /// The text as written, for `explain`.
    pub template: String,
    pieces: Vec<Piece>,
}

impl Hint {
    pub fn parse(template: &str, kind_vars: &[&str]) -> Result<Hint, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = template.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    let known = COMMON_VARS.contains(&name.as_str())
                        || kind_vars.contains(&name.as_str())
                        || name.strip_prefix("env.").is_some_and(|v| !v.is_empty());
                    if !known {
                        let mut valid: Vec<&str> = COMMON_VARS.to_vec();
                        valid.extend_from_slice(kind_vars);
                        valid.push("env.NAME");
                        return Err(format!(
                            "unknown placeholder `{{{name}}}` in hint; valid: {}",
                            valid
                                .iter()
                                .map(|v| format!("{{{v}}}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(Piece::Var(name));
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Hint {
            template: template.to_string(),
            pieces,
        })
    }

    /// The hint with its placeholders filled. A placeholder whose value is
    /// not known (unset, empty, or a word such as `unknown` or `none`
    /// that a probe uses for "could not tell") never reaches the
    /// operator: the parenthesis holding it, else the sentence holding
    /// it, is left out. Empty when nothing is left.
    pub fn render(&self, id: &str, finding: &Finding, facts: &Facts) -> String {
        let mut toks: Vec<Tok> = Vec::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => toks.extend(t.chars().map(Tok::Tpl)),
                Piece::Var(name) => {
                    let value = match name.as_str() {
                        "measured" => finding.measured.clone(),
                        "expected" => finding.expected.clone(),
                        "id" => Some(id.to_string()),
                        "host" => Some(facts.hostname().to_string()),
                        other => match other.strip_prefix("env.") {
                            Some(var) => facts.env(var).map(String::from),
                            None => finding
                                .vars
                                .iter()
                                .find(|(k, _)| *k == other)
                                .map(|(_, v)| v.clone()),
                        },
                    };
                    match value.filter(|v| known(v)) {
                        Some(v) => toks.extend(v.chars().map(Tok::Val)),
                        None => toks.push(Tok::Missing),
                    }
                }
            }
        }
        drop_unknowns(toks)
    }
}

/// A hint as characters: the template's (which carry its structure), a
/// value's (which never do), and a value that is not known.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Tok {
    Tpl(char),
    Val(char),
    Missing,
}

impl Tok {
    fn char(self) -> Option<char> {
        match self {
            Tok::Tpl(c) | Tok::Val(c) => Some(c),
            Tok::Missing => None,
        }
    }
}

/// Whether a value says something: probes write `unknown` or `none`
/// where they could not tell, and neither helps in a command to run.
fn known(v: &str) -> bool {
    let t = v.trim();
    !(t.is_empty()
        || ["unknown", "(unknown)", "none", "(none)", "n/a"]
            .iter()
            .any(|w| t.eq_ignore_ascii_case(w)))
}

/// Removes each innermost parenthesis that holds an unknown value, then
/// each sentence that still does; tidies the spaces left behind.
fn drop_unknowns(mut toks: Vec<Tok>) -> String {
    // Parentheses of the template, outside `code`, innermost first.
    loop {
        let mut code = false;
        let mut open: Vec<usize> = Vec::new();
        let mut cut: Option<(usize, usize)> = None;
        for (i, t) in toks.iter().enumerate() {
            match t {
                Tok::Tpl('`') => code = !code,
                Tok::Tpl('(') if !code => open.push(i),
                Tok::Tpl(')') if !code => {
                    if let Some(o) = open.pop()
                        && toks[o..i].contains(&Tok::Missing)
                    {
                        cut = Some((o, i));
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some((o, c)) = cut else { break };
        let from = if o > 0 && toks[o - 1] == Tok::Tpl(' ') {
            o - 1
        } else {
            o
        };
        toks.drain(from..=c);
    }
    // Sentences: up to `.`, `;`, `!` or `?` and the space after, outside
    // `code`.
    let mut sentences: Vec<Vec<Tok>> = vec![Vec::new()];
    let mut code = false;
    for (i, t) in toks.iter().enumerate() {
        sentences.last_mut().unwrap().push(*t);
        match t {
            Tok::Tpl('`') => code = !code,
            Tok::Tpl('.' | ';' | '!' | '?') if !code => {
                let ends = toks
                    .get(i + 1)
                    .is_none_or(|n| matches!(n, Tok::Tpl(c) if c.is_whitespace()));
                if ends {
                    sentences.push(Vec::new());
                }
            }
            _ => {}
        }
    }
    let kept: String = sentences
        .into_iter()
        .filter(|s| !s.contains(&Tok::Missing))
        .flat_map(|s| s.into_iter().filter_map(Tok::char))
        .collect();
    let mut out = kept.split_whitespace().collect::<Vec<_>>().join(" ");
    for (from, to) in [(" .", "."), (" ,", ","), (" ;", ";"), ("( ", "(")] {
        out = out.replace(from, to);
    }
    // A clause left last ends the hint as a sentence does.
    if out.ends_with([';', ',', ':']) {
        out.pop();
        out.push('.');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_placeholders_and_escapes() {
        let facts = Facts::new(
            "/".into(),
            [("X".to_string(), "1".to_string())].into(),
            vec![],
        );
        let hint = Hint::parse(
            "got {measured}, want {expected}; X={env.X} {{literal}} {exit_code}",
            &["exit_code"],
        )
        .unwrap();
        let finding = Finding::fail("m")
            .measured("a")
            .expected("b")
            .var("exit_code", "3");
        assert_eq!(
            hint.render("c", &finding, &facts),
            "got a, want b; X=1 {literal} 3"
        );
    }

    fn render(template: &str, finding: &Finding) -> String {
        let facts = Facts::new("/".into(), Default::default(), vec![]);
        Hint::parse(template, &["iface", "suggestion", "pid"])
            .unwrap()
            .render("c", finding, &facts)
    }

    #[test]
    fn an_unknown_value_takes_its_parenthesis_or_its_sentence_with_it() {
        let f = Finding::fail("m")
            .var("iface", "unknown")
            .var("pid", "none");
        assert_eq!(
            render(
                "Set NCCL_SOCKET_IFNAME={iface}, or bring it up (`ip link set {iface} up`). Check the route.",
                &f
            ),
            "Check the route."
        );
        assert_eq!(
            render(
                "Fix or unset X in the job script (suggested: {suggestion}).",
                &f
            ),
            "Fix or unset X in the job script."
        );
        assert_eq!(
            render("Kill the leftover (`kill {pid}`).", &f),
            "Kill the leftover."
        );
        assert_eq!(render("Use {iface}.", &f), "");
        assert_eq!(
            render("Start a time daemon (chronyd); running: {pid}.", &f),
            "Start a time daemon (chronyd)."
        );
        // Known values keep everything, and their own dots and brackets
        // are not the template's.
        let f = Finding::fail("m")
            .var("iface", "eth0 (v1.2)")
            .var("suggestion", "WARN");
        assert_eq!(
            render(
                "Set IFNAME={iface}; then retry (suggested: {suggestion}).",
                &f
            ),
            "Set IFNAME=eth0 (v1.2); then retry (suggested: WARN)."
        );
        // A dot inside `code` does not end a sentence.
        let f = Finding::fail("m");
        assert_eq!(
            render("Run `sysctl -w a.b=1`. Then {iface}.", &f),
            "Run `sysctl -w a.b=1`."
        );
    }

    #[test]
    fn unknown_placeholder_is_an_error() {
        let e = Hint::parse("see {mesured}", &[]).unwrap_err();
        assert!(e.contains("unknown placeholder `{mesured}`"), "{e}");
        assert!(e.contains("{measured}"));
    }
}
