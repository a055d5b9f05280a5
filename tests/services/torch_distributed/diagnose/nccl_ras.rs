//! Diagnose reading NCCL's RAS port: recorded reports replayed by a
//! server that speaks RAS's client protocol, in its JSON and text forms.

use super::*;

/// One recorded report (fixtures/nccl-ras/), in the JSON or text form.
fn recorded(case: &str, json: bool) -> Vec<u8> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/nccl-ras");
    std::fs::read(dir.join(format!("{case}.{}", if json { "json" } else { "txt" }))).unwrap()
}

/// A server speaking NCCL RAS's client protocol that replays one recorded
/// report (fixtures/nccl-ras/), as NCCL 2.28.7 (JSON) or an older NCCL
/// that knows only the text form (its answer to SET FORMAT is an error).
fn ras_replay(case: &str, json: bool) -> String {
    ras_server(vec![recorded(case, json)], json)
}

/// A server speaking RAS's client protocol: `CLIENT PROTOCOL n` →
/// `SERVER PROTOCOL 2`, `SET FORMAT json` → `OK` or `ERROR: Unknown
/// command ...`, `STATUS` → the report in two sends, then the connection
/// closes; the first connection gets the first of `reports`, the next the
/// next, the last for every later one. Returns its address.
fn ras_server(reports: Vec<Vec<u8>>, json: bool) -> String {
    use std::io::{BufRead, BufReader, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for (n, conn) in l.incoming().enumerate() {
            let Ok(s) = conn else { return };
            let report = &reports[n.min(reports.len() - 1)];
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                let cmd = line.trim().to_ascii_uppercase();
                line.clear();
                let reply = if cmd.starts_with("CLIENT PROTOCOL") {
                    "SERVER PROTOCOL 2\n".to_string()
                } else if cmd == "SET FORMAT JSON" && json {
                    "OK\n".to_string()
                } else if cmd == "STATUS" || cmd == "VERBOSE STATUS" {
                    let (a, b) = report.split_at(report.len() / 3);
                    let _ = w.write_all(a);
                    let _ = w.write_all(b);
                    break;
                } else {
                    format!("ERROR: Unknown command {cmd}\n")
                };
                let _ = w.write_all(reply.as_bytes());
            }
        }
    });
    addr
}

fn ras(addr: &str) -> (i32, Diagnosis) {
    let out = Command::new(common::BIN)
        .args([
            "diagnose", "--format", "json", "--pid", "1", "--py-spy", "off",
        ])
        .args(["--nccl-ras", addr])
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), diagnosis(&out))
}

/// Each recorded report, in each form: the rank RAS points at is named
/// with its node and pid, and a healthy job names nobody.
#[test]
fn nccl_ras_reports_name_the_missing_dead_and_lagging_ranks() {
    let _shared = crate::common::shared();
    for json in [true, false] {
        let form = if json { "json" } else { "text" };
        let (code, d) = ras(&ras_replay("healthy", json));
        let r = d.nccl_ras.as_ref().expect("NCCL RAS's report");
        assert_eq!(r.format, form, "{d:#?}");
        assert_eq!(r.nccl_version.as_deref(), Some("2.28.7"), "{d:#?}");
        assert_eq!(r.communicators, 1, "{d:#?}");
        assert!(r.culprits.is_empty(), "{d:#?}");
        assert_eq!(d.verdict, "no_job", "{d:#?}");
        assert_eq!(code, 3);
        for (case, rank, pid, words) in [
            ("missing", 5, 4241, "missing from communicator"),
            (
                "dead",
                6,
                4242,
                if json {
                    "RAS considers it dead"
                } else {
                    "missing from communicator"
                },
            ),
            (
                "mismatch",
                3,
                4133,
                if json {
                    "behind in AllReduce: launched up to 41 where the others reached 42"
                } else {
                    "behind the others: has launched up to operation 41"
                },
            ),
        ] {
            let (code, d) = ras(&ras_replay(case, json));
            let c = &d.nccl_ras.as_ref().expect("NCCL RAS's report").culprits;
            assert_eq!(c.len(), 1, "{case} {form}: {d:#?}");
            assert_eq!(c[0].rank, rank, "{case} {form}: {d:#?}");
            assert_eq!(c[0].pid, Some(pid), "{case} {form}: {d:#?}");
            let node = if rank < 4 { "127.0.0.21" } else { "127.0.0.22" };
            assert_eq!(c[0].node, node, "{case} {form}: {d:#?}");
            let reason = c[0].reason.as_str();
            assert!(reason.contains(words), "{case} {form}: {reason}");
            // The node RAS names gets preflight's ping check, quoted.
            assert!(
                reason.contains(&format!("; ping check pass: {node} ({node}): 3/3 replies")),
                "{case} {form}: {reason}"
            );
            assert_eq!(d.verdict, "held", "{case} {form}");
            assert_eq!(code, 1, "{case} {form}");
        }
        // The text form says the dead process itself too.
        if !json {
            let (_, d) = ras(&ras_replay("dead", false));
            let f = d
                .nccl_ras
                .as_ref()
                .expect("NCCL RAS's report")
                .findings
                .join("\n");
            assert!(
                f.contains("process 4242 on node 127.0.0.22 is considered dead"),
                "{f}"
            );
        }
    }
    // Nothing listening where asked: said, never guessed at.
    let port = common::unused_port("127.0.0.1");
    let (code, d) = ras(&format!("127.0.0.1:{port}"));
    let e = d
        .nccl_ras
        .as_ref()
        .and_then(|r| r.error.as_deref())
        .unwrap_or_else(|| panic!("no error said: {d:#?}"));
    assert!(e.starts_with("no NCCL RAS at 127.0.0.1:"), "{e}");
    assert_eq!(code, 3);
}

/// Two reports across the window: a rank a collective behind in both, at
/// the same count, is named; one whose counts moved between them (the
/// whole job a dozen collectives on, the rank still one behind, as a
/// healthy job caught mid-collective is) is not, and the counts that grew
/// are said.
#[test]
fn nccl_ras_names_a_rank_behind_only_where_two_reports_agree() {
    let _shared = crate::common::shared();
    for json in [true, false] {
        let first = recorded("mismatch", json);
        let later = String::from_utf8(first.clone())
            .unwrap()
            .replace("\"AllReduce\": 42", "\"AllReduce\": 54")
            .replace("\"AllReduce\": 41", "\"AllReduce\": 53")
            .replace("up to 41 ", "up to 53 ")
            .replace("operation 42", "operation 54")
            .replace("operation 41", "operation 53");
        assert_ne!(later.as_bytes(), first.as_slice());
        let (code, d) = ras(&ras_server(vec![first, later.into_bytes()], json));
        let r = d.nccl_ras.as_ref().expect("NCCL RAS's report");
        assert!(r.culprits.is_empty(), "json {json}: {d:#?}");
        let moved = r.moved.as_deref().unwrap_or_else(|| panic!("{d:#?}"));
        let n = if json { 8 * 12 } else { 2 * 12 };
        assert_eq!(
            moved,
            format!("NCCL RAS counted {n} more collectives across the window"),
            "json {json}"
        );
        assert_eq!(code, 3, "json {json}: {d:#?}");
    }
}
