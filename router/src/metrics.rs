//! The router's `/metrics`, in `weft-http`'s [`MetricsRegistry`] (names as before: the Grafana
//! dashboards in `dashboards/` read them).

use weft_http::prometheus::core::Collector;
use weft_http::prometheus::{Counter, Gauge, Histogram, IntCounter, IntGauge};
use weft_http::MetricsRegistry;

/// Decision-time histogram buckets (seconds).
const BUCKETS_S: [f64; 7] = [50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3];

/// Every metric the router shows.
pub struct RouterMetrics {
    registry: MetricsRegistry,
    /// Decisions returned.
    pub decisions: IntCounter,
    /// Requests where no candidate met the constraints.
    pub no_fit: IntCounter,
    /// Requests refused (auth, bad input, limits).
    pub rejected: IntCounter,
    /// Feedback events accepted.
    pub feedback: IntCounter,
    /// Decisions or feedback that could not be published.
    pub publish_errors: IntCounter,
    /// Successful snapshot refreshes.
    pub refresh_ok: IntCounter,
    /// Failed snapshot refreshes.
    pub refresh_errors: IntCounter,
    /// Age of the snapshot decisions are served from.
    pub snapshot_age: Gauge,
    /// 1 when the last refresh failed.
    pub snapshot_stale: IntGauge,
    /// Tenant x context x candidate cells in the snapshot.
    pub snapshot_cells: IntGauge,
    /// Tenants whose aggregates filled `--max-cells` at the last read (cells past it are
    /// not served: their candidates fall back to the priors).
    pub snapshot_tenants_at_cell_limit: IntGauge,
    /// Arms dropped from a tenant's contextual model to stay within `--max-arms`.
    pub model_arms_evicted: IntCounter,
    /// Feedback not learnt at once because its tenant's pending list was full (it counts
    /// from the refresh that reads it stored).
    pub model_learn_deferred: IntCounter,
    /// Seconds since the contextual model's last full rebuild was installed (or the start).
    pub model_age: Gauge,
    /// Rows learnt so far by the full rebuild under way (0 when none is).
    pub rebuild_rows: IntGauge,
    /// Refreshes that ended with the full rebuild unfinished (it resumes at the next).
    pub rebuild_resumed: IntCounter,
    /// Refreshes whose step of the full rebuild failed (what it learnt stays).
    pub rebuild_errors: IntCounter,
    /// Refreshes whose contextual model part failed or ran out of time (the new rows or
    /// the rebuild's step): the aggregates read were served all the same.
    pub model_errors: IntCounter,
    /// Posterior memo hits.
    pub memo_hits: IntCounter,
    /// Posterior memo misses.
    pub memo_misses: IntCounter,
    /// Outcomes learnt by the contextual model from this router's own feedback, at once.
    pub learned_now: IntCounter,
    /// Decision-feedback rows read from ClickHouse by the refresh.
    pub refresh_rows: IntCounter,
    /// CPU seconds of this process.
    pub cpu: Counter,
    /// Server-side decision time.
    pub decision_seconds: Histogram,
}

impl Default for RouterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A float metric (the registry's constructors build integer ones), registered.
fn float<T: Collector + Clone + 'static>(
    r: &MetricsRegistry,
    name: &str,
    help: &str,
    new: fn(&str, &str) -> weft_http::prometheus::Result<T>,
) -> T {
    // Names are constants, valid and unique (the unit test below renders them all).
    r.register(new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}")))
}

impl RouterMetrics {
    /// Every metric at zero, in a registry of its own.
    pub fn new() -> Self {
        let r = MetricsRegistry::new();
        let c = |n: &str, h: &str| r.counter(n, h);
        RouterMetrics {
            decisions: c("weft_router_decisions_total", "Decisions returned."),
            no_fit: c(
                "weft_router_no_fit_total",
                "Requests where no candidate met the constraints.",
            ),
            rejected: c(
                "weft_router_rejected_total",
                "Requests refused (auth, bad input).",
            ),
            feedback: c("weft_router_feedback_total", "Feedback events accepted."),
            publish_errors: c(
                "weft_router_publish_errors_total",
                "Decisions or feedback that could not be published.",
            ),
            refresh_ok: c(
                "weft_router_snapshot_refresh_total",
                "Successful snapshot refreshes.",
            ),
            refresh_errors: c(
                "weft_router_snapshot_refresh_errors_total",
                "Failed snapshot refreshes.",
            ),
            snapshot_age: float(
                &r,
                "weft_router_snapshot_age_seconds",
                "Age of the snapshot decisions are served from.",
                |n, h| Gauge::new(n, h),
            ),
            snapshot_stale: r.gauge(
                "weft_router_snapshot_stale",
                "1 when the last refresh failed.",
            ),
            snapshot_cells: r.gauge(
                "weft_router_snapshot_cells",
                "Tenant x context x candidate cells in the snapshot.",
            ),
            snapshot_tenants_at_cell_limit: r.gauge(
                "weft_router_snapshot_tenants_at_cell_limit",
                "Tenants whose aggregates filled --max-cells at the last read (the least evidenced cells past it are not served).",
            ),
            model_arms_evicted: c(
                "weft_router_model_arms_evicted_total",
                "Arms dropped from a tenant's contextual model to stay within --max-arms (a full rebuild counts its own again).",
            ),
            model_learn_deferred: c(
                "weft_router_model_learn_deferred_total",
                "Feedback not learnt at once because its tenant's 100,000 pending outcomes were full (it counts from the refresh that reads it stored).",
            ),
            model_age: float(
                &r,
                "weft_router_model_age_seconds",
                "Seconds since the contextual model's last full rebuild was installed (or the start).",
                |n, h| Gauge::new(n, h),
            ),
            rebuild_rows: r.gauge(
                "weft_router_model_rebuild_rows",
                "Rows learnt so far by the full rebuild under way (0 when none is).",
            ),
            rebuild_resumed: c(
                "weft_router_model_rebuild_resumed_total",
                "Refreshes that ended with the full rebuild unfinished (it resumes at the next).",
            ),
            rebuild_errors: c(
                "weft_router_model_rebuild_errors_total",
                "Refreshes whose step of the full rebuild failed (what it learnt stays).",
            ),
            model_errors: c(
                "weft_router_model_refresh_errors_total",
                "Refreshes whose contextual model part failed or ran out of time (the aggregates read were served all the same).",
            ),
            memo_hits: c(
                "weft_router_posterior_memo_hits_total",
                "Decisions whose posterior counts were memoised.",
            ),
            memo_misses: c(
                "weft_router_posterior_memo_misses_total",
                "Posterior states drawn afresh.",
            ),
            learned_now: c(
                "weft_router_model_learned_now_total",
                "Outcomes the contextual model learnt from this router's feedback at once.",
            ),
            refresh_rows: c(
                "weft_router_model_refresh_rows_total",
                "Decision-feedback rows the refresh read from ClickHouse.",
            ),
            cpu: float(
                &r,
                "process_cpu_seconds_total",
                "User and system CPU time of this process.",
                |n, h| Counter::new(n, h),
            ),
            decision_seconds: r.histogram(
                "weft_router_decision_seconds",
                "Server-side decision time.",
                BUCKETS_S.to_vec(),
            ),
            registry: r,
        }
    }

    /// Set a counter that mirrors a value counted elsewhere.
    pub fn mirror(c: &IntCounter, value: u64) {
        let now = c.get();
        if value > now {
            c.inc_by(value - now);
        }
    }

    /// The Prometheus text exposition.
    pub fn text(&self) -> String {
        if let Some(cpu) = weft_http::cpu::process_cpu_seconds() {
            let now = self.cpu.get();
            if cpu > now {
                self.cpu.inc_by(cpu - now);
            }
        }
        self.registry.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_shown_under_its_old_name() {
        let m = RouterMetrics::new();
        m.decisions.inc();
        m.decision_seconds.observe(0.0003);
        m.snapshot_stale.set(1);
        let t = m.text();
        for name in [
            "weft_router_decisions_total 1",
            "weft_router_no_fit_total 0",
            "weft_router_rejected_total 0",
            "weft_router_feedback_total 0",
            "weft_router_publish_errors_total 0",
            "weft_router_snapshot_refresh_total 0",
            "weft_router_snapshot_refresh_errors_total 0",
            "weft_router_snapshot_age_seconds",
            "weft_router_snapshot_stale 1",
            "weft_router_snapshot_cells 0",
            "weft_router_snapshot_tenants_at_cell_limit 0",
            "weft_router_model_arms_evicted_total 0",
            "weft_router_model_learn_deferred_total 0",
            "weft_router_model_age_seconds",
            "weft_router_model_rebuild_rows 0",
            "weft_router_model_rebuild_resumed_total 0",
            "weft_router_model_rebuild_errors_total 0",
            "weft_router_model_refresh_errors_total 0",
            "weft_router_posterior_memo_hits_total 0",
            "weft_router_posterior_memo_misses_total 0",
            "process_cpu_seconds_total",
            "weft_router_decision_seconds_bucket{le=\"0.0005\"} 1",
            "weft_router_decision_seconds_bucket{le=\"+Inf\"} 1",
            "weft_router_decision_seconds_count 1",
        ] {
            assert!(t.contains(name), "{name} missing in\n{t}");
        }
    }
}
