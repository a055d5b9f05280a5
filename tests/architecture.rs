//! The floor plan of `src/`: every import points to a lower floor, a few
//! pairs on one floor are kept apart, clap stays in the command line, and
//! no import loop spans more than one folder. The checker reads the source
//! as text, so a bad import fails here, naming the file, the line and the
//! import, before anyone reviews it.
//!
//! Floors, from the top (see src/lib.rs):
//!   0 lib.rs, main.rs
//!   1 cli, fuzzing (the fuzz targets' entry points, feature `fuzzing`)
//!   2 commands
//!   3 engine, cluster, collective, diagnose (the stages)
//!   4 checklist, report
//!   5 kinds
//!   6 result
//!   7 facts, values, yaml, exit, suggest, interrupt, test_hooks (ground)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The floor of each top-level module of the crate.
const FLOORS: &[(&str, u8)] = &[
    ("cli", 1),
    ("fuzzing", 1),
    ("commands", 2),
    ("engine", 3),
    ("cluster", 3),
    ("collective", 3),
    ("diagnose", 3),
    ("admission", 3),
    ("checklist", 4),
    ("report", 4),
    ("kinds", 5),
    ("result", 6),
    ("facts", 7),
    ("values", 7),
    ("yaml", 7),
    ("exit", 7),
    ("suggest", 7),
    ("interrupt", 7),
    ("test_hooks", 7),
];

/// The ground: plain values that any of them may use.
const GROUND: &[&str] = &[
    "facts",
    "values",
    "yaml",
    "exit",
    "suggest",
    "interrupt",
    "test_hooks",
];

/// Imports between modules of one floor that the plan allows: the
/// collective stage moves its data over the cluster stage's store, its
/// mesh proves the job's token (auth), and its tests meet over a real
/// rendezvous (`cluster::test_support`).
const SAME_FLOOR_ALLOWED: &[(&str, &str)] = &[
    ("collective", "cluster::store"),
    ("collective", "cluster::auth"),
    ("collective", "cluster::test_support"),
];

/// Imports the floors alone would allow, that the plan forbids: a stage
/// hands its result to the command, which renders it.
const FORBIDDEN: &[(&str, &str)] = &[
    ("engine", "report"),
    ("cluster", "report"),
    ("collective", "report"),
    ("diagnose", "report"),
    ("admission", "report"),
];

/// Where clap's types may appear.
fn may_use_clap(file: &str) -> bool {
    file == "src/cli.rs" || file.starts_with("src/commands/")
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    file: String,
    line: usize,
    message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// One import found in a file: where, its text, and the module path it
/// names (absolute, from the crate root).
#[derive(Debug, Clone)]
struct Import {
    line: usize,
    text: String,
    path: Vec<String>,
}

/// The module path of a file under `src/`: `src/kinds/mod.rs` is
/// `kinds`, `src/kinds/port.rs` is `kinds::port`, lib.rs and main.rs the
/// root.
fn module_of(file: &str) -> Vec<String> {
    let rel = file.strip_prefix("src/").unwrap_or(file);
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The source with comments and the contents of string and character
/// literals blanked out, newlines kept, so positions still give lines.
fn strip(source: &str) -> String {
    let b = source.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = source[i..].find('\n').map_or(b.len(), |n| i + n);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = source[i + 2..]
                    .find("*/")
                    .map_or(b.len(), |n| i + 2 + n + 2);
                blank(&mut out, i, end);
                i = end;
            }
            b'r' if (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let body = i + 2 + hashes;
                let end = source[body..].find(&close).map_or(b.len(), |n| body + n);
                blank(&mut out, body, end);
                i = end + close.len();
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                blank(&mut out, i + 1, j);
                i = j + 1;
            }
            b'\'' => {
                // A character literal ('x', '\n', '"'), not a lifetime.
                let len = if b.get(i + 1) == Some(&b'\\') {
                    source[i + 2..].find('\'').map(|n| n + 3)
                } else {
                    source[i + 1..]
                        .chars()
                        .next()
                        .filter(|c| source[i + 1 + c.len_utf8()..].starts_with('\''))
                        .map(|c| c.len_utf8() + 2)
                };
                match len {
                    Some(n) => {
                        blank(&mut out, i + 1, i + n - 1);
                        i += n;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The paths a `use` tree names: `a::{b, c::{d, e}}` is a::b, a::c::d,
/// a::c::e.
fn expand(tree: &str) -> Vec<String> {
    // Spaces go, but a rename keeps its ` as `.
    let tree = tree
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" as ", "\u{1}")
        .replace(' ', "")
        .replace('\u{1}', " as ");
    let mut out = Vec::new();
    fn walk(prefix: &str, tree: &str, out: &mut Vec<String>) {
        let Some(open) = tree.find('{') else {
            out.push(format!("{prefix}{tree}"));
            return;
        };
        let head = &tree[..open];
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut start = 0;
        let mut items = Vec::new();
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&inner[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(&inner[start..]);
        for item in items.into_iter().filter(|i| !i.is_empty()) {
            walk(&format!("{prefix}{head}"), item, out);
        }
    }
    walk("", &tree, &mut out);
    out
}

/// The inline modules (`mod tests { ... }`) open at each byte offset, so
/// that `super` inside one means the file's module.
fn inline_modules(text: &str) -> Vec<(usize, usize, String)> {
    let b = text.as_bytes();
    let mut spans = Vec::new();
    let mut search = 0;
    while let Some(n) = text[search..].find("mod ") {
        let at = search + n;
        search = at + 4;
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue;
        }
        let rest = &text[at + 4..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = rest.trim_start()[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = at + 4 + rest.len() - after.len();
        let mut depth = 0;
        let mut end = text.len();
        for (i, c) in text[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        spans.push((open, end, name));
    }
    spans
}

fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// Every import of a file: its `use` declarations and the `crate::`,
/// `super::` and `self::` paths written inline.
fn imports(file: &str, source: &str) -> Vec<Import> {
    let text = strip(source);
    let module = module_of(file);
    let inline = inline_modules(&text);
    let scope_at = |at: usize| -> Vec<String> {
        let mut m = module.clone();
        for (open, end, name) in &inline {
            if *open < at && at < *end {
                m.push(name.clone());
            }
        }
        m
    };
    let absolute = |at: usize, path: &str| -> Option<Vec<String>> {
        let mut parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        let mut base = match parts.first().copied() {
            Some("crate") => {
                parts.remove(0);
                Vec::new()
            }
            Some("super" | "self") => scope_at(at),
            _ => return None,
        };
        while let Some(first) = parts.first().copied() {
            match first {
                "super" => {
                    base.pop();
                }
                "self" => {}
                _ => break,
            }
            parts.remove(0);
        }
        base.extend(
            parts
                .iter()
                .map(|p| p.split(" as ").next().unwrap_or(p).to_string()),
        );
        Some(base)
    };
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let word_start =
        |at: usize| at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
    let mut search = 0;
    let mut in_use = Vec::new();
    while let Some(n) = text[search..].find("use ") {
        let at = search + n;
        search = at + 4;
        if !word_start(at) {
            continue;
        }
        let Some(end) = text[at..].find(';') else {
            continue;
        };
        let tree = &text[at + 4..at + end];
        in_use.push((at, at + end));
        let line = line_of(&text, at);
        let shown = source[at..at + end + 1]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for path in expand(tree) {
            if let Some(abs) = absolute(at, &path) {
                out.push(Import {
                    line,
                    text: shown.clone(),
                    path: abs,
                });
            }
        }
    }
    for prefix in ["crate::", "super::", "self::"] {
        let mut search = 0;
        while let Some(n) = text[search..].find(prefix) {
            let at = search + n;
            search = at + prefix.len();
            if !word_start(at) || (at >= 2 && &text[at - 2..at] == "::") {
                continue;
            }
            if in_use.iter().any(|(s, e)| *s <= at && at <= *e) {
                continue;
            }
            let len = text[at..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(text.len() - at);
            let path = text[at..at + len].trim_end_matches(':');
            if let Some(abs) = absolute(at, path) {
                out.push(Import {
                    line: line_of(&text, at),
                    text: source[at..at + len].to_string(),
                    path: abs,
                });
            }
        }
    }
    out
}

/// The file of the longest module prefix of `path`, if any.
fn resolve<'a>(path: &[String], modules: &'a BTreeMap<Vec<String>, String>) -> Option<&'a String> {
    (1..=path.len())
        .rev()
        .find_map(|n| modules.get(&path[..n].to_vec()))
}

fn floor(module: &[String]) -> u8 {
    match module.first() {
        None => 0,
        Some(top) => FLOORS
            .iter()
            .find(|(name, _)| name == top)
            .map_or(0, |(_, f)| *f),
    }
}

/// A file's folder; `x.rs` beside an `x/` folder is in that folder, as
/// `x/mod.rs` would be.
fn folder(file: &str, files: &BTreeMap<String, String>) -> String {
    let own = file.strip_suffix(".rs").unwrap_or(file);
    let prefix = format!("{own}/");
    if files.keys().any(|f| f.starts_with(&prefix)) {
        return own.to_string();
    }
    Path::new(file)
        .parent()
        .map_or(String::new(), |p| p.display().to_string())
}

/// Every rule the tree breaks: `files` maps `src/...` paths to source text.
fn check(files: &BTreeMap<String, String>) -> Vec<Violation> {
    let modules: BTreeMap<Vec<String>, String> = files
        .keys()
        .filter(|f| !f.ends_with("main.rs"))
        .map(|f| (module_of(f), f.clone()))
        .collect();
    let mut violations = Vec::new();
    let mut edges: BTreeMap<&String, BTreeMap<&String, (usize, String)>> = BTreeMap::new();
    for (file, source) in files {
        let from = module_of(file);
        let from_top = from.first().cloned().unwrap_or_default();
        for import in imports(file, source) {
            let Some(target) = resolve(&import.path, &modules) else {
                continue;
            };
            if target == file {
                continue;
            }
            edges
                .entry(file)
                .or_default()
                .entry(target)
                .or_insert((import.line, import.text.clone()));
            let to = module_of(target);
            let to_top = to.first().cloned().unwrap_or_default();
            if to_top == from_top || from.is_empty() {
                continue;
            }
            let (f, t) = (floor(&from), floor(&to));
            let both_ground =
                GROUND.contains(&from_top.as_str()) && GROUND.contains(&to_top.as_str());
            let named = to.join("::");
            let message = if t < f {
                Some(format!(
                    "`{}`: {from_top} (floor {f}) imports {named} (floor {t}); an import may only point to a lower floor",
                    import.text
                ))
            } else if t == f && !both_ground {
                let allowed = SAME_FLOOR_ALLOWED.iter().any(|(a, b)| {
                    *a == from_top && (named == *b || named.starts_with(&format!("{b}::")))
                });
                (!allowed).then(|| {
                    format!(
                        "`{}`: {from_top} imports {named}, on its own floor ({f}); modules of one floor stay apart",
                        import.text
                    )
                })
            } else if FORBIDDEN
                .iter()
                .any(|(a, b)| *a == from_top && *b == to_top)
            {
                Some(format!(
                    "`{}`: the {from_top} stage imports {named}; a stage returns its result and the command renders it",
                    import.text
                ))
            } else {
                None
            };
            if let Some(message) = message {
                violations.push(Violation {
                    file: file.clone(),
                    line: import.line,
                    message,
                });
            }
        }
        let text = strip(source);
        for word in ["clap::", "unsafe "] {
            let mut search = 0;
            while let Some(n) = text[search..].find(word) {
                let at = search + n;
                search = at + word.len();
                let b = text.as_bytes();
                if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
                    continue;
                }
                let line = line_of(&text, at);
                let shown = source
                    .lines()
                    .nth(line - 1)
                    .unwrap_or("")
                    .trim()
                    .to_string();
                if word == "clap::" && !may_use_clap(file) {
                    violations.push(Violation {
                        file: file.clone(),
                        line,
                        message: format!(
                            "`{shown}`: clap belongs to src/cli.rs and src/commands/; give the command its own argument type"
                        ),
                    });
                }
                if word == "unsafe " {
                    violations.push(Violation {
                        file: file.clone(),
                        line,
                        message: format!(
                            "`{shown}`: `unsafe` lives only in the crates/*-sys crates"
                        ),
                    });
                }
            }
        }
    }
    for component in loops(&edges) {
        let folders: BTreeSet<String> = component.iter().map(|f| folder(f, files)).collect();
        if folders.len() > 1 {
            let first = component[0];
            let (line, text) = component
                .iter()
                .find_map(|to| edges.get(first).and_then(|e| e.get(to)))
                .cloned()
                .unwrap_or((1, String::new()));
            let names: Vec<&str> = component.iter().map(|s| s.as_str()).collect();
            violations.push(Violation {
                file: first.clone(),
                line,
                message: format!(
                    "`{text}` is part of an import loop across {} folders ({}): {}",
                    folders.len(),
                    folders.into_iter().collect::<Vec<_>>().join(", "),
                    names.join(" ")
                ),
            });
        }
    }
    violations.sort();
    violations.dedup();
    violations
}

/// The import loops: strongly connected components of more than one file
/// (Tarjan's algorithm).
fn loops<'a>(
    edges: &BTreeMap<&'a String, BTreeMap<&'a String, (usize, String)>>,
) -> Vec<Vec<&'a String>> {
    struct State<'a> {
        index: BTreeMap<&'a String, usize>,
        low: BTreeMap<&'a String, usize>,
        stack: Vec<&'a String>,
        on_stack: BTreeSet<&'a String>,
        next: usize,
        out: Vec<Vec<&'a String>>,
    }
    fn visit<'a>(
        v: &'a String,
        edges: &BTreeMap<&'a String, BTreeMap<&'a String, (usize, String)>>,
        s: &mut State<'a>,
    ) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in edges.get(v).into_iter().flat_map(|e| e.keys().copied()) {
            if !s.index.contains_key(w) {
                visit(w, edges, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    let nodes: Vec<&String> = edges.keys().copied().collect();
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(v, edges, &mut s);
        }
    }
    s.out
}

fn read_tree(dir: &Path, files: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_tree(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .expect("under the manifest dir")
                .display()
                .to_string();
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
            files.insert(rel, text);
        }
    }
}

#[test]
fn the_tree_keeps_its_floors() {
    let mut files = BTreeMap::new();
    read_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 50, "read only {} files", files.len());
    // The checker sees the layers it is about: a sample of real imports.
    let engine = imports("src/engine.rs", &files["src/engine.rs"]);
    assert!(
        engine
            .iter()
            .any(|i| i.path.first().map(String::as_str) == Some("checklist")),
        "{engine:?}"
    );
    let violations = check(&files);
    let shown: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(violations.is_empty(), "\n{}", shown.join("\n"));
}

/// The fault switches tests use live in one module that only a build
/// with the `test-hooks` feature compiles: no other file names them, so
/// a release binary holds none.
#[test]
fn fault_switches_exist_only_in_test_builds() {
    let mut files = BTreeMap::new();
    read_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let naming: Vec<&String> = files
        .iter()
        .filter(|(_, text)| text.contains("PREFLIGHT_TEST_"))
        .map(|(f, _)| f)
        .collect();
    assert_eq!(naming, ["src/test_hooks.rs"]);
    let lib = &files["src/lib.rs"];
    assert!(
        lib.contains("#[cfg(feature = \"test-hooks\")]\nmod test_hooks;"),
        "src/lib.rs must compile test_hooks only with the feature"
    );
    for (f, text) in &files {
        for (n, line) in text.lines().enumerate() {
            if line.contains("test_hooks::") {
                let before: Vec<&str> = text.lines().take(n).collect();
                let gated = before
                    .iter()
                    .rev()
                    .take(12)
                    .any(|l| l.contains("cfg(feature = \"test-hooks\")"));
                assert!(
                    gated,
                    "{f}:{}: test_hooks used outside a cfg(feature = \"test-hooks\") item",
                    n + 1
                );
            }
        }
    }
}

fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(p, s)| (p.to_string(), s.to_string()))
        .collect()
}

/// A small crate with the real layout's names, that keeps every rule.
fn good() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "src/lib.rs",
            "pub mod cli;\npub mod commands;\npub mod engine;\npub mod kinds;\npub mod result;\npub mod cluster;\npub mod collective;\npub mod report;\n",
        ),
        (
            "src/cli.rs",
            "use clap::Parser;\nuse crate::commands::run;\n",
        ),
        (
            "src/commands/mod.rs",
            "mod run;\npub use run::run;\nuse crate::engine;\n",
        ),
        (
            "src/commands/run.rs",
            "use crate::report::human;\nuse crate::collective::stage;\n#[derive(clap::Args)]\npub struct RunArgs;\n",
        ),
        (
            "src/engine.rs",
            "use crate::kinds::{self, Probe};\nuse crate::result::Finding;\n",
        ),
        ("src/cluster/mod.rs", "pub mod store;\npub mod server;\n"),
        ("src/cluster/store.rs", "use super::server::Frame;\n"),
        ("src/cluster/server.rs", "use super::store::Store;\n"),
        (
            "src/collective/stage.rs",
            "use crate::cluster::store::Store;\n",
        ),
        (
            "src/report/human.rs",
            "use crate::result::{CheckResult, Status};\n",
        ),
        (
            "src/kinds/mod.rs",
            "mod port;\nuse crate::result::Finding;\n// use crate::engine; (a comment is no import)\nconst S: &str = \"crate::commands::run\";\n",
        ),
        (
            "src/kinds/port.rs",
            "#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::Probe;\n}\n",
        ),
        ("src/result/mod.rs", "use crate::facts::Facts;\n"),
        ("src/facts/mod.rs", "use crate::values::Bytes;\n"),
        ("src/values.rs", "use serde::Deserialize;\n"),
    ]
}

fn with(
    base: Vec<(&'static str, &'static str)>,
    extra: &[(&'static str, &'static str)],
) -> BTreeMap<String, String> {
    let mut files = tree(&base);
    for (p, s) in extra {
        files.insert(p.to_string(), s.to_string());
    }
    files
}

#[test]
fn a_tree_that_keeps_the_rules_passes() {
    let violations = check(&tree(&good()));
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn an_import_up_a_floor_is_named_with_its_file_and_line() {
    let files = with(
        good(),
        &[(
            "src/kinds/port.rs",
            "use crate::result::Finding;\n\nuse crate::engine::{self, run};\n",
        )],
    );
    let v = check(&files);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].file, "src/kinds/port.rs");
    assert_eq!(v[0].line, 3);
    assert!(
        v[0].message.contains("use crate::engine::{self, run};"),
        "{}",
        v[0]
    );
    assert!(
        v[0].message
            .contains("kinds (floor 5) imports engine (floor 3)"),
        "{}",
        v[0]
    );
}

#[test]
fn inline_paths_and_super_count_as_imports() {
    // `super::super` from kinds/port.rs is the crate root: a path up to
    // commands from there is an import too, as is an inline `crate::` path.
    let files = with(
        good(),
        &[
            (
                "src/kinds/port.rs",
                "fn f() { super::super::commands::run(); }\n",
            ),
            (
                "src/result/mod.rs",
                "fn g() -> crate::kinds::Probe { todo!() }\n",
            ),
        ],
    );
    let v = check(&files);
    let up: Vec<(&str, usize)> = v
        .iter()
        .filter(|v| v.message.contains("lower floor"))
        .map(|v| (v.file.as_str(), v.line))
        .collect();
    assert_eq!(
        up,
        vec![("src/kinds/port.rs", 1), ("src/result/mod.rs", 1)],
        "{v:#?}"
    );
}

#[test]
fn the_ground_imports_nothing_above_it() {
    let files = with(good(), &[("src/values.rs", "use crate::result::Status;\n")]);
    let v = check(&files);
    assert!(
        v.iter().any(|v| v.file == "src/values.rs"
            && v.line == 1
            && v.message
                .contains("values (floor 7) imports result (floor 6)")),
        "{v:#?}"
    );
}

#[test]
fn stages_keep_apart_and_away_from_rendering() {
    let files = with(
        good(),
        &[
            (
                "src/cluster/server.rs",
                "use super::store::Store;\nuse crate::collective::stage::RankResult;\n",
            ),
            (
                "src/collective/stage.rs",
                "use crate::cluster::store::Store;\nuse crate::cluster::server::serve;\n",
            ),
            ("src/engine.rs", "use crate::report::human::Human;\n"),
        ],
    );
    let v = check(&files);
    let shown: Vec<String> = v.iter().map(ToString::to_string).collect();
    assert_eq!(v.len(), 4, "{shown:#?}");
    assert!(
        shown
            .iter()
            .any(|s| s.starts_with("src/cluster/server.rs:2:")
                && s.contains("cluster imports collective::stage")),
        "{shown:#?}"
    );
    assert!(
        shown
            .iter()
            .any(|s| s.starts_with("src/collective/stage.rs:2:")
                && s.contains("collective imports cluster::server")),
        "{shown:#?}"
    );
    assert!(
        shown.iter().any(|s| s.starts_with("src/engine.rs:1:")
            && s.contains("the engine stage imports report::human")),
        "{shown:#?}"
    );
    // The two stages now import each other: a loop across two folders.
    assert!(
        shown
            .iter()
            .any(|s| s.contains("import loop across 2 folders")),
        "{shown:#?}"
    );
}

#[test]
fn a_loop_inside_one_folder_is_allowed_and_across_folders_is_not() {
    // store ↔ server in cluster/ is in the good tree and passes; kinds and
    // result importing each other is a loop across folders (and an import
    // up a floor).
    let files = with(
        good(),
        &[
            ("src/kinds/mod.rs", "use crate::result::Finding;\n"),
            ("src/result/mod.rs", "use crate::kinds::Probe;\n"),
        ],
    );
    let v = check(&files);
    assert!(
        v.iter().any(|v| v
            .message
            .contains("import loop across 2 folders (src/kinds, src/result)")),
        "{v:#?}"
    );
}

#[test]
fn clap_and_unsafe_stay_where_they_belong() {
    let files = with(
        good(),
        &[(
            "src/report/human.rs",
            "#[derive(Clone, clap::ValueEnum)]\npub enum Format { Human }\nfn f() { unsafe { g() } }\n",
        )],
    );
    let v = check(&files);
    let shown: Vec<String> = v.iter().map(ToString::to_string).collect();
    assert_eq!(v.len(), 2, "{shown:#?}");
    assert!(
        shown[0].starts_with("src/report/human.rs:1:") && shown[0].contains("clap belongs to"),
        "{shown:#?}"
    );
    assert!(
        shown[1].starts_with("src/report/human.rs:3:") && shown[1].contains("`unsafe` lives only"),
        "{shown:#?}"
    );
}

#[test]
fn use_trees_expand() {
    assert_eq!(
        expand("crate::a::{b, c::{d, e as f}, self}"),
        vec![
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e as f",
            "crate::a::self"
        ]
    );
}

/// The fuzz targets' entry points compile only with the `fuzzing` feature,
/// and only the fuzz crate and they name it: no shipped binary holds them.
#[test]
fn fuzzing_entry_points_exist_only_in_fuzz_builds() {
    let mut files = BTreeMap::new();
    read_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let lib = &files["src/lib.rs"];
    assert!(
        lib.contains("#[cfg(feature = \"fuzzing\")]\npub mod fuzzing;"),
        "src/lib.rs must compile fuzzing only with the feature"
    );
    for (f, text) in &files {
        for (n, line) in text.lines().enumerate() {
            if line.contains("fn parse_for_fuzzing") || line.contains("fn parse_settings") {
                let gated = text
                    .lines()
                    .take(n)
                    .collect::<Vec<_>>()
                    .iter()
                    .rev()
                    .take(4)
                    .any(|l| l.contains("cfg(feature = \"fuzzing\")"));
                assert!(
                    gated,
                    "{f}:{}: a fuzzing entry outside cfg(feature = \"fuzzing\")",
                    n + 1
                );
            }
        }
    }
}

/// How long a source file may grow before a reader loses the thread: past
/// it, a file holds several concerns that want modules of their own.
const MAX_LINES: usize = 900;

/// Files allowed past `MAX_LINES`, each with why (none today: the bound
/// is kept by splitting along seams, not by adding here).
const LONG_FILES: &[(&str, &str)] = &[];

/// The source files (outside tests and fixtures) longer than `MAX_LINES`
/// and not excused.
fn too_long(files: &BTreeMap<String, String>) -> Vec<String> {
    files
        .iter()
        .filter(|(f, _)| !f.starts_with("tests/") && !f.contains("/fixtures/"))
        .filter(|(f, _)| !LONG_FILES.iter().any(|(long, _)| long == f))
        .map(|(f, text)| (f, text.lines().count()))
        .filter(|(_, n)| *n > MAX_LINES)
        .map(|(f, n)| format!("{f}: {n} lines (at most {MAX_LINES}: split it along its seams)"))
        .collect()
}

#[test]
fn no_source_file_outgrows_a_reader() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = BTreeMap::new();
    read_tree(&root.join("src"), &mut files);
    for dir in std::fs::read_dir(root.join("crates")).expect("crates/") {
        let src = dir.expect("entry").path().join("src");
        if src.is_dir() {
            read_tree(&src, &mut files);
        }
    }
    assert!(
        files.keys().any(|f| f.starts_with("crates/nccl-sys/src/")),
        "{:?}",
        files.keys().collect::<Vec<_>>()
    );
    let long = too_long(&files);
    assert!(long.is_empty(), "\n{}", long.join("\n"));
    let mut grown = tree(&[("src/big.rs", "fn x() {}\n")]);
    grown.insert("src/grown.rs".into(), "//\n".repeat(MAX_LINES + 1));
    grown.insert("tests/long.rs".into(), "//\n".repeat(MAX_LINES + 1));
    assert_eq!(too_long(&grown).len(), 1, "{:?}", too_long(&grown));
}

/// What in a file's code (comments, strings and its unit tests left out)
/// reads a finding's wording: a `message` field, or text searched.
fn reads_message_text(source: &str) -> Vec<usize> {
    let code = strip(source);
    let end = code.find("#[cfg(test)]").unwrap_or(code.len());
    let code = &code[..end];
    let words = [
        "message",
        "match_indices",
        "contains(\"",
        "starts_with(",
        "ends_with(",
        "find(\"",
        "split(",
    ];
    code.lines()
        .enumerate()
        .filter(|(_, line)| words.iter().any(|w| line.contains(w)))
        .map(|(n, _)| n + 1)
        .collect()
}

/// Causes are decided on what findings say they are about, never on their
/// words: the rules live in `result/cause.rs` alone, which reads no text,
/// and nothing else sets `caused_by`.
#[test]
fn no_cause_rule_matches_on_message_text() {
    let mut files = BTreeMap::new();
    read_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let rules = "src/result/cause.rs";
    let lines = reads_message_text(&files[rules]);
    assert!(lines.is_empty(), "{rules} reads text at lines {lines:?}");
    for (f, text) in files.iter().filter(|(f, _)| *f != rules) {
        let code = strip(text);
        for (n, line) in code.lines().enumerate() {
            let sets = line.contains("caused_by =") || line.contains("caused_by_mut()");
            assert!(!sets, "{f}:{}: a cause is set outside {rules}", n + 1);
        }
    }
    // The check sees a rule that reads text.
    let reading = "fn rule(c: &C) -> bool {\n    c.message.contains(\"held by pid\")\n}\n#[cfg(test)]\nmod tests { fn t(m: &str) { m.split(' '); } }\n";
    assert_eq!(reads_message_text(reading), [2]);
}
