//! Turning a checklist file into checks, collecting every error with its
//! location instead of stopping at the first.

use std::path::Path;

use super::error::{ChecklistError, ChecklistErrors};
use super::hint::Hint;
use super::when::When;
use super::{Check, DEFAULT_TIMEOUT, Scope};
use preflight_ground::suggest::did_you_mean;
use preflight_ground::values::Span;
use preflight_ground::yaml::{self, Location, Node, Segment, YamlError};
use preflight_kinds::{self as kinds, KindInfo};
use preflight_result::Severity;

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
    "cache",
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
            Err(all) => errors.extend(all.into_iter().map(|e| {
                ChecklistError::from_yaml(
                    file,
                    e.under(Segment::Index(index))
                        .under(Segment::Key("checks".into())),
                )
            })),
        }
    }
    if errors.is_empty() {
        Ok(checks)
    } else {
        // In the file's order, as an editor walks them.
        errors.sort_by_key(|e| e.location.map(|l| (l.line, l.column)));
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
                let other = other.unwrap_or("?");
                let guess = did_you_mean(other, ["checks"])
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                return Err(YamlError::at(
                    format!("unknown key `{other}` at the top level{guess}; valid keys: checks"),
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

/// One check, or every error in it: a checklist author fixes them in one
/// pass, not one per run. (A kind's own parameters stop at their first
/// error: serde reads them.)
fn parse_check(file: &str, node: &Node) -> Result<Check, Vec<YamlError>> {
    let entries = yaml::mapping_entries(node).ok_or_else(|| {
        vec![YamlError::at(
            format!("a check is a mapping, found a {}", yaml::type_name(node)),
            node,
        )]
    })?;
    let location = Location::of(node);
    let mut errors: Vec<YamlError> = Vec::new();
    let mut id: Option<(String, &Node)> = None;
    let mut kind: Option<&'static KindInfo> = None;
    let mut severity = Severity::default();
    let mut scope: Option<(Scope, &Node)> = None;
    let mut timeout = None;
    let mut tags = Vec::new();
    let mut area = None;
    let mut when = When::default();
    let mut description = None;
    let mut hint_node = None;
    let mut opt_in = false;
    let mut cache = None;
    let mut params = Vec::new();
    // The value, or the error kept for the report.
    fn ok<T>(errors: &mut Vec<YamlError>, r: Result<T, YamlError>) -> Option<T> {
        r.map_err(|e| errors.push(e)).ok()
    }

    for (key, value) in entries.iter().copied() {
        let name = yaml::scalar_text(key).unwrap_or_default();
        match name.as_str() {
            "id" => {
                let text = ok(&mut errors, field::<String>("id", value));
                if let Some(text) = text {
                    match validate_id(&text) {
                        Ok(()) => id = Some((text, value)),
                        Err(m) => {
                            errors.push(YamlError::at(m, value).under(Segment::Key("id".into())))
                        }
                    }
                }
            }
            "kind" => {
                if let Some(text) = ok(&mut errors, field::<String>("kind", value)) {
                    kind = ok(
                        &mut errors,
                        kinds::lookup(&text).ok_or_else(|| {
                            YamlError::at(unknown_kind_message(&text), value)
                                .under(Segment::Key("kind".into()))
                        }),
                    );
                }
            }
            "severity" => severity = ok(&mut errors, field("severity", value)).unwrap_or_default(),
            "scope" => {
                scope = ok(&mut errors, field("scope", value)).map(|s| (s, value));
            }
            "timeout" => {
                if let Some(span) = ok(&mut errors, field::<Span>("timeout", value)) {
                    if span.0.is_zero() {
                        errors.push(
                            YamlError::at("a check's timeout must be longer than zero", value)
                                .under(Segment::Key("timeout".into())),
                        );
                    } else {
                        timeout = Some(span.0);
                    }
                }
            }
            "tags" => tags = ok(&mut errors, field("tags", value)).unwrap_or_default(),
            "area" => area = ok(&mut errors, field::<String>("area", value)),
            "when" => when = ok(&mut errors, field("when", value)).unwrap_or_default(),
            "description" => description = ok(&mut errors, field::<String>("description", value)),
            "hint" => hint_node = Some(value),
            "opt_in" => opt_in = ok(&mut errors, field("opt_in", value)).unwrap_or_default(),
            "cache" => {
                if let Some(span) = ok(&mut errors, field::<Span>("cache", value)) {
                    if span.0.is_zero() {
                        errors.push(
                            YamlError::at(
                                "a check's cache must be longer than zero (leave it out to keep nothing)",
                                value,
                            )
                            .under(Segment::Key("cache".into())),
                        );
                    } else {
                        cache = Some(span.0);
                    }
                }
            }
            "<<" => errors.push(YamlError::at(
                "YAML merge keys (`<<`) are not supported: write the keys out",
                key,
            )),
            _ => params.push((key, value)),
        }
    }

    let has_id = entries
        .iter()
        .any(|(k, _)| yaml::scalar_text(k).as_deref() == Some("id"));
    let has_kind = entries
        .iter()
        .any(|(k, _)| yaml::scalar_text(k).as_deref() == Some("kind"));
    if !has_id {
        errors.push(YamlError::at("missing key `id`", node));
    }
    if !has_kind {
        let who = id
            .as_ref()
            .map_or("the check".to_string(), |(id, _)| format!("check `{id}`"));
        errors.push(YamlError::at(
            format!(
                "{who} is missing key `kind`; valid kinds: {}",
                kinds::names().join(", ")
            ),
            node,
        ));
    }
    let hint = match (hint_node, kind) {
        (Some(value), Some(kind)) => {
            ok(&mut errors, field::<String>("hint", value)).and_then(|text| {
                ok(
                    &mut errors,
                    Hint::parse(&text, kind.hint_vars)
                        .map_err(|m| YamlError::at(m, value).under(Segment::Key("hint".into()))),
                )
            })
        }
        _ => None,
    };
    // The kind's parameters, when there is a kind to read them by: serde
    // stops at the first bad one, so each bad parameter is taken out and
    // the rest read again, until every one is reported.
    let probe = kind.and_then(|kind| {
        let mut params = params;
        let mut taken: Vec<String> = Vec::new();
        let mut bad = false;
        loop {
            match (kind.parse)(node, params.clone()) {
                Ok(probe) => return (!bad).then_some(probe),
                Err(e) => {
                    // Once a parameter is out, what is said of the whole
                    // check (a missing key, no expectation left) follows
                    // from that and is not another mistake.
                    if taken.is_empty() || e.top_key().is_some() {
                        errors.push(explain_unknown_key(e.clone(), kind));
                    }
                    bad = true;
                    let at = e.top_key().and_then(|key| {
                        params
                            .iter()
                            .position(|(k, _)| yaml::scalar_text(k).as_deref() == Some(key))
                    });
                    let at = at?;
                    let (key, _) = params.remove(at);
                    taken.push(yaml::scalar_text(key).unwrap_or_default());
                }
            }
        }
    });
    let (Some((id, _)), Some(kind), Some(probe), true) = (id, kind, probe, errors.is_empty())
    else {
        return Err(errors);
    };
    // A node kind whose parameters make it each rank's.
    let own = if kind.scope == Scope::Node && probe.every_rank() {
        Scope::Rank
    } else {
        kind.scope
    };
    let scope = match scope {
        None => own,
        Some((said, value)) => match scope_said(kind, own, said) {
            Ok(s) => s,
            Err(message) => {
                return Err(vec![
                    YamlError::at(message, value).under(Segment::Key("scope".into())),
                ]);
            }
        },
    };
    let timeout = timeout
        .or_else(|| probe.default_timeout())
        .unwrap_or(DEFAULT_TIMEOUT);
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
        cache,
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

/// A check's own `scope:` against its kind's: a node kind may be said to
/// be each rank's (a `command` that reads the rank's environment); no
/// other change holds.
fn scope_said(kind: &KindInfo, own: Scope, said: Scope) -> Result<Scope, String> {
    match (own, said) {
        (k, s) if k == s => Ok(s),
        (Scope::Node, Scope::Rank) => Ok(Scope::Rank),
        (Scope::Cluster, _) => Err(format!(
            "kind `{}` compares nodes with each other: its scope is cluster",
            kind.name
        )),
        (_, Scope::Cluster) => Err(format!(
            "`scope: cluster` needs a cluster kind (cluster_versions, cluster_env, ...); `{}` is evaluated on each {}",
            kind.name,
            if own == Scope::Rank { "rank" } else { "node" }
        )),
        (Scope::Rank, _) if kind.scope == Scope::Node => Err(format!(
            "kind `{}` as configured runs on every rank at once (its parameters say so): its scope is rank",
            kind.name
        )),
        (Scope::Rank, _) => Err(format!(
            "kind `{}` examines each rank's own state (its environment, devices or bindings): its scope is rank, and a node's leader cannot evaluate it for the node's other ranks",
            kind.name
        )),
        (Scope::Node, Scope::Node) => Ok(Scope::Node),
    }
}
