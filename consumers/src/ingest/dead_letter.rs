//! Dead letters: records that cannot be ingested, sent whole to the dead-letter topic.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use tracing::{instrument, warn};

use super::flush::{Flusher, Stopped};
use super::{backoff, now_micros};
use crate::decode::Rejection;
use crate::telemetry::{DeadLetterRow, Sample};

/// A record that will go to the dead-letter topic, owned.
pub(super) struct DeadLetter {
    pub(super) key: Option<Vec<u8>>,
    pub(super) value: Vec<u8>,
    pub(super) headers: Vec<(String, Vec<u8>)>,
    pub(super) offset: i64,
    pub(super) reason: Rejection,
}

impl Flusher {
    #[instrument(skip(self, dead), fields(n = dead.len()))]
    pub(super) async fn dead_letter(
        &mut self,
        topic: &str,
        partition: i32,
        dead: &[DeadLetter],
    ) -> Result<(), Stopped> {
        let dlq_topic = self.cfg.topics.dead_letter();
        for d in dead {
            let offset = d.offset.to_string();
            let partition_s = partition.to_string();
            let mut attempt = 0;
            loop {
                let mut headers = OwnedHeaders::new();
                for (k, v) in &d.headers {
                    headers = headers.insert(Header {
                        key: k,
                        value: Some(v),
                    });
                }
                for (k, v) in [
                    ("weft-dlq-reason", d.reason.code),
                    ("weft-dlq-message", d.reason.message.as_str()),
                    ("weft-dlq-topic", topic),
                    ("weft-dlq-partition", partition_s.as_str()),
                    ("weft-dlq-offset", offset.as_str()),
                ] {
                    headers = headers.insert(Header {
                        key: k,
                        value: Some(v.as_bytes()),
                    });
                }
                let mut rec = FutureRecord::<Vec<u8>, Vec<u8>>::to(&dlq_topic)
                    .payload(&d.value)
                    .headers(headers);
                if let Some(k) = &d.key {
                    rec = rec.key(k);
                }
                match self.dlq.send(rec, Duration::from_secs(30)).await {
                    Ok(_) => break,
                    Err((e, _)) => {
                        attempt += 1;
                        warn!(error = %e, attempt, "dead-letter publish failed; retrying (offsets held)");
                        if *self.stop.borrow() {
                            return Err(Stopped);
                        }
                        tokio::time::sleep(backoff(attempt, self.cfg.max_backoff_ms)).await;
                    }
                }
            }
            // Acknowledged by the broker: now (and only now) it is a dead letter to report.
            self.telemetry.record(Sample::DeadLetter(DeadLetterRow {
                at: now_micros(),
                topic: topic.to_owned(),
                partition,
                offset: d.offset,
                reason: d.reason.code,
                message: d.reason.message.clone(),
                tenant: d
                    .headers
                    .iter()
                    .find(|(k, _)| k == weft_schemas::wire::header::TENANT)
                    .and_then(|(_, v)| std::str::from_utf8(v).ok())
                    .unwrap_or_default()
                    .to_owned(),
            }));
            self.metrics
                .dead_lettered
                .with_label_values(&[d.reason.code])
                .inc();
        }
        Ok(())
    }
}
