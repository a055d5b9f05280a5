//! The benchmarks cannot rot unseen: every script in bench/ runs once in
//! CI's short mode (bench/ci.sh, which .ci/run calls), and every script
//! bench/RESULTS.md names exists.

use std::path::Path;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Sourced by the others, not run on their own.
const LIBRARIES: &[&str] = &["timing.sh", "rounds.sh", "binary.sh", "ci.sh"];

#[test]
fn every_bench_script_runs_in_ci() {
    let _shared = crate::common::shared();
    let ci = std::fs::read_to_string(repo().join("bench/ci.sh")).unwrap();
    let mut scripts: Vec<String> = std::fs::read_dir(repo().join("bench"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sh") && !LIBRARIES.contains(&n.as_str()))
        .collect();
    scripts.sort();
    assert!(scripts.len() >= 10, "{scripts:?}");
    for s in &scripts {
        assert!(
            ci.lines()
                .any(|l| l.starts_with("short ") && l.contains(&format!("bash bench/{s}"))),
            "bench/{s} is not run by bench/ci.sh"
        );
    }
    // CI runs the README's test command, tools/test.sh.
    let test = std::fs::read_to_string(repo().join("tools/test.sh")).unwrap();
    assert!(
        test.contains("bash bench/ci.sh"),
        "tools/test.sh does not run bench/ci.sh"
    );
}

#[test]
fn every_script_the_results_name_exists() {
    let _shared = crate::common::shared();
    let results = std::fs::read_to_string(repo().join("bench/RESULTS.md")).unwrap();
    let mut named = 0;
    for (at, _) in results.match_indices("bench/") {
        let rest = &results[at..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "/._-".contains(c)))
            .unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches('.');
        if path.ends_with(".sh") || path.ends_with(".py") || path.ends_with(".yaml") {
            named += 1;
            assert!(
                repo().join(path).exists(),
                "bench/RESULTS.md names {path}, which is not there"
            );
        }
    }
    assert!(named > 10, "{named}");
}

/// A script that compiles against MPI installs the header as well as the
/// compiler: Debian's openmpi-bin brings mpicc but not mpi.h, which
/// libopenmpi-dev does, so the check is a compile of the header, not a
/// look for the command.
#[test]
fn a_script_that_compiles_installs_what_it_compiles_with() {
    let _shared = crate::common::shared();
    let mut compiling = 0;
    for entry in std::fs::read_dir(repo().join("bench")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        if !name.ends_with(".sh") || !text.contains("mpicc -O") {
            continue;
        }
        compiling += 1;
        let probe = text
            .lines()
            .find(|l| l.contains("#include <mpi.h>"))
            .unwrap_or_else(|| panic!("bench/{name} compiles with mpicc but never asks for mpi.h"));
        assert!(
            probe.contains("mpicc -E") && probe.contains("libopenmpi-dev"),
            "bench/{name}: {probe}"
        );
        assert!(
            !text.contains("command -v mpicc"),
            "bench/{name}: mpicc on the PATH does not mean mpi.h is there"
        );
    }
    assert!(compiling >= 2, "{compiling}");
}
