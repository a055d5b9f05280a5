//! What the rendezvous waits for, said while it waits (`run`'s ranks and
//! node mode's agent): rank 0's count of the ranks checked in and the first
//! missing ones, another rank's attempts at reaching rank 0.

use std::io::IsTerminal;
use std::time::Duration;

use super::RunSettings;
use preflight_cluster as cluster;
use preflight_report::format::Format;

/// What the rendezvous waits for, said while it waits: on a terminal one
/// line rewritten twice a second, in a log one line every 10 s, nothing
/// in a phase shorter than that (human output only, not with -q).
pub struct Watch {
    pub sender: cluster::Waiting,
    receiver: Option<tokio::sync::watch::Receiver<String>>,
    terminal: bool,
}

impl Watch {
    pub fn new(args: &RunSettings, meets_others: bool) -> Watch {
        if !meets_others || args.format != Format::Human || args.display.quiet {
            return Watch {
                sender: None,
                receiver: None,
                terminal: false,
            };
        }
        let (tx, rx) = tokio::sync::watch::channel(String::new());
        Watch {
            sender: Some(tx),
            receiver: Some(rx),
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// Runs until dropped: the caller selects it beside the stage.
    pub async fn show(&self, deadline: tokio::time::Instant) {
        let Some(rx) = &self.receiver else {
            return std::future::pending().await;
        };
        let every = if self.terminal {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(10)
        };
        let first = if self.terminal {
            Duration::from_secs(1)
        } else {
            every
        };
        tokio::time::sleep(first).await;
        loop {
            let text = rx.borrow().clone();
            if !text.is_empty() {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let line = format!(
                    "waiting: {text}; {} left",
                    preflight_ground::values::format_duration(left)
                );
                if self.terminal {
                    let cut: String = line.chars().take(150).collect();
                    eprint!("\r\x1b[K{cut}");
                } else {
                    eprintln!("preflight: {line}");
                }
            }
            tokio::time::sleep(every).await;
        }
    }

    pub fn done(&self) {
        if self.terminal && self.receiver.is_some() {
            eprint!("\r\x1b[K");
        }
    }
}
