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
//! (never both: the write would wait on its own read); a test binary a
//! test runs again takes neither, its parent holds the lock for it. A
//! test that panicked holding it poisons nothing, and a test that waits
//! for its turn past `TURN` fails rather than hang.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

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

/// How long a test waits for its turn before it fails, naming the lock:
/// far past all the tests' time here (about 12 minutes side by side),
/// well inside CI's limit. A wait that never ends (a test holding a
/// place while it waits on another that waits on it) is a hang.
const TURN: Duration = Duration::from_secs(30 * 60);

/// A descriptor of the lock file's own, locked: flock belongs to the
/// open file, so two threads of one process each need theirs.
fn machine(exclusive: bool) -> Flock<File> {
    let how = if exclusive {
        FlockArg::LockExclusiveNonblock
    } else {
        FlockArg::LockSharedNonblock
    };
    let path = path();
    let mut file = open(&path);
    let start = Instant::now();
    loop {
        match Flock::lock(file, how) {
            Ok(held) => return held,
            Err((back, Errno::EWOULDBLOCK)) => file = back,
            Err((_, e)) => panic!("the tests' lock {}: {e}", path.display()),
        }
        wait_turn(&path, start);
    }
}

/// One of the places (`LOCK.slotN`, N below the CPU count), exclusive:
/// the first one free.
fn slot() -> Flock<File> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut places: Vec<(PathBuf, Option<File>)> = (0..cpus)
        .map(|i| {
            let path = slot_path(i);
            let file = open(&path);
            (path, Some(file))
        })
        .collect();
    let start = Instant::now();
    loop {
        for (path, file) in &mut places {
            let Some(f) = file.take() else { continue };
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(held) => return held,
                Err((back, Errno::EWOULDBLOCK)) => *file = Some(back),
                Err((_, e)) => panic!("the tests' lock {}: {e}", path.display()),
            }
        }
        wait_turn(&places[0].0, start);
    }
}

/// A short pause between tries (flock's own wait has no deadline), or
/// the failure once the turn is past.
fn wait_turn(path: &Path, start: Instant) {
    assert!(
        start.elapsed() < TURN,
        "the tests' lock {}: not free after {TURN:?}; a test holding it waits on this one, or never ends",
        path.display()
    );
    std::thread::sleep(Duration::from_millis(10));
}

/// Place `i` (`LOCK.slotI`).
pub fn slot_path(i: usize) -> PathBuf {
    let mut name = path().into_os_string();
    name.push(format!(".slot{i}"));
    PathBuf::from(name)
}

/// Opened to be locked. An ordinary user may only read a file root made,
/// which is enough to lock it.
fn open(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .or_else(|_| File::open(path))
        .unwrap_or_else(|e| panic!("the tests' lock {}: {e}", path.display()))
}
