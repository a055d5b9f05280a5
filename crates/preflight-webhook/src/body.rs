//! A request's body, read within bounds: at most `MAX_BODY` kept, and
//! kept only while the bytes of every connection's bodies together stay
//! within a budget; what is over the limit read and dropped (within its
//! own bounds) so that the refusal reaches a sender still sending.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::HeaderMap;
use hyper::body::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::mutate::MAX_BODY;

/// How much of a body over `MAX_BODY` is read and dropped, and for how
/// long from the moment it went over, so that its sender has finished
/// sending when the 413 comes: a connection closed on unread bytes is
/// reset, and the sender sees a broken pipe in place of the answer.
pub const DRAIN_BYTES: u64 = 4 * MAX_BODY as u64;
pub const DRAIN_TIME: Duration = Duration::from_secs(10);

/// Bytes of bodies kept at once, across connections: 512 connections,
/// each part way through a body of `MAX_BODY`, would hold 2 GiB, four
/// times the Deployment's memory limit.
pub const BUDGET: usize = 128 << 20;

/// The bytes of bodies kept at once, shared by every connection.
pub fn budget() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(BUDGET))
}

pub enum Body {
    /// The body, and its share of the budget (none for an empty body),
    /// given back when dropped.
    Read(Bytes, Option<OwnedSemaphorePermit>),
    /// Over `MAX_BODY`, said or sent.
    TooBig,
    /// The budget is spent: the sender may try again (503).
    Busy,
    Unreadable(String),
}

/// The body of a request with `headers`, taking its bytes from `budget`.
pub async fn read<B>(headers: &HeaderMap, mut body: B, budget: &Arc<Semaphore>) -> Body
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let declared = headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    // hyper acts on the last `Expect`, and so does this.
    let waits = headers
        .get_all(hyper::header::EXPECT)
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .is_some_and(|e| e.trim().eq_ignore_ascii_case("100-continue"));
    // Too big by its own word: a sender that waits for "100 Continue"
    // (curl over 1 MiB does) is answered before it sends a byte (hyper
    // sends the 100 only once the body is read), and one that says it
    // will send more than the drain takes is not waited for.
    if declared.is_some_and(|n| n > MAX_BODY as u64 && (waits || n > DRAIN_BYTES)) {
        return Body::TooBig;
    }
    let mut held: Option<OwnedSemaphorePermit> = None;
    let mut kept: Vec<u8> =
        Vec::with_capacity(declared.map_or(0, |n| n.min(MAX_BODY as u64) as usize));
    let mut seen = 0u64;
    let mut drain_until = None;
    loop {
        let frame = match drain_until {
            Some(at) => match tokio::time::timeout_at(at, body.frame()).await {
                Ok(f) => f,
                Err(_) => return Body::TooBig,
            },
            None => body.frame().await,
        };
        let data = match frame {
            None => break,
            // Over the limit already: that is the answer, whatever broke.
            Some(Err(_)) if drain_until.is_some() => return Body::TooBig,
            Some(Err(e)) => return Body::Unreadable(e.to_string()),
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue, // trailers
            },
        };
        seen += data.len() as u64;
        if seen > DRAIN_BYTES {
            return Body::TooBig;
        }
        if seen > MAX_BODY as u64 {
            if drain_until.is_none() {
                drain_until = Some(tokio::time::Instant::now() + DRAIN_TIME);
                kept = Vec::new();
                held = None;
            }
            continue;
        }
        let Ok(more) = budget.clone().try_acquire_many_owned(data.len() as u32) else {
            return Body::Busy;
        };
        match &mut held {
            Some(h) => h.merge(more),
            None => held = Some(more),
        }
        kept.extend_from_slice(&data);
    }
    if drain_until.is_some() {
        return Body::TooBig;
    }
    kept.shrink_to_fit();
    Body::Read(Bytes::from(kept), held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::body::Frame;
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A body of these frames, an error where one is `None`; counts what
    /// was read of it.
    struct Frames(VecDeque<Option<Bytes>>, Arc<std::sync::atomic::AtomicUsize>);

    impl hyper::body::Body for Frames {
        type Data = Bytes;
        type Error = String;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, String>>> {
            let next = self.0.pop_front();
            if next.is_some() {
                self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Poll::Ready(next.map(|f| f.map(Frame::data).ok_or_else(|| "cut".to_string())))
        }
    }

    fn frames(sizes: &[Option<usize>]) -> (Frames, Arc<std::sync::atomic::AtomicUsize>) {
        let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let list = sizes
            .iter()
            .map(|s| s.map(|n| Bytes::from(vec![b' '; n])))
            .collect();
        (Frames(list, read.clone()), read)
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn a_body_within_the_limit_is_kept_and_holds_its_bytes_of_the_budget() {
        let budget = budget();
        let (body, _) = frames(&[Some(MIB), Some(MIB)]);
        let Body::Read(b, held) = block_on(read(&headers(&[]), body, &budget)) else {
            panic!("not read");
        };
        assert_eq!(b.len(), 2 * MIB);
        assert_eq!(budget.available_permits(), BUDGET - 2 * MIB);
        drop(held);
        assert_eq!(budget.available_permits(), BUDGET);
    }

    #[test]
    fn a_body_said_too_big_to_a_sender_that_waits_is_refused_unread() {
        let budget = budget();
        let (body, read_frames) = frames(&[Some(MIB); 9]);
        let h = headers(&[("content-length", "9437184"), ("expect", "100-continue")]);
        assert!(matches!(block_on(read(&h, body, &budget)), Body::TooBig));
        assert_eq!(read_frames.load(std::sync::atomic::Ordering::SeqCst), 0);
        // Said over what the drain takes: not waited for either.
        let (body, read_frames) = frames(&[Some(MIB); 17]);
        let h = headers(&[("content-length", "17825792")]);
        assert!(matches!(block_on(read(&h, body, &budget)), Body::TooBig));
        assert_eq!(read_frames.load(std::sync::atomic::Ordering::SeqCst), 0);
        // The last Expect is the one hyper heeds.
        let (body, read_frames) = frames(&[Some(MIB); 9]);
        let h = headers(&[
            ("content-length", "9437184"),
            ("expect", "100-continue"),
            ("expect", "nothing"),
        ]);
        assert!(matches!(block_on(read(&h, body, &budget)), Body::TooBig));
        assert_eq!(read_frames.load(std::sync::atomic::Ordering::SeqCst), 9);
    }

    #[test]
    fn a_body_sent_too_big_is_read_to_its_end_then_refused_and_keeps_nothing() {
        let budget = budget();
        for h in [headers(&[("content-length", "9437184")]), headers(&[])] {
            let (body, read_frames) = frames(&[Some(MIB); 9]);
            assert!(matches!(block_on(read(&h, body, &budget)), Body::TooBig));
            assert_eq!(read_frames.load(std::sync::atomic::Ordering::SeqCst), 9);
            assert_eq!(budget.available_permits(), BUDGET);
        }
        // Past what the drain takes: refused there, the rest unread.
        let (body, read_frames) = frames(&[Some(MIB); 40]);
        assert!(matches!(
            block_on(read(&headers(&[]), body, &budget)),
            Body::TooBig
        ));
        assert_eq!(read_frames.load(std::sync::atomic::Ordering::SeqCst), 17);
        // Broken after going over: still too big, not "unreadable".
        let (body, _) = frames(&[Some(5 * MIB), None]);
        assert!(matches!(
            block_on(read(&headers(&[]), body, &budget)),
            Body::TooBig
        ));
        let (body, _) = frames(&[Some(MIB), None]);
        assert!(matches!(
            block_on(read(&headers(&[]), body, &budget)),
            Body::Unreadable(e) if e == "cut"
        ));
        assert_eq!(budget.available_permits(), BUDGET);
    }

    #[test]
    fn a_spent_budget_refuses_the_next_body_and_frees_with_the_bodies_kept() {
        let budget = budget();
        let mut kept = Vec::new();
        for _ in 0..BUDGET / (4 * MIB) {
            let (body, _) = frames(&[Some(4 * MIB)]);
            match block_on(read(&headers(&[]), body, &budget)) {
                Body::Read(b, held) => kept.push((b, held)),
                _ => panic!("refused within the budget"),
            }
        }
        let (body, _) = frames(&[Some(1)]);
        assert!(matches!(
            block_on(read(&headers(&[]), body, &budget)),
            Body::Busy
        ));
        kept.pop();
        let (body, _) = frames(&[Some(MIB)]);
        assert!(matches!(
            block_on(read(&headers(&[]), body, &budget)),
            Body::Read(..)
        ));
    }
}
