//! The [`Publisher`]: validate, encode, send to Kafka, and never lose a confirmed event.
//!
//! # Durability
//! [`Publisher::publish`] returns at once with a [`Receipt`], a future that resolves only when
//! the event is durable: acknowledged by Kafka (acks=all), or appended to the on-disk spool
//! and fsynced as the [`FsyncPolicy`] promises. The hot path of the caller never waits for the
//! network or the disk unless it awaits the receipt.
//!
//! # Spooling and order
//! Events go to the spool when a delivery fails (broker unreachable: `message.timeout.ms`
//! passes) or librdkafka's queue is full. From then on the publisher is in *spool mode*, and
//! keeps per-request order like this:
//! - new events are held in memory while messages sent before the switch are still in flight
//!   (they may yet fail, and must be spooled ahead of anything newer); once none is in flight,
//!   the held events are appended behind them;
//! - while anything is spooled, every new event is appended to the spool too;
//! - a replayer thread sends spooled records to Kafka in order, in batches, and moves the
//!   durable cursor only after a whole batch is acknowledged (a failed batch is resent whole:
//!   at-least-once, consumers deduplicate by identity);
//! - when the replayer reads the last batch the spool holds, it starts a *handover*: new
//!   events are held in memory instead of appended; once that batch is acknowledged, the
//!   held events are sent directly, in order, and so is everything after them. Without the
//!   handover, constant traffic would keep the spool from ever being empty.
//!
//! A process that restarts finds its spool non-empty and starts in spool mode, so what the
//! spool holds is replayed before anything new.
//!
//! # One Kafka producer per healthy stretch
//! After a message times out, librdkafka's idempotent producer bumps its epoch locally and
//! resets its sequence numbers. Kafka accepts that, but the local broker (tansu 0.6) panics
//! on the unknown epoch and stops serving. So a producer instance that saw a delivery failure
//! is *tainted*: the replayer swaps in a fresh one (a new producer id), purges the old one's
//! queue (those events are spooled, in order) and never sends through it again.

mod delivery;
mod receipt;
mod refused;
mod replay;
mod state;
mod writer;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::Producer;
use tracing::{info, warn};
use weft_kafka::{ClientSettings, TopicError, TopicLayout};
use weft_schemas::contracts::Contract;
use weft_schemas::wire::{ContentType, SchemaIds, WireError};
use weft_schemas::{Envelope, EnvelopeError, Kind, Topics};

use crate::config::{ConfigError, PublisherConfig, ValueFormat};
use crate::metrics::Metrics;
use crate::spool::{Spool, SpoolError, SpoolOptions};
use delivery::Ctx;
use replay::replayer_loop;
use state::{lock, read, write, Job, Kafka, Shared, State};
use weft_kafka::registry::{self, RegistryError};
use writer::{writer_loop, WriterMsg};

pub use receipt::{Delivery, Receipt};
pub use refused::{RefusedFileError, Republished};

/// Why an event was not accepted, or could not be made durable.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The envelope failed validation; it was not published.
    #[error(transparent)]
    Invalid(#[from] EnvelopeError),
    /// The payload could not be encoded in the configured content type.
    #[error("cannot encode the event: {0}")]
    Encode(#[from] WireError),
    /// The encoded record exceeds `max_message_bytes`; Kafka would refuse it forever.
    #[error("event is {size} bytes, over the {max}-byte message limit")]
    TooLarge {
        /// Encoded size of the event, in bytes.
        size: usize,
        /// The configured `max_message_bytes`.
        max: usize,
    },
    /// Kafka is not taking events and the spool is at its bound: back-pressure, retry later.
    #[error("spool is full ({used} of {max} bytes); the event was NOT accepted, retry later")]
    SpoolFull {
        /// Bytes the spool holds now.
        used: u64,
        /// The spool's bound (`spool_max_bytes`).
        max: u64,
    },
    /// The spool could not be written; the event is not durable.
    #[error("spool write failed: {0}")]
    Spool(String),
    /// Kafka refused the event for good (not a connectivity problem).
    #[error("Kafka refused the event: {0}")]
    Kafka(KafkaError),
    /// The publisher was closed.
    #[error("publisher is closed")]
    Closed,
    /// Payload keys neither defined by the kind nor of the `x_<org>_<field>` shape, refused
    /// because `refuse_nonconforming_keys` is set.
    #[error("payload keys {keys} are neither defined by {kind} nor of the x_<org>_<field> shape")]
    Nonconforming {
        /// The event's kind.
        kind: Kind,
        /// The keys, comma-separated.
        keys: String,
    },
}

impl PublishError {
    /// A short, stable reason code (API responses and metric labels).
    pub fn code(&self) -> &'static str {
        match self {
            // The envelope's own code: the one the gateway's `parse_request` and ingest's
            // dead letters give the same envelope.
            PublishError::Invalid(e) => e.code(),
            PublishError::Encode(_) => "encode_failed",
            PublishError::TooLarge { .. } => "too_large",
            PublishError::SpoolFull { .. } => "spool_full",
            PublishError::Spool(_) => "spool_failed",
            PublishError::Kafka(_) => "kafka_refused",
            PublishError::Closed => "closed",
            PublishError::Nonconforming { .. } => "nonconforming_key",
        }
    }

    /// The [`PublishError::code`]s of the errors [`PublishError::is_retriable`] calls so.
    pub const RETRIABLE_CODES: [&'static str; 3] = ["spool_full", "spool_failed", "closed"];

    /// `true` when the caller did nothing wrong and may retry the same event later.
    pub fn is_retriable(&self) -> bool {
        Self::RETRIABLE_CODES.contains(&self.code())
    }
}

/// Why a publisher could not be created.
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    /// The configuration failed [`PublisherConfig::check`].
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The Kafka client could not be created or its admin call failed.
    #[error("Kafka client: {0}")]
    Kafka(#[from] KafkaError),
    /// The spool could not be opened.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// Schema ids could not be obtained from the registry (`avro-confluent` only).
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Kafka refused to create a topic; holds the topic and Kafka's error code.
    #[error("creating topic `{0}`: {1}")]
    CreateTopic(String, RDKafkaErrorCode),
    /// The OS would not start a writer or replayer thread.
    #[error("cannot start a publisher thread: {0}")]
    Thread(std::io::Error),
}

struct Inner {
    shared: Arc<Shared>,
    config: PublisherConfig,
    topics: [String; 8],
    content_type: ContentType,
    schema_ids: SchemaIds,
    producer_id: String,
    seq: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Nonconforming keys logged already (each is logged once).
    reported: weft_schemas::extensions::Reported,
}

/// The Rust publishing API. Cheap to clone; all clones share one Kafka producer and spool.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("producer_id", &self.inner.producer_id)
            .field("spool", &self.inner.config.spool_dir)
            .finish()
    }
}

impl Publisher {
    /// Connect: check the config, open (and lock) the spool, register Avro schemas if the
    /// content type needs a registry, and start the writer and replayer threads. Does not
    /// wait for the broker: an unreachable broker only means events are spooled.
    pub async fn connect(config: PublisherConfig) -> Result<Self, PublisherError> {
        Self::connect_with_metrics(config, Arc::new(Metrics::new())).await
    }

    /// [`Publisher::connect`] reporting into the given metrics (the gateway shares them).
    pub async fn connect_with_metrics(
        config: PublisherConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, PublisherError> {
        config.check()?;
        let schema_ids = match (&config.content_type, &config.schema_registry_url) {
            (ValueFormat::AvroConfluent, Some(url)) => {
                registry::register_all(url, &config.topics).await?
            }
            _ => SchemaIds::default(),
        };
        let (mut spool, report) = Spool::open(
            &config.spool_dir,
            SpoolOptions {
                fsync: config.fsync,
                max_bytes: config.spool_max_bytes,
                segment_bytes: config.spool_segment_bytes,
            },
        )?;
        if report.pending > 0 {
            info!(
                pending = report.pending,
                dir = %config.spool_dir.display(),
                "spool holds events from an earlier run; replaying them before new ones"
            );
        }
        refused::count_aside(&mut spool);
        metrics.spool_bytes.set(spool.bytes() as i64);
        metrics.spool_pending.set(report.pending as i64);
        metrics.spool_corrupt_records.inc_by(report.corrupt_records);
        metrics.spool_corrupt_bytes.inc_by(report.corrupt_bytes);
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                spooling: report.pending > 0,
                to_spool: report.pending,
                ..State::default()
            }),
            changed: Condvar::new(),
            spool_bytes: AtomicU64::new(spool.bytes()),
            spool: Mutex::new(spool),
            wake: Condvar::new(),
            writer: Mutex::new(tx),
            producer: RwLock::new(None),
            kafka_config: kafka_config(&config),
            metrics,
            max_bytes: config.spool_max_bytes,
            max_in_flight: config.max_in_flight,
            shutdown: AtomicBool::new(false),
        });
        let producer: Kafka = shared.kafka_config.create_with_context(Ctx {
            shared: shared.clone(),
            tainted: AtomicBool::new(false),
        })?;
        *write(&shared.producer) = Some(producer);
        let mut threads = Vec::new();
        let sh = shared.clone();
        let fsync = config.fsync;
        threads.push(
            std::thread::Builder::new()
                .name("weft-spool-writer".into())
                .spawn(move || writer_loop(sh, rx, fsync))
                .map_err(PublisherError::Thread)?,
        );
        let sh = shared.clone();
        let batch = config.replay_batch;
        let timeout = Duration::from_millis(config.message_timeout_ms);
        let give_up = (config.set_aside_after_secs > 0)
            .then(|| Duration::from_secs(config.set_aside_after_secs));
        threads.push(
            std::thread::Builder::new()
                .name("weft-spool-replayer".into())
                .spawn(move || replayer_loop(sh, batch, timeout, give_up))
                .map_err(PublisherError::Thread)?,
        );
        let topics = Kind::ALL.map(|k| config.topics.topic(k));
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                content_type: config.content_type.content_type(),
                schema_ids,
                producer_id: config.effective_producer_id(),
                seq: AtomicU64::new(0),
                threads: Mutex::new(threads),
                reported: Default::default(),
                topics,
                config,
            }),
        })
    }

    /// The metrics this publisher reports into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.shared.metrics
    }

    /// The topic names in use.
    pub fn topics(&self) -> &Topics {
        &self.inner.config.topics
    }

    /// The producer id stamped on events that carry none.
    pub fn producer_id(&self) -> &str {
        &self.inner.producer_id
    }

    /// Create the topics (one per kind, plus the dead-letter topic) that do not exist yet,
    /// with the configured partitions. Existing topics are left as they are.
    pub async fn ensure_topics(&self) -> Result<Vec<String>, PublisherError> {
        ensure_topics(&self.inner.config).await
    }

    /// Publish and wait until the event is durable.
    pub async fn publish_durable(&self, env: Envelope) -> Result<Delivery, PublishError> {
        self.publish(env)?.await
    }

    /// Publish a typed contract (`TraceEvent`, `PolicyDecision`, … any [`Contract`]) as an
    /// event of its kind, under this publisher's tenant, grouped under `request_id` (the
    /// flow or request it belongs to).
    pub fn publish_contract<C: Contract>(
        &self,
        e: &C,
        request_id: Option<&str>,
    ) -> Result<Receipt, PublishError> {
        let mut env = Envelope::new(C::KIND, e)
            .map_err(|e| PublishError::Invalid(EnvelopeError::PayloadJson(e)))?
            .with_tenant(self.inner.config.tenant.clone());
        env.request_id = request_id.map(str::to_owned);
        self.publish(env)
    }

    /// Most bytes the spool record of one event takes besides its payload's text and its
    /// request id (for the `json` content type, whose value is the payload's text): the
    /// record's fixed bytes ([`SpoolRecord::FIXED_BYTES`]), the longest topic, the key (a
    /// copy of the request id or of the identity, at most [`MAX_ID_BYTES`]) and every header
    /// ([`weft_schemas::wire::for_each_header`]) at its longest, the request id's value excepted: the
    /// longest kind, a tenant of 128 bytes, this publisher's producer id, the largest `seq`
    /// and an `emitted_at` it stamps. The gateway's `/readyz` sizes one largest request
    /// with it.
    ///
    /// [`SpoolRecord::FIXED_BYTES`]: crate::spool::SpoolRecord::FIXED_BYTES
    /// [`MAX_ID_BYTES`]: weft_schemas::identity::MAX_ID_BYTES
    pub fn spool_bytes_per_event(&self) -> u64 {
        use crate::spool::SpoolRecord;
        let inner = &*self.inner;
        let topic = inner.topics.iter().map(String::len).max().unwrap_or(0);
        let kind = Kind::ALL
            .iter()
            .map(|k| k.as_str().len())
            .max()
            .unwrap_or(0);
        let worst = Envelope {
            kind: Kind::ALL[0],
            request_id: Some(String::new()),
            tenant: String::new(),
            producer_id: Some(inner.producer_id.clone()),
            seq: Some(u64::MAX),
            emitted_at: Some(weft_schemas::time::now_rfc3339()),
            payload: serde_json::value::RawValue::NULL.to_owned(),
        };
        let mut headers = 0;
        weft_schemas::wire::for_each_header(&worst, inner.content_type, |k, v| {
            headers += SpoolRecord::HEADER_BYTES + k.len() + v.len();
        });
        // The kind and tenant values at their longest (a tenant is at most 128 bytes,
        // `weft_schemas::envelope::is_valid_tenant`).
        headers += kind - worst.kind.as_str().len() + 128;
        (SpoolRecord::FIXED_BYTES + topic + weft_schemas::identity::MAX_ID_BYTES + headers) as u64
    }

    /// Events in the spool not yet delivered to Kafka.
    pub fn spool_pending(&self) -> u64 {
        lock(&self.inner.shared.spool).pending()
    }

    /// Bytes the spool holds on disk, and its bound (`spool_max_bytes`).
    pub fn spool_bytes(&self) -> (u64, u64) {
        let used = lock(&self.inner.shared.spool).bytes();
        (used, self.inner.config.spool_max_bytes)
    }

    /// `true` while events are being spooled rather than sent directly.
    pub fn is_spooling(&self) -> bool {
        lock(&self.inner.shared.state).spooling
    }

    /// Block until the spool is empty and events flow directly again, or `timeout` passes.
    /// Returns whether it drained. For `weft publish --drain-spool` and tests.
    pub fn wait_drained(&self, timeout: Duration) -> bool {
        let sh = &self.inner.shared;
        let deadline = Instant::now() + timeout;
        let mut st = lock(&sh.state);
        loop {
            if !st.spooling && st.in_flight == 0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = sh
                .changed
                .wait_timeout(st, (deadline - now).min(Duration::from_millis(200)))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Stop accepting events, wait (up to `timeout`) for in-flight ones to be acknowledged or
    /// spooled, write out everything queued for the spool, and stop the background threads.
    /// Every receipt is resolved when this returns. Undelivered spool content stays on disk
    /// for the next run; the spool directory's lock is released when the last handle drops.
    /// Blocking: call it from `spawn_blocking` inside a runtime.
    pub fn close(&self, timeout: Duration) {
        let inner = &*self.inner;
        let sh = &*inner.shared;
        lock(&sh.state).closed = true;
        let deadline = Instant::now() + timeout;
        if let Some(p) = read(&sh.producer).as_ref() {
            let _ = p.flush(timeout);
        }
        {
            let mut st = lock(&sh.state);
            while st.in_flight > 0 && Instant::now() < deadline {
                st = sh
                    .changed
                    .wait_timeout(st, Duration::from_millis(50))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            if st.in_flight > 0 {
                warn!(
                    in_flight = st.in_flight,
                    "close: events still in flight after the timeout"
                );
            }
            // Whatever is still held goes to the spool now, in order.
            let held: Vec<Job> = st.held.drain(..).collect();
            st.held_bytes = 0;
            for job in held {
                sh.to_writer(&mut st, job);
            }
        }
        sh.shutdown.store(true, Ordering::SeqCst);
        sh.wake.notify_all();
        let _ = lock(&sh.writer).send(WriterMsg::Stop);
        let threads: Vec<_> = lock(&inner.threads).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        // Also breaks the Shared -> producer -> context -> Shared cycle.
        let producer = write(&sh.producer).take();
        drop(producer);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Last handle gone without close(): stop the threads; they finish what is queued.
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        let _ = lock(&self.shared.writer).send(WriterMsg::Stop);
        let producer = write(&self.shared.producer).take();
        drop(producer);
    }
}

fn kind_index(kind: Kind) -> usize {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

/// librdkafka's headers for a record's `(name, value)` pairs, in order.
pub fn owned_headers<K: AsRef<str>>(headers: &[(K, Vec<u8>)]) -> OwnedHeaders {
    headers.iter().fold(
        OwnedHeaders::new_with_capacity(headers.len()),
        |h, (k, v)| {
            h.insert(Header {
                key: k.as_ref(),
                value: Some(v.as_slice()),
            })
        },
    )
}

/// The librdkafka settings derived from the config (extra properties last, so they win):
/// the Publisher's producer, and `weft bench publish --raw`'s bare one.
pub fn kafka_config(c: &PublisherConfig) -> ClientConfig {
    let mut k = ClientConfig::new();
    k.set("bootstrap.servers", &c.brokers)
        .set("acks", &c.acks)
        .set("enable.idempotence", c.idempotence.to_string())
        .set("compression.type", &c.compression)
        .set("linger.ms", c.linger_ms.to_string())
        .set("batch.size", c.batch_bytes.to_string())
        .set("batch.num.messages", c.batch_messages.to_string())
        .set("message.timeout.ms", c.message_timeout_ms.to_string())
        .set("queue.buffering.max.messages", c.queue_bound.to_string())
        .set("queue.buffering.max.kbytes", "1048576")
        .set(
            "message.max.bytes",
            (c.max_message_bytes + 4096).to_string(),
        )
        .set(
            "client.id",
            format!("weft-publisher-{}", std::process::id()),
        );
    client_settings(c).apply(&mut k);
    k
}

/// The brokers and the configured librdkafka extras (SASL/TLS and the like), for every client
/// the publisher makes: producer and admin alike.
fn client_settings(c: &PublisherConfig) -> ClientSettings {
    ClientSettings::new(&c.brokers, &c.kafka_properties)
}

/// Create missing topics (one per kind plus dead-letter) with the configured partitions
/// ([`weft_kafka::ensure_topics`]). Returns the names created now.
pub async fn ensure_topics(c: &PublisherConfig) -> Result<Vec<String>, PublisherError> {
    let layout = TopicLayout {
        partitions: c.partitions,
        replication_factor: c.replication_factor,
    };
    weft_kafka::ensure_topics(&client_settings(c), &c.topics, layout)
        .await
        .map_err(|e| match e {
            TopicError::Kafka(e) => PublisherError::Kafka(e),
            TopicError::Create(name, code) => PublisherError::CreateTopic(name, code),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FsyncPolicy;

    fn env(i: usize) -> Envelope {
        let text = format!(
            r#"{{"kind":"trace_event","request_id":"r","payload":{{"event_id":"e{i}","event_type":"flow_started","timestamp":"2026-03-08T06:00:05Z"}}}}"#
        );
        serde_json::from_str(&text).unwrap()
    }

    fn offline(dir: &std::path::Path) -> PublisherConfig {
        PublisherConfig {
            // Nothing listens on the discard port: every delivery times out.
            brokers: "127.0.0.1:9".into(),
            spool_dir: dir.to_owned(),
            message_timeout_ms: 300,
            ..PublisherConfig::default()
        }
    }

    /// A refused envelope is answered with the envelope's own code: the one the gateway's
    /// `parse_request`, docs/HTTP.md and ingest's dead letters use. Before, `id_too_long`,
    /// `no_identity` and `undecodable_json` came out of the publisher as `invalid_payload`
    /// or `missing_identity`.
    #[test]
    fn an_invalid_envelope_is_answered_with_the_envelopes_own_code() {
        let missing = weft_schemas::identity::IdentityError::MissingId {
            kind: Kind::Frame,
            field: "frame_id",
        };
        let not_json = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let cases = [
            (EnvelopeError::PayloadJson(not_json), "undecodable_json"),
            (EnvelopeError::PayloadNotObject, "undecodable_json"),
            (EnvelopeError::DuplicateKey("k".into()), "duplicate_key"),
            (
                EnvelopeError::Schema {
                    kind: Kind::Frame,
                    violations: Vec::new(),
                },
                "schema_invalid",
            ),
            (EnvelopeError::Identity(missing), "no_identity"),
            (EnvelopeError::BadTenant, "bad_tenant"),
            (
                EnvelopeError::IdTooLong {
                    field: "identity",
                    len: 2_000,
                },
                "id_too_long",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.code(), want);
            let text = e.to_string();
            assert_eq!(PublishError::Invalid(e).code(), want, "{text}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unreachable_broker_spools_in_order_and_the_spool_outlives_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let p = Publisher::connect(offline(dir.path())).await.unwrap();
        let receipts: Vec<Receipt> = (0..50).map(|i| p.publish(env(i)).unwrap()).collect();
        for r in receipts {
            assert_eq!(r.await.unwrap(), Delivery::Spooled);
        }
        assert!(p.is_spooling());
        assert_eq!(p.spool_pending(), 50);
        assert_eq!(p.metrics().spooled.get(), 50);
        let bad: Envelope =
            serde_json::from_str(r#"{"kind":"frame","payload":{"frame_id":"f"}}"#).unwrap();
        assert_eq!(p.publish(bad).unwrap_err().code(), "schema_invalid");
        // In spool mode new events go straight to the spool, behind the older ones.
        assert_eq!(
            p.publish(env(50)).unwrap().await.unwrap(),
            Delivery::Spooled
        );
        let p2 = p.clone();
        tokio::task::spawn_blocking(move || p2.close(Duration::from_secs(5)))
            .await
            .unwrap();
        assert!(matches!(p.publish(env(51)), Err(PublishError::Closed)));
        drop(p); // the last handle releases the spool directory's lock

        let (mut spool, report) = Spool::open(
            dir.path(),
            SpoolOptions {
                fsync: FsyncPolicy::Never,
                max_bytes: u64::MAX,
                segment_bytes: 1 << 20,
            },
        )
        .unwrap();
        assert_eq!(report.pending, 51);
        let batch = spool.read_batch(100, u64::MAX).unwrap();
        let ids: Vec<String> = batch
            .records
            .iter()
            .map(|r| {
                let v: serde_json::Value = serde_json::from_slice(&r.value).unwrap();
                v["event_id"].as_str().unwrap().to_owned()
            })
            .collect();
        let want: Vec<String> = (0..51).map(|i| format!("e{i}")).collect();
        assert_eq!(ids, want, "publish order kept");
        assert_eq!(batch.records[0].key.as_deref(), Some(&b"r"[..]));
    }

    /// A spooled record Kafka refuses on replay is set aside, and counted as that only: not
    /// as published or replayed, which count what Kafka acknowledged. Before, the replayer
    /// counted every record of a settled batch, those set aside included.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_set_aside_on_replay_is_not_counted_as_published() {
        let dir = tempfile::tempdir().unwrap();
        let pad = "a".repeat(200_000);
        let big: Envelope = serde_json::from_str(&format!(
            r#"{{"kind":"trace_event","payload":{{"event_id":"e1","event_type":"flow_started","timestamp":"2026-03-08T06:00:05Z","x_acme_pad":"{pad}"}}}}"#
        ))
        .unwrap();
        let p = Publisher::connect(offline(dir.path())).await.unwrap();
        assert_eq!(p.publish(big).unwrap().await.unwrap(), Delivery::Spooled);
        let p2 = p.clone();
        tokio::task::spawn_blocking(move || p2.close(Duration::from_secs(5)))
            .await
            .unwrap();
        drop(p);
        // Reopened with a smaller message limit: librdkafka refuses the record for good.
        let small = PublisherConfig {
            max_message_bytes: 10_000,
            ..offline(dir.path())
        };
        let p = Publisher::connect(small).await.unwrap();
        let m = p.metrics();
        // The batch is settled (cursor committed) after its counters moved.
        let deadline = Instant::now() + Duration::from_secs(10);
        while (m.spool_refused.get(), p.spool_pending()) != (1, 0) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!((m.spool_refused.get(), p.spool_pending()), (1, 0));
        assert!(dir.path().join(refused::FILE).exists());
        assert_eq!(
            (m.published.get(), m.replayed.get()),
            (0, 0),
            "Kafka acknowledged nothing"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_spool_is_back_pressure_never_a_silent_drop() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = PublisherConfig {
            spool_max_bytes: 20_000,
            spool_segment_bytes: 10_000,
            ..offline(dir.path())
        };
        let p = Publisher::connect(cfg).await.unwrap();
        let (mut durable, mut full) = (0, 0);
        let mut receipts = Vec::new();
        for i in 0..400 {
            match p.publish(env(i)) {
                Ok(r) => receipts.push(r),
                Err(PublishError::SpoolFull { .. }) => full += 1,
                Err(e) => panic!("{e}"),
            }
        }
        for r in receipts {
            match r.await {
                Ok(_) => durable += 1,
                Err(e) => {
                    assert_eq!(e.code(), "spool_full", "{e}");
                    full += 1
                }
            }
        }
        assert_eq!(durable + full, 400, "every event is accounted for");
        assert!(
            durable > 10 && full > 100,
            "{durable} durable, {full} refused"
        );
        assert_eq!(p.spool_pending(), durable as u64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nonconforming_keys_are_counted_and_refused_only_when_configured() {
        let odd: Envelope = serde_json::from_str(
            r#"{"kind":"trace_event","payload":{"event_id":"e","event_type":"flow_started",
                "timestamp":"2026-03-08T06:00:05Z","x_weaver_signature":"s","weaver_reserved":1,"Foo":2}}"#,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = Publisher::connect(offline(dir.path())).await.unwrap();
        assert!(p.publish(env(0)).is_ok());
        assert_eq!(p.metrics().publisher_nonconforming_keys.get(), 0);
        assert!(p.publish(odd.clone()).is_ok(), "counted, not refused");
        assert_eq!(p.metrics().publisher_nonconforming_keys.get(), 2);
        p.close(Duration::from_secs(5));

        let dir = tempfile::tempdir().unwrap();
        let refusing = PublisherConfig {
            refuse_nonconforming_keys: true,
            ..offline(dir.path())
        };
        let p = Publisher::connect(refusing).await.unwrap();
        let e = p.publish(odd).unwrap_err();
        assert_eq!(e.code(), "nonconforming_key");
        assert!(e.to_string().contains("Foo, weaver_reserved"), "{e}");
        assert!(p.publish(env(1)).is_ok(), "conforming events still pass");
        p.close(Duration::from_secs(5));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_append_is_failed_once_and_leaves_nothing_to_replay() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = PublisherConfig {
            spool_segment_bytes: 4_000,
            ..offline(dir.path())
        };
        let p = Publisher::connect(cfg).await.unwrap();
        assert_eq!(p.publish(env(0)).unwrap().await.unwrap(), Delivery::Spooled);
        // The next segments cannot be created (stands for a disk out of space or inodes).
        for id in 2..4u64 {
            std::fs::create_dir(dir.path().join(format!("{id:020}.seg"))).unwrap();
        }
        let receipts: Vec<_> = (1..200).map(|i| p.publish(env(i)).unwrap()).collect();
        let (mut durable, mut failed) = (1, 0);
        for r in receipts {
            match r.await {
                Ok(d) => {
                    assert_eq!(d, Delivery::Spooled);
                    durable += 1
                }
                Err(e) => {
                    assert_eq!(e.code(), "spool_failed", "{e}");
                    failed += 1
                }
            }
        }
        assert!(failed > 0, "rotation failed");
        assert_eq!(
            p.spool_pending(),
            durable,
            "a failed receipt left no record"
        );
        // What the replayer will settle is exactly what is not settled yet, so the spool
        // mode can end (a failed append settled twice kept it on for ever).
        let sh = &p.inner.shared;
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let unsettled = {
                let st = lock(&sh.state);
                st.to_spool as i64 - st.settled as i64
            };
            let pending = p.spool_pending() as i64;
            if unsettled == pending || Instant::now() > deadline {
                assert_eq!(unsettled, pending);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
