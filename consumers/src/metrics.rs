//! Prometheus metrics of `weft ingest`.

use weft_http::prometheus::{
    Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
};
use weft_http::MetricsRegistry;

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
    /// Records sent to the dead-letter topic, per rejection code.
    pub dead_lettered: IntCounterVec,
    /// Records skipped because their offset is already stored and projected.
    pub replay_skipped: IntCounter,
    /// Offsets the broker never delivered, per topic.
    pub offset_gaps: IntCounterVec,
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
    /// Events moved to another narrative by a late anchor.
    pub narratives_moved: IntCounter,
    /// Nodes held in the projector's in-memory graph.
    pub narrative_graph_nodes: IntGauge,
    /// Time to project one batch onto the narratives.
    pub projector_seconds: Histogram,
    /// Telemetry rows (migration 0006) dropped: queue full, table missing or insert failed.
    pub telemetry_dropped: IntCounterVec,
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
        let narrative_graph_nodes = r.gauge(
            "weft_narrative_graph_nodes",
            "Nodes held by the narrative projector",
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
                "Records sent to the dead-letter topic",
                &["reason"],
            ),
            replay_skipped: r.counter(
                "weft_ingest_replay_skipped_total",
                "Records at or below the stored offset, skipped after a restart",
            ),
            offset_gaps: r.counter_vec(
                "weft_ingest_offset_gaps_total",
                "Offsets the broker never delivered (retention, compaction, or a broker fault)",
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
            narratives_moved: r.counter(
                "weft_narratives_moved_total",
                "Events moved to another narrative by a late anchor",
            ),
            narrative_graph_nodes,
            projector_seconds: r.histogram(
                "weft_narrative_projector_seconds",
                "Time to project one batch",
                vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5],
            ),
            telemetry_dropped: r.counter_vec(
                "weft_ingest_telemetry_dropped_total",
                "Telemetry rows not written to ClickHouse (best effort; ingest unaffected)",
                &["table"],
            ),
            registry: r,
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
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
