//! The writer against a fake sink: batching, the full queue, retries, the shutdown flush.

use std::sync::atomic::AtomicU32;
use std::sync::Mutex;

use serde_json::json;
use tokio::sync::{Notify, Semaphore};

use super::*;

/// Records each insert; may hold inserts until released, and fail the first ones.
#[derive(Clone)]
struct Fake {
    inserts: Arc<Mutex<Vec<Vec<LogRow>>>>,
    attempts: Arc<AtomicU32>,
    fail_first: u32,
    gate: Arc<Semaphore>,
    inserted: Arc<Notify>,
    /// The token of every attempt, in order.
    tokens: Arc<Mutex<Vec<String>>>,
}

impl Fake {
    fn new(fail_first: u32, open: bool) -> Self {
        Self {
            inserts: Default::default(),
            attempts: Default::default(),
            fail_first,
            gate: Arc::new(Semaphore::new(if open {
                Semaphore::MAX_PERMITS
            } else {
                0
            })),
            inserted: Default::default(),
            tokens: Default::default(),
        }
    }

    fn batches(&self) -> Vec<Vec<LogRow>> {
        self.inserts.lock().expect("fake sink lock").clone()
    }

    /// Wait (bounded) until `n` inserts succeeded.
    async fn wait_for_inserts(&self, n: usize) {
        let wait = async {
            loop {
                let notified = self.inserted.notified();
                if self.batches().len() >= n {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .expect("the inserts never came");
    }
}

impl Sink for Fake {
    async fn insert(&self, rows: &[LogRow], token: &str) -> Result<(), AuditError> {
        self.tokens
            .lock()
            .expect("fake sink lock")
            .push(token.to_owned());
        let attempt = self.attempts.fetch_add(1, Ordering::SeqCst);
        let _permit = self.gate.acquire().await.expect("gate open");
        if attempt < self.fail_first {
            return Err(AuditError::Invalid(format!("attempt {attempt} fails")));
        }
        self.inserts
            .lock()
            .expect("fake sink lock")
            .push(rows.to_vec());
        self.inserted.notify_waiters();
        Ok(())
    }
}

fn opt(capacity: usize, max_batch: usize) -> WriterOptions {
    WriterOptions {
        capacity,
        max_batch,
        flush_every: Duration::from_millis(50),
        retries: 2,
        retry_backoff: Duration::from_millis(1),
    }
}

fn log_n(log: &AuditLog, n: u64) {
    for i in 0..n {
        log.record(
            "acme",
            "key:0123",
            "refused_tenant_forbidden",
            &json!({"i": i}),
            0,
        );
    }
}

fn queries(batch: &[LogRow]) -> Vec<String> {
    batch.iter().map(|r| r.query.clone()).collect()
}

fn numbered(n: u64) -> Vec<String> {
    (0..n).map(|i| json!({"i": i}).to_string()).collect()
}

#[tokio::test]
async fn many_rows_are_one_insert_a_second() {
    let (fake, metrics) = (Fake::new(0, true), Arc::new(AuditMetrics::default()));
    let (log, flusher) = AuditLog::spawn(fake.clone(), metrics.clone(), opt(10_000, 5_000));
    log_n(&log, 300);
    // One runtime thread: the writer runs only once this task waits, with every row
    // queued, and a tick writes them together.
    fake.wait_for_inserts(1).await;
    log_n(&log, 200);
    fake.wait_for_inserts(2).await;
    flusher.shutdown().await;
    let b = fake.batches();
    assert_eq!(b.len(), 2, "one insert per tick");
    assert_eq!(queries(&b[0]), numbered(300), "every row, in order");
    assert_eq!(queries(&b[1]), numbered(200));
    assert_eq!(metrics.log_inserts.get(), 2);
    assert_eq!(metrics.log_rows_written.get(), 500);
    assert_eq!(metrics.log_rows_dropped.get(), 0);
}

#[tokio::test]
async fn a_full_batch_is_written_at_once_and_shutdown_writes_the_rest() {
    let fake = Fake::new(0, true);
    let metrics = Arc::new(AuditMetrics::default());
    let mut o = opt(10_000, 100);
    o.flush_every = Duration::from_secs(3600);
    let (log, flusher) = AuditLog::spawn(fake.clone(), metrics.clone(), o);
    log_n(&log, 250);
    // Two full batches go at once, without waiting for the (hour-long) tick.
    fake.wait_for_inserts(2).await;
    flusher.shutdown().await;
    let written: Vec<String> = fake
        .batches()
        .concat()
        .iter()
        .map(|r| r.query.clone())
        .collect();
    assert_eq!(
        written,
        numbered(250),
        "every row once, the rest by the shutdown"
    );
    assert!(fake.batches().iter().all(|b| b.len() <= 100));
    let mut tokens = fake.tokens.lock().expect("fake sink lock").clone();
    let n = tokens.len();
    tokens.dedup();
    assert_eq!((n, tokens.len()), (3, 3), "one token per batch: {tokens:?}");
    // After shutdown, a row is dropped and counted, not queued forever.
    log_n(&log, 1);
    assert_eq!(metrics.log_rows_dropped.get(), 1);
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_instead_of_growing() {
    // The sink holds every insert: nothing leaves the queue but the first batch.
    let fake = Fake::new(0, false);
    let metrics = Arc::new(AuditMetrics::default());
    let (log, flusher) = AuditLog::spawn(fake.clone(), metrics.clone(), opt(10, 5));
    // A single-threaded runtime: the writer does not run until this task yields, so the
    // queue holds exactly its capacity.
    log_n(&log, 100);
    assert_eq!(metrics.log_rows_dropped.get(), 90);
    // The writer takes one batch and blocks in the sink; the queue refills to capacity and
    // everything past it is dropped.
    while fake.attempts.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    log_n(&log, 100);
    assert_eq!(metrics.log_rows_dropped.get(), 90 + 95);
    fake.gate.add_permits(Semaphore::MAX_PERMITS);
    flusher.shutdown().await;
    let written: usize = fake.batches().iter().map(Vec::len).sum();
    assert_eq!(written, 15, "5 in the first batch, then the 10 queued");
    assert_eq!(metrics.log_rows_written.get(), 15);
}

#[tokio::test]
async fn a_failed_batch_is_retried_a_bounded_number_of_times() {
    // Fails twice, then succeeds: written once, nothing lost.
    let fake = Fake::new(2, true);
    let metrics = Arc::new(AuditMetrics::default());
    let (log, flusher) = AuditLog::spawn(fake.clone(), metrics.clone(), opt(100, 100));
    log_n(&log, 7);
    flusher.shutdown().await;
    assert_eq!(fake.attempts.load(Ordering::SeqCst), 3);
    assert_eq!(fake.batches().len(), 1);
    assert_eq!(metrics.log_rows_written.get(), 7);
    assert_eq!(metrics.log_write_failures.get(), 0);
    // Every attempt at the batch carries its token: one whose answer was lost may have
    // landed, and ClickHouse drops a second insert with the same token.
    let tokens = fake.tokens.lock().expect("fake sink lock").clone();
    assert_eq!(tokens.len(), 3);
    assert!(tokens.iter().all(|t| *t == tokens[0]), "{tokens:?}");

    // Fails more often than it is retried: given up after 1 + 2 attempts, rows counted.
    let fake = Fake::new(u32::MAX, true);
    let metrics = Arc::new(AuditMetrics::default());
    let (log, flusher) = AuditLog::spawn(fake.clone(), metrics.clone(), opt(100, 100));
    log_n(&log, 7);
    flusher.shutdown().await;
    assert_eq!(fake.attempts.load(Ordering::SeqCst), 3);
    assert_eq!(metrics.log_write_failures.get(), 7);
    assert_eq!(metrics.log_rows_written.get(), 0);
}
