//! Sending a large message without copying it into the kernel:
//! `vmsplice(2)` hands the buffer's pages to a pipe and `splice(2)` moves
//! them on into the socket, where the kernel sends from the pages
//! themselves (a NIC straight from them; loopback and veth by reference,
//! so the receiver's read is the only copy). The pages stay in use until
//! the receiver has read them, which the caller learns from the
//! receiver's acknowledgement: only then may the buffer change. Where the
//! kernel refuses (an old kernel, a sandbox), the bytes are written as
//! usual; the receiver cannot tell the difference.

use std::io::{self, IoSlice};
use std::os::fd::OwnedFd;

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice, vmsplice};
use tokio::io::{AsyncWriteExt, Interest};

use super::transport::{WriteHalf, Writer};

/// One pipe per rank, reused: a message goes through it a pipe's worth at
/// a time, and it is empty between messages.
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

/// 1 MiB (256 pages): the unprivileged maximum by default
/// (fs.pipe-max-size); a smaller pipe works, in more rounds.
const PIPE_BYTES: i32 = 1 << 20;

impl Pipe {
    pub fn new() -> Option<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ok()?;
        let _ = fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_BYTES));
        Some(Pipe { read, write })
    }
}

/// Sends `data` to the socket through the pipe. On return the pages may
/// still be in flight: the caller waits for the receiver's
/// acknowledgement before changing `data`.
pub async fn send(wr: &mut Writer, pipe: &Pipe, data: &[u8]) -> io::Result<()> {
    let mut off = 0;
    while off < data.len() {
        // The pipe is empty here, so this never waits.
        let mapped = match vmsplice(
            &pipe.write,
            &[IoSlice::new(&data[off..])],
            SpliceFFlags::empty(),
        ) {
            Ok(0) | Err(_) => return wr.write_all(&data[off..]).await,
            Ok(n) => n,
        };
        let mut left = mapped;
        while left > 0 {
            left -= into_socket(wr, &pipe.read, left).await?;
        }
        off += mapped;
    }
    Ok(())
}

/// Moves up to `len` bytes from the pipe into the socket, waiting while
/// the socket's buffer is full.
async fn into_socket(wr: &mut Writer, pipe: &OwnedFd, len: usize) -> io::Result<usize> {
    let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
    // The same loop for either kind of stream: tokio's readiness, then a
    // try that clears it when the socket is full.
    macro_rules! pump {
        ($s:expr) => {{
            let s = $s;
            loop {
                s.writable().await?;
                let r = s.try_io(Interest::WRITABLE, || {
                    splice(pipe, None, s, None, len, flags).map_err(io::Error::from)
                });
                match r {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
        }};
    }
    let n = match &wr.half {
        WriteHalf::Tcp(w) => pump!(AsRef::<tokio::net::TcpStream>::as_ref(w)),
        WriteHalf::Unix(w) => pump!(AsRef::<tokio::net::UnixStream>::as_ref(w)),
    };
    wr.watch.moved(n);
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::super::transport::{Conn, Watch};
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Several pipes' worth, starting mid-page, arrives intact over a Unix
    /// socket and over loopback TCP.
    #[test]
    fn spliced_bytes_arrive_intact() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let data: Vec<u8> = (0..(3 << 20) + 12345).map(|i| (i % 251) as u8).collect();
            let part = &data[7..];
            let (a, mut b) = tokio::net::UnixStream::pair().unwrap();
            let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = tcp.local_addr().unwrap();
            let (c, accepted) = tokio::join!(tokio::net::TcpStream::connect(addr), tcp.accept());
            let mut d = accepted.unwrap().0;
            let pipe = Pipe::new().expect("a pipe");
            for (mut w, r) in [
                (
                    Conn::Unix(a).split(&Watch::new()).1,
                    &mut b as &mut (dyn tokio::io::AsyncRead + Unpin),
                ),
                (Conn::Tcp(c.unwrap()).split(&Watch::new()).1, &mut d),
            ] {
                let mut got = vec![0u8; part.len()];
                let (sent, read) = tokio::join!(send(&mut w, &pipe, part), r.read_exact(&mut got));
                sent.unwrap();
                read.unwrap();
                assert!(got == part);
            }
        });
    }
}
