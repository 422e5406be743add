//! The wire formats through the real local broker: a payload with extension and unknown
//! fields goes JSON -> Kafka record (JSON, Avro single-object, Avro Confluent) -> JSON with
//! every field intact, and the envelope metadata survives in headers.

mod common;

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, TopicPartitionList};
use serde_json::Value;
use weft_schemas::wire::{self, ContentType, SchemaIds};
use weft_schemas::{Envelope, Kind};

const PAYLOAD: &str = r#"{"event_id":"te-ext-1","event_type":"capability_executed","timestamp":"2026-03-08T06:00:05Z","capability_id":"org.myapp.search_docs","principal":null,"decision_id":"pd-1","outcome":"success","metadata":{"duration_ms":142,"nested":{"deep":[1,2.5,"x",null,{"k":true}]}},"x_acme_region":"eu-west-1","x_acme_cost":{"usd":0.0021},"unknown_future_field":[{"a":1}],"big":18446744073709551615}"#;

fn envelope() -> Envelope {
    let text = format!(
        r#"{{"kind":"trace_event","request_id":"req-ext","tenant":"acme","producer_id":"test","seq":3,"emitted_at":"2026-03-08T06:00:06.123456Z","payload":{PAYLOAD}}}"#
    );
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_fields_survive_every_framing_through_kafka() {
    let topic = common::unique("weft_it_wire");
    let brokers = common::brokers();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .unwrap();
    let mut ids = SchemaIds::default();
    ids.insert(Kind::TraceEvent, 7);
    let env = envelope();
    env.validate().expect("the test payload is spec-valid");
    let framings = [
        ContentType::Json,
        ContentType::AvroSingleObject,
        ContentType::AvroConfluent,
    ];
    for ct in framings {
        let value = wire::encode_value(&env, ct, &ids).unwrap();
        let mut headers = OwnedHeaders::new();
        for (k, v) in wire::encode_headers(&env, ct) {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let record = FutureRecord::to(&topic)
            .key("req-ext")
            .payload(&value)
            .headers(headers);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", common::unique("g"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();

    let want: Value = serde_json::from_str(PAYLOAD).unwrap();
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < framings.len() && std::time::Instant::now() < deadline {
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let msg = msg.unwrap();
        let hdrs: Vec<(&str, &[u8])> = msg
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key, h.value.unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        let (back, ct) = wire::decode(&hdrs, msg.payload().unwrap(), None, &ids).unwrap();
        assert_eq!(msg.key(), Some(&b"req-ext"[..]));
        assert_eq!(back.kind, Kind::TraceEvent);
        assert_eq!(back.tenant, "acme");
        assert_eq!(back.request_id.as_deref(), Some("req-ext"));
        assert_eq!(back.producer_id.as_deref(), Some("test"));
        assert_eq!(back.seq, Some(3));
        assert_eq!(
            back.emitted_at.as_deref(),
            Some("2026-03-08T06:00:06.123456Z")
        );
        let got: Value = serde_json::from_str(back.payload.get()).unwrap();
        assert_eq!(got, want, "{ct:?} lost or changed a field");
        if ct == ContentType::Json {
            assert_eq!(back.payload.get(), PAYLOAD, "JSON must be byte-identical");
        }
        seen.push(ct);
    }
    assert_eq!(seen, framings, "all three records consumed back, in order");
}

/// Records framed `avro-confluent` by `weft publish` are stored by `weft ingest`, which learns
/// the ids from the registry as the records bring them (it started before any was registered).
/// Before, ingest knew no id and sent every such record to the dead-letter topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_confluent_records_are_stored_through_the_registry() {
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::{Json, Router};
    use std::sync::{Arc, Mutex};

    // A stand-in registry: ids from 1001 in registration order, served back by id.
    type Schemas = Arc<Mutex<Vec<String>>>;
    let schemas = Schemas::default();
    let app = Router::new()
        .route(
            "/subjects/{subject}/versions",
            post(
                |State(s): State<Schemas>, Json(body): Json<Value>| async move {
                    let mut s = s.lock().unwrap();
                    let text = body["schema"].as_str().unwrap_or_default().to_owned();
                    let id = match s.iter().position(|t| *t == text) {
                        Some(i) => i,
                        None => {
                            s.push(text);
                            s.len() - 1
                        }
                    };
                    Json(serde_json::json!({ "id": 1001 + id }))
                },
            ),
        )
        .route(
            "/schemas/ids/{id}",
            get(
                |State(s): State<Schemas>, Path(id): Path<usize>| async move {
                    let s = s.lock().unwrap();
                    match id.checked_sub(1001).and_then(|i| s.get(i)) {
                        Some(text) => Ok(Json(serde_json::json!({ "schema": text }))),
                        None => Err(StatusCode::NOT_FOUND),
                    }
                },
            ),
        )
        .with_state(schemas.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let registry = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let p = common::pipeline::Pipeline::new("it_wire_confluent");
    let config = p.path("weft.toml");
    std::fs::write(
        &config,
        format!(
            "[publisher]\ncontent_type = \"avro-confluent\"\nschema_registry_url = \"{registry}\"\n"
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    p.simulate(&["--flows", "20", "--seed", "3"]);
    let events = p.path("events.jsonl");
    let ingest = p.ingest_with(None, &[("WEFT_CONFIG", config)]);
    p.publish_with(&events, &[("WEFT_CONFIG", config)]);
    assert_eq!(
        schemas.lock().unwrap().len(),
        8,
        "one schema per kind registered"
    );

    let n = common::pipeline::distinct_facts(&[&events]);
    p.wait_for_facts(n, Duration::from_secs(120)).await;
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, n);
    drop(ingest);
    assert!(
        p.ingest_log()
            .contains("learnt a schema id from the registry"),
        "{}",
        p.ingest_log()
    );
    assert!(
        !p.ingest_log().contains("unknown_schema"),
        "{}",
        p.ingest_log()
    );
}
