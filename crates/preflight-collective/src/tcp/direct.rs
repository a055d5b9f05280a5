//! Single-copy transfers between ranks on one host: the receiver copies a
//! large message straight out of the sender's memory with
//! `process_vm_readv(2)` (Linux "cross-memory attach", as OpenMPI's vader
//! and NCCL's P2P/CMA paths do), and the Unix socket between them carries
//! only a descriptor one way and an acknowledgement back. Through a socket
//! each byte is copied twice (into the kernel and out again); this way,
//! once. The kernel allows it between processes of one user in one PID
//! namespace, unless Yama's ptrace_scope or a seccomp profile forbids it,
//! so every pair proves it works at init by reading a random marker from
//! the other's memory, and a pair that cannot falls back to copying through
//! the socket, with the reason reported.

use std::io::{self, IoSliceMut};

use nix::sys::uio::{RemoteIoVec, process_vm_readv};
use nix::unistd::Pid;

/// Messages smaller than this go through the socket: the descriptor and
/// the acknowledgement cost two more trips than the bytes themselves.
pub const MIN_BYTES: usize = 64 << 10;

const MARKER_MAGIC: &[u8; 8] = b"PFDIRCT1";

/// What this rank shows a same-host peer at init: its memory holds a
/// marker the peer must be able to read back.
pub struct Marker {
    bytes: Box<[u8; 32]>,
}

/// A peer's offer, as sent over the socket: its process id, where its
/// marker lies and what the marker holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub pid: i32,
    pub addr: u64,
    pub marker: [u8; 32],
}

pub const OFFER_LEN: usize = 4 + 8 + 32;

impl Marker {
    /// A marker unique to this process and rank: the magic, the rank, the
    /// process id and the clock, so reading another process (another PID
    /// namespace's pid 1234) cannot match it.
    pub fn new(rank: u32) -> Marker {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(MARKER_MAGIC);
        b[8..12].copy_from_slice(&rank.to_le_bytes());
        b[12..16].copy_from_slice(&std::process::id().to_le_bytes());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        b[16..32].copy_from_slice(&nanos.to_le_bytes());
        Marker { bytes: Box::new(b) }
    }

    pub fn offer(&self) -> [u8; OFFER_LEN] {
        let mut o = [0u8; OFFER_LEN];
        o[..4].copy_from_slice(&std::process::id().to_le_bytes());
        o[4..12].copy_from_slice(&(self.bytes.as_ptr() as u64).to_le_bytes());
        o[12..].copy_from_slice(&self.bytes[..]);
        o
    }
}

impl Offer {
    pub fn parse(b: &[u8; OFFER_LEN]) -> Offer {
        let mut marker = [0u8; 32];
        marker.copy_from_slice(&b[12..]);
        Offer {
            pid: i32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            addr: u64::from_le_bytes(b[4..12].try_into().unwrap_or([0; 8])),
            marker,
        }
    }

    /// Reads the peer's marker out of its memory: `Ok` when it is there,
    /// else why single-copy reads cannot work for this pair.
    pub fn try_read(&self) -> Result<(), String> {
        let mut got = [0u8; 32];
        match read(Pid::from_raw(self.pid), self.addr, &mut got) {
            Ok(()) if got == self.marker => Ok(()),
            Ok(()) => Err(format!(
                "pid {} is another process here (a different PID namespace?)",
                self.pid
            )),
            Err(e) => Err(refusal(self.pid, &e)),
        }
    }
}

/// The kernel's refusal in words, with the usual cause.
fn refusal(pid: i32, e: &io::Error) -> String {
    let cause = match e.raw_os_error() {
        Some(libc::EPERM) => {
            "not permitted: another user, a different PID namespace (that pid is another process here), kernel.yama.ptrace_scope above 0, or a seccomp profile"
        }
        Some(libc::ESRCH) => "no such process here (a different PID namespace?)",
        Some(libc::EFAULT) => "address not mapped: another process (a different PID namespace?)",
        Some(libc::ENOSYS) => "process_vm_readv is not available in this kernel or sandbox",
        _ => "",
    };
    if cause.is_empty() {
        format!("process_vm_readv(pid {pid}): {e}")
    } else {
        format!("process_vm_readv(pid {pid}): {e}: {cause}")
    }
}

/// Copies `dst.len()` bytes from `addr` in process `pid` into `dst`.
pub fn read(pid: Pid, addr: u64, dst: &mut [u8]) -> io::Result<()> {
    // The address is a peer's word: a range that wraps around, or does not
    // fit this machine's addresses, is refused before any read.
    let start = usize::try_from(addr)
        .ok()
        .filter(|a| a.checked_add(dst.len()).is_some())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a peer's range of {} bytes at {addr:#x} wraps around",
                    dst.len()
                ),
            )
        })?;
    let mut done = 0usize;
    while done < dst.len() {
        let remote = [RemoteIoVec {
            base: start + done,
            len: dst.len() - done,
        }];
        let n = process_vm_readv(pid, &mut [IoSliceMut::new(&mut dst[done..])], &remote)
            .map_err(io::Error::from)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_readv copied nothing",
            ));
        }
        done += n;
    }
    Ok(())
}

/// A large message's descriptor: where it lies in the sender and how long
/// it is.
pub fn descriptor(buf: &[u8]) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&(buf.as_ptr() as u64).to_le_bytes());
    d[8..].copy_from_slice(&(buf.len() as u64).to_le_bytes());
    d
}

pub fn parse_descriptor(d: &[u8; 16]) -> (u64, usize) {
    let addr = u64::from_le_bytes(d[..8].try_into().unwrap_or([0; 8]));
    let len = u64::from_le_bytes(d[8..].try_into().unwrap_or([0; 8]));
    (addr, len as usize)
}

/// The byte a receiver sends back once it has copied a message: from then
/// on the sender may reuse its buffer.
pub const ACK: u8 = 0xac;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_that_wraps_around_is_refused_unread() {
        let mut dst = [0u8; 16];
        let me = Pid::from_raw(std::process::id() as i32);
        let e = read(me, u64::MAX - 4, &mut dst).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("wraps around"), "{e}");
    }

    #[test]
    fn reads_own_marker_and_refuses_a_stranger() {
        let m = Marker::new(3);
        let offer = Offer::parse(&m.offer());
        assert_eq!(offer.pid as u32, std::process::id());
        assert_eq!(offer.try_read(), Ok(()));
        // The same address with a different marker: another process.
        let mut other = offer.clone();
        other.marker[31] ^= 1;
        assert!(other.try_read().unwrap_err().contains("another process"));
        // A pid that does not exist.
        let gone = Offer {
            pid: i32::MAX,
            ..offer
        };
        let e = gone.try_read().unwrap_err();
        assert!(e.contains("no such process"), "{e}");
    }

    #[test]
    fn descriptor_round_trip() {
        let b = vec![7u8; 100];
        let (addr, len) = parse_descriptor(&descriptor(&b));
        assert_eq!(len, 100);
        let mut got = vec![0u8; 100];
        read(Pid::this(), addr, &mut got).unwrap();
        assert_eq!(got, b);
    }
}
