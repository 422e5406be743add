//! End to end on the local stack: a shuffled simulator stream with 20% of events lacking a
//! request id, duplicate publishes and events held back until the rest is ingested. Every
//! narrative must equal the ground truth (members and links), no fact may be stored twice,
//! and `weft rebuild` must reproduce the same narratives from the facts alone.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::pipeline::{distinct_facts, truth_membership, Pipeline};
use weft_schemas::links::NodeKind;
use weft_store::narrative::query;
use weft_store::{ClickHouseConfig, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narratives_match_the_ground_truth_whatever_the_arrival_order() {
    let p = Pipeline::new("it_narr");
    let truth = p.simulate(&[
        "--flows",
        "150",
        "--seed",
        "42",
        "--shuffle",
        "--no-request-id",
        "0.2",
        "--duplicates",
        "0.05",
        "--delay",
        "0.1",
        "--held-back-out",
        p.path("late.jsonl").to_str().unwrap(),
    ]);
    assert!(
        truth.totals.duplicates > 0
            && truth.totals.held_back > 0
            && truth.totals.without_request_id > 0
    );
    let main = p.path("events.jsonl");
    let late = p.path("late.jsonl");
    // Budgets far below the run's size, so late events load evicted components and old
    // copies go through the dedup filter and a ClickHouse check (small batches keep them in
    // other batches than their originals): both must stay exact.
    let addr = format!("127.0.0.1:{}", common::pipeline::free_port());
    let ingest = p.ingest_args(
        Some(&addr),
        &[],
        &[
            "--narrative-max-nodes",
            "300",
            "--dedup-max-entries",
            "20",
            "--batch-max-rows",
            "50",
        ],
    );

    // Everything but the held-back events first, and wait until it is stored...
    p.publish(&main);
    let first = distinct_facts(&[&main]);
    p.wait_for_facts(first, Duration::from_secs(180)).await;
    // ... then the late ones, which must bind to narratives that already exist.
    p.publish(&late);
    let all = distinct_facts(&[&main, &late]);
    assert_eq!(all, truth.totals.distinct_events);
    p.wait_for_facts(all, Duration::from_secs(120)).await;

    let want = truth_membership(&truth);
    p.wait_for_narratives(&want, Duration::from_secs(60)).await;

    // Exactly once: as many rows as distinct facts, none twice.
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, all);
    // ... and the bounded paths were taken, not only the in-memory ones; so was the
    // open filter's (ids named by events with a request id, neither looked up nor kept).
    for name in [
        "weft_ingest_dedup_checked_total",
        "weft_narrative_evicted_nodes_total",
        "weft_narrative_loaded_nodes_total",
        "weft_narrative_ids_spared_total",
        "weft_narrative_direct_total",
    ] {
        let v = common::metric(&addr, name).await.unwrap_or(0);
        assert!(v > 0, "{name} = {v}: the small budgets were not exercised");
    }
    // The id filter's background rebuild ended, and passes after it said so.
    assert_eq!(
        common::metric(&addr, "weft_narrative_id_filter_ready").await,
        Some(1)
    );
    assert_eq!(
        p.scalar("SELECT uniqExact(tenant, kind, id, content_hash) FROM weft_events")
            .await,
        all
    );

    // Links and timeline order, through the same query the CLI and the API use.
    let store = Store::new(ClickHouseConfig {
        url: common::clickhouse_url(),
        database: p.db.clone(),
        ..ClickHouseConfig::default()
    })
    .unwrap();
    for r in &truth.requests {
        let n = query::lookup(&store, "default", &r.request_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n.narrative_id, r.request_id);
        assert_eq!(n.request_id.as_deref(), Some(r.request_id.as_str()));
        let got: BTreeSet<(String, String, String, String, String)> = n
            .links
            .iter()
            .map(|l| {
                (
                    l.from.kind.clone(),
                    l.from.id.clone(),
                    l.to.kind.clone(),
                    l.to.id.clone(),
                    l.via.clone(),
                )
            })
            .collect();
        let want: BTreeSet<(String, String, String, String, String)> = r
            .links
            .iter()
            .filter(|l| l.to.kind != NodeKind::Flow)
            .map(|l| {
                (
                    l.from.kind.as_str().to_owned(),
                    l.from.id.clone(),
                    l.to.kind.as_str().to_owned(),
                    l.to.id.clone(),
                    l.via.as_str().to_owned(),
                )
            })
            .collect();
        assert_eq!(got, want, "links of {}", r.request_id);
        let times: Vec<&str> = n.entries.iter().map(|e| e.timestamp.as_str()).collect();
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "entries of {} out of order",
            r.request_id
        );
        // Any member id finds the same narrative.
        let member = &r.members[r.members.len() / 2];
        let by_member = query::lookup(&store, "default", &member.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(by_member.narrative_id, r.request_id);
    }
    // Another tenant sees nothing.
    assert!(
        query::lookup(&store, "other", &truth.requests[0].request_id)
            .await
            .unwrap()
            .is_none()
    );

    // Narratives are a projection: rebuilding them from the facts gives the same result.
    let before = p.membership().await;
    assert_eq!(ingest.terminate().code(), Some(0));
    let out = p.weft().arg("rebuild").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(p.membership().await, before);
}
