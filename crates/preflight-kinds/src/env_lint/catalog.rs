//! The shipped catalog of variables env_lint knows (catalog.yaml): names
//! by documentation source, allowed values, integer-valued names and
//! deprecated names.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

use preflight_ground::yaml;

const TEXT: &str = include_str!("catalog.yaml");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    pub id: String,
    pub doc: String,
    pub names: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValueRule {
    pub one_of: Vec<String>,
    /// Comma-separated list of allowed values.
    #[serde(default)]
    pub list: bool,
    /// A leading `^` (exclude these) is allowed.
    #[serde(default)]
    pub negate: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    pub sources: Vec<Source>,
    #[serde(default)]
    pub values: BTreeMap<String, ValueRule>,
    #[serde(default)]
    pub integers: Vec<String>,
    #[serde(default)]
    pub deprecated: BTreeMap<String, String>,
}

impl Catalog {
    /// The embedded catalog, parsed once.
    pub fn get() -> Result<&'static Catalog, String> {
        static CATALOG: OnceLock<Result<Catalog, String>> = OnceLock::new();
        CATALOG
            .get_or_init(|| {
                let node = yaml::parse_document(TEXT).map_err(|e| e.message.clone())?;
                yaml::from_node::<Catalog>(&node)
                    .map_err(|e| format!("env_lint catalog: {} at {}", e.message, e.path()))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Where a known variable is documented.
    pub fn source_of(&self, name: &str) -> Option<&Source> {
        self.sources
            .iter()
            .find(|s| s.names.iter().any(|n| n == name))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.sources
            .iter()
            .flat_map(|s| s.names.iter().map(String::as_str))
    }
}

/// Checks a value against its allowed set: `Err` names the bad part.
pub fn check_value(name: &str, value: &str, rule: &ValueRule) -> Result<(), String> {
    let mut rest = value.trim();
    if rule.negate {
        rest = rest.strip_prefix('^').unwrap_or(rest);
    }
    let parts: Vec<&str> = if rule.list {
        rest.split(',').map(str::trim).collect()
    } else {
        vec![rest]
    };
    for part in parts {
        // NCCL_ALGO and NCCL_PROTO also take `collective:values;...`.
        let values: Vec<&str> = if rule.list && part.contains(':') {
            part.split(';')
                .filter_map(|p| p.split_once(':').map(|(_, v)| v))
                .flat_map(|v| v.split(','))
                .map(|v| v.trim().trim_start_matches('^'))
                .collect()
        } else {
            vec![part]
        };
        for v in values {
            if !rule.one_of.iter().any(|o| o.eq_ignore_ascii_case(v)) {
                return Err(format!(
                    "{name}=`{value}`: `{v}` is not one of {}",
                    rule.one_of.join(", ")
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_parses_and_is_consistent() {
        let c = Catalog::get().unwrap();
        assert!(c.names().count() > 300);
        for name in c.values.keys().chain(&c.integers) {
            assert!(
                c.source_of(name).is_some(),
                "{name} has a rule but no source"
            );
        }
        for (old, new) in &c.deprecated {
            assert!(c.source_of(old).is_none(), "{old} is deprecated and listed");
            assert!(
                c.source_of(new).is_some(),
                "{new} replaces {old} but is unlisted"
            );
        }
    }
}
