//! Prints what nccl-sys finds on this node, without any collective call:
//!
//!   probe [--nccl-lib PATH] [--cuda-lib PATH]
//!
//! The probe line, then every place each search tried. Exit 0 when devices
//! and NCCL are both available, 2 otherwise.

use std::path::PathBuf;

use nccl_sys::{CudaSearch, CudaStatus, NcclSearch, probe};

fn main() {
    let mut nccl_lib: Option<PathBuf> = None;
    let mut cuda_lib: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let target = match a.as_str() {
            "--nccl-lib" => &mut nccl_lib,
            "--cuda-lib" => &mut cuda_lib,
            other => {
                eprintln!("probe: unknown argument {other}");
                std::process::exit(1);
            }
        };
        let Some(v) = args.next() else {
            eprintln!("probe: {a} needs a path");
            std::process::exit(1);
        };
        *target = Some(PathBuf::from(v));
    }
    let p = probe(
        &CudaSearch::from_env(cuda_lib.as_deref()),
        &NcclSearch::from_env(nccl_lib.as_deref()),
    );
    println!("{p}");
    match &p.cuda {
        CudaStatus::NotFound { report } => println!("cuda search: {report}"),
        CudaStatus::Unusable { path, .. }
        | CudaStatus::NoDevices { path, .. }
        | CudaStatus::Devices { path, .. } => {
            println!("cuda: {path}")
        }
    }
    match &p.nccl {
        Ok(n) => println!("nccl: {} {} ({})", n.version, n.path, n.report),
        Err(e) => println!("nccl: {e}"),
    }
    std::process::exit(if p.available() { 0 } else { 2 });
}
