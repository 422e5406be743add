//! The librdkafka floor: already-encoded records sent through a bare Kafka producer with the
//! [`Publisher`](weft_producers::Publisher)'s own settings (acks=all, idempotence, batching,
//! compression), and nothing else: no validation, no receipts, no spool.
//!
//! Only `weft bench publish --raw` uses it. What the Publisher costs above this floor is
//! weft's; the floor itself is librdkafka's (and the broker's), and no change in weft can take
//! the Publisher below it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use weft_producers::publisher::kafka_config;
use weft_producers::PublisherConfig;

/// One encoded record, as the Publisher would hand it to librdkafka.
#[derive(Debug, Clone)]
pub struct RawRecord {
    /// Kafka topic to send to.
    pub topic: String,
    /// Record key (the partitioning key).
    pub key: Vec<u8>,
    /// Encoded record value.
    pub value: Vec<u8>,
    /// Kafka headers, name and value.
    pub headers: Vec<(&'static str, Vec<u8>)>,
}

/// Delivery counts of a [`send_all`] run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RawCounts {
    /// Records Kafka acknowledged.
    pub acked: u64,
    /// Records whose delivery failed.
    pub failed: u64,
}

#[derive(Default)]
struct Counter {
    acked: AtomicU64,
    failed: AtomicU64,
}

struct Ctx(Arc<Counter>);

impl ClientContext for Ctx {}

impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.0.acked.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.0.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// Send every record (retrying while librdkafka's queue is full), wait up to `timeout` for
/// the last acknowledgements, and count the outcomes. Blocking.
pub fn send_all(
    config: &PublisherConfig,
    records: &[RawRecord],
    timeout: Duration,
) -> Result<RawCounts, KafkaError> {
    let counter = Arc::new(Counter::default());
    let producer: ThreadedProducer<Ctx> =
        kafka_config(config).create_with_context(Ctx(counter.clone()))?;
    for r in records {
        let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
        for (k, v) in &r.headers {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_slice()),
            });
        }
        let mut record = BaseRecord::to(&r.topic)
            .key(r.key.as_slice())
            .payload(r.value.as_slice())
            .headers(headers);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), rec)) => {
                    record = rec;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
    producer.flush(timeout)?;
    Ok(RawCounts {
        acked: counter.acked.load(Ordering::Relaxed),
        failed: counter.failed.load(Ordering::Relaxed),
    })
}
