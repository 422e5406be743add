//! Waiting for running inserts (`Store::wait_for_query`, `Store::wait_for_earlier_inserts`)
//! against the real local ClickHouse. Ingest relies on them for exactly-once facts: a facts
//! insert whose answer was lost is waited for, by its `query_id`, before the retry asks how
//! far each partition is stored; a facts member taking partitions over waits for the inserts
//! running at the rebalance (a previous owner's) before reading its resume points, and the
//! projector's load for those into the narrative tables before it restores a killed pass.
//!
//! An insert is held running by sending the first half of its Native body and nothing more
//! (ClickHouse lists it in `system.processes` while it reads the body); it lands when the
//! rest is sent.

mod common;

use std::time::Duration;

use tokio::sync::watch;
use weft_store::{native, ClickHouseConfig, Compression, EventRow, Stopped, Store};

async fn store() -> Store {
    let store = Store::new(ClickHouseConfig {
        url: common::clickhouse_url(),
        database: common::unique("weft_it_running"),
        compression: Compression::None,
        ..ClickHouseConfig::default()
    })
    .unwrap();
    store.migrate().await.unwrap();
    store
}

fn event<'a>(id: &'a str, offset: u64, payload: &'a str) -> EventRow<'a> {
    EventRow {
        tenant: "acme",
        kind: "frame",
        id,
        content_hash: [7; 32],
        ts: 1_764_806_400_000_000,
        request_id: "",
        producer_id: "p",
        seq: offset,
        emitted_at: 1_764_806_400_000_000,
        ingested_at: 1_764_806_401_000_000,
        event_type: "",
        principal: "",
        capability_id: "",
        decision: "",
        outcome: "",
        token_id: "",
        decision_id: "",
        frame_id: id,
        handle_id: "",
        handle_refs: &[],
        candidate_id: "",
        flow_id: "",
        links: &[],
        conflict: 0,
        topic: "weaver.frames",
        partition: 0,
        offset,
        content_type: "application/json",
        payload,
    }
}

async fn count(store: &Store, sql: &str) -> u64 {
    store.client().query(sql).fetch_one().await.unwrap()
}

/// An insert held running, and the rest of its body.
struct Held(clickhouse::insert_formatted::InsertFormatted, bytes::Bytes);

impl Held {
    /// Send the rest of the body: the insert lands.
    async fn land(self) {
        let Held(mut ins, rest) = self;
        ins.send(rest).await.unwrap();
        ins.end().await.unwrap();
    }
}

/// An insert into `weft_events` of two rows, run as `query_id`, held running: half its body
/// is sent. Returns once ClickHouse lists it. (ClickHouse reads up to `max_query_size`,
/// 256 KiB, of the body before it starts the query: the rows carry a payload of 1 MB so the
/// half sent is past that.)
async fn held_insert(store: &Store, query_id: &str) -> Held {
    let payload = format!("{{\"pad\":\"{}\"}}", "x".repeat(1 << 20));
    let rows = [event("f-1", 1, &payload), event("f-2", 2, "{}")];
    let mut body = native::encode(&rows).unwrap();
    let head = body.split_to(body.len() / 2);
    let mut ins = store
        .client()
        .insert_formatted_with("INSERT INTO weft_events FORMAT Native")
        .with_setting("query_id", query_id);
    ins.send(head).await.unwrap();
    let sql = format!("SELECT count() FROM system.processes WHERE query_id = '{query_id}'");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while count(store, &sql).await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the held insert never showed in system.processes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Held(ins, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_for_the_failed_attempt_by_its_query_id() {
    let store = store().await;
    let id = common::unique("weft-it-attempt");
    let held = held_insert(&store, &id).await;
    // While the attempt runs, asking how far the partition is stored would read the old max
    // offset (the part is not written yet), and a resend would store the rows twice.
    assert!(!store
        .wait_for_query(&id, Duration::from_millis(300))
        .await
        .unwrap());
    assert_eq!(count(&store, "SELECT count() FROM weft_events").await, 0);
    // Another query's id is not waited for.
    assert!(store
        .wait_for_query("weft-it-no-such-query", Duration::from_secs(5))
        .await
        .unwrap());
    // The waiter started while the attempt runs returns once it has landed, and the stored
    // max offset it then reads includes the attempt's rows.
    let waiter = {
        let store = store.clone();
        let id = id.clone();
        tokio::spawn(async move { store.wait_for_query(&id, Duration::from_secs(60)).await })
    };
    held.land().await;
    assert!(waiter.await.unwrap().unwrap(), "the attempt never finished");
    assert_eq!(
        count(&store, "SELECT max(offset) FROM weft_events").await,
        2,
        "read after the wait, the stored offset includes the attempt"
    );
}

/// `Store::wait_for_earlier_inserts` on `tables`, in a task of its own, giving up on a
/// failure (`Stopped` when stopped).
fn earlier_inserts(
    store: &Store,
    tables: &'static [&'static str],
    stop: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let (store, stop) = (store.clone(), stop.clone());
    tokio::spawn(async move {
        store
            .wait_for_earlier_inserts(tables, &stop, |e, _| async move { Err(e.into()) })
            .await
    })
}

/// An insert into `weft_events` held running (`name`: its query id's prefix), and a wait for
/// the earlier inserts started while it runs, still waiting after 300 ms.
async fn waiting_on_a_held_insert(
    store: &Store,
    stop: &watch::Receiver<bool>,
    name: &str,
) -> (Held, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let held = held_insert(store, &common::unique(name)).await;
    let waiter = earlier_inserts(store, &["weft_events"], stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "returned while the insert runs");
    (held, waiter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_taking_partitions_over_waits_for_the_inserts_running_then() {
    let store = store().await;
    let (_tx, stop) = watch::channel(false);
    let (held, waiter) = waiting_on_a_held_insert(&store, &stop, "weft-it-previous-owner").await;
    // Inserts into other tables are not waited for.
    let other = earlier_inserts(&store, &["weft_narratives"], &stop);
    let other = tokio::time::timeout(Duration::from_secs(5), other).await;
    assert!(matches!(other, Ok(Ok(Ok(())))), "{other:?}");
    // An insert that starts after the call is not a predecessor's: not waited for.
    let later = held_insert(&store, &common::unique("weft-it-later-writer")).await;
    held.land().await;
    let waited = tokio::time::timeout(Duration::from_secs(60), waiter).await;
    assert!(matches!(waited, Ok(Ok(Ok(())))), "{waited:?}");
    assert_eq!(count(&store, "SELECT count() FROM weft_events").await, 2);
    later.land().await;
}

/// The wait is not bounded, but a stop ends it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_earlier_inserts_gives_way_to_a_stop() {
    let store = store().await;
    let (tx, stop) = watch::channel(false);
    let (held, waiter) = waiting_on_a_held_insert(&store, &stop, "weft-it-stopped-wait").await;
    tx.send(true).unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter).await;
    let stopped = matches!(&waited, Ok(Ok(Err(e))) if e.downcast_ref::<Stopped>().is_some());
    assert!(stopped, "{waited:?}");
    held.land().await;
}
