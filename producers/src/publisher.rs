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

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, PurgeConfig, ThreadedProducer};
use rdkafka::{ClientContext, Message};
use tokio::sync::oneshot;
use tracing::{debug, error, info, warn};
use weft_schemas::contracts::{
    CapabilityToken, ExecutionFeedback, ExecutionRoutingDecision, Frame, Handle, PolicyDecision,
    RoutingDecision, TraceEvent,
};
use weft_schemas::wire::{self, ContentType, SchemaIds, WireError};
use weft_schemas::{Envelope, EnvelopeError, Kind, Topics};

use crate::config::{ConfigError, FsyncPolicy, PublisherConfig, ValueFormat};
use crate::metrics::Metrics;
use crate::registry::{self, RegistryError};
use crate::spool::{Spool, SpoolError, SpoolOptions, SpoolRecord};

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
}

impl PublishError {
    /// A short, stable reason code (API responses and metric labels).
    pub fn code(&self) -> &'static str {
        match self {
            PublishError::Invalid(EnvelopeError::Schema { .. }) => "schema_invalid",
            PublishError::Invalid(EnvelopeError::BadTenant) => "bad_tenant",
            PublishError::Invalid(EnvelopeError::Identity(_)) => "missing_identity",
            PublishError::Invalid(EnvelopeError::DuplicateKey(_)) => "duplicate_key",
            PublishError::Invalid(_) => "invalid_payload",
            PublishError::Encode(_) => "encode_failed",
            PublishError::TooLarge { .. } => "too_large",
            PublishError::SpoolFull { .. } => "spool_full",
            PublishError::Spool(_) => "spool_failed",
            PublishError::Kafka(_) => "kafka_refused",
            PublishError::Closed => "closed",
        }
    }

    /// `true` when the caller did nothing wrong and may retry the same event later.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            PublishError::SpoolFull { .. } | PublishError::Spool(_) | PublishError::Closed
        )
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

/// Where a durable event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Acknowledged by Kafka at this partition and offset.
    Kafka {
        /// Partition the event was written to.
        partition: i32,
        /// Offset of the event in that partition.
        offset: i64,
    },
    /// In the spool, fsynced per policy; the replayer will deliver it.
    Spooled,
}

type Reply = oneshot::Sender<Result<Delivery, PublishError>>;

/// A promise of durability for one published event. Await it (or call
/// [`Receipt::wait_blocking`] outside an async runtime); it resolves when the event is
/// durable, or with the reason it could not be made so.
#[derive(Debug)]
pub struct Receipt {
    /// The event's natural identity (event_id, decision_id, ... or the feedback's hash).
    pub id: String,
    rx: oneshot::Receiver<Result<Delivery, PublishError>>,
}

impl Receipt {
    /// Block the current thread until the event is durable. Not for use inside a runtime.
    pub fn wait_blocking(self) -> Result<Delivery, PublishError> {
        self.rx.blocking_recv().unwrap_or(Err(PublishError::Closed))
    }
}

impl Future for Receipt {
    type Output = Result<Delivery, PublishError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(PublishError::Closed)))
    }
}

/// One event on its way to the spool, with whoever waits for it.
struct Job {
    record: SpoolRecord,
    size: u64,
    reply: Option<Reply>,
    started: Instant,
}

enum WriterMsg {
    Append(Job),
    Stop,
}

/// What rides with each message through librdkafka, back to the delivery callback.
enum Pending {
    Live { reply: Reply, started: Instant },
    Replay(mpsc::Sender<Result<(), KafkaError>>),
}

#[derive(Default)]
struct State {
    spooling: bool,
    /// The replayer is sending the spool's last batch; new events wait in `held`.
    handover: bool,
    /// Live (non-replay) messages inside librdkafka.
    in_flight: u64,
    /// Spool-mode events waiting for the in-flight ones to resolve.
    held: VecDeque<Job>,
    held_bytes: u64,
    /// Bytes sent to the writer and not yet appended.
    queued_bytes: u64,
    /// Records sent towards the spool (incl. what a restart found) ...
    to_spool: u64,
    /// ... and how many of them are settled: replayed to Kafka, or failed to append.
    settled: u64,
    closed: bool,
}

/// Everything the delivery callback, the writer and the replayer share.
struct Shared {
    state: Mutex<State>,
    /// Signalled when the state changes (waiters for in_flight == 0 or drain) ...
    changed: Condvar,
    spool: Mutex<Spool>,
    /// ... and this one wakes the replayer when records were appended.
    wake: Condvar,
    writer: Mutex<mpsc::Sender<WriterMsg>>,
    /// The current Kafka producer; replaced when tainted (see the module docs).
    producer: RwLock<Option<Kafka>>,
    kafka_config: ClientConfig,
    metrics: Arc<Metrics>,
    spool_bytes: AtomicU64,
    max_bytes: u64,
    shutdown: AtomicBool,
}

type Kafka = ThreadedProducer<Ctx>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Queue a job for the spool writer (state lock held, so order is the lock's order).
    fn to_writer(&self, st: &mut State, job: Job) {
        st.to_spool += 1;
        st.queued_bytes += job.size;
        if let Err(mpsc::SendError(WriterMsg::Append(job))) =
            lock(&self.writer).send(WriterMsg::Append(job))
        {
            st.queued_bytes -= job.size;
            st.settled += 1;
            if let Some(r) = job.reply {
                let _ = r.send(Err(PublishError::Closed));
            }
        }
    }

    /// Once nothing is in flight, held events may follow the failed ones into the spool.
    fn release_held(&self, st: &mut State) {
        if st.in_flight == 0 && !st.handover {
            while let Some(job) = st.held.pop_front() {
                st.held_bytes -= job.size;
                self.to_writer(st, job);
            }
        }
    }

    /// Leave spool mode when everything spooled is delivered and nothing is pending.
    fn maybe_resume_direct(&self, st: &mut State) {
        if st.spooling
            && st.in_flight == 0
            && (st.held.is_empty() || st.handover)
            && st.settled == st.to_spool
            && !self.producer_tainted()
        {
            st.spooling = false;
            st.handover = false;
            info!(
                held = st.held.len(),
                "spool drained; publishing directly to Kafka again"
            );
            self.send_held_direct(st);
        }
    }

    /// End of a handover: the held events go straight to Kafka, oldest first. If librdkafka
    /// refuses one (queue full), the rest stay held and spool mode resumes.
    fn send_held_direct(&self, st: &mut State) {
        let guard = read(&self.producer);
        let Some(producer) = guard.as_ref() else {
            return;
        };
        while let Some(job) = st.held.pop_front() {
            st.held_bytes -= job.size;
            let Some(reply) = job.reply else { continue };
            let r = &job.record;
            let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
            for (k, v) in &r.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v.as_slice()),
                });
            }
            let mut record = BaseRecord::with_opaque_to(
                &r.topic,
                Box::new(Pending::Live {
                    reply,
                    started: job.started,
                }),
            )
            .payload(&r.value)
            .headers(headers);
            if let Some(k) = &r.key {
                record = record.key(k.as_slice());
            }
            st.in_flight += 1;
            if let Err((e, rec)) = producer.send(record) {
                st.in_flight -= 1;
                warn!(error = %e, "handing held events to Kafka failed; spooling again");
                st.spooling = true;
                if let Pending::Live { reply, .. } = *rec.delivery_opaque {
                    st.held_bytes += job.size;
                    st.held.push_front(Job {
                        reply: Some(reply),
                        ..job
                    });
                }
                // Behind any events just sent: they may still fail and be spooled first.
                self.release_held(st);
                return;
            }
        }
    }

    /// Whether the current producer saw a delivery failure and must be replaced.
    fn producer_tainted(&self) -> bool {
        read(&self.producer)
            .as_ref()
            .is_none_or(|p| p.context().tainted.load(Ordering::SeqCst))
    }

    /// Replace a tainted producer: new instance first (so nothing is ever sent through the
    /// old one again), then purge the old one, whose queued events fail and are spooled.
    fn replace_producer_if_tainted(self: &Arc<Self>) {
        if !self.producer_tainted() || self.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let fresh: Result<Kafka, KafkaError> = self.kafka_config.create_with_context(Ctx {
            shared: self.clone(),
            tainted: AtomicBool::new(false),
        });
        let fresh = match fresh {
            Ok(p) => p,
            Err(e) => {
                error!(error = %e, "cannot create a new Kafka producer");
                return;
            }
        };
        let old = write(&self.producer).replace(fresh);
        info!("replaced the Kafka producer after delivery failures (new producer id)");
        if let Some(old) = old {
            // Queued events fail now (and are spooled). Requests already on the wire are let
            // finish, so the broker never sees a connection torn down mid-request.
            old.purge(PurgeConfig::default().queue());
            let _ = old.flush(Duration::from_secs(30));
            // Dropping joins its polling thread.
            drop(old);
        }
    }

    /// Bound check for a new spool-bound event.
    fn check_room(&self, st: &State, size: u64) -> Result<(), PublishError> {
        let used = self.spool_bytes.load(Ordering::Relaxed) + st.queued_bytes + st.held_bytes;
        if used + size > self.max_bytes {
            return Err(PublishError::SpoolFull {
                used,
                max: self.max_bytes,
            });
        }
        Ok(())
    }
}

/// librdkafka's callbacks: route each delivery report back to its waiter or the spool.
struct Ctx {
    shared: Arc<Shared>,
    /// Set on the first retriable delivery failure; the instance is then retired.
    tainted: AtomicBool,
}

impl ClientContext for Ctx {}

/// Errors after which resending the same bytes can never succeed.
fn is_permanent(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::InvalidTopic
        )
    )
}

impl ProducerContext for Ctx {
    type DeliveryOpaque = Box<Pending>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Box<Pending>) {
        let sh = &self.shared;
        match (*opaque, result) {
            (Pending::Replay(tx), r) => {
                if let Err((e, _)) = r {
                    if !is_permanent(e) {
                        self.tainted.store(true, Ordering::SeqCst);
                    }
                }
                let _ = tx.send(r.as_ref().map(|_| ()).map_err(|(e, _)| e.clone()));
            }
            (Pending::Live { reply, started }, Ok(msg)) => {
                let idle = {
                    let mut st = lock(&sh.state);
                    st.in_flight -= 1;
                    sh.release_held(&mut st);
                    sh.maybe_resume_direct(&mut st);
                    st.in_flight == 0
                };
                // Waiters (close, wait_drained) wait for nothing in flight; waking them for
                // every acknowledgement would cost a futex call per event.
                if idle {
                    sh.changed.notify_all();
                }
                sh.metrics.published.inc();
                sh.metrics
                    .publish_latency
                    .observe(started.elapsed().as_secs_f64());
                let _ = reply.send(Ok(Delivery::Kafka {
                    partition: msg.partition(),
                    offset: msg.offset(),
                }));
            }
            (Pending::Live { reply, started }, Err((e, msg))) => {
                let mut st = lock(&sh.state);
                st.in_flight -= 1;
                if is_permanent(e) {
                    error!(error = %e, topic = msg.topic(), "Kafka refused an event for good");
                    sh.release_held(&mut st);
                    sh.maybe_resume_direct(&mut st);
                    drop(st);
                    sh.changed.notify_all();
                    let _ = reply.send(Err(PublishError::Kafka(e.clone())));
                    return;
                }
                self.tainted.store(true, Ordering::SeqCst);
                if !st.spooling {
                    warn!(error = %e, "delivery failed; spooling events until Kafka is back");
                    st.spooling = true;
                }
                let record = SpoolRecord {
                    topic: msg.topic().to_owned(),
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
                };
                // Already accepted by `publish`: it must be spooled even past the soft bound
                // (the spool itself enforces the hard one and reports SpoolFull).
                let size = Spool::size_of(std::slice::from_ref(&record));
                let job = Job {
                    record,
                    size,
                    reply: Some(reply),
                    started,
                };
                sh.to_writer(&mut st, job);
                sh.release_held(&mut st);
                drop(st);
                sh.changed.notify_all();
                sh.wake.notify_all();
            }
        }
    }
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
        let (spool, report) = Spool::open(
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
        metrics.spool_bytes.set(spool.bytes() as i64);
        metrics.spool_pending.set(report.pending as i64);
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
        threads.push(
            std::thread::Builder::new()
                .name("weft-spool-replayer".into())
                .spawn(move || replayer_loop(sh, batch, timeout))
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

    /// Validate, stamp, encode and send one event. Returns at once; the [`Receipt`] resolves
    /// when the event is durable. An invalid event is an error here and is never published.
    pub fn publish(&self, mut env: Envelope) -> Result<Receipt, PublishError> {
        let started = Instant::now();
        let inner = &*self.inner;
        let (payload, identity) = env.validate()?;
        if env.producer_id.is_none() {
            env.producer_id = Some(inner.producer_id.clone());
        }
        if env.seq.is_none() {
            env.seq = Some(inner.seq.fetch_add(1, Ordering::Relaxed) + 1);
        }
        if env.emitted_at.is_none() {
            env.emitted_at = Some(weft_schemas::time::now_rfc3339());
        }
        // JSON: the submitted text itself, lent to librdkafka (which copies it once).
        let encoded;
        let value: &[u8] = match inner.content_type {
            ContentType::Json => env.payload.get().as_bytes(),
            ct => {
                encoded = wire::encode_value_parsed(&env, &payload, ct, &inner.schema_ids)?;
                &encoded
            }
        };
        drop(payload);
        // Headers go straight into librdkafka's list; no String per header.
        let mut owned = Some(OwnedHeaders::new_with_capacity(7));
        let mut header_bytes = 0;
        wire::for_each_header(&env, inner.content_type, |k, v| {
            header_bytes += k.len() + v.len();
            owned = owned.take().map(|h| {
                h.insert(Header {
                    key: k,
                    value: Some(v),
                })
            });
        });
        let owned = owned.unwrap_or_else(|| OwnedHeaders::new_with_capacity(0));
        let key = env.request_id.as_deref().unwrap_or(&identity);
        let size = value.len() + key.len() + header_bytes;
        let max = inner.config.max_message_bytes;
        if size > max {
            return Err(PublishError::TooLarge { size, max });
        }
        let topic = &inner.topics[kind_index(env.kind)];
        let (reply, rx) = oneshot::channel();
        let sh = &*inner.shared;

        let mut st = lock(&sh.state);
        if st.closed {
            return Err(PublishError::Closed);
        }
        if !st.spooling {
            st.in_flight += 1;
            drop(st);
            let record =
                BaseRecord::with_opaque_to(topic, Box::new(Pending::Live { reply, started }))
                    .key(key.as_bytes())
                    .payload(value)
                    .headers(owned);
            let sent = match read(&sh.producer).as_ref() {
                Some(p) => p.send(record),
                None => Err((KafkaError::Canceled, record)),
            };
            let reply = match sent {
                Ok(()) => return Ok(Receipt { id: identity, rx }),
                Err((e, rec)) => match *rec.delivery_opaque {
                    Pending::Live { reply, .. } if !is_permanent(&e) => {
                        debug!(error = %e, "librdkafka refused the event; spooling it");
                        reply
                    }
                    _ => {
                        let mut st = lock(&sh.state);
                        st.in_flight -= 1;
                        sh.release_held(&mut st);
                        sh.maybe_resume_direct(&mut st);
                        return Err(PublishError::Kafka(e));
                    }
                },
            };
            // Queue full (or a transient client error): spool, ordered behind in-flight ones.
            let job = spool_job(topic, key, value, &env, inner.content_type, reply, started);
            let mut st = lock(&sh.state);
            st.in_flight -= 1;
            if !st.spooling {
                warn!("Kafka producer queue is full; spooling events");
                st.spooling = true;
            }
            if let Err(e) = sh.check_room(&st, job.size) {
                sh.release_held(&mut st);
                sh.maybe_resume_direct(&mut st);
                return Err(e);
            }
            sh.held_or_write(&mut st, job);
            drop(st);
            sh.changed.notify_all();
            return Ok(Receipt { id: identity, rx });
        }
        let job = spool_job(topic, key, value, &env, inner.content_type, reply, started);
        sh.check_room(&st, job.size)?;
        sh.held_or_write(&mut st, job);
        Ok(Receipt { id: identity, rx })
    }

    /// Publish and wait until the event is durable.
    pub async fn publish_durable(&self, env: Envelope) -> Result<Delivery, PublishError> {
        self.publish(env)?.await
    }

    fn typed<T: serde::Serialize>(
        &self,
        kind: Kind,
        payload: &T,
        request_id: Option<&str>,
    ) -> Result<Receipt, PublishError> {
        let mut env = Envelope::new(kind, payload)
            .map_err(|e| PublishError::Invalid(EnvelopeError::PayloadJson(e)))?
            .with_tenant(self.inner.config.tenant.clone());
        env.request_id = request_id.map(str::to_owned);
        self.publish(env)
    }

    /// Publish a TraceEvent, grouped under `request_id` (the flow or request it belongs to).
    pub fn publish_trace_event(
        &self,
        e: &TraceEvent,
        request_id: Option<&str>,
    ) -> Result<Receipt, PublishError> {
        self.typed(Kind::TraceEvent, e, request_id)
    }

    /// Publish a PolicyDecision.
    pub fn publish_policy_decision(
        &self,
        e: &PolicyDecision,
        request_id: Option<&str>,
    ) -> Result<Receipt, PublishError> {
        self.typed(Kind::PolicyDecision, e, request_id)
    }

    /// Publish a CapabilityToken.
    pub fn publish_capability_token(
        &self,
        e: &CapabilityToken,
        request_id: Option<&str>,
    ) -> Result<Receipt, PublishError> {
        self.typed(Kind::CapabilityToken, e, request_id)
    }

    /// Publish a Frame's metadata.
    pub fn publish_frame(
        &self,
        e: &Frame,
        request_id: Option<&str>,
    ) -> Result<Receipt, PublishError> {
        self.typed(Kind::Frame, e, request_id)
    }

    /// Publish a Handle's metadata.
    pub fn publish_handle(
        &self,
        e: &Handle,
        request_id: Option<&str>,
    ) -> Result<Receipt, PublishError> {
        self.typed(Kind::Handle, e, request_id)
    }

    /// Publish a RoutingDecision.
    pub fn publish_routing_decision(
        &self,
        e: &RoutingDecision,
        request_id: Option<&str>,
    ) -> Result<Receipt, PublishError> {
        self.typed(Kind::RoutingDecision, e, request_id)
    }

    /// Publish an ExecutionRoutingDecision.
    pub fn publish_execution_routing_decision(
        &self,
        e: &ExecutionRoutingDecision,
        request_id: Option<&str>,
    ) -> Result<Receipt, PublishError> {
        self.typed(Kind::ExecutionRoutingDecision, e, request_id)
    }

    /// Publish an ExecutionFeedback.
    pub fn publish_execution_feedback(
        &self,
        e: &ExecutionFeedback,
        request_id: Option<&str>,
    ) -> Result<Receipt, PublishError> {
        self.typed(Kind::ExecutionFeedback, e, request_id)
    }

    /// Events in the spool not yet delivered to Kafka.
    pub fn spool_pending(&self) -> u64 {
        lock(&self.inner.shared.spool).pending()
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

impl Shared {
    /// Spool-mode routing: hold while older messages are in flight, else append.
    fn held_or_write(&self, st: &mut State, job: Job) {
        if st.in_flight > 0 || st.handover {
            st.held_bytes += job.size;
            st.held.push_back(job);
        } else {
            self.to_writer(st, job);
        }
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

/// A spool-bound job for an encoded event (the rare path: Kafka is not taking events).
fn spool_job(
    topic: &str,
    key: &str,
    value: &[u8],
    env: &Envelope,
    content_type: ContentType,
    reply: Reply,
    started: Instant,
) -> Job {
    let record = SpoolRecord {
        topic: topic.to_owned(),
        key: Some(key.as_bytes().to_vec()),
        value: value.to_vec(),
        headers: wire::encode_headers(env, content_type)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into_bytes()))
            .collect(),
    };
    let size = Spool::size_of(std::slice::from_ref(&record));
    Job {
        record,
        size,
        reply: Some(reply),
        started,
    }
}

/// The librdkafka settings derived from the config (extra properties last, so they win).
pub(crate) fn kafka_config(c: &PublisherConfig) -> ClientConfig {
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
    with_extras(k, c)
}

/// The configured librdkafka extras (SASL/TLS and the like), applied last so they win, on
/// every client the publisher makes: producer and admin alike.
fn with_extras(mut k: ClientConfig, c: &PublisherConfig) -> ClientConfig {
    for (name, value) in &c.kafka_properties {
        k.set(name, value);
    }
    k
}

/// Create missing topics (one per kind plus dead-letter) with the configured partitions.
/// Returns the names created now.
pub async fn ensure_topics(c: &PublisherConfig) -> Result<Vec<String>, PublisherError> {
    let mut base = ClientConfig::new();
    base.set("bootstrap.servers", &c.brokers);
    let admin: AdminClient<DefaultClientContext> = with_extras(base, c).create()?;
    let mut names = c.topics.event_topics();
    names.push(c.topics.dead_letter());
    let new: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| {
            NewTopic::new(
                n,
                c.partitions,
                TopicReplication::Fixed(c.replication_factor),
            )
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let mut created = Vec::new();
    for r in admin.create_topics(new.iter(), &opts).await? {
        match r {
            Ok(name) => created.push(name),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => return Err(PublisherError::CreateTopic(name, code)),
        }
    }
    Ok(created)
}

/// The spool writer: group-commit appends, fsync per policy, then resolve receipts.
fn writer_loop(sh: Arc<Shared>, rx: mpsc::Receiver<WriterMsg>, fsync: FsyncPolicy) {
    let mut unsynced: Vec<Job> = Vec::new();
    let tick = match fsync {
        FsyncPolicy::Interval(d) => d.min(Duration::from_millis(100)),
        _ => Duration::from_millis(100),
    };
    let mut stop = false;
    while !stop {
        let first = match rx.recv_timeout(tick) {
            Ok(m) => Some(m),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                stop = true;
                None
            }
        };
        let mut batch = Vec::new();
        let mut bytes = 0u64;
        let mut next = first;
        while let Some(m) = next {
            match m {
                WriterMsg::Append(job) => {
                    bytes += job.size;
                    batch.push(job);
                }
                WriterMsg::Stop => stop = true,
            }
            if batch.len() >= 20_000 || bytes >= 8 << 20 {
                break;
            }
            next = rx.try_recv().ok();
        }
        if !batch.is_empty() {
            append_batch(&sh, batch, fsync, &mut unsynced);
        }
        // Interval policy: sync when due; `stop` forces a final sync.
        if !unsynced.is_empty() {
            let res = {
                let mut sp = lock(&sh.spool);
                if stop {
                    sp.sync().map(|_| true)
                } else {
                    sp.sync_if_due()
                }
            };
            match res {
                Ok(true) => resolve_spooled(&sh, unsynced.drain(..)),
                Ok(false) => {}
                Err(e) => {
                    error!(error = %e, "spool fsync failed");
                    let n = unsynced.len() as u64;
                    fail_jobs(&sh, unsynced.drain(..), &e, n);
                }
            }
        }
    }
    // Anything that raced in after Stop is refused, never silently dropped.
    while let Ok(WriterMsg::Append(job)) = rx.try_recv() {
        fail_jobs(
            &sh,
            std::iter::once(job),
            &SpoolError::Corrupt("publisher closed"),
            1,
        );
    }
}

fn append_batch(sh: &Shared, batch: Vec<Job>, fsync: FsyncPolicy, unsynced: &mut Vec<Job>) {
    let records: Vec<SpoolRecord> = batch.iter().map(|j| j.record.clone()).collect();
    let bytes: u64 = batch.iter().map(|j| j.size).sum();
    let n = batch.len();
    // Append the whole group; if it does not fit, the longest prefix that does (a later
    // event never lands when an earlier one was refused, so per-request order holds).
    let (res, refused) = {
        let mut sp = lock(&sh.spool);
        let mut res = sp.append(&records).map(|synced| (synced, n));
        if let Err(SpoolError::Full { used, max }) = res {
            let room = max.saturating_sub(used);
            let (mut k, mut acc) = (0, 0);
            for r in &records {
                acc += Spool::size_of(std::slice::from_ref(r));
                if acc > room {
                    break;
                }
                k += 1;
            }
            if k > 0 {
                res = sp.append(&records[..k]).map(|synced| (synced, k));
            }
        }
        sh.spool_bytes.store(sp.bytes(), Ordering::Relaxed);
        sh.metrics.spool_bytes.set(sp.bytes() as i64);
        sh.metrics.spool_pending.set(sp.pending() as i64);
        let refused = SpoolError::Full {
            used: sp.bytes(),
            max: sh.max_bytes,
        };
        (res, refused)
    };
    lock(&sh.state).queued_bytes -= bytes;
    match res {
        Ok((synced, k)) => {
            let mut batch = batch;
            let rest = batch.split_off(k);
            sh.metrics.spooled.inc_by(k as u64);
            sh.wake.notify_all();
            if synced || fsync == FsyncPolicy::Never {
                resolve_spooled(sh, batch.into_iter());
            } else {
                unsynced.extend(batch);
            }
            if !rest.is_empty() {
                warn!(events = rest.len(), "spool is full; refusing events");
                let m = rest.len() as u64;
                fail_jobs(sh, rest.into_iter(), &refused, m);
            }
        }
        Err(e) => {
            error!(error = %e, events = n, "could not spool events; their receipts fail");
            fail_jobs(sh, batch.into_iter(), &e, n as u64);
        }
    }
}

fn resolve_spooled(sh: &Shared, jobs: impl Iterator<Item = Job>) {
    for job in jobs {
        sh.metrics
            .publish_latency
            .observe(job.started.elapsed().as_secs_f64());
        if let Some(r) = job.reply {
            let _ = r.send(Ok(Delivery::Spooled));
        }
    }
}

/// Receipts of jobs that never reached the disk fail; they no longer count as spooled.
fn fail_jobs(sh: &Shared, jobs: impl Iterator<Item = Job>, e: &SpoolError, n: u64) {
    for job in jobs {
        if let Some(r) = job.reply {
            let _ = r.send(Err(match e {
                SpoolError::Full { used, max } => PublishError::SpoolFull {
                    used: *used,
                    max: *max,
                },
                other => PublishError::Spool(other.to_string()),
            }));
        }
    }
    let mut st = lock(&sh.state);
    st.settled += n;
    sh.maybe_resume_direct(&mut st);
    drop(st);
    sh.changed.notify_all();
}

/// The replayer: send spooled records in order, commit the cursor per acknowledged batch.
fn replayer_loop(sh: Arc<Shared>, batch: usize, timeout: Duration) {
    let mut backoff = Duration::from_millis(250);
    // Halved after a failed round (a slow broker may not ack a big batch within
    // message.timeout.ms), doubled back after each success.
    let mut size = batch;
    while !sh.shutdown.load(Ordering::SeqCst) {
        sh.replace_producer_if_tainted();
        {
            let mut st = lock(&sh.state);
            sh.maybe_resume_direct(&mut st);
        }
        let (batch_read, last) = {
            let mut sp = lock(&sh.spool);
            if sp.unread() == 0 {
                let _ = sh.wake.wait_timeout(sp, Duration::from_millis(200));
                continue;
            }
            let r = sp.read_batch(size);
            (r, sp.unread() == 0)
        };
        if last && batch_read.is_ok() {
            // The spool's last batch: hold new events in memory until it is acknowledged.
            let mut st = lock(&sh.state);
            if st.spooling {
                st.handover = true;
            }
        }
        let b = match batch_read {
            Ok(b) => b,
            Err(e) => {
                error!(error = %e, "reading the spool failed; retrying");
                lock(&sh.spool).rewind();
                std::thread::sleep(backoff);
                continue;
            }
        };
        let n = b.records.len();
        if n == 0 {
            continue;
        }
        let (tx, rx) = mpsc::channel();
        let mut sent = 0;
        let mut failed: Option<String> = None;
        let guard = read(&sh.producer);
        let Some(producer) = guard.as_ref() else {
            break;
        };
        for r in &b.records {
            let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
            for (k, v) in &r.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v.as_slice()),
                });
            }
            let mut record =
                BaseRecord::with_opaque_to(&r.topic, Box::new(Pending::Replay(tx.clone())))
                    .payload(&r.value)
                    .headers(headers);
            if let Some(k) = &r.key {
                record = record.key(k.as_slice());
            }
            loop {
                match producer.send(record) {
                    Ok(()) => {
                        sent += 1;
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), rec)) => {
                        record = rec;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err((e, _)) => {
                        failed = Some(e.to_string());
                        break;
                    }
                }
            }
            if failed.is_some() {
                break;
            }
        }
        drop(guard);
        drop(tx);
        // Every sent message reports back within message.timeout.ms.
        let deadline = Instant::now() + timeout + Duration::from_secs(5);
        for _ in 0..sent {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    failed.get_or_insert_with(|| e.to_string());
                }
                Err(_) => {
                    failed.get_or_insert_with(|| "no delivery report in time".into());
                    break;
                }
            }
        }
        match failed {
            None => {
                let res = {
                    let mut sp = lock(&sh.spool);
                    let r = sp.commit(b.end, n as u64);
                    sh.spool_bytes.store(sp.bytes(), Ordering::Relaxed);
                    sh.metrics.spool_bytes.set(sp.bytes() as i64);
                    sh.metrics.spool_pending.set(sp.pending() as i64);
                    r
                };
                if let Err(e) = res {
                    // The records are in Kafka; a lost cursor only means duplicates later.
                    error!(error = %e, "could not persist the spool cursor");
                }
                sh.metrics.replayed.inc_by(n as u64);
                sh.metrics.published.inc_by(n as u64);
                let mut st = lock(&sh.state);
                st.settled += n as u64;
                sh.maybe_resume_direct(&mut st);
                drop(st);
                sh.changed.notify_all();
                debug!(events = n, "replayed spooled events to Kafka");
                backoff = Duration::from_millis(250);
                size = (size * 2).min(batch);
            }
            Some(e) => {
                warn!(error = %e, events = n, "replaying the spool failed; will retry the whole batch");
                lock(&sh.spool).rewind();
                {
                    let mut st = lock(&sh.state);
                    st.handover = false;
                    sh.release_held(&mut st);
                }
                let until = Instant::now() + backoff;
                while Instant::now() < until && !sh.shutdown.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                size = (size / 2).max(50.min(batch));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let batch = spool.read_batch(100).unwrap();
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
}
