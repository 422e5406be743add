//! A plain Kafka producer and consumer for tests that write and read records by hand
//! (poison, positions, resume), where the Publisher would refuse or reshape them.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

/// A spec-valid trace event's payload.
pub fn event(id: &str) -> Vec<u8> {
    format!(
        r#"{{"event_id":"{id}","event_type":"flow_failed","timestamp":"2026-03-08T06:00:05Z"}}"#
    )
    .into_bytes()
}

/// A consumer on the local broker; in `group` (committing by hand only) when given.
pub fn consumer(group: Option<&str>) -> BaseConsumer {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", super::brokers());
    if let Some(g) = group {
        c.set("group.id", g).set("enable.auto.commit", "false");
    }
    c.create().expect("a Kafka consumer")
}

/// A producer on the local broker that takes records up to 8 MB (the poison tests send
/// larger ones than the default allows).
pub fn producer() -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", super::brokers())
        .set("message.max.bytes", "8000000")
        .create()
        .expect("a Kafka producer")
}

/// Produce `value` to partition 0 of `topic`, alone in its batch (awaited before the next).
pub async fn send(p: &FutureProducer, topic: &str, key: &str, value: &[u8]) {
    p.send(
        FutureRecord::to(topic).key(key).payload(value).partition(0),
        Duration::from_secs(30),
    )
    .await
    .map_err(|(e, _)| e)
    .expect("the broker took the record");
}

/// Wait (at most 60 s) until `topic` exists with its partitions (ingest creates them at start).
pub fn wait_for_topic(topic: &str) {
    let c = consumer(None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .is_ok_and(|md| md.topics().iter().any(|t| !t.partitions().is_empty()))
    {
        assert!(Instant::now() < deadline, "{topic} never created");
        std::thread::sleep(Duration::from_millis(100));
    }
}
