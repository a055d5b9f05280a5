//! The authenticated connection: after the handshake every byte either way
//! travels in records sealed with a key only the two ends hold (derived
//! from the job's token and both nonces, one key per direction) and a
//! sequence number, so an on-path host can neither inject, alter, replay,
//! reorder nor drop a record unnoticed. The records are not encrypted:
//! nothing sent is secret (the token never is), only its integrity matters.
//!
//! A record is a u32 length, that many bytes, and
//! HMAC-SHA256(key, sequence | length | bytes). `Sealed` is a byte stream
//! (AsyncRead + AsyncWrite) over any other, so the frames above it do not
//! change.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

type HmacSha256 = Hmac<Sha256>;

/// A rank's connection to rank 0 after the handshake.
pub type Channel = Sealed<tokio::net::TcpStream>;

/// The most bytes one record carries: a frame larger than this goes in
/// several.
const MAX_RECORD: usize = 64 << 10;
const LEN: usize = 4;
const TAG: usize = 32;
/// A buffer larger than this is given back once empty: rank 0 holds one
/// connection per node, and 16,384 connections each keeping the largest
/// record it ever held would be a gigabyte.
const KEEP: usize = 16 << 10;

/// Empties `buf`, giving its memory back when it grew large.
fn release(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP {
        *buf = Vec::new();
    } else {
        buf.clear();
    }
}

/// One direction's key and the sequence number of its next record.
pub struct Direction {
    key: [u8; 32],
    seq: u64,
}

impl Direction {
    pub fn new(key: [u8; 32]) -> Direction {
        Direction { key, seq: 0 }
    }

    fn tag(&self, len: &[u8; LEN], data: &[u8]) -> HmacSha256 {
        // HMAC takes keys of any length; this cannot fail.
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(&self.seq.to_be_bytes());
        mac.update(len);
        mac.update(data);
        mac
    }
}

pub struct Sealed<S> {
    inner: S,
    send: Direction,
    recv: Direction,
    /// A sealed record not yet all written, and how much of it is.
    out: Vec<u8>,
    out_done: usize,
    /// Bytes read and not yet a whole record.
    raw: Vec<u8>,
    /// A verified record's bytes not yet read by the caller.
    plain: Vec<u8>,
    plain_done: usize,
}

fn corrupt(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

impl<S> Sealed<S> {
    pub fn new(inner: S, send: Direction, recv: Direction) -> Sealed<S> {
        Sealed {
            inner,
            send,
            recv,
            out: Vec::new(),
            out_done: 0,
            raw: Vec::new(),
            plain: Vec::new(),
            plain_done: 0,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The raw stream below the seal, for tests that play the on-path host.
    #[cfg(any(test, feature = "test-support"))]
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The next whole record in `raw`, verified, into `plain`: `Ok(false)`
    /// when more bytes are needed.
    fn open_record(&mut self) -> io::Result<bool> {
        if self.raw.len() < LEN {
            return Ok(false);
        }
        let len_bytes: [u8; LEN] = [self.raw[0], self.raw[1], self.raw[2], self.raw[3]];
        let len = u32::from_be_bytes(len_bytes) as usize;
        if len > MAX_RECORD {
            return Err(corrupt("a sealed record longer than any preflight sends"));
        }
        if self.raw.len() < LEN + len + TAG {
            return Ok(false);
        }
        let data = &self.raw[LEN..LEN + len];
        let tag = &self.raw[LEN + len..LEN + len + TAG];
        if self.recv.tag(&len_bytes, data).verify_slice(tag).is_err() {
            return Err(corrupt(
                "a record failed its integrity check: altered, injected or replayed on the way",
            ));
        }
        self.recv.seq += 1;
        self.plain = data.to_vec();
        self.plain_done = 0;
        if self.raw.len() == LEN + len + TAG {
            release(&mut self.raw);
        } else {
            self.raw.drain(..LEN + len + TAG);
        }
        Ok(true)
    }
}

impl<S: AsyncWrite + Unpin> Sealed<S> {
    /// Writes out what is left of the current sealed record.
    fn poll_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_done < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.out_done..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_done += n;
        }
        release(&mut self.out);
        self.out_done = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sealed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.plain_done < this.plain.len() {
                let n = buf.remaining().min(this.plain.len() - this.plain_done);
                buf.put_slice(&this.plain[this.plain_done..this.plain_done + n]);
                this.plain_done += n;
                if this.plain_done == this.plain.len() {
                    this.plain = Vec::new();
                    this.plain_done = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.open_record()? {
                continue;
            }
            let mut chunk = [0u8; 16 << 10];
            let mut rb = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            if rb.filled().is_empty() {
                // The end of the stream: clean between records, else cut.
                return Poll::Ready(if this.raw.is_empty() {
                    Ok(())
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                });
            }
            this.raw.extend_from_slice(rb.filled());
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Sealed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_out(cx))?;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let data = &buf[..buf.len().min(MAX_RECORD)];
        let len = (data.len() as u32).to_be_bytes();
        let tag = this.send.tag(&len, data).finalize().into_bytes();
        this.send.seq += 1;
        this.out.extend_from_slice(&len);
        this.out.extend_from_slice(data);
        this.out.extend_from_slice(&tag);
        // The record is ours now: what the socket does not take yet goes
        // out on the next write or flush.
        let _ = this.poll_out(cx)?;
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_out(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_out(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pair(
        a: tokio::io::DuplexStream,
        b: tokio::io::DuplexStream,
    ) -> (
        Sealed<tokio::io::DuplexStream>,
        Sealed<tokio::io::DuplexStream>,
    ) {
        (
            Sealed::new(a, Direction::new([1; 32]), Direction::new([2; 32])),
            Sealed::new(b, Direction::new([2; 32]), Direction::new([1; 32])),
        )
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn bytes_go_through_in_records_of_any_size() {
        rt().block_on(async {
            let (a, b) = tokio::io::duplex(1 << 10);
            let (mut a, mut b) = pair(a, b);
            let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            let expected = data.clone();
            let writer = async move {
                a.write_all(&data).await.unwrap();
                a.write_all(b"!").await.unwrap();
                a.flush().await.unwrap();
                a
            };
            let reader = async move {
                let mut got = vec![0u8; expected.len() + 1];
                b.read_exact(&mut got).await.unwrap();
                assert_eq!(&got[..expected.len()], &expected[..]);
                assert_eq!(got[expected.len()], b'!');
            };
            let (_a, ()) = tokio::join!(writer, reader);
        });
    }

    /// What an on-path host might do to the records: flip a bit, replay
    /// one, drop one, or seal with a key of its own. Every one is caught.
    #[test]
    fn altered_replayed_dropped_or_forged_records_are_caught() {
        rt().block_on(async {
            let record = |dir: &mut Direction, data: &[u8]| {
                let len = (data.len() as u32).to_be_bytes();
                let tag = dir.tag(&len, data).finalize().into_bytes();
                dir.seq += 1;
                [&len[..], data, &tag[..]].concat()
            };
            let mut good = Direction::new([1; 32]);
            let first = record(&mut good, b"store set coll/report");
            let second = record(&mut good, b"verdict");
            let mut altered = first.clone();
            altered[6] ^= 1;
            let forged = record(&mut Direction::new([9; 32]), b"store set coll/report");
            for (what, wire) in [
                ("altered", altered),
                ("replayed", first.clone()),
                ("dropped", second.clone()),
                ("forged", forged),
            ] {
                let (mut tx, rx) = tokio::io::duplex(1 << 16);
                let mut b = Sealed::new(rx, Direction::new([0; 32]), Direction::new([1; 32]));
                if what == "replayed" {
                    // The first record read once, then again.
                    tx.write_all(&first).await.unwrap();
                    let mut one = vec![0u8; b"store set coll/report".len()];
                    b.read_exact(&mut one).await.unwrap();
                }
                tx.write_all(&wire).await.unwrap();
                let mut got = [0u8; 8];
                let e = b.read(&mut got).await.unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{what}");
                assert!(e.to_string().contains("integrity"), "{what}: {e}");
            }
        });
    }
}
