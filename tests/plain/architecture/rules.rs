//! House rules no compiler holds: no file outgrows a reader, causes come
//! from fields and not message text, fault switches and fuzzing entry points
//! exist only in their own builds, every test takes the binary's lock.

use super::*;

/// preflight's own source: `src/`, `tools/` and every `crates/preflight-*/src`.
fn every_source() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = BTreeMap::new();
    read_tree(&root.join("src"), &mut files);
    read_tree(&root.join("tools"), &mut files);
    for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("preflight-")
        {
            read_tree(&entry.path().join("src"), &mut files);
        }
    }
    assert!(files.len() > 100, "read only {} files", files.len());
    files
}

/// The fault switches tests use live in one module that only a build
/// with the `test-hooks` feature compiles: no other file names them, so
/// a release binary holds none.
#[test]
fn fault_switches_exist_only_in_test_builds() {
    let _shared = crate::common::shared();
    let files = every_source();
    let naming: Vec<&String> = files
        .iter()
        .filter(|(_, text)| text.contains("PREFLIGHT_TEST_"))
        .map(|(f, _)| f)
        .collect();
    assert_eq!(naming, ["crates/preflight-ground/src/test_hooks.rs"]);
    let lib = &files["crates/preflight-ground/src/lib.rs"];
    assert!(
        lib.contains("#[cfg(any(test, feature = \"test-hooks\"))]\npub mod test_hooks;"),
        "crates/preflight-ground/src/lib.rs must compile test_hooks only with the feature (or for its own unit test)"
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

/// The fuzz targets' entry points compile only with the `fuzzing` feature,
/// and only the fuzz crate and they name it: no shipped binary holds them.
#[test]
fn fuzzing_entry_points_exist_only_in_fuzz_builds() {
    let _shared = crate::common::shared();
    let files = every_source();
    let lib = &files["src/lib.rs"];
    assert!(
        lib.contains("#[cfg(feature = \"fuzzing\")]\npub mod fuzzing;"),
        "src/lib.rs must compile fuzzing only with the feature"
    );
    // Every entry (`*_for_fuzzing`, the site settings' parser, the
    // checklist's re-emitter) behind the feature, where it is defined.
    let mut entries = 0;
    for (f, text) in &files {
        for (n, line) in text.lines().enumerate() {
            let entry = (line.contains("fn ") && line.contains("_for_fuzzing("))
                || line.contains("fn parse_settings(")
                || line.trim() == "pub mod reemit;";
            if entry {
                entries += 1;
                let gated = text
                    .lines()
                    .take(n)
                    .collect::<Vec<_>>()
                    .iter()
                    .rev()
                    .take(4)
                    .any(|l| l.contains("cfg(") && l.contains("feature = \"fuzzing\")"));
                assert!(
                    gated,
                    "{f}:{}: a fuzzing entry outside cfg(feature = \"fuzzing\")",
                    n + 1
                );
            }
        }
    }
    assert!(entries >= 7, "{entries} fuzzing entries found");
}

/// How long a source file may grow before a reader loses the thread: past
/// it, a file holds several concerns that want modules of their own.
const MAX_LINES: usize = 900;

/// Files allowed past `MAX_LINES`, each with why (none today: the bound
/// is kept by splitting along seams, not by adding here).
const LONG_FILES: &[(&str, &str)] = &[];

/// The source files, tests' among them (fixtures aside), longer than
/// `MAX_LINES` and not excused.
fn too_long(files: &BTreeMap<String, String>) -> Vec<String> {
    files
        .iter()
        .filter(|(f, _)| !f.contains("fixtures/"))
        .filter(|(f, _)| !LONG_FILES.iter().any(|(long, _)| long == f))
        .map(|(f, text)| (f, text.lines().count()))
        .filter(|(_, n)| *n > MAX_LINES)
        .map(|(f, n)| format!("{f}: {n} lines (at most {MAX_LINES}: split it along its seams)"))
        .collect()
}

#[test]
fn no_source_file_outgrows_a_reader() {
    let _shared = crate::common::shared();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = BTreeMap::new();
    read_tree(&root.join("src"), &mut files);
    read_tree(&root.join("tools"), &mut files);
    read_tree(&root.join("tests"), &mut files);
    for dir in std::fs::read_dir(root.join("crates")).expect("crates/") {
        for part in ["src", "tests"] {
            let src = dir.as_ref().expect("entry").path().join(part);
            if src.is_dir() {
                read_tree(&src, &mut files);
            }
        }
    }
    assert!(
        files.keys().any(|f| f.starts_with("crates/nccl-sys/src/"))
            && files.keys().any(|f| f.starts_with("tests/services/")),
        "{:?}",
        files.keys().collect::<Vec<_>>()
    );
    let long = too_long(&files);
    assert!(long.is_empty(), "\n{}", long.join("\n"));
    let mut grown = tree(&[("src/big.rs", "fn x() {}\n")]);
    grown.insert("src/grown.rs".into(), "//\n".repeat(MAX_LINES + 1));
    grown.insert("tests/long.rs".into(), "//\n".repeat(MAX_LINES + 1));
    grown.insert("fixtures/long.rs".into(), "//\n".repeat(MAX_LINES + 1));
    assert_eq!(too_long(&grown).len(), 2, "{:?}", too_long(&grown));
}

/// The integration tests are at most four binaries (each links the whole
/// crate; cargo runs them one after another), each a `tests/NAME/main.rs`
/// over modules, and every helper lives in the one tree `tests/common`,
/// which only those four `main.rs` include by path.
#[test]
fn the_tests_are_four_binaries_over_one_helper_tree() {
    let _shared = crate::common::shared();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut binaries = Vec::new();
    for entry in std::fs::read_dir(root.join("tests")).expect("tests/") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            path.extension().is_none_or(|e| e != "rs"),
            "tests/{name}: a test file of its own is a binary of its own; make it a module of tests/plain, tests/network, tests/collective or tests/services"
        );
        if path.join("main.rs").is_file() {
            binaries.push(name);
        }
    }
    binaries.sort();
    assert_eq!(binaries, ["collective", "network", "plain", "services"]);
    let mut files = BTreeMap::new();
    read_tree(&root.join("tests"), &mut files);
    let mut included = Vec::new();
    for (file, text) in &files {
        for line in text.lines() {
            if line.trim_start().starts_with("#[path") {
                included.push(format!("{file}: {}", line.trim()));
            }
        }
    }
    let expected: Vec<String> = binaries
        .iter()
        .map(|b| format!("tests/{b}/main.rs: #[path = \"../common/mod.rs\"]"))
        .collect();
    assert_eq!(
        included, expected,
        "only each binary's main.rs includes tests/common"
    );
    assert!(
        !root.join("tests/support").exists(),
        "one helper tree: tests/common"
    );
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
/// words: the rules live in preflight-result's `cause.rs` alone, which reads no text,
/// and nothing else sets `caused_by`.
#[test]
fn no_cause_rule_matches_on_message_text() {
    let _shared = crate::common::shared();
    let files = every_source();
    let rules = "crates/preflight-result/src/cause.rs";
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

/// Every test takes the binary's lock at its top (tests/README.md):
/// `serial()` to run alone, `shared()` beside the others, or a helper of
/// its file that takes `serial()`; never `shared()` and such a helper
/// together, which would wait on itself.
#[test]
fn every_test_takes_the_binarys_lock_once() {
    let _shared = crate::common::shared();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = BTreeMap::new();
    read_tree(&root.join("tests"), &mut files);
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (file, source) in files
        .iter()
        .filter(|(f, _)| !f.starts_with("tests/common/"))
    {
        let text = &strip(source);
        // A function's body ends at the first `}` at the start of a line
        // (rustfmt's layout).
        let bodies: Vec<(&str, &str)> = text
            .match_indices("\nfn ")
            .map(|(at, _)| {
                let rest = &text[at + 4..];
                let name = &rest[..rest.find('(').unwrap_or(0)];
                (name, &rest[..rest.find("\n}\n").unwrap_or(rest.len())])
            })
            .collect();
        let serial_helpers: Vec<&str> = bodies
            .iter()
            .filter(|(_, body)| body.contains("serial()"))
            .map(|(name, _)| *name)
            .collect();
        for (at, _) in text.match_indices("#[test]\n") {
            let Some(fn_at) = text[at..].find("\nfn ") else {
                continue;
            };
            let rest = &text[at + fn_at + 4..];
            let name = &rest[..rest.find('(').unwrap_or(0)];
            let body = &rest[..rest.find("\n}\n").unwrap_or(rest.len())];
            seen += 1;
            let takes_serial = body.contains("serial()");
            let takes_shared = body.contains("shared()");
            let via_helper = serial_helpers
                .iter()
                .any(|h| *h != name && body.contains(&format!("{h}(")));
            match (takes_serial, takes_shared, via_helper) {
                (true, false, false) | (false, true, false) | (false, false, true) => {}
                _ => wrong.push(format!(
                    "{file}: {name}: serial {takes_serial}, shared {takes_shared}, through a helper {via_helper}"
                )),
            }
        }
    }
    assert!(seen > 400, "{seen} tests found");
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}
