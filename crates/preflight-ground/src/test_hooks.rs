//! Fault switches for tests, compiled only with the `test-hooks` feature
//! (which the tests turn on through the package's dev-dependency on
//! itself): a release build cannot be told to hang, corrupt its data or
//! lie about its clock or version, and holds none of these names.
//!
//! - `PREFLIGHT_TEST_COLL_HANG=RANK:BYTES`: that rank stops taking part in
//!   collective steps above BYTES (a hang at one size);
//!   `PREFLIGHT_TEST_COLL_HANG_MARKER=PATH`: it writes PATH as it stops, so
//!   that a test acts on the hang itself, never on a guess of its time.
//! - `PREFLIGHT_TEST_COLL_CORRUPT=RANK:BYTES`: that rank corrupts one value
//!   of its contribution from BYTES on.
//! - `PREFLIGHT_TEST_VERSION=V`: the tool version this rank reports (one
//!   node "runs another preflight").
//! - `PREFLIGHT_TEST_CLOCK_OFFSET_MS=N`: added to this process's wall-clock
//!   readings (a skewed node, without touching the machine's clock).
//! - `PREFLIGHT_TEST_INTERRUPT_DELAY_MS=N`: after a signal, the report is
//!   written N ms late (an orderly end that takes too long: the hard
//!   limit, or a second signal, must end the process).
//! - `PREFLIGHT_TEST_CHECKIN_MARKER=PATH`: the rank writes PATH once its
//!   check-in has gone out to rank 0 (a test stops it then).
//! - `PREFLIGHT_TEST_MESH_DIAL_DELAY_MS=RANK:MS`: that rank waits MS before
//!   dialling its TCP backend's peers, with its own sockets already
//!   announced (a slow rank, and a window in which others may connect).
//! - `PREFLIGHT_TEST_REPORT_FETCH_DELAY_MS=RANK:MS`: that rank waits MS
//!   before it fetches rank 0's collective report (a rank that a loaded
//!   node runs late at the end of the stage), writing
//!   `PREFLIGHT_TEST_COLL_HANG_MARKER` as it starts to wait.
//! - `PREFLIGHT_TEST_INIT_FLOOR_MS=N`: a library backend's init may take
//!   twice the step deadline and at least N ms, in place of 30 s (a test
//!   of init's deadline need not wait out the floor).

pub const COLL_HANG: &str = "PREFLIGHT_TEST_COLL_HANG";
pub const COLL_HANG_MARKER: &str = "PREFLIGHT_TEST_COLL_HANG_MARKER";
pub const COLL_CORRUPT: &str = "PREFLIGHT_TEST_COLL_CORRUPT";
pub const VERSION: &str = "PREFLIGHT_TEST_VERSION";
pub const CLOCK_OFFSET_MS: &str = "PREFLIGHT_TEST_CLOCK_OFFSET_MS";
pub const INTERRUPT_DELAY_MS: &str = "PREFLIGHT_TEST_INTERRUPT_DELAY_MS";
pub const MESH_DIAL_DELAY_MS: &str = "PREFLIGHT_TEST_MESH_DIAL_DELAY_MS";
pub const CHECKIN_MARKER: &str = "PREFLIGHT_TEST_CHECKIN_MARKER";
pub const REPORT_FETCH_DELAY_MS: &str = "PREFLIGHT_TEST_REPORT_FETCH_DELAY_MS";
pub const INIT_FLOOR_MS: &str = "PREFLIGHT_TEST_INIT_FLOOR_MS";

/// `RANK:BYTES` for `rank`, from `var`; anything else is no hook.
pub fn rank_bytes(get: &dyn Fn(&str) -> Option<String>, var: &str, rank: u32) -> Option<usize> {
    let v = get(var)?;
    let (r, b) = v.split_once(':')?;
    (r.trim().parse::<u32>().ok()? == rank).then_some(())?;
    b.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_apply_to_their_rank_only() {
        let env = |k: &str| (k == COLL_HANG).then(|| "2:65536".to_string());
        assert_eq!(rank_bytes(&env, COLL_HANG, 2), Some(65536));
        assert_eq!(rank_bytes(&env, COLL_HANG, 1), None);
        assert_eq!(rank_bytes(&env, COLL_CORRUPT, 2), None);
    }
}
