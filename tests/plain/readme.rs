//! The README's commands are the ones that work: `cargo run` knows which
//! binary to run, the fresh-machine section shows exactly one command
//! each for running preflight and the tests, and CI (.ci/run) runs those
//! very lines, read from the README, so they cannot drift apart. The
//! launch lines are run by tests/services/deployed.rs and tests/services/slurm.rs.

use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn commands(heading: &str) -> Result<Vec<String>, String> {
    let out = Command::new(format!("{ROOT}/tools/readme-commands.sh"))
        .arg(heading)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("no commands under {heading:?}"));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

#[test]
fn the_fresh_machine_section_shows_one_command_each() {
    let _shared = crate::common::shared();
    assert_eq!(
        commands("Run the preflight on this machine").unwrap(),
        ["dist/preflight run"]
    );
    assert_eq!(commands("Run the tests").unwrap(), ["bash tools/test.sh"]);
    assert!(commands("No such heading").is_err());
}

/// `cargo run` with two binaries in the package needs `default-run`;
/// without it the README's first command fails on a fresh clone.
#[test]
fn cargo_run_runs_preflight() {
    let _shared = crate::common::shared();
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(ROOT)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `cargo metadata`'s JSON, no report: untyped.
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let package = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "preflight")
        .unwrap();
    assert_eq!(package["default_run"], "preflight", "{package:#}");
    let bins = package["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"] == serde_json::json!(["bin"]))
        .count();
    assert!(bins > 1, "default-run matters only with several binaries");
}

/// CI runs the README's lines themselves, not a copy of them.
#[test]
fn ci_runs_the_readme_commands_as_printed() {
    let _shared = crate::common::shared();
    let ci = std::fs::read_to_string(format!("{ROOT}/.ci/run")).unwrap();
    for heading in ["Run the tests", "Run the preflight on this machine"] {
        assert!(
            ci.contains(&format!("one_command \"{heading}\"")),
            ".ci/run does not read {heading:?} from the README:\n{ci}"
        );
    }
    assert!(
        ci.contains("bash -c \"$tests\"") && ci.contains("bash -c \"$first\""),
        "{ci}"
    );
    // The test script is what the README says it is.
    let script = std::fs::read_to_string(format!("{ROOT}/tools/test.sh")).unwrap();
    for step in [
        ". .ci/install",
        "tools/release.sh",
        "cargo test --workspace",
        "fuzz/run.sh",
    ] {
        assert!(script.contains(step), "tools/test.sh lacks {step}");
    }
}

/// The worked example's mistake, as the reference shows it, is what the
/// binary prints for that file today, word for word.
#[test]
fn the_worked_examples_error_is_what_validate_prints() {
    let _shared = crate::common::shared();
    let reference = std::fs::read_to_string(format!("{ROOT}/docs/reference.md")).unwrap();
    let shown = reference
        .lines()
        .find(|l| l.starts_with("error: site.yaml:5:5: "))
        .expect("docs/reference.md shows the worked example's error");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("site.yaml"),
        "checks:\n  - id: site.lustre_mounted\n    kind: file\n    path: /proc/mounts\n    contain: '^\\S+ /lustre lustre '\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_preflight"))
        .args(["validate", "site.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let printed = String::from_utf8_lossy(&out.stderr);
    assert!(
        printed.lines().any(|l| l == shown),
        "docs/reference.md: {shown}\nbinary: {printed}"
    );
}

/// The README is a front door: 400 lines at most, every relative link
/// points at a file that exists, and every document in docs/ is in the
/// index there.
#[test]
fn the_readme_is_short_and_its_links_and_the_docs_index_hold() {
    let _shared = crate::common::shared();
    let readme = std::fs::read_to_string(format!("{ROOT}/README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 400, "README.md has {lines} lines");
    let link = regex::Regex::new(r"\]\(([^)#]+)(#[^)]*)?\)").unwrap();
    for (doc, base) in [
        ("README.md", ROOT.to_string()),
        ("docs/README.md", format!("{ROOT}/docs")),
    ] {
        let text = std::fs::read_to_string(format!("{ROOT}/{doc}")).unwrap();
        for c in link.captures_iter(&text) {
            let target = &c[1];
            if target.starts_with("http") {
                continue;
            }
            assert!(
                std::path::Path::new(&base).join(target).exists(),
                "{doc} links to {target}, which does not exist"
            );
        }
    }
    let index = std::fs::read_to_string(format!("{ROOT}/docs/README.md")).unwrap();
    for entry in std::fs::read_dir(format!("{ROOT}/docs")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "README.md" {
            assert!(
                index.contains(&format!("]({name})")),
                "docs/README.md does not list {name}"
            );
        }
    }
}
