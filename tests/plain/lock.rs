//! The tests' lock (tests/common/lock.rs) holds across processes, as
//! tools/test.sh needs when it runs the binaries side by side: another
//! process, here flock(1) as the script's own lane for the unit tests
//! uses it, finds the lock taken.

use crate::common::lock;

use std::process::Command;

/// Whether flock(1) could take `path` at once (`--shared` or not).
fn free(path: &std::path::Path, shared: bool) -> bool {
    let mut c = Command::new("flock");
    if shared {
        c.arg("--shared");
    }
    let status = c
        .args(["--nonblock", "--conflict-exit-code", "75"])
        .arg(path)
        .arg("true")
        .status()
        .expect("flock (util-linux)");
    match status.code() {
        Some(0) => true,
        Some(75) => false,
        other => panic!("flock {}: exit {other:?}", path.display()),
    }
}

#[test]
fn a_serial_test_holds_the_lock_against_every_other_process() {
    let _serial = crate::common::serial();
    assert!(!free(&lock::path(), true));
}

#[test]
fn a_shared_test_lets_others_share_and_holds_a_place() {
    let _shared = crate::common::shared();
    assert!(free(&lock::path(), true));
    assert!(!free(&lock::path(), false));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let places = (0..cpus)
        .filter(|i| !free(&lock::slot_path(*i), false))
        .count();
    assert!(places >= 1, "no place of {cpus} is held");
}
