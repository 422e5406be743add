//! Prometheus metrics of `weft ingest`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use weft_http::prometheus::{
    Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
};

use weft_http::MetricsRegistry;

/// Stall detection from this process's own positions (not the broker's high watermarks,
/// which tansu's memory engine under-reports): since when fetched records have waited with
/// nothing stored. Read by `/healthz` (503 when stalled) and `/metrics`.
#[derive(Debug, Default)]
pub struct Health {
    /// Micros since the epoch when the oldest record still waiting was fetched; 0 = none.
    waiting_since: AtomicI64,
    /// `stall_after_secs`; 0 disables.
    stall_after_secs: AtomicU64,
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

impl Health {
    /// Set the stall threshold (seconds; 0 disables).
    pub fn set_stall_after(&self, secs: u64) {
        self.stall_after_secs.store(secs, Ordering::Relaxed);
    }

    /// A fetched record now waits to be stored (keeps the oldest wait).
    pub fn waiting(&self) {
        let _ = self.waiting_since.compare_exchange(
            0,
            now_micros(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// A flush stored what it took; `more` when newer records still wait.
    pub fn progressed(&self, more: bool) {
        let v = if more { now_micros() } else { 0 };
        self.waiting_since.store(v, Ordering::Relaxed);
    }

    /// Seconds records have waited with nothing stored (0 when nothing waits).
    pub fn waited_secs(&self) -> u64 {
        match self.waiting_since.load(Ordering::Relaxed) {
            0 => 0,
            t => ((now_micros() - t).max(0) / 1_000_000) as u64,
        }
    }

    /// `Some(seconds)` when stalled: records waited at least `stall_after_secs`.
    pub fn stalled(&self) -> Option<u64> {
        let after = self.stall_after_secs.load(Ordering::Relaxed);
        let waited = self.waited_secs();
        (after > 0 && waited >= after).then_some(waited)
    }
}

/// Everything `/metrics` shows for the ingest process.
pub struct IngestMetrics {
    registry: MetricsRegistry,
    /// Records read from Kafka, per topic.
    pub consumed: IntCounterVec,
    /// Facts stored in `weft_events`, per kind.
    pub inserted: IntCounterVec,
    /// Copies of an already stored event, dropped.
    pub deduplicated: IntCounter,
    /// Events stored with an id already used for different content.
    pub conflicts: IntCounter,
    /// Records the dead-letter topic acknowledged, per rejection code (quarantined ones are
    /// counted in `dead_letters_quarantined` only).
    pub dead_lettered: IntCounterVec,
    /// Records skipped because their offset is already stored and projected.
    pub replay_skipped: IntCounter,
    /// Offsets the broker never delivered, per topic.
    pub offset_gaps: IntCounterVec,
    /// Seeks back after the broker answered a fetch inside a record batch from a later batch
    /// (tansu's memory engine; `ingest/resume.rs`), per topic.
    pub seek_backs: IntCounterVec,
    /// Rows per facts insert.
    pub batch_rows: Histogram,
    /// Latency of one facts insert.
    pub insert_seconds: Histogram,
    /// ClickHouse writes retried after an error.
    pub insert_retries: IntCounter,
    /// 1 when the last ClickHouse insert succeeded, 0 after a failure.
    pub clickhouse_up: IntGauge,
    /// High watermark minus the next offset to store, per partition; set by the lag monitor.
    pub lag: IntGaugeVec,
    /// Time from `emitted_at` to queryable in ClickHouse, per kind.
    pub freshness_seconds: HistogramVec,
    /// Identities the dedup state could not decide, checked in ClickHouse.
    pub dedup_checked: IntCounter,
    /// The narrative projector's metrics.
    pub narrative: NarrativeMetrics,
    /// Dead letters the dead-letter topic refused in every form (kept in weft_quarantine);
    /// not counted in `dead_lettered`.
    pub dead_letters_quarantined: IntCounter,
    /// Top-level payload keys of stored events neither defined by their kind nor of the
    /// `x_<org>_<field>` shape.
    pub nonconforming_keys: IntCounter,
    /// Dead-letter sends retried after a transient error (broker unreachable, queue full).
    pub dead_letter_retries: IntCounter,
    /// 1 while records are fetched but none stored for `stall_after_secs`.
    pub stalled: IntGauge,
    /// Seconds since this process last stored (or dead-lettered) a fetched record while
    /// records were waiting; 0 when nothing waits.
    pub stalled_seconds: IntGauge,
    /// Stall detection (not a Prometheus metric; feeds `stalled` and `stalled_seconds`).
    pub health: Health,
    /// Telemetry rows (migration 0006) dropped: queue full, table missing or insert failed.
    pub telemetry_dropped: IntCounterVec,
    /// Partitions not read for now: more than `align_skew_ms` ahead of the slowest
    /// partition with records waiting (single-process roles; see `ingest/align.rs`).
    pub partitions_held: IntGauge,
}

/// The narrative projector's metrics (dashboards read these names).
pub struct NarrativeMetrics {
    /// Events moved to another narrative by a late anchor.
    pub moved: IntCounter,
    /// Nodes held in the projector's in-memory graph.
    pub graph_nodes: IntGauge,
    /// Nodes of evicted components loaded back from ClickHouse.
    pub loaded: IntCounter,
    /// Nodes evicted from the graph to keep it within `narrative_max_nodes`.
    pub evicted: IntCounter,
    /// Ids named by events with a request id that the open filter ruled out: neither looked
    /// up nor kept in memory (see `narrative/filter.rs`).
    pub spared: IntCounter,
    /// Events with a request id placed in their own narrative without entering the graph:
    /// new ids that name, and are named by, nothing in memory (see `narrative/projector.rs`).
    pub direct: IntCounter,
    /// Size of the largest uncolored component the last pass assigned.
    pub largest_component: IntGauge,
    /// 1 once both id filters' background rebuilds have ended (until then every id a pass
    /// names is looked up in ClickHouse).
    pub id_filter_ready: IntGauge,
    /// Time to project one batch onto the narratives.
    pub projector_seconds: Histogram,
    /// Facts fed to the projector (this shard's tenants only).
    pub projected: IntCounter,
    /// Records of tenants another narrative shard projects, passed over undecoded.
    pub shard_skipped: IntCounter,
    /// This process's narrative shard, `i` of `--narrative-shard i/N` (0 when unsharded).
    pub shard_index: IntGauge,
    /// `N` of `--narrative-shard i/N`: 1 when one process projects every tenant.
    pub shard_count: IntGauge,
}

impl NarrativeMetrics {
    fn new(r: &MetricsRegistry) -> Self {
        Self {
            moved: r.counter(
                "weft_narratives_moved_total",
                "Events moved to another narrative by a late anchor",
            ),
            graph_nodes: r.gauge(
                "weft_narrative_graph_nodes",
                "Nodes held by the narrative projector",
            ),
            loaded: r.counter(
                "weft_narrative_loaded_nodes_total",
                "Nodes of evicted narrative components loaded back from ClickHouse",
            ),
            evicted: r.counter(
                "weft_narrative_evicted_nodes_total",
                "Nodes evicted from the narrative graph to stay within narrative_max_nodes",
            ),
            spared: r.counter(
                "weft_narrative_ids_spared_total",
                "Ids named by events with a request id that no stored event without one can reach: not looked up",
            ),
            direct: r.counter(
                "weft_narrative_direct_total",
                "Events with a request id placed in their own narrative without entering the graph (new ids naming nothing in memory)",
            ),
            largest_component: r.gauge(
                "weft_narrative_largest_component",
                "Nodes of the largest uncolored component the last narrative pass assigned",
            ),
            id_filter_ready: r.gauge(
                "weft_narrative_id_filter_ready",
                "1 once the narrative id filters are rebuilt after start (0: every named id is looked up)",
            ),
            projector_seconds: r.histogram(
                "weft_narrative_projector_seconds",
                "Time to project one batch",
                vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5],
            ),
            projected: r.counter(
                "weft_narrative_projected_total",
                "Facts fed to the narrative projector (of this shard's tenants)",
            ),
            shard_skipped: r.counter(
                "weft_narrative_shard_skipped_total",
                "Records of tenants another narrative shard projects, passed over before decoding",
            ),
            shard_index: r.gauge(
                "weft_narrative_shard_index",
                "This process's narrative shard: i of --narrative-shard i/N",
            ),
            shard_count: r.gauge(
                "weft_narrative_shard_count",
                "Narrative shards: N of --narrative-shard i/N (1: every tenant in one process)",
            ),
        }
    }
}

impl IngestMetrics {
    // Metric definitions are constants; a failure here is a programming error caught by the
    // unit test below, not something input can trigger.
    /// A fresh registry with every ingest metric at zero.
    pub fn new() -> Self {
        let r = MetricsRegistry::new();
        let lag = r.gauge_vec(
            "weft_ingest_consumer_lag",
            "High watermark minus the next offset to store, per partition",
            &["topic", "partition"],
        );
        let freshness = r.histogram_vec(
            "weft_ingest_freshness_seconds",
            "From emitted_at to queryable in ClickHouse",
            vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0],
            &["kind"],
        );
        let clickhouse_up = r.gauge(
            "weft_ingest_clickhouse_up",
            "1 when the last ClickHouse insert succeeded",
        );
        Self {
            consumed: r.counter_vec(
                "weft_ingest_consumed_total",
                "Records read from Kafka",
                &["topic"],
            ),
            inserted: r.counter_vec(
                "weft_ingest_inserted_total",
                "Facts stored in weft_events",
                &["kind"],
            ),
            deduplicated: r.counter(
                "weft_ingest_deduplicated_total",
                "Copies of an already stored event, dropped",
            ),
            conflicts: r.counter(
                "weft_ingest_conflicts_total",
                "Events stored with an id already used for different content",
            ),
            dead_lettered: r.counter_vec(
                "weft_ingest_dead_lettered_total",
                "Records the dead-letter topic acknowledged (quarantined ones not included)",
                &["reason"],
            ),
            replay_skipped: r.counter(
                "weft_ingest_replay_skipped_total",
                "Records skipped as read before: at or below the stored offset after a restart, or delivered again",
            ),
            offset_gaps: r.counter_vec(
                "weft_ingest_offset_gaps_total",
                "Offsets the broker never delivered (retention, compaction, or a broker fault)",
                &["topic"],
            ),
            seek_backs: r.counter_vec(
                "weft_ingest_seek_backs_total",
                "Seeks back after the broker answered a fetch from a later record batch than the one holding the offset asked for",
                &["topic"],
            ),
            batch_rows: r.histogram(
                "weft_ingest_batch_rows",
                "Rows per ClickHouse insert",
                vec![
                    1.0, 10.0, 100.0, 1_000.0, 5_000.0, 10_000.0, 25_000.0, 50_000.0, 100_000.0,
                ],
            ),
            insert_seconds: r.histogram(
                "weft_ingest_insert_seconds",
                "Latency of one facts insert",
                vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ],
            ),
            insert_retries: r.counter(
                "weft_ingest_insert_retries_total",
                "ClickHouse writes retried after an error",
            ),
            clickhouse_up,
            lag,
            freshness_seconds: freshness,
            dedup_checked: r.counter(
                "weft_ingest_dedup_checked_total",
                "Identities older than the dedup state holds exactly, checked in ClickHouse",
            ),
            narrative: NarrativeMetrics::new(&r),
            dead_letters_quarantined: r.counter(
                "weft_ingest_dead_letters_quarantined_total",
                "Dead letters refused by the dead-letter topic in every form (kept in weft_quarantine; not in weft_ingest_dead_lettered_total)",
            ),
            nonconforming_keys: r.counter(
                "weft_ingest_nonconforming_keys_total",
                "Payload keys neither defined by the kind nor of the x_<org>_<field> shape, in records ingest read",
            ),
            dead_letter_retries: r.counter(
                "weft_ingest_dead_letter_retries_total",
                "Dead-letter sends retried after a transient error (offsets held meanwhile)",
            ),
            stalled: r.gauge(
                "weft_ingest_stalled",
                "1 while records are fetched but none stored for stall_after_secs",
            ),
            stalled_seconds: r.gauge(
                "weft_ingest_stalled_seconds",
                "Seconds records have waited with nothing stored (0 when nothing waits)",
            ),
            telemetry_dropped: r.counter_vec(
                "weft_ingest_telemetry_dropped_total",
                "Telemetry rows not written to ClickHouse (best effort; ingest unaffected)",
                &["table"],
            ),
            partitions_held: r.gauge(
                "weft_ingest_partitions_held",
                "Partitions not read for now: more than align_skew_ms ahead of the slowest partition with records waiting",
            ),
            health: Health::default(),
            registry: r,
        }
    }

    /// The registry, for a collector the process adds (the binary's heap gauges).
    pub fn registry(&self) -> &MetricsRegistry {
        &self.registry
    }

    /// The Prometheus text exposition (stall gauges refreshed first).
    pub fn render(&self) -> String {
        self.stalled.set(i64::from(self.health.stalled().is_some()));
        self.stalled_seconds.set(self.health.waited_secs() as i64);
        self.registry.render()
    }
}

impl Default for IngestMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn all_metrics_register_and_render() {
        let m = super::IngestMetrics::new();
        m.consumed.with_label_values(&["t"]).inc();
        m.dead_lettered.with_label_values(&["schema_invalid"]).inc();
        m.lag.with_label_values(&["t", "0"]).set(3);
        let text = m.render();
        for name in [
            "weft_ingest_consumed_total",
            "weft_ingest_dead_lettered_total",
            "weft_ingest_consumer_lag",
            "weft_ingest_batch_rows",
            "weft_ingest_insert_seconds",
            "weft_ingest_deduplicated_total",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
    }
}
