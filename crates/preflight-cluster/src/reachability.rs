//! All-pairs reachability: every node connects to every other node's probe
//! listener and exchanges a short echo. TCP tells the failures apart: a
//! reset is `refused` (nothing listens, or a firewall REJECTs), no SYN-ACK
//! is `timed_out` (a firewall DROPs), an ICMP error is `unreachable`, and
//! a connection accepted with no echo is `no_answer`: the kernel answered
//! for the node, so no firewall drops it, but the rank behind the
//! listener did not (stopped, or starved of CPU). A failed probe is tried
//! once more, with twice the time, before it counts: one late echo from a
//! busy node is not a fault. The listener answers from a thread of its
//! own, so a rank whose runtime is busy still echoes.
//!
//! Up to `ALL_PAIRS_MAX` nodes every ordered pair is probed (N×(N-1)
//! connects, in parallel per node). Above it each node probes its ring
//! neighbours and its hypercube partners (i XOR 2^k), O(N log N) in all,
//! which still crosses every switch boundary of a typical fabric.

use std::io::ErrorKind;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use preflight_kinds::ports::PortRange;
use preflight_kinds::tcp_connect;
use preflight_result::cluster::{NO_ANSWER, Probe};

pub const ALL_PAIRS_MAX: usize = 64;
const ECHO: &[u8; 8] = b"pfprobe\n";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    pub node: usize,
    pub addr: String,
}

/// Which nodes node `i` of `n` probes.
pub fn partners(i: usize, n: usize) -> Vec<usize> {
    if n <= ALL_PAIRS_MAX {
        return (0..n).filter(|&j| j != i).collect();
    }
    let mut out = vec![(i + 1) % n, (i + n - 1) % n];
    let mut bit = 1;
    while bit < n {
        let j = i ^ bit;
        if j < n {
            out.push(j);
        }
        bit <<= 1;
    }
    out.sort_unstable();
    out.dedup();
    out.retain(|&j| j != i);
    out
}

/// The probe listener on `ip`: the first port of `ports` that can be
/// bound (a taken one moves on to the next), or an ephemeral port. When
/// every port of the range is taken (a stranger can bind them all before
/// the job starts), an ephemeral port, with the ports that were taken:
/// the listener's port is announced through the authenticated check-in,
/// so a squatter moves the probe, it does not make the node unreachable.
/// `Err` says why no listener could be had at all, for the matrix.
pub async fn listen(ip: &str, ports: Option<PortRange>) -> Result<Listening, String> {
    let ephemeral = || async {
        TcpListener::bind((ip, 0))
            .await
            .map_err(|e| format!("cannot open a probe listener on {ip}: {e}"))
    };
    let Some(range) = ports else {
        return Ok(Listening {
            listener: ephemeral().await?,
            taken: None,
        });
    };
    let mut other = None;
    for port in range.ports() {
        match TcpListener::bind((ip, port)).await {
            Ok(l) => {
                return Ok(Listening {
                    listener: l,
                    taken: None,
                });
            }
            Err(e) if e.kind() == ErrorKind::AddrInUse => {}
            Err(e) => other = Some(format!("port {port}: {e}")),
        }
    }
    match other {
        None => Ok(Listening {
            listener: ephemeral().await?,
            taken: Some(range),
        }),
        Some(e) => Err(format!(
            "no probe listener: no port of the probe range {range} could be bound on {ip} ({e}) (--probe-ports / PREFLIGHT_PROBE_PORTS)"
        )),
    }
}

pub struct Listening {
    pub listener: TcpListener,
    /// The probe range, when every port of it was taken and the listener
    /// is on an ephemeral port instead.
    pub taken: Option<PortRange>,
}

/// Serves echoes on a thread of its own until the handle is dropped: a
/// rank whose runtime is busy (gathering facts, a slow check) still
/// answers its peers' probes at once, so its silence means the process
/// itself is stopped or starved.
pub fn serve_apart(listener: TcpListener) -> Result<Serving, String> {
    let listener = listener
        .into_std()
        .map_err(|e| format!("the probe listener: {e}"))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("probe-echo".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else {
                    return;
                };
                tokio::select! {
                    () = serve(listener) => {}
                    _ = stopped => {}
                }
            });
        })
        .map_err(|e| format!("cannot start the probe listener's thread: {e}"))?;
    Ok(Serving { _stop: stop })
}

/// The probe listener's thread: it stops, and its port closes, when this
/// is dropped.
pub struct Serving {
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Serves echoes until the task is dropped. Each connection gets one
/// second: a peer that connects and says nothing costs nothing else.
pub async fn serve(listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            // Out of file descriptors and the like: back off instead of
            // spinning on the error.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                let mut buf = [0u8; 8];
                stream.read_exact(&mut buf).await?;
                stream.write_all(&buf).await
            })
            .await;
        });
    }
}

/// Probes `target`: one try within `timeout`, and when it fails, a second
/// within twice that, whose result counts (the first's is kept in its
/// words).
pub async fn probe(from: usize, target: &Target, timeout: Duration) -> Probe {
    let first = probe_once(from, target, timeout).await;
    if first.status == "ok" {
        return first;
    }
    let mut again = probe_once(from, target, timeout * 2).await;
    if again.status != "ok" {
        let was = first.detail.as_deref().unwrap_or(&first.status);
        again.detail = Some(match again.detail.take() {
            Some(d) => format!("{d} (tried twice; the first: {was})"),
            None => format!("tried twice; the first: {was}"),
        });
    }
    again
}

/// One try: connect and echo within `timeout`.
async fn probe_once(from: usize, target: &Target, timeout: Duration) -> Probe {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut result = Probe {
        from,
        to: target.node,
        status: "ok".into(),
        rtt_ms: None,
        detail: None,
    };
    // A lost SYN is retransmitted by the kernel only after a second: on a
    // lossy link one lost packet would read as a DROP rule. Up to three
    // tries share the deadline; a real DROP times out all three alike.
    let attempt = (timeout / 3).max(Duration::from_millis(50));
    let connect = loop {
        let until = (Instant::now() + attempt).min(deadline);
        match tokio::time::timeout_at(until, TcpStream::connect(&target.addr)).await {
            Err(_) if until < deadline => continue,
            other => break other,
        }
    };
    let mut stream = match connect {
        Err(_) => {
            result.status = "timed_out".into();
            result.detail = Some(format!(
                "no answer within {} ms (packets dropped)",
                timeout.as_millis()
            ));
            return result;
        }
        Ok(Err(e)) => {
            result.status = tcp_connect::classify(&e).name().into();
            result.detail = Some(e.to_string());
            return result;
        }
        Ok(Ok(s)) => s,
    };
    let echo = tokio::time::timeout_at(deadline, async {
        stream.write_all(ECHO).await?;
        let mut buf = [0u8; 8];
        stream.read_exact(&mut buf).await?;
        Ok::<bool, std::io::Error>(&buf == ECHO)
    })
    .await;
    match echo {
        Ok(Ok(true)) => result.rtt_ms = Some(start.elapsed().as_secs_f64() * 1000.0),
        Ok(Ok(false)) => {
            result.status = "error".into();
            result.detail = Some("connected, but the echo came back wrong".into());
        }
        Ok(Err(e)) => {
            result.status = "error".into();
            result.detail = Some(format!("connected, but the echo failed: {e}"));
        }
        Err(_) => {
            result.status = NO_ANSWER.into();
            result.detail = Some(format!(
                "connected, but no echo within {} ms: the node accepts but does not answer (stopped or starved?)",
                timeout.as_millis()
            ));
        }
    }
    result
}

/// The probes of one node, all at once; at most `ALL_PAIRS_MAX` of them:
/// no plan of rank 0's names more, whatever a message says.
pub async fn probe_all(from: usize, targets: &[Target], timeout: Duration) -> Vec<Probe> {
    let mut set = tokio::task::JoinSet::new();
    for t in targets.iter().take(ALL_PAIRS_MAX) {
        let t = t.clone();
        set.spawn(async move { probe(from, &t, timeout).await });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(p) = r {
            out.push(p);
        }
    }
    out.sort_by_key(|p| p.to);
    out
}

/// Reads the matrix for patterns: a node that every peer fails to reach
/// while it reaches them is the one whose firewall (or listener) is at
/// fault; a node that reaches nobody has a fault on its own side. Each
/// finding comes with the node it singles out, if one.
///
/// A pattern blames a node only on evidence that points at it and not at
/// its peer: several peers that agree, or the node's own checks
/// (`own_fault[x]`: its firewall check found a rule that blocks). One
/// failed pair and nothing else (two nodes, A cannot reach B, B reaches
/// A, no rule on either) fits B's inbound as well as A's outbound or a
/// filter between them: the link is named and nobody is blamed, so that
/// a Slurm prolog drains nobody on a guess.
pub fn culprits(
    n: usize,
    probes: &[Probe],
    names: &[String],
    own_fault: &[bool],
) -> Vec<(Option<usize>, String)> {
    let mut out = Vec::new();
    let mut blamed = vec![false; n];
    // Nodes named as silent: their peers' failed echoes are said.
    let mut quiet = vec![false; n];
    let faulty = |x: usize| own_fault.get(x).copied().unwrap_or(false);
    for (x, name) in names.iter().enumerate().take(n) {
        let inbound: Vec<&Probe> = probes.iter().filter(|p| p.to == x).collect();
        let outbound: Vec<&Probe> = probes.iter().filter(|p| p.from == x).collect();
        let in_failed = inbound.iter().filter(|p| p.status != "ok").count();
        let out_ok = outbound.iter().filter(|p| p.status == "ok").count();
        let evidence = |peers: usize| {
            if faulty(x) {
                " (its own firewall check found a blocking rule)"
            } else if peers >= 2 {
                ""
            } else {
                "?"
            }
        };
        let silent = inbound.iter().filter(|p| p.status == NO_ANSWER).count();
        if !inbound.is_empty() && silent == inbound.len() {
            // The kernel accepted every connection: no firewall drops
            // them, and nothing on the network is to blame. Its rank is
            // named, singled out for nothing.
            quiet[x] = true;
            out.push((
                None,
                format!(
                    "{name} accepts connections but does not answer (stopped or starved?): every peer's probe connected and got no echo ({} of {}), twice; not a firewall",
                    silent,
                    inbound.len()
                ),
            ));
            continue;
        }
        if !inbound.is_empty() && in_failed == inbound.len() && out_ok > 0 {
            let why = evidence(inbound.len());
            if why == "?" {
                continue;
            }
            let kind = &inbound[0].status;
            let how = match kind.as_str() {
                "timed_out" => "drops incoming connections (a firewall DROP rule?)",
                "refused" => "refuses incoming connections (a firewall REJECT rule?)",
                _ => "cannot be reached",
            };
            blamed[x] = true;
            out.push((
                Some(x),
                format!(
                    "{name} {how}: every peer failed to reach it ({kind}) while it reached {out_ok} of {}{why}",
                    outbound.len()
                ),
            ));
        } else if !outbound.is_empty() && out_ok == 0 && in_failed < inbound.len() {
            let why = evidence(outbound.len());
            if why == "?" {
                continue;
            }
            blamed[x] = true;
            out.push((
                Some(x),
                format!(
                    "{name} reaches none of its peers while they reach it: its outgoing traffic is blocked{why}"
                ),
            ));
        }
    }
    // What no blamed node explains is a link: named, with both ends of
    // the doubt, blaming neither.
    for p in probes.iter().filter(|p| p.status != "ok") {
        if blamed.get(p.from).copied().unwrap_or(false)
            || blamed.get(p.to).copied().unwrap_or(false)
            || quiet.get(p.to).copied().unwrap_or(false)
        {
            continue;
        }
        let (from, to) = (&names[p.from], &names[p.to]);
        if p.status == NO_ANSWER {
            out.push((
                None,
                format!(
                    "{from} to {to}: {to} accepted the connection but did not answer, twice (stopped or starved?); not a firewall"
                ),
            ));
            continue;
        }
        let back = probes
            .iter()
            .find(|q| q.from == p.to && q.to == p.from)
            .map(|q| q.status.as_str());
        let doubt = if back == Some("ok") {
            format!(
                "{to}'s inbound or {from}'s outbound is filtered, or something between them is ({to} reaches {from}; neither node's own checks found a rule)"
            )
        } else {
            "the link between them, or a filter on it, fails".to_string()
        };
        out.push((
            None,
            format!("{from} to {to} fails ({}): {doubt}", p.status),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_clusters_probe_all_pairs_large_ones_a_subset() {
        assert_eq!(partners(1, 4), vec![0, 2, 3]);
        let n = 1000;
        let p = partners(5, n);
        assert!(p.contains(&4) && p.contains(&6) && p.contains(&(5 ^ 512)));
        assert!(p.len() <= 2 + 10, "{p:?}");
        assert_eq!(partners(0, 1), Vec::<usize>::new());
    }

    #[test]
    fn a_taken_probe_port_moves_on_and_an_exhausted_range_falls_back_to_an_ephemeral_port() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // Two adjacent ports, the first held by another listener.
            let (held, first) = loop {
                let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let p = a.local_addr().unwrap().port();
                if p < 65535 && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
                    break (a, p);
                }
            };
            let range = PortRange {
                first,
                last: first + 1,
            };
            let l = listen("127.0.0.1", Some(range)).await.unwrap();
            assert_eq!(l.listener.local_addr().unwrap().port(), first + 1);
            assert_eq!(l.taken, None);
            // Both taken now: an ephemeral port, and the range said.
            let e = listen("127.0.0.1", Some(range)).await.unwrap();
            let port = e.listener.local_addr().unwrap().port();
            assert!(port != first && port != first + 1 && port != 0);
            assert_eq!(e.taken, Some(range));
            drop(held);
            let eph = listen("127.0.0.1", None).await.unwrap();
            assert_ne!(eph.listener.local_addr().unwrap().port(), 0);
            assert_eq!(eph.taken, None);
        });
    }

    fn seen(from: usize, to: usize, status: &str) -> Probe {
        Probe {
            from,
            to,
            status: status.into(),
            rtt_ms: None,
            detail: None,
        }
    }

    /// Two nodes, A cannot reach B, B reaches A: B's inbound, A's
    /// outbound or a filter between them. Only B's own firewall rule
    /// decides; without it the link is named and nobody blamed.
    #[test]
    fn one_failed_pair_blames_only_the_node_whose_own_checks_agree() {
        let names: Vec<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        let probes = [seen(0, 1, "timed_out"), seen(1, 0, "ok")];
        let c = culprits(2, &probes, &names, &[false, true]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].0, Some(1), "{c:?}");
        assert!(c[0].1.starts_with("b drops incoming connections"), "{c:?}");
        assert!(
            c[0].1
                .ends_with("(its own firewall check found a blocking rule)"),
            "{c:?}"
        );

        let c = culprits(2, &probes, &names, &[false, false]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].0, None, "nobody is blamed on a guess: {c:?}");
        assert_eq!(
            c[0].1,
            "a to b fails (timed_out): b's inbound or a's outbound is filtered, or something between them is (b reaches a; neither node's own checks found a rule)"
        );
    }

    /// Three nodes, A's outgoing connections blocked: two peers agree.
    #[test]
    fn a_node_that_reaches_none_of_several_peers_is_named() {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let mut probes = Vec::new();
        for from in 0..3 {
            for to in 0..3 {
                if from != to {
                    probes.push(seen(from, to, if from == 0 { "timed_out" } else { "ok" }));
                }
            }
        }
        let c = culprits(3, &probes, &names, &[false; 3]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].0, Some(0), "{c:?}");
        assert!(c[0].1.contains("its outgoing traffic is blocked"), "{c:?}");
    }

    #[test]
    fn a_node_everyone_fails_to_reach_is_named() {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let mut probes = Vec::new();
        for from in 0..3 {
            for to in 0..3 {
                if from != to {
                    probes.push(Probe {
                        from,
                        to,
                        status: if to == 2 { "timed_out" } else { "ok" }.into(),
                        rtt_ms: None,
                        detail: None,
                    });
                }
            }
        }
        let c = culprits(3, &probes, &names, &[false; 3]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].0, Some(2), "{c:?}");
        assert!(c[0].1.starts_with("c drops"), "{c:?}");
    }

    #[test]
    fn a_plan_naming_thousands_of_peers_is_probed_for_64_at_most() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = free.local_addr().unwrap().to_string();
            drop(free);
            let targets: Vec<Target> = (0..5000)
                .map(|node| Target {
                    node,
                    addr: addr.clone(),
                })
                .collect();
            let got = probe_all(0, &targets, Duration::from_millis(200)).await;
            assert_eq!(got.len(), ALL_PAIRS_MAX);
        });
    }

    /// A listener whose kernel accepts but whose process never echoes is
    /// `no_answer`, after a second try, never `timed_out`; a probe whose
    /// first echo does not come but whose second does is ok.
    #[test]
    fn accepted_without_an_echo_is_no_answer_and_a_second_try_can_pass() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // Never accepted by the program: the kernel completes the
            // handshake into the backlog, and nothing reads.
            let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = mute.local_addr().unwrap().to_string();
            let t = Target { node: 2, addr };
            let p = probe(0, &t, Duration::from_millis(100)).await;
            assert_eq!(p.status, NO_ANSWER, "{p:?}");
            let detail = p.detail.unwrap();
            assert!(
                detail.contains("accepts but does not answer (stopped or starved?)"),
                "{detail}"
            );
            assert!(detail.contains("tried twice"), "{detail}");
            // The first connection is held without an echo, the second
            // is served.
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            let server = async move {
                let (held, _) = l.accept().await.unwrap();
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = [0u8; 8];
                s.read_exact(&mut buf).await.unwrap();
                s.write_all(&buf).await.unwrap();
                drop(held);
            };
            let t = Target { node: 1, addr };
            let (p, ()) = tokio::join!(probe(0, &t, Duration::from_millis(200)), server);
            assert_eq!(p.status, "ok", "{p:?}");
        });
    }

    /// The echo is served from a thread of its own: a rank whose runtime
    /// is blocked still answers.
    #[test]
    fn a_busy_rank_still_echoes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            let _serving = serve_apart(l).unwrap();
            // This runtime is blocked until the probe, made from another
            // thread, has its answer.
            let p = std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(probe(0, &Target { node: 1, addr }, Duration::from_secs(2)))
            })
            .join()
            .unwrap();
            assert_eq!(p.status, "ok", "{p:?}");
        });
    }

    /// Every peer connected to c and got no echo: c is named as silent,
    /// blamed for nothing, and no firewall is suspected; one silent pair
    /// is said as such.
    #[test]
    fn a_silent_node_is_not_a_firewall() {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let mut probes = Vec::new();
        for from in 0..3 {
            for to in 0..3 {
                if from != to {
                    probes.push(seen(from, to, if to == 2 { NO_ANSWER } else { "ok" }));
                }
            }
        }
        let c = culprits(3, &probes, &names, &[false; 3]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].0, None, "{c:?}");
        assert_eq!(
            c[0].1,
            "c accepts connections but does not answer (stopped or starved?): every peer's probe connected and got no echo (2 of 2), twice; not a firewall"
        );
        assert!(!c[0].1.contains("drops"), "{c:?}");
        let mut probes: Vec<Probe> = probes.iter().map(|p| seen(p.from, p.to, "ok")).collect();
        probes[0].status = NO_ANSWER.into();
        let c = culprits(3, &probes, &names, &[false; 3]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(
            c[0].1,
            "a to b: b accepted the connection but did not answer, twice (stopped or starved?); not a firewall"
        );
        assert_eq!(c[0].0, None);
        assert!(c[0].1.contains("did not answer"), "{c:?}");
        assert!(!c[0].1.contains("filtered"), "{c:?}");
    }

    #[test]
    fn refused_and_dropped_are_told_apart() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // A port that was just free: nothing listens, the kernel resets.
            let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = free.local_addr().unwrap().to_string();
            drop(free);
            let p = probe(0, &Target { node: 1, addr }, Duration::from_secs(1)).await;
            assert_eq!(p.status, "refused", "{p:?}");
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap().to_string();
            tokio::spawn(serve(l));
            let p = probe(0, &Target { node: 1, addr }, Duration::from_secs(1)).await;
            assert_eq!(p.status, "ok", "{p:?}");
        });
    }
}
