//! Ingest telemetry (migration 0006) is best effort: with one telemetry table missing (an
//! older schema), ingest still stores every fact, warns once, counts the dropped samples on
//! /metrics, and keeps writing the tables that exist (lag samples that settle at zero).

mod common;

use std::time::Duration;

use common::pipeline::{distinct_facts, free_port, wait_for_port, Pipeline};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_telemetry_table_only_warns_and_ingest_goes_on() {
    let p = Pipeline::new("it_tel");
    p.client()
        .query("DROP TABLE weft_ingest_batches")
        .execute()
        .await
        .unwrap();
    p.simulate(&["--events", "300", "--seed", "9", "--clean"]);
    let events = p.path("events.jsonl");
    p.publish(&events);
    let valid = distinct_facts(&[&events]);

    let addr = format!("127.0.0.1:{}", free_port());
    let _ingest = p.ingest(Some(&addr));
    p.wait_for_facts(valid, Duration::from_secs(60)).await;
    let log = p.ingest_log_all();
    assert!(
        log.lines()
            .any(|l| l.contains("telemetry table unusable") && l.contains("weft_ingest_batches")),
        "no warning about the missing table:\n{}",
        p.ingest_log()
    );

    // The flushes' batch rows were dropped and counted, not retried.
    assert!(wait_for_port(&addr, Duration::from_secs(5)));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let body = reqwest::get(format!("http://{addr}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let dropped: f64 = body
            .lines()
            .find(|l| {
                l.starts_with("weft_ingest_telemetry_dropped_total")
                    && l.contains("table=\"weft_ingest_batches\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if dropped >= 1.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no dropped batch rows counted on /metrics:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The lag table still fills; once everything is stored, every partition's latest sample
    // says lag 0 (the monitor samples every 5 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (parts, behind): (u64, u64) = p
            .client()
            .query(
                "SELECT count(), countIf(lag != 0) FROM \
                 (SELECT topic, partition, argMax(lag, at) AS lag FROM weft_ingest_lag \
                  GROUP BY topic, partition)",
            )
            .fetch_one()
            .await
            .unwrap();
        if parts > 0 && behind == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "lag samples: {parts} partitions, {behind} still behind:\n{}",
            p.ingest_log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
