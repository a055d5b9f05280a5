//! The one rule for skips (tests/common/skip.rs): where PREFLIGHT_REQUIRE_*
//! is set, a test that cannot run fails; and every skip in the suite goes
//! through that rule, none prints its own "skipped" and returns.

use crate::common::skip;

use std::path::{Path, PathBuf};

#[test]
fn skipping_is_forbidden_by_either_variable_set_to_1() {
    let _shared = crate::common::shared();
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(skip::required(env(&[])), None);
    assert_eq!(
        skip::required(env(&[("PREFLIGHT_REQUIRE_LIBS", "0")])),
        None
    );
    assert_eq!(
        skip::required(env(&[("PREFLIGHT_REQUIRE_LIBS", "1")])),
        Some("PREFLIGHT_REQUIRE_LIBS")
    );
    assert_eq!(
        skip::required(env(&[("PREFLIGHT_REQUIRE_NETNS", "1")])),
        Some("PREFLIGHT_REQUIRE_NETNS")
    );
}

/// The real thing, in a child process with the variable set: the skip
/// fails it.
#[test]
fn a_skip_under_the_variable_fails_the_test() {
    // The child runs under its parent's lock.
    if std::env::var_os("SKIPS_CHILD").is_some() {
        skip::skip("staged by tests/plain/skips.rs");
        return;
    }
    let _shared = crate::common::shared();
    for (var, value, fails) in [
        ("PREFLIGHT_REQUIRE_LIBS", "1", true),
        ("PREFLIGHT_REQUIRE_NETNS", "1", true),
        ("PREFLIGHT_REQUIRE_LIBS", "0", false),
    ] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "skips::a_skip_under_the_variable_fails_the_test",
                "--nocapture",
            ])
            .env_remove("PREFLIGHT_REQUIRE_LIBS")
            .env_remove("PREFLIGHT_REQUIRE_NETNS")
            .env("SKIPS_CHILD", "1")
            .env(var, value)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert_eq!(!out.status.success(), fails, "{var}={value}: {text}");
        if fails {
            assert!(
                text.contains(&format!(
                    "{var}=1, and this test cannot run here: staged by tests/plain/skips.rs"
                )),
                "{text}"
            );
        } else {
            assert!(
                text.contains("skipped: staged by tests/plain/skips.rs"),
                "{text}"
            );
        }
    }
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
        if entry.is_dir() {
            sources(&entry, out);
        } else if entry.extension().is_some_and(|e| e == "rs") {
            out.push(entry);
        }
    }
}

/// A unit test in `src/` that returns early does so through the rule too
/// (`preflight_ground::testing::test_skip`, which fails under the CI variables): no silent
/// return in any test module.
#[test]
fn every_early_return_in_a_unit_test_goes_through_the_rule() {
    let _shared = crate::common::shared();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    for krate in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = krate.unwrap().path().join("src");
        if src.is_dir() {
            sources(&src, &mut files);
        }
    }
    assert!(files.len() > 50, "{files:?}");
    let mut silent = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let Some(tests) = lines.iter().position(|l| l.contains("#[cfg(test)]")) else {
            continue;
        };
        for (n, line) in lines.iter().enumerate().skip(tests) {
            if line.trim() != "return;" {
                continue;
            }
            checked += 1;
            let before = &lines[n.saturating_sub(3)..n];
            if !before.iter().any(|l| l.contains("test_skip(")) {
                silent.push(format!("{}:{}", file.display(), n + 1));
            }
        }
    }
    assert!(checked >= 4, "the lint found no early return to check");
    assert!(
        silent.is_empty(),
        "unit tests that return early without testing::test_skip:\n{}",
        silent.join("\n")
    );
}

/// No test file prints its own skip: the words a hand-made skip uses are
/// found nowhere but in the rule itself.
#[test]
fn every_skip_goes_through_the_rule() {
    let _shared = crate::common::shared();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("tests"), &mut files);
    for krate in std::fs::read_dir(root.join("crates")).unwrap() {
        let tests = krate.unwrap().path().join("tests");
        if tests.is_dir() {
            sources(&tests, &mut files);
        }
    }
    assert!(files.len() > 20, "{files:?}");
    let patterns = [
        "eprintln!(\"skip",
        "eprintln!(\"SKIP",
        "eprintln!(\"not applicable",
        "println!(\"skip",
    ];
    let mut found = Vec::new();
    for file in &files {
        if file.ends_with("common/skip.rs") || file.ends_with("plain/skips.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if patterns.iter().any(|p| line.contains(p)) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "skips that do not go through tests/common/skip.rs:\n{}",
        found.join("\n")
    );
}
