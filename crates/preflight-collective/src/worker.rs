//! The child process that runs one library backend (NCCL or oneCCL) for
//! one rank: `preflight collective-worker`, started by `supervisor`.
//!
//! Why a process of its own: oneCCL's init and operations cannot be
//! interrupted (a rank whose rank 0 is gone blocks in init for minutes),
//! a GPU driver can stall a call, both libraries start threads and exit
//! handlers that outlive any handle we drop, and oneCCL writes its logs on
//! stdout. A child can be killed at a deadline, leaves nothing behind in
//! the rank's own process, and its stdout and stderr become the backend's
//! log instead of mixing with our report.
//!
//! The job comes in [`JOB_ENV`]; the conversation, one JSON object per
//! line over a Unix socket whose path the parent passes in [`SOCKET_ENV`]:
//! child `Probe` → (parent `MakeId` → child `Id`) →
//! parent `Id` → child `Init` → child `Step`… → child `Done`. The parent
//! may say `Stop` instead of `Id` (a rank lacks the library: nobody
//! inits). Every wait on the parent's side has a deadline; the child has
//! none of its own beyond the library's, because the parent kills it.

use super::job::{JOB_ENV, Job, Link, PARENT_ENV};
use super::registry::library;

/// A worker blocked inside a library call outlives a rank that was killed
/// (SIGKILL runs no destructor): the kernel kills it with its parent.
fn die_with_parent() -> Result<(), String> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    // The parent may have died before the line above took effect.
    let expected = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|p| p.parse::<i32>().ok());
    if expected.is_some_and(|p| nix::unistd::getppid().as_raw() != p) {
        return Err("the rank that started this worker is gone".into());
    }
    Ok(())
}

/// `preflight collective-worker`: exit 0 when the conversation ended as
/// it should (including "not available here"), 2 otherwise.
pub fn main() -> i32 {
    if let Err(e) = die_with_parent() {
        eprintln!("preflight collective-worker: {e}");
        return 2;
    }
    let mut link = match Link::connect() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("preflight collective-worker: {e}");
            return 2;
        }
    };
    let job: Job = match std::env::var(JOB_ENV)
        .map_err(|e| format!("{JOB_ENV}: {e}"))
        .and_then(|j| serde_json::from_str(&j).map_err(|e| format!("{JOB_ENV}: {e}")))
    {
        Ok(j) => j,
        Err(e) => {
            eprintln!("preflight collective-worker: {e}");
            return 2;
        }
    };
    let outcome = match library(&job.backend) {
        Some(l) => (l.work)(&job, &mut link),
        None => Err(format!("no library backend named {}", job.backend)),
    };
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            // The parent reads this from our stderr into the backend's log.
            eprintln!("preflight collective-worker: {e}");
            2
        }
    }
}
