//! A file read as its owner wrote it, trusting nothing about it: opened
//! once, never through a link (the last part of the path), never blocking
//! on a FIFO, judged by what was opened (fstat: a check by path and a read
//! by path could see two files), and read only up to a bound. Who may own
//! it and with what mode is the caller's to judge on the metadata.

use std::fs::Metadata;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Why a guarded file was not read.
#[derive(Debug)]
pub enum Refused {
    /// There is none.
    Missing,
    /// A symbolic link, named instead of the file.
    Link,
    /// Not a plain file (a directory, a FIFO, a device).
    NotPlain,
    /// Over the bound.
    TooLarge(u64),
    /// The system's own words.
    Io(std::io::Error),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Missing => write!(f, "no such file"),
            Refused::Link => write!(f, "a symbolic link: name the file itself"),
            Refused::NotPlain => write!(f, "not a regular file"),
            Refused::TooLarge(max) => write!(f, "over {max} bytes"),
            Refused::Io(e) => write!(f, "{e}"),
        }
    }
}

/// The file's metadata and, where `judge` accepts them, its bytes (at
/// most `max`).
pub fn read(
    path: &Path,
    max: u64,
    judge: impl FnOnce(&Metadata) -> Result<(), String>,
) -> Result<Result<Vec<u8>, String>, Refused> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            _ if e.kind() == std::io::ErrorKind::NotFound => Refused::Missing,
            Some(libc::ELOOP) => Refused::Link,
            _ => Refused::Io(e),
        })?;
    let meta = file.metadata().map_err(Refused::Io)?;
    if !meta.is_file() {
        return Err(Refused::NotPlain);
    }
    if let Err(why) = judge(&meta) {
        return Ok(Err(why));
    }
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(Refused::Io)?;
    if bytes.len() as u64 > max {
        return Err(Refused::TooLarge(max));
    }
    Ok(Ok(bytes))
}
