//! The floor plan, held by the compiler: every floor is a crate
//! (docs/design.md draws them), so nothing can name a floor above its own.
//! What is checked here is that the drawing and the manifests agree:
//! docs/design.md's table of crates is each crate's dependencies, no
//! dependency points up a floor, only the command line depends on clap,
//! and the layout names every module where it is. The house rules no
//! compiler holds (a file's length, fault switches and fuzz entry points
//! only in their own builds, causes from fields) are in `rules`.

use std::collections::BTreeMap;
use std::path::Path;

mod rules;

/// A made-up tree of sources, `path` to text.
fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(p, s)| (p.to_string(), s.to_string()))
        .collect()
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

/// The modules in `dir` (files and folders; its root `mod.rs` or
/// `lib.rs` aside) whose names `what` does not say as a word.
fn unnamed(dir: &Path, what: &str) -> Vec<String> {
    let words: Vec<&str> = what
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    let mut out = Vec::new();
    for child in std::fs::read_dir(dir).unwrap().flatten() {
        let child = child.file_name().to_string_lossy().into_owned();
        let stem = child.strip_suffix(".rs").unwrap_or(&child);
        let module = child.ends_with(".rs") || !child.contains('.');
        if module && !matches!(stem, "mod" | "lib") && !words.contains(&stem) {
            out.push(stem.to_string());
        }
    }
    out
}

/// docs/design.md's layout: the ```text block under `## Layout`, each
/// line of `src/` and of `crates/preflight-*` as (floor, what it says).
struct Drawing {
    src: BTreeMap<String, (Option<u8>, String)>,
    crates: BTreeMap<String, (Option<u8>, String)>,
}

fn drawing(design: &str) -> Drawing {
    let layout = design
        .split("\n## Layout\n")
        .nth(1)
        .and_then(|s| s.split("```text\n").nth(1))
        .and_then(|s| s.split("\n```").next())
        .expect("docs/design.md: a ```text block under ## Layout");
    let mut d = Drawing {
        src: BTreeMap::new(),
        crates: BTreeMap::new(),
    };
    // `3 crates/preflight-cluster/  what it is`: the floor, the path, the
    // description.
    for line in layout.lines() {
        let (floor, rest) = match line.split_once(' ') {
            Some((f, rest)) if f.parse::<u8>().is_ok() => (f.parse().ok(), rest),
            _ => (None, line),
        };
        if let Some(path) = rest.strip_prefix("src/") {
            let (path, what) = path.split_once(' ').unwrap_or((path, ""));
            d.src
                .insert(path.to_string(), (floor, what.trim().to_string()));
        } else if let Some(path) = rest.strip_prefix("crates/") {
            let (path, what) = path.split_once(' ').unwrap_or((path, ""));
            if path.starts_with("preflight-") {
                let name = path.trim_end_matches('/').to_string();
                d.crates.insert(name, (floor, what.trim().to_string()));
            }
        }
    }
    d
}

fn design() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join("docs/design.md")).unwrap()
}

/// Our crates, by directory name (`preflight-run`).
fn our_crates() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out: Vec<String> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("preflight-"))
        .collect();
    out.sort();
    out
}

/// A package's dependency as cargo reads its manifest: the package
/// depended on (under whatever name), whether for every build (`None`),
/// for tests (`dev`) or the build script (`build`), and the features it
/// turns on.
#[derive(Debug)]
struct Dep {
    name: String,
    kind: Option<String>,
    features: Vec<String>,
}

/// Each of the workspace's packages and its dependencies, from `cargo
/// metadata` (not the manifests' text: a table form, a rename or a
/// target section is read as cargo reads it).
fn packages() -> BTreeMap<String, Vec<Dep>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut packages = BTreeMap::new();
    for p in meta["packages"].as_array().unwrap() {
        let deps = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| Dep {
                name: d["name"].as_str().unwrap().to_string(),
                kind: d["kind"].as_str().map(str::to_string),
                features: d["features"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|f| f.as_str().map(str::to_string))
                    .collect(),
            })
            .collect();
        packages.insert(p["name"].as_str().unwrap().to_string(), deps);
    }
    packages
}

/// Dependencies on one floor that the plan draws: the collective stage
/// runs over the cluster stage's store and handshake.
const BESIDE: &[(&str, &str)] = &[("preflight-collective", "preflight-cluster")];

/// Features that exist for the tests, the fuzzers and the rank simulator
/// alone: no dependency of a build turns one on.
const BUILD_ONLY: &[&str] = &["test-hooks", "test-support", "rank-sim", "fuzzing"];

/// docs/design.md draws `src/` and preflight's crates as they are: a line
/// for every top-level module of `src/` (the command line, floor 1), one
/// for every `crates/preflight-*` with its floor, and in each folder's or
/// crate's line the name of every module in it, so that the map a new
/// engineer reads first cannot leave out a room.
#[test]
fn the_design_notes_draw_the_current_layout() {
    let _shared = crate::common::shared();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Drawing { src, mut crates } = drawing(&design());
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root.join("src")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.path().is_dir();
        let key = if is_dir {
            format!("{name}/")
        } else if name.ends_with(".rs") {
            name.clone()
        } else {
            continue;
        };
        let Some((floor, what)) = src.get(&key) else {
            missing.push(format!("src/{key} has no line"));
            continue;
        };
        let root_file = matches!(key.as_str(), "lib.rs" | "main.rs");
        if !root_file && *floor != Some(1) {
            missing.push(format!(
                "src/{key} is drawn on floor {floor:?}: src/ is the command line, floor 1"
            ));
        }
        if is_dir {
            for stem in unnamed(&entry.path(), what) {
                missing.push(format!("src/{key}'s line does not name {stem}"));
            }
        }
    }
    for path in src.keys() {
        let there = root.join("src").join(path.trim_end_matches('/'));
        if !there.exists() {
            missing.push(format!("src/{path} is drawn but not there"));
        }
    }
    for name in our_crates() {
        let Some((floor, what)) = crates.remove(&name) else {
            missing.push(format!("crates/{name}/ has no line"));
            continue;
        };
        if floor.is_none() {
            missing.push(format!("crates/{name}/ is drawn on no floor"));
        }
        for stem in unnamed(&root.join("crates").join(&name).join("src"), &what) {
            missing.push(format!("crates/{name}/'s line does not name {stem}"));
        }
    }
    for name in crates.keys() {
        missing.push(format!("crates/{name}/ is drawn but not there"));
    }
    assert!(
        missing.is_empty(),
        "docs/design.md's layout:\n{}",
        missing.join("\n")
    );
}

/// docs/design.md's table of crates says what each may use, and each
/// crate's Cargo.toml says what it does: the two name the same crates of
/// ours, every one on a floor below (or, where the table draws it, beside)
/// the crate's own, so the drawing cannot drift from what the compiler
/// holds. Only the command line depends on clap.
#[test]
fn the_design_notes_crate_table_is_each_crates_dependencies() {
    let _shared = crate::common::shared();
    let design = design();
    let Drawing { crates, .. } = drawing(&design);
    let packages = packages();
    let ours: Vec<String> = our_crates()
        .iter()
        .map(|n| n.trim_start_matches("preflight-").to_string())
        .collect();
    let mut wrong = Vec::new();
    let mut rows = Vec::new();
    for row in design.lines().filter(|l| l.starts_with("| `preflight")) {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let name = cells[0].split('`').nth(1).unwrap_or_default();
        rows.push(name.to_string());
        // What the row says it uses: our crates by their short names, up
        // to the first parenthesis (a reason, not a crate).
        let uses = cells[2].split('(').next().unwrap_or("");
        let mut drawn: Vec<String> = uses
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| ours.iter().any(|o| o == w))
            .map(str::to_string)
            .collect();
        drawn.sort();
        let deps = &packages[name];
        let normal = || deps.iter().filter(|d| d.kind.is_none());
        let names = |krate: &str| normal().any(|d| d.name == krate);
        let mut depends: Vec<String> = normal()
            .filter_map(|d| d.name.strip_prefix("preflight-"))
            .map(str::to_string)
            .collect();
        depends.sort();
        for d in normal() {
            for f in d
                .features
                .iter()
                .filter(|f| BUILD_ONLY.contains(&f.as_str()))
            {
                wrong.push(format!(
                    "{name}: its dependency on {} turns on `{f}` for every build; that feature is for the tests' builds",
                    d.name
                ));
            }
        }
        if name == "preflight" {
            // The command line: over every floor, clap its own.
            if uses.trim() != "all below" {
                wrong.push(format!("{name}: its row uses {uses:?}, not all below"));
            }
            if !names("clap") {
                wrong.push(format!("{name}: the command line without clap"));
            }
            continue;
        }
        if drawn != depends {
            wrong.push(format!(
                "{name}: docs/design.md draws {drawn:?}, its Cargo.toml depends on {depends:?}"
            ));
        }
        if names("clap") {
            wrong.push(format!(
                "{name}: depends on clap, which belongs to the command line (src/)"
            ));
        }
        let floor_of = |n: &str| crates.get(n).and_then(|(f, _)| *f);
        let own = floor_of(name);
        let table_floor = cells[1].parse::<u8>().ok();
        if own != table_floor {
            wrong.push(format!(
                "{name}: floor {table_floor:?} in the table, {own:?} in the layout"
            ));
        }
        for d in &depends {
            let theirs = floor_of(&format!("preflight-{d}"));
            if theirs < own {
                wrong.push(format!(
                    "{name} (floor {own:?}) depends on preflight-{d} (floor {theirs:?}): a dependency may not point up a floor"
                ));
            }
            let beside = BESIDE.contains(&(name, format!("preflight-{d}").as_str()));
            if theirs == own && !beside {
                wrong.push(format!(
                    "{name} depends on preflight-{d}, on its own floor ({own:?}): crates of one floor keep apart, but for what BESIDE draws"
                ));
            }
        }
    }
    for (name, deps) in &packages {
        if rows.contains(name) {
            continue;
        }
        // The -sys crates and the fuzz crate's like: below every floor.
        for d in deps.iter().filter(|d| d.kind.is_none()) {
            if d.name.starts_with("preflight") || d.name == "clap" {
                wrong.push(format!("{name}: depends on {}", d.name));
            }
        }
    }
    let mut want: Vec<String> = our_crates();
    want.push("preflight".to_string());
    want.sort();
    rows.sort();
    assert_eq!(rows, want, "a row for each of our crates");
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}
