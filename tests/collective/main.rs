//! The collective stage: TCP over loopback and namespace hosts, NCCL over
//! its CPU stand-in and the real libnccl, oneCCL on CPU.
//!
//! One test binary of four (tests/README.md); its modules share tests/common.

#[path = "../common/mod.rs"]
mod common;

mod gpu_copies;
mod loopback;
mod nccl;
mod netns;
mod oneccl;
mod standin;
