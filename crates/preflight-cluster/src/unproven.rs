//! Connections to rank 0 that have not proven the job secret yet. They are
//! bounded in all and per source address, like any server's, but a full
//! table does not turn the newcomer away while strangers sit in it: the
//! oldest connection that has had its chance (`GRACE`, many round trips of
//! an honest handshake) is closed to make room. A stranger who opens
//! handshakes and never finishes them (a valid hello, then nothing), from
//! the ranks' own address or from many, therefore holds slots only until
//! someone else needs them, and the job's ranks, whose handshakes finish
//! within the grace, always get through.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How long an unproven connection keeps its slot against a newcomer. An
/// honest handshake is two round trips and two HMACs: far less, on any
/// network a job runs over.
pub const GRACE: Duration = Duration::from_millis(250);

pub struct Unproven {
    inner: Mutex<Inner>,
    all: usize,
    per_source: usize,
    /// Signalled whenever a slot is given up.
    freed: Notify,
    guesses: Guesses,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// By admission order: the first is the oldest.
    conns: BTreeMap<u64, Entry>,
}

struct Entry {
    ip: IpAddr,
    since: Instant,
    evict: Arc<Notify>,
}

/// One admitted connection's place; given up when dropped.
pub struct Slot {
    owner: Arc<Unproven>,
    id: u64,
    ip: IpAddr,
    /// Signalled when a newcomer takes this slot: the connection closes.
    pub evicted: Arc<Notify>,
}

impl Slot {
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The wrong-proof budgets of every source.
    pub fn guesses(&self) -> &Guesses {
        &self.owner.guesses
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let removed = self.owner.lock().conns.remove(&self.id).is_some();
        if removed {
            self.owner.freed.notify_one();
        }
    }
}

impl Unproven {
    pub fn new(all: usize, per_source: usize) -> Arc<Unproven> {
        Arc::new(Unproven {
            inner: Mutex::new(Inner::default()),
            all: all.max(1),
            per_source: per_source.max(1),
            freed: Notify::new(),
            guesses: Guesses::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until one more connection may be accepted: a slot is free,
    /// or the oldest connection past its grace has been closed for it.
    /// Until then the next connection waits in the kernel's accept queue
    /// (a burst of thousands of ranks is served as handshakes finish).
    pub async fn room(&self) {
        loop {
            let wait = {
                let mut inner = self.lock();
                if inner.conns.len() < self.all {
                    return;
                }
                if inner.evict_oldest(|_| true, GRACE) {
                    return;
                }
                inner
                    .conns
                    .values()
                    .next()
                    .map_or(GRACE, |e| GRACE.saturating_sub(e.since.elapsed()))
            };
            tokio::select! {
                _ = self.freed.notified() => {}
                _ = tokio::time::sleep(wait.max(Duration::from_millis(1))) => {}
            }
        }
    }

    /// A slot for a connection from `ip`; where that address already
    /// holds its share, its oldest connection gives its slot up. A
    /// newcomer is never refused for the ones before it: a stranger on
    /// the ranks' own address (a shared node) who reopens handshakes as
    /// fast as they close would otherwise hold the address's every slot
    /// against them; this way it must open its whole share within one
    /// honest handshake, a round trip, to close one.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Slot {
        let mut inner = self.lock();
        let from_ip = inner.conns.values().filter(|e| e.ip == ip).count();
        if from_ip >= self.per_source {
            inner.evict_oldest(|e| e.ip == ip, Duration::ZERO);
        }
        let id = inner.next;
        inner.next += 1;
        let evict = Arc::new(Notify::new());
        inner.conns.insert(
            id,
            Entry {
                ip,
                since: Instant::now(),
                evict: Arc::clone(&evict),
            },
        );
        Slot {
            owner: Arc::clone(self),
            id,
            ip,
            evicted: evict,
        }
    }
}

impl Inner {
    /// Closes the oldest connection that `pick` allows and that is at
    /// least `age` old; whether there was one.
    fn evict_oldest(&mut self, pick: impl Fn(&Entry) -> bool, age: Duration) -> bool {
        let Some(id) = self
            .conns
            .iter()
            .find(|(_, e)| pick(e) && e.since.elapsed() >= age)
            .map(|(id, _)| *id)
        else {
            return false;
        };
        if let Some(e) = self.conns.remove(&id) {
            // Stored if the connection is not waiting yet: it closes at
            // its next step.
            e.evict.notify_one();
        }
        true
    }
}

/// Failed proofs a source may make at once, and per second after that.
pub const GUESS_BURST: f64 = 16.0;
pub const GUESSES_PER_SECOND: f64 = 10.0;
/// Sources remembered at most; beyond it, the ones whose budget is whole
/// again are forgotten first.
const GUESS_SOURCES: usize = 4096;

/// The budget of wrong proofs per source address. A job's own ranks never
/// make one; a stranger who guesses the secret online makes nothing else.
/// A source that has spent its budget waits before its next proof is
/// checked: about `GUESSES_PER_SECOND` guesses a second, however many
/// connections it opens (6,400 a second on loopback, unthrottled).
#[derive(Default)]
pub struct Guesses {
    budget: Mutex<std::collections::HashMap<IpAddr, (f64, Instant)>>,
}

impl Guesses {
    fn left_in(map: &std::collections::HashMap<IpAddr, (f64, Instant)>, ip: IpAddr) -> f64 {
        map.get(&ip).map_or(GUESS_BURST, |(left, at)| {
            (left + at.elapsed().as_secs_f64() * GUESSES_PER_SECOND).min(GUESS_BURST)
        })
    }

    /// Waits until `ip` may have one more proof checked: at most
    /// `(1 + GUESS_BURST) / GUESSES_PER_SECOND` (1.7 s), since the debt
    /// stops at `GUESS_BURST`, so a job's own rank on the same address as
    /// a guesser (a shared node) is slowed, never locked out: its
    /// handshake has 5 s.
    pub async fn pace(&self, ip: IpAddr) {
        let left = {
            let map = self.budget.lock().unwrap_or_else(|e| e.into_inner());
            Self::left_in(&map, ip)
        };
        if left < 1.0 {
            let wait = (1.0 - left) / GUESSES_PER_SECOND;
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }

    /// `ip` made a wrong proof.
    pub fn failed(&self, ip: IpAddr) {
        let mut map = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        let left = (Self::left_in(&map, ip) - 1.0).max(-GUESS_BURST);
        if map.len() >= GUESS_SOURCES && !map.contains_key(&ip) {
            map.retain(|_, (l, at)| {
                *l + at.elapsed().as_secs_f64() * GUESSES_PER_SECOND < GUESS_BURST
            });
            if map.len() >= GUESS_SOURCES {
                return;
            }
        }
        map.insert(ip, (left, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(f)
    }

    /// A stranger holding every slot of an address: a newcomer takes the
    /// oldest one's place, and other addresses are not affected.
    /// A source that keeps proving the wrong secret is slowed to a few
    /// guesses a second after its burst; another source is not.
    #[test]
    fn wrong_proofs_are_paced_per_source() {
        block_on(async {
            let g = Guesses::default();
            let ip: IpAddr = "10.0.0.9".parse().unwrap();
            for _ in 0..GUESS_BURST as usize {
                let start = Instant::now();
                g.pace(ip).await;
                assert_eq!(start.elapsed(), Duration::ZERO);
                g.failed(ip);
            }
            let start = Instant::now();
            g.pace(ip).await;
            assert!(
                start.elapsed() >= Duration::from_millis(99),
                "{:?}",
                start.elapsed()
            );
            let start = Instant::now();
            g.pace("10.0.0.10".parse().unwrap()).await;
            assert_eq!(start.elapsed(), Duration::ZERO);
            // However many guesses pile up, the wait stays bounded.
            for _ in 0..1000 {
                g.failed(ip);
            }
            let start = Instant::now();
            g.pace(ip).await;
            assert!(
                start.elapsed() <= Duration::from_millis(1700),
                "{:?}",
                start.elapsed()
            );
        });
    }

    #[test]
    fn a_full_address_gives_up_its_oldest_slot_to_a_newcomer() {
        block_on(async {
            let u = Unproven::new(100, 2);
            let ip: IpAddr = "10.0.0.1".parse().unwrap();
            let first = u.admit(ip);
            let second = u.admit(ip);
            let _other = u.admit("10.0.0.2".parse().unwrap());
            let _third = u.admit(ip);
            // The first was told to close, and holds nothing any more.
            tokio::time::timeout(Duration::from_millis(1), first.evicted.notified())
                .await
                .expect("the oldest was evicted");
            drop(first);
            assert_eq!(u.lock().conns.len(), 3);
            tokio::time::timeout(Duration::from_millis(1), second.evicted.notified())
                .await
                .expect_err("the second is still in");
        });
    }

    /// Every slot taken (by many addresses): room is made by closing the
    /// oldest once it has had its grace, not by waiting for it to give up.
    #[test]
    fn a_full_table_makes_room_by_evicting_the_oldest_past_the_grace() {
        block_on(async {
            let u = Unproven::new(2, 2);
            let a = u.admit("10.0.0.1".parse().unwrap());
            let b = u.admit("10.0.0.2".parse().unwrap());
            let start = Instant::now();
            u.room().await;
            assert!(start.elapsed() >= GRACE);
            tokio::time::timeout(Duration::from_millis(1), a.evicted.notified())
                .await
                .expect("the oldest was evicted");
            // A slot given up makes room at once.
            let _c = u.admit("10.0.0.3".parse().unwrap());
            drop(b);
            let start = Instant::now();
            u.room().await;
            assert_eq!(start.elapsed(), Duration::ZERO);
        });
    }
}
