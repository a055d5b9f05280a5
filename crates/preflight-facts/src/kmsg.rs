//! NVIDIA Xid errors in the kernel log: the driver's one-line reports of
//! GPU faults ("NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off
//! the bus."), from /dev/kmsg or a saved log.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub struct Xid {
    /// `0000:18:00` as the driver prints it (no function number).
    pub bus: String,
    pub code: u32,
    /// The rest of the line after the code.
    pub detail: String,
    /// Seconds since boot, where the line carries a timestamp (a /dev/kmsg
    /// record's microseconds, dmesg's `[  812.331]`).
    pub at: Option<f64>,
}

/// Every Xid line in a log, in order; other lines are ignored. Takes
/// /dev/kmsg records ("4,1234,5678,-;NVRM: ...") and dmesg lines alike.
pub fn parse(text: &str) -> Vec<Xid> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Xid> {
    let start = line.find("NVRM: Xid (")?;
    let at = timestamp(&line[..start]);
    let rest = &line[start + "NVRM: Xid (".len()..];
    let (bus, rest) = rest.split_once("):")?;
    let bus = bus.trim().trim_start_matches("PCI:").to_ascii_lowercase();
    let rest = rest.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let code = digits.parse().ok()?;
    let detail = rest[digits.len()..]
        .trim_start_matches(',')
        .trim()
        .to_string();
    Some(Xid {
        bus,
        code,
        detail,
        at,
    })
}

/// The time before a message: a /dev/kmsg record's prefix
/// (`PRI,SEQ,USEC,FLAGS;`) or dmesg's `[  SECONDS.FRACTION]`.
fn timestamp(prefix: &str) -> Option<f64> {
    if let Some((fields, _)) = prefix.split_once(';') {
        let usec: u64 = fields.split(',').nth(2)?.trim().parse().ok()?;
        return Some(usec as f64 / 1e6);
    }
    // dmesg's `[  812.331]`, also after a syslog prefix ("Nov 26 12:00:00
    // host kernel: [  812.331] NVRM: ..."); dmesg -T's wall-clock form is
    // not a number and gives none.
    // The first bracket that holds a number: `[drm]` and the like are not
    // times.
    prefix.match_indices('[').find_map(|(open, _)| {
        let inside = prefix[open + 1..].split_once(']')?.0;
        inside.trim().parse::<f64>().ok().filter(|s| s.is_finite())
    })
}

/// Reads what /dev/kmsg holds now. Each read returns one record; the
/// device blocks at the end unless opened non-blocking, and says EAGAIN
/// there. EPIPE means records were overwritten while reading: skip on.
pub fn read_kmsg(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.file_type().is_char_device() {
        return std::fs::read_to_string(path);
    }
    let mut out = String::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.push_str(&String::from_utf8_lossy(&buf[..n]));
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid_lines_in_both_formats() {
        let log = "6,1234,5678,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n\
                   4,1235,5679,-;NVRM: Xid (PCI:0000:52:00): 79, pid=2480, name=python, GPU has fallen off the bus.\n\
                   [  812.331] NVRM: Xid (PCI:0000:9D:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU\n";
        let xids = parse(log);
        assert_eq!(xids.len(), 2);
        assert_eq!(xids[0].bus, "0000:52:00");
        assert_eq!(xids[0].code, 79);
        assert!(xids[0].detail.ends_with("GPU has fallen off the bus."));
        assert_eq!(xids[1].bus, "0000:9d:00");
        assert_eq!(xids[1].code, 48);
        assert_eq!(xids[0].at, Some(5.679e-3));
        assert_eq!(xids[1].at, Some(812.331));
        let syslog = parse(
            "Nov 26 12:00:00 gpu1 kernel: [ 9.5] NVRM: Xid (PCI:0000:52:00): 79, GPU has fallen off the bus.\n\
                            [Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=1, name=x, Timeout\n",
        );
        assert_eq!(syslog[0].at, Some(9.5));
        assert_eq!(syslog[1].at, None);
        assert_eq!(syslog[1].code, 119);
        let tagged =
            parse("[ 9.5] [drm] NVRM: Xid (PCI:0000:52:00): 79, GPU has fallen off the bus.\n");
        assert_eq!(tagged[0].at, Some(9.5));
    }

    #[test]
    fn malformed_lines_are_ignored() {
        assert!(parse("NVRM: Xid (PCI:0000:52:00): abc\nNVRM: Xid (").is_empty());
    }

    /// /dev/kmsg blocks at its end unless read non-blocking: the read must
    /// return (records, or a permission error), never wait for new ones.
    #[test]
    fn reading_dev_kmsg_returns() {
        let path = Path::new("/dev/kmsg");
        if !path.exists() {
            preflight_ground::testing::test_skip("no /dev/kmsg here (a container without it)");
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(read_kmsg(Path::new("/dev/kmsg")).map(|t| t.len()));
        });
        let result = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("read_kmsg returned");
        match result {
            Ok(len) => assert!(len > 0),
            // Only an unprivileged reader may be refused.
            Err(e) => {
                let status = std::fs::read_to_string("/proc/self/status").unwrap();
                let root = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|ids| ids.split_whitespace().nth(1))
                    == Some("0");
                assert!(!root, "root could not read /dev/kmsg: {e}");
            }
        }
    }
}
