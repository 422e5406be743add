//! The replayer thread: spooled records back to Kafka, in order, batch by batch.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::BaseRecord;
use tracing::{debug, error, warn};

use super::delivery::{is_permanent, Pending};
use super::owned_headers;
use super::refused::set_aside;
use super::state::{lock, read, Kafka, Shared};
use crate::spool::{ReadBatch, SpoolRecord};

/// Bound on the bytes of one replay batch (besides `replay_batch` records): the batch is in
/// memory, and librdkafka holds a copy of it until it is acknowledged. One record larger than
/// this still goes, alone.
pub(super) const REPLAY_BATCH_BYTES: u64 = 64 << 20;

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
            let r = sp.read_batch(size, REPLAY_BATCH_BYTES);
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
        sh.metrics.spool_corrupt_records.inc_by(b.corrupt_records);
        sh.metrics.spool_corrupt_bytes.inc_by(b.corrupt_bytes);
        let n = b.records.len();
        if n == 0 {
            if b.skipped > 0 {
                // Only damaged records, set aside: they count as settled.
                replayed(&sh, &b);
            }
            continue;
        }
        let (tx, rx) = mpsc::channel();
        let guard = read(&sh.producer);
        let Some(producer) = guard.as_ref() else {
            break;
        };
        let mut report = send_batch(producer, &b.records, &tx);
        drop(guard);
        drop(tx);
        await_reports(&rx, &mut report, timeout);
        match report.failed {
            None => {
                // Refused for good, and only those: resending them can never succeed, so
                // they are set aside and the spool moves on (else every event behind them
                // would wait for ever).
                for (i, e) in report.refused {
                    set_aside(&sh, &b.records[i], &e);
                }
                replayed(&sh, &b);
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

/// How a batch's replay went: the records handed to librdkafka, those refused for good
/// ([`is_permanent`]: index and error), and the first error worth retrying the batch for.
#[derive(Default)]
struct Report {
    sent: usize,
    refused: Vec<(usize, String)>,
    failed: Option<String>,
}

/// Hand a batch of spooled records to librdkafka, in order, waiting out a full queue; stop
/// at the first error worth a retry.
fn send_batch(
    producer: &Kafka,
    records: &[SpoolRecord],
    tx: &mpsc::Sender<(usize, Result<(), KafkaError>)>,
) -> Report {
    let mut report = Report::default();
    for (i, r) in records.iter().enumerate() {
        match enqueue(producer, r, i, tx) {
            Ok(()) => report.sent += 1,
            Err(e) if is_permanent(&e) => report.refused.push((i, e.to_string())),
            Err(e) => {
                report.failed = Some(e.to_string());
                return report;
            }
        }
    }
    report
}

/// Hand one spooled record (number `i` of its batch) to librdkafka as it was spooled (topic,
/// key, value, headers), its delivery report to come on `tx`; a full queue is waited out.
pub(super) fn enqueue(
    producer: &Kafka,
    r: &SpoolRecord,
    i: usize,
    tx: &mpsc::Sender<(usize, Result<(), KafkaError>)>,
) -> Result<(), KafkaError> {
    let mut record = BaseRecord::with_opaque_to(&r.topic, Box::new(Pending::Replay(tx.clone(), i)))
        .payload(&r.value)
        .headers(owned_headers(&r.headers));
    if let Some(k) = &r.key {
        record = record.key(k.as_slice());
    }
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), rec)) => {
                record = rec;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Wait for the delivery reports of the records sent (each reports back within
/// message.timeout.ms), noting each refused for good and the first other failure.
fn await_reports(
    rx: &mpsc::Receiver<(usize, Result<(), KafkaError>)>,
    report: &mut Report,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout + Duration::from_secs(5);
    for _ in 0..report.sent {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((_, Ok(()))) => {}
            Ok((i, Err(e))) if is_permanent(&e) => report.refused.push((i, e.to_string())),
            Ok((_, Err(e))) => {
                report.failed.get_or_insert_with(|| e.to_string());
            }
            Err(_) => {
                report
                    .failed
                    .get_or_insert_with(|| "no delivery report in time".into());
                break;
            }
        }
    }
}

/// A whole batch acknowledged: move the durable cursor past it, then settle its records
/// (and the damaged ones it skipped, which the spool counted as pending too).
/// The spool counts them pending until the cursor is persisted, so they are settled only
/// then (settled twice, spool mode would never end). A failed commit is retried, not the
/// delivery: the records are in Kafka already. At shutdown they stay unsettled and on disk,
/// so the next run sends them again (copies, which consumers drop by identity).
fn replayed(sh: &Shared, b: &ReadBatch) {
    let sent = b.records.len() as u64;
    sh.metrics.replayed.inc_by(sent);
    sh.metrics.published.inc_by(sent);
    let n = sent + b.skipped;
    let mut backoff = Duration::from_millis(250);
    loop {
        let res = {
            let mut sp = lock(&sh.spool);
            let r = sp.commit(b.end, n);
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
    st.settled += n;
    sh.maybe_resume_direct(&mut st);
    drop(st);
    sh.changed.notify_all();
    debug!(events = n, "replayed spooled events to Kafka");
}
