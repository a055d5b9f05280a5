//! Which programs run on the node, from /proc/PID/comm under the root: how
//! checks see daemons (chronyd, nv-fabricmanager) without a service manager.

use std::path::Path;

/// The command names of every process, each once, sorted.
pub fn running(proc_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(proc_dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}
