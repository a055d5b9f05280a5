//! Checklists: YAML files of declarative checks, the shipped ones embedded in
//! the binary and the operator's added with `--checks`.

mod error;
mod evaluate;
pub mod explain;
mod hash;
mod hint;
pub mod kept;
mod load;
#[cfg(any(test, feature = "fuzzing"))]
pub mod reemit;
pub mod shared;
pub mod when;

use std::sync::Arc;
use std::time::Duration;

pub use error::{ChecklistError, ChecklistErrors};
pub use evaluate::{Evaluator, complete, complete_all, evaluate_cluster, evaluate_collective};
pub use hash::checklist_hash;
pub use hint::Hint;
/// Every key a check may have (the man page documents each).
pub use load::COMMON_KEYS;
pub use load::{load_file, load_text};

use preflight_kinds::{KindInfo, Probe};
use preflight_result::Severity;
use when::When;

pub use preflight_kinds::Scope;

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// One check, ready to run.
pub struct Check {
    pub id: String,
    pub kind: &'static KindInfo,
    pub probe: Arc<dyn Probe>,
    pub severity: Severity,
    pub scope: Scope,
    pub timeout: Duration,
    pub tags: Vec<String>,
    pub area: String,
    pub when: When,
    pub description: Option<String>,
    pub hint: Option<Hint>,
    /// Runs only when `--only` names it (its id or one of its tags): for
    /// checks too slow or intrusive for every health check.
    pub opt_in: bool,
    /// `cache: DURATION`: a pass is kept that long and reused while the
    /// node and the check are unchanged (`kept`).
    pub cache: Option<Duration>,
    /// `file:line:column` of the check's first key.
    pub source: String,
}

impl Check {
    /// Whether `--only`/`--skip` selector names this check.
    pub fn selected_by(&self, selector: &str) -> bool {
        self.id == selector || self.tags.iter().any(|t| t == selector)
    }
}

/// A checklist file's source text and the name errors should show.
pub struct SourceFile {
    pub name: String,
    pub text: String,
}

/// The checklists shipped in `checks/`, embedded at build time.
pub fn shipped() -> Vec<SourceFile> {
    const FILES: &[(&str, &str)] = &include!(concat!(env!("OUT_DIR"), "/shipped_checks.rs"));
    FILES
        .iter()
        .map(|(name, text)| SourceFile {
            name: (*name).to_string(),
            text: (*text).to_string(),
        })
        .collect()
}

/// The checks that will run: the shipped ones, each replaced by an added
/// check with the same id, followed by the added ones that are new.
pub fn assemble(shipped: Vec<Check>, added: Vec<Check>) -> Result<Vec<Check>, ChecklistErrors> {
    let mut errors = Vec::new();
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut checks = shipped;
    for check in added {
        if let Some(first) = seen.get(&check.id) {
            errors.push(ChecklistError::duplicate(&check.source, &check.id, first));
            continue;
        }
        seen.insert(check.id.clone(), check.source.clone());
        match checks.iter().position(|c| c.id == check.id) {
            Some(i) => checks[i] = check,
            None => checks.push(check),
        }
    }
    if errors.is_empty() {
        Ok(checks)
    } else {
        Err(ChecklistErrors(errors))
    }
}

/// Placeholders every hint may use.
pub fn hint_vars() -> &'static [&'static str] {
    hint::COMMON_VARS
}

#[cfg(test)]
mod tests {
    use super::*;
    use preflight_facts::Facts;
    use preflight_result::Finding;

    #[test]
    fn shipped_checks_load_and_explain_themselves() {
        let mut ids = std::collections::HashSet::new();
        for source in shipped() {
            let checks = load_text(&source.name, &source.text).unwrap_or_else(|e| panic!("{e}"));
            for check in checks {
                assert!(ids.insert(check.id.clone()), "{} defined twice", check.id);
                assert!(
                    check.description.is_some(),
                    "{} ({}) has no description",
                    check.id,
                    check.source
                );
                assert!(
                    check.hint.is_some(),
                    "{} ({}) has no hint",
                    check.id,
                    check.source
                );
            }
        }
        assert!(!ids.is_empty());
    }

    /// Every shipped hint, rendered as a probe that could not tell would
    /// fill it (nothing set, or `unknown`/`none` for every value), says
    /// neither word unless its own text does, and never `(unknown)`.
    #[test]
    fn no_shipped_hint_ever_says_unknown_or_none() {
        let words = |t: &str, w: &str| {
            t.to_lowercase()
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|x| *x == w)
                .count()
        };
        let facts = Facts::new("/".into(), Default::default(), vec![]);
        let mut rendered = 0;
        for source in shipped() {
            for check in load_text(&source.name, &source.text).unwrap() {
                let Some(hint) = &check.hint else { continue };
                let vars: Vec<&'static str> = check.kind.hint_vars.to_vec();
                let with = |value: Option<&str>| {
                    let mut f = Finding::fail("m");
                    if let Some(v) = value {
                        f = f.measured(v).expected(v);
                        for name in &vars {
                            f = f.var(name, v);
                        }
                    }
                    hint.render(&check.id, &f, &facts)
                };
                for value in [
                    None,
                    Some("unknown"),
                    Some("none"),
                    Some("(unknown)"),
                    Some(""),
                ] {
                    let text = with(value);
                    for w in ["unknown", "none"] {
                        assert!(
                            words(&text, w) <= words(&hint.template, w),
                            "{} ({}) with {value:?} says `{w}`: {text}",
                            check.id,
                            check.source
                        );
                    }
                    assert!(!text.contains("(unknown)"), "{}: {text}", check.id);
                }
                // And the values do reach the operator when known.
                if hint.template.contains('{') && !hint.template.contains("{{") {
                    let text = with(Some("VALUE-X"));
                    let uses_env = hint.template.contains("{env.")
                        || hint.template.contains("{host}")
                        || hint.template.contains("{id}");
                    assert!(text.contains("VALUE-X") || uses_env, "{}: {text}", check.id);
                }
                rendered += 1;
            }
        }
        assert!(rendered >= 40, "only {rendered} hints");
    }
}
