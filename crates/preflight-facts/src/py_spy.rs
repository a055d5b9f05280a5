//! A Python process's stack, from py-spy (`pip install py-spy`), where it
//! is installed: `py-spy dump --nonblocking --json`, which reads the
//! process's memory without pausing it (no stop at all, at the price of a
//! stack that may be torn while it changes). Only the main thread's
//! frames are kept, innermost first.

use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyFrame {
    pub function: String,
    /// `torch/distributed/distributed_c10d.py`, `train.py`.
    pub file: String,
    pub line: u32,
}

/// py-spy as `setting` says: `off`, `auto` (the first on PATH), or a path.
pub fn locate(setting: &str, path_var: Option<&str>) -> Option<PathBuf> {
    match setting {
        "off" => None,
        "auto" => std::env::split_paths(path_var?)
            .map(|d| d.join("py-spy"))
            .find(|p| p.is_file()),
        path => Some(PathBuf::from(path)),
    }
}

/// The main thread's stack of `pid`, within `timeout`.
pub async fn dump(py_spy: &Path, pid: u32, timeout: Duration) -> Result<Vec<PyFrame>, String> {
    let run = tokio::process::Command::new(py_spy)
        .args(["dump", "--nonblocking", "--json", "--pid", &pid.to_string()])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| format!("py-spy gave no stack within {} ms", timeout.as_millis()))?
        .map_err(|e| format!("cannot run {}: {e}", py_spy.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        return Err(format!(
            "py-spy could not read pid {pid} ({}): {first}",
            out.status
        ));
    }
    parse(&String::from_utf8_lossy(&out.stdout), pid)
}

/// The main thread's frames from py-spy's JSON: the thread whose OS id is
/// the process's, else the one named MainThread.
pub fn parse(json: &str, pid: u32) -> Result<Vec<PyFrame>, String> {
    let threads: Vec<serde_json::Value> =
        serde_json::from_str(json).map_err(|e| format!("py-spy's output: {e}"))?;
    let main = threads
        .iter()
        .find(|t| t["os_thread_id"].as_u64() == Some(u64::from(pid)))
        .or_else(|| threads.iter().find(|t| t["thread_name"] == "MainThread"))
        .ok_or("py-spy found no main thread")?;
    Ok(main["frames"]
        .as_array()
        .map(|frames| {
            frames
                .iter()
                .take(256)
                .map(|f| PyFrame {
                    function: f["name"]
                        .as_str()
                        .unwrap_or("?")
                        .chars()
                        .take(200)
                        .collect(),
                    file: f["short_filename"]
                        .as_str()
                        .or(f["filename"].as_str())
                        .unwrap_or("?")
                        .chars()
                        .take(300)
                        .collect(),
                    line: f["line"].as_u64().unwrap_or(0) as u32,
                })
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_threads_frames_innermost_first() {
        let json = r#"[
          {"pid": 7, "thread_id": 1, "thread_name": "pt_autograd_0", "os_thread_id": 9,
           "frames": [{"name": "run", "short_filename": "threading.py", "line": 3}]},
          {"pid": 7, "thread_id": 2, "thread_name": "MainThread", "os_thread_id": 7,
           "frames": [
             {"name": "all_reduce", "filename": "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py",
              "short_filename": "torch/distributed/distributed_c10d.py", "line": 1541},
             {"name": "<module>", "filename": "/tmp/job.py", "short_filename": "job.py", "line": 13}]}
        ]"#;
        let f = parse(json, 7).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].function, "all_reduce");
        assert_eq!(f[0].file, "torch/distributed/distributed_c10d.py");
        assert_eq!((f[1].function.as_str(), f[1].line), ("<module>", 13));
        assert!(parse("[]", 7).is_err());
        assert!(parse("not json", 7).is_err());
        assert_eq!(locate("off", Some("/usr/bin")), None);
        assert_eq!(
            locate("/opt/py-spy", None),
            Some(PathBuf::from("/opt/py-spy"))
        );
    }
}
