//! Ingest telemetry in ClickHouse (migration 0006): per-flush batch figures, dead letters and
//! consumer lag, so the pipeline-operations dashboard needs no Prometheus.
//!
//! Why best effort: these rows describe ingest, they are not audit facts. The ingest loop and
//! the lag thread hand samples to a bounded channel with `try_send` (never waiting); one task
//! inserts them about once a second. A full channel, a missing table or a failed insert drops
//! the samples, logs a warning and counts them (`weft_ingest_telemetry_dropped_total`), and
//! nothing is retried, so telemetry never holds an offset or slows a flush.

use std::sync::Arc;
use std::time::Duration;

use clickhouse::Row;
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::{info, warn};
pub use weft_store::telemetry::{BatchRow, DeadLetterRow, LagRow, BATCHES, DEAD_LETTERS, LAG};
use weft_store::{check_columns, insert, Store};

use crate::metrics::IngestMetrics;

/// Samples waiting for the writer; beyond this many, new ones are dropped (and counted).
const QUEUE: usize = 8_192;
/// How often the writer inserts what it has collected.
const EVERY: Duration = Duration::from_secs(1);

/// A telemetry sample on its way to ClickHouse.
#[derive(Debug)]
pub enum Sample {
    /// Per-partition flush figures, for `weft_ingest_batches`.
    Batch(BatchRow),
    /// An acknowledged dead letter, for `weft_dead_letters`.
    DeadLetter(DeadLetterRow),
    /// A lag sample, for `weft_ingest_lag`.
    Lag(LagRow),
}

impl Sample {
    fn table(&self) -> &'static str {
        match self {
            Sample::Batch(_) => BATCHES,
            Sample::DeadLetter(_) => DEAD_LETTERS,
            Sample::Lag(_) => LAG,
        }
    }
}

/// The sending side, cheap to clone; usable from async code and plain threads alike.
#[derive(Clone)]
pub struct Telemetry {
    tx: Option<mpsc::Sender<Sample>>,
    /// Per table (batches, dead letters, lag): whether it exists with the expected columns.
    enabled: [bool; 3],
    metrics: Arc<IngestMetrics>,
}

impl Telemetry {
    /// A sink that drops everything silently (telemetry switched off, and in unit tests).
    pub fn disabled(metrics: Arc<IngestMetrics>) -> Self {
        Self {
            tx: None,
            enabled: [false; 3],
            metrics,
        }
    }

    /// Check which telemetry tables exist with the expected columns and start the writer
    /// task. A missing or outdated table only warns: an older schema keeps ingesting, and
    /// that table's samples are dropped.
    pub async fn start(store: Store, metrics: Arc<IngestMetrics>) -> Self {
        let mut enabled = [true; 3];
        for (i, (table, check)) in [
            (BATCHES, check_columns::<BatchRow>(&store, BATCHES).await),
            (
                DEAD_LETTERS,
                check_columns::<DeadLetterRow>(&store, DEAD_LETTERS).await,
            ),
            (LAG, check_columns::<LagRow>(&store, LAG).await),
        ]
        .into_iter()
        .enumerate()
        {
            if let Err(e) = check {
                warn!(table, error = %e, "telemetry table unusable (run `weft migrate`); its samples are dropped");
                enabled[i] = false;
            }
        }
        if enabled.iter().all(|e| !e) {
            return Self {
                enabled,
                ..Self::disabled(metrics)
            };
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write_loop(store, metrics.clone(), rx, enabled));
        info!("ingest telemetry is written to ClickHouse");
        Self {
            tx: Some(tx),
            enabled,
            metrics,
        }
    }

    /// Queue a sample without waiting; when the queue is full or its table is unusable it
    /// is dropped and counted.
    pub fn record(&self, sample: Sample) {
        let Some(tx) = &self.tx else { return };
        let table = sample.table();
        let on = match &sample {
            Sample::Batch(_) => self.enabled[0],
            Sample::DeadLetter(_) => self.enabled[1],
            Sample::Lag(_) => self.enabled[2],
        };
        if !on || tx.try_send(sample).is_err() {
            self.metrics
                .telemetry_dropped
                .with_label_values(&[table])
                .inc();
        }
    }
}

/// Collects samples and inserts them per table about once a second, and once more when
/// every sender is gone (ingest stopped).
async fn write_loop(
    store: Store,
    metrics: Arc<IngestMetrics>,
    mut rx: mpsc::Receiver<Sample>,
    enabled: [bool; 3],
) {
    let mut batches = Vec::new();
    let mut dead = Vec::new();
    let mut lag = Vec::new();
    let mut tick = tokio::time::interval(EVERY);
    loop {
        let (flush, open) = tokio::select! {
            s = rx.recv() => match s {
                Some(Sample::Batch(r)) => { batches.push(r); (false, true) }
                Some(Sample::DeadLetter(r)) => { dead.push(r); (false, true) }
                Some(Sample::Lag(r)) => { lag.push(r); (false, true) }
                None => (true, false),
            },
            _ = tick.tick() => (true, true),
        };
        // On the tick, when ingest stopped, or early when a lot piled up.
        if flush || batches.len() + dead.len() + lag.len() >= QUEUE {
            write(&store, &metrics, BATCHES, enabled[0], &mut batches).await;
            write(&store, &metrics, DEAD_LETTERS, enabled[1], &mut dead).await;
            write(&store, &metrics, LAG, enabled[2], &mut lag).await;
        }
        if !open {
            return;
        }
    }
}

/// Insert one table's rows, once; on failure drop them, warn and count.
async fn write<T>(store: &Store, metrics: &IngestMetrics, table: &str, on: bool, rows: &mut Vec<T>)
where
    T: Serialize + for<'a> Row<Value<'a> = T> + clickhouse::RowWrite,
{
    if rows.is_empty() {
        return;
    }
    let n = rows.len() as u64;
    if !on {
        metrics
            .telemetry_dropped
            .with_label_values(&[table])
            .inc_by(n);
    } else if let Err(e) = insert::<T>(store, table, rows).await {
        warn!(table, rows = n, error = %e, "telemetry insert failed; dropping these samples");
        metrics
            .telemetry_dropped
            .with_label_values(&[table])
            .inc_by(n);
    }
    rows.clear();
}
