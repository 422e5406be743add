//! Dead letters: records that cannot be ingested, sent to the dead-letter topic.
//!
//! One record must never stop ingest. A dead letter goes out whole when it fits
//! `max_message_bytes`; else (or when the broker refuses it for its size) in a *bounded* form:
//! the original value cut to what fits, with `weft-dlq-truncated: 1`,
//! `weft-dlq-original-bytes`, `weft-dlq-sha256` (of the whole original value) beside the usual
//! `weft-dlq-reason`/`-message`/`-topic`/`-partition`/`-offset`; and if even that is refused,
//! in a *minimal* form (no value, no original headers). A form refused for good is never
//! retried; only transient errors (broker unreachable, queue full) are, with the partition's
//! offsets held, each through a new producer (see `send_once`), and every wait gives way to a
//! stop at once. If the minimal form is refused
//! too, the record is quarantined: stored in the ClickHouse table `weft_quarantine` (the value
//! cut to `max_message_bytes`, its size, SHA-256, key, small headers, source topic, partition,
//! offset, the reason and the broker's refusal), retried like a facts insert until it lands,
//! and the partition moves on (`weft_ingest_dead_letters_quarantined_total`).

use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tracing::{error, info, instrument, warn};

use super::config::{kafka_config, IngestConfig};
use super::flush::{Flusher, Stopped};
use super::now_micros;
use super::retry::unless_stopped;
use crate::decode::Rejection;
use crate::telemetry::{DeadLetterRow, Sample};
use weft_store::insert;
use weft_store::telemetry::{QuarantineRow, QUARANTINE};

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
/// The prefix of the headers weft adds to a dead letter.
const DLQ_PREFIX: &str = "weft-dlq-";
/// What a record's own header named with [`DLQ_PREFIX`] is renamed to start with.
const ORIGINAL_PREFIX: &str = "original-";
/// Longest key and `weft-dlq-message` a bounded form carries.
const MAX_SMALL: usize = 1 << 10;
/// Most bytes of original headers a bounded form (or a quarantine row) keeps.
const HEADERS_KEPT: usize = 16 << 10;

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

/// The dead-letter producer: idempotent, acknowledged by every in-sync replica, with room for
/// weft's headers around a record of `max_message_bytes` unless the properties set a limit
/// (a smaller one makes larger dead letters go out bounded, or quarantined).
pub(super) fn producer(cfg: &IngestConfig) -> KafkaResult<FutureProducer> {
    let mut dlq = kafka_config(cfg);
    dlq.set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "30000");
    if !cfg.kafka_properties.contains_key("message.max.bytes") {
        let room = cfg.max_message_bytes + (64 << 10);
        dlq.set("message.max.bytes", room.to_string());
    }
    dlq.create()
}

/// An idempotent producer that hit a fatal error (librdkafka's word for one that can never
/// send again, such as a sequence gap the broker will not accept) fails every send from then
/// on; a new one starts a new producer id. `None` while `dlq` can still send.
fn fatal_error(dlq: &FutureProducer) -> Option<String> {
    dlq.client()
        .fatal_error()
        .map(|(code, reason)| format!("{code:?}: {reason}"))
}

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
    /// The bytes it holds until sent (key, value and headers), for the batch's byte budget:
    /// a record of 1 MB of headers and an empty value is 1 MB, not nothing.
    pub(super) fn held_bytes(&self) -> usize {
        self.value.len()
            + self.key.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }

    /// The record's `weft-tenant` header, empty when it has none; the last one when it has
    /// several, as `weft_schemas::wire::tenant_of` reads it.
    fn tenant(&self) -> String {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k == weft_schemas::wire::header::TENANT)
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
            .unwrap_or_default()
            .to_owned()
    }

    /// Headers of at most `HEADERS_KEPT` bytes in all, else none.
    fn small_headers(&self) -> Option<&[(String, Vec<u8>)]> {
        let size: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        (size <= HEADERS_KEPT).then_some(self.headers.as_slice())
    }

    /// The row that keeps this record in `weft_quarantine`: the value cut to `max` bytes.
    pub(super) fn quarantine_row(
        &self,
        max: usize,
        source: (&str, i32),
        refused: &KafkaError,
    ) -> QuarantineRow {
        QuarantineRow {
            at: now_micros(),
            tenant: self.tenant(),
            topic: source.0.to_owned(),
            partition: source.1,
            offset: self.offset,
            reason: self.reason.code,
            message: String::from_utf8_lossy(cut(self.reason.message.as_bytes(), HEADERS_KEPT))
                .into_owned(),
            refused: refused.to_string(),
            original_bytes: self.value.len() as u64,
            sha256: hex::encode(Sha256::digest(&self.value)),
            truncated: self.value.len() > max,
            key: self
                .key
                .as_deref()
                .map(|k| cut(k, MAX_SMALL).to_vec())
                .unwrap_or_default(),
            headers: self
                .small_headers()
                .unwrap_or_default()
                .iter()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect(),
            value: cut(&self.value, max).to_vec(),
        }
    }

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
        let original: &[(String, Vec<u8>)] = match form {
            Form::Whole => &self.headers,
            Form::Bounded => self.small_headers().unwrap_or_default(),
            Form::Minimal => &[],
        };
        // A record that already carries weft's headers (a producer's, or a dead letter
        // published again) keeps them under another name: a reader that takes the first
        // `weft-dlq-reason` must get weft's.
        let mut headers: Vec<(String, Vec<u8>)> = original
            .iter()
            .map(|(k, v)| {
                let name = if k.starts_with(DLQ_PREFIX) {
                    format!("{ORIGINAL_PREFIX}{k}")
                } else {
                    k.clone()
                };
                (name, v.clone())
            })
            .collect();
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
    /// Send `dead` to the dead-letter topic (quarantining what it refuses in every form);
    /// how many it acknowledged (the quarantined ones are counted apart).
    #[instrument(skip(self, dead), fields(n = dead.len()))]
    pub(super) async fn dead_letter(
        &mut self,
        topic: &str,
        partition: i32,
        dead: &[DeadLetter],
    ) -> Result<u64, Stopped> {
        let max = self.cfg.max_message_bytes;
        let mut acknowledged = 0;
        for d in dead {
            let mut form = d.first_form(max);
            let sent = loop {
                match self.send_form(d, form, max, (topic, partition)).await? {
                    Ok(()) => break Ok(form),
                    Err(e) => {
                        let next = match form {
                            Form::Whole => Form::Bounded,
                            Form::Bounded => Form::Minimal,
                            Form::Minimal => break Err(e),
                        };
                        warn!(error = %e, ?form, ?next, offset = d.offset,
                            "dead letter refused for good in this form; sending a smaller one");
                        form = next;
                    }
                }
            };
            let acked = sent.is_ok();
            let message = match sent {
                Ok(Form::Whole) => d.reason.message.clone(),
                Ok(f) => format!(
                    "{} [dead-lettered {f:?}: {} bytes, sha256 {}]",
                    String::from_utf8_lossy(cut(d.reason.message.as_bytes(), MAX_SMALL)),
                    d.value.len(),
                    hex::encode(Sha256::digest(&d.value))
                ),
                Err(e) => {
                    error!(error = %e, topic, partition, offset = d.offset,
                        "dead letter refused even without its value: quarantined in weft_quarantine");
                    self.quarantine(d, (topic, partition), &e).await?;
                    self.metrics.dead_letters_quarantined.inc();
                    format!(
                        "QUARANTINED (dead-letter topic refused it; kept in weft_quarantine): {} [{} bytes, sha256 {}]",
                        String::from_utf8_lossy(cut(d.reason.message.as_bytes(), MAX_SMALL)),
                        d.value.len(),
                        hex::encode(Sha256::digest(&d.value))
                    )
                }
            };
            // Acknowledged by the broker, or quarantined (counted in its own metric only, and
            // shown in `weft_dead_letters` with a message starting `QUARANTINED`).
            if acked {
                acknowledged += 1;
                self.metrics
                    .dead_lettered
                    .with_label_values(&[d.reason.code])
                    .inc();
            }
            self.telemetry.record(Sample::DeadLetter(DeadLetterRow {
                at: now_micros(),
                topic: topic.to_owned(),
                partition,
                offset: d.offset,
                reason: d.reason.code,
                message,
                tenant: d.tenant(),
            }));
        }
        Ok(acknowledged)
    }

    /// Keep `d` in `weft_quarantine`, retrying until ClickHouse has it or the process stops
    /// (at once, even mid-wait): the partition's offsets move on only once the row is stored.
    async fn quarantine(
        &self,
        d: &DeadLetter,
        source: (&str, i32),
        refused: &KafkaError,
    ) -> Result<(), Stopped> {
        let row = d.quarantine_row(self.cfg.max_message_bytes, source, refused);
        self.backoff
            .retry(
                || insert::<QuarantineRow>(&self.store, QUARANTINE, std::slice::from_ref(&row)),
                |e, attempt| {
                    self.metrics.insert_retries.inc();
                    warn!(error = %e, attempt, "quarantine insert failed; offsets held, retrying");
                    Ok(())
                },
            )
            .await
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
            match send_once(&mut self.dlq, &self.cfg, rec, self.backoff.stop()).await? {
                Ok(()) => return Ok(Ok(())),
                Err(e) if is_permanent(&e) => return Ok(Err(e)),
                Err(e) => {
                    attempt += 1;
                    self.metrics.dead_letter_retries.inc();
                    warn!(error = %e, attempt, "dead-letter publish failed; retrying with a new producer (offsets held)");
                    self.backoff.pause(attempt).await?;
                }
            }
        }
    }
}

/// Send one dead letter through `dlq`: `Ok(Err)` with the broker's error, `Err(Stopped)` when
/// the process is asked to stop (at once, even mid-send). After a transient error `dlq` is
/// replaced by a new producer (a new producer id), as the Publisher replaces a tainted one
/// (`producers/src/publisher/mod.rs`, "One Kafka producer per healthy stretch"): once a
/// message timed out, librdkafka's idempotent producer bumps its epoch locally, on which
/// tansu 0.6 panics and stops serving; it is never sent through again.
async fn send_once(
    dlq: &mut FutureProducer,
    cfg: &IngestConfig,
    rec: FutureRecord<'_, Vec<u8>, Vec<u8>>,
    stop: &watch::Receiver<bool>,
) -> Result<Result<(), KafkaError>, Stopped> {
    let send = dlq.send(rec, std::time::Duration::from_secs(5));
    match unless_stopped(stop, send).await? {
        Ok(_) => Ok(Ok(())),
        Err((e, _)) if is_permanent(&e) => Ok(Err(e)),
        Err((e, _)) => {
            replace(dlq, cfg, &e);
            Ok(Err(e))
        }
    }
}

/// Replace `dlq` after the transient error `e`. If a new producer cannot be made, the old one
/// is kept (and the next failure tries again); one in librdkafka's fatal state says so.
fn replace(dlq: &mut FutureProducer, cfg: &IngestConfig, e: &KafkaError) {
    let fatal = fatal_error(dlq);
    match producer(cfg) {
        Ok(fresh) => {
            let old = std::mem::replace(dlq, fresh);
            match fatal {
                Some(fatal) => {
                    error!(%fatal, "dead-letter producer failed for good; replaced by a new one")
                }
                None => {
                    info!(error = %e, "dead-letter producer replaced after a failed send (new producer id)")
                }
            }
            // Dropping a producer purges its queue and waits for it (up to 500 ms), then joins
            // its thread: not on the runtime's worker. Nothing of ours is queued in it (one
            // dead letter is sent at a time, and this one's send has failed).
            tokio::task::spawn_blocking(move || drop(old));
        }
        Err(new) => {
            warn!(error = %new, fatal = ?fatal, "a new dead-letter producer could not be made; retrying with the old one")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_counts_its_key_and_headers_not_only_its_value() {
        let mut d = dead(0);
        d.headers.push(("x".into(), vec![0; 1 << 20]));
        d.key = Some(vec![0; 1000]);
        assert_eq!(
            d.held_bytes(),
            1000 + "weft-tenant".len() + 4 + 1 + (1 << 20)
        );
    }

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
    fn a_records_own_weft_headers_cannot_pass_for_weft_s() {
        let mut d = dead(10);
        d.headers
            .push(("weft-dlq-reason".into(), b"forged".to_vec()));
        d.headers.push(("weft-dlq-offset".into(), b"0".to_vec()));
        for form in [Form::Whole, Form::Bounded] {
            let (_, _, headers) = d.render(form, 1_000_000, ("t", 0));
            let first = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v);
            assert_eq!(
                first("weft-dlq-reason"),
                Some(&d.reason.code.as_bytes().to_vec())
            );
            assert_eq!(
                first("weft-dlq-offset"),
                Some(&d.offset.to_string().into_bytes())
            );
            assert_eq!(
                first("original-weft-dlq-reason"),
                Some(&b"forged".to_vec()),
                "{form:?}: the record's own header is kept, renamed"
            );
            let reasons = headers
                .iter()
                .filter(|(k, _)| k == "weft-dlq-reason")
                .count();
            assert_eq!(reasons, 1, "{form:?}");
        }
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
    fn a_quarantine_row_keeps_the_value_cut_to_the_maximum_with_size_and_hash() {
        let d = dead(5000);
        let refused = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        let row = d.quarantine_row(4000, ("t", 2), &refused);
        assert_eq!((row.topic.as_str(), row.partition, row.offset), ("t", 2, 7));
        assert_eq!(row.value, d.value[..4000]);
        assert!(row.truncated);
        assert_eq!(row.original_bytes, 5000);
        assert_eq!(row.sha256, hex::encode(Sha256::digest(&d.value)));
        assert_eq!(row.tenant, "acme");
        assert_eq!(row.headers, vec![("weft-tenant".into(), "acme".into())]);
        assert!(row.refused.contains("MessageSizeTooLarge"));
        let whole = d.quarantine_row(1_000_000, ("t", 2), &refused);
        assert!(!whole.truncated && whole.value == d.value);
    }

    /// A record with two tenant headers is quarantined under the tenant ingest reads: the last.
    #[test]
    fn the_quarantined_tenant_is_the_last_tenant_header() {
        let mut d = dead(10);
        d.headers.push(("weft-tenant".into(), b"globex".to_vec()));
        let refused = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(d.quarantine_row(100, ("t", 0), &refused).tenant, "globex");
        let headers: Vec<(&str, &[u8])> = d
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        assert_eq!(weft_schemas::wire::tenant_of(&headers), Some("globex"));
    }

    /// A producer in librdkafka's fatal state is found, and one made afresh is not in it.
    #[test]
    fn a_producer_failed_for_good_is_told_from_a_working_one() {
        let cfg = IngestConfig::default();
        let dlq = producer(&cfg).unwrap();
        assert_eq!(fatal_error(&dlq), None);
        let reason = std::ffi::CString::new("injected by a test").unwrap();
        // SAFETY: the client pointer is live for the producer's lifetime, and the reason a
        // NUL-terminated string that outlives the call.
        let injected = unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                dlq.client().native_ptr(),
                rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                reason.as_ptr(),
            )
        };
        assert_eq!(
            injected,
            rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
        );
        let fatal = fatal_error(&dlq).expect("the injected fatal error");
        assert!(fatal.contains("injected by a test"), "{fatal}");
        assert_eq!(fatal_error(&producer(&cfg).unwrap()), None);
    }

    /// A send that fails for a transient reason (here: nothing listens, so the message times
    /// out) leaves a new producer in place: the one that saw it is never sent through again.
    #[tokio::test]
    async fn a_transient_send_failure_replaces_the_producer() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let cfg = IngestConfig {
            brokers: format!("127.0.0.1:{port}"),
            ..IngestConfig::default()
        };
        let mut dlq: FutureProducer = kafka_config(&cfg)
            .set("message.timeout.ms", "100")
            .create()
            .expect("a producer");
        let before = dlq.client().native_ptr() as usize;
        let (_stop, rx) = watch::channel(false);
        let value = b"dead".to_vec();
        let rec = FutureRecord::<Vec<u8>, Vec<u8>>::to("weaver.dead_letter").payload(&value);
        let sent = send_once(&mut dlq, &cfg, rec, &rx)
            .await
            .expect("not stopped");
        let e = sent.expect_err("nothing listens on the port");
        assert!(!is_permanent(&e), "{e}");
        assert_ne!(
            dlq.client().native_ptr() as usize,
            before,
            "the producer that saw {e} was replaced"
        );
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
