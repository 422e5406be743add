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

mod align;
mod batch;
mod config;
mod consume;
mod dead_letter;
mod flush;
mod headers;
mod lag;
mod log_end;
mod rebalance;
mod resume;
mod retry;
mod schema_ids;
mod seek;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::StreamConsumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use serde::Serialize;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::metrics::IngestMetrics;
use crate::narrative::filter::RebuildGate;
use crate::narrative::projector::{LoadError, Projector};
use crate::telemetry::Telemetry;
use batch::PartitionState;
use config::{bound_prefetch, ensure_topics, kafka_config};
use flush::{Flusher, FlusherSlot};
use lag::spawn_lag_monitor;
use rebalance::RebalanceWatch;
use retry::{sparse, Backoff, Stopped};
use weft_schemas::wire::header::CONTENT_TYPE;
use weft_store::telemetry::{QuarantineRow, QUARANTINE};
use weft_store::{EventRow, Store, StoreError};

pub use config::{listen_addr, IngestConfig, Role};

/// How long the consumer's own queue must stay empty before the records fetched ahead of
/// the partition queues' split count as all taken (once, at start).
const DRAINED: Duration = Duration::from_millis(20);

/// Fatal ingest errors (everything transient is retried inside the loop).
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// A Kafka client or admin call failed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The event or dead-letter topics do not exist and could not be created.
    #[error(transparent)]
    Topics(#[from] weft_kafka::TopicError),
    /// A ClickHouse failure that ingest does not retry.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A narrative shard on a role that stores facts.
    #[error(
        "narrative shard {shard} with --role {role}: only `--role narratives` can be sharded \
         (run the facts with `--role facts`, whose members share the partitions, and one \
         `--role narratives --narrative-shard i/N` process per shard)"
    )]
    ShardRole {
        /// The shard asked for.
        shard: crate::narrative::shard::NarrativeShard,
        /// The role it was asked with.
        role: &'static str,
    },
    /// The process was asked to stop while ingest waited for Kafka or ClickHouse before
    /// reading where to resume (nothing was stored; a restart resumes as after any stop).
    #[error("stopped while waiting before reading the resume points")]
    Stopped,
    /// The status server address `listen` does not parse.
    #[error("invalid listen address `{0}`")]
    Listen(String),
    /// The loop gave up on a failure it cannot retry, logged where it happened (a flush task
    /// that panicked, ClickHouse rejecting the dedup check). Nothing of the batch in hand is
    /// stored as progress.
    #[error(
        "ingest stopped on a failure it does not retry (the error is logged above); a restart \
         resumes from the offsets ClickHouse holds"
    )]
    Halted,
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

impl From<Stopped> for IngestError {
    fn from(_: Stopped) -> Self {
        IngestError::Stopped
    }
}

impl From<LoadError> for IngestError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Store(e) => IngestError::Store(e),
            LoadError::Stopped => IngestError::Stopped,
        }
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
    /// Records the dead-letter topic acknowledged (not the quarantined ones).
    pub dead_lettered: u64,
}

/// The ingest process.
pub struct Ingestor {
    cfg: IngestConfig,
    store: Store,
    /// The Confluent schema ids met so far ([`schema_ids`]).
    schemas: schema_ids::SchemaBook,
    /// Shared so the run loop can hold a received message while it borrows `self`, and
    /// the flush task can store offsets.
    consumer: Arc<StreamConsumer<RebalanceWatch>>,
    /// The single-process roles' per-partition queues, read in time order
    /// ([`align`]); `None` reads the consumer's own queue.
    lanes: Option<align::Lanes>,
    rebalanced: Arc<std::sync::atomic::AtomicBool>,
    /// In the facts role, since when the group's last assignment holds partitions that have
    /// delivered no record yet (their state is loaded on the first one): looked at once
    /// quiet ([`Ingestor::nudge_quiet_partitions`]).
    unloaded_since: Option<std::time::Instant>,
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
    /// The pause between attempts of a retry loop, cut short by `stop`.
    backoff: Backoff,
    /// Best-effort figures for ClickHouse (batches, dead letters, lag); never blocks.
    telemetry: Telemetry,
    /// Nonconforming payload keys logged already (each is logged once).
    reported: weft_schemas::extensions::Reported,
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
        cfg.check_shard()?;
        let shard = cfg.narrative_shard;
        metrics.narrative.shard_index.set(i64::from(shard.index()));
        metrics.narrative.shard_count.set(i64::from(shard.count()));
        ensure_topics(&cfg).await?;
        let backoff = Backoff::new(cfg.max_backoff_ms, stop.clone());
        if cfg.role != Role::Narratives {
            retry_store(&backoff, &metrics, "check weft_events", || {
                weft_store::check_columns::<EventRow>(&store, "weft_events")
            })
            .await?;
        }
        retry_store(&backoff, &metrics, "check weft_quarantine", || {
            weft_store::check_columns::<QuarantineRow>(&store, QUARANTINE)
        })
        .await?;
        if cfg.role == Role::All {
            // The only writer of weft_events in this role: an insert running now is a killed
            // predecessor's (see `Store::wait_for_earlier_inserts`). The facts role waits at
            // each assignment instead: `after_rebalance`.
            wait_for_earlier_inserts(&backoff, &metrics, &store).await?;
        }
        let watch = RebalanceWatch::default();
        let rebalanced = watch.0.clone();
        let mut consumer_config = kafka_config(&cfg);
        consumer_config
            .set("group.id", cfg.kafka_group())
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            // A ClickHouse outage blocks the loop while it retries; do not let the group
            // evict us for it.
            .set("max.poll.interval.ms", "3600000")
            .set("fetch.wait.max.ms", "100");
        bound_prefetch(&cfg, &mut consumer_config);
        let consumer: StreamConsumer<RebalanceWatch> =
            consumer_config.create_with_context(watch)?;
        let dlq = dead_letter::producer(&cfg)?;
        // The id filters' rebuild waits until the partitions are loaded (`subscribe`).
        let (open_filters, filters) = RebuildGate::shut();
        let projector = match cfg.role {
            Role::Facts => None,
            Role::All | Role::Narratives => Some(
                retry_store(&backoff, &metrics, "load narratives", || {
                    Projector::load_shard(
                        store.clone(),
                        cfg.narrative_max_nodes,
                        cfg.narrative_shard,
                        &stop,
                        filters.clone(),
                    )
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
            backoff: backoff.clone(),
            telemetry: telemetry.clone(),
        };
        let mut me = Self {
            schemas: schema_ids::SchemaBook::new(cfg.schema_registry_url.clone()),
            cfg,
            store,
            consumer,
            lanes: None,
            rebalanced,
            unloaded_since: None,
            metrics,
            flusher: FlusherSlot::Idle(Box::new(flusher)),
            parts: BTreeMap::new(),
            buffered: (0, 0),
            totals: IngestTotals::default(),
            positions: Arc::default(),
            stop,
            backoff,
            telemetry,
            reported: Default::default(),
        };
        me.subscribe().await?;
        open_filters.send_replace(true);
        Ok(me)
    }

    /// Buffer one received record (flushing when a batch is full or due); `true` when the
    /// process stops.
    /// Take every record waiting in the consumer's own queue, until it stays empty for
    /// [`DRAINED`]; `true` when ingest must stop. The queue may hold events (a commit's
    /// result, an error) ahead of records, which `recv` serves and passes over by waking
    /// itself, so a poll that finds an event does not end it.
    async fn drain_own_queue(
        &mut self,
        consumer: &StreamConsumer<RebalanceWatch>,
        since_check: &mut u32,
    ) -> Result<bool, IngestError> {
        while let Ok(msg) = tokio::time::timeout(DRAINED, consumer.recv()).await {
            if self.on_record(msg, since_check).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn on_record(
        &mut self,
        msg: Result<BorrowedMessage<'_>, KafkaError>,
        since_check: &mut u32,
    ) -> Result<bool, IngestError> {
        let m = match msg {
            Ok(m) => m,
            Err(e) => {
                warn!(error = %e, "kafka consumer error (retrying)");
                return Ok(false);
            }
        };
        let mut not_asked = None;
        if let Some(id) = self
            .schemas
            .unmet(m.payload(), || headers::last(&m, CONTENT_TYPE))
        {
            let mut stop = self.stop.clone();
            match self.schemas.learn(id, &mut stop).await {
                Ok(asked) => not_asked = (!asked).then_some(id),
                Err(_) => return Ok(true),
            }
        }
        let mut rec = self.decode_record(&m);
        if let (Some(id), Some(Err(dead))) = (not_asked, rec.decoded.as_mut()) {
            schema_ids::not_asked(&mut dead.reason, id);
        }
        drop(m);
        self.after_rebalance().await?;
        let full = self.accept(rec).await?;
        // Under constant load a record always wins the biased select, so the timer branch
        // may never run: check the flush deadline here too.
        *since_check += 1;
        let flush_every = Duration::from_millis(self.cfg.flush_interval_ms);
        let due = *since_check >= 256 && {
            *since_check = 0;
            self.parts
                .values()
                .any(|p| p.oldest.is_some_and(|t| t.elapsed() >= flush_every))
        };
        Ok((full || due) && self.flush().await.is_err())
    }

    /// Totals so far.
    pub fn totals(&self) -> IngestTotals {
        self.totals
    }

    /// How the loop ends when a step gives up: cleanly when the process was asked to stop,
    /// else as [`IngestError::Halted`], so that the exit status says so and a supervisor that
    /// restarts on failure restarts it.
    fn ended(&self) -> Result<IngestTotals, IngestError> {
        ended(*self.stop.borrow(), self.totals)
    }

    /// Run until `shutdown` becomes true, then flush what is buffered and return.
    pub async fn run(mut self) -> Result<IngestTotals, IngestError> {
        let mut shutdown = self.stop.clone();
        let flush_every = Duration::from_millis(self.cfg.flush_interval_ms);
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let mut since_check = 0u32;
        let consumer = self.consumer.clone();
        let lanes = self.lanes.take();
        spawn_lag_monitor(
            kafka_config(&self.cfg),
            self.positions.clone(),
            self.metrics.clone(),
            self.telemetry.clone(),
            shutdown.clone(),
        );
        // Records fetched in the moment between `assign` and the split of the partition
        // queues sit in the consumer's own queue, and precede everything their partitions'
        // queues will hold: taken after a later record, they would read as a rewind (and the
        // gap before it as skipped), so they are taken first. They were all queued before
        // the split returned; no record of a split partition reaches that queue afterwards.
        if lanes.is_some() && self.drain_own_queue(&consumer, &mut since_check).await? {
            return self.ended();
        }
        loop {
            tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    info!("shutting down: flushing buffered records");
                    // One last, short attempt; if ClickHouse or Kafka is down (or a dead
                    // letter cannot go out) it gives up, and the records are replayed from
                    // the stored offsets next time.
                    let last = async {
                        if self.flush().await.is_ok() {
                            let _ = self.settle_flush().await;
                        }
                    };
                    if tokio::time::timeout(Duration::from_secs(7), last).await.is_err() {
                        warn!("the last flush did not finish within 7 s; stopping without it");
                    }
                    return Ok(self.totals);
                }
                msg = next_record(&consumer, lanes.as_ref()) => {
                    // A partition's queue skipped ahead: if the records in between were
                    // fetched before the split, they wait in the consumer's own queue.
                    let skipped = lanes.as_ref().is_some_and(align::Lanes::take_skip);
                    if skipped && self.drain_own_queue(&consumer, &mut since_check).await? {
                        return self.ended();
                    }
                    if self.on_record(msg, &mut since_check).await? { return self.ended(); }
                }
                // With per-partition queues the consumer's own queue still serves events
                // (errors, statistics), and rdkafka wants it polled; asked only while no
                // partition has a record (asking it first, for every record, cost half
                // again the consumer's CPU in `weft bench ingest`). What it held of the
                // split partitions was taken before the loop.
                msg = consumer.recv(), if lanes.is_some() => {
                    if self.on_record(msg, &mut since_check).await? { return self.ended(); }
                }
                _ = tick.tick() => {
                    self.after_rebalance().await?;
                    self.nudge_quiet_partitions().await?;
                    // A flush that landed while the stream went quiet: take its resume points
                    // now, not at the next flush, so lag and totals do not wait for traffic.
                    let landed = matches!(&self.flusher, FlusherSlot::Busy(t) if t.is_finished());
                    if landed && self.settle_flush().await.is_err() { return self.ended(); }
                    let due = self.parts.values().any(|p| p.oldest.is_some_and(|t| t.elapsed() >= flush_every));
                    if due && self.flush().await.is_err() { return self.ended(); }
                }
            }
        }
    }
}

/// The next record: from the per-partition queues when there are any, else the consumer's.
async fn next_record<'a>(
    consumer: &'a StreamConsumer<RebalanceWatch>,
    lanes: Option<&'a align::Lanes>,
) -> Result<BorrowedMessage<'a>, KafkaError> {
    match lanes {
        Some(l) => l.recv().await,
        None => consumer.recv().await,
    }
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// [`Ingestor::ended`], for a loop that gave up: asked to stop (`stopping`) it is a clean
/// end, otherwise a failure.
fn ended(stopping: bool, totals: IngestTotals) -> Result<IngestTotals, IngestError> {
    if stopping {
        Ok(totals)
    } else {
        Err(IngestError::Halted)
    }
}

/// Retry a ClickHouse operation while ClickHouse is unreachable (start-up reads must not give
/// up while it restarts), or until the process is asked to stop; a query it rejects is
/// returned at once. `f` may fail with any error that says whether ClickHouse failed or the
/// process stopped ([`StoreError`], a projector's [`LoadError`]).
async fn retry_store<T, E, F, Fut>(
    backoff: &Backoff,
    metrics: &IngestMetrics,
    what: &str,
    f: F,
) -> Result<T, IngestError>
where
    E: Into<IngestError>,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    backoff
        .retry(f, |e, attempt| {
            store_failed(metrics, what, e.into(), attempt)
        })
        .await
}

/// After failed attempt `attempt` at `what`: `Ok` to retry a transient ClickHouse failure
/// (logged sparsely; ClickHouse counts as down), `Err` to give up on anything else (a
/// rejected query logged as such).
fn store_failed(
    metrics: &IngestMetrics,
    what: &str,
    e: IngestError,
    attempt: u32,
) -> Result<(), IngestError> {
    match &e {
        IngestError::Store(s) if s.is_transient() => {
            metrics.clickhouse_up.set(0);
            if sparse(attempt) {
                error!(error = %s, attempt, "{what}: clickhouse unavailable; retrying");
            }
            Ok(())
        }
        IngestError::Store(s) => {
            error!(error = %s, "{what}: ClickHouse rejected the query (did `weft migrate` run?)");
            Err(e)
        }
        _ => Err(e),
    }
}

/// Wait until the facts inserts running now into `weft_events` (a killed predecessor's, or a
/// partition's previous owner's) have finished ([`Store::wait_for_earlier_inserts`]: however
/// long that takes, only those running now), or `Err(Stopped)` once the process is asked to
/// stop. ClickHouse unreachable meanwhile: asked again as [`retry_store`] does.
pub(super) async fn wait_for_earlier_inserts(
    backoff: &Backoff,
    metrics: &IngestMetrics,
    store: &Store,
) -> Result<(), IngestError> {
    let what = "wait for the inserts running earlier";
    store
        .wait_for_earlier_inserts(&["weft_events"], backoff.stop(), |e, attempt| async move {
            store_failed(metrics, what, e.into(), attempt)?;
            Ok(backoff.pause(attempt).await?)
        })
        .await
}

/// Ask Kafka (`fetch`: a blocking call with its own timeout) until it answers, backing off
/// after each error (a timeout, a leader moving while a broker restarts: all pass), or
/// `Err(Stopped)` once the process is asked to stop.
pub(super) async fn retry_kafka<T>(
    what: &str,
    backoff: &Backoff,
    mut fetch: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, IngestError> {
    if backoff.stopping() {
        return Err(IngestError::Stopped);
    }
    backoff
        .retry(
            || std::future::ready(fetch()),
            |e, attempt| {
                if sparse(attempt) {
                    warn!(error = %e, attempt, "{what}: kafka did not answer; retrying");
                }
                Ok(())
            },
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode;

    /// Retries with no pause, ended by `stop`.
    fn quick(stop: watch::Receiver<bool>) -> Backoff {
        Backoff::new(0, stop)
    }

    /// A ClickHouse failure as an unreachable server gives it.
    fn unreachable() -> StoreError {
        StoreError::ClickHouse {
            url: "http://127.0.0.1:1".into(),
            source: clickhouse::error::Error::TimedOut,
        }
    }

    /// [`retry_store`] of an operation whose call `n` (from 1) answers `answer(n)`: its
    /// result, and how many calls were made.
    async fn store_retried<T, E: Into<IngestError>>(
        stop: &watch::Receiver<bool>,
        metrics: &IngestMetrics,
        answer: impl Fn(u32) -> Result<T, E>,
    ) -> (Result<T, IngestError>, u32) {
        let mut calls = 0;
        let r = retry_store(&quick(stop.clone()), metrics, "read progress", || {
            calls += 1;
            std::future::ready(answer(calls))
        })
        .await;
        (r, calls)
    }

    /// ClickHouse unreachable: retried (and counted as down) until it answers; a query it
    /// rejects is not retried.
    #[tokio::test]
    async fn clickhouse_is_asked_again_until_it_answers_but_not_after_a_rejection() {
        let (_tx, stop) = watch::channel(false);
        let metrics = IngestMetrics::new();
        metrics.clickhouse_up.set(1);
        let answer = |n| if n < 3 { Err(unreachable()) } else { Ok(7) };
        let (r, calls) = store_retried(&stop, &metrics, answer).await;
        assert_eq!((r.ok(), calls), (Some(7), 3));
        assert_eq!(metrics.clickhouse_up.get(), 0);
        let rejected = |_| Err::<(), _>(StoreError::BadDatabase("x-y".into()));
        let (r, calls) = store_retried(&stop, &metrics, rejected).await;
        assert!(matches!(r, Err(IngestError::Store(_))), "{r:?}");
        assert_eq!(calls, 1);
    }

    /// ClickHouse down for good: the retries end with the stop (they went on for ever).
    #[tokio::test]
    async fn retrying_clickhouse_gives_way_to_a_stop() {
        let (tx, stop) = watch::channel(false);
        let metrics = IngestMetrics::new();
        let down = |n| {
            if n == 3 {
                let _ = tx.send(true);
            }
            Err::<(), _>(unreachable())
        };
        let (r, calls) = store_retried(&stop, &metrics, down).await;
        assert!(matches!(r, Err(IngestError::Stopped)), "{r:?}");
        assert_eq!(calls, 3);
    }

    /// A projector load stopped while it waits for earlier inserts is a stop, not a failure
    /// to retry.
    #[tokio::test]
    async fn a_stopped_load_is_not_retried() {
        let (_tx, stop) = watch::channel(false);
        let metrics = IngestMetrics::new();
        let stopped = |_| Err::<(), _>(LoadError::Stopped);
        let (r, calls) = store_retried(&stop, &metrics, stopped).await;
        assert!(matches!(r, Err(IngestError::Stopped)), "{r:?}");
        assert_eq!(calls, 1);
    }

    /// A watermark request that times out (a broker restarting) is asked again, not fatal.
    #[tokio::test]
    async fn a_kafka_timeout_is_retried_until_kafka_answers() {
        let (_tx, stop) = watch::channel(false);
        let mut calls = 0;
        let r = retry_kafka("high watermark", &quick(stop), || {
            calls += 1;
            if calls == 1 {
                Err(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::OperationTimedOut,
                ))
            } else {
                Ok((0i64, 5i64))
            }
        })
        .await;
        assert_eq!(r.ok(), Some((0, 5)));
        assert_eq!(calls, 2);
    }

    /// Kafka down for good: the retries end with the stop.
    #[tokio::test]
    async fn retrying_kafka_gives_way_to_a_stop() {
        let (tx, stop) = watch::channel(false);
        let mut calls = 0;
        let r: Result<(), _> = retry_kafka("high watermark", &quick(stop), || {
            calls += 1;
            if calls == 3 {
                let _ = tx.send(true);
            }
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::OperationTimedOut,
            ))
        })
        .await;
        assert!(matches!(r, Err(IngestError::Stopped)), "{r:?}");
        assert_eq!(calls, 3);
    }

    /// A loop that gives up without being asked to stop ends in an error, so `weft ingest`
    /// exits non-zero (it printed its totals and exited 0, like a clean shutdown).
    #[test]
    fn giving_up_unasked_is_an_error() {
        let totals = IngestTotals::default();
        assert!(matches!(ended(false, totals), Err(IngestError::Halted)));
        assert!(ended(true, totals).is_ok());
    }
}
