//! Bad input on the local stack: with ~1% garbage among valid events, every garbage record
//! lands in the dead-letter topic with its original bytes and headers plus a reason, every
//! valid event is stored, and /metrics counts the dead letters by reason.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::pipeline::{distinct_facts, free_port, wait_for_port, Pipeline};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// One garbage record: (topic suffix, value, extra headers, expected reason code).
type Garbage = (
    &'static str,
    Vec<u8>,
    Vec<(&'static str, &'static [u8])>,
    &'static str,
);

fn garbage() -> Vec<Garbage> {
    let mut g: Vec<Garbage> = Vec::new();
    for i in 0..4u8 {
        g.push((
            "frames",
            vec![0xff, 0xfe, i, 0x00, 0x13],
            vec![],
            "undecodable",
        ));
        g.push((
            "trace_events",
            format!("{{\"event_id\": \"e{i}\", ").into_bytes(),
            vec![],
            "undecodable_json",
        ));
        g.push((
            "trace_events",
            format!(r#"{{"event_id":"bad-{i}","event_type":"not_a_type","timestamp":"2026-01-01T00:00:00Z"}}"#).into_bytes(),
            vec![],
            "schema_invalid",
        ));
        g.push((
            "handles",
            b"{}".to_vec(),
            vec![("weft-kind", b"telemetry_blob")],
            "unknown_kind",
        ));
        g.push((
            "frames",
            vec![0xC3, 0x01, 9, 9, 9, 9, 9, 9, 9, i, 2, 4],
            vec![],
            "unknown_schema",
        ));
    }
    g
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_goes_to_the_dead_letter_topic_with_a_reason() {
    let p = Pipeline::new("it_dlq");
    p.simulate(&["--events", "2000", "--seed", "5", "--clean"]);
    let events = p.path("events.jsonl");
    p.publish(&events); // also creates the topics
    let valid = distinct_facts(&[&events]);

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", common::brokers())
        .create()
        .unwrap();
    let bad = garbage();
    let per_mille = bad.len() as u64 * 1000 / valid;
    assert!(
        (9..=11).contains(&per_mille),
        "about 1% garbage, got {per_mille}‰"
    );
    for (i, (suffix, value, extra, _)) in bad.iter().enumerate() {
        let topic = format!("{}{}", p.prefix, suffix);
        let id = i.to_string();
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "x-test-id",
            value: Some(id.as_bytes()),
        });
        for (k, v) in extra {
            headers = headers.insert(Header {
                key: k,
                value: Some(*v),
            });
        }
        let key = format!("garbage-{i}");
        producer
            .send(
                FutureRecord::to(&topic)
                    .key(&key)
                    .payload(value)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _ingest = p.ingest(Some(&addr));
    p.wait_for_facts(valid, Duration::from_secs(120)).await;

    // Read the whole dead-letter topic back.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", common::brokers())
        .set("group.id", common::unique("dlq-reader"))
        .create()
        .unwrap();
    let dlq = format!("{}dead_letter", p.prefix);
    let md = consumer
        .fetch_metadata(Some(&dlq), Duration::from_secs(10))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for part in md.topics()[0].partitions() {
        tpl.add_partition_offset(&dlq, part.id(), Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    // Every copy is kept, so a record dead-lettered twice fails the test.
    type Dead = (Vec<u8>, Vec<u8>, String, String);
    let mut got: BTreeMap<usize, Vec<Dead>> = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut read = 0usize;
    let mut high: Option<Vec<(i32, i64)>> = None;
    loop {
        // Once every garbage record has arrived, read on to each partition's end: a second
        // copy would sit there.
        if high.is_none() && got.len() == bad.len() {
            let ends = md.topics()[0]
                .partitions()
                .iter()
                .map(|part| {
                    let (_, hi) = consumer
                        .fetch_watermarks(&dlq, part.id(), Duration::from_secs(10))
                        .unwrap();
                    (part.id(), hi)
                })
                .collect();
            high = Some(ends);
        }
        if let Some(ends) = &high {
            let pos = consumer.position().unwrap();
            let at_end = ends.iter().all(|(part, hi)| {
                *hi == 0
                    || matches!(pos.find_partition(&dlq, *part).map(|e| e.offset()),
                                Some(Offset::Offset(o)) if o >= *hi)
            });
            if at_end {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "dead-letter topic not read to its end: {} of {} garbage records seen",
            got.len(),
            bad.len()
        );
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        read += 1;
        let h = |name: &str| -> Option<String> {
            m.headers()?
                .iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let id: usize = h("x-test-id")
            .expect("original headers kept")
            .parse()
            .unwrap();
        got.entry(id).or_default().push((
            m.payload().unwrap_or_default().to_vec(),
            m.key().unwrap_or_default().to_vec(),
            h("weft-dlq-reason").expect("reason header"),
            h("weft-dlq-topic").expect("source topic header"),
        ));
    }
    assert_eq!(
        read,
        bad.len(),
        "dead-letter records read: one per garbage record"
    );
    for (i, (suffix, value, _, reason)) in bad.iter().enumerate() {
        let copies = got.get(&i).map_or(&[][..], Vec::as_slice);
        assert_eq!(copies.len(), 1, "record {i} dead-lettered exactly once");
        let (v, k, r, t) = &copies[0];
        assert_eq!(v, value, "record {i}: original bytes kept");
        assert_eq!(k, format!("garbage-{i}").as_bytes());
        assert_eq!(r, reason, "record {i}");
        assert_eq!(t, &format!("{}{}", p.prefix, suffix));
    }

    // Every valid event stored, nothing else, nothing twice.
    assert_eq!(p.scalar("SELECT count() FROM weft_events").await, valid);

    // Metrics count dead letters by reason.
    assert!(wait_for_port(&addr, Duration::from_secs(5)));
    let body = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let total: u64 = body
        .lines()
        .filter(|l| l.starts_with("weft_ingest_dead_lettered_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(total, bad.len() as u64, "{body}");
    assert!(
        body.contains(r#"weft_ingest_dead_lettered_total{reason="schema_invalid"} 4"#),
        "{body}"
    );
    let health = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap();
    assert!(health.status().is_success());
}
