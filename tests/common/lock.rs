//! The tests' one lock, held in two places. A test that measures time or
//! loads the machine (collective runs, torch jobs, Slurm, signals, starved
//! hosts, 2,048 simulated ranks) takes `serial()` and runs alone; every
//! other test takes `shared()` and runs beside the others that do, as many
//! at once as the machine has CPUs. On two cores, tests side by side would
//! measure each other, and more shared tests than cores slow each other
//! past their own deadlines.
//!
//! Within a binary a read-write lock keeps its threads apart; across the
//! binaries, which tools/test.sh runs side by side, locks on files (flock:
//! let go by the kernel when their holder ends, however it ends) keep the
//! processes apart: the lock file itself, shared or exclusive, and one
//! slot file of as many as the CPUs, exclusive, for each shared test. The
//! file lock favours no waiter: while shared tests keep coming a serial
//! one waits, so the shared tests of every binary run together first and
//! the serial ones one after another once they are done, the order that
//! takes the least time. A test takes one of the two, once, at its top
//! (never both: the write would wait on its own read). A test that
//! panicked holding it poisons nothing.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

static BINARY: RwLock<()> = RwLock::new(());

/// Held for a test that runs alone. The file is let go before the
/// binary's lock (fields drop in order).
pub struct Serial {
    _machine: Flock<File>,
    _binary: RwLockWriteGuard<'static, ()>,
}

/// Held for a test that runs beside others.
pub struct Shared {
    _slot: Flock<File>,
    _machine: Flock<File>,
    _binary: RwLockReadGuard<'static, ()>,
}

pub fn serial() -> Serial {
    let binary = BINARY.write().unwrap_or_else(|p| p.into_inner());
    Serial {
        _machine: machine(true),
        _binary: binary,
    }
}

pub fn shared() -> Shared {
    let binary = BINARY.read().unwrap_or_else(|p| p.into_inner());
    let machine = machine(false);
    Shared {
        _slot: slot(),
        _machine: machine,
        _binary: binary,
    }
}

/// PREFLIGHT_TEST_LOCK (tools/test.sh sets it, and holds it and slot 0
/// for the unit tests it runs beside these binaries), else one file in the
/// temporary directory: every checkout on the machine shares it, as
/// their tests would share its cores.
pub fn path() -> PathBuf {
    std::env::var_os("PREFLIGHT_TEST_LOCK")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("preflight-tests.lock"))
}

/// A descriptor of the lock file's own, locked: flock belongs to the
/// open file, so two threads of one process each need theirs.
fn machine(exclusive: bool) -> Flock<File> {
    let how = if exclusive {
        FlockArg::LockExclusive
    } else {
        FlockArg::LockShared
    };
    locked(path(), how)
}

/// One of the slots (`LOCK.slotN`, N below the CPU count), exclusive: the
/// first free one, else the one this thread waits its turn on.
fn slot() -> Flock<File> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for i in 0..cpus {
        let path = slot_path(i);
        match Flock::lock(open(&path), FlockArg::LockExclusiveNonblock) {
            Ok(held) => return held,
            Err((_, Errno::EWOULDBLOCK)) => {}
            Err((_, e)) => panic!("the tests' lock {}: {e}", path.display()),
        }
    }
    locked(slot_path(waiter() % cpus), FlockArg::LockExclusive)
}

fn locked(path: PathBuf, how: FlockArg) -> Flock<File> {
    Flock::lock(open(&path), how)
        .unwrap_or_else(|(_, e)| panic!("the tests' lock {}: {e}", path.display()))
}

/// Place `i` (`LOCK.slotI`).
pub fn slot_path(i: usize) -> PathBuf {
    let mut name = path().into_os_string();
    name.push(format!(".slot{i}"));
    PathBuf::from(name)
}

/// Spreads the waiters of every process over the slots.
fn waiter() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    std::process::id() as usize + N.fetch_add(1, Ordering::Relaxed)
}

/// Opened to be locked. An ordinary user may only read a file root made,
/// which is enough to lock it.
fn open(path: &std::path::Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .or_else(|_| File::open(path))
        .unwrap_or_else(|e| panic!("the tests' lock {}: {e}", path.display()))
}
