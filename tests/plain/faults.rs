//! Faults around a run rather than in the cluster: the disk under
//! `--output` full, and the checklist file replaced while runs read it.
//! Both with the real binary; the full disk is a real tmpfs of 256 KiB
//! (root; skipped with a reason without it, unless
//! PREFLIGHT_REQUIRE_NETNS=1 makes that a failure).

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

fn check(checklist: &Path, output: Option<&Path>) -> std::process::Output {
    let mut c = Command::new(common::BIN);
    c.args(["check", "--no-shipped", "--checks"])
        .arg(checklist)
        .args(["--format", "json"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    if let Some(o) = output {
        c.arg("--output").arg(o);
    }
    c.output().expect("run preflight")
}

/// A tmpfs mounted for one test, unmounted at drop.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(at: &Path, size: &str) -> Option<Mount> {
        std::fs::create_dir_all(at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Mount(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

const ONE_CHECK: &str =
    "checks:\n  - id: ok.true\n    kind: command\n    area: system\n    argv: [\"true\"]\n";

/// A node whose disk is full when the report is written: the error names
/// the file and the reason, the exit code is 2 (preflight could not do its
/// job: whoever reads that file gets no verdict), the previous report at
/// that path is untouched (the write is a temporary file renamed over it),
/// and no temporary file is left behind.
#[test]
fn a_full_disk_under_output_is_named_and_the_previous_report_kept() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let Some(mount) = Mount::tmpfs(&dir.path().join("full"), "256k") else {
        common::skip_unless_required("cannot mount a tmpfs here (not root?)");
        return;
    };
    let checklist = dir.path().join("checks.yaml");
    std::fs::write(&checklist, ONE_CHECK).unwrap();
    let report = mount.0.join("report.json");
    std::fs::write(&report, "previous report\n").unwrap();
    // Fill the file system to the last block.
    let mut filler = std::fs::File::create(mount.0.join("filler")).unwrap();
    let block = [0u8; 4096];
    while filler
        .write_all(&block)
        .and_then(|()| filler.sync_all())
        .is_ok()
    {}
    drop(filler);

    let start = Instant::now();
    let out = check(&checklist, Some(&report));
    let took = start.elapsed();
    println!("time to verdict with a full disk: {took:?}");
    // 0.01 s in docs/faults.md: a full disk is said at once, never waited on.
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot write the report to {}", report.display()))
            && stderr.contains("No space left on device"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&report).unwrap(),
        "previous report\n"
    );
    let names: Vec<String> = std::fs::read_dir(&mount.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n == "report.json" || n == "filler"),
        "left behind: {names:?}"
    );
}

/// The ids of a report's checks.
fn ids(stdout: &[u8]) -> Vec<String> {
    common::report(&String::from_utf8_lossy(stdout), "")
        .checks
        .iter()
        .map(|c| c.id.clone())
        .collect()
}

fn version(prefix: &str, n: usize) -> String {
    let mut text = String::from("checks:\n");
    for i in 0..n {
        text.push_str(&format!(
            "  - id: {prefix}.c{i}\n    kind: command\n    area: system\n    argv: [\"true\"]\n"
        ));
    }
    text
}

/// The checklist file replaced while runs read it, as configuration
/// management does (a new file renamed over the old): every run sees one
/// whole version, never a mix, whichever it caught. Rewritten in place
/// instead (truncated, then written in two parts), a run may catch a
/// prefix: it then runs a prefix's checks or names the file, line and
/// column of the cut (exit 2); it never panics or hangs.
#[test]
fn a_checklist_replaced_mid_read_is_read_whole_or_refused_with_its_place() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checks.yaml");
    let (a, b) = (version("a", 40), version("b", 25));
    let (ids_a, ids_b): (Vec<String>, Vec<String>) = (
        (0..40).map(|i| format!("a.c{i}")).collect(),
        (0..25).map(|i| format!("b.c{i}")).collect(),
    );
    for in_place in [false, true] {
        std::fs::write(&path, &a).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (stop, path, a, b) = (Arc::clone(&stop), path.clone(), a.clone(), b.clone());
            let temp = dir.path().join(".checks.yaml.new");
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let text = if n.is_multiple_of(2) { &b } else { &a };
                    if in_place {
                        let mut f = std::fs::File::create(&path).unwrap();
                        let cut = text.len() / 2;
                        f.write_all(&text.as_bytes()[..cut]).unwrap();
                        std::thread::yield_now();
                        f.write_all(&text.as_bytes()[cut..]).unwrap();
                    } else {
                        std::fs::write(&temp, text).unwrap();
                        std::fs::rename(&temp, &path).unwrap();
                    }
                    n += 1;
                }
                n
            })
        };
        let (mut seen_a, mut seen_b, mut prefixes, mut refused) = (0, 0, 0, 0);
        for _ in 0..30 {
            let out = check(&path, None);
            let stderr = String::from_utf8_lossy(&out.stderr);
            match out.status.code() {
                Some(0) => {
                    let got = ids(&out.stdout);
                    if got == ids_a {
                        seen_a += 1;
                    } else if got == ids_b {
                        seen_b += 1;
                    } else {
                        assert!(in_place, "a mix of two versions: {got:?}");
                        let prefix_of = |full: &[String]| full.starts_with(&got);
                        assert!(
                            prefix_of(&ids_a) || prefix_of(&ids_b),
                            "neither version nor a prefix of one: {got:?}"
                        );
                        prefixes += 1;
                    }
                }
                Some(2) => {
                    assert!(in_place, "a replaced file was refused: {stderr}");
                    // An empty file caught between truncation and write
                    // says it holds no checks; a cut one names its place.
                    assert!(stderr.contains("checks.yaml"), "{stderr}");
                    refused += 1;
                }
                other => panic!("exit {other:?}: {stderr}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        let writes = writer.join().unwrap();
        println!(
            "{}: {writes} rewrites; runs saw A {seen_a}, B {seen_b}, a prefix {prefixes}, refused {refused}",
            if in_place { "in place" } else { "renamed over" }
        );
        assert!(writes > 30, "the file was hardly rewritten: {writes}");
    }
}
