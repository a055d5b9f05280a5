//! Network checks and the cluster stage: namespace hosts with real
//! firewalls, ranks as real processes on loopback and across hosts, the
//! node leader, signals.
//!
//! One test binary of four (tests/README.md); its modules share tests/common.

#[path = "../common/mod.rs"]
mod common;

mod cluster_leader;
mod cluster_loopback;
mod cluster_netns;
mod firewall;
mod harness;
mod interface;
mod ping;
mod port;
mod shipped;
mod signals;
mod tcp_connect;
