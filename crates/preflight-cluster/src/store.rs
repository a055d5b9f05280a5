//! A small key-value store served by the master over the rendezvous
//! connections, for what ranks must exchange before a collective can start
//! (listening addresses, NCCL or oneCCL unique ids).
//!
//! API, on an authenticated connection (see `client::connect`):
//! - `set(conn, key, value, deadline)`: stores `value`, replacing any old one;
//! - `get(conn, key, wait, deadline)`: the value, waiting up to `wait` for
//!   another rank to set it; `Ok(None)` when it was not set in time;
//! - `set_large` and `get_large`: the same for a value of any size up to
//!   the store's capacity, in parts (rank 0's collective report grows with
//!   the world).
//!
//! Keys and values are strings (encode binary ids as hex); a key is at most
//! 256 bytes and a value at most 64 KiB, so one rank cannot exhaust the
//! master. Every call has a deadline; the master answers every get by its
//! `wait` at the latest.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::protocol::{self, Msg};

/// What a store call can fail with: the connection, or the store saying no.
pub use super::protocol::FrameError;

/// The connection the store is reached over: a rank's sealed link to
/// rank 0.
pub use super::sealed::Channel;

/// Rank 0's list of each rank's host (JSON, indexed by rank), written by
/// the server with the verdict for the ranks that run the collective stage.
pub const HOSTS_KEY: &str = "cluster/hosts";

pub const MAX_KEY: usize = 256;
pub const MAX_VALUE: usize = 64 << 10;
/// Total bytes the master keeps: with the per-item limits, a bound.
const MAX_TOTAL: usize = 64 << 20;

#[derive(Default)]
pub struct Store {
    /// The values, and their keys' and values' bytes in all.
    map: Mutex<(HashMap<String, String>, usize)>,
    changed: Notify,
}

/// The rank whose key this is: the number that ends it (`coll/result/3`,
/// `coll/result/3#0`, `coll/tcp/addr/3`); rank 0's for the keys of the
/// whole job (`coll/report`, `coll/nccl/plan`). Only that rank may write it.
pub fn owner(key: &str) -> u32 {
    let base = key.split_once('#').map_or(key, |(base, _)| base);
    base.rsplit('/')
        .next()
        .and_then(|last| last.parse().ok())
        .unwrap_or(0)
}

/// Set by rank 0's server, empty, when the connection that writes
/// `rank`'s keys ends: the rank can no longer answer through the store.
pub fn gone_key(rank: u32) -> String {
    format!("conn/gone/{rank}")
}

impl Store {
    /// Keys are written once: the same value again is accepted (a retry),
    /// another value is refused, so no peer can replace what a rank
    /// published.
    pub fn set(&self, key: String, value: String) -> Result<(), String> {
        if key.len() > MAX_KEY || value.len() > MAX_VALUE {
            return Err(format!(
                "store: key or value too large (limits {MAX_KEY} and {MAX_VALUE} bytes)"
            ));
        }
        let mut guard = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let (map, total) = &mut *guard;
        match map.get(&key) {
            Some(old) if *old == value => return Ok(()),
            Some(_) => {
                return Err(format!(
                    "store: `{key}` is already set, and keys are written once"
                ));
            }
            None => {}
        }
        if *total + key.len() + value.len() > MAX_TOTAL {
            return Err("store: full".into());
        }
        *total += key.len() + value.len();
        map.insert(key, value);
        drop(guard);
        self.changed.notify_waiters();
        Ok(())
    }

    /// Server side: what `set_large` stores, for a value rank 0's server
    /// publishes itself.
    pub fn set_large(&self, key: &str, value: &str) -> Result<(), String> {
        let parts = parts(value);
        // Refused before any part is written: a value the store cannot hold
        // must not fill it with parts of no use.
        if parts.len() > MAX_PARTS || value.len() > MAX_TOTAL {
            return Err(too_large(key, value));
        }
        for (i, part) in parts.iter().enumerate() {
            self.set(part_key(key, i), (*part).to_string())?;
        }
        self.set(key.to_string(), parts_header(parts.len(), value.len()))
    }

    pub fn peek(&self, key: &str) -> Option<String> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .get(key)
            .cloned()
    }

    /// The value, waiting until `deadline` for it to be set.
    pub async fn get(&self, key: &str, deadline: Instant) -> Option<String> {
        loop {
            // Register before looking, so a set between the look and the
            // wait still wakes us.
            let notified = self.changed.notified();
            if let Some(v) = self.peek(key) {
                return Some(v);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.peek(key);
            }
        }
    }
}

/// Client side: store `value` under `key`.
pub async fn set<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut S,
    key: &str,
    value: &str,
    deadline: Instant,
) -> Result<(), FrameError> {
    let msg = Msg::StoreSet {
        key: key.into(),
        value: value.into(),
    };
    protocol::write(conn, &msg, deadline).await?;
    match protocol::read(conn, deadline).await? {
        Msg::StoreValue { .. } => Ok(()),
        Msg::Rejected { reason, .. } => Err(FrameError::Refused(reason)),
        Msg::Interrupted { notice } => Err(FrameError::Interrupted(notice)),
        _ => Err(FrameError::Body("unexpected answer to a store set".into())),
    }
}

/// Client side: the value of `key`, waiting up to `wait` for it.
pub async fn get<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut S,
    key: &str,
    wait: Duration,
    deadline: Instant,
) -> Result<Option<String>, FrameError> {
    let msg = Msg::StoreGet {
        key: key.into(),
        wait_ms: wait.as_millis() as u64,
    };
    protocol::write(conn, &msg, deadline).await?;
    match protocol::read(conn, deadline).await? {
        Msg::StoreValue { value, .. } => Ok(value),
        Msg::Rejected { reason, .. } => Err(FrameError::Refused(reason)),
        Msg::Interrupted { notice } => Err(FrameError::Interrupted(notice)),
        _ => Err(FrameError::Body("unexpected answer to a store get".into())),
    }
}

/// Rank 0's word that a signal interrupted it, if it has said so. Rank 0
/// pushes it to every connection when the signal comes, unasked: it is
/// read here from what already arrived, without a request (so that asking
/// costs rank 0 nothing at any scale, and works after rank 0 has exited:
/// the frame stays readable before the connection's end). Only between
/// requests, when nothing else can be on the way.
pub async fn rank0_interrupted<S: AsyncRead + Unpin>(
    conn: &mut S,
) -> Option<Box<preflight_result::report::Interrupted>> {
    let deadline = Instant::now() + Duration::from_millis(20);
    match super::protocol::read(conn, deadline).await {
        Ok(Msg::Interrupted { notice }) => Some(notice),
        _ => None,
    }
}

/// The most parts one large value may have: the store's whole capacity in
/// items of the largest size, so a header naming more is refused unread.
const MAX_PARTS: usize = MAX_TOTAL / MAX_VALUE + 1;

/// The key of part `i` of a large value.
fn part_key(key: &str, i: usize) -> String {
    format!("{key}#{i}")
}

fn parts_header(count: usize, len: usize) -> String {
    format!("parts:{count}:{len}")
}

fn too_large(key: &str, value: &str) -> String {
    format!(
        "store: {key} is {} bytes, more than the store holds ({MAX_TOTAL})",
        value.len()
    )
}

/// The value split into parts of at most `MAX_VALUE` bytes, each ending on
/// a character boundary.
fn parts(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = value;
    while !rest.is_empty() {
        let mut end = rest.len().min(MAX_VALUE);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

/// Client side: stores a value of any size up to the store's capacity. The
/// parts go first, under `KEY#0`, `KEY#1`, ...; then `KEY` itself, as
/// `parts:N:LEN`, so a reader that finds `KEY` finds every part in place.
/// A part the store refuses (full) is an error, never a silent loss.
pub async fn set_large<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut S,
    key: &str,
    value: &str,
    deadline: Instant,
) -> Result<(), FrameError> {
    let parts = parts(value);
    // Refused before any part is written: a value the store cannot hold
    // must not fill it with parts of no use.
    if parts.len() > MAX_PARTS || value.len() > MAX_TOTAL {
        return Err(FrameError::Refused(too_large(key, value)));
    }
    for (i, part) in parts.iter().enumerate() {
        set(conn, &part_key(key, i), part, deadline).await?;
    }
    set(conn, key, &parts_header(parts.len(), value.len()), deadline).await
}

/// Client side: a value stored with `set_large`, waiting up to `wait` for
/// it. A missing or malformed part is an error naming it.
pub async fn get_large<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut S,
    key: &str,
    wait: Duration,
    deadline: Instant,
) -> Result<Option<String>, FrameError> {
    let Some(header) = get(conn, key, wait, deadline).await? else {
        return Ok(None);
    };
    let bad = || FrameError::Refused(format!("store: {key}: `{header}` is not a parts header"));
    let mut fields = header.strip_prefix("parts:").ok_or_else(bad)?.split(':');
    let count: usize = fields.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    let len: usize = fields.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    if count > MAX_PARTS || len > MAX_TOTAL || fields.next().is_some() {
        return Err(bad());
    }
    let mut value = String::with_capacity(len);
    for i in 0..count {
        let part = get(conn, &part_key(key, i), Duration::ZERO, deadline)
            .await?
            .ok_or_else(|| {
                FrameError::Refused(format!("store: {key}: part {i} of {count} is missing"))
            })?;
        value.push_str(&part);
        if value.len() > len {
            break;
        }
    }
    if value.len() != len {
        return Err(FrameError::Refused(format!(
            "store: {key}: {} bytes in its parts, {len} announced",
            value.len()
        )));
    }
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn parts_end_on_character_boundaries_and_rebuild_the_value() {
        for len in [
            0,
            1,
            MAX_VALUE - 1,
            MAX_VALUE,
            MAX_VALUE + 1,
            3 * MAX_VALUE + 7,
        ] {
            // A 3-byte character straddles every part boundary somewhere.
            let value: String = "aé€".chars().cycle().take(len).collect();
            let p = parts(&value);
            assert!(p.iter().all(|x| !x.is_empty() && x.len() <= MAX_VALUE));
            assert_eq!(p.concat(), value, "{len}");
        }
    }

    #[test]
    fn get_waits_for_a_set_and_gives_up_at_its_deadline() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = Arc::new(Store::default());
            let s2 = Arc::clone(&store);
            let waiter = tokio::spawn(async move {
                s2.get("nccl-id", Instant::now() + Duration::from_secs(2))
                    .await
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
            store.set("nccl-id".into(), "abcd".into()).unwrap();
            assert_eq!(waiter.await.unwrap().as_deref(), Some("abcd"));
            let none = store
                .get("other", Instant::now() + Duration::from_millis(30))
                .await;
            assert_eq!(none, None);
            assert!(store.set("k".into(), "x".repeat(MAX_VALUE + 1)).is_err());
            // The key limit: at it, accepted; one byte over, refused.
            assert!(store.set("k".repeat(MAX_KEY), "v".into()).is_ok());
            let e = store.set("k".repeat(MAX_KEY + 1), "v".into()).unwrap_err();
            assert!(
                e.contains("key or value too large (limits 256 and 65536 bytes)"),
                "{e}"
            );
            assert_eq!(owner("coll/result/12#3"), 12);
            assert_eq!(owner("coll/tcp/addr/7"), 7);
            assert_eq!(owner("coll/report"), 0);
            assert_eq!(owner("coll/report#4"), 0);
        });
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Text of any length up to a few parts, of 1- to 4-byte characters,
    /// so that part boundaries fall inside characters everywhere.
    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(vec!['a', 'é', '€', '𝄞']), 0..80_000)
            .prop_map(|c| c.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Any value up to the store's bound goes in as parts no larger
        /// than a value may be, each ending on a character, and comes out
        /// whole: rank 0's stored side and a reader's rebuild agree.
        #[test]
        fn any_value_round_trips_through_parts(value in text()) {
            let store = Store::default();
            store.set_large("coll/report", &value).unwrap();
            let header = store.peek("coll/report").unwrap();
            let count: usize = header.split(':').nth(1).unwrap().parse().unwrap();
            let mut rebuilt = String::new();
            for i in 0..count {
                let part = store.peek(&part_key("coll/report", i)).unwrap();
                prop_assert!(!part.is_empty() && part.len() <= MAX_VALUE);
                rebuilt.push_str(&part);
            }
            prop_assert_eq!(header, parts_header(count, value.len()));
            prop_assert_eq!(rebuilt, value);
        }

        /// Over the bound: a named error, at once, and nothing stored.
        #[test]
        fn a_value_over_the_bound_is_a_named_error(extra in 1usize..4096) {
            let store = Store::default();
            let value = "z".repeat(MAX_TOTAL + extra);
            let e = store.set_large("huge", &value).unwrap_err();
            prop_assert!(e.contains("more than the store holds"), "{}", e);
            prop_assert!(store.peek("huge").is_none());
            prop_assert!(store.peek("huge#0").is_none());
        }
    }
}
