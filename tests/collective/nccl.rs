//! The NCCL backend with the real libnccl.so.2 (from the nvidia-nccl-cu12
//! wheel) on a node without a GPU, through the real binary in node mode
//! (`--nproc-per-node 2`, plain processes on loopback): the library found
//! through each search path (`--nccl-lib`, PREFLIGHT_NCCL_LIB, the loader
//! via LD_LIBRARY_PATH, Python site-packages via PYTHONPATH and via a .pth
//! file), its version and path in the JSON report, the no-GPU skip and the
//! exit codes with NCCL optional and required, and a bad path that says
//! what was tried.
//!
//! The library comes from PREFLIGHT_TEST_NCCL_LIB or the cache that
//! tests/setup/collective-libs.sh fills; without it each test prints why
//! and returns, unless PREFLIGHT_REQUIRE_LIBS=1 (CI), where that fails.
//! On a machine with a CUDA driver the no-GPU expectations do not hold:
//! those tests say so and return (tests/gpu/ covers that machine).

use crate::common;
use crate::common::cluster;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cluster::{Outcome, local, run_args};

const NO_GPU: &str = "no CUDA device (libcuda.so.1 not found)";
const MARGIN: Duration = Duration::from_secs(90);

use crate::common::serial;

fn skip(why: &str) {
    common::skip_unless_required(why);
}

/// The cached libnccl.so.2, or `None` after saying why.
fn test_lib() -> Option<PathBuf> {
    common::cached_lib("PREFLIGHT_TEST_NCCL_LIB", "nccl/lib/libnccl.so.2")
}

fn in_ld_cache(soname: &str) -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("{soname} ")))
        .unwrap_or(false)
}

/// The library, on a node where the no-GPU answer is the right one.
fn lib_without_gpu() -> Option<PathBuf> {
    let lib = test_lib()?;
    if in_ld_cache("libcuda.so.1") || Path::new("/dev/nvidiactl").exists() {
        // Not a missing library: this machine has a driver, and the no-GPU
        // answer would be wrong here.
        skip(
            "this machine has a CUDA driver, where the no-GPU answer would be wrong; run tests/gpu/ instead",
        );
        return None;
    }
    Some(lib)
}

/// Two ranks in node mode with exactly `env` (plus PATH).
fn node(extra: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut args = run_args("30s");
    args.extend(["--nproc-per-node", "2"].iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    local("node", &args, env).finish(MARGIN)
}

/// The no-GPU skip with `lib` named as the library loaded.
fn assert_skip_with(o: &Outcome, lib: &Path) {
    let report = o.report();
    let b = report.backend("nccl");
    assert!(!b.available, "{b:#?}");
    assert_eq!(b.reason, NO_GPU, "{b:#?}");
    assert_eq!(b.verdict, "skip", "{b:#?}");
    let library = b.library.as_deref().unwrap_or_else(|| panic!("{b:#?}"));
    let version = library
        .strip_prefix("NCCL ")
        .and_then(|r| r.split_once(" at "))
        .map(|(v, _)| v)
        .unwrap_or_else(|| panic!("{library}"));
    let parts: Vec<&str> = version.split('.').collect();
    assert!(
        parts.len() == 3 && parts[0] == "2" && parts.iter().all(|p| p.parse::<u32>().is_ok()),
        "version {version} in {library}"
    );
    assert!(
        library.ends_with(&format!(" at {}", lib.display())),
        "{library} should name {}",
        lib.display()
    );
    // No init was tried without a device.
    assert!(b.init_ms.is_none(), "{b:#?}");
    assert!(b.ops.is_empty(), "{b:#?}");
    // TCP ran as usual beside it.
    assert_eq!(o.status("collective.tcp"), "pass");
}

fn exit(o: &Outcome, code: i32) {
    assert_eq!(o.code, code, "{}\n{}", o.stdout, o.stderr);
}

#[test]
fn nccl_lib_flag_loads_it_and_a_required_nccl_without_gpu_fails() {
    let _s = serial();
    let Some(lib) = lib_without_gpu() else { return };
    let l = lib.display().to_string();
    let o = node(&["--backends", "tcp,nccl", "--nccl-lib", &l], &[]);
    exit(&o, 1);
    assert_skip_with(&o, &lib);
    let msg = o.message("collective.nccl");
    assert!(msg.starts_with("fail"), "{msg}");
    assert!(msg.contains("required") && msg.contains(NO_GPU), "{msg}");
}

#[test]
fn preflight_nccl_lib_loads_it_and_an_optional_nccl_skips() {
    let _s = serial();
    let Some(lib) = lib_without_gpu() else { return };
    let l = lib.display().to_string();
    let o = node(&["--backends", "auto"], &[("PREFLIGHT_NCCL_LIB", &l)]);
    exit(&o, 0);
    assert_skip_with(&o, &lib);
    // The skip names the library it would have used.
    let msg = o.message("collective.nccl");
    assert!(
        msg.starts_with(&format!("skip nccl: {NO_GPU} (NCCL 2."))
            && msg.ends_with(&format!(" at {l})")),
        "{msg}"
    );
}

#[test]
fn default_backends_leave_nccl_optional() {
    let _s = serial();
    let Some(lib) = lib_without_gpu() else { return };
    let l = lib.display().to_string();
    let o = node(&[], &[("PREFLIGHT_NCCL_LIB", &l)]);
    exit(&o, 0);
    assert_skip_with(&o, &lib);
    assert_eq!(o.status("collective.nccl"), "skip");
}

#[test]
fn the_loader_finds_it_through_ld_library_path() {
    let _s = serial();
    let Some(lib) = lib_without_gpu() else { return };
    if in_ld_cache("libnccl.so.2") {
        skip("the system has its own libnccl.so.2, which the loader may pick");
        return;
    }
    // The loader's choice is reported as the file it mapped, links resolved.
    let real = std::fs::canonicalize(&lib).unwrap();
    let dir = real.parent().unwrap().display().to_string();
    let o = node(&["--backends", "auto"], &[("LD_LIBRARY_PATH", &dir)]);
    exit(&o, 0);
    assert_skip_with(&o, &real);
}

/// `<root>/nvidia/nccl/lib/libnccl.so.2` as pip lays it out, a link to the
/// cached library (hundreds of MB: never copied).
fn site_packages(lib: &Path) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("nvidia/nccl/lib");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(lib, dir.join("libnccl.so.2")).unwrap();
    root
}

/// The library, where the site-packages search is what will find it: no
/// system NCCL ahead of it, and a python3 to ask.
fn lib_for_site_packages() -> Option<PathBuf> {
    let lib = lib_without_gpu()?;
    if in_ld_cache("libnccl.so.2") {
        skip("the system has its own libnccl.so.2, which the loader takes first");
        return None;
    }
    let python = Command::new("python3")
        .args(["-c", "import site"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !python {
        skip("python3 is not usable here: the site-packages search asks it");
        return None;
    }
    Some(lib)
}

#[test]
fn python_site_packages_on_pythonpath() {
    let _s = serial();
    let Some(lib) = lib_for_site_packages() else {
        return;
    };
    let root = site_packages(&lib);
    let r = root.path().display().to_string();
    let o = node(&["--backends", "auto"], &[("PYTHONPATH", &r)]);
    exit(&o, 0);
    assert_skip_with(&o, &root.path().join("nvidia/nccl/lib/libnccl.so.2"));
}

#[test]
fn python_site_packages_through_a_pth_file() {
    let _s = serial();
    let Some(lib) = lib_for_site_packages() else {
        return;
    };
    // A .pth file in the user site dir of a private HOME puts the tree on
    // python3's path, as a venv or a conda env does for its packages.
    let home = tempfile::tempdir().unwrap();
    let h = home.path().display().to_string();
    let user_site = Command::new("python3")
        .args(["-c", "import site; print(site.getusersitepackages())"])
        .env("HOME", &h)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap();
    assert!(user_site.starts_with(&h), "{user_site}");
    std::fs::create_dir_all(&user_site).unwrap();
    let root = site_packages(&lib);
    std::fs::write(
        Path::new(&user_site).join("preflight-test.pth"),
        format!("{}\n", root.path().display()),
    )
    .unwrap();
    let o = node(&["--backends", "auto"], &[("HOME", &h)]);
    exit(&o, 0);
    assert_skip_with(&o, &root.path().join("nvidia/nccl/lib/libnccl.so.2"));
}

#[test]
fn a_bad_library_path_says_what_was_tried() {
    let _s = serial();
    if lib_without_gpu().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("missing/libnccl.so.2");
    let b = bad.display().to_string();

    let o = node(&["--backends", "tcp,nccl", "--nccl-lib", &b], &[]);
    exit(&o, 1);
    let report = o.report();
    let n = report.backend("nccl");
    let reason = &n.reason;
    assert!(reason.starts_with(NO_GPU), "{reason}");
    assert!(
        reason.contains(&format!("{b} (explicit path)"))
            && reason.contains("No such file or directory"),
        "{reason}"
    );
    assert!(n.library.is_none(), "{n:#?}");
    assert!(o.message("collective.nccl").contains(&b));

    // The environment variable, with NCCL optional: still said, exit 0.
    let o = node(&["--backends", "auto"], &[("PREFLIGHT_NCCL_LIB", &b)]);
    exit(&o, 0);
    let report = o.report();
    let reason = &report.backend("nccl").reason;
    assert!(
        reason.contains(&format!("{b} (PREFLIGHT_NCCL_LIB)")),
        "{reason}"
    );
    // A library that is not NCCL at all: named, with what is wrong.
    let not_nccl = dir.path().join("libnotnccl.so");
    std::fs::write(&not_nccl, b"not an ELF file").unwrap();
    let p = not_nccl.display().to_string();
    let o = node(&["--backends", "tcp,nccl", "--nccl-lib", &p], &[]);
    exit(&o, 1);
    let report = o.report();
    let reason = &report.backend("nccl").reason;
    assert!(reason.contains(&format!("{p} (explicit path)")), "{reason}");
}
