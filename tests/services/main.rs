//! Real services around the job: Slurm (munge, slurmctld, slurmd), Ansible
//! over sshd, Prometheus tools and the webhook, packages, launchers and
//! torch jobs.
//!
//! One test binary of four (tests/README.md); its modules share tests/common.

#[path = "../common/mod.rs"]
mod common;
#[macro_use]
mod torch;

mod ansible;
mod deployed;
mod exporters;
mod packages;
mod slurm;
mod torch_distributed;
