//! Prometheus metrics of the publish path, shared by the [`crate::Publisher`] and the gateway.
//!
//! One [`Metrics`] per process, with its own registry, so tests and embedders can create
//! several publishers without colliding in a global registry. `GET /metrics` renders it.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// The counters, gauges and histograms. Cheap to update (atomics) on the hot path.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
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
    /// Bytes the spool occupies on disk.
    pub spool_bytes: IntGauge,
    /// Events in the spool not yet delivered.
    pub spool_pending: IntGauge,
    /// Time from `publish` to durability (Kafka ack or spool fsync), in seconds.
    pub publish_latency: Histogram,
}

impl Metrics {
    /// Fresh metrics in a fresh registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
            // Names are constants and unique: registration cannot fail.
            let _ = registry.register(Box::new(c.clone()));
            c
        };
        let accepted = counter(
            "weft_gateway_events_accepted_total",
            "Events accepted by the gateway and made durable",
        );
        let published = counter(
            "weft_publisher_events_published_total",
            "Events acknowledged by Kafka (acks=all)",
        );
        let spooled = counter(
            "weft_publisher_events_spooled_total",
            "Events written to the durable spool because Kafka could not take them",
        );
        let replayed = counter(
            "weft_publisher_events_replayed_total",
            "Spooled events delivered to Kafka by the replayer",
        );
        let rejected = IntCounterVec::new(
            Opts::new(
                "weft_events_rejected_total",
                "Events refused (never published), by reason",
            ),
            &["reason"],
        )
        .unwrap_or_else(|e| panic!("metric rejected: {e}"));
        let _ = registry.register(Box::new(rejected.clone()));
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
            let _ = registry.register(Box::new(g.clone()));
            g
        };
        let spool_bytes = gauge(
            "weft_publisher_spool_bytes",
            "Bytes the spool occupies on disk",
        );
        let spool_pending = gauge(
            "weft_publisher_spool_pending_events",
            "Spooled events not yet delivered to Kafka",
        );
        let publish_latency = Histogram::with_opts(
            HistogramOpts::new(
                "weft_publisher_publish_latency_seconds",
                "Time from publish() to durability (Kafka ack or spool fsync)",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
        )
        .unwrap_or_else(|e| panic!("metric latency: {e}"));
        let _ = registry.register(Box::new(publish_latency.clone()));
        Self {
            registry,
            accepted,
            rejected,
            published,
            spooled,
            replayed,
            spool_bytes,
            spool_pending,
            publish_latency,
        }
    }

    /// Count one refused event under `reason`.
    pub fn reject(&self, reason: &str) {
        self.rejected.with_label_values(&[reason]).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
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
