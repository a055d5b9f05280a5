//! The libraries the NCCL backend's tests load: the CPU stand-in for
//! libcuda.so.1 and libnccl.so.2 (tests/standin/standin.c), built here once
//! per test process with the machine's C compiler; or, on a machine with
//! GPUs (tests/gpu/nccl-standin-suite.sh), the real ones named by
//! PREFLIGHT_GPU_CUDA_LIB and PREFLIGHT_GPU_NCCL_LIB, where the tests that
//! need the stand-in's fault switches say so and return.
//!
//! The stand-in is compiled against the real nccl.h when the test cache
//! has it (tests/setup/collective-libs.sh extracts it from the
//! nvidia-nccl-cu12 wheel), so that every NCCL function it defines is held
//! to NCCL's own prototype; PREFLIGHT_REQUIRE_LIBS=1 (CI) requires that.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub struct Libs {
    pub cuda: PathBuf,
    pub nccl: PathBuf,
    /// The stand-in, whose fault switches work; false for real libraries.
    pub standin: bool,
    /// How many ranks the devices take (the stand-in's: as many as asked).
    pub max_ranks: u32,
}

fn real() -> Option<Libs> {
    let cuda = std::env::var_os("PREFLIGHT_GPU_CUDA_LIB").filter(|v| !v.is_empty())?;
    let nccl = std::env::var_os("PREFLIGHT_GPU_NCCL_LIB").filter(|v| !v.is_empty())?;
    let gpus = Command::new("nvidia-smi")
        .args(["--query-gpu=index", "--format=csv,noheader"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count() as u32)
        .unwrap_or(1);
    Some(Libs {
        cuda: cuda.into(),
        nccl: nccl.into(),
        standin: false,
        max_ranks: gpus.max(1),
    })
}

fn build() -> Result<Libs, String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = repo.join("tests/standin/standin.c");
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("standin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let lib = dir.join("libstandin.so");
    let mut cc = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()));
    cc.args([
        "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread",
    ])
    .arg("-fvisibility=hidden")
    .arg("-o")
    .arg(&lib)
    .arg(&src);
    let header = super::lib_cache().join("nccl/include/nccl.h");
    if header.exists() {
        cc.arg("-DSTANDIN_NCCL_H")
            .arg("-I")
            .arg(repo.join("tests/standin/cuda-stub"))
            .arg("-I")
            .arg(header.parent().unwrap());
    } else {
        super::skip_unless_required(&format!(
            "{} not found (tests/setup/collective-libs.sh extracts it): the stand-in is built without NCCL's own prototypes to check it against",
            header.display()
        ));
    }
    let out = cc
        .output()
        .map_err(|e| format!("cannot run the C compiler: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the stand-in does not compile:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // One library under both names: NCCL then sees the driver's memory.
    let (cuda, nccl) = (dir.join("libcuda.so.1"), dir.join("libnccl.so.2"));
    for link in [&cuda, &nccl] {
        let _ = std::fs::remove_file(link);
        std::os::unix::fs::symlink("libstandin.so", link)
            .map_err(|e| format!("{}: {e}", link.display()))?;
    }
    Ok(Libs {
        cuda,
        nccl,
        standin: true,
        max_ranks: 4,
    })
}

/// The libraries, or `None` after saying why (a failure under
/// PREFLIGHT_REQUIRE_LIBS=1 when the stand-in cannot be built).
pub fn libs() -> Option<&'static Libs> {
    static LIBS: OnceLock<Result<Libs, String>> = OnceLock::new();
    match LIBS.get_or_init(|| real().map_or_else(build, Ok)) {
        Ok(l) => Some(l),
        Err(why) => {
            super::skip_unless_required(why);
            None
        }
    }
}

/// The stand-in alone: its fault switches are what the test needs.
pub fn standin() -> Option<&'static Libs> {
    let l = libs()?;
    if !l.standin {
        super::skip_unless_required(
            "this test needs the stand-in's fault switches, which the real library has not",
        );
        return None;
    }
    Some(l)
}
