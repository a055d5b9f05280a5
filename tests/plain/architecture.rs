//! The floor plan of `src/`: every import points to a lower floor, a few
//! pairs on one floor are kept apart, clap stays in the command line, and
//! no import loop spans more than one folder. The checker reads the source
//! as text, so a bad import fails here, naming the file, the line and the
//! import, before anyone reviews it.
//!
//! Floors, from the top (see src/lib.rs):
//!   0 lib.rs, main.rs
//!   1 cli, fuzzing (the fuzz targets' entry points, feature `fuzzing`)
//!   2 commands (the command line)
//!   3 run (a run's settings and the pipeline through the stages)
//!   4 engine, cluster, collective, diagnose, webhook (the stages:
//!     crates/preflight-stages, whose tree is checked on its own)
//!   5 checklist, report (crates/preflight-checklist, -report)
//!   6 kinds (crates/preflight-kinds)
//!   7 result (crates/preflight-result)
//!   8 test_hooks (in the stages' crate); facts and ground
//!     (crates/preflight-facts, -ground)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

mod checker;

mod rules;

/// The floor of each top-level module of this crate, and of each of
/// preflight's crates below it (`preflight_NAME`). The compiler keeps a
/// crate from naming anything above it; this keeps `src/` to the floors
/// when it names a module or a crate.
const FLOORS: &[(&str, u8)] = &[
    ("cli", 1),
    ("fuzzing", 1),
    ("commands", 2),
    ("run", 3),
    ("stages", 4),
    ("engine", 4),
    ("cluster", 4),
    ("collective", 4),
    ("diagnose", 4),
    ("webhook", 4),
    ("checklist", 5),
    ("report", 5),
    ("kinds", 6),
    ("result", 7),
    ("facts", 8),
    ("ground", 8),
    ("test_hooks", 8),
];

/// The ground: the lowest floor, whose modules and crates may use each
/// other.
const GROUND: &[&str] = &["test_hooks", "facts", "ground"];

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
    ("webhook", "report"),
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

/// The crates of preflight's own that a source names
/// (`preflight_kinds::...`), each as (line, its name in `FLOORS`).
fn crate_uses(source: &str) -> Vec<(usize, String)> {
    const PREFIX: &str = "preflight_";
    let text = strip(source);
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut search = 0;
    while let Some(n) = text[search..].find(PREFIX) {
        let at = search + n;
        search = at + PREFIX.len();
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue;
        }
        let name: String = text[search..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if FLOORS.iter().any(|(m, _)| *m == name) {
            out.push((line_of(&text, at), name));
        }
    }
    out
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
        for (line, to_top) in crate_uses(source) {
            if from.is_empty() || to_top == from_top {
                continue;
            }
            let (f, t) = (floor(&from), floor(std::slice::from_ref(&to_top)));
            let shown = source.lines().nth(line - 1).unwrap_or("").trim();
            let both_ground =
                GROUND.contains(&from_top.as_str()) && GROUND.contains(&to_top.as_str());
            let message = if t < f {
                Some(format!(
                    "`{shown}`: {from_top} (floor {f}) names the crate preflight_{to_top} (floor {t}); an import may only point to a lower floor"
                ))
            } else if t == f && !both_ground {
                Some(format!(
                    "`{shown}`: {from_top} names the crate preflight_{to_top}, on its own floor ({f}); modules of one floor stay apart"
                ))
            } else if FORBIDDEN
                .iter()
                .any(|(a, b)| *a == from_top && *b == to_top)
            {
                Some(format!(
                    "`{shown}`: the {from_top} stage names the crate preflight_{to_top}; a stage returns its result and the command renders it"
                ))
            } else {
                None
            };
            if let Some(message) = message {
                violations.push(Violation {
                    file: file.clone(),
                    line,
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
    let _shared = crate::common::shared();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = BTreeMap::new();
    read_tree(&root.join("src"), &mut files);
    assert!(files.len() > 30, "read only {} files", files.len());
    // The stages are one crate whose modules keep the same floors and
    // rules among themselves: checked as a tree of their own, its paths
    // as `src/...`.
    let mut stages = BTreeMap::new();
    read_tree(&root.join("crates/preflight-stages/src"), &mut stages);
    let stages: BTreeMap<String, String> = stages
        .into_iter()
        .map(|(f, text)| (f.replace("crates/preflight-stages/src/", "src/"), text))
        .collect();
    assert!(stages.len() > 50, "read only {} files", stages.len());
    let stage_violations = check(&stages);
    let shown: Vec<String> = stage_violations
        .iter()
        .map(|v| format!("crates/preflight-stages/{v}"))
        .collect();
    assert!(stage_violations.is_empty(), "\n{}", shown.join("\n"));
    // The checker sees the layers it is about: a sample of real imports,
    // of a module and of a crate below.
    let collective = imports(
        "src/collective/stage.rs",
        &stages["src/collective/stage.rs"],
    );
    assert!(
        collective
            .iter()
            .any(|i| i.path.first().map(String::as_str) == Some("cluster")),
        "{collective:?}"
    );
    let run = crate_uses(&files["src/run/mod.rs"]);
    assert!(run.iter().any(|(_, c)| c == "stages"), "{run:?}");
    let engine = crate_uses(&stages["src/engine.rs"]);
    assert!(engine.iter().any(|(_, c)| c == "checklist"), "{engine:?}");
    let violations = check(&files);
    let shown: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(violations.is_empty(), "\n{}", shown.join("\n"));
}
