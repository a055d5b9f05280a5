//! Hints: what to do on failure, with `{placeholders}` filled from the
//! finding. Placeholders are checked when the checklist loads, so a typo in
//! a hint is an error with a location, not a blank in a 3 a.m. report.

use crate::facts::Facts;
use crate::result::Finding;

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

    pub fn render(&self, id: &str, finding: &Finding, facts: &Facts) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
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
                    out.push_str(value.as_deref().unwrap_or("(unknown)"));
                }
            }
        }
        out
    }
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

    #[test]
    fn unknown_placeholder_is_an_error() {
        let e = Hint::parse("see {mesured}", &[]).unwrap_err();
        assert!(e.contains("unknown placeholder `{mesured}`"), "{e}");
        assert!(e.contains("{measured}"));
    }
}
