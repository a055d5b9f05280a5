//! Who holds a TCP port: the socket's inode from /proc/net/tcp{,6}, then the
//! process whose /proc/PID/fd links to `socket:[inode]`, all under `--root`.

use std::path::Path;

use preflight_facts::{Facts, procs};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its parent, from /proc/PID/stat (0 when unreadable).
    pub ppid: u32,
    pub cmdline: String,
    /// Who runs it: the owner of /proc/PID, by name where /etc/passwd
    /// has one (empty when unknown).
    pub user: String,
}

impl Holder {
    /// What kind of program it is, when that tells the operator something.
    pub fn role(&self) -> Option<&'static str> {
        let argv0 = self.cmdline.split(' ').next().unwrap_or("");
        let program = argv0.rsplit('/').next().unwrap_or(argv0);
        if program == "preflight" {
            return Some("another preflight");
        }
        let torch = [
            "torchrun",
            "torch.distributed",
            "torch/distributed",
            "deepspeed",
            "accelerate launch",
        ];
        if torch.iter().any(|t| self.cmdline.contains(t)) {
            return Some("a PyTorch job");
        }
        None
    }

    pub fn describe(&self) -> String {
        let flat = self
            .cmdline
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let mut cmd: String = flat.chars().take(120).collect();
        if cmd.len() < flat.len() {
            cmd.push('…');
        }
        let user = if self.user.is_empty() {
            String::new()
        } else {
            format!(" (user {})", self.user)
        };
        match self.role() {
            Some(role) => format!("pid {}{user} `{cmd}` ({role})", self.pid),
            None => format!("pid {}{user} `{cmd}`", self.pid),
        }
    }
}

/// The inodes of the sockets bound to `port` in one table's text
/// (/proc/net/tcp or tcp6): the kernel's, or a fixture's, or garbage.
pub fn bound_inodes(text: &str, port: u16) -> Vec<u64> {
    let mut found = Vec::new();
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        let (Some(local), Some(inode)) = (fields.get(1), fields.get(9)) else {
            continue;
        };
        let Some(local_port) = local
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
        else {
            continue;
        };
        if local_port == port
            && let Ok(inode) = inode.parse::<u64>()
            && inode != 0
        {
            found.push(inode);
        }
    }
    found
}

fn cmdline(proc_dir: &Path) -> String {
    let raw = std::fs::read(proc_dir.join("cmdline")).unwrap_or_default();
    let text = String::from_utf8_lossy(&raw)
        .split('\0')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if text.is_empty() {
        std::fs::read_to_string(proc_dir.join("comm"))
            .map(|c| format!("[{}]", c.trim()))
            .unwrap_or_default()
    } else {
        text
    }
}

/// Why a port's holder is this job's own, when it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ours {
    /// This process, or a child of it between fork and exec (a `command`
    /// check's program holds a copy of every descriptor until its exec
    /// closes them).
    Itself,
    /// A process this one descends from: the launcher that started the
    /// job (torchrun's agent holds MASTER_PORT for its store, mpirun,
    /// slurmstepd) or preflight's own node agent. What it is, for the
    /// report: "torchrun pid 4242".
    Launcher(String),
    /// Another rank of this job: the same program started by the same
    /// parent (rank 0 listening where its siblings look).
    Sibling,
}

/// Whether `holder` belongs to this job rather than a stranger: itself,
/// an ancestor, or a sibling rank. Only on the real root, where the pids
/// are this machine's; a parent hidden by a PID namespace is not seen,
/// and its port then counts as a stranger's.
pub fn this_jobs(facts: &Facts, holder: &Holder) -> Option<Ours> {
    if !facts.is_live() {
        return None;
    }
    let me = std::process::id();
    if holder.pid == me || holder.ppid == me {
        return Some(Ours::Itself);
    }
    let proc_dir = facts.host_path("/proc");
    // Only a launcher whose port the job's ranks use rather than bind:
    // torchrun's agent (its store is the ranks' store) and preflight's own
    // node agent. slurmstepd, mpirun or a shell holding MASTER_PORT is a
    // real conflict: the training's rank 0 must bind it.
    let shared_store =
        holder.role() == Some("a PyTorch job") || same_program(&proc_dir, holder.pid);
    if shared_store && procs::ancestors(&proc_dir, me).contains(&holder.pid) {
        return Some(Ours::Launcher(format!(
            "{} pid {}",
            launcher_name(holder, &proc_dir),
            holder.pid
        )));
    }
    let parent = std::os::unix::process::parent_id();
    if parent > 1 && holder.ppid == parent && same_program(&proc_dir, holder.pid) {
        return Some(Ours::Sibling);
    }
    None
}

/// Whether process `pid` runs the same executable as this one.
fn same_program(proc_dir: &Path, pid: u32) -> bool {
    let theirs = std::fs::read_link(proc_dir.join(pid.to_string()).join("exe"));
    let ours = std::fs::read_link(proc_dir.join("self/exe"));
    matches!((theirs, ours), (Ok(a), Ok(b)) if a == b)
}

/// What a launcher is called in the report: the name operators know it
/// by, not python3's.
fn launcher_name(holder: &Holder, proc_dir: &Path) -> String {
    if holder.role() == Some("a PyTorch job") {
        return "torchrun".into();
    }
    if same_program(proc_dir, holder.pid) {
        return "preflight's node agent".into();
    }
    let argv0 = holder.cmdline.split(' ').next().unwrap_or("");
    let program = argv0.rsplit('/').next().unwrap_or(argv0);
    if program.is_empty() {
        "the launcher".into()
    } else {
        program.to_string()
    }
}

/// Who holds `port`; `Err` says why nobody can be named.
pub fn holders(facts: &Facts, port: u16) -> Result<Vec<Holder>, String> {
    holders_of(facts, &[port])
        .pop()
        .map_or_else(|| Ok(Vec::new()), |(_, found)| found)
}

/// Who holds each of `ports`, in one pass over /proc: every process's
/// descriptors are read once however many ports are asked about (a scan
/// costs tens of milliseconds on a busy node).
pub fn holders_of(facts: &Facts, ports: &[u16]) -> Vec<(u16, Result<Vec<Holder>, String>)> {
    let tables: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(facts.host_path(t)).ok())
        .collect();
    // `socket:[inode]` → the ports it is bound to.
    let mut wanted: std::collections::HashMap<String, Vec<u16>> = Default::default();
    for &port in ports {
        for text in &tables {
            for inode in bound_inodes(text, port) {
                let ports = wanted.entry(format!("socket:[{inode}]")).or_default();
                if !ports.contains(&port) {
                    ports.push(port);
                }
            }
        }
    }
    let mut found: Vec<(u16, Vec<Holder>)> = ports.iter().map(|&p| (p, Vec::new())).collect();
    let mut unreadable = 0usize;
    let proc_root = facts.host_path("/proc");
    let listed = if wanted.is_empty() {
        Ok(())
    } else {
        match std::fs::read_dir(&proc_root) {
            Ok(entries) => {
                for entry in entries.filter_map(Result::ok) {
                    let Some(pid) = entry
                        .file_name()
                        .to_str()
                        .and_then(|n| n.parse::<u32>().ok())
                    else {
                        continue;
                    };
                    let dir = entry.path();
                    let Ok(fds) = std::fs::read_dir(dir.join("fd")) else {
                        unreadable += 1;
                        continue;
                    };
                    let mut held: Vec<u16> = Vec::new();
                    for fd in fds.filter_map(Result::ok) {
                        if let Ok(t) = std::fs::read_link(fd.path())
                            && let Some(ports) = t.to_str().and_then(|t| wanted.get(t))
                        {
                            for p in ports {
                                if !held.contains(p) {
                                    held.push(*p);
                                }
                            }
                        }
                    }
                    if held.is_empty() {
                        continue;
                    }
                    let holder = Holder {
                        pid,
                        ppid: procs::parent(&dir).unwrap_or(0),
                        cmdline: cmdline(&dir),
                        user: std::fs::metadata(&dir)
                            .map(|m| facts.user_name(std::os::unix::fs::MetadataExt::uid(&m)))
                            .unwrap_or_default(),
                    };
                    for (_, list) in found.iter_mut().filter(|(p, _)| held.contains(p)) {
                        if !list.iter().any(|h| h.pid == pid) {
                            list.push(holder.clone());
                        }
                    }
                }
                Ok(())
            }
            Err(_) => Err(format!("cannot list {}", proc_root.display())),
        }
    };
    found
        .into_iter()
        .map(|(port, mut list)| {
            let bound = wanted.values().any(|ps| ps.contains(&port));
            let result = if !bound {
                Ok(Vec::new())
            } else if let Err(e) = &listed {
                Err(e.clone())
            } else if list.is_empty() {
                Err(if unreadable > 0 {
                    format!(
                        "a socket holds it, but its process is among {unreadable} this user cannot inspect (run as root to name it)"
                    )
                } else {
                    "a socket holds it, but no process owns it (it may be closing, or in another PID namespace)".into()
                })
            } else {
                list.sort_by_key(|h| h.pid);
                Ok(list)
            };
            (port, result)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forked child still holds our sockets until its exec: it is this
    /// job, not a stranger on the port (seen in a Slurm prolog, where a
    /// `command` check forked while the port check read /proc). The
    /// process that started this one is this job's too when it is
    /// torchrun's agent, named as what it is; another launcher (a shell,
    /// slurmstepd) holding the port is a conflict.
    #[test]
    fn a_child_or_an_ancestor_of_ours_is_this_job_and_a_stranger_is_not() {
        let facts = Facts::new("/".into(), Default::default(), Vec::new());
        let me = std::process::id();
        let holder = |pid, ppid, cmd: &str| Holder {
            pid,
            ppid,
            cmdline: cmd.into(),
            user: String::new(),
        };
        let cmd = "/usr/local/bin/preflight slurm prolog";
        assert_eq!(this_jobs(&facts, &holder(me, 1, cmd)), Some(Ours::Itself));
        assert_eq!(
            this_jobs(&facts, &holder(4_000_000, me, cmd)),
            Some(Ours::Itself)
        );
        assert_eq!(this_jobs(&facts, &holder(4_000_000, 1, cmd)), None);
        let parent = std::os::unix::process::parent_id();
        if parent > 1 {
            let torch =
                "/usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --no_python x";
            assert_eq!(
                this_jobs(&facts, &holder(parent, 1, torch)),
                Some(Ours::Launcher(format!("torchrun pid {parent}")))
            );
            assert_eq!(this_jobs(&facts, &holder(parent, 1, "bash")), None);
        }
    }

    /// Real listeners of this process, asked about at once: each port is
    /// named with its holder, and a free port with nobody.
    #[test]
    fn several_ports_in_one_pass_each_with_its_holder() {
        let facts = Facts::new("/".into(), Default::default(), Vec::new());
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (pa, pb) = (
            a.local_addr().unwrap().port(),
            b.local_addr().unwrap().port(),
        );
        let free = {
            let c = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            c.local_addr().unwrap().port()
        };
        let found = holders_of(&facts, &[pa, free, pb]);
        let me = std::process::id();
        let ports: Vec<u16> = found.iter().map(|(p, _)| *p).collect();
        assert_eq!(ports, [pa, free, pb]);
        for (port, held) in &found {
            let pids: Vec<u32> = held.as_ref().unwrap().iter().map(|h| h.pid).collect();
            if *port == free {
                assert!(pids.is_empty(), "{port}: {pids:?}");
            } else {
                assert_eq!(pids, [me], "{port}");
            }
        }
        assert_eq!(holders(&facts, pb).unwrap()[0].pid, me);
    }

    #[test]
    fn roles_are_recognised() {
        let h = |c: &str| Holder {
            ppid: 1,
            pid: 1,
            cmdline: c.into(),
            user: String::new(),
        };
        assert_eq!(
            h("/usr/bin/python3 -m torch.distributed.run --nproc_per_node 8 train.py").role(),
            Some("a PyTorch job")
        );
        assert_eq!(
            h("/usr/local/bin/torchrun train.py").role(),
            Some("a PyTorch job")
        );
        assert_eq!(
            h("/opt/bin/preflight run").role(),
            Some("another preflight")
        );
        assert_eq!(h("nginx: master process").role(), None);
    }
}
