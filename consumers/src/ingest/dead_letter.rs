//! Dead letters: records that cannot be ingested, sent to the dead-letter topic.
//!
//! One record must never stop ingest. A dead letter goes out whole when it fits
//! `max_message_bytes`; else (or when the broker refuses it for its size) in a *bounded* form:
//! the original value cut to what fits, with `weft-dlq-truncated: 1`,
//! `weft-dlq-original-bytes`, `weft-dlq-sha256` (of the whole original value) beside the usual
//! `weft-dlq-reason`/`-message`/`-topic`/`-partition`/`-offset`; and if even that is refused,
//! in a *minimal* form (no value, no original headers). A form refused for good is never
//! retried; only transient errors (broker unreachable, queue full) are, with the partition's
//! offsets held, and every wait gives way to a stop at once. If the minimal form is refused
//! too, the record is quarantined: its row in `weft_dead_letters` (reason, source topic,
//! partition, offset, SHA-256 and size in the message) is what remains, and the partition
//! moves on (`weft_ingest_dead_letters_quarantined_total`).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use sha2::{Digest, Sha256};
use tracing::{error, instrument, warn};

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

/// Room kept for the record's framing and weft's own headers in a bounded form.
const OVERHEAD: usize = 8 << 10;
/// Longest key and `weft-dlq-message` a bounded form carries.
const MAX_SMALL: usize = 1 << 10;

/// The shape a dead letter goes out in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// Key, value and headers as read, plus weft's headers.
    Whole,
    /// The value cut to fit, original headers kept only if small, with size and SHA-256.
    Bounded,
    /// Weft's headers only.
    Minimal,
}

/// Key, value and headers of a dead letter as it goes out.
type Rendered = (Option<Vec<u8>>, Vec<u8>, Vec<(String, Vec<u8>)>);

/// Errors that will not go away by retrying the same bytes.
fn is_permanent(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::InvalidRecord
                | C::InvalidMessage
                | C::InvalidRequiredAcks
        )
    )
}

fn cut(bytes: &[u8], max: usize) -> &[u8] {
    &bytes[..bytes.len().min(max)]
}

impl DeadLetter {
    fn whole_size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + 8)
            .sum();
        self.value.len() + self.key.as_ref().map_or(0, Vec::len) + headers + OVERHEAD
    }

    /// The first form worth trying under `max` bytes.
    pub(super) fn first_form(&self, max: usize) -> Form {
        if self.whole_size() <= max {
            Form::Whole
        } else {
            Form::Bounded
        }
    }

    /// Key, value and headers of this dead letter in `form`, at most `max` bytes of value.
    pub(super) fn render(&self, form: Form, max: usize, source: (&str, i32)) -> Rendered {
        let (topic, partition) = source;
        let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
        let original_headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        if form == Form::Whole || (form == Form::Bounded && original_headers <= 16 << 10) {
            headers.extend(self.headers.iter().cloned());
        }
        let message = match form {
            Form::Whole => self.reason.message.as_bytes(),
            _ => cut(self.reason.message.as_bytes(), MAX_SMALL),
        };
        let mut weft = vec![
            ("weft-dlq-reason", self.reason.code.as_bytes().to_vec()),
            ("weft-dlq-message", message.to_vec()),
            ("weft-dlq-topic", topic.as_bytes().to_vec()),
            ("weft-dlq-partition", partition.to_string().into_bytes()),
            ("weft-dlq-offset", self.offset.to_string().into_bytes()),
        ];
        if form != Form::Whole {
            weft.push(("weft-dlq-truncated", b"1".to_vec()));
            weft.push((
                "weft-dlq-original-bytes",
                self.value.len().to_string().into_bytes(),
            ));
            weft.push((
                "weft-dlq-sha256",
                hex::encode(Sha256::digest(&self.value)).into_bytes(),
            ));
        }
        headers.extend(weft.into_iter().map(|(k, v)| (k.to_owned(), v)));
        let key = match form {
            Form::Whole => self.key.clone(),
            _ => self.key.as_deref().map(|k| cut(k, MAX_SMALL).to_vec()),
        };
        let value = match form {
            Form::Whole => self.value.clone(),
            Form::Bounded => {
                let used: usize = headers.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
                let room = max.saturating_sub(used + OVERHEAD + key.as_ref().map_or(0, Vec::len));
                cut(&self.value, room).to_vec()
            }
            Form::Minimal => Vec::new(),
        };
        (key, value, headers)
    }
}

impl Flusher {
    #[instrument(skip(self, dead), fields(n = dead.len()))]
    pub(super) async fn dead_letter(
        &mut self,
        topic: &str,
        partition: i32,
        dead: &[DeadLetter],
    ) -> Result<(), Stopped> {
        let max = self.cfg.max_message_bytes;
        for d in dead {
            let mut form = d.first_form(max);
            let sent = loop {
                match self.send_form(d, form, max, (topic, partition)).await? {
                    Ok(()) => break Some(form),
                    Err(e) => {
                        let next = match form {
                            Form::Whole => Form::Bounded,
                            Form::Bounded => Form::Minimal,
                            Form::Minimal => {
                                error!(error = %e, topic, partition, offset = d.offset,
                                    "dead letter refused even without its value: quarantined in weft_dead_letters");
                                break None;
                            }
                        };
                        warn!(error = %e, ?form, ?next, offset = d.offset,
                            "dead letter refused for good in this form; sending a smaller one");
                        form = next;
                    }
                }
            };
            let message = match sent {
                Some(Form::Whole) => d.reason.message.clone(),
                Some(f) => format!(
                    "{} [dead-lettered {f:?}: {} bytes, sha256 {}]",
                    String::from_utf8_lossy(cut(d.reason.message.as_bytes(), MAX_SMALL)),
                    d.value.len(),
                    hex::encode(Sha256::digest(&d.value))
                ),
                None => {
                    self.metrics.dead_letters_quarantined.inc();
                    format!(
                        "QUARANTINED (dead-letter topic refused it): {} [{} bytes, sha256 {}]",
                        String::from_utf8_lossy(cut(d.reason.message.as_bytes(), MAX_SMALL)),
                        d.value.len(),
                        hex::encode(Sha256::digest(&d.value))
                    )
                }
            };
            // Acknowledged by the broker (or quarantined): now it is a dead letter to report.
            self.telemetry.record(Sample::DeadLetter(DeadLetterRow {
                at: now_micros(),
                topic: topic.to_owned(),
                partition,
                offset: d.offset,
                reason: d.reason.code,
                message,
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

    /// Send `d` in `form` until the broker acknowledges it (`Ok(Ok)`), refuses it for good
    /// (`Ok(Err)`), or the process is asked to stop (`Err(Stopped)`, at once, even mid-wait).
    async fn send_form(
        &mut self,
        d: &DeadLetter,
        form: Form,
        max: usize,
        source: (&str, i32),
    ) -> Result<Result<(), KafkaError>, Stopped> {
        let dlq_topic = self.cfg.topics.dead_letter();
        let (key, value, headers) = d.render(form, max, source);
        let mut attempt = 0;
        loop {
            let mut owned = OwnedHeaders::new();
            for (k, v) in &headers {
                owned = owned.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
            let mut rec = FutureRecord::<Vec<u8>, Vec<u8>>::to(&dlq_topic)
                .payload(&value)
                .headers(owned);
            if let Some(k) = &key {
                rec = rec.key(k);
            }
            let mut stop = self.stop.clone();
            let outcome = tokio::select! {
                r = self.dlq.send(rec, std::time::Duration::from_secs(5)) => r,
                _ = stop.wait_for(|s| *s) => return Err(Stopped),
            };
            match outcome {
                Ok(_) => return Ok(Ok(())),
                Err((e, _)) if is_permanent(&e) => return Ok(Err(e)),
                Err((e, _)) => {
                    attempt += 1;
                    self.metrics.dead_letter_retries.inc();
                    warn!(error = %e, attempt, "dead-letter publish failed; retrying (offsets held)");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff(attempt, self.cfg.max_backoff_ms)) => {}
                        _ = stop.wait_for(|s| *s) => return Err(Stopped),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(value_len: usize) -> DeadLetter {
        DeadLetter {
            key: Some(b"k".to_vec()),
            value: vec![b'v'; value_len],
            headers: vec![("weft-tenant".into(), b"acme".to_vec())],
            offset: 7,
            reason: Rejection {
                code: "undecodable",
                message: "m".repeat(5000),
            },
        }
    }

    #[test]
    fn a_record_over_the_limit_goes_out_bounded_with_its_size_and_hash() {
        let max = 1_000_000;
        let d = dead(1_050_000);
        assert_eq!(d.first_form(max), Form::Bounded);
        let (key, value, headers) = d.render(Form::Bounded, max, ("t", 3));
        let size = value.len()
            + key.map_or(0, |k| k.len())
            + headers
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>();
        assert!(size <= max - OVERHEAD, "{size}");
        assert!(value.len() > 900_000, "cut to what fits, not emptied");
        let h = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(h("weft-dlq-original-bytes"), Some(b"1050000".to_vec()));
        assert_eq!(
            h("weft-dlq-sha256"),
            Some(hex::encode(Sha256::digest(&d.value)).into_bytes())
        );
        assert_eq!(h("weft-dlq-offset"), Some(b"7".to_vec()));
        assert_eq!(h("weft-dlq-partition"), Some(b"3".to_vec()));
        assert_eq!(
            h("weft-tenant"),
            Some(b"acme".to_vec()),
            "small headers kept"
        );
        assert!(h("weft-dlq-message").unwrap().len() <= MAX_SMALL);
    }

    #[test]
    fn small_records_go_whole_and_minimal_has_no_value() {
        let d = dead(100);
        assert_eq!(d.first_form(1_000_000), Form::Whole);
        let (_, value, headers) = d.render(Form::Whole, 1_000_000, ("t", 0));
        assert_eq!(value, d.value);
        assert!(!headers.iter().any(|(k, _)| k == "weft-dlq-truncated"));
        let (_, value, headers) = d.render(Form::Minimal, 1_000_000, ("t", 0));
        assert!(value.is_empty());
        assert!(!headers.iter().any(|(k, _)| k == "weft-tenant"));
        assert!(headers.iter().any(|(k, _)| k == "weft-dlq-sha256"));
    }

    #[test]
    fn size_errors_are_permanent_and_outages_are_not() {
        let size = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        let down = KafkaError::MessageProduction(RDKafkaErrorCode::BrokerTransportFailure);
        let full = KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull);
        assert!(is_permanent(&size));
        assert!(!is_permanent(&down) && !is_permanent(&full));
    }
}
