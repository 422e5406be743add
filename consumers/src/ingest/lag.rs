//! The lag monitor.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::Consumer;
use tokio::sync::watch;

use super::now_micros;
use crate::metrics::IngestMetrics;
use crate::telemetry::{LagRow, Sample, Telemetry};

/// Consumer lag from watermarks and stored positions, on its own thread: watermark requests
/// block, and while Kafka is down they time out, which must never stall the ingest loop.
/// Each sample goes to the gauge and (best effort, without waiting) to `weft_ingest_lag`.
pub(super) fn spawn_lag_monitor(
    brokers: ClientConfig,
    positions: Arc<std::sync::Mutex<BTreeMap<(String, i32), i64>>>,
    metrics: Arc<IngestMetrics>,
    telemetry: Telemetry,
    stop: watch::Receiver<bool>,
) {
    std::thread::spawn(move || {
        let client: Result<rdkafka::consumer::BaseConsumer, _> = brokers.create();
        let Ok(client) = client else { return };
        // The partitions whose lag the gauge shows: one this process no longer reads (a
        // rebalance took it) leaves the gauge instead of freezing there.
        let mut shown: BTreeSet<(String, i32)> = BTreeSet::new();
        while !*stop.borrow() {
            let snapshot: Vec<((String, i32), i64)> = positions
                .lock()
                .map(|p| p.iter().map(|(k, v)| (k.clone(), *v)).collect())
                .unwrap_or_default();
            let now: BTreeSet<(String, i32)> = snapshot.iter().map(|(k, _)| k.clone()).collect();
            for (topic, partition) in shown.difference(&now) {
                let _ = metrics
                    .lag
                    .remove_label_values(&[topic, &partition.to_string()]);
            }
            shown = now;
            for ((topic, partition), next) in snapshot {
                if let Ok((_, high)) =
                    client.fetch_watermarks(&topic, partition, Duration::from_secs(2))
                {
                    let lag = (high - next).max(0);
                    metrics
                        .lag
                        .with_label_values(&[&topic, &partition.to_string()])
                        .set(lag);
                    telemetry.record(Sample::Lag(LagRow {
                        at: now_micros(),
                        topic,
                        partition,
                        next_offset: next,
                        high_watermark: high,
                        lag,
                    }));
                }
            }
            std::thread::sleep(Duration::from_secs(5));
        }
    });
}
