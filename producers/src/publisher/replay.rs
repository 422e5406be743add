//! The replayer thread: spooled records back to Kafka, in order, batch by batch.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::BaseRecord;
use tracing::{debug, error, warn};

use super::delivery::Pending;
use super::owned_headers;
use super::state::{lock, read, Kafka, Shared};
use crate::spool::{ReadBatch, SpoolRecord};

/// The replayer: send spooled records in order, commit the cursor per acknowledged batch.
pub(super) fn replayer_loop(sh: Arc<Shared>, batch: usize, timeout: Duration) {
    let mut backoff = Duration::from_millis(250);
    // Halved after a failed round (a slow broker may not ack a big batch within
    // message.timeout.ms), doubled back after each success.
    let mut size = batch;
    while !sh.shutdown.load(Ordering::SeqCst) {
        sh.replace_producer_if_tainted();
        {
            let mut st = lock(&sh.state);
            sh.maybe_resume_direct(&mut st);
        }
        let (batch_read, last) = {
            let mut sp = lock(&sh.spool);
            if sp.unread() == 0 {
                let _ = sh.wake.wait_timeout(sp, Duration::from_millis(200));
                continue;
            }
            let r = sp.read_batch(size);
            (r, sp.unread() == 0)
        };
        if last && batch_read.is_ok() {
            // The spool's last batch: hold new events in memory until it is acknowledged.
            let mut st = lock(&sh.state);
            if st.spooling {
                st.handover = true;
            }
        }
        let b = match batch_read {
            Ok(b) => b,
            Err(e) => {
                error!(error = %e, "reading the spool failed; retrying");
                lock(&sh.spool).rewind();
                std::thread::sleep(backoff);
                continue;
            }
        };
        let n = b.records.len();
        if n == 0 {
            continue;
        }
        let (tx, rx) = mpsc::channel();
        let guard = read(&sh.producer);
        let Some(producer) = guard.as_ref() else {
            break;
        };
        let (sent, mut failed) = send_batch(producer, &b.records, &tx);
        drop(guard);
        drop(tx);
        if let Some(e) = await_reports(&rx, sent, timeout) {
            failed.get_or_insert(e);
        }
        match failed {
            None => {
                replayed(&sh, &b, n);
                backoff = Duration::from_millis(250);
                size = (size * 2).min(batch);
            }
            Some(e) => {
                warn!(error = %e, events = n, "replaying the spool failed; will retry the whole batch");
                lock(&sh.spool).rewind();
                {
                    let mut st = lock(&sh.state);
                    st.handover = false;
                    sh.release_held(&mut st);
                }
                let until = Instant::now() + backoff;
                while Instant::now() < until && !sh.shutdown.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                size = (size / 2).max(50.min(batch));
            }
        }
    }
}

/// Hand a batch of spooled records to librdkafka, in order, waiting out a full queue.
/// Returns how many were handed over, and the error that stopped it early, if any.
fn send_batch(
    producer: &Kafka,
    records: &[SpoolRecord],
    tx: &mpsc::Sender<Result<(), KafkaError>>,
) -> (usize, Option<String>) {
    let mut sent = 0;
    for r in records {
        let headers = owned_headers(&r.headers);
        let mut record =
            BaseRecord::with_opaque_to(&r.topic, Box::new(Pending::Replay(tx.clone())))
                .payload(&r.value)
                .headers(headers);
        if let Some(k) = &r.key {
            record = record.key(k.as_slice());
        }
        loop {
            match producer.send(record) {
                Ok(()) => {
                    sent += 1;
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), rec)) => {
                    record = rec;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return (sent, Some(e.to_string())),
            }
        }
    }
    (sent, None)
}

/// Wait for the delivery reports of `sent` messages (each reports back within
/// message.timeout.ms); the first failure, if any.
fn await_reports(
    rx: &mpsc::Receiver<Result<(), KafkaError>>,
    sent: usize,
    timeout: Duration,
) -> Option<String> {
    let mut failed = None;
    let deadline = Instant::now() + timeout + Duration::from_secs(5);
    for _ in 0..sent {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failed.get_or_insert_with(|| e.to_string());
            }
            Err(_) => {
                failed.get_or_insert_with(|| "no delivery report in time".into());
                break;
            }
        }
    }
    failed
}

/// A whole batch acknowledged: move the durable cursor past it, then settle its records.
/// The spool counts them pending until the cursor is persisted, so they are settled only
/// then (settled twice, spool mode would never end). A failed commit is retried, not the
/// delivery: the records are in Kafka already. At shutdown they stay unsettled and on disk,
/// so the next run sends them again (copies, which consumers drop by identity).
fn replayed(sh: &Shared, b: &ReadBatch, n: usize) {
    sh.metrics.replayed.inc_by(n as u64);
    sh.metrics.published.inc_by(n as u64);
    let mut backoff = Duration::from_millis(250);
    loop {
        let res = {
            let mut sp = lock(&sh.spool);
            let r = sp.commit(b.end, n as u64);
            sh.spool_bytes.store(sp.bytes(), Ordering::Relaxed);
            sh.metrics.spool_bytes.set(sp.bytes() as i64);
            sh.metrics.spool_pending.set(sp.pending() as i64);
            r
        };
        let Err(e) = res else { break };
        error!(error = %e, events = n, "could not persist the spool cursor; retrying");
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if sh.shutdown.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    let mut st = lock(&sh.state);
    st.settled += n as u64;
    sh.maybe_resume_direct(&mut st);
    drop(st);
    sh.changed.notify_all();
    debug!(events = n, "replayed spooled events to Kafka");
}
