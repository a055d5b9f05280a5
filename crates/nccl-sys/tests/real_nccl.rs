//! The real libnccl.so.2 (from the nvidia-nccl-cu12 wheel) found through
//! every search path, its version and unique id, and the no-GPU path.
//!
//! The library comes from PREFLIGHT_TEST_NCCL_LIB or the cache that
//! tests/setup/collective-libs.sh fills; without it the tests say why and
//! return, unless PREFLIGHT_REQUIRE_LIBS=1 (CI), where that is a failure.
//! Paths that depend on the process environment at start (LD_LIBRARY_PATH,
//! PYTHONPATH) run in a re-executed copy of this test binary.

#[path = "../../../tests/common/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nccl_sys::{CudaSearch, CudaStatus, Error, Nccl, NcclSearch, Source, probe};

const MODE_ENV: &str = "NCCL_SYS_TEST_MODE";

fn test_lib() -> Option<PathBuf> {
    let cache = std::env::var_os("PREFLIGHT_LIB_CACHE")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || PathBuf::from("/var/cache/preflight-test-libs"),
            PathBuf::from,
        );
    let path = std::env::var_os("PREFLIGHT_TEST_NCCL_LIB")
        .filter(|v| !v.is_empty())
        .map_or_else(|| cache.join("nccl/lib/libnccl.so.2"), PathBuf::from);
    if path.exists() {
        return Some(path);
    }
    let why = format!(
        "{} not found (set PREFLIGHT_TEST_NCCL_LIB or run tests/setup/collective-libs.sh)",
        path.display()
    );
    skip::skip(&why);
    None
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nccl-sys-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A pip-style tree `<root>/nvidia/nccl/lib/libnccl.so.2` linking to the
/// cached library (474 MB: never copied).
fn fake_site_packages(tag: &str, lib: &Path) -> PathBuf {
    let root = temp_dir(tag);
    let dir = root.join("nvidia/nccl/lib");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(lib, dir.join("libnccl.so.2")).unwrap();
    root
}

/// Runs one mode of `worker` in a fresh process with extra environment.
fn run_worker(mode: &str, env: &[(&str, &Path)]) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        "worker",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(MODE_ENV, mode)
    .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run worker");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "worker {mode} failed:\n{text}");
    text
}

#[test]
fn explicit_path_loads_and_reports_the_version() {
    let Some(lib) = test_lib() else { return };
    let nccl = Nccl::open_path(&lib).unwrap_or_else(|e| panic!("{e}"));
    let v = nccl.version();
    assert_eq!(v.major, 2, "{v}");
    assert!(v.minor >= 14, "{v}");
    assert_eq!(nccl.path(), lib.display().to_string());
    let loaded = nccl.report().loaded().expect("an attempt that loaded");
    assert_eq!(loaded.source, Source::Explicit);
    assert!(nccl.supports_nonblocking());
    println!("NCCL {v} at {}", nccl.path());
}

#[test]
fn a_unique_id_is_obtained_without_a_gpu() {
    let Some(lib) = test_lib() else { return };
    let nccl = Nccl::open_path(&lib).unwrap_or_else(|e| panic!("{e}"));
    let id = nccl.unique_id().unwrap_or_else(|e| panic!("{e}"));
    assert!(id.as_bytes().iter().any(|b| *b != 0), "an all-zero id");
}

#[test]
fn found_by_soname_through_ld_library_path() {
    let Some(lib) = test_lib() else { return };
    let dir = lib.parent().unwrap();
    let text = run_worker("soname", &[("LD_LIBRARY_PATH", dir)]);
    let want = format!("LOADED {} ", lib.display());
    assert!(
        text.contains(&want) && text.contains("via system loader"),
        "{text}"
    );
}

#[test]
fn found_in_site_packages_reported_by_python() {
    let Some(lib) = test_lib() else { return };
    if Command::new("python3").arg("-V").output().is_err() {
        skip::skip("no python3 to ask for site-packages");
        return;
    }
    let root = fake_site_packages("py", &lib);
    // PYTHONPATH puts the fake dir on sys.path, which the search reads.
    let text = run_worker("python", &[("PYTHONPATH", &root)]);
    let _ = std::fs::remove_dir_all(&root);
    let want = format!("LOADED {}/nvidia/nccl/lib/libnccl.so.2 ", root.display());
    assert!(
        text.contains(&want) && text.contains("via python site-packages"),
        "{text}"
    );
}

#[test]
fn found_in_a_site_packages_dir_given_as_a_root() {
    let Some(lib) = test_lib() else { return };
    let root = fake_site_packages("root", &lib);
    let search = NcclSearch {
        site_dirs: vec![root.clone()],
        ..NcclSearch::default()
    };
    let nccl = Nccl::search(&search).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        nccl.path(),
        root.join("nvidia/nccl/lib/libnccl.so.2")
            .display()
            .to_string()
    );
    assert_eq!(nccl.report().loaded().unwrap().source, Source::SitePackages);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn nothing_found_lists_every_place_tried() {
    let empty = temp_dir("empty");
    let search = NcclSearch {
        site_dirs: vec![empty.clone()],
        python: Some("/nonexistent/python3".into()),
        ..NcclSearch::default()
    };
    let err = Nccl::search(&search).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::NotFound { .. }), "{text}");
    assert!(text.contains("/nonexistent/python3 not run"), "{text}");
    assert!(
        text.contains("no nvidia/nccl/lib/libnccl.so.2 under any python site-packages"),
        "{text}"
    );
    let err = Nccl::open_path(Path::new("/nonexistent/libnccl.so.2"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/nonexistent/libnccl.so.2 (explicit path): ") && err.contains("No such file"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&empty);
}

/// The probe decides before any collective call. On a machine with a CUDA
/// driver this test has nothing to check and says so.
#[test]
fn probe_without_a_driver_says_no_cuda_device() {
    let Some(lib) = test_lib() else { return };
    let nccl_search = NcclSearch {
        explicit: Some(lib.clone()),
        ..NcclSearch::default()
    };
    let p = probe(&CudaSearch::from_env(None), &nccl_search);
    if !matches!(p.cuda, CudaStatus::NotFound { .. }) {
        skip::skip(&format!(
            "this machine has a CUDA driver ({p}); run tests/gpu/ instead"
        ));
        return;
    }
    assert_eq!(p.to_string(), "no CUDA device (libcuda.so.1 not found)");
    assert!(!p.available());
    // NCCL itself loaded: the verdict comes from the device side.
    assert_eq!(p.nccl.as_ref().expect("nccl found").version.major, 2);
}

/// Without a GPU, init fails at once with ncclGetLastError's text: not a
/// hang and not a panic. Run on a thread under a deadline so a regression
/// to a hang fails the test instead of stalling CI.
#[test]
fn init_without_a_gpu_is_an_error_with_the_last_error_text() {
    let Some(lib) = test_lib() else { return };
    if !matches!(
        probe(&CudaSearch::from_env(None), &NcclSearch::default()).cuda,
        CudaStatus::NotFound { .. }
    ) {
        skip::skip("this machine has a CUDA driver; run tests/gpu/ instead");
        return;
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = (|| -> Result<(String, String), Error> {
            let nccl = Nccl::open_path(&lib)?;
            let id = nccl.unique_id()?;
            let blocking = nccl.init_rank(1, &id, 0).map(|_| ()).unwrap_err();
            let nonblocking = match nccl.init_rank_nonblocking(1, &id, 0) {
                Err(e) => e,
                Ok(comm) => comm
                    .wait_ready(Instant::now() + Duration::from_secs(20))
                    .unwrap_err(),
            };
            Ok((blocking.to_string(), nonblocking.to_string()))
        })();
        let _ = tx.send(result.map_err(|e| e.to_string()));
    });
    let start = Instant::now();
    let (blocking, nonblocking) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("NCCL init hung without a GPU")
        .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "blocking: {blocking}\nnon-blocking: {nonblocking}\n({:?})",
        start.elapsed()
    );
    assert!(
        blocking.starts_with("ncclCommInitRank failed: "),
        "{blocking}"
    );
    assert!(blocking.contains("(ncclResult 1)"), "{blocking}");
    assert!(
        blocking.contains("Cuda failure"),
        "no ncclGetLastError text: {blocking}"
    );
    assert!(nonblocking.contains("(ncclResult 1)"), "{nonblocking}");
    assert!(nonblocking.contains("Cuda failure"), "{nonblocking}");
}

/// Not a test: the re-executed side of the tests above, which run this
/// binary again with `worker --exact --ignored` and the mode set. Ignored
/// in a normal run, so it is listed as what it is instead of passing.
#[test]
#[ignore = "a helper the other tests re-execute, not a test of its own"]
fn worker() {
    let Ok(mode) = std::env::var(MODE_ENV) else {
        return;
    };
    let search = match mode.as_str() {
        "soname" => NcclSearch {
            loader: true,
            ..NcclSearch::default()
        },
        "python" => NcclSearch {
            python: Some("python3".into()),
            ..NcclSearch::default()
        },
        other => panic!("unknown mode {other}"),
    };
    match Nccl::search(&search) {
        Ok(n) => {
            let via = n
                .report()
                .loaded()
                .map(|a| a.source.to_string())
                .unwrap_or_default();
            println!("LOADED {} {} via {via}", n.path(), n.version());
        }
        Err(e) => {
            eprintln!("NOT LOADED: {e}");
            std::process::exit(3);
        }
    }
}
