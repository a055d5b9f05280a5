//! `env`: an environment variable is set (or unset) and matches a pattern.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params, redact};
use preflight_facts::Facts;
use preflight_ground::values::Pattern;
use preflight_result::{Finding, Status};

pub const KIND: KindInfo = KindInfo {
    name: "env",
    scope: crate::Scope::Rank,
    area: "environment",
    summary: "An environment variable of the job is set, or unset, and its value matches a pattern.",
    params: &[
        ParamDoc {
            name: "name",
            ty: "string",
            default: None,
            doc: "The variable's name.",
        },
        ParamDoc {
            name: "set",
            ty: "bool",
            default: Some("true"),
            doc: "Whether the variable must be set (true) or must be absent (false). An empty value counts as set.",
        },
        ParamDoc {
            name: "matches",
            ty: "regex",
            default: Some("(any value)"),
            doc: "When set, the value must match this regular expression (unanchored: use ^...$ for the whole value).",
        },
    ],
    hint_vars: &["value"],
    parse: parse_params::<EnvCheck>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvCheck {
    name: String,
    #[serde(default = "yes")]
    set: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    matches: Option<Pattern>,
}

fn yes() -> bool {
    true
}

impl Params for EnvCheck {
    fn validate(&self) -> Result<(), String> {
        if !self.set && self.matches.is_some() {
            return Err(
                "`matches` needs `set: true`: an absent variable has no value to match".into(),
            );
        }
        Ok(())
    }
}

impl EnvCheck {
    fn check(&self, facts: &Facts) -> Finding {
        let value = facts.env(&self.name);
        let shown = value.map(|v| redact(&self.name, v));
        let finding = match (value, self.set) {
            (None, true) => Finding::fail(format!("{} is not set", self.name))
                .measured("unset")
                .expected(self.matches.as_ref().map_or("set".to_string(), |p| {
                    format!("set, matching /{}/", p.as_str())
                })),
            (Some(_), false) => Finding::fail(format!(
                "{} is set to `{}`",
                self.name,
                shown.clone().unwrap_or_default()
            ))
            .expected("unset"),
            (None, false) => Finding::pass(format!("{} is not set", self.name)).measured("unset"),
            (Some(v), true) => match &self.matches {
                Some(p) if !p.is_match(v) => Finding::fail(format!(
                    "{}=`{}` does not match /{}/",
                    self.name,
                    shown.clone().unwrap_or_default(),
                    p.as_str()
                ))
                .expected(format!("matching /{}/", p.as_str())),
                _ => Finding::pass(format!(
                    "{}=`{}`",
                    self.name,
                    shown.clone().unwrap_or_default()
                )),
            },
        };
        let finding = match &shown {
            Some(v) if finding.measured.is_none() => finding.measured(v.clone()),
            _ => finding,
        };
        let finding = match finding.status {
            Status::Pass => finding,
            _ => finding.about_variables([self.name.clone()]),
        };
        finding.var("value", shown.unwrap_or_else(|| "unset".into()))
    }
}

impl Probe for EnvCheck {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move { self.check(&facts) })
    }
}
