//! Native-format inserts (`weft_store::native`) against the real local ClickHouse: every
//! column of every row type written that way reads back as written, edge values included.

mod common;

use weft_schemas::links::{Link, NodeKind, Via};
use weft_schemas::Kind;

use serde_json::{json, Value};
use weft_store::narrative::{LinkRow, NarrativeRow, NodeRow};
use weft_store::{insert_native, ClickHouseConfig, Compression, EventRow, Store};

/// A fresh database; `compression` as a remote ClickHouse would get it (`auto` sends loopback
/// bodies uncompressed).
async fn store(compression: Compression) -> Store {
    let store = Store::new(ClickHouseConfig {
        url: common::clickhouse_url(),
        database: common::unique("weft_it_native"),
        compression,
        ..ClickHouseConfig::default()
    })
    .unwrap();
    store.migrate().await.unwrap();
    store
}

async fn json_rows(store: &Store, sql: &str) -> Vec<Value> {
    let mut cursor = store
        .client()
        .query(sql)
        .fetch_bytes("JSONEachRow")
        .unwrap();
    let text = cursor.collect().await.unwrap();
    std::str::from_utf8(&text)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn event<'a>(id: &'a str, refs: &'a [Box<str>], links: &'a [Link]) -> EventRow<'a> {
    EventRow {
        tenant: "acme",
        kind: "frame",
        id,
        content_hash: [0xc3; 32],
        ts: -1,
        request_id: "req-ü",
        producer_id: "kernel-1",
        seq: u64::MAX,
        emitted_at: 1_764_806_400_123_456,
        ingested_at: 1_764_806_401_000_000,
        event_type: "",
        principal: "alice",
        capability_id: "org.x.read",
        decision: "allow",
        outcome: "ok",
        token_id: "tok-1",
        decision_id: "pd-1",
        frame_id: id,
        handle_id: "h-1",
        handle_refs: refs,
        candidate_id: "gpt",
        flow_id: "flow-1",
        links,
        conflict: 1,
        topic: "weaver.frames",
        partition: u32::MAX,
        offset: 42,
        content_type: "application/json",
        payload: r#"{"text":"line\nbreak \"quoted\" ☃"}"#,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_column_reads_back_as_written() {
    for compression in [Compression::None, Compression::Lz4] {
        events_read_back(compression).await;
    }
}

async fn events_read_back(compression: Compression) {
    let store = store(compression).await;
    let refs: [Box<str>; 2] = ["h-1".into(), "h-☃".into()];
    let link = |via, kind, id: &str| Link {
        via,
        to_kind: NodeKind::Event(kind),
        to_id: id.into(),
    };
    let links = [
        link(Via::HandleRefs, Kind::Handle, "h-1"),
        link(Via::DecisionId, Kind::PolicyDecision, "pd-1"),
    ];
    let rows = [event("f-1", &refs, &links), event("f-2", &[], &[])];
    insert_native(&store, "weft_events", &rows).await.unwrap();

    let got = json_rows(
        &store,
        "SELECT * EXCEPT (ts, emitted_at, ingested_at, content_hash, token_scope, \
                token_expires_at, token_single_use), \
                toUnixTimestamp64Micro(ts) AS ts_us, toUnixTimestamp64Micro(emitted_at) AS em_us, \
                toUnixTimestamp64Micro(ingested_at) AS in_us, hex(content_hash) AS hash \
         FROM weft_events ORDER BY id \
         SETTINGS output_format_json_quote_64bit_integers = 0",
    )
    .await;
    assert_eq!(got.len(), 2);
    for (row, want_refs, want_links) in [
        (
            &got[0],
            json!(["h-1", "h-☃"]),
            json!([
                ["handle_refs", "handle", "h-1"],
                ["decision_id", "policy_decision", "pd-1"]
            ]),
        ),
        (&got[1], json!([]), json!([])),
    ] {
        let id = row["id"].as_str().unwrap();
        let want = json!({
            "tenant": "acme", "kind": "frame", "id": id, "request_id": "req-ü",
            "producer_id": "kernel-1", "seq": u64::MAX, "event_type": "", "principal": "alice",
            "capability_id": "org.x.read", "decision": "allow", "outcome": "ok",
            "token_id": "tok-1", "decision_id": "pd-1", "frame_id": id, "handle_id": "h-1",
            "handle_refs": want_refs, "candidate_id": "gpt", "flow_id": "flow-1",
            "links": want_links, "conflict": 1, "topic": "weaver.frames",
            "partition": u32::MAX, "offset": 42, "content_type": "application/json",
            "payload": r#"{"text":"line\nbreak \"quoted\" ☃"}"#,
            "ts_us": -1, "em_us": 1_764_806_400_123_456_i64, "in_us": 1_764_806_401_000_000_i64,
            "hash": "C3".repeat(32),
        });
        assert_eq!(row, &want, "compression {compression:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrative_rows_read_back_as_written() {
    let store = store(Compression::Auto).await;
    let member: NarrativeRow = NarrativeRow {
        tenant: "acme".into(),
        narrative_id: "adhoc:frame:f-1".into(),
        kind: "frame".into(),
        id: "f-1".into(),
        content_hash: [7; 32],
        ts: 1_764_806_400_000_001,
        request_id: String::new(),
        payload: "{\"a\":\"☃\"}".into(),
        version: u64::MAX - 1,
        is_deleted: 1,
    };
    let node: NodeRow = NodeRow {
        tenant: "acme".into(),
        kind: "frame".into(),
        id: "f-1".into(),
        narrative_id: "req-1".into(),
        request_id: "req-1".into(),
        ts: -7,
        version: 3,
    };
    let link: LinkRow = LinkRow {
        tenant: "acme".into(),
        to_kind: "handle".into(),
        to_id: "h-1".into(),
        from_kind: "frame".into(),
        from_id: "f-1".into(),
        via: "handle_refs".into(),
    };
    insert_native(&store, "weft_narratives", std::slice::from_ref(&member))
        .await
        .unwrap();
    insert_native(&store, "weft_narrative_nodes", std::slice::from_ref(&node))
        .await
        .unwrap();
    insert_native(&store, "weft_links", std::slice::from_ref(&link))
        .await
        .unwrap();
    let c = store.client();
    let m: Vec<NarrativeRow> = c
        .query("SELECT ?fields FROM weft_narratives")
        .fetch_all()
        .await
        .unwrap();
    let n: Vec<NodeRow> = c
        .query("SELECT ?fields FROM weft_narrative_nodes")
        .fetch_all()
        .await
        .unwrap();
    let l: Vec<LinkRow> = c
        .query("SELECT ?fields FROM weft_links")
        .fetch_all()
        .await
        .unwrap();
    assert_eq!(format!("{m:?}"), format!("{:?}", [member]));
    assert_eq!(format!("{n:?}"), format!("{:?}", [node]));
    assert_eq!(format!("{l:?}"), format!("{:?}", [link]));
}
