//! The binary to ship (`tools/release.sh`: dist/preflight) starts on the
//! clusters people have: its highest GLIBC symbol version is 2.17 (RHEL
//! and CentOS 7; Rocky 8 has 2.28, Ubuntu 20.04 2.31), it runs here, and
//! it holds no test fault switch, and SHA256SUMS checks it and its two
//! packages. `.ci/run` builds it before the tests.

use crate::common;

use std::path::Path;
use std::process::Command;

/// `GLIBC_2.17` -> (2, 17).
fn version(tag: &str) -> Option<(u32, u32)> {
    let (major, minor) = tag.strip_prefix("GLIBC_")?.split_once('.')?;
    let minor = minor.split('.').next()?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[test]
fn the_release_binary_needs_glibc_2_17_at_most_and_runs() {
    let _shared = crate::common::shared();
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/preflight");
    if !bin.exists() {
        common::skip_unless_required(
            "dist/preflight is not built: run tools/release.sh (.ci/run does)",
        );
        return;
    }
    let dump = Command::new("objdump")
        .arg("-T")
        .arg(&bin)
        .output()
        .expect("objdump (binutils)");
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let text = String::from_utf8_lossy(&dump.stdout);
    let versions: Vec<(u32, u32)> = text
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(version)
        .collect();
    assert!(
        !versions.is_empty(),
        "no GLIBC symbol versions in {}",
        bin.display()
    );
    let highest = versions.iter().max().unwrap();
    assert!(
        *highest <= (2, 17),
        "dist/preflight needs GLIBC_{}.{}",
        highest.0,
        highest.1
    );
    // A dynamic binary: dlopen of libnccl and libccl needs the loader.
    assert!(
        text.contains("dlopen"),
        "dist/preflight does not use dlopen"
    );

    let out = Command::new(&bin)
        .args(["check", "--format", "json"])
        .output()
        .unwrap();
    let report = common::report_of(&out);
    assert_eq!(report.command, "check");
    assert!(
        matches!(out.status.code(), Some(0 | 1 | 3)),
        "{:?}",
        out.status
    );

    let bytes = std::fs::read(&bin).unwrap();
    assert!(
        !bytes.windows(15).any(|w| w == b"PREFLIGHT_TEST_"),
        "dist/preflight holds a test fault switch"
    );
    // The README's Install step: `sha256sum -c SHA256SUMS` next to the file.
    let sums = Command::new("sha256sum")
        .args(["-c", "SHA256SUMS"])
        .current_dir(bin.parent().unwrap())
        .output()
        .unwrap();
    assert!(
        sums.status.success(),
        "{}{}",
        String::from_utf8_lossy(&sums.stdout),
        String::from_utf8_lossy(&sums.stderr)
    );
    // The binary and its two packages, each checked.
    let checked = String::from_utf8_lossy(&sums.stdout);
    let lines: Vec<&str> = checked.lines().collect();
    assert_eq!(lines.len(), 3, "{checked}");
    assert_eq!(lines[0], "preflight: OK");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        lines.contains(&format!("preflight_{version}_amd64.deb: OK").as_str()),
        "{checked}"
    );
    assert!(
        lines.contains(&format!("preflight-{version}-1.x86_64.rpm: OK").as_str()),
        "{checked}"
    );
}

#[test]
fn glibc_tags_are_read_as_versions() {
    let _shared = crate::common::shared();
    assert_eq!(version("GLIBC_2.17"), Some((2, 17)));
    assert_eq!(version("GLIBC_2.2.5"), Some((2, 2)));
    assert_eq!(version("GLIBC_PRIVATE"), None);
    assert!(version("GLIBC_2.34") > version("GLIBC_2.17"));
}
