//! Writing reports: to stdout, where a closed pipe (`| head`) is not a
//! crash, or to a file, atomically, so a reader never sees half a report.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub enum Destination {
    Stdout,
    File(PathBuf),
}

pub fn write_report(destination: &Destination, text: &str) -> io::Result<()> {
    match destination {
        Destination::Stdout => write_stdout(text),
        Destination::File(path) => write_atomic(path, text),
    }
}

/// Writes to stdout; a reader that went away is not an error.
pub fn write_stdout(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// A temporary file beside the target, synced, then renamed over it. A
/// target that is there and is no regular file (`/dev/null`, a FIFO,
/// `/dev/stdout`) is written to as it is: renaming over it would replace
/// a device node with a file, for every program on the machine.
fn write_atomic(path: &Path, text: &str) -> io::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
        return file.write_all(text.as_bytes());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "the output path names no file")
    })?;
    let temp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}
