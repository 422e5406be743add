//! `GET /metrics` of `weft audit serve`: what an operator alerts on. Totals only, no tenant
//! label: the route is open, like every weft service's `/metrics`, and tenants' names are
//! not for everyone.

use weft_http::prometheus::{IntCounter, IntCounterVec, IntGauge};
use weft_http::MetricsRegistry;

/// The audit API's metrics.
#[derive(Debug, Clone)]
pub struct AuditMetrics {
    registry: MetricsRegistry,
    /// Requests refused before any read, by code (`missing_api_key`, `tenant_forbidden`, ...).
    pub refused: IntCounterVec,
    /// Rows of `weft_audit_log` that could not be written (the read was answered; its record
    /// is only in the log line).
    pub log_write_failures: IntCounter,
    /// Rows of `weft_audit_log` dropped because the writer's queue was full (the read was
    /// answered and its log line written; its row was not queued).
    pub log_rows_dropped: IntCounter,
    /// Inserts into `weft_audit_log` (each one batch of rows, one part).
    pub log_inserts: IntCounter,
    /// Rows written to `weft_audit_log`.
    pub log_rows_written: IntCounter,
    /// Rounds of the sealing loop.
    pub seal_rounds: IntCounter,
    /// Rounds of the sealing loop that failed for at least one tenant.
    pub seal_failures: IntCounter,
    /// Rows the last round left unsealed because they disagree with their payload or repeat
    /// another (run `weft audit verify`): should stay 0.
    pub seal_rows_held: IntGauge,
    /// Unix time of the last round that sealed every tenant (0: none yet).
    pub seal_last_success: IntGauge,
}

impl Default for AuditMetrics {
    fn default() -> Self {
        let r = MetricsRegistry::new();
        Self {
            refused: r.counter_vec(
                "weft_audit_refused_total",
                "Audit API requests refused before any read, by code",
                &["code"],
            ),
            log_write_failures: r.counter(
                "weft_audit_log_write_failures_total",
                "weft_audit_log rows that could not be written",
            ),
            log_rows_dropped: r.counter(
                "weft_audit_log_rows_dropped_total",
                "weft_audit_log rows dropped because the writer's queue was full",
            ),
            log_inserts: r.counter(
                "weft_audit_log_inserts_total",
                "Inserts into weft_audit_log (one batch of rows each)",
            ),
            log_rows_written: r.counter(
                "weft_audit_log_rows_written_total",
                "Rows written to weft_audit_log",
            ),
            seal_rounds: r.counter("weft_audit_seal_rounds_total", "Rounds of the sealing loop"),
            seal_failures: r.counter(
                "weft_audit_seal_failures_total",
                "Rounds of the sealing loop that failed for at least one tenant",
            ),
            seal_rows_held: r.gauge(
                "weft_audit_seal_rows_held",
                "Rows the last sealing round left unsealed (they disagree with their payload)",
            ),
            seal_last_success: r.gauge(
                "weft_audit_seal_last_success_seconds",
                "Unix time of the last sealing round that sealed every tenant",
            ),
            registry: r,
        }
    }
}

impl AuditMetrics {
    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        self.registry.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_renders() {
        let m = AuditMetrics::default();
        m.refused.with_label_values(&["tenant_forbidden"]).inc();
        let text = m.render();
        for name in [
            "weft_audit_refused_total",
            "weft_audit_log_write_failures_total",
            "weft_audit_log_rows_dropped_total",
            "weft_audit_log_inserts_total",
            "weft_audit_log_rows_written_total",
            "weft_audit_seal_rounds_total",
            "weft_audit_seal_failures_total",
            "weft_audit_seal_rows_held",
            "weft_audit_seal_last_success_seconds",
        ] {
            assert!(text.contains(name), "{name} missing:\n{text}");
        }
    }
}
