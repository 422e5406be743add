//! One reading of a payload: a capability token whose `scope` appears twice (serde_json keeps
//! the last, ClickHouse's `token_scope` column and JSON functions read the first, so I-06 would
//! judge a scope the narrative does not show) is refused at every entry -- the `Publisher`
//! API, `weft publish`, the gateway -- and dead-lettered by ingest with `duplicate_key`, while
//! the good events around it are stored exactly once.

mod common;
mod publish_support;

use std::collections::BTreeMap;
use std::time::Duration;

use common::pipeline::{free_port, wait_for_port, Pipeline};
use publish_support::{config, consume};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{json, Value};
use weft_producers::Publisher;
use weft_schemas::{Envelope, Kind};

/// A spec-valid capability token, `scope` written twice when `dup` (the attack shape).
fn token(id: &str, dup: bool) -> String {
    let second = if dup {
        r#","scope":["org.myapp.delete_everything"]"#
    } else {
        ""
    };
    format!(
        r#"{{"token_id":"{id}","principal":"agent-7","scope":["org.myapp.search_docs"]{second},"issued_at":"2026-03-08T06:00:00Z","expires_at":"2026-03-08T07:00:00Z","single_use":false,"issuer":"kernel-1"}}"#
    )
}

fn envelope(id: &str, dup: bool) -> Envelope {
    Envelope {
        kind: Kind::CapabilityToken,
        request_id: Some(format!("req-{id}")),
        tenant: "acme".into(),
        producer_id: None,
        seq: None,
        emitted_at: None,
        payload: serde_json::value::RawValue::from_string(token(id, dup)).unwrap(),
    }
}

#[test]
fn the_attack_payload_differs_only_by_the_duplicate() {
    // Guard the fixture: without the duplicate the same token is valid, so every refusal
    // below is for the duplicate and nothing else.
    assert!(envelope("ok", false).validate().is_ok());
    let e = envelope("bad", true).validate().unwrap_err();
    assert!(e.to_string().contains("duplicate key at /scope"), "{e}");
    // serde_json alone would have accepted it, keeping the last scope.
    let v: Value = serde_json::from_str(&token("bad", true)).unwrap();
    assert_eq!(v["scope"], json!(["org.myapp.delete_everything"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_api_refuses_a_duplicate_key() {
    let spool = tempfile::tempdir().unwrap();
    let prefix = common::unique("dupapi") + ".";
    let p = Publisher::connect(config(&prefix, spool.path()))
        .await
        .unwrap();
    p.ensure_topics().await.unwrap();
    let err = p.publish(envelope("tok-api-bad", true)).unwrap_err();
    assert_eq!(err.code(), "duplicate_key", "{err}");
    p.publish(envelope("tok-api-ok", false))
        .unwrap()
        .await
        .unwrap();
    let topic = format!("{prefix}capability_tokens");
    let got = consume(&[topic], 1, Duration::from_secs(30));
    assert_eq!(got.len(), 1, "only the good token reached Kafka");
    assert!(String::from_utf8_lossy(&got[0].value).contains("tok-api-ok"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weft_publish_and_ingest_refuse_a_duplicate_key() {
    let p = Pipeline::new("it_dup");
    // `weft publish`: the bad line is refused with its reason, the good ones go through.
    let file = p.path("tokens.jsonl");
    let lines: Vec<String> = [("tok-a", false), ("tok-b", true), ("tok-c", false)]
        .iter()
        .map(|(id, dup)| serde_json::to_string(&envelope(id, *dup)).unwrap())
        .collect();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let out = p
        .weft()
        .arg("publish")
        .arg(&file)
        .arg("--spool-dir")
        .arg(p.path("spool"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a refused line fails the run");
    assert!(
        stderr.contains("line 2: rejected: [duplicate_key]"),
        "{stderr}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("2 published to Kafka"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Ingest: the same bytes written straight to Kafka, between the good ones.
    let topic = format!("{}capability_tokens", p.prefix);
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", common::brokers())
        .create()
        .unwrap();
    let bad = token("tok-raw-bad", true);
    for (key, value) in [
        ("raw-1", token("tok-raw-1", false)),
        ("raw-bad", bad.clone()),
        ("raw-2", token("tok-raw-2", false)),
    ] {
        producer
            .send(
                FutureRecord::to(&topic).key(key).payload(&value),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let _ingest = p.ingest(Some(&addr));
    p.wait_for_facts(4, Duration::from_secs(120)).await;
    let dl = read_dead_letters(&format!("{}dead_letter", p.prefix), 1);
    assert_eq!(dl.len(), 1, "{dl:?}");
    let (value, reason, message) = &dl["raw-bad"];
    assert_eq!(value, bad.as_bytes(), "original bytes kept");
    assert_eq!(reason, "duplicate_key");
    assert!(message.contains("/scope"), "{message}");
    // Good events stored exactly once each, the bad one not at all.
    let rows = p
        .scalar("SELECT count() FROM weft_events WHERE kind = 'capability_token'")
        .await;
    let ids = p
        .scalar("SELECT uniqExact(id) FROM weft_events WHERE kind = 'capability_token'")
        .await;
    assert_eq!(
        (rows, ids),
        (4, 4),
        "tok-a, tok-c, tok-raw-1, tok-raw-2 once each"
    );
    assert_eq!(
        p.scalar("SELECT count() FROM weft_events WHERE id = 'tok-raw-bad' OR id = 'tok-b'")
            .await,
        0
    );
    assert!(wait_for_port(&addr, Duration::from_secs(5)));
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"weft_ingest_dead_lettered_total{reason="duplicate_key"} 1"#),
        "{metrics}"
    );
}

/// Key -> (value, reason, message) of every record in the dead-letter topic.
fn read_dead_letters(dlq: &str, want: usize) -> BTreeMap<String, (Vec<u8>, String, String)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::brokers())
        .set("group.id", common::unique("dlq-reader"))
        .create()
        .unwrap();
    let md = consumer
        .fetch_metadata(Some(dlq), Duration::from_secs(10))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for part in md.topics()[0].partitions() {
        tpl.add_partition_offset(dlq, part.id(), Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut got = BTreeMap::new();
    let mut seen = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen < want && std::time::Instant::now() < deadline {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        seen += 1;
        let h = |name: &str| -> String {
            m.headers()
                .and_then(|hs| hs.iter().find(|h| h.key == name))
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        let prev = got.insert(
            key.clone(),
            (
                m.payload().unwrap_or_default().to_vec(),
                h("weft-dlq-reason"),
                h("weft-dlq-message"),
            ),
        );
        assert!(prev.is_none(), "{key} dead-lettered twice");
    }
    got
}
