//! Facts as ingest decodes them, built in the test process, for tests that drive the
//! narrative projector directly against the real ClickHouse.

use weft_consumers::decode::{decode, Fact, Record};
use weft_consumers::narrative::projector::Projector;
use weft_schemas::wire::{self, ContentType, SchemaIds};
use weft_schemas::{Envelope, Topics};
use weft_store::Store;

/// The fact ingest would decode from `env` read at `offset` of `partition`.
pub fn fact(env: &Envelope, partition: i32, offset: i64) -> Fact {
    let topics = Topics::default();
    let ids = SchemaIds::default();
    let topic = topics.topic(env.kind);
    let value = wire::encode_value(env, ContentType::Json, &ids).unwrap();
    let headers = wire::encode_headers(env, ContentType::Json);
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    let rec = Record {
        topic: &topic,
        partition,
        offset,
        key: None,
        value: Some(&value),
        headers: &headers,
        timestamp_ms: Some(1_700_000_000_000),
    };
    decode(&rec, &topics, &ids).unwrap_or_else(|r| panic!("{}", r.message))
}

/// Wait (at most 60 s) until the projector's id filters are rebuilt in the background (until
/// then every id a pass names is looked up, and no fact is placed directly).
pub async fn wait_for_id_filters(projector: &Projector) {
    let started = std::time::Instant::now();
    while !projector.id_filter_ready() {
        assert!(
            started.elapsed().as_secs() < 60,
            "the id filters never loaded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Where a pass dies: after which of its inserts (`Links`: after `weft_links` and
/// `weft_links_from`, which carry no version; `Progress`: after all of them, before the next
/// pass).
#[derive(Debug, Clone, Copy)]
pub enum KillAfter {
    Links,
    Narratives,
    Nodes,
    Progress,
}

/// Play a kill of the pass that just wrote `version`: remove what it had not written yet.
pub async fn unwrite(store: &Store, version: u64, at: KillAfter) {
    let tables: &[&str] = match at {
        KillAfter::Links => &[
            "weft_narratives",
            "weft_narrative_nodes",
            "weft_projector_progress",
        ],
        KillAfter::Narratives => &["weft_narrative_nodes", "weft_projector_progress"],
        KillAfter::Nodes => &["weft_projector_progress"],
        KillAfter::Progress => &[],
    };
    for t in tables {
        store
            .client()
            .query(&format!("DELETE FROM {t} WHERE version = {{v:UInt64}}"))
            .param("v", version)
            .execute()
            .await
            .unwrap();
    }
}
