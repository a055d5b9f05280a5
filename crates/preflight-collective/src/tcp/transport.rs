//! The wire between two ranks: a pair's reader and writer (TCP, or a
//! Unix socket on one host), and how one message travels (plain bytes,
//! spliced and acknowledged, or read straight out of the sender's memory),
//! each read and write under the operation's deadline, a timeout naming
//! the peer that stopped.

use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream, tcp, unix};
use tokio::time::Instant;

use super::*;
use crate::{Dtype, OpError};

/// When bytes last moved on any of a rank's connections, and how many
/// have: a step is hung only when nothing moves for the stall limit, not
/// when it is merely slow. Each half notes what it moves; a rank's halves
/// share one watch (its runtime is one thread).
#[derive(Debug)]
pub(super) struct Watch {
    /// The last movement, or an operation's start.
    at: Cell<Instant>,
    /// The last movement of bytes alone.
    moved_at: Cell<Instant>,
    bytes: Cell<u64>,
}

impl Watch {
    pub(super) fn new() -> Rc<Watch> {
        Rc::new(Watch {
            at: Cell::new(Instant::now()),
            moved_at: Cell::new(Instant::now()),
            bytes: Cell::new(0),
        })
    }

    pub(super) fn moved(&self, n: usize) {
        if n > 0 {
            let now = Instant::now();
            self.at.set(now);
            self.moved_at.set(now);
            self.bytes.set(self.bytes.get().saturating_add(n as u64));
        }
    }

    /// An operation's start counts as movement: the one before it ended.
    pub(super) fn started(&self) {
        self.at.set(Instant::now());
    }

    pub(super) fn last(&self) -> Instant {
        self.at.get()
    }

    pub(super) fn bytes(&self) -> u64 {
        self.bytes.get()
    }
}

/// How a wait on the network ended.
pub(super) enum Waited<T> {
    Done(T),
    /// Nothing moved for the stall limit (or, with none, the deadline came).
    Stalled,
    /// The deadline came while data still moved.
    StillMoving,
}

/// Runs `work` until it ends, `deadline` comes, or nothing has moved
/// on any connection for the stall limit.
pub(super) async fn watched<T>(
    watch: &Watch,
    stall: Option<Duration>,
    deadline: tokio::time::Instant,
    work: impl std::future::Future<Output = T>,
) -> Waited<T> {
    tokio::pin!(work);
    watch.started();
    let before = watch.bytes();
    loop {
        let quiet = stall.map_or(deadline, |s| (watch.last() + s).min(deadline));
        if let Ok(v) = tokio::time::timeout_at(quiet, &mut work).await {
            return Waited::Done(v);
        }
        let now = tokio::time::Instant::now();
        let since = now.saturating_duration_since(watch.last());
        match stall {
            // Before the deadline: alive while something moved within the
            // stall limit.
            Some(s) if now < deadline && since < s => {}
            // At the deadline: still moving when bytes moved during this
            // very wait, and within the stall limit (a wait begun on a
            // peer that has stopped moves nothing, and is a wait).
            Some(s)
                if now >= deadline
                    && watch.bytes() > before
                    && now.saturating_duration_since(watch.moved_at.get()) < s =>
            {
                return Waited::StillMoving;
            }
            _ => return Waited::Stalled,
        }
    }
}

pub(super) struct Reader {
    half: ReadHalf,
    watch: Rc<Watch>,
}

pub(super) enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
}

pub(super) struct Writer {
    pub(super) half: WriteHalf,
    pub(super) watch: Rc<Watch>,
}

pub(super) enum WriteHalf {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
}

impl AsyncRead for Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = match &mut me.half {
            ReadHalf::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Unix(r) => Pin::new(r).poll_read(cx, buf),
        };
        me.watch.moved(buf.filled().len() - before);
        r
    }
}

impl AsyncWrite for Writer {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let r = match &mut me.half {
            WriteHalf::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Unix(w) => Pin::new(w).poll_write(cx, buf),
        };
        if let Poll::Ready(Ok(n)) = r {
            me.watch.moved(n);
        }
        r
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().half {
            WriteHalf::Tcp(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Unix(w) => Pin::new(w).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().half {
            WriteHalf::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Unix(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// One connected peer before it is split into halves.
pub(super) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    /// The process at the other end of a Unix socket (SO_PEERCRED): pid
    /// and uid; `None` over TCP.
    pub(super) fn peer(&self) -> Option<(i32, u32)> {
        match self {
            Conn::Tcp(_) => None,
            Conn::Unix(s) => s.peer_cred().ok().and_then(|c| Some((c.pid()?, c.uid()))),
        }
    }

    pub(super) fn transport(&self) -> Transport {
        match self {
            Conn::Tcp(_) => Transport::Tcp,
            Conn::Unix(_) => Transport::Unix,
        }
    }

    pub(super) async fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.write_all(b).await,
            Conn::Unix(s) => s.write_all(b).await,
        }
    }

    pub(super) async fn read_exact(&mut self, b: &mut [u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.read_exact(b).await.map(|_| ()),
            Conn::Unix(s) => s.read_exact(b).await.map(|_| ()),
        }
    }

    /// Its halves, each noting what it moves in `watch`.
    pub(super) fn split(self, watch: &Rc<Watch>) -> (Reader, Writer) {
        let (r, w) = match self {
            Conn::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Conn::Unix(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), WriteHalf::Unix(w))
            }
        };
        (
            Reader {
                half: r,
                watch: watch.clone(),
            },
            Writer {
                half: w,
                watch: watch.clone(),
            },
        )
    }
}

pub(super) fn closed(peer: u32, e: &std::io::Error) -> OpError {
    let detail = match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "end of stream: the process is gone?".to_string(),
        // A single-copy read from a process that has exited.
        _ if e.raw_os_error() == Some(libc::ESRCH) => {
            "its memory could not be read: the process is gone".to_string()
        }
        _ => e.to_string(),
    };
    OpError::Closed { peer, detail }
}

/// How one message travels.
#[derive(Debug, Clone, Copy)]
pub(super) enum Way {
    /// Small: bytes through the socket, nothing more.
    Bytes,
    /// Large, between hosts (or same-host pairs without single-copy
    /// reads): bytes through the socket, then an acknowledgement from the
    /// receiver, so the sender may splice its pages into the socket
    /// (vmsplice) instead of copying them: the kernel holds the pages
    /// themselves until the receiver has read them, and the
    /// acknowledgement says when that was.
    Acked,
    /// Large, same host with single-copy reads: a descriptor, the receiver
    /// copies out of the sender's memory, then the acknowledgement.
    Direct(Pid),
}

impl Way {
    pub(super) fn acked(self) -> bool {
        !matches!(self, Way::Bytes)
    }
}

pub(super) async fn write(wr: &mut Writer, b: &[u8], to: u32) -> Result<(), OpError> {
    wr.write_all(b).await.map_err(|e| closed(to, &e))
}

/// This rank's side of a message to `to`: the bytes or the descriptor
/// (the acknowledgement, when due, is read by the caller).
pub(super) async fn send_out(
    wr: &mut Writer,
    pipe: &mut Option<splice::Pipe>,
    send: &[u8],
    way: Way,
    to: u32,
) -> Result<(), OpError> {
    match way {
        Way::Direct(_) => write(wr, &direct::descriptor(send), to).await,
        Way::Acked => {
            if pipe.is_none() {
                *pipe = splice::Pipe::new();
            }
            match pipe {
                Some(p) => splice::send(wr, p, send).await.map_err(|e| closed(to, &e)),
                None => send_bytes(wr, send, to).await,
            }
        }
        Way::Bytes => send_bytes(wr, send, to).await,
    }
}

/// This rank's side of a message from `from`: the bytes, or the bytes
/// copied out of the sender's memory; then the acknowledgement when due.
pub(super) async fn recv_in(
    rd: &mut Reader,
    ack: &mut Writer,
    recv: Recv<'_>,
    way: Way,
    from: u32,
) -> Result<(), OpError> {
    match way {
        Way::Direct(pid) => recv_direct(rd, recv, pid, from).await?,
        Way::Acked | Way::Bytes => recv_bytes(rd, recv, from).await?,
    }
    if way.acked() {
        write(ack, &[direct::ACK], from).await?;
    }
    Ok(())
}

/// `send` through the socket, in chunks.
pub(super) async fn send_bytes(wr: &mut Writer, send: &[u8], to: u32) -> Result<(), OpError> {
    for c in send.chunks(CHUNK) {
        write(wr, c, to).await?;
    }
    Ok(())
}

/// Bytes from the socket into `recv`, a chunk at a time (a reduction
/// reduces each chunk while the next is in flight).
pub(super) async fn recv_bytes(rd: &mut Reader, recv: Recv<'_>, from: u32) -> Result<(), OpError> {
    let mut off = 0;
    match recv {
        Recv::Into(buf) => {
            while off < buf.len() {
                let end = (off + CHUNK).min(buf.len());
                rd.read_exact(&mut buf[off..end])
                    .await
                    .map_err(|e| closed(from, &e))?;
                off = end;
            }
        }
        Recv::Reduce { dst, tmp, dtype } => {
            // tmp is small and reused, so the reduction reads it from
            // cache rather than from memory.
            let step = tmp.len().max(Dtype::SIZE);
            while off < dst.len() {
                let end = (off + step).min(dst.len());
                let t = &mut tmp[..end - off];
                rd.read_exact(t).await.map_err(|e| closed(from, &e))?;
                reduce(&mut dst[off..end], t, dtype);
                off = end;
            }
        }
    }
    Ok(())
}

/// A descriptor from `from`, and the bytes copied out of its memory.
pub(super) async fn recv_direct(
    rd: &mut Reader,
    recv: Recv<'_>,
    pid: Pid,
    from: u32,
) -> Result<(), OpError> {
    let mut d = [0u8; 16];
    rd.read_exact(&mut d).await.map_err(|e| closed(from, &e))?;
    let (addr, len) = direct::parse_descriptor(&d);
    if len != recv.len() {
        return Err(OpError::Other {
            detail: format!(
                "rank {from} offered {len} bytes where {} were due",
                recv.len()
            ),
        });
    }
    let copy = |dst: &mut [u8], at: usize| {
        let at = addr.checked_add(at as u64).ok_or_else(|| OpError::Other {
            detail: format!("rank {from} offered an address that wraps around ({addr:#x})"),
        })?;
        direct::read(pid, at, dst)
            .map(|()| rd.watch.moved(dst.len()))
            .map_err(|e| closed(from, &e))
    };
    match recv {
        Recv::Into(buf) => copy(buf, 0)?,
        Recv::Reduce { dst, tmp, dtype } => {
            let step = tmp.len().max(Dtype::SIZE);
            let mut off = 0;
            while off < dst.len() {
                let end = (off + step).min(dst.len());
                let t = &mut tmp[..end - off];
                copy(t, off)?;
                reduce(&mut dst[off..end], t, dtype);
                off = end;
            }
        }
    }
    Ok(())
}

pub(super) async fn read_ack(rd: &mut Reader, to: u32) -> Result<(), OpError> {
    let mut a = [0u8; 1];
    rd.read_exact(&mut a).await.map_err(|e| closed(to, &e))?;
    if a[0] != direct::ACK {
        return Err(OpError::Other {
            detail: format!(
                "rank {to} sent {:#04x} where an acknowledgement was due",
                a[0]
            ),
        });
    }
    Ok(())
}

/// Where an exchange's incoming bytes go.
pub(super) enum Recv<'a> {
    /// Stored as they are.
    Into(&'a mut [u8]),
    /// Added element-wise into `dst`, through `tmp` (a multiple of 4 bytes).
    Reduce {
        dst: &'a mut [u8],
        tmp: &'a mut [u8],
        dtype: Dtype,
    },
}

impl Recv<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Recv::Into(b) => b.len(),
            Recv::Reduce { dst, .. } => dst.len(),
        }
    }
}

impl Tcp {
    /// How a message of `len` bytes to or from `peer` travels.
    pub(super) fn way(&self, peer: u32, len: usize) -> Way {
        if len < direct::MIN_BYTES {
            return Way::Bytes;
        }
        match self.direct.get(peer as usize).copied().flatten() {
            Some(pid) => Way::Direct(pid),
            // Within a host the acknowledgement costs microseconds; across
            // a network it would cost a round trip per message.
            None if self.transports.get(peer as usize).copied().flatten()
                == Some(Transport::Unix) =>
            {
                Way::Acked
            }
            None => Way::Bytes,
        }
    }

    /// Sends `send` to `to` while receiving from `from` into `recv`. A
    /// large message is acknowledged by its receiver: when this returns,
    /// the peer has every byte and `send` may change, so the sender may
    /// hand the kernel its pages rather than a copy (see `Way`).
    pub(super) async fn exchange(
        &mut self,
        send: &[u8],
        to: u32,
        recv: Recv<'_>,
        from: u32,
        deadline: Instant,
    ) -> Result<(), OpError> {
        let out = self.way(to, send.len());
        let inw = self.way(from, recv.len());
        let sent = Cell::new(false);
        let got = Cell::new(false);
        let missing = |peer: u32| OpError::Other {
            detail: format!("no connection with rank {peer}"),
        };
        let (t, f) = (to as usize, from as usize);
        let (watch, stall) = (self.watch.clone(), self.stall);
        let pipe = &mut self.pipe;
        let readers = &mut self.readers;
        let writers = &mut self.writers;
        let work = async {
            if t == f {
                let rd = readers.get_mut(f).and_then(Option::as_mut);
                let wr = writers.get_mut(t).and_then(Option::as_mut);
                let (Some(rd), Some(wr)) = (rd, wr) else {
                    return Err(missing(to));
                };
                if matches!(out, Way::Direct(_)) || matches!(inw, Way::Direct(_)) {
                    // A descriptor one way at least: in this order on both
                    // sides, the bytes that may go the other way are few,
                    // and an acknowledgement follows everything else the
                    // peer writes in this exchange.
                    send_out(wr, pipe, send, out, to).await?;
                    recv_in(rd, wr, recv, inw, from).await?;
                    got.set(true);
                } else {
                    tokio::try_join!(send_out(wr, pipe, send, out, to), async {
                        recv_bytes(rd, recv, from).await?;
                        got.set(true);
                        Ok(())
                    })?;
                    if inw.acked() {
                        write(wr, &[direct::ACK], from).await?;
                    }
                }
                if out.acked() {
                    read_ack(rd, to).await?;
                }
                sent.set(true);
                return Ok(());
            }
            let Ok([rd_from, rd_to]) = readers.get_disjoint_mut([f, t]) else {
                return Err(missing(to));
            };
            let Ok([wr_to, wr_from]) = writers.get_disjoint_mut([t, f]) else {
                return Err(missing(to));
            };
            let (Some(rd_from), Some(wr_to)) = (rd_from.as_mut(), wr_to.as_mut()) else {
                return Err(missing(to));
            };
            let send_side = async {
                send_out(wr_to, pipe, send, out, to).await?;
                if out.acked() {
                    read_ack(rd_to.as_mut().ok_or_else(|| missing(to))?, to).await?;
                }
                sent.set(true);
                Ok(())
            };
            let recv_side = async {
                let ack = wr_from.as_mut().ok_or_else(|| missing(from))?;
                recv_in(rd_from, ack, recv, inw, from).await?;
                got.set(true);
                Ok(())
            };
            tokio::try_join!(send_side, recv_side)?;
            Ok(())
        };
        let r = match watched(&watch, stall, deadline, work).await {
            Waited::Done(r) => r,
            Waited::StillMoving => Err(OpError::still_moving(if !got.get() {
                Some(from)
            } else if !sent.get() {
                Some(to)
            } else {
                None
            })),
            Waited::Stalled if !got.get() => Err(OpError::RecvTimeout { from }),
            Waited::Stalled if !sent.get() => Err(OpError::SendTimeout { to }),
            Waited::Stalled => Ok(()),
        };
        if r.is_err() {
            // Pages of an unfinished message may still sit in the pipe.
            self.pipe = None;
        }
        r
    }
}
