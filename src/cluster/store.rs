//! A small key-value store served by the master over the rendezvous
//! connections, for what ranks must exchange before a collective can start
//! (listening addresses, NCCL or oneCCL unique ids).
//!
//! API, on an authenticated connection (see `rendezvous::connect`):
//! - `set(conn, key, value, deadline)`: stores `value`, replacing any old one;
//! - `get(conn, key, wait, deadline)`: the value, waiting up to `wait` for
//!   another rank to set it; `Ok(None)` when it was not set in time.
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

use super::protocol::{self, FrameError, Msg};

pub const MAX_KEY: usize = 256;
pub const MAX_VALUE: usize = 64 << 10;
/// Total bytes the master keeps: with the per-item limits, a bound.
const MAX_TOTAL: usize = 64 << 20;

#[derive(Default)]
pub struct Store {
    map: Mutex<HashMap<String, String>>,
    changed: Notify,
}

impl Store {
    pub fn set(&self, key: String, value: String) -> Result<(), String> {
        if key.len() > MAX_KEY || value.len() > MAX_VALUE {
            return Err(format!(
                "store: key or value too large (limits {MAX_KEY} and {MAX_VALUE} bytes)"
            ));
        }
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
        if total + key.len() + value.len() > MAX_TOTAL {
            return Err("store: full".into());
        }
        map.insert(key, value);
        drop(map);
        self.changed.notify_waiters();
        Ok(())
    }

    pub fn peek(&self, key: &str) -> Option<String> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
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
// The collective stages (next issues) are the callers; tests use it now.
#[allow(dead_code)]
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
        Msg::Rejected { reason } => Err(FrameError::Body(reason)),
        _ => Err(FrameError::Body("unexpected answer to a store set".into())),
    }
}

/// Client side: the value of `key`, waiting up to `wait` for it.
#[allow(dead_code)]
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
        _ => Err(FrameError::Body("unexpected answer to a store get".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
        });
    }
}
