//! For unit tests only (the `test-support` feature, which the crates'
//! dev-dependencies turn on): never in a shipped binary.

/// A unit test that cannot run on this machine says so, and fails where
/// CI requires every test to run (PREFLIGHT_REQUIRE_LIBS or
/// PREFLIGHT_REQUIRE_NETNS set to 1), as tests/common/skip.rs does for
/// the integration tests; tests/plain/skips.rs holds every early return in a
/// unit test to it.
pub fn test_skip(why: &str) {
    for var in ["PREFLIGHT_REQUIRE_LIBS", "PREFLIGHT_REQUIRE_NETNS"] {
        if std::env::var(var).is_ok_and(|v| v == "1") {
            panic!("{var}=1, and this test cannot run here: {why}");
        }
    }
    eprintln!("skipped: {why}");
}
