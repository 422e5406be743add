//! The router's `/metrics`, through the `prometheus` crate (names as before: the Grafana
//! dashboards in `dashboards/` read them).

use prometheus::{
    Counter, Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Registry, TextEncoder,
};

/// Decision-time histogram buckets (seconds).
const BUCKETS_S: [f64; 7] = [50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3];

/// Every metric the router shows.
pub struct RouterMetrics {
    registry: Registry,
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

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: T) -> T {
    // Names are constants, unique in this registry: registration cannot fail at run time
    // (the unit test below registers them all).
    let _ = r.register(Box::new(m.clone()));
    m
}

fn int_counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    reg(
        r,
        IntCounter::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}")),
    )
}

fn int_gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    reg(
        r,
        IntGauge::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}")),
    )
}

impl Default for RouterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RouterMetrics {
    /// Every metric at zero, in a registry of its own.
    pub fn new() -> Self {
        let r = Registry::new();
        let c = |n: &str, h: &str| int_counter(&r, n, h);
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
            snapshot_age: reg(
                &r,
                Gauge::new(
                    "weft_router_snapshot_age_seconds",
                    "Age of the snapshot decisions are served from.",
                )
                .unwrap_or_else(|e| panic!("metric: {e}")),
            ),
            snapshot_stale: int_gauge(
                &r,
                "weft_router_snapshot_stale",
                "1 when the last refresh failed.",
            ),
            snapshot_cells: int_gauge(
                &r,
                "weft_router_snapshot_cells",
                "Tenant x context x candidate cells in the snapshot.",
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
            cpu: reg(
                &r,
                Counter::new(
                    "process_cpu_seconds_total",
                    "User and system CPU time of this process.",
                )
                .unwrap_or_else(|e| panic!("metric: {e}")),
            ),
            decision_seconds: reg(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "weft_router_decision_seconds",
                        "Server-side decision time.",
                    )
                    .buckets(BUCKETS_S.to_vec()),
                )
                .unwrap_or_else(|e| panic!("metric: {e}")),
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
        if let Some(cpu) = process_cpu_seconds() {
            let now = self.cpu.get();
            if cpu > now {
                self.cpu.inc_by(cpu - now);
            }
        }
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for these metric types.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// CPU seconds (user + system) this process has used, from `/proc/self/stat`; `None` where
/// there is no procfs. `weft bench route` divides decisions by it: decisions per core.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name (which may hold spaces): utime and stime
    // are the 12th and 13th of those, in clock ticks.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) / ticks as f64)
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

    #[test]
    fn cpu_seconds_grow_with_work() {
        let before = process_cpu_seconds().expect("procfs on Linux");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = process_cpu_seconds().expect("procfs on Linux");
        assert!(after > before, "{before} -> {after}");
    }
}
