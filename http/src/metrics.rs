//! The one metrics registry helper: a `prometheus` registry per service (so tests and
//! embedders can run several without colliding) with constructors that register as they
//! build, and the text exposition for `GET /metrics`.
//!
//! Metric definitions are constants; an invalid one is a programming error (each service's
//! unit test renders its registry), so the constructors panic rather than return errors.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// A registry and the constructors that fill it.
#[derive(Debug, Clone, Default)]
pub struct MetricsRegistry {
    registry: Registry,
}

fn built<T>(name: &str, r: prometheus::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("metric {name}: {e}"))
}

impl MetricsRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register any collector (a metric built elsewhere).
    pub fn register<C: Collector + Clone + 'static>(&self, c: C) -> C {
        // A second registration of one name is a programming error caught by the tests.
        let _ = self.registry.register(Box::new(c.clone()));
        c
    }

    /// A counter.
    pub fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(built(name, IntCounter::new(name, help)))
    }

    /// A counter with labels.
    pub fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(built(
            name,
            IntCounterVec::new(Opts::new(name, help), labels),
        ))
    }

    /// A gauge.
    pub fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(built(name, IntGauge::new(name, help)))
    }

    /// A gauge with labels.
    pub fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.register(built(name, IntGaugeVec::new(Opts::new(name, help), labels)))
    }

    /// A histogram with the given buckets.
    pub fn histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
        let opts = HistogramOpts::new(name, help).buckets(buckets);
        self.register(built(name, Histogram::with_opts(opts)))
    }

    /// A histogram with labels.
    pub fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        buckets: Vec<f64>,
        labels: &[&str],
    ) -> HistogramVec {
        let opts = HistogramOpts::new(name, help).buckets(buckets);
        self.register(built(name, HistogramVec::new(opts, labels)))
    }

    /// The Prometheus text exposition of every registered metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding well-formed metrics into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// The `GET /metrics` answer for a rendered exposition.
pub fn metrics_response(text: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_as_it_builds_and_renders() {
        let r = MetricsRegistry::new();
        r.counter("t_total", "t").inc();
        r.counter_vec("t_by_total", "t", &["reason"])
            .with_label_values(&["x"])
            .inc();
        r.gauge("t_gauge", "t").set(3);
        r.histogram("t_seconds", "t", vec![0.1, 1.0]).observe(0.5);
        let text = r.render();
        for needle in [
            "t_total 1",
            "t_by_total{reason=\"x\"} 1",
            "t_gauge 3",
            "t_seconds_bucket{le=\"1\"} 1",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
    }
}
