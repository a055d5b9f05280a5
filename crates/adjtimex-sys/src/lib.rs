//! The kernel's clock discipline state from adjtimex(2) in read-only mode
//! (modes = 0): whether the clock is synchronised (STA_UNSYNC), and its
//! maximum and estimated error. No crate we depend on wraps this call
//! safely, so this one does, and the `unsafe` stays here.

// The workspace refuses `unsafe` (Cargo.toml's lints); this crate is
// where it lives, each block saying why it is sound.
#![allow(unsafe_code)]

use std::io;

/// STA_UNSYNC in `status`: nothing disciplines the clock.
pub const STA_UNSYNC: i32 = 0x0040;
/// adjtimex's return value when the clock is not synchronised.
pub const TIME_ERROR: i32 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockState {
    /// The return value: TIME_OK (0) ... TIME_ERROR (5).
    pub state: i32,
    /// The status bits (STA_*).
    pub status: i32,
    /// Maximum error, microseconds.
    pub maxerror_us: i64,
    /// Estimated error, microseconds.
    pub esterror_us: i64,
}

impl ClockState {
    pub fn synchronized(&self) -> bool {
        self.status & STA_UNSYNC == 0 && self.state != TIME_ERROR
    }
}

/// Reads the state without changing anything (unprivileged).
#[cfg(target_os = "linux")]
pub fn read() -> io::Result<ClockState> {
    // SAFETY: timex is a plain C struct of integers, for which all-zero is
    // a valid value; zero `modes` asks the kernel only to fill it in.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    tx.modes = 0;
    // SAFETY: `tx` is a valid, exclusively borrowed timex for the call.
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(ClockState {
        state,
        status: tx.status,
        maxerror_us: tx.maxerror as i64,
        esterror_us: tx.esterror as i64,
    })
}

#[cfg(not(target_os = "linux"))]
pub fn read() -> io::Result<ClockState> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "adjtimex(2) is Linux-only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_machines_clock() {
        let state = read().expect("adjtimex in read-only mode needs no privilege");
        assert!((0..=5).contains(&state.state), "{state:?}");
        assert!(state.maxerror_us >= 0);
    }

    /// Unsynchronised is either of the kernel's two words for it: the
    /// STA_UNSYNC status bit, or the TIME_ERROR clock state.
    #[test]
    fn synchronized_needs_neither_the_unsync_bit_nor_time_error() {
        let clock = |state, status| ClockState {
            state,
            status,
            maxerror_us: 0,
            esterror_us: 0,
        };
        // TIME_OK (0) with PLL (0x0001) on: synchronised.
        assert!(clock(0, 0x0001).synchronized());
        assert!(!clock(0, 0x0001 | STA_UNSYNC).synchronized());
        assert!(!clock(TIME_ERROR, 0x0001).synchronized());
        assert!(!clock(TIME_ERROR, STA_UNSYNC).synchronized());
        // TIME_INS (1), a leap second announced, is still synchronised.
        assert!(clock(1, 0).synchronized());
    }
}
