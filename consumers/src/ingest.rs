//! `weft ingest`: the consumer that turns the weaver topics into facts and narratives.
//!
//! One loop reads records, decodes them ([`crate::decode`]), and buffers them per source
//! partition. A flush (at `batch_max_rows` or `batch_max_bytes` buffered over all partitions,
//! or every `flush_interval`) takes every partition with data through the same steps:
//! 1. dead-letter the records that cannot be ingested (original bytes and headers, plus the
//!    reason), and wait for the broker to acknowledge them;
//! 2. drop copies of stored events, flag id conflicts, and insert the rest of every
//!    partition into `weft_events` as one atomic insert (retried until ClickHouse answers);
//! 3. project the batch onto the narratives (when this process runs the projector);
//! 4. store the Kafka offset, which rdkafka commits in the background.
//!
//! Where to resume is read from ClickHouse, not from Kafka (see [`crate::facts`]), so a crash
//! between any two steps replays at most one batch, and nothing in it is stored twice.
//!
//! Steps 1 and 2 also report what they did (dead letters once acknowledged, per-partition
//! batch figures once inserted), and the lag monitor its samples, to ClickHouse through
//! [`crate::telemetry`]: best effort, never waited for, never holding an offset.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{debug, error, info, info_span, instrument, warn, Instrument};
use weft_schemas::wire::SchemaIds;
use weft_schemas::Topics;

use crate::decode::{self, Fact, Record, Rejection};
use weft_store::{insert, EventRow, Store, StoreError};

use crate::facts::{self, identity_key, DedupCache, Seen};
use crate::metrics::IngestMetrics;
use crate::narrative::projector::{ProjectBatch, Projector};
use crate::telemetry::{BatchRow, DeadLetterRow, LagRow, Sample, Telemetry};

/// Which parts of the pipeline this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Facts and narratives over every partition: one process, the default.
    #[default]
    All,
    /// Facts only, partitions shared with other `facts` processes through a consumer group:
    /// the scale-out mode. Run exactly one `narratives` process beside them.
    Facts,
    /// Narratives only, over every partition.
    Narratives,
}

impl Role {
    /// The name used in configuration and telemetry (`all`, `facts`, `narratives`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Facts => "facts",
            Role::Narratives => "narratives",
        }
    }
}

/// Settings of `weft ingest` (the `[ingest]` TOML section).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngestConfig {
    /// Kafka bootstrap servers; empty means the `[kafka]` section's.
    pub brokers: String,
    /// Consumer group; offsets are committed there (for lag dashboards and resumption).
    /// The `narratives` role commits under `<group_id>.narratives` instead: see
    /// [`IngestConfig::kafka_group`].
    pub group_id: String,
    /// Topic names; the CLI fills them from `[publisher.topics]`, so both sides agree.
    #[serde(skip)]
    pub topics: Topics,
    /// Which parts of the pipeline this process runs.
    pub role: Role,
    /// Partitions for topics this process creates when they are missing.
    pub partitions: i32,
    /// Replication factor for topics this process creates (1 suits one local broker; use
    /// the cluster's usual factor, typically 3, in production).
    pub replication_factor: i32,
    /// Flush when this many records are buffered (over all partitions).
    pub batch_max_rows: usize,
    /// ... or this many payload bytes.
    pub batch_max_bytes: usize,
    /// ... or when the oldest buffered record is this old (milliseconds).
    pub flush_interval_ms: u64,
    /// How long identities are remembered for deduplication (seconds; default 7 days).
    pub dedup_window_secs: u64,
    /// Status server (`/metrics`, `/healthz`, `/v1/narratives/{id}`); empty disables it.
    pub listen: String,
    /// Longest wait between ClickHouse retries (milliseconds).
    pub max_backoff_ms: u64,
    /// Extra librdkafka properties for every Kafka client (security.protocol, sasl.*, debug...).
    pub kafka_properties: BTreeMap<String, String>,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            brokers: String::new(),
            group_id: "weft-ingest".into(),
            topics: Topics::default(),
            role: Role::All,
            partitions: 4,
            replication_factor: 1,
            batch_max_rows: 50_000,
            batch_max_bytes: 64 << 20,
            flush_interval_ms: 1_000,
            dedup_window_secs: 7 * 24 * 3600,
            listen: "127.0.0.1:8788".into(),
            max_backoff_ms: 10_000,
            kafka_properties: BTreeMap::new(),
        }
    }
}

/// Fatal ingest errors (everything transient is retried inside the loop).
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// A Kafka client or admin call failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A ClickHouse failure that ingest does not retry.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The status server address `listen` does not parse.
    #[error("invalid listen address `{0}`")]
    Listen(String),
    /// The broker moved a partition's position backwards, below what weft has stored: the
    /// topic was deleted and recreated, or truncated. Going on would skip its new records as
    /// "already stored", so ingest stops and says so.
    #[error(
        "{topic}[{partition}]: the broker's log is at offset {got}, below weft's resume point \
         {expected}: the topic was recreated or truncated since weft stored its offsets. Its new records \
         would be taken for stored ones, so ingest stops. Use a new topic prefix or a new \
         ClickHouse database for the new log"
    )]
    Rewound {
        /// Topic whose log moved back.
        topic: String,
        /// Partition whose log moved back.
        partition: i32,
        /// The offset weft would resume at.
        expected: i64,
        /// The broker's high watermark, or the offset it delivered.
        got: i64,
    },
}

/// Notes group rebalances. A partition this process loses may be advanced by another
/// process before it comes back, so every cached resume point must be dropped and reread
/// from ClickHouse; the loop does that when the flag is set (buffered records of revoked
/// partitions are uncommitted, so dropping them loses nothing).
#[derive(Default)]
struct RebalanceWatch(Arc<std::sync::atomic::AtomicBool>);

impl rdkafka::ClientContext for RebalanceWatch {}

impl rdkafka::consumer::ConsumerContext for RebalanceWatch {
    fn pre_rebalance(
        &self,
        _: &rdkafka::consumer::BaseConsumer<Self>,
        r: &rdkafka::consumer::Rebalance<'_>,
    ) {
        if let rdkafka::consumer::Rebalance::Revoke(tpl) = r {
            info!(partitions = tpl.count(), "partitions revoked");
        }
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A record that will go to the dead-letter topic, owned.
struct DeadLetter {
    key: Option<Vec<u8>>,
    value: Vec<u8>,
    headers: Vec<(String, Vec<u8>)>,
    offset: i64,
    reason: Rejection,
}

/// Buffered work and resume points of one source partition.
struct PartitionState {
    topic: String,
    partition: i32,
    /// Highest offset whose fact is stored (or that was decided not to need storing).
    stored: i64,
    /// Highest offset projected onto narratives.
    projected: i64,
    dedup: DedupCache,
    facts: Vec<(i64, Fact)>,
    dead: Vec<DeadLetter>,
    bytes: usize,
    last_offset: i64,
    /// The offset the next record should carry: the resume point, then last seen + 1.
    /// weft's topics are neither compacted nor transactional, so a jump past it means records
    /// the broker never delivered; it is counted and logged, never silent.
    expected: Option<i64>,
    oldest: Option<Instant>,
    /// `weft_ingest_consumed_total` for this partition's topic, looked up once.
    consumed: prometheus::IntCounter,
}

impl PartitionState {
    fn is_empty(&self) -> bool {
        self.facts.is_empty() && self.dead.is_empty()
    }
}

/// Counts reported when ingest stops, and by tests.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct IngestTotals {
    /// Records read from Kafka.
    pub consumed: u64,
    /// Facts inserted into `weft_events`.
    pub inserted: u64,
    /// Copies of stored events, dropped.
    pub deduplicated: u64,
    /// Records the dead-letter topic acknowledged.
    pub dead_lettered: u64,
}

/// The ingest process.
pub struct Ingestor {
    cfg: IngestConfig,
    store: Store,
    ids: SchemaIds,
    /// Shared so the run loop can hold a received message while it borrows `self`, and
    /// the flush task can store offsets.
    consumer: Arc<StreamConsumer<RebalanceWatch>>,
    rebalanced: Arc<std::sync::atomic::AtomicBool>,
    metrics: Arc<IngestMetrics>,
    /// What flushes need besides the records: idle here, or inside the flush in flight.
    flusher: FlusherSlot,
    parts: BTreeMap<(String, i32), PartitionState>,
    /// Records and payload bytes buffered over all partitions: the batch thresholds apply
    /// to these, so one flush makes one large insert whatever the partition count.
    buffered: (usize, usize),
    totals: IngestTotals,
    /// Next offset to store per partition, read by the lag monitor thread.
    positions: Arc<std::sync::Mutex<BTreeMap<(String, i32), i64>>>,
    /// Set on SIGINT/SIGTERM: retry loops give up (nothing is committed, so nothing is lost).
    stop: watch::Receiver<bool>,
    /// Best-effort figures for ClickHouse (batches, dead letters, lag); never blocks.
    telemetry: Telemetry,
}

/// The flusher, idle or away in the flush task. At most one flush is in flight: the loop
/// decodes the next batch while it runs, and waits for it before starting another.
enum FlusherSlot {
    Idle(Box<Flusher>),
    Busy(tokio::task::JoinHandle<(Box<Flusher>, FlushResult)>),
    /// Lost with a flush task that panicked; the process stops.
    Gone,
}

/// Everything a flush needs besides its records, moved into the flush task and back, so the
/// flush (dead letters, the facts insert, the narrative pass) runs on another thread while
/// the loop goes on decoding.
struct Flusher {
    cfg: IngestConfig,
    store: Store,
    consumer: Arc<StreamConsumer<RebalanceWatch>>,
    dlq: FutureProducer,
    metrics: Arc<IngestMetrics>,
    projector: Option<Projector>,
    stop: watch::Receiver<bool>,
    telemetry: Telemetry,
}

/// One partition's share of a flush, taken out of its [`PartitionState`].
struct FlushPart {
    topic: String,
    partition: i32,
    facts: Vec<(i64, Fact)>,
    /// Per fact: `None` for a copy of a stored event (dropped by the dedup cache, or at or
    /// below the stored offset), else `Some(conflict)`.
    keep: Vec<Option<bool>>,
    dead: Vec<DeadLetter>,
    bytes: usize,
    last_offset: i64,
    /// Facts at or below this offset are projected already.
    projected: i64,
}

/// What a landed flush did, applied to the partitions' resume points and the totals.
struct FlushDone {
    /// (topic, partition, last offset) of each partition flushed.
    parts: Vec<(String, i32, i64)>,
    inserted: u64,
    dead_lettered: u64,
}

/// Where one partition's rows sit in a batch insert: topic, partition, the rows' index
/// range, and the highest offset among them.
type Span = (String, i32, std::ops::Range<usize>, i64);

/// A flush abandoned because the process is stopping; its records are replayed next time.
#[derive(Debug)]
struct Stopped;

type FlushResult = Result<FlushDone, Stopped>;

fn backoff(attempt: u32, max_ms: u64) -> Duration {
    Duration::from_millis((100u64 << attempt.min(10)).min(max_ms))
}

impl Ingestor {
    /// Connect, create missing topics, migrate nothing (run `weft migrate` first), load the
    /// projector state and the resume points.
    pub async fn start(
        cfg: IngestConfig,
        store: Store,
        metrics: Arc<IngestMetrics>,
        stop: watch::Receiver<bool>,
    ) -> Result<Self, IngestError> {
        ensure_topics(&cfg).await?;
        if cfg.role != Role::Narratives {
            retry_store(&cfg, &metrics, "check weft_events", || {
                weft_store::check_columns::<EventRow>(&store, "weft_events")
            })
            .await?;
        }
        if cfg.role == Role::All {
            // The only writer of weft_events in this role: an insert running now is a killed
            // predecessor's, and the resume points must be read after it lands.
            retry_store(&cfg, &metrics, "wait for earlier inserts", || {
                store.wait_for_running_inserts(&["weft_events"], Duration::from_secs(60))
            })
            .await?;
        }
        let watch = RebalanceWatch::default();
        let rebalanced = watch.0.clone();
        let consumer: StreamConsumer<RebalanceWatch> = kafka_config(&cfg)
            .set("group.id", cfg.kafka_group())
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            // A ClickHouse outage blocks the loop while it retries; do not let the group
            // evict us for it.
            .set("max.poll.interval.ms", "3600000")
            .set("fetch.wait.max.ms", "100")
            .create_with_context(watch)?;
        let dlq: FutureProducer = kafka_config(&cfg)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "30000")
            .create()?;
        let projector = match cfg.role {
            Role::Facts => None,
            Role::All | Role::Narratives => Some(
                retry_store(&cfg, &metrics, "load narratives", || {
                    Projector::load(store.clone())
                })
                .await?,
            ),
        };
        let telemetry = Telemetry::start(store.clone(), metrics.clone()).await;
        let consumer = Arc::new(consumer);
        let flusher = Flusher {
            cfg: cfg.clone(),
            store: store.clone(),
            consumer: consumer.clone(),
            dlq,
            metrics: metrics.clone(),
            projector,
            stop: stop.clone(),
            telemetry: telemetry.clone(),
        };
        let mut me = Self {
            cfg,
            store,
            ids: SchemaIds::default(),
            consumer,
            rebalanced,
            metrics,
            flusher: FlusherSlot::Idle(Box::new(flusher)),
            parts: BTreeMap::new(),
            buffered: (0, 0),
            totals: IngestTotals::default(),
            positions: Arc::default(),
            stop,
            telemetry,
        };
        me.subscribe().await?;
        Ok(me)
    }

    /// Group mode subscribes; the single-process roles assign every partition at the offset
    /// ClickHouse says comes next.
    async fn subscribe(&mut self) -> Result<(), IngestError> {
        let topics = self.cfg.topics.event_topics();
        if self.cfg.role == Role::Facts {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            self.consumer.subscribe(&names)?;
            info!(group = %self.cfg.kafka_group(), "subscribed (facts role, partitions shared with the group)");
            return Ok(());
        }
        let mut attempt = 0;
        let md = loop {
            match self.consumer.fetch_metadata(None, Duration::from_secs(10)) {
                Ok(md) => break md,
                Err(e) => {
                    attempt += 1;
                    warn!(error = %e, attempt, "kafka metadata unavailable; retrying");
                    tokio::time::sleep(backoff(attempt, self.cfg.max_backoff_ms)).await;
                }
            }
        };
        let mut tpl = TopicPartitionList::new();
        let role = self.cfg.role;
        for t in md
            .topics()
            .iter()
            .filter(|t| topics.iter().any(|n| n == t.name()))
        {
            for p in t.partitions() {
                let st = self.partition_state(t.name(), p.id()).await?;
                let from = match role {
                    Role::Narratives => st.projected,
                    _ => st.stored.min(st.projected),
                };
                st.expected = Some(from + 1);
                // A resume point past the log's end means the log is not the one weft stored
                // (tansu answers such fetches with nothing, so waiting would only hide it).
                // One offset of slack: tansu's memory engine reports a high watermark one short.
                let (_, high) =
                    self.consumer
                        .fetch_watermarks(t.name(), p.id(), Duration::from_secs(10))?;
                if from > high {
                    return Err(IngestError::Rewound {
                        topic: t.name().to_owned(),
                        partition: p.id(),
                        expected: from + 1,
                        got: high,
                    });
                }
                tpl.add_partition_offset(t.name(), p.id(), Offset::Offset(from + 1))?;
            }
        }
        info!(partitions = tpl.count(), role = ?self.cfg.role, "assigned every partition");
        self.consumer.assign(&tpl)?;
        Ok(())
    }

    async fn partition_state(
        &mut self,
        topic: &str,
        partition: i32,
    ) -> Result<&mut PartitionState, IngestError> {
        let key = (topic.to_owned(), partition);
        if !self.parts.contains_key(&key) {
            let st = self.load_partition(topic, partition).await?;
            self.parts.insert(key.clone(), st);
        }
        Ok(self
            .parts
            .entry(key)
            .or_insert_with(|| unreachable!("inserted above")))
    }

    /// Resume points and dedup window of a partition this process starts reading.
    async fn load_partition(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<PartitionState, IngestError> {
        let (stored, dedup) = if self.cfg.role != Role::Narratives {
            let window = Duration::from_secs(self.cfg.dedup_window_secs);
            let store = &self.store;
            let stored = retry_store(&self.cfg, &self.metrics, "read progress", || {
                facts::stored_max_offset(store, topic, partition)
            })
            .await?;
            let dedup = retry_store(&self.cfg, &self.metrics, "load dedup window", || {
                facts::load_dedup(store, topic, partition, window)
            })
            .await?;
            (stored, dedup)
        } else {
            (i64::MAX, DedupCache::new(Duration::ZERO))
        };
        let projected = match &self.flusher {
            FlusherSlot::Idle(f) => f
                .projector
                .as_ref()
                .map_or(i64::MAX, |p| p.projected(topic, partition)),
            // Unreachable in practice: the single-process roles load every partition before
            // the first flush, and the facts role (no projector) never leaves a flush in
            // flight. Should it happen, projecting the partition again is safe (every
            // projector write is idempotent).
            _ if self.cfg.role == Role::Facts => i64::MAX,
            _ => -1,
        };
        debug!(
            topic,
            partition,
            stored,
            projected,
            dedup = dedup.len(),
            "partition ready"
        );
        Ok(PartitionState {
            topic: topic.to_owned(),
            partition,
            stored,
            projected,
            dedup,
            facts: Vec::new(),
            dead: Vec::new(),
            bytes: 0,
            last_offset: -1,
            expected: None,
            oldest: None,
            consumed: self.metrics.consumed.with_label_values(&[topic]),
        })
    }

    /// Totals so far.
    pub fn totals(&self) -> IngestTotals {
        self.totals
    }

    /// Run until `shutdown` becomes true, then flush what is buffered and return.
    pub async fn run(mut self) -> Result<IngestTotals, IngestError> {
        let mut shutdown = self.stop.clone();
        let flush_every = Duration::from_millis(self.cfg.flush_interval_ms);
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut since_check = 0u32;
        let consumer = self.consumer.clone();
        spawn_lag_monitor(
            kafka_config(&self.cfg),
            self.positions.clone(),
            self.metrics.clone(),
            self.telemetry.clone(),
            shutdown.clone(),
        );
        loop {
            tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    info!("shutting down: flushing buffered records");
                    // One last attempt; if ClickHouse or Kafka is down it gives up, and the
                    // records are replayed from the stored offsets next time.
                    if self.flush().await.is_ok() {
                        let _ = self.settle_flush().await;
                    }
                    return Ok(self.totals);
                }
                msg = consumer.recv() => {
                    match msg {
                        Ok(m) => {
                            let rec = self.decode_record(&m);
                            drop(m);
                            self.after_rebalance().await?;
                            let full = self.accept(rec).await?;
                            // Under constant load `recv` always wins the biased select, so the
                            // timer branch may never run: check the flush deadline here too.
                            since_check += 1;
                            let due = since_check >= 256 && {
                                since_check = 0;
                                self.parts.values().any(|p| p.oldest.is_some_and(|t| t.elapsed() >= flush_every))
                            };
                            if (full || due) && self.flush().await.is_err() { return Ok(self.totals); }
                        }
                        Err(e) => warn!(error = %e, "kafka consumer error (retrying)"),
                    }
                }
                _ = tick.tick() => {
                    self.after_rebalance().await?;
                    // A flush that landed while the stream went quiet: take its resume points
                    // now, not at the next flush, so lag and totals do not wait for traffic.
                    let landed = matches!(&self.flusher, FlusherSlot::Busy(t) if t.is_finished());
                    if landed && self.settle_flush().await.is_err() { return Ok(self.totals); }
                    let due = self.parts.values().any(|p| p.oldest.is_some_and(|t| t.elapsed() >= flush_every));
                    if due && self.flush().await.is_err() { return Ok(self.totals); }
                }
            }
        }
    }

    /// After a group rebalance: forget the partitions this process lost (their new owner
    /// rereads them from the committed offset, which never passes what is stored), and
    /// reread the resume point of those it kept, dropping buffered records that another
    /// owner stored meanwhile. Buffers of kept partitions stay: their records may not be
    /// fetched again.
    async fn after_rebalance(&mut self) -> Result<(), IngestError> {
        if !self
            .rebalanced
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        let assigned: std::collections::HashSet<(String, i32)> = self
            .consumer
            .assignment()?
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        self.parts.retain(|k, _| assigned.contains(k));
        for st in self.parts.values_mut() {
            let stored = retry_store(&self.cfg, &self.metrics, "read progress", || {
                facts::stored_max_offset(&self.store, &st.topic, st.partition)
            })
            .await?;
            if stored > st.stored {
                st.stored = stored;
                st.facts.retain(|(o, _)| *o > stored);
                st.dead.retain(|d| d.offset > stored);
            }
        }
        self.buffered = self.parts.values().fold((0, 0), |(r, b), p| {
            (r + p.facts.len() + p.dead.len(), b + p.bytes)
        });
        info!(partitions = assigned.len(), "rebalanced");
        Ok(())
    }

    /// Decode a record while it is still borrowed from librdkafka: a valid one is copied
    /// once, into its fact; only a rejected one is copied whole, for the dead-letter topic.
    fn decode_record(&self, m: &BorrowedMessage<'_>) -> DecodedRecord {
        let borrowed = m.headers();
        let headers: Vec<(&str, &[u8])> = borrowed
            .iter()
            .flat_map(|h| h.iter())
            .map(|h| (h.key, h.value.unwrap_or_default()))
            .collect();
        let r = Record {
            topic: m.topic(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key(),
            value: m.payload(),
            headers: &headers,
            timestamp_ms: m.timestamp().to_millis(),
        };
        let decoded = decode::decode(&r, &self.cfg.topics, &self.ids).map_err(|reason| {
            Box::new(DeadLetter {
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().unwrap_or_default().to_vec(),
                headers: headers
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
                    .collect(),
                offset: m.offset(),
                reason,
            })
        });
        DecodedRecord {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            decoded,
        }
    }

    /// Buffer one decoded record; returns true when a batch is full.
    async fn accept(&mut self, rec: DecodedRecord) -> Result<bool, IngestError> {
        self.totals.consumed += 1;
        let (max_rows, max_bytes) = (self.cfg.batch_max_rows, self.cfg.batch_max_bytes);
        let role = self.cfg.role;
        let metrics = self.metrics.clone();
        let buffered = self.buffered;
        let st = self.partition_state(&rec.topic, rec.partition).await?;
        st.consumed.inc();
        if let Some(expected) = st.expected.filter(|e| rec.offset > *e) {
            warn!(
                topic = %rec.topic,
                partition = rec.partition,
                expected,
                got = rec.offset,
                "the broker skipped offsets: records in between were never delivered"
            );
            metrics
                .offset_gaps
                .with_label_values(&[&rec.topic])
                .inc_by((rec.offset - expected) as u64);
        }
        // A backwards move is a reset: the resume point lay beyond the log's end, and the
        // broker sent us back to its start. (In the facts role the group protocol rewinds to
        // the committed offset legitimately; there the stored offsets guard instead.)
        if let Some(expected) = st
            .expected
            .filter(|e| rec.offset < *e && role != Role::Facts)
        {
            return Err(IngestError::Rewound {
                topic: rec.topic,
                partition: rec.partition,
                expected,
                got: rec.offset,
            });
        }
        st.expected = Some(rec.offset + 1);
        let need_fact = role != Role::Narratives && rec.offset > st.stored;
        let need_projection = rec.offset > st.projected;
        st.last_offset = st.last_offset.max(rec.offset);
        if !need_fact && !need_projection {
            self.metrics.replay_skipped.inc();
            return Ok(false);
        }
        st.oldest.get_or_insert_with(Instant::now);
        let (mut rows, mut bytes) = buffered;
        match rec.decoded {
            Ok(fact) => {
                let n = fact.envelope.payload.get().len();
                st.bytes += n;
                (rows, bytes) = (rows + 1, bytes + n);
                st.facts.push((rec.offset, fact));
            }
            Err(dead) if need_fact => {
                let n = dead.value.len();
                st.bytes += n;
                (rows, bytes) = (rows + 1, bytes + n);
                st.dead.push(*dead);
            }
            // The facts role owns dead-lettering; a projector-only pass just skips.
            Err(_) => {}
        }
        self.buffered = (rows, bytes);
        Ok(rows >= max_rows || bytes >= max_bytes)
    }

    /// Start a flush of every partition that has buffered records (dead letters, then one
    /// facts insert for all partitions alongside one projector pass for all), after the one
    /// in flight has landed. In the facts role the flush is waited for at once: a rebalance
    /// may hand a partition to another member, which must find its rows stored.
    async fn flush(&mut self) -> Result<(), Stopped> {
        self.settle_flush().await?;
        let batch = self.take_batch();
        if batch.is_empty() {
            return Ok(());
        }
        let FlusherSlot::Idle(flusher) = std::mem::replace(&mut self.flusher, FlusherSlot::Gone)
        else {
            return Err(Stopped);
        };
        let rows: usize = batch.iter().map(|p| p.facts.len() + p.dead.len()).sum();
        let span = info_span!("flush", partitions = batch.len(), rows);
        self.flusher = FlusherSlot::Busy(tokio::spawn(flusher.run(batch).instrument(span)));
        if self.cfg.role == Role::Facts {
            self.settle_flush().await?;
        }
        Ok(())
    }

    /// Wait for the flush in flight, if any, and move the partitions' resume points past it.
    async fn settle_flush(&mut self) -> Result<(), Stopped> {
        let FlusherSlot::Busy(task) = &mut self.flusher else {
            return match self.flusher {
                FlusherSlot::Gone => Err(Stopped),
                _ => Ok(()),
            };
        };
        let (flusher, result) = match task.await {
            Ok(r) => r,
            Err(e) => {
                // Nothing of the batch is committed: a restart replays it.
                error!(error = %e, "the flush task failed; stopping");
                self.flusher = FlusherSlot::Gone;
                return Err(Stopped);
            }
        };
        if let Some(p) = &flusher.projector {
            self.metrics.narrative_graph_nodes.set(p.graph_len() as i64);
        }
        let has_facts = self.cfg.role != Role::Narratives;
        let has_projector = flusher.projector.is_some();
        self.flusher = FlusherSlot::Idle(flusher);
        let done = result?;
        self.totals.inserted += done.inserted;
        self.totals.dead_lettered += done.dead_lettered;
        for (topic, partition, last) in done.parts {
            if let Some(st) = self.parts.get_mut(&(topic, partition)) {
                if has_facts {
                    st.stored = st.stored.max(last);
                }
                if has_projector {
                    st.projected = st.projected.max(last);
                }
            }
        }
        self.publish_positions();
        Ok(())
    }

    /// Take every partition's buffered records out for a flush, deciding here, in order,
    /// which facts are copies of stored events (the dedup cache lives with the partition).
    fn take_batch(&mut self) -> Vec<FlushPart> {
        let role = self.cfg.role;
        let mut batch = Vec::new();
        for st in self.parts.values_mut() {
            if st.is_empty() && st.last_offset <= st.stored.min(st.projected) {
                continue;
            }
            let facts = std::mem::take(&mut st.facts);
            let keep = facts
                .iter()
                .map(|(offset, f)| {
                    if role == Role::Narratives || *offset <= st.stored {
                        return None;
                    }
                    let key = identity_key(&f.envelope.tenant, f.envelope.kind.as_str(), &f.id);
                    match st.dedup.observe(key, &f.content_hash) {
                        Seen::Duplicate => {
                            self.totals.deduplicated += 1;
                            self.metrics.deduplicated.inc();
                            None
                        }
                        Seen::Conflict => {
                            self.metrics.conflicts.inc();
                            Some(true)
                        }
                        Seen::New => Some(false),
                    }
                })
                .collect();
            batch.push(FlushPart {
                topic: st.topic.clone(),
                partition: st.partition,
                facts,
                keep,
                dead: std::mem::take(&mut st.dead),
                bytes: std::mem::take(&mut st.bytes),
                last_offset: st.last_offset,
                projected: st.projected,
            });
            st.oldest = None;
        }
        self.buffered = (0, 0);
        batch
    }

    /// Publish where each partition stands, for the lag monitor.
    fn publish_positions(&self) {
        if let Ok(mut pos) = self.positions.lock() {
            for st in self.parts.values() {
                pos.insert(
                    (st.topic.clone(), st.partition),
                    st.stored.min(st.projected).max(-1) + 1,
                );
            }
        }
    }
}

impl Flusher {
    /// Flush `parts`, retrying until it lands or the process stops; hands itself back.
    async fn run(mut self: Box<Self>, mut parts: Vec<FlushPart>) -> (Box<Self>, FlushResult) {
        let result = self.flush_batch(&mut parts).await;
        (self, result)
    }

    async fn flush_batch(&mut self, parts: &mut [FlushPart]) -> FlushResult {
        // 1. Dead letters first: once their offsets are committed they must be safe elsewhere.
        let mut dead_lettered = 0;
        for p in parts.iter() {
            if !p.dead.is_empty() {
                self.dead_letter(&p.topic, p.partition, &p.dead).await?;
                dead_lettered += p.dead.len() as u64;
            }
        }
        // 2. Facts: the rows of one atomic insert for every partition: one part in
        //    ClickHouse, however many partitions the batch spans.
        let ingested_at = now_micros();
        let mut rows = Vec::new();
        // Per partition: (topic, partition, its rows in `rows`, last offset among them).
        let mut spans: Vec<Span> = Vec::new();
        for p in parts.iter() {
            let start = rows.len();
            for ((offset, f), keep) in p.facts.iter().zip(&p.keep) {
                if let Some(conflict) = *keep {
                    rows.push(EventRow::new(
                        f,
                        &p.topic,
                        p.partition,
                        *offset,
                        ingested_at,
                        conflict,
                    ));
                }
            }
            if let Some(last) = rows[start..].iter().map(|r| r.offset as i64).max() {
                spans.push((p.topic.clone(), p.partition, start..rows.len(), last));
            }
        }
        // 3. The facts insert and the narrative pass run concurrently: while ClickHouse
        //    writes the facts, weft computes the narratives. Neither reads what the other
        //    writes (the projector reads only narrative tables), and each keeps its own
        //    resume point, so either may land first or alone.
        let batches: Vec<ProjectBatch<'_>> = parts
            .iter()
            .filter(|p| p.last_offset > p.projected)
            .map(|p| ProjectBatch {
                topic: &p.topic,
                partition: p.partition,
                facts: p
                    .facts
                    .iter()
                    .filter(|(o, _)| *o > p.projected)
                    .map(|(_, f)| f)
                    .collect(),
                last_offset: p.last_offset,
            })
            .collect();
        let mut projector = self.projector.take();
        let (inserted, projected) = {
            let this = &*self;
            let insert = async {
                if rows.is_empty() {
                    Ok(0.0)
                } else {
                    this.insert_facts(&rows, &spans).await
                }
            };
            let project = async {
                match projector.as_mut() {
                    Some(p) if !batches.is_empty() => this.project(p, &batches).await,
                    _ => Ok(()),
                }
            };
            tokio::join!(insert, project)
        };
        self.projector = projector;
        let insert_ms = inserted?;
        if self.cfg.role != Role::Narratives {
            // Telemetry: one row per partition that had records, after the insert landed.
            let at = now_micros();
            let role = self.cfg.role.as_str();
            for p in parts.iter() {
                let ins = spans
                    .iter()
                    .find(|(t, n, _, _)| *t == p.topic && *n == p.partition);
                if ins.is_none() && p.dead.is_empty() {
                    continue;
                }
                self.telemetry.record(Sample::Batch(BatchRow {
                    at,
                    topic: p.topic.clone(),
                    partition: p.partition,
                    rows: ins.map_or(0, |(_, _, r, _)| r.len() as u32),
                    dead: p.dead.len() as u32,
                    bytes: p.bytes as u64,
                    insert_ms: if ins.is_some() { insert_ms } else { 0.0 },
                    role,
                }));
            }
            for r in &rows {
                self.metrics.inserted.with_label_values(&[r.kind]).inc();
                let age = (ingested_at - r.emitted_at) as f64 / 1e6;
                self.metrics
                    .freshness_seconds
                    .with_label_values(&[r.kind])
                    .observe(age.max(0.0));
            }
        }
        projected?;
        // 4. Let rdkafka commit the next offsets.
        for p in parts.iter() {
            if let Err(e) = self
                .consumer
                .store_offset(&p.topic, p.partition, p.last_offset)
            {
                debug!(error = %e, "store_offset failed (the offset is still safe in ClickHouse)");
            }
        }
        Ok(FlushDone {
            parts: parts
                .iter()
                .map(|p| (p.topic.clone(), p.partition, p.last_offset))
                .collect(),
            inserted: rows.len() as u64,
            dead_lettered,
        })
    }

    /// One narrative pass over a flush's facts, retried until it lands. A failed pass may have
    /// moved the in-memory graph ahead of ClickHouse, so before a retry the graph is rebuilt
    /// from ClickHouse, as a restart would.
    async fn project(
        &self,
        projector: &mut Projector,
        batches: &[ProjectBatch<'_>],
    ) -> Result<(), Stopped> {
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            match projector.apply(batches).await {
                Ok(stats) => {
                    self.metrics.narratives_moved.inc_by(stats.moved as u64);
                    break;
                }
                Err(e) => {
                    attempt += 1;
                    self.metrics.insert_retries.inc();
                    warn!(error = %e, attempt, "narrative projection failed; retrying");
                    if *self.stop.borrow() {
                        return Err(Stopped);
                    }
                    tokio::time::sleep(backoff(attempt, self.cfg.max_backoff_ms)).await;
                    // Replaying onto the moved-ahead graph would find nothing to change and
                    // lose the pass's moves (the progress row, written last, was not).
                    match Projector::load(self.store.clone()).await {
                        Ok(fresh) => *projector = fresh,
                        Err(e) => {
                            warn!(error = %e, "reloading the narrative graph failed; retrying");
                            continue;
                        }
                    }
                }
            }
        }
        self.metrics
            .projector_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Insert the batch's facts (`spans` says which rows came from which partition) as one
    /// insert, retrying until ClickHouse has them. Before a retry it asks ClickHouse how far
    /// each partition is stored and sends only the rows beyond that, so rows whose insert
    /// answer was lost are never stored twice. Returns the insert's milliseconds.
    #[instrument(skip_all, fields(rows = rows.len(), partitions = spans.len()))]
    async fn insert_facts(&self, rows: &[EventRow<'_>], spans: &[Span]) -> Result<f64, Stopped> {
        let mut attempt = 0u32;
        let first = Instant::now();
        let mut pending: Option<Vec<EventRow<'_>>> = None;
        loop {
            let started = Instant::now();
            let batch = pending.as_deref().unwrap_or(rows);
            match insert::<EventRow<'static>>(&self.store, "weft_events", batch).await {
                Ok(()) => {
                    self.metrics
                        .insert_seconds
                        .observe(started.elapsed().as_secs_f64());
                    self.metrics.batch_rows.observe(batch.len() as f64);
                    self.metrics.clickhouse_up.set(1);
                    return Ok(first.elapsed().as_secs_f64() * 1e3);
                }
                Err(e) => {
                    attempt += 1;
                    self.metrics.clickhouse_up.set(0);
                    self.metrics.insert_retries.inc();
                    if e.is_transient() {
                        warn!(error = %e, attempt, "insert failed; offsets not committed, retrying");
                    } else {
                        error!(error = %e, attempt, "ClickHouse rejected the insert (schema out of date? run `weft migrate`); retrying");
                    }
                    if *self.stop.borrow() {
                        return Err(Stopped);
                    }
                    tokio::time::sleep(backoff(attempt, self.cfg.max_backoff_ms)).await;
                    if let Ok(left) = self.rows_not_stored(rows, spans).await {
                        if left.is_empty() {
                            info!("the failed-looking insert had landed; not repeating it");
                            self.metrics.clickhouse_up.set(1);
                            return Ok(first.elapsed().as_secs_f64() * 1e3);
                        }
                        if left.len() < rows.len() {
                            info!(
                                left = left.len(),
                                "part of the insert had landed; sending the rest"
                            );
                        }
                        pending = Some(left);
                    }
                }
            }
        }
    }

    /// The rows of `rows` beyond what ClickHouse has stored for their partition.
    async fn rows_not_stored<'r>(
        &self,
        rows: &[EventRow<'r>],
        spans: &[Span],
    ) -> Result<Vec<EventRow<'r>>, StoreError> {
        let mut left = Vec::new();
        for (topic, partition, range, last) in spans {
            let stored = facts::stored_max_offset(&self.store, topic, *partition).await?;
            if stored < *last {
                left.extend(
                    rows[range.clone()]
                        .iter()
                        .filter(|r| r.offset as i64 > stored)
                        .cloned(),
                );
            }
        }
        Ok(left)
    }

    #[instrument(skip(self, dead), fields(n = dead.len()))]
    async fn dead_letter(
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

/// Consumer lag from watermarks and stored positions, on its own thread: watermark requests
/// block, and while Kafka is down they time out, which must never stall the ingest loop.
/// Each sample goes to the gauge and (best effort, without waiting) to `weft_ingest_lag`.
fn spawn_lag_monitor(
    brokers: ClientConfig,
    positions: Arc<std::sync::Mutex<BTreeMap<(String, i32), i64>>>,
    metrics: Arc<IngestMetrics>,
    telemetry: Telemetry,
    stop: watch::Receiver<bool>,
) {
    std::thread::spawn(move || {
        let client: Result<rdkafka::consumer::BaseConsumer, _> = brokers.create();
        let Ok(client) = client else { return };
        while !*stop.borrow() {
            let snapshot: Vec<((String, i32), i64)> = positions
                .lock()
                .map(|p| p.iter().map(|(k, v)| (k.clone(), *v)).collect())
                .unwrap_or_default();
            for ((topic, partition), next) in snapshot {
                if let Ok((_, high)) =
                    client.fetch_watermarks(&topic, partition, Duration::from_secs(2))
                {
                    let lag = (high - next).max(0);
                    metrics
                        .lag
                        .with_label_values(&[&topic, &partition.to_string()])
                        .set(lag);
                    telemetry.record(Sample::Lag(LagRow {
                        at: now_micros(),
                        topic,
                        partition,
                        next_offset: next,
                        high_watermark: high,
                        lag,
                    }));
                }
            }
            std::thread::sleep(Duration::from_secs(5));
        }
    });
}

/// A consumed record, decoded, and owned so the consumer can be polled again while it is
/// buffered.
struct DecodedRecord {
    topic: String,
    partition: i32,
    offset: i64,
    /// The fact, or the whole record and the reason, for the dead-letter topic.
    decoded: Result<Fact, Box<DeadLetter>>,
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Retry a ClickHouse operation while ClickHouse is unreachable (start-up reads must not give
/// up while it restarts); a query it rejects is returned at once.
async fn retry_store<T, F, Fut>(
    cfg: &IngestConfig,
    metrics: &IngestMetrics,
    what: &str,
    mut f: F,
) -> Result<T, IngestError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if !e.is_transient() => {
                error!(error = %e, "{what}: ClickHouse rejected the query (did `weft migrate` run?)");
                return Err(e.into());
            }
            Err(e) => {
                attempt += 1;
                metrics.clickhouse_up.set(0);
                if attempt == 1 || attempt % 10 == 0 {
                    error!(error = %e, attempt, "{what}: clickhouse unavailable; retrying");
                }
                tokio::time::sleep(backoff(attempt, cfg.max_backoff_ms)).await;
            }
        }
    }
}

impl IngestConfig {
    /// The Kafka consumer group this process commits offsets to. A `facts` member that takes
    /// a partition over starts reading at the group's committed offset, trusting that it
    /// never passes what is stored in ClickHouse. The `narratives` process commits after
    /// projecting, not after storing facts, so it must commit under a group of its own, or a
    /// facts member could start past records nobody stored.
    pub fn kafka_group(&self) -> String {
        match self.role {
            Role::Narratives => format!("{}.narratives", self.group_id),
            Role::All | Role::Facts => self.group_id.clone(),
        }
    }
}

/// Base client settings: brokers plus the configured librdkafka extras.
fn kafka_config(cfg: &IngestConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.brokers);
    for (k, v) in &cfg.kafka_properties {
        c.set(k, v);
    }
    c
}

/// Create the event and dead-letter topics that do not exist yet. The admin client takes the
/// same librdkafka extras as the consumer, so SASL/TLS settings apply to it too.
async fn ensure_topics(cfg: &IngestConfig) -> Result<(), IngestError> {
    let admin: AdminClient<DefaultClientContext> = kafka_config(cfg).create()?;
    let mut names = cfg.topics.event_topics();
    names.push(cfg.topics.dead_letter());
    let new: Vec<NewTopic<'_>> = names
        .iter()
        .map(|n| {
            NewTopic::new(
                n,
                cfg.partitions,
                TopicReplication::Fixed(cfg.replication_factor),
            )
        })
        .collect();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    for r in admin.create_topics(&new, &opts).await? {
        match r {
            Ok(t) => info!(topic = %t, "created topic"),
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => warn!(topic = %t, error = %e, "could not create topic"),
        }
    }
    Ok(())
}

/// Parse the status server address (empty = disabled).
pub fn listen_addr(cfg: &IngestConfig) -> Result<Option<SocketAddr>, IngestError> {
    if cfg.listen.is_empty() {
        return Ok(None);
    }
    cfg.listen
        .parse()
        .map(Some)
        .map_err(|_| IngestError::Listen(cfg.listen.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_narratives_role_commits_under_a_group_of_its_own() {
        let mut cfg = IngestConfig {
            group_id: "g".into(),
            ..IngestConfig::default()
        };
        for (role, group) in [
            (Role::All, "g"),
            (Role::Facts, "g"),
            (Role::Narratives, "g.narratives"),
        ] {
            cfg.role = role;
            assert_eq!(cfg.kafka_group(), group, "{role:?}");
        }
    }
}
