//! `kernel_param`: a value under /proc/sys compared with an expectation.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{IfMissing, KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params};
use preflight_facts::Facts;
use preflight_ground::values::Pattern;
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "kernel_param",
    scope: crate::Scope::Node,
    area: "kernel",
    summary: "A kernel parameter under /proc/sys (sysctl) has the expected value.",
    params: &[
        ParamDoc {
            name: "name",
            ty: "string",
            default: None,
            doc: "The sysctl name (net.core.somaxconn) or a path under /proc/sys.",
        },
        ParamDoc {
            name: "equals",
            ty: "string",
            default: Some("unset"),
            doc: "The value must equal this (whitespace between fields is normalised to one space).",
        },
        ParamDoc {
            name: "one_of",
            ty: "list of strings",
            default: Some("unset"),
            doc: "The value must be one of these.",
        },
        ParamDoc {
            name: "min",
            ty: "integer",
            default: Some("unset"),
            doc: "The value, a single integer, must be at least this.",
        },
        ParamDoc {
            name: "max",
            ty: "integer",
            default: Some("unset"),
            doc: "The value, a single integer, must be at most this.",
        },
        ParamDoc {
            name: "matches",
            ty: "regex",
            default: Some("unset"),
            doc: "The value must match this regular expression.",
        },
        ParamDoc {
            name: "if_missing",
            ty: "error|fail|skip",
            default: Some("error"),
            doc: "What to report when the parameter does not exist on this kernel.",
        },
    ],
    hint_vars: &["value", "name"],
    parse: parse_params::<KernelParam>,
};

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KernelParam {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    equals: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    one_of: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    matches: Option<Pattern>,
    #[serde(default)]
    if_missing: IfMissing,
}

impl Params for KernelParam {
    fn validate(&self) -> Result<(), String> {
        let given = [
            self.equals.is_some(),
            self.one_of.is_some(),
            self.min.is_some(),
            self.max.is_some(),
            self.matches.is_some(),
        ];
        if !given.contains(&true) {
            return Err(format!(
                "kernel_param `{}` needs an expectation: one of equals, one_of, min, max, matches",
                self.name
            ));
        }
        if let (Some(min), Some(max)) = (self.min, self.max)
            && min > max
        {
            return Err(format!("`min` ({min}) is greater than `max` ({max})"));
        }
        Ok(())
    }
}

impl KernelParam {
    fn path(&self) -> String {
        if self.name.starts_with('/') {
            self.name.clone()
        } else {
            format!("/proc/sys/{}", self.name.replace('.', "/"))
        }
    }

    fn expectation(&self) -> String {
        let mut parts = Vec::new();
        if let Some(v) = &self.equals {
            parts.push(format!("= {v}"));
        }
        if let Some(v) = &self.one_of {
            parts.push(format!("one of {}", v.join(", ")));
        }
        if let Some(v) = self.min {
            parts.push(format!(">= {v}"));
        }
        if let Some(v) = self.max {
            parts.push(format!("<= {v}"));
        }
        if let Some(p) = &self.matches {
            parts.push(format!("matching /{}/", p.as_str()));
        }
        parts.join(" and ")
    }

    fn check(&self, facts: &Facts) -> Finding {
        let path = self.path();
        let text = match std::fs::read_to_string(facts.host_path(&path)) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return self.if_missing.finding(format!(
                    "{} does not exist on this kernel ({path})",
                    self.name
                ));
            }
            Err(e) if super::is_denied(&e) => {
                return super::needs_privilege(&format!("reading {path}"), "root");
            }
            Err(e) => return Finding::error(format!("cannot read {path}: {e}")),
        };
        let value = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let expected = self.expectation();
        let base = |f: Finding| {
            f.measured(value.clone())
                .expected(expected.clone())
                .var("value", value.clone())
                .var("name", self.name.clone())
        };
        if let Some(want) = &self.equals
            && &value != want
        {
            return base(Finding::fail(format!(
                "{} is {value}, expected {want}",
                self.name
            )));
        }
        if let Some(options) = &self.one_of
            && !options.contains(&value)
        {
            return base(Finding::fail(format!(
                "{} is {value}, expected one of {}",
                self.name,
                options.join(", ")
            )));
        }
        if self.min.is_some() || self.max.is_some() {
            let Ok(number) = value.parse::<i64>() else {
                return base(Finding::error(format!(
                    "{} is `{value}`, not a single integer",
                    self.name
                )));
            };
            if let Some(min) = self.min.filter(|&m| number < m) {
                return base(Finding::fail(format!(
                    "{} is {number}, below the minimum {min}",
                    self.name
                )));
            }
            if let Some(max) = self.max.filter(|&m| number > m) {
                return base(Finding::fail(format!(
                    "{} is {number}, above the maximum {max}",
                    self.name
                )));
            }
        }
        if let Some(p) = &self.matches
            && !p.is_match(&value)
        {
            return base(Finding::fail(format!(
                "{} is `{value}`, not matching /{}/",
                self.name,
                p.as_str()
            )));
        }
        base(Finding::pass(format!("{} = {value}", self.name)))
    }
}

impl Probe for KernelParam {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}
