//! The audit API's writer of `weft_audit_log`: one background task behind a bounded queue.
//!
//! A request's row is queued without waiting ([`AuditLog::record`]); the task inserts what
//! is queued as one insert every [`WriterOptions::flush_every`], or as soon as
//! [`WriterOptions::max_batch`] rows wait, and retries a failed batch a bounded number of
//! times. So a flood of cheap requests (refusals are logged too) costs one queue slot each
//! and an insert a second, never a task and a part per request. A row that finds the queue
//! full is dropped and counted (`weft_audit_log_rows_dropped_total`), with a warning at most
//! every [`DROP_WARN_EVERY`]; its `tracing` event was already emitted. On shutdown
//! ([`LogFlusher::shutdown`]) what is queued is written before the process ends.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::LogRow;
use crate::metrics::AuditMetrics;
use crate::{AuditError, Store};

/// The least time between two warnings about dropped rows.
pub const DROP_WARN_EVERY: Duration = Duration::from_secs(10);

/// Where a batch of rows goes: `weft_audit_log` ([`Store`]), or a fake in unit tests.
pub trait Sink: Send + Sync + 'static {
    /// Insert `rows` as one insert. Every attempt at one batch carries the same `token`, and
    /// the sink writes a token's rows at most once: an attempt whose answer was lost may
    /// have landed.
    fn insert<'a>(
        &'a self,
        rows: &'a [LogRow],
        token: &'a str,
    ) -> impl Future<Output = Result<(), AuditError>> + Send + 'a;
}

impl Sink for Store {
    fn insert<'a>(
        &'a self,
        rows: &'a [LogRow],
        token: &'a str,
    ) -> impl Future<Output = Result<(), AuditError>> + Send + 'a {
        super::insert(self, rows, Some(token))
    }
}

/// How the writer batches and retries.
#[derive(Debug, Clone, Copy)]
pub struct WriterOptions {
    /// Rows the queue holds; one more is dropped and counted.
    pub capacity: usize,
    /// Rows of one insert at most; a full batch is written at once.
    pub max_batch: usize,
    /// The longest a queued row waits for its insert.
    pub flush_every: Duration,
    /// Attempts after the first of a batch that failed; then its rows are counted in
    /// `weft_audit_log_write_failures_total` and dropped.
    pub retries: u32,
    /// The wait before the first retry, doubled before each next one.
    pub retry_backoff: Duration,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            capacity: 10_000,
            max_batch: 5_000,
            flush_every: Duration::from_secs(1),
            retries: 3,
            retry_backoff: Duration::from_millis(250),
        }
    }
}

/// The handle requests log through: cheap to clone, never waits.
#[derive(Debug, Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<LogRow>,
    metrics: Arc<AuditMetrics>,
    drops: Arc<DropWarnings>,
}

/// Rate-limits the warning about dropped rows.
#[derive(Debug)]
struct DropWarnings {
    start: Instant,
    /// Milliseconds after `start` of the last warning, plus one (0: never warned).
    last_ms: AtomicU64,
    /// Rows dropped since the last warning.
    since: AtomicU64,
}

/// Ends the writer: [`LogFlusher::shutdown`] writes what is queued and waits for it.
#[derive(Debug)]
pub struct LogFlusher {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl LogFlusher {
    /// Stop taking rows, write every row queued (with the usual retries), and return once
    /// they are written or given up.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the audit-log writer task failed");
        }
    }
}

impl AuditLog {
    /// Start the writer task on the current runtime, writing to `sink`.
    pub fn spawn<S: Sink>(
        sink: S,
        metrics: Arc<AuditMetrics>,
        opt: WriterOptions,
    ) -> (Self, LogFlusher) {
        let (tx, rx) = mpsc::channel(opt.capacity.max(1));
        let (stop, stopped) = oneshot::channel();
        let span = tracing::info_span!("audit_log_writer");
        let task = tokio::spawn(run(sink, rx, stopped, metrics.clone(), opt).instrument(span));
        let drops = Arc::new(DropWarnings {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            since: AtomicU64::new(0),
        });
        (Self { tx, metrics, drops }, LogFlusher { stop, task })
    }

    /// Log one read: its `tracing` event now, its row queued for the writer (or, when the
    /// queue is full or the writer stopped, dropped and counted).
    pub fn record(
        &self,
        tenant: &str,
        actor: &str,
        action: &str,
        query: &serde_json::Value,
        results: u64,
    ) {
        let row = LogRow::new(tenant, actor, action, query, results);
        if self.tx.try_send(row).is_err() {
            self.dropped();
        }
    }

    fn dropped(&self) {
        self.metrics.log_rows_dropped.inc();
        let d = &self.drops;
        let since = d.since.fetch_add(1, Ordering::Relaxed) + 1;
        let now = d.start.elapsed().as_millis() as u64 + 1;
        let last = d.last_ms.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= DROP_WARN_EVERY.as_millis() as u64;
        if due
            && d.last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            d.since.fetch_sub(since, Ordering::Relaxed);
            tracing::warn!(
                dropped = since,
                "weft_audit_log queue full: rows dropped (each read's log line was still written; see weft_audit_log_rows_dropped_total)"
            );
        }
    }
}

async fn run<S: Sink>(
    sink: S,
    mut rx: mpsc::Receiver<LogRow>,
    mut stopped: oneshot::Receiver<()>,
    metrics: Arc<AuditMetrics>,
    opt: WriterOptions,
) {
    let max_batch = opt.max_batch.max(1);
    let mut tokens = Tokens::new();
    let mut batch: Vec<LogRow> = Vec::with_capacity(max_batch.min(opt.capacity.max(1)));
    let mut tick = tokio::time::interval(opt.flush_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            row = rx.recv() => match row {
                Some(row) => {
                    batch.push(row);
                    if batch.len() >= max_batch {
                        flush(&sink, &mut batch, tokens.next(), &metrics, &opt).await;
                    }
                }
                // Every handle is gone: nothing more can come.
                None => break,
            },
            _ = tick.tick() => flush(&sink, &mut batch, tokens.next(), &metrics, &opt).await,
        }
    }
    // Shutdown: no new rows; write those queued.
    rx.close();
    while let Some(row) = rx.recv().await {
        batch.push(row);
        if batch.len() >= max_batch {
            flush(&sink, &mut batch, tokens.next(), &metrics, &opt).await;
        }
    }
    flush(&sink, &mut batch, tokens.next(), &metrics, &opt).await;
}

/// Names for batches, one per batch and unlike any other writer's: the process id, when the
/// writer started, and a count.
struct Tokens {
    prefix: String,
    n: u64,
}

impl Tokens {
    fn new() -> Self {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        Tokens {
            prefix: format!("weft-audit-{}-{started}", std::process::id()),
            n: 0,
        }
    }

    fn next(&mut self) -> String {
        self.n += 1;
        format!("{}-{}", self.prefix, self.n)
    }
}

/// Insert `batch` as one insert named `token`, retrying; empty afterwards either way.
async fn flush<S: Sink>(
    sink: &S,
    batch: &mut Vec<LogRow>,
    token: String,
    metrics: &AuditMetrics,
    opt: &WriterOptions,
) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len() as u64;
    let mut wait = opt.retry_backoff;
    for attempt in 0..=opt.retries {
        match sink.insert(batch, &token).await {
            Ok(()) => {
                metrics.log_inserts.inc();
                metrics.log_rows_written.inc_by(n);
                batch.clear();
                return;
            }
            Err(e) if attempt < opt.retries => {
                tracing::warn!(error = %e, rows = n, attempt, "weft_audit_log insert failed; retrying");
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2);
            }
            Err(e) => {
                metrics.log_write_failures.inc_by(n);
                tracing::error!(error = %e, rows = n, "weft_audit_log insert failed for good: rows lost (their log lines remain)");
            }
        }
    }
    batch.clear();
}

#[cfg(test)]
mod tests;
