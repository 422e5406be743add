//! A plain Kafka producer for tests that write records by hand (poison, positions), where
//! the Publisher would refuse or reshape them.

use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

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
