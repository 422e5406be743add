//! The flusher: dead letters, one facts insert for the batch, the narrative pass.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::FutureProducer;
use tracing::{debug, error, info, instrument, warn};

use super::batch::FlushPart;
use super::rebalance::RebalanceWatch;
use super::retry::{unless_stopped, Backoff};
use super::{now_micros, IngestConfig, Role};
use crate::facts;
use crate::metrics::IngestMetrics;
use crate::narrative::filter::RebuildGate;
use crate::narrative::projector::{LoadError, ProjectBatch, Projector};
use crate::telemetry::{BatchRow, Sample, Telemetry};
use weft_store::{insert_native_as, EventRow, FloorRow, Store, StoreError, INGEST_FLOOR};

/// The flusher, idle or away in the flush task. At most one flush is in flight: the loop
/// decodes the next batch while it runs, and waits for it before starting another.
pub(super) enum FlusherSlot {
    Idle(Box<Flusher>),
    Busy(tokio::task::JoinHandle<(Box<Flusher>, FlushResult)>),
    /// Lost with a flush task that panicked; the process stops.
    Gone,
}

/// Everything a flush needs besides its records, moved into the flush task and back, so the
/// flush (dead letters, the facts insert, the narrative pass) runs on another thread while
/// the loop goes on decoding.
pub(super) struct Flusher {
    pub(super) cfg: IngestConfig,
    pub(super) store: Store,
    pub(super) consumer: Arc<StreamConsumer<RebalanceWatch>>,
    pub(super) dlq: FutureProducer,
    pub(super) metrics: Arc<IngestMetrics>,
    pub(super) projector: Option<Projector>,
    /// The pause between attempts, cut short when the process is asked to stop.
    pub(super) backoff: Backoff,
    pub(super) telemetry: Telemetry,
}

/// What a landed flush did, applied to the partitions' resume points and the totals.
pub(super) struct FlushDone {
    /// (topic, partition, last offset) of each partition flushed.
    pub(super) parts: Vec<(String, i32, i64)>,
    pub(super) inserted: u64,
    /// Dead letters the dead-letter topic acknowledged (not the quarantined ones).
    pub(super) dead_lettered: u64,
}

/// Where one partition's rows sit in a batch insert: topic, partition, the rows' index
/// range, and the highest offset among them.
pub(super) type Span = (String, i32, std::ops::Range<usize>, i64);

/// A flush abandoned because the process is stopping; its records are replayed next time.
pub(super) use super::retry::Stopped;

pub(super) type FlushResult = Result<FlushDone, Stopped>;

impl Flusher {
    /// Flush `parts`, retrying until it lands or the process stops; hands itself back.
    pub(super) async fn run(
        mut self: Box<Self>,
        mut parts: Vec<FlushPart>,
    ) -> (Box<Self>, FlushResult) {
        let result = self.flush_batch(&mut parts).await;
        (self, result)
    }

    pub(super) async fn flush_batch(&mut self, parts: &mut [FlushPart]) -> FlushResult {
        // 1. Dead letters first: once their offsets are committed they must be safe elsewhere.
        let mut dead_lettered = 0;
        for p in parts.iter() {
            if !p.dead.is_empty() {
                dead_lettered += self.dead_letter(&p.topic, p.partition, &p.dead).await?;
            }
        }
        // 2. Facts: the rows of one atomic insert for every partition: one part in
        //    ClickHouse, however many partitions the batch spans.
        let ingested_at = now_micros();
        let (rows, spans) = fact_rows(parts, ingested_at);
        // 3. The facts insert and the narrative pass run concurrently: while ClickHouse
        //    writes the facts, weft computes the narratives. Neither reads what the other
        //    writes (the projector reads only narrative tables), and each keeps its own
        //    resume point, so either may land first or alone.
        let batches = project_batches(parts);
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
            self.report(parts, &spans, &rows, insert_ms, ingested_at);
        }
        projected?;
        // 4. A partition whose batch ends in dead letters: how far it is done, or a restart
        //    (which resumes after the last stored fact) would dead-letter them again.
        if self.cfg.role != Role::Narratives {
            self.record_floors(parts).await?;
        }
        // 5. Let rdkafka commit the next offsets.
        for p in parts.iter() {
            debug!(topic = %p.topic, partition = p.partition, last_offset = p.last_offset,
                facts = p.facts.len(), "flushed; offset stored for commit");
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

    /// Record in `weft_ingest_floor` the last offset of each partition whose batch ends in
    /// dead letters, once its facts are stored (so the floor never passes a fact that is not):
    /// ingest resumes after the highest stored offset or floor. Retried until it lands; a
    /// crash before that only sends those dead letters again.
    async fn record_floors(&self, parts: &[FlushPart]) -> Result<(), Stopped> {
        let floors: Vec<FloorRow> = parts.iter().filter_map(FlushPart::dead_tail).collect();
        if floors.is_empty() {
            return Ok(());
        }
        self.backoff
            .retry(
                || weft_store::insert::<FloorRow>(&self.store, INGEST_FLOOR, &floors),
                |e, attempt| {
                    warn!(error = %e, attempt, "recording how far dead-lettered partitions are done failed; retrying");
                    Ok(())
                },
            )
            .await
    }

    /// One narrative pass over a flush's facts, retried until it lands. A failed pass may have
    /// moved the in-memory graph ahead of ClickHouse, so before a retry the graph is rebuilt
    /// from ClickHouse, as a restart would.
    pub(super) async fn project(
        &self,
        projector: &mut Projector,
        batches: &[ProjectBatch<'_>],
    ) -> Result<(), Stopped> {
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            match projector.apply(batches).await {
                Ok(stats) => {
                    let m = &self.metrics.narrative;
                    m.moved.inc_by(stats.moved as u64);
                    m.projected.inc_by(stats.facts as u64);
                    m.loaded.inc_by(stats.loaded as u64);
                    m.evicted.inc_by(stats.evicted as u64);
                    m.spared.inc_by(stats.spared as u64);
                    m.direct.inc_by(stats.direct as u64);
                    m.largest_component.set(stats.largest_component as i64);
                    m.id_filter_ready
                        .set(i64::from(projector.id_filter_ready()));
                    break;
                }
                Err(e) => {
                    attempt += 1;
                    self.metrics.insert_retries.inc();
                    warn!(error = %e, attempt, "narrative projection failed; retrying");
                    // Replaying onto the moved-ahead graph would find nothing to change and
                    // lose the pass's moves (the progress row, written last, was not): the
                    // pass is retried only on a graph reloaded from ClickHouse.
                    let (max_nodes, shard) = (self.cfg.narrative_max_nodes, projector.shard());
                    loop {
                        self.backoff.pause(attempt).await?;
                        let stop = self.backoff.stop();
                        let gate = RebuildGate::open();
                        match Projector::load_shard(
                            self.store.clone(),
                            max_nodes,
                            shard,
                            stop,
                            gate,
                        )
                        .await
                        {
                            Ok(fresh) => break *projector = fresh,
                            Err(LoadError::Stopped) => return Err(Stopped),
                            Err(LoadError::Store(e)) => {
                                attempt += 1;
                                warn!(error = %e, attempt, "reloading the narrative graph failed; retrying");
                            }
                        }
                    }
                }
            }
        }
        self.metrics
            .narrative
            .projector_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Insert the batch's facts (`spans` says which rows came from which partition) as one
    /// insert, retrying until ClickHouse has them. Before a retry it asks ClickHouse how far
    /// each partition is stored and sends only the rows beyond that, so rows whose insert
    /// answer was lost are never stored twice. Returns the insert's milliseconds.
    #[instrument(skip_all, fields(rows = rows.len(), partitions = spans.len()))]
    pub(super) async fn insert_facts(
        &self,
        rows: &[EventRow<'_>],
        spans: &[Span],
    ) -> Result<f64, Stopped> {
        let mut attempt = 0u32;
        let first = Instant::now();
        let mut pending: Option<Vec<EventRow<'_>>> = None;
        loop {
            let started = Instant::now();
            let batch = pending.as_deref().unwrap_or(rows);
            let query_id = attempt_id();
            match insert_native_as(&self.store, "weft_events", batch, Some(&query_id)).await {
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
                    let left = self
                        .rows_left_after(&query_id, rows, spans, &mut attempt)
                        .await?;
                    if left.is_empty() {
                        if e.is_transient() {
                            info!("the failed-looking insert had landed; not repeating it");
                        } else {
                            // Landed, yet refused with an error that is not the network's: a
                            // materialized view refused its block (the facts are written
                            // first), and its table misses these rows.
                            error!(error = %e, rows = rows.len(),
                                "the insert's rows landed but ClickHouse refused it: a view of weft_events missed them");
                        }
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

    /// After the failed insert attempt `query_id`: back off, wait until that attempt no
    /// longer runs in ClickHouse (its answer may have been lost while the server goes on
    /// writing its part), then ask how far each partition is stored; the rows of `rows` not
    /// stored yet. Nothing is resent before both answers are in: a resend while the attempt
    /// runs, or without knowing what it stored, could store its rows twice. Asks again
    /// (backing off) until it knows, or the process stops.
    async fn rows_left_after<'r>(
        &self,
        query_id: &str,
        rows: &[EventRow<'r>],
        spans: &[Span],
        attempt: &mut u32,
    ) -> Result<Vec<EventRow<'r>>, Stopped> {
        loop {
            self.backoff.pause(*attempt).await?;
            let waited = Instant::now();
            match self.attempt_finished(query_id).await? {
                Ok(true) => {
                    let ms = waited.elapsed().as_millis() as u64;
                    debug!(query_id, waited_ms = ms, "the failed insert no longer runs");
                }
                Ok(false) => {
                    *attempt += 1;
                    warn!(
                        query_id,
                        attempt, "the failed insert still runs in ClickHouse; not resending yet"
                    );
                    continue;
                }
                Err(e) => {
                    *attempt += 1;
                    warn!(error = %e, query_id, attempt,
                        "cannot tell whether the failed insert still runs; asking again");
                    continue;
                }
            }
            match self.rows_not_stored(rows, spans).await {
                Ok(left) => return Ok(left),
                Err(e) => {
                    *attempt += 1;
                    warn!(error = %e, attempt, "cannot read how far the partitions are stored; asking again");
                }
            }
        }
    }

    /// Wait (at most [`ATTEMPT_WAIT`]) until the insert `query_id` no longer runs in
    /// ClickHouse: `Ok(true)` once it does not, `Ok(false)` while it still does. Gives up as
    /// soon as the process is told to stop.
    async fn attempt_finished(&self, query_id: &str) -> Result<Result<bool, StoreError>, Stopped> {
        let attempt = self.store.wait_for_query(query_id, ATTEMPT_WAIT);
        unless_stopped(self.backoff.stop(), attempt).await
    }

    /// The rows of `rows` beyond what ClickHouse has stored for their partition.
    pub(super) async fn rows_not_stored<'r>(
        &self,
        rows: &[EventRow<'r>],
        spans: &[Span],
    ) -> Result<Vec<EventRow<'r>>, StoreError> {
        let mut stored = Vec::with_capacity(spans.len());
        for (topic, partition, _, _) in spans {
            stored.push(facts::stored_max_offset(&self.store, topic, *partition).await?);
        }
        Ok(rows_beyond(rows, spans, &stored))
    }

    /// After the insert landed: one telemetry row per partition that had records, and the
    /// per-kind insert and freshness metrics.
    fn report(
        &self,
        parts: &[FlushPart],
        spans: &[Span],
        rows: &[EventRow<'_>],
        insert_ms: f64,
        ingested_at: i64,
    ) {
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
        // A labelled metric's handle costs a hash and a lock to find: once per kind, not
        // per row (`r.kind` is one of eight static names).
        let mut handles: Vec<(&str, u64, prometheus::Histogram)> = Vec::new();
        for r in rows {
            let at = match handles.iter().position(|(k, _, _)| *k == r.kind) {
                Some(i) => i,
                None => {
                    let h = self.metrics.freshness_seconds.with_label_values(&[r.kind]);
                    handles.push((r.kind, 0, h));
                    handles.len() - 1
                }
            };
            let (_, n, freshness) = &mut handles[at];
            *n += 1;
            freshness.observe(((ingested_at - r.emitted_at) as f64 / 1e6).max(0.0));
        }
        for (kind, n, _) in handles {
            self.metrics.inserted.with_label_values(&[kind]).inc_by(n);
        }
    }
}

/// How long one look at a failed insert attempt waits for it to stop running before the
/// retry loop backs off and looks again (it never resends while the attempt runs).
const ATTEMPT_WAIT: Duration = Duration::from_secs(30);

/// A `query_id` for one facts insert attempt, unique across processes and attempts
/// (ClickHouse refuses an id that a running query has): a random tag drawn once per process,
/// and a counter.
pub(super) fn attempt_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static TAG: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tag = TAG.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(now_micros() as u128);
        h.finish()
    });
    format!(
        "weft-facts-{tag:016x}-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The rows of one atomic insert for every partition of a batch (one part in ClickHouse,
/// however many partitions the batch spans): every fact the dedup decisions keep, in offset
/// order per partition. Per partition with rows, a [`Span`]: where its rows sit in the insert,
/// and the highest offset among them.
pub(super) fn fact_rows(parts: &[FlushPart], ingested_at: i64) -> (Vec<EventRow<'_>>, Vec<Span>) {
    let mut rows = Vec::with_capacity(parts.iter().map(|p| p.facts.len()).sum());
    let mut spans: Vec<Span> = Vec::new();
    for p in parts {
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
    (rows, spans)
}

/// The narrative pass's share of a batch: per partition, the facts beyond its projected
/// offset (copies of stored events included: the projector links them idempotently).
pub(super) fn project_batches(parts: &[FlushPart]) -> Vec<ProjectBatch<'_>> {
    parts
        .iter()
        .filter(|p| p.last_offset > p.projected)
        .map(|p| ProjectBatch {
            topic: &p.topic,
            partition: p.partition,
            facts: p
                .facts
                .iter()
                .filter(|(o, _)| *o > p.projected)
                .map(|(_, f)| &**f)
                .collect(),
            last_offset: p.last_offset,
        })
        .collect()
}

/// What to resend after an insert whose answer was lost: per span, the rows above the offset
/// ClickHouse has stored for its partition (`stored[i]` for `spans[i]`); nothing of a span
/// stored up to its last row.
pub(super) fn rows_beyond<'r>(
    rows: &[EventRow<'r>],
    spans: &[Span],
    stored: &[i64],
) -> Vec<EventRow<'r>> {
    let mut left = Vec::new();
    for ((_, _, range, last), &stored) in spans.iter().zip(stored) {
        if stored < *last {
            left.extend(
                rows[range.clone()]
                    .iter()
                    .filter(|r| r.offset as i64 > stored)
                    .cloned(),
            );
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Fact;
    use crate::ingest::batch::tests::fact;

    fn part(partition: i32, facts: Vec<(i64, Fact)>, keep: Vec<Option<bool>>) -> FlushPart {
        let last_offset = facts.iter().map(|(o, _)| *o).max().unwrap_or(-1);
        FlushPart {
            topic: "t".into(),
            partition,
            facts: facts.into_iter().map(|(o, f)| (o, Box::new(f))).collect(),
            keep,
            dead: Vec::new(),
            bytes: 0,
            last_offset,
            projected: -1,
        }
    }

    fn parts() -> Vec<FlushPart> {
        vec![
            part(
                0,
                vec![
                    (4, fact("a", "flow_started")),
                    (5, fact("b", "flow_started")),
                    (6, fact("c", "flow_started")),
                    (7, fact("a", "flow_started")),
                ],
                vec![Some(false), Some(true), Some(false), None],
            ),
            part(1, vec![(2, fact("d", "flow_started"))], vec![None]),
            part(
                2,
                vec![
                    (0, fact("e", "flow_started")),
                    (1, fact("f", "flow_started")),
                ],
                vec![Some(false), Some(false)],
            ),
        ]
    }

    #[test]
    fn one_insert_for_every_partition_with_a_span_each() {
        let parts = parts();
        let (rows, spans) = fact_rows(&parts, 42);
        let ids: Vec<(u32, u64, bool)> = rows
            .iter()
            .map(|r| (r.partition, r.offset, r.conflict == 1))
            .collect();
        assert_eq!(
            ids,
            [
                (0, 4, false),
                (0, 5, true),
                (0, 6, false),
                (2, 0, false),
                (2, 1, false)
            ]
        );
        // Partition 0's last kept row is offset 6 (7 was a copy); partition 1 kept nothing.
        assert_eq!(spans, [("t".into(), 0, 0..3, 6), ("t".into(), 2, 3..5, 1)]);
        assert!(rows.iter().all(|r| r.ingested_at == 42));
    }

    #[test]
    fn after_a_lost_answer_only_the_rows_beyond_what_is_stored_are_resent() {
        let parts = parts();
        let (rows, spans) = fact_rows(&parts, 0);
        let offsets = |left: Vec<EventRow<'_>>| -> Vec<(u32, u64)> {
            left.iter().map(|r| (r.partition, r.offset)).collect()
        };
        // Nothing stored: everything again.
        assert_eq!(offsets(rows_beyond(&rows, &spans, &[-1, -1])).len(), 5);
        // Partition 0 stored up to 4, partition 2 wholly: resend 5 and 6 only.
        assert_eq!(
            offsets(rows_beyond(&rows, &spans, &[4, 1])),
            [(0, 5), (0, 6)]
        );
        // The whole insert landed.
        assert!(rows_beyond(&rows, &spans, &[6, 9]).is_empty());
    }

    #[test]
    fn every_insert_attempt_has_its_own_query_id() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| attempt_id()).collect();
        assert_eq!(ids.len(), 1000);
        let id = attempt_id();
        // One process tag, then the counter; only characters a URL parameter takes as is.
        assert!(id.starts_with("weft-facts-"), "{id}");
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        let tag = |id: &str| id.rsplit_once('-').map(|(t, _)| t.to_owned());
        assert_eq!(tag(&id), tag(&attempt_id()));
    }

    #[test]
    fn the_narrative_pass_takes_every_fact_beyond_the_projected_offset() {
        let mut parts = parts();
        parts[0].projected = 5;
        parts[2].projected = 1;
        let batches = project_batches(&parts);
        let got: Vec<(i32, Vec<&str>, i64)> = batches
            .iter()
            .map(|b| {
                let ids = b.facts.iter().map(|f| f.id.as_str()).collect();
                (b.partition, ids, b.last_offset)
            })
            .collect();
        // Copies (offset 7, partition 1's) are projected too; partition 2 is projected already.
        assert_eq!(got, [(0, vec!["c", "a"], 7), (1, vec!["d"], 2)]);
    }
}
