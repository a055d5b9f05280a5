//! The one rule for a test that cannot run on this machine: it says why
//! and passes on a developer's machine, and it fails where
//! PREFLIGHT_REQUIRE_NETNS=1 or PREFLIGHT_REQUIRE_LIBS=1 is set (CI, which
//! installs everything the tests need), where a skip would hide a
//! regression. Every skip in `tests/` and `crates/*/tests/` goes through
//! `skip`; `tests/plain/skips.rs` holds that.

/// The variable that forbids skipping, if one is set to 1.
pub fn required(env: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
    ["PREFLIGHT_REQUIRE_NETNS", "PREFLIGHT_REQUIRE_LIBS"]
        .into_iter()
        .find(|var| env(var).as_deref() == Some("1"))
}

/// Says why this test does nothing here, or fails when skipping is
/// forbidden.
pub fn skip(why: &str) {
    if let Some(var) = required(|k| std::env::var(k).ok()) {
        panic!("{var}=1, and this test cannot run here: {why}");
    }
    eprintln!(
        "skipped: {why} (PREFLIGHT_REQUIRE_NETNS=1 or PREFLIGHT_REQUIRE_LIBS=1 makes this a failure)"
    );
}
