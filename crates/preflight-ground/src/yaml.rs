//! A serde `Deserializer` over saphyr's marked YAML tree.
//!
//! Why not a ready-made YAML serde crate: the checklist format mixes common
//! keys (id, severity, ...) with each kind's own parameters in one mapping,
//! and the crates we tried lose or blur positions inside such merged maps.
//! Walking saphyr's span-carrying nodes ourselves gives every error the exact
//! line, column and key path of the offending node.

use std::fmt;

use saphyr::{LoadableYamlNode, MarkedYamlOwned, ScalarOwned, YamlDataOwned};
use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

pub type Node = MarkedYamlOwned;

/// 1-based line and column of a node in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

impl Location {
    pub fn of(node: &Node) -> Location {
        Location {
            line: node.span.start.line(),
            column: node.span.start.col() + 1,
        }
    }
}

/// One step of the key path from the document root to a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// A deserialization error that knows where it happened.
#[derive(Debug, Clone)]
pub struct YamlError {
    pub message: String,
    pub location: Option<Location>,
    /// Innermost segment first; reversed when displayed.
    path_rev: Vec<Segment>,
}

impl YamlError {
    pub fn new(message: impl Into<String>, location: Option<Location>) -> YamlError {
        YamlError {
            message: message.into(),
            location,
            path_rev: Vec::new(),
        }
    }

    pub fn at(message: impl Into<String>, node: &Node) -> YamlError {
        YamlError::new(message, Some(Location::of(node)))
    }

    pub fn with_message(mut self, message: String) -> YamlError {
        self.message = message;
        self
    }

    /// Attaches the node's location unless a deeper node already did.
    fn locate(mut self, node: &Node) -> YamlError {
        if self.location.is_none() {
            self.location = Some(Location::of(node));
        }
        self
    }

    /// Records that the error happened below `segment`.
    pub fn under(mut self, segment: Segment) -> YamlError {
        self.path_rev.push(segment);
        self
    }

    /// The key path, e.g. `checks[2].timeout`.
    pub fn path(&self) -> String {
        render_path(self.path_rev.iter().rev())
    }

    /// The outermost key of the path: the entry of the mapping read that
    /// the error is about.
    pub fn top_key(&self) -> Option<&str> {
        match self.path_rev.last() {
            Some(Segment::Key(k)) => Some(k),
            _ => None,
        }
    }

    /// The name serde's "missing field `x`" is about.
    pub fn missing_field(&self) -> Option<&str> {
        self.message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
    }
}

pub fn render_path<'a>(segments: impl Iterator<Item = &'a Segment>) -> String {
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for YamlError {}

impl de::Error for YamlError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        YamlError::new(plain_types(&msg.to_string()), None)
    }
}

/// Serde names Rust types ("expected i64"); checklist authors write YAML.
fn plain_types(message: &str) -> String {
    const NAMES: &[(&str, &str)] = &[
        ("expected i64", "expected an integer"),
        ("expected i32", "expected an integer"),
        ("expected u64", "expected a whole number"),
        ("expected u32", "expected a whole number"),
        ("expected u16", "expected a whole number below 65536"),
        ("expected u8", "expected a whole number"),
        ("expected usize", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
        ("expected a sequence", "expected a list"),
        ("expected a map", "expected a mapping"),
    ];
    let mut text = message.to_string();
    for (from, to) in NAMES {
        if text.ends_with(from) {
            text = format!("{}{to}", &text[..text.len() - from.len()]);
        }
    }
    text
}

/// The tab at or just before `col` on `line` (1-based line, 0-based
/// column, in characters), else the first one after it: (line, column),
/// both 1-based.
fn tab_near(text: &str, line: usize, col: usize) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let here: Vec<char> = lines.get(line.checked_sub(1)?)?.chars().collect();
    if let Some(at) = here.iter().take(col + 1).rposition(|c| *c == '\t') {
        return Some((line, at + 1));
    }
    if let Some(at) = here.iter().skip(col).position(|c| *c == '\t') {
        return Some((line, col + at + 1));
    }
    lines
        .iter()
        .enumerate()
        .skip(line)
        .find_map(|(i, l)| l.chars().position(|c| c == '\t').map(|at| (i + 1, at + 1)))
}

/// Parses one YAML document; an empty file is a null node.
pub fn parse_document(text: &str) -> Result<Node, YamlError> {
    let mut docs = Node::load_from_str(text).map_err(|e| {
        let mark = e.marker();
        let (mut line, mut column) = (mark.line(), mark.col() + 1);
        // The scanner reports a tab it refuses where it stopped: after the
        // tab, or at the start of the scalar the tab interrupts. The
        // operator needs the tab's own line and column.
        if e.info().contains("tab")
            && let Some((l, c)) = tab_near(text, mark.line(), mark.col())
        {
            (line, column) = (l, c);
        }
        YamlError::new(
            format!("invalid YAML: {}", e.info()),
            Some(Location { line, column }),
        )
    })?;
    match docs.len() {
        0 => Ok(Node::value_from_str("~")),
        1 => Ok(docs.remove(0)),
        _ => Err(YamlError::at(
            "a checklist file holds one YAML document; found a second one (`---`)",
            &docs[1],
        )),
    }
}

/// Strips tags, which carry no meaning in checklists.
pub fn data(node: &Node) -> &YamlDataOwned<Node> {
    match &node.data {
        YamlDataOwned::Tagged(_, inner) => data(inner),
        other => other,
    }
}

/// The YAML type of a node, as users would name it.
pub fn type_name(node: &Node) -> &'static str {
    match data(node) {
        YamlDataOwned::Value(ScalarOwned::Null) => "null",
        YamlDataOwned::Value(ScalarOwned::Boolean(_)) => "boolean",
        YamlDataOwned::Value(ScalarOwned::Integer(_)) => "integer",
        YamlDataOwned::Value(ScalarOwned::FloatingPoint(_)) => "float",
        YamlDataOwned::Value(ScalarOwned::String(_)) | YamlDataOwned::Representation(..) => {
            "string"
        }
        YamlDataOwned::Sequence(_) => "list",
        YamlDataOwned::Mapping(_) => "mapping",
        YamlDataOwned::Alias(_) => "alias",
        YamlDataOwned::BadValue | YamlDataOwned::Tagged(..) => "invalid value",
    }
}

/// A scalar's text, for keys and string-typed fields.
pub fn scalar_text(node: &Node) -> Option<String> {
    match data(node) {
        YamlDataOwned::Value(ScalarOwned::String(s)) => Some(s.clone()),
        YamlDataOwned::Value(ScalarOwned::Integer(i)) => Some(i.to_string()),
        YamlDataOwned::Value(ScalarOwned::FloatingPoint(f)) => Some(f.to_string()),
        YamlDataOwned::Value(ScalarOwned::Boolean(b)) => Some(b.to_string()),
        YamlDataOwned::Representation(s, ..) => Some(s.clone()),
        _ => None,
    }
}

/// The items of a sequence node, in file order.
pub fn sequence_items(node: &Node) -> Option<Vec<&Node>> {
    match data(node) {
        YamlDataOwned::Sequence(items) => Some(items.iter().collect()),
        _ => None,
    }
}

/// Key-value pairs of a mapping node, in file order.
pub fn mapping_entries(node: &Node) -> Option<Vec<(&Node, &Node)>> {
    match data(node) {
        YamlDataOwned::Mapping(map) => Some(map.iter().collect()),
        _ => None,
    }
}

/// Deserializes a whole node.
pub fn from_node<'a, T: de::Deserialize<'a>>(node: &'a Node) -> Result<T, YamlError> {
    // Errors raised after the value was read (a bad duration or regex) have
    // no node of their own: they belong to this one.
    T::deserialize(NodeDeserializer { node }).map_err(|e| e.locate(node))
}

/// Deserializes `node`, finding every error rather than the first: after
/// each error, the entry it is about is taken out of a copy of the tree
/// and the rest is read again, so a file's author fixes every mistake in
/// one pass. Returns what could be read without the bad entries, and the
/// errors (a field missing only because its value was taken out is not
/// one of them).
pub fn from_node_all<T: de::DeserializeOwned>(node: &Node) -> (Option<T>, Vec<YamlError>) {
    let mut tree = node.clone();
    let mut errors: Vec<YamlError> = Vec::new();
    let mut taken: Vec<String> = Vec::new();
    loop {
        match from_node::<T>(&tree) {
            Ok(value) => return (Some(value), errors),
            Err(e) => {
                // Up to the last key: a bad list item takes its list out
                // (the items after it keep their indices in the report).
                let mut path: Vec<Segment> = e.path_rev.iter().rev().cloned().collect();
                while matches!(path.last(), Some(Segment::Index(_))) {
                    path.pop();
                }
                if !e
                    .missing_field()
                    .is_some_and(|f| taken.iter().any(|t| t == f))
                {
                    errors.push(e);
                }
                // Each round takes one entry out, so this ends.
                if !remove_at(&mut tree, &path) {
                    return (None, errors);
                }
                if let Some(Segment::Key(k)) = path.last() {
                    taken.push(k.clone());
                }
            }
        }
    }
}

/// Takes the entry at `path` out of `tree`; false when there is none.
fn remove_at(tree: &mut Node, path: &[Segment]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut node = tree;
    for segment in parents {
        let next = match (&mut node.data, segment) {
            (YamlDataOwned::Mapping(map), Segment::Key(k)) => map
                .iter_mut()
                .find(|(key, _)| scalar_text(key).as_deref() == Some(k.as_str()))
                .map(|(_, v)| v),
            (YamlDataOwned::Sequence(items), Segment::Index(i)) => items.get_mut(*i),
            _ => None,
        };
        let Some(next) = next else { return false };
        node = next;
    }
    match (&mut node.data, last) {
        (YamlDataOwned::Mapping(map), Segment::Key(k)) => {
            let before = map.len();
            map.retain(|key, _| scalar_text(key).as_deref() != Some(k.as_str()));
            map.len() < before
        }
        _ => false,
    }
}

/// Deserializes a struct from selected entries of a mapping (the kind's
/// parameters, once the common keys are taken out).
pub fn from_entries<'a, T: de::Deserialize<'a>>(
    mapping: &'a Node,
    entries: Vec<(&'a Node, &'a Node)>,
) -> Result<T, YamlError> {
    T::deserialize(EntriesDeserializer { mapping, entries })
}

struct NodeDeserializer<'a> {
    node: &'a Node,
}

impl<'de> NodeDeserializer<'de> {
    fn unsupported(&self) -> YamlError {
        match data(self.node) {
            YamlDataOwned::Alias(_) => YamlError::at(
                "YAML aliases (*name) are not supported in checklists",
                self.node,
            ),
            _ => YamlError::at("invalid YAML value", self.node),
        }
    }
}

impl<'de> de::Deserializer<'de> for NodeDeserializer<'de> {
    type Error = YamlError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        let node = self.node;
        let result = match data(node) {
            YamlDataOwned::Value(ScalarOwned::Null) => visitor.visit_unit(),
            YamlDataOwned::Value(ScalarOwned::Boolean(b)) => visitor.visit_bool(*b),
            YamlDataOwned::Value(ScalarOwned::Integer(i)) => visitor.visit_i64(*i),
            YamlDataOwned::Value(ScalarOwned::FloatingPoint(f)) => visitor.visit_f64(f.0),
            YamlDataOwned::Value(ScalarOwned::String(s)) => visitor.visit_str(s),
            YamlDataOwned::Representation(s, ..) => visitor.visit_str(s),
            YamlDataOwned::Sequence(items) => visitor.visit_seq(SeqAccess {
                items: items.iter().enumerate(),
            }),
            YamlDataOwned::Mapping(map) => visitor.visit_map(MapAccess {
                entries: map.iter().collect::<Vec<_>>().into_iter(),
                value: None,
            }),
            _ => Err(self.unsupported()),
        };
        result.map_err(|e| e.locate(node))
    }

    /// Strings accept any scalar, so `mode: 0644` or `expect: 1` work when
    /// the parameter is text.
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        match data(self.node) {
            YamlDataOwned::Value(ScalarOwned::Integer(_))
            | YamlDataOwned::Value(ScalarOwned::FloatingPoint(_))
            | YamlDataOwned::Value(ScalarOwned::Boolean(_)) => {
                let text = scalar_text(self.node).unwrap_or_default();
                visitor
                    .visit_string(text)
                    .map_err(|e: YamlError| e.locate(self.node))
            }
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        match data(self.node) {
            YamlDataOwned::Value(ScalarOwned::Null) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, YamlError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, YamlError> {
        let node = self.node;
        match scalar_text(node) {
            Some(text) => visitor
                .visit_enum(text.into_deserializer())
                .map_err(|e: YamlError| e.locate(node)),
            None => Err(YamlError::at(
                format!("expected one word, found a {}", type_name(node)),
                node,
            )),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

struct SeqAccess<'a, I: Iterator<Item = (usize, &'a Node)>> {
    items: I,
}

impl<'de, I: Iterator<Item = (usize, &'de Node)>> de::SeqAccess<'de> for SeqAccess<'de, I> {
    type Error = YamlError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, YamlError> {
        match self.items.next() {
            None => Ok(None),
            Some((index, node)) => seed
                .deserialize(NodeDeserializer { node })
                .map(Some)
                .map_err(|e| e.locate(node).under(Segment::Index(index))),
        }
    }
}

struct MapAccess<'a> {
    entries: std::vec::IntoIter<(&'a Node, &'a Node)>,
    value: Option<(String, &'a Node)>,
}

impl<'de> de::MapAccess<'de> for MapAccess<'de> {
    type Error = YamlError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, YamlError> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        let name = scalar_text(key).unwrap_or_else(|| format!("<{}>", type_name(key)));
        self.value = Some((name.clone(), value));
        seed.deserialize(NodeDeserializer { node: key })
            .map(Some)
            .map_err(|e| e.locate(key).under(Segment::Key(name)))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, YamlError> {
        let (name, node) = self
            .value
            .take()
            .ok_or_else(|| YamlError::new("a value was requested before its key", None))?;
        seed.deserialize(NodeDeserializer { node })
            .map_err(|e| e.locate(node).under(Segment::Key(name)))
    }
}

struct EntriesDeserializer<'a> {
    mapping: &'a Node,
    entries: Vec<(&'a Node, &'a Node)>,
}

impl<'de> de::Deserializer<'de> for EntriesDeserializer<'de> {
    type Error = YamlError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, YamlError> {
        let mapping = self.mapping;
        visitor
            .visit_map(MapAccess {
                entries: self.entries.into_iter(),
                value: None,
            })
            .map_err(|e| e.locate(mapping))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
        struct enum identifier ignored_any
    }
}
