//! Prometheus metrics of the publish path, shared by the [`crate::Publisher`] and the gateway.
//!
//! One [`Metrics`] per process, with its own registry, so tests and embedders can create
//! several publishers without colliding in a global registry. `GET /metrics` renders it.

use weft_http::prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge};
use weft_http::MetricsRegistry;

/// The counters, gauges and histograms. Cheap to update (atomics) on the hot path.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: MetricsRegistry,
    /// Events the gateway accepted (and the publisher made durable).
    pub accepted: IntCounter,
    /// Events refused, by reason code (`schema_invalid`, `tenant_forbidden`, ...).
    pub rejected: IntCounterVec,
    /// Events acknowledged by Kafka (first try or replay).
    pub published: IntCounter,
    /// Events written to the spool.
    pub spooled: IntCounter,
    /// Spooled events later delivered to Kafka by the replayer.
    pub replayed: IntCounter,
    /// Spooled events Kafka refused for good on replay, or kept failing while it acknowledged
    /// others (`set_aside_after_secs`), set aside in `refused.jsonl`.
    pub spool_refused: IntCounter,
    /// Damaged spool records set aside, not replayed (copied to `corrupt-*` files in the
    /// spool folder; a range whose length was damaged counts once).
    pub spool_corrupt_records: IntCounter,
    /// Bytes in them.
    pub spool_corrupt_bytes: IntCounter,
    /// Bytes the spool occupies on disk.
    pub spool_bytes: IntGauge,
    /// Events in the spool not yet delivered.
    pub spool_pending: IntGauge,
    /// Top-level payload keys the gateway saw that are neither defined by their kind nor of
    /// the `x_<org>_<field>` shape.
    pub nonconforming_keys: IntCounter,
    /// The same, seen by the [`crate::Publisher`] (`weft publish`, the SDK, the router;
    /// not the gateway's items, which the gateway counts).
    pub publisher_nonconforming_keys: IntCounter,
    /// Time from `publish` to durability (Kafka ack or spool fsync), in seconds.
    pub publish_latency: Histogram,
}

impl Metrics {
    /// Fresh metrics in a fresh registry.
    pub fn new() -> Self {
        let r = MetricsRegistry::new();
        Self {
            accepted: r.counter(
                "weft_gateway_events_accepted_total",
                "Events accepted by the gateway and made durable",
            ),
            rejected: r.counter_vec(
                "weft_events_rejected_total",
                "Events refused (never published), by reason",
                &["reason"],
            ),
            published: r.counter(
                "weft_publisher_events_published_total",
                "Events acknowledged by Kafka (acks=all)",
            ),
            spooled: r.counter(
                "weft_publisher_events_spooled_total",
                "Events written to the durable spool because Kafka could not take them",
            ),
            replayed: r.counter(
                "weft_publisher_events_replayed_total",
                "Spooled events delivered to Kafka by the replayer",
            ),
            spool_refused: r.counter(
                "weft_publisher_spool_refused_total",
                "Spooled events Kafka refused for good, or failed for set_aside_after_secs while it acknowledged others (set aside in the spool's refused.jsonl)",
            ),
            spool_corrupt_records: r.counter(
                "weft_publisher_spool_corrupt_records_total",
                "Damaged spool records set aside, not replayed (copied to corrupt-* files in the spool folder)",
            ),
            spool_corrupt_bytes: r.counter(
                "weft_publisher_spool_corrupt_bytes_total",
                "Bytes of damaged spool records set aside",
            ),
            spool_bytes: r.gauge(
                "weft_publisher_spool_bytes",
                "Bytes the spool occupies on disk",
            ),
            spool_pending: r.gauge(
                "weft_publisher_spool_pending_events",
                "Spooled events not yet delivered to Kafka",
            ),
            nonconforming_keys: r.counter(
                "weft_gateway_nonconforming_keys_total",
                "Payload keys neither defined by the kind nor of the x_<org>_<field> shape",
            ),
            publisher_nonconforming_keys: r.counter(
                "weft_publisher_nonconforming_keys_total",
                "Payload keys neither defined by the kind nor of the x_<org>_<field> shape, seen by the publisher",
            ),
            publish_latency: r.histogram(
                "weft_publisher_publish_latency_seconds",
                "Time from publish() to durability (Kafka ack or spool fsync)",
                vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ],
            ),
            registry: r,
        }
    }

    /// Count one refused event under `reason`.
    pub fn reject(&self, reason: &str) {
        self.rejected.with_label_values(&[reason]).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.registry.render()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_metric_in_text_format() {
        let m = Metrics::new();
        m.accepted.inc();
        m.reject("schema_invalid");
        m.publish_latency.observe(0.003);
        m.spool_bytes.set(42);
        let text = m.render();
        for needle in [
            "weft_gateway_events_accepted_total 1",
            "weft_events_rejected_total{reason=\"schema_invalid\"} 1",
            "weft_publisher_events_published_total 0",
            "weft_publisher_events_spooled_total 0",
            "weft_publisher_spool_bytes 42",
            "weft_publisher_publish_latency_seconds_bucket{le=\"0.005\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
