//! Helpers shared by the publish-path integration tests (`publish_*`, `gateway_*`,
//! `fault_broker`): a publisher config isolated per test, and a consumer that reads whole
//! topics back so tests can compare what Kafka holds with what was submitted.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use weft_producers::PublisherConfig;
use weft_schemas::wire::{self, SchemaIds};
use weft_schemas::{Envelope, Topics};

/// One record as read back from Kafka.
#[derive(Debug, Clone)]
pub struct Rec {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Rec {
    /// The envelope the record decodes to (headers + value).
    pub fn envelope(&self) -> Envelope {
        let h: Vec<(&str, &[u8])> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        wire::decode(&h, &self.value, None, &SchemaIds::default())
            .unwrap_or_else(|e| {
                panic!("record {}@{} does not decode: {e}", self.topic, self.offset)
            })
            .0
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
}

/// A publisher config for the local broker, with its own topic prefix and spool directory.
pub fn config(prefix: &str, spool: &Path) -> PublisherConfig {
    PublisherConfig {
        brokers: crate::common::brokers(),
        topics: Topics::with_prefix(prefix),
        spool_dir: spool.to_owned(),
        partitions: 3,
        ..PublisherConfig::default()
    }
}

/// Read every record of `topics` from the beginning until `want` records arrived, or
/// `timeout` passed (then it returns what it has; the caller's asserts fail with detail).
pub fn consume(topics: &[String], want: usize, timeout: Duration) -> Vec<Rec> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", crate::common::brokers())
        .set("group.id", crate::common::unique("g"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for t in topics {
        let md = consumer
            .fetch_metadata(Some(t), Duration::from_secs(10))
            .expect("metadata");
        for topic in md.topics() {
            for p in topic.partitions() {
                tpl.add_partition_offset(t, p.id(), Offset::Beginning)
                    .expect("partition");
            }
        }
    }
    consumer.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + timeout;
    while out.len() < want && Instant::now() < deadline {
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let Ok(msg) = msg else { continue };
        out.push(Rec {
            topic: msg.topic().to_owned(),
            partition: msg.partition(),
            offset: msg.offset(),
            key: msg.key().map(<[u8]>::to_vec),
            value: msg.payload().unwrap_or_default().to_vec(),
            headers: msg
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                        .collect()
                })
                .unwrap_or_default(),
        });
    }
    out
}

/// Total records in `topics`, for "nothing else arrived" checks: everything is read from
/// the beginning until the topics stay quiet for 2 s after a record (15 s before the first:
/// assigning and the first fetch can take seconds on a loaded machine). Watermarks are not
/// used because the local broker's in-memory log reports them differently from its sqlite log.
pub fn count(topics: &[String]) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", crate::common::brokers())
        .set("group.id", crate::common::unique("count"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for t in topics {
        let md = consumer
            .fetch_metadata(Some(t), Duration::from_secs(10))
            .expect("metadata");
        for topic in md.topics() {
            for p in topic.partitions() {
                tpl.add_partition_offset(t, p.id(), Offset::Beginning)
                    .expect("partition");
            }
        }
    }
    consumer.assign(&tpl).expect("assign");
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut quiet_since = Instant::now();
    let quiet = |n: i64| Duration::from_secs(if n == 0 { 15 } else { 2 });
    while quiet_since.elapsed() < quiet(n) && Instant::now() < deadline {
        if let Some(Ok(_)) = consumer.poll(Duration::from_millis(100)) {
            n += 1;
            quiet_since = Instant::now();
        }
    }
    n
}

/// A spec-valid TraceEvent payload, unique per `(tag, i)`, as compact JSON text.
pub fn trace_payload(tag: &str, i: usize) -> String {
    format!(
        r#"{{"event_id":"te-{tag}-{i}","event_type":"flow_step_started","timestamp":"2026-03-08T06:00:05Z","metadata":{{"flow_id":"f-{tag}","step":{i}}},"x_weft_test":"{tag}"}}"#
    )
}

/// The envelope for [`trace_payload`] under `request`.
pub fn trace_envelope(tag: &str, i: usize, request: Option<&str>) -> Envelope {
    let mut v = serde_json::json!({"kind": "trace_event", "tenant": "acme"});
    if let Some(r) = request {
        v["request_id"] = r.into();
    }
    let text = v.to_string();
    let text = format!(
        "{},\"payload\":{}}}",
        &text[..text.len() - 1],
        trace_payload(tag, i)
    );
    serde_json::from_str(&text).expect("envelope")
}

/// Group records by Kafka key, keeping partition order (what per-request order means).
pub fn by_key(recs: &[Rec]) -> BTreeMap<Vec<u8>, Vec<&Rec>> {
    let mut sorted: Vec<&Rec> = recs.iter().collect();
    sorted.sort_by_key(|r| (r.topic.clone(), r.partition, r.offset));
    let mut m: BTreeMap<Vec<u8>, Vec<&Rec>> = BTreeMap::new();
    for r in sorted {
        m.entry(r.key.clone().unwrap_or_default())
            .or_default()
            .push(r);
    }
    m
}

/// The `event_id` of each record's payload.
pub fn event_ids(recs: &[Rec]) -> Vec<String> {
    recs.iter()
        .map(|r| {
            r.envelope().payload_value().unwrap()["event_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}
