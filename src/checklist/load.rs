//! Turning a checklist file into checks, collecting every error with its
//! location instead of stopping at the first.

use std::path::Path;

use super::error::{ChecklistError, ChecklistErrors};
use super::hint::Hint;
use super::when::When;
use super::{Check, DEFAULT_TIMEOUT, Scope};
use crate::kinds::{self, KindInfo};
use crate::result::Severity;
use crate::suggest::did_you_mean;
use crate::values::Span;
use crate::yaml::{self, Location, Node, Segment, YamlError};

/// Keys every check may have; the rest belong to its kind.
pub const COMMON_KEYS: &[&str] = &[
    "id",
    "kind",
    "severity",
    "scope",
    "timeout",
    "tags",
    "area",
    "when",
    "description",
    "hint",
    "opt_in",
];

pub fn load_file(path: &Path) -> Result<Vec<Check>, ChecklistErrors> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ChecklistErrors(vec![ChecklistError::unreadable(&name, e)]))?;
    load_text(&name, &text)
}

pub fn load_text(file: &str, text: &str) -> Result<Vec<Check>, ChecklistErrors> {
    let fail = |e: YamlError| ChecklistErrors(vec![ChecklistError::from_yaml(file, e)]);
    let root = yaml::parse_document(text).map_err(fail)?;
    let list = top_level(&root).map_err(fail)?;
    let mut checks: Vec<Check> = Vec::new();
    let mut errors = Vec::new();
    for (index, node) in list.iter().enumerate() {
        match parse_check(file, node) {
            Ok(check) => {
                if let Some(first) = checks.iter().find(|c| c.id == check.id) {
                    errors.push(ChecklistError::duplicate(
                        &check.source,
                        &check.id,
                        &first.source,
                    ));
                } else {
                    checks.push(check);
                }
            }
            Err(e) => errors.push(ChecklistError::from_yaml(
                file,
                e.under(Segment::Index(index))
                    .under(Segment::Key("checks".into())),
            )),
        }
    }
    if errors.is_empty() {
        Ok(checks)
    } else {
        Err(ChecklistErrors(errors))
    }
}

/// The `checks:` list; an empty file holds no checks.
fn top_level(root: &Node) -> Result<Vec<&Node>, YamlError> {
    if yaml::type_name(root) == "null" {
        return Ok(Vec::new());
    }
    let entries = yaml::mapping_entries(root).ok_or_else(|| {
        YamlError::at(
            format!(
                "a checklist is a mapping with a `checks:` list, found a {}",
                yaml::type_name(root)
            ),
            root,
        )
    })?;
    let mut list = None;
    for (key, value) in entries {
        match yaml::scalar_text(key).as_deref() {
            Some("checks") => list = Some(value),
            other => {
                return Err(YamlError::at(
                    format!(
                        "unknown key `{}` at the top level; valid keys: checks",
                        other.unwrap_or("?")
                    ),
                    key,
                ));
            }
        }
    }
    let Some(list) = list else {
        return Err(YamlError::at("missing the `checks:` list", root));
    };
    match yaml::data(list) {
        saphyr::YamlDataOwned::Sequence(items) => Ok(items.iter().collect()),
        saphyr::YamlDataOwned::Value(saphyr::ScalarOwned::Null) => Ok(Vec::new()),
        _ => Err(YamlError::at(
            format!(
                "`checks` must be a list of checks, found a {}",
                yaml::type_name(list)
            ),
            list,
        )
        .under(Segment::Key("checks".into()))),
    }
}

fn field<'a, T: serde::Deserialize<'a>>(name: &str, node: &'a Node) -> Result<T, YamlError> {
    yaml::from_node(node).map_err(|e| e.under(Segment::Key(name.to_string())))
}

fn parse_check(file: &str, node: &Node) -> Result<Check, YamlError> {
    let entries = yaml::mapping_entries(node).ok_or_else(|| {
        YamlError::at(
            format!("a check is a mapping, found a {}", yaml::type_name(node)),
            node,
        )
    })?;
    let location = Location::of(node);
    let mut id: Option<(String, &Node)> = None;
    let mut kind: Option<&'static KindInfo> = None;
    let mut severity = Severity::default();
    let mut scope: Option<(Scope, &Node)> = None;
    let mut timeout = DEFAULT_TIMEOUT;
    let mut tags = Vec::new();
    let mut area = None;
    let mut when = When::default();
    let mut description = None;
    let mut hint_node = None;
    let mut opt_in = false;
    let mut params = Vec::new();

    for (key, value) in entries.iter().copied() {
        let name = yaml::scalar_text(key).unwrap_or_default();
        match name.as_str() {
            "id" => {
                let text: String = field("id", value)?;
                validate_id(&text)
                    .map_err(|m| YamlError::at(m, value).under(Segment::Key("id".into())))?;
                id = Some((text, value));
            }
            "kind" => {
                let text: String = field("kind", value)?;
                kind = Some(kinds::lookup(&text).ok_or_else(|| {
                    YamlError::at(unknown_kind_message(&text), value)
                        .under(Segment::Key("kind".into()))
                })?);
            }
            "severity" => severity = field("severity", value)?,
            "scope" => scope = Some((field("scope", value)?, value)),
            "timeout" => {
                timeout = field::<Span>("timeout", value)?.0;
                if timeout.is_zero() {
                    return Err(
                        YamlError::at("a check's timeout must be longer than zero", value)
                            .under(Segment::Key("timeout".into())),
                    );
                }
            }
            "tags" => tags = field("tags", value)?,
            "area" => area = Some(field::<String>("area", value)?),
            "when" => when = field("when", value)?,
            "description" => description = Some(field::<String>("description", value)?),
            "hint" => hint_node = Some(value),
            "opt_in" => opt_in = field("opt_in", value)?,
            "<<" => {
                return Err(YamlError::at(
                    "YAML merge keys (`<<`) are not supported: write the keys out",
                    key,
                ));
            }
            _ => params.push((key, value)),
        }
    }

    let Some((id, _)) = id else {
        return Err(YamlError::at("missing key `id`", node));
    };
    let Some(kind) = kind else {
        return Err(YamlError::at(
            format!(
                "check `{id}` is missing key `kind`; valid kinds: {}",
                kinds::names().join(", ")
            ),
            node,
        ));
    };
    let hint = match hint_node {
        Some(value) => {
            let text: String = field("hint", value)?;
            Some(
                Hint::parse(&text, kind.hint_vars)
                    .map_err(|m| YamlError::at(m, value).under(Segment::Key("hint".into())))?,
            )
        }
        None => None,
    };
    let probe = (kind.parse)(node, params).map_err(|e| explain_unknown_key(e, kind))?;
    let kind_scope = if probe.cluster().is_some() {
        Scope::Cluster
    } else {
        Scope::Node
    };
    if let Some((said, value)) = scope
        && said != kind_scope
    {
        let message = match said {
            Scope::Cluster => format!(
                "`scope: cluster` needs a cluster kind (cluster_versions, cluster_env, ...); `{}` is evaluated on each node",
                kind.name
            ),
            Scope::Node => format!(
                "kind `{}` compares nodes with each other: its scope is cluster",
                kind.name
            ),
        };
        return Err(YamlError::at(message, value).under(Segment::Key("scope".into())));
    }
    let scope = kind_scope;
    Ok(Check {
        id,
        kind,
        probe,
        severity,
        scope,
        timeout,
        tags,
        area: area.unwrap_or_else(|| kind.area.to_string()),
        when,
        description,
        hint,
        opt_in,
        source: format!("{file}:{}:{}", location.line, location.column),
    })
}

fn validate_id(id: &str) -> Result<(), String> {
    let ok = id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid id `{id}`: use letters, digits and . _ : - (starting with a letter or digit)"
        ))
    }
}

fn unknown_kind_message(name: &str) -> String {
    let names = kinds::names();
    let mut message = format!("unknown kind `{name}`");
    if let Some(s) = did_you_mean(name, names.iter().copied()) {
        message.push_str(&format!(" (did you mean `{s}`?)"));
    }
    message.push_str(&format!("; valid kinds: {}", names.join(", ")));
    message
}

/// Serde says "unknown field `x`, expected one of ..." about the kind's
/// parameters only, and "missing field"; operators need the whole picture
/// in the words of the checklist format.
fn explain_unknown_key(error: YamlError, kind: &KindInfo) -> YamlError {
    if let Some(rest) = error.message.strip_prefix("missing field `") {
        let key = rest.split('`').next().unwrap_or_default();
        let message = format!("missing key `{key}`, required by kind `{}`", kind.name);
        return error.with_message(message);
    }
    let Some(rest) = error.message.strip_prefix("unknown field `") else {
        return error;
    };
    let key = rest.split('`').next().unwrap_or_default().to_string();
    let params: Vec<&str> = kind.params.iter().map(|p| p.name).collect();
    let mut message = format!("unknown key `{key}` for kind `{}`", kind.name);
    if let Some(s) = did_you_mean(&key, params.iter().chain(COMMON_KEYS).copied()) {
        message.push_str(&format!(" (did you mean `{s}`?)"));
    }
    message.push_str(&format!(
        "; `{}` takes: {}; every check takes: {}",
        kind.name,
        params.join(", "),
        COMMON_KEYS.join(", ")
    ));
    error.with_message(message)
}
