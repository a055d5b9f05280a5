use super::pending::pending_limits;
use super::*;
use crate::client::{ClientConfig, await_verdict, connect};
use crate::protocol::{self, FrameError, Msg};
use crate::test_support::{block_on, ranked, server};
use crate::{reachability, store};
use preflight_result::Verdict;

/// A process that checks in after the verdict went out is told it came
/// too late and who held its rank, instead of waiting for a verdict
/// that never comes.
#[test]
fn a_check_in_after_the_verdict_is_told_it_is_too_late() {
    block_on(async {
        let (server, client) = server(1, 5).await;
        let check_in = |c: CheckIn| Msg::CheckIn(Box::new(c));
        let mut first = connect(&client).await.unwrap();
        // Checking in a second after rank 0's start: a deadline counted
        // afresh from the verdict would land a second late.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let sample = crate::checkin::sample;
        protocol::write(&mut first, &check_in(sample(0, 1, "h0")), client.deadline)
            .await
            .unwrap();
        let (report, until) = await_verdict(&mut first, client.verdict_deadline)
            .await
            .unwrap();
        assert_eq!(report.verdict, Verdict::Ready);
        // The run's deadline travels with the verdict: rank 0's, not a
        // fresh --timeout from the moment the verdict arrived.
        assert!(until > Instant::now(), "{until:?}");
        assert!(
            until <= client.deadline + Duration::from_millis(500),
            "{until:?}"
        );
        assert!(server.await.unwrap().barrier.complete);
        // The barrier has closed: a second claimant of rank 0, then a
        // rank outside the world.
        for (rank, why) in [
            (
                0,
                "rank 0 had checked in from h0 (10.0.0.1, connected from 127.0.0.1) pid 100: this process is a second claimant of rank 0",
            ),
            (3, "rank 3 is outside the world of 1 rank"),
        ] {
            let mut late = connect(&client).await.unwrap();
            protocol::write(&mut late, &check_in(sample(rank, 1, "h9")), client.deadline)
                .await
                .unwrap();
            let e = await_verdict(&mut late, client.verdict_deadline)
                .await
                .unwrap_err();
            assert!(
                e.contains(
                    "too late: rank 0 had already sent the verdict (ready: 1 of 1 rank checked in)"
                ) && e.contains(why),
                "{e}"
            );
        }
    });
}

#[test]
fn pending_limits_leave_the_world_its_descriptors() {
    // Plenty of descriptors: the fixed ceiling; a node's ranks fit.
    assert_eq!(pending_limits(Some((1 << 20, 1 << 20)), 512, 8), (4096, 64));
    assert_eq!(
        pending_limits(Some((1 << 20, 1 << 20)), 300, 300),
        (4096, 600)
    );
    // 1,024 descriptors and 300 ranks: half of what the world leaves.
    assert_eq!(pending_limits(Some((1024, 1024)), 300, 300), (330, 330));
    // Fewer descriptors than the world needs: a floor, never a panic.
    assert_eq!(pending_limits(Some((32, 32)), 48, 48), (16, 16));
}

/// An authenticated peer that checks in with a 3 MiB hostname and
/// thousands of variables: rank 0 keeps and sends a bounded view of
/// it, and the verdict stays small and deliverable.
#[test]
fn a_check_in_with_huge_fields_is_bounded_on_receipt() {
    block_on(async {
        // Over the 1 MiB a rank's frame may have: refused unread.
        let (_server, client) = server(1, 5).await;
        let c = crate::checkin::sample(0, 1, &"h".repeat(3 << 20));
        let mut conn = connect(&client).await.unwrap();
        let _ = protocol::write(&mut conn, &Msg::CheckIn(Box::new(c)), client.deadline).await;
        let e = await_verdict(&mut conn, client.verdict_deadline)
            .await
            .unwrap_err();
        assert!(e.contains("the master went away before the verdict"), "{e}");
        // Under it, but with every field far too large: bounded.
        let (server, client) = server(1, 5).await;
        let mut c = crate::checkin::sample(0, 1, &"h".repeat(512 << 10));
        c.env = (0..300)
            .map(|i| (format!("NCCL_{i}"), "v".repeat(1000)))
            .collect();
        let mut conn = connect(&client).await.unwrap();
        protocol::write(&mut conn, &Msg::CheckIn(Box::new(c)), client.deadline)
            .await
            .unwrap();
        let (report, _) = await_verdict(&mut conn, client.verdict_deadline)
            .await
            .unwrap();
        assert!(
            report.nodes[0].hostname.len() < 512,
            "{}",
            report.nodes[0].hostname.len()
        );
        // It claimed 10.0.0.1 and connected from loopback: both named.
        assert_eq!(report.nodes[0].addr, "10.0.0.1");
        assert_eq!(report.nodes[0].seen_from.as_deref(), Some("127.0.0.1"));
        assert!(
            report.warnings.iter().any(|w| w
                .contains("says its address is 10.0.0.1 but its connection came from 127.0.0.1")),
            "{:?}",
            report.warnings
        );
        let size = serde_json::to_vec(&report).unwrap().len();
        assert!(size < 128 << 10, "a verdict of {size} bytes");
        drop(server);
    });
}

async fn both_ranked(client: &ClientConfig) -> (Channel, Channel) {
    let mut a = ranked(client, 0, 2, "h0").await;
    let mut b = ranked(client, 1, 2, "h0").await;
    await_verdict(&mut a, client.verdict_deadline)
        .await
        .unwrap();
    await_verdict(&mut b, client.verdict_deadline)
        .await
        .unwrap();
    (a, b)
}

/// Store keys belong to ranks: rank 1 may not forge rank 0's report or
/// plan, nor replace what it published; a process that has not checked
/// in, or came second for a rank, writes nothing.
#[test]
fn store_keys_are_written_once_by_their_own_rank() {
    block_on(async {
        let start = Instant::now();
        let (_server, client) = server(2, 2).await;
        let (mut a, mut b) = both_ranked(&client).await;
        let deadline = start + Duration::from_secs(4);
        let refused = |r: Result<(), FrameError>| match r {
            Err(FrameError::Refused(why)) => why,
            other => panic!("not refused: {other:?}"),
        };
        for key in [
            "coll/report",
            "coll/nccl/plan",
            "coll/tcp/addr/0",
            "coll/report#0",
        ] {
            let why = refused(store::set(&mut b, key, "forged", deadline).await);
            assert!(
                why.contains(&format!(
                    "`{key}` is rank 0's to write, and this connection is rank 1's"
                )),
                "{why}"
            );
        }
        store::set(&mut b, "coll/tcp/addr/1", "10.0.0.2:1", deadline)
            .await
            .unwrap();
        // The same value again is a retry; another one is refused.
        store::set(&mut b, "coll/tcp/addr/1", "10.0.0.2:1", deadline)
            .await
            .unwrap();
        let why = refused(store::set(&mut b, "coll/tcp/addr/1", "6.6.6.6:1", deadline).await);
        assert!(
            why.contains("already set, and keys are written once"),
            "{why}"
        );
        store::set(&mut a, "coll/report", "real", deadline)
            .await
            .unwrap();
        let got = store::get(&mut b, "coll/report", Duration::ZERO, deadline).await;
        assert_eq!(got.unwrap().as_deref(), Some("real"));
        // Authenticated, never checked in.
        let mut stranger = connect(&client).await.unwrap();
        let why = refused(store::set(&mut stranger, "coll/result/1", "x", deadline).await);
        assert!(why.contains("has not checked in"), "{why}");
        // A second process claiming rank 1, after the verdict.
        let mut second = ranked(&client, 1, 2, "h9").await;
        let _ = await_verdict(&mut second, client.verdict_deadline).await;
        let why = refused(store::set(&mut second, "coll/result/1", "x", deadline).await);
        assert!(
            why.contains("another process checked in as rank 1 first"),
            "{why}"
        );
    });
}

/// An authenticated peer cannot make rank 0 hold much: a key over the
/// limit is refused on a get too, a get waits alone on its connection,
/// a frame over 1 MiB closes the connection, and connections beyond
/// what the world needs are turned away.
#[test]
fn an_authenticated_peer_cannot_exhaust_rank_0() {
    block_on(async {
        let start = Instant::now();
        let (_server, client) = server(1, 3).await;
        let deadline = start + Duration::from_secs(3);
        let mut c = connect(&client).await.unwrap();
        let e = store::get(&mut c, &"k".repeat(300), Duration::ZERO, deadline)
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("a key of 300 bytes, over the 256 allowed"),
            "{e}"
        );
        // Two gets at once on one connection: the second is refused
        // at once, the first still answered.
        let get = |key: &str| Msg::StoreGet {
            key: key.into(),
            wait_ms: 300,
        };
        protocol::write(&mut c, &get("a"), deadline).await.unwrap();
        protocol::write(&mut c, &get("b"), deadline).await.unwrap();
        match protocol::read(&mut c, deadline).await.unwrap() {
            Msg::Rejected { reason, .. } => {
                assert!(reason.contains("one get at a time"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            protocol::read(&mut c, deadline).await.unwrap(),
            Msg::StoreValue { value: None, .. }
        ));
        // A 4 MiB key: the frame is over what a rank may send.
        let huge = Msg::StoreGet {
            key: "k".repeat(4 << 20),
            wait_ms: 0,
        };
        let mut h = connect(&client).await.unwrap();
        let _ = protocol::write(&mut h, &huge, deadline).await;
        assert!(protocol::read(&mut h, deadline).await.is_err());
        // A world of 1 needs 66 connections at most.
        let mut held = Vec::new();
        let mut turned_away = None;
        for _ in 0..80 {
            let mut conn = connect(&client).await.unwrap();
            let ping = Msg::TimeRequest { t0: 0 };
            protocol::write(&mut conn, &ping, deadline).await.unwrap();
            match protocol::read(&mut conn, deadline).await {
                Ok(Msg::TimeReply { .. }) => held.push(conn),
                Ok(Msg::Rejected { reason, .. }) => {
                    turned_away = Some(reason);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        let why = turned_away.expect("some connection turned away");
        assert!(
            why.contains("already holds 66 authenticated connections"),
            "{why}"
        );
        assert!(held.len() <= 66, "{}", held.len());
    });
}

/// Probe results count only from the rank asked to probe for its node,
/// about the peers it was asked to probe: a forged "node 0 cannot
/// reach node 1" sent early by another rank is ignored.
#[test]
fn forged_probe_results_are_ignored() {
    block_on(async {
        let (server, client) = server(3, 5).await;
        let mut conns = Vec::new();
        for (rank, host) in [(2u32, "h2"), (0, "h0"), (1, "h1")] {
            let listener = reachability::listen("127.0.0.1", None)
                .await
                .unwrap()
                .listener;
            let addr = listener.local_addr().unwrap().to_string();
            tokio::spawn(reachability::serve(listener));
            let mut c = crate::checkin::sample(rank, 3, host);
            c.probe_addr = Some(addr);
            let mut conn = connect(&client).await.unwrap();
            protocol::write(&mut conn, &Msg::CheckIn(Box::new(c)), client.deadline)
                .await
                .unwrap();
            if rank == 2 {
                let forged = Msg::ProbeResults {
                    results: vec![Probe {
                        from: 0,
                        to: 1,
                        status: "timed_out".into(),
                        rtt_ms: None,
                        detail: Some("forged".into()),
                    }],
                };
                protocol::write(&mut conn, &forged, client.deadline)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            conns.push(conn);
        }
        let waits: Vec<_> = conns
            .into_iter()
            .map(|mut c| {
                let d = client.verdict_deadline;
                tokio::spawn(async move { await_verdict(&mut c, d).await.map(|_| ()) })
            })
            .collect();
        for w in waits {
            w.await.unwrap().unwrap();
        }
        let report = server.await.unwrap();
        assert!(
            report.reachability.probes.iter().all(|p| p.status == "ok"),
            "{:#?}",
            report.reachability.probes
        );
        assert_eq!(report.reachability.probes.len(), 6);
    });
}

/// The store API the collective stages use, over real authenticated
/// connections of checked-in ranks to a real server.
#[test]
fn ranks_exchange_values_through_the_store() {
    block_on(async {
        let start = Instant::now();
        let (server, client) = server(2, 2).await;
        let (mut a, mut b) = both_ranked(&client).await;
        let deadline = start + Duration::from_secs(4);
        let waiter =
            async { store::get(&mut b, "nccl-unique-id", Duration::from_secs(1), deadline).await };
        let setter = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            store::set(&mut a, "nccl-unique-id", "00ff", deadline).await
        };
        let (got, set) = tokio::join!(waiter, setter);
        set.unwrap();
        assert_eq!(got.unwrap().as_deref(), Some("00ff"));
        let none = store::get(&mut a, "absent", Duration::from_millis(20), deadline).await;
        assert_eq!(none.unwrap(), None);
        assert!(server.await.unwrap().barrier.complete);
    });
}

/// A value far above one item's limit goes through a real server in
/// parts and comes back whole; one above the store's capacity is an
/// error, never a hang or a silent loss.
#[test]
fn large_values_go_through_the_store_in_parts() {
    block_on(async {
        let start = Instant::now();
        let (server, client) = server(2, 3).await;
        let (mut a, mut b) = both_ranked(&client).await;
        let deadline = start + Duration::from_secs(5);
        let value: String = "rank 299 é€ ".chars().cycle().take(300_000).collect();
        let waiter = store::get_large(&mut b, "coll/report", Duration::from_secs(2), deadline);
        let setter = store::set_large(&mut a, "coll/report", &value, deadline);
        let (got, set) = tokio::join!(waiter, setter);
        set.unwrap();
        assert_eq!(got.unwrap().as_deref(), Some(value.as_str()));
        // A plain value under the key is no parts header: named.
        store::set(&mut a, "plain", "x", deadline).await.unwrap();
        let e = store::get_large(&mut b, "plain", Duration::ZERO, deadline)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("`x` is not a parts header"), "{e}");
        let huge = "y".repeat(65 << 20);
        let e = store::set_large(&mut a, "huge", &huge, deadline)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("more than the store holds"), "{e}");
        drop(server);
    });
}
