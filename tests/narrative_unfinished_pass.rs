//! A narrative pass killed after its narrative rows but before its node rows, on the real
//! ClickHouse: the replayed pass must finish its work, whatever it decides this time.
//!
//! The case that `fault_ingest_survives_repeated_sigkill` once hit at random: a feedback
//! without a request id, projected before its routing decision arrived, lands in a narrative
//! of its own. The process dies before that pass records where it put the feedback (node rows,
//! progress). After the restart the replayed batch also holds the routing decision, so the
//! feedback now belongs to the request's narrative, and the row the killed pass wrote must be
//! tombstoned, not left behind as a second, stray narrative.

mod common;

use common::pipeline::Pipeline;
use weft_consumers::decode::{decode, Fact, Record};
use weft_consumers::narrative::filter::RebuildGate;
use weft_consumers::narrative::projector::{ProjectBatch, Projector};
use weft_consumers::narrative::shard::NarrativeShard;
use weft_schemas::wire::SchemaIds;
use weft_schemas::Topics;
use weft_store::narrative::query;
use weft_store::{ClickHouseConfig, Store};

const ROUTING: &str = r#"{"decision_id":"erd-1","candidate":{"candidate_id":"flow-a","candidate_type":"flow"},"confidence":0.8,"reason_codes":["capability_match"],"created_at":"2026-05-25T07:59:00Z"}"#;
const FEEDBACK: &str = r#"{"decision_id":"erd-1","candidate_id":"flow-a","success":true,"timestamp":"2026-05-25T08:00:00Z"}"#;

fn fact(topic: &str, payload: &str, request_id: Option<&str>) -> Fact {
    tenant_fact("default", topic, payload, request_id)
}

fn tenant_fact(tenant: &str, topic: &str, payload: &str, request_id: Option<&str>) -> Fact {
    let mut headers: Vec<(&str, &[u8])> = request_id
        .map(|r| ("weft-request-id", r.as_bytes()))
        .into_iter()
        .collect();
    headers.push(("weft-tenant", tenant.as_bytes()));
    let rec = Record {
        topic,
        partition: 0,
        offset: 0,
        key: None,
        value: Some(payload.as_bytes()),
        headers: &headers,
        timestamp_ms: Some(1_700_000_000_000),
    };
    decode(&rec, &Topics::default(), &SchemaIds::default())
        .unwrap_or_else(|r| panic!("{topic}: {}", r.message))
}

fn batch<'a>(topic: &'a str, f: &'a Fact) -> ProjectBatch<'a> {
    ProjectBatch {
        topic,
        partition: 0,
        facts: vec![f],
        last_offset: 0,
    }
}

/// The narrative that `id` (a member's id or a narrative id) resolves to, for tenant `default`.
async fn narrative_of(store: &Store, id: &str) -> Option<query::Narrative> {
    query::lookup(store, "default", id).await.unwrap()
}

fn store_of(p: &Pipeline) -> Store {
    Store::new(ClickHouseConfig {
        url: common::clickhouse_url(),
        database: p.db.clone(),
        ..ClickHouseConfig::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_killed_before_its_node_rows_is_finished_by_the_replay() {
    let p = Pipeline::new("it_unfinished");
    let store = store_of(&p);
    let (fb_topic, erd_topic) = (
        "weaver.execution_feedback",
        "weaver.execution_routing_decisions",
    );
    let feedback = fact(fb_topic, FEEDBACK, None);
    let routing = fact(erd_topic, ROUTING, Some("req-1"));

    // A pass that completes, so the killed one is not the first.
    let earlier = fact(erd_topic, &ROUTING.replace("erd-1", "erd-0"), Some("req-0"));
    let mut projector = Projector::load(
        store.clone(),
        weft_consumers::narrative::projector::DEFAULT_MAX_NODES,
    )
    .await
    .unwrap();
    projector
        .apply(&[batch(erd_topic, &earlier)])
        .await
        .unwrap();
    // The pass that dies: the feedback alone, in a narrative of its own.
    projector
        .apply(&[batch(fb_topic, &feedback)])
        .await
        .unwrap();
    let alone = narrative_of(&store, &feedback.id)
        .await
        .expect("the feedback has a narrative");
    assert_ne!(alone.narrative_id, "req-1");
    // Its node rows and progress never landed (the order of a pass's writes puts them last).
    for sql in [
        "DELETE FROM weft_narrative_nodes WHERE kind = 'execution_feedback'",
        "DELETE FROM weft_projector_progress WHERE topic = 'weaver.execution_feedback'",
    ] {
        store.client().query(sql).execute().await.unwrap();
    }

    // The restart: the replayed batch now holds the routing decision too.
    let mut projector = Projector::load(
        store.clone(),
        weft_consumers::narrative::projector::DEFAULT_MAX_NODES,
    )
    .await
    .unwrap();
    projector
        .apply(&[batch(fb_topic, &feedback), batch(erd_topic, &routing)])
        .await
        .unwrap();

    let joined = narrative_of(&store, &feedback.id)
        .await
        .expect("the feedback has a narrative");
    assert_eq!(joined.narrative_id, "req-1");
    let mut members: Vec<&str> = joined.entries.iter().map(|e| e.kind.as_str()).collect();
    members.sort_unstable();
    assert_eq!(
        members,
        ["execution_feedback", "execution_routing_decision"]
    );
    // The killed pass's narrative holds nothing any more.
    let left = narrative_of(&store, &alone.narrative_id).await;
    assert!(
        left.as_ref().is_none_or(|n| n.narrative_id == "req-1"),
        "the killed pass's narrative still has members: {left:?}"
    );
}

/// The same kill in one of two narrative shards, while the other shard goes on: shard B's
/// passes, completed after A's killed one (higher versions), must not count as A's last
/// completed pass, and B's restart must not restore A's rows (another shard's tenant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shards_killed_pass_is_its_own_whatever_the_other_shard_did_since() {
    let p = Pipeline::new("it_unfinished_shard");
    let store = store_of(&p);
    let (a, b) = (
        NarrativeShard::new(0, 2).unwrap(),
        NarrativeShard::new(1, 2).unwrap(),
    );
    let tenant_of = |s: NarrativeShard| {
        (0..)
            .map(|i| format!("tenant-{i}"))
            .find(|t| s.owns(t))
            .unwrap()
    };
    let (ta, tb) = (tenant_of(a), tenant_of(b));
    let (fb_topic, erd_topic) = (
        "weaver.execution_feedback",
        "weaver.execution_routing_decisions",
    );
    let max = weft_consumers::narrative::projector::DEFAULT_MAX_NODES;
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let load = |s| Projector::load_shard(store.clone(), max, s, &stop, RebuildGate::open());
    let b_pass = |n: &str| {
        let erd = ROUTING.replace("erd-1", &format!("erd-b{n}"));
        tenant_fact(&tb, erd_topic, &erd, Some(&format!("req-b{n}")))
    };

    let mut pb = load(b).await.unwrap();
    let first_b = b_pass("0");
    pb.apply(&[batch(erd_topic, &first_b)]).await.unwrap();
    // Shard A: a completed pass, then the pass that dies (the feedback alone).
    let mut pa = load(a).await.unwrap();
    let earlier = tenant_fact(
        &ta,
        erd_topic,
        &ROUTING.replace("erd-1", "erd-0"),
        Some("req-0"),
    );
    pa.apply(&[batch(erd_topic, &earlier)]).await.unwrap();
    let feedback = tenant_fact(&ta, fb_topic, FEEDBACK, None);
    pa.apply(&[batch(fb_topic, &feedback)]).await.unwrap();
    let alone = query::lookup(&store, &ta, &feedback.id).await.unwrap();
    let alone = alone.expect("the feedback has a narrative").narrative_id;
    assert_ne!(alone, "req-1");
    for sql in [
        "DELETE FROM weft_narrative_nodes WHERE kind = 'execution_feedback'",
        "DELETE FROM weft_projector_progress WHERE topic = 'weaver.execution_feedback'",
    ] {
        store.client().query(sql).execute().await.unwrap();
    }
    drop(pa);

    // Shard B restarts: A's killed pass is newer than B's last completed one, but it is
    // another shard's, so B restores nothing of it.
    let mut pb = load(b).await.unwrap();
    let restored: u64 = store
        .client()
        .query("SELECT count() FROM weft_narrative_nodes WHERE kind = 'execution_feedback'")
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(restored, 0, "shard B restored shard A's killed pass");
    // ... and completes a pass, newer than A's killed one.
    let second_b = b_pass("1");
    pb.apply(&[batch(erd_topic, &second_b)]).await.unwrap();

    // Shard A restarts: its own last completed pass is older than its killed one, which it
    // restores; the replay (with the routing decision this time) then moves the feedback.
    let mut pa = load(a).await.unwrap();
    let routing = tenant_fact(&ta, erd_topic, ROUTING, Some("req-1"));
    pa.apply(&[batch(fb_topic, &feedback), batch(erd_topic, &routing)])
        .await
        .unwrap();
    let joined = query::lookup(&store, &ta, &feedback.id).await.unwrap();
    assert_eq!(joined.expect("a narrative").narrative_id, "req-1");
    let left = query::lookup(&store, &ta, &alone).await.unwrap();
    assert!(
        left.as_ref().is_none_or(|n| n.narrative_id == "req-1"),
        "the killed pass's narrative still has members: {left:?}"
    );
    // Each shard's progress is its own, and B's tenant was never A's to place.
    assert_eq!(p.progress_shards().await, ["0/2", "1/2"]);
    assert!(query::lookup(&store, &ta, "req-b1")
        .await
        .unwrap()
        .is_none());
    assert!(query::lookup(&store, &tb, "req-b1")
        .await
        .unwrap()
        .is_some());
}
