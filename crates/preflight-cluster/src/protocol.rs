//! The wire format between ranks and the master: frames of
//! `b"PFL"`, a version byte, a big-endian u32 body length, then a JSON body.
//!
//! The magic makes a stray client (a port scanner, an HTTP probe, another
//! program on the same port) fail on its first bytes; the version lets a
//! newer preflight say "other version" instead of misreading; the maximum
//! frame size bounds what a peer can make us allocate. Every read has a
//! deadline, so a half-open or slow peer costs one task, not the barrier.

use std::fmt;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::checkin::CheckIn;
use preflight_result::cluster::{ClusterReport, Probe};
use preflight_result::report::Interrupted;

pub const MAGIC: &[u8; 3] = b"PFL";
/// 3: the client proves the token first, the server answers with its
/// proof in `Welcome`, and every later byte is sealed (`sealed`).
pub const VERSION: u8 = 3;
/// A check-in of a node with hundreds of checks is tens of KiB; a report of
/// a large cluster is bigger. Anything beyond this is not ours.
pub const MAX_FRAME: u32 = 8 << 20;
const HEADER: usize = 8;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Msg {
    /// Client: opens the authentication with its nonce.
    Hello {
        nonce: String,
        version: String,
    },
    /// Server: its nonce. It proves nothing yet: a stranger who connects
    /// gets no proof to test guesses of the token against.
    Challenge {
        nonce: String,
    },
    /// Client: its proof of the token over both nonces.
    Proof {
        proof: String,
    },
    /// Server: the client's proof held; its own proof over both nonces.
    Welcome {
        proof: String,
    },
    /// Either side: why it ends the connection. A server that rejects a
    /// proof says where its token comes from, and its fingerprint only
    /// when the token is public anyway (derived from a job id): a secret's
    /// fingerprint would let a stranger test guesses offline.
    Rejected {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fingerprint: Option<String>,
    },
    /// NTP-style clock sample: client's send time (µs since the epoch).
    TimeRequest {
        t0: i64,
    },
    /// Server's receive and send times for the request.
    TimeReply {
        t0: i64,
        t1: i64,
        t2: i64,
    },
    CheckIn(Box<CheckIn>),
    /// Server: probe these peers and send the results.
    ProbePlan {
        node: usize,
        targets: Vec<super::reachability::Target>,
        timeout_ms: u64,
    },
    ProbeResults {
        results: Vec<Probe>,
    },
    StoreSet {
        key: String,
        value: String,
    },
    StoreGet {
        key: String,
        wait_ms: u64,
    },
    StoreValue {
        key: String,
        value: Option<String>,
    },
    /// A rank whose node leader checked it in, on its own connection after
    /// the verdict: it takes over its store keys for the collective stage.
    Attach {
        rank: u32,
    },
    /// The barrier's verdict, and the milliseconds left then until rank 0's
    /// `--timeout` deadline: the run's deadline every rank holds the
    /// collective stage to (each counts from the moment it reads this).
    Verdict {
        report: Box<ClusterReport>,
        left_ms: u64,
    },
    /// A node's leader to a local rank: its check-in went on to rank 0 (a
    /// leader that dies before saying so leaves the rank to check in
    /// itself).
    Relayed,
    /// A node's leader to its other local ranks, before the verdict: the
    /// node-scope checks it evaluated once for the whole node.
    NodeFindings {
        results: Vec<preflight_result::CheckResult>,
    },
    /// Server, after the verdict: rank 0 was interrupted by a signal and
    /// is leaving; every request from now on gets this answer.
    Interrupted {
        notice: Box<Interrupted>,
    },
}

#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    Closed,
    /// The peer closed the connection inside a frame.
    Truncated,
    /// The first bytes are not a preflight frame.
    Garbage,
    /// A preflight frame of another protocol version.
    Version(u8),
    /// The frame's length and the limit it broke.
    TooLarge(u32, u32),
    Timeout,
    /// A frame whose body is not a message of this version.
    Body(String),
    /// A well-formed answer that says no (the store refused a value, or
    /// holds something that is not what was asked for).
    Refused(String),
    /// Rank 0 was interrupted by a signal: no answer will come.
    Interrupted(Box<Interrupted>),
    Io(std::io::Error),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Closed => write!(f, "the peer closed the connection"),
            FrameError::Truncated => write!(f, "the peer closed the connection inside a frame"),
            FrameError::Garbage => write!(f, "not a preflight peer (bad magic)"),
            FrameError::Version(v) => write!(
                f,
                "a preflight peer speaking protocol version {v} (this one speaks {VERSION})"
            ),
            FrameError::TooLarge(n, max) => {
                write!(f, "a frame of {n} bytes, more than the {max} allowed")
            }
            FrameError::Timeout => write!(f, "the peer sent nothing before the deadline"),
            FrameError::Body(e) => write!(f, "a malformed message: {e}"),
            FrameError::Refused(e) => write!(f, "{e}"),
            FrameError::Interrupted(i) => write!(f, "{}", i.describe()),
            FrameError::Io(e) => write!(f, "{e}"),
        }
    }
}

pub fn encode(msg: &Msg) -> Vec<u8> {
    // Serializing our own types cannot fail: no maps with non-string keys.
    let body = serde_json::to_vec(msg).unwrap_or_default();
    let mut frame = Vec::with_capacity(HEADER + body.len());
    frame.extend_from_slice(MAGIC);
    frame.push(VERSION);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

pub async fn write<W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &Msg,
    deadline: Instant,
) -> Result<(), FrameError> {
    write_frame(w, &encode(msg), deadline).await
}

/// `write` of a frame `encode` made: one encoding for every rank that is
/// sent the same message.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    frame: &[u8],
    deadline: Instant,
) -> Result<(), FrameError> {
    // Said here, by the sender, rather than as "a frame of N bytes" by a
    // receiver that cannot tell why.
    let body = frame.len() - HEADER;
    if body > MAX_FRAME as usize {
        return Err(FrameError::TooLarge(
            u32::try_from(body).unwrap_or(u32::MAX),
            MAX_FRAME,
        ));
    }
    match tokio::time::timeout_at(deadline, async {
        w.write_all(frame).await?;
        w.flush().await
    })
    .await
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(FrameError::Io(e)),
        Err(_) => Err(FrameError::Timeout),
    }
}

/// The largest frame rank 0 reads from a rank: a check-in, a store value
/// (64 KiB at most), probe results. What a rank reads from rank 0 (the
/// verdict) may be larger, up to `MAX_FRAME`.
pub const MAX_RANK_FRAME: u32 = 1 << 20;

/// The largest frame a peer may send before it has authenticated: the
/// handshake's messages are small, and a stranger must not make rank 0
/// allocate megabytes per pending connection.
pub const MAX_HANDSHAKE_FRAME: u32 = 4096;

/// Reads one frame; the whole frame must arrive before `deadline`.
pub async fn read<R: AsyncRead + Unpin>(r: &mut R, deadline: Instant) -> Result<Msg, FrameError> {
    read_limited(r, deadline, MAX_FRAME).await
}

/// `read` with a smaller size limit, for the handshake.
pub async fn read_limited<R: AsyncRead + Unpin>(
    r: &mut R,
    deadline: Instant,
    max: u32,
) -> Result<Msg, FrameError> {
    match tokio::time::timeout_at(deadline, read_inner(r, max)).await {
        Ok(result) => result,
        Err(_) => Err(FrameError::Timeout),
    }
}

async fn read_inner<R: AsyncRead + Unpin>(r: &mut R, max: u32) -> Result<Msg, FrameError> {
    let mut header = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        let n = r.read(&mut header[got..]).await.map_err(FrameError::Io)?;
        if n == 0 {
            return Err(if got == 0 {
                FrameError::Closed
            } else {
                FrameError::Truncated
            });
        }
        got += n;
        // Judge the magic as soon as it is in: a stray client that sends a
        // few bytes and waits must not hold us for the whole header.
        if got >= MAGIC.len() && &header[..MAGIC.len()] != MAGIC {
            return Err(FrameError::Garbage);
        }
    }
    if header[3] != VERSION {
        return Err(FrameError::Version(header[3]));
    }
    let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    if len > max {
        return Err(FrameError::TooLarge(len, max));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FrameError::Truncated
        } else {
            FrameError::Io(e)
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| FrameError::Body(e.to_string()))
}

/// A deadline `d` from now.
#[cfg(any(test, feature = "test-support"))]
pub fn after(d: std::time::Duration) -> Instant {
    Instant::now() + d
}

pub fn now_us(offset_ms: i64) -> i64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_micros() as i64).saturating_add(offset_ms.saturating_mul(1000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// The sender refuses a frame no receiver would take, and says how
    /// large it was, instead of the receiver's "a frame of N bytes".
    #[test]
    fn an_oversized_frame_is_refused_by_its_sender() {
        let msg = Msg::Rejected {
            reason: "x".repeat(MAX_FRAME as usize),
            source: None,
            fingerprint: None,
        };
        let mut sink: Vec<u8> = Vec::new();
        let e = rt()
            .block_on(write(
                &mut sink,
                &msg,
                Instant::now() + Duration::from_secs(5),
            ))
            .unwrap_err();
        assert!(
            matches!(e, FrameError::TooLarge(n, MAX_FRAME) if n > MAX_FRAME),
            "{e}"
        );
        assert!(sink.is_empty(), "nothing was sent");
    }

    fn read_bytes(bytes: Vec<u8>) -> Result<Msg, FrameError> {
        rt().block_on(async move {
            let mut slice = bytes.as_slice();
            read(&mut slice, after(Duration::from_secs(1))).await
        })
    }

    #[test]
    fn round_trip() {
        let frame = encode(&Msg::Hello {
            nonce: "ab".into(),
            version: "1".into(),
        });
        assert!(matches!(read_bytes(frame), Ok(Msg::Hello { nonce, .. }) if nonce == "ab"));
    }

    #[test]
    fn garbage_is_rejected_on_the_magic() {
        assert!(matches!(
            read_bytes(b"GET / HTTP/1.1\r\n\r\n".to_vec()),
            Err(FrameError::Garbage)
        ));
        // Three bytes suffice: the reader does not wait for a full header.
        assert!(matches!(
            read_bytes(b"XYZ".to_vec()),
            Err(FrameError::Garbage)
        ));
    }

    #[test]
    fn oversized_frames_are_refused_before_allocation() {
        let mut frame = MAGIC.to_vec();
        frame.push(VERSION);
        frame.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(read_bytes(frame), Err(FrameError::TooLarge(..))));
    }

    #[test]
    fn handshake_frames_are_small() {
        let frame = encode(&Msg::Hello {
            nonce: "x".repeat(5000),
            version: "1".into(),
        });
        let limited = rt().block_on(async move {
            let mut slice = frame.as_slice();
            read_limited(
                &mut slice,
                after(Duration::from_secs(1)),
                MAX_HANDSHAKE_FRAME,
            )
            .await
        });
        assert!(matches!(
            limited,
            Err(FrameError::TooLarge(_, MAX_HANDSHAKE_FRAME))
        ));
    }

    #[test]
    fn truncated_and_empty_and_other_versions() {
        let frame = encode(&Msg::Welcome {
            proof: String::new(),
        });
        assert!(matches!(
            read_bytes(frame[..frame.len() - 1].to_vec()),
            Err(FrameError::Truncated)
        ));
        assert!(matches!(
            read_bytes(frame[..5].to_vec()),
            Err(FrameError::Truncated)
        ));
        assert!(matches!(read_bytes(Vec::new()), Err(FrameError::Closed)));
        let mut other = frame.clone();
        other[3] = 9;
        assert!(matches!(read_bytes(other), Err(FrameError::Version(9))));
        let mut bad_body = MAGIC.to_vec();
        bad_body.push(VERSION);
        bad_body.extend_from_slice(&3u32.to_be_bytes());
        bad_body.extend_from_slice(b"{x}");
        assert!(matches!(read_bytes(bad_body), Err(FrameError::Body(_))));
    }

    #[test]
    fn a_silent_peer_times_out() {
        rt().block_on(async {
            let (mut a, _b) = tokio::io::duplex(64);
            let r = read(&mut a, after(Duration::from_millis(50))).await;
            assert!(matches!(r, Err(FrameError::Timeout)));
        });
    }
}
