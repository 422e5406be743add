//! The replayer thread: spooled records back to Kafka, in order, batch by batch.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::BaseRecord;
use tracing::{debug, error, warn};

use super::delivery::{is_permanent, is_refusal, Pending};
use super::owned_headers;
use super::refused::set_aside;
use super::state::{lock, read, Kafka, Shared};
use crate::spool::{ReadBatch, SpoolRecord};

/// Bound on the bytes of one replay batch (besides `replay_batch` records): the batch is in
/// memory, and librdkafka holds a copy of it until it is acknowledged. One record larger than
/// this still goes, alone.
pub(super) const REPLAY_BATCH_BYTES: u64 = 64 << 20;

/// The replayer: send spooled records in order, commit the cursor per acknowledged batch.
/// `give_up_after`: see [`Stuck`].
pub(super) fn replayer_loop(
    sh: Arc<Shared>,
    batch: usize,
    timeout: Duration,
    give_up_after: Option<Duration>,
) {
    let mut stuck = Stuck::new(give_up_after);
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
                replayed(&sh, &b, 0);
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
        if report.failed.is_none() {
            stuck.delivered(&b.records);
        } else if let Some(give_up) = stuck.failed(&b.records, &report, Instant::now()) {
            for (i, e) in give_up {
                report.refused.push((i, e));
            }
            report.failed = None;
        }
        // Refused for good, and only those: resending them can never succeed, so they are
        // set aside and the spool moves on (else every event behind them would wait for
        // ever); if they cannot be, the round is retried.
        let failed = report.failed.or_else(|| {
            let refused: Vec<(&SpoolRecord, &str)> = (report.refused.iter())
                .map(|(i, e)| (&b.records[*i], e.as_str()))
                .collect();
            set_aside(&sh, &refused)
                .err()
                .map(|e| format!("setting refused events aside in refused.jsonl failed: {e}"))
        });
        match failed {
            None => {
                // What Kafka acknowledged; those set aside are counted as refused only.
                replayed(&sh, &b, report.acked as u64);
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

/// How a batch's replay went: the records handed to librdkafka and those it acknowledged,
/// those refused for good ([`is_permanent`]: index and error), those that failed with an
/// error worth a retry (index and error) and how many of those the broker refused
/// ([`is_refusal`]), whether reports stopped coming before the last, and the first reason to
/// retry the batch.
#[derive(Default)]
struct Report {
    sent: usize,
    acked: usize,
    refused: Vec<(usize, String)>,
    failing: Vec<(usize, String)>,
    refusals: usize,
    late: bool,
    failed: Option<String>,
}

impl Report {
    fn failing(&mut self, i: usize, e: &KafkaError) {
        let e_text = e.to_string();
        self.failed.get_or_insert_with(|| e_text.clone());
        self.failing.push((i, e_text));
        self.refusals += usize::from(is_refusal(e));
    }
}

/// Hand a batch of spooled records to librdkafka, in order, waiting out a full queue. A
/// record that cannot be handed over is noted and the rest still go, so that the round
/// tells which records fail and which Kafka takes ([`Stuck`]).
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
            Err(e) => report.failing(i, &e),
        }
    }
    report
}

/// Records that keep failing on replay while Kafka acknowledges the records sent beside
/// them: a topic deleted behind the spool's back, an authorization taken away, a partition
/// that stays leaderless. Such an error is not [`is_permanent`], so the batch is resent, and
/// without a limit every event behind the record would wait for ever. A record failing in
/// every round since `after` ago, in a round where Kafka acknowledged others, is given up
/// on: set aside in `refused.jsonl` like one refused for good, for an operator to publish
/// again (`weft publish --republish-refused`). A round whose records all fail counts too when
/// the broker refused each of them ([`is_refusal`]): a run of records for a deleted topic,
/// longer than a round, would otherwise never be given up on. Nothing is given up while
/// Kafka neither acknowledges a record nor says why (it is down, not refusing), nor while a
/// delivery report is missing.
///
/// Records are told apart by a hash of their bytes, since a failed round rereads the batch
/// from the cursor. The map holds only records failing in the last failed round, so it is
/// bounded by the batch.
struct Stuck {
    after: Option<Duration>,
    since: HashMap<u64, Instant>,
}

impl Stuck {
    fn new(after: Option<Duration>) -> Self {
        Stuck {
            after,
            since: HashMap::new(),
        }
    }

    fn key(r: &SpoolRecord) -> u64 {
        let mut h = DefaultHasher::new();
        r.topic.hash(&mut h);
        r.key.hash(&mut h);
        r.value.hash(&mut h);
        r.headers.hash(&mut h);
        h.finish()
    }

    /// A round went through: its records failed no more.
    fn delivered(&mut self, records: &[SpoolRecord]) {
        if !self.since.is_empty() {
            for r in records {
                self.since.remove(&Self::key(r));
            }
        }
    }

    /// A round failed at `now`: the records to give up on (index and why), all of the
    /// round's failing ones or none (a record given up on must not be sent again, and the
    /// cursor moves past a whole batch only).
    fn failed(
        &mut self,
        records: &[SpoolRecord],
        report: &Report,
        now: Instant,
    ) -> Option<Vec<(usize, String)>> {
        let after = self.after?;
        let failing: Vec<u64> = report
            .failing
            .iter()
            .map(|&(i, _)| Self::key(&records[i]))
            .collect();
        let mut since = HashMap::with_capacity(failing.len());
        for &k in &failing {
            since.insert(k, self.since.get(&k).copied().unwrap_or(now));
        }
        self.since = since;
        let said_no = report.refusals == report.failing.len();
        let answering = (report.acked > 0 || said_no) && !report.late && !failing.is_empty();
        let old = |k: &u64| now.duration_since(self.since[k]) >= after;
        if !answering || !failing.iter().all(old) {
            return None;
        }
        for k in &failing {
            self.since.remove(k);
        }
        Some(
            report
                .failing
                .iter()
                .map(|(i, e)| {
                    let beside = if report.acked > 0 {
                        "while Kafka acknowledged the records sent beside it"
                    } else {
                        "the broker refusing it"
                    };
                    let why = format!(
                        "failed on every replay for {}s, {beside}; last error: {e}",
                        after.as_secs()
                    );
                    (*i, why)
                })
                .collect(),
        )
    }
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
            Ok((_, Ok(()))) => report.acked += 1,
            Ok((i, Err(e))) if is_permanent(&e) => report.refused.push((i, e.to_string())),
            Ok((i, Err(e))) => report.failing(i, &e),
            Err(_) => {
                report.late = true;
                report
                    .failed
                    .get_or_insert_with(|| "no delivery report in time".into());
                break;
            }
        }
    }
}

/// A whole batch settled (`acked` of its records acknowledged by Kafka, the others set aside):
/// count the acknowledged ones as replayed and published, move the durable cursor past the
/// batch, then settle its records (and the damaged ones it skipped, which the spool counted as
/// pending too).
/// The spool counts them pending until the cursor is persisted, so they are settled only
/// then (settled twice, spool mode would never end). A failed commit is retried, not the
/// delivery: the records are in Kafka already. At shutdown they stay unsettled and on disk,
/// so the next run sends them again (copies, which consumers drop by identity).
fn replayed(sh: &Shared, b: &ReadBatch, acked: u64) {
    sh.metrics.replayed.inc_by(acked);
    sh.metrics.published.inc_by(acked);
    let n = b.records.len() as u64 + b.skipped;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(v: &str) -> SpoolRecord {
        SpoolRecord {
            topic: "t".into(),
            key: None,
            value: v.as_bytes().to_vec(),
            headers: Vec::new(),
        }
    }

    /// A round of `n` records sent, all reported: `failing` failed with `error`, the rest
    /// acknowledged.
    fn round_of(n: usize, failing: &[usize], error: RDKafkaErrorCode) -> Report {
        let mut r = Report {
            sent: n,
            acked: n - failing.len(),
            ..Report::default()
        };
        for &i in failing {
            r.failing(i, &KafkaError::MessageProduction(error));
        }
        r
    }

    /// [`round_of`] with the broker refusing the failing records' topic.
    fn round(n: usize, failing: &[usize]) -> Report {
        round_of(n, failing, RDKafkaErrorCode::UnknownTopicOrPartition)
    }

    /// [`round_of`] with the failing records timing out (Kafka unreachable).
    fn silent(n: usize, failing: &[usize]) -> Report {
        round_of(n, failing, RDKafkaErrorCode::MessageTimedOut)
    }

    const AFTER: Duration = Duration::from_secs(60);

    #[test]
    fn a_record_failing_while_others_are_acknowledged_is_given_up_after_the_limit() {
        let recs = [rec("a"), rec("b"), rec("c")];
        let mut s = Stuck::new(Some(AFTER));
        let t0 = Instant::now();
        assert_eq!(s.failed(&recs, &round(3, &[1]), t0), None);
        assert_eq!(s.failed(&recs, &round(3, &[1]), t0 + AFTER / 2), None);
        let given = s.failed(&recs, &round(3, &[1]), t0 + AFTER).unwrap();
        assert_eq!(given.len(), 1);
        assert_eq!(given[0].0, 1);
        assert!(given[0].1.contains("Unknown topic"), "{}", given[0].1);
        assert!(
            s.since.is_empty(),
            "nothing is remembered of a record given up on"
        );
    }

    #[test]
    fn nothing_is_given_up_while_kafka_acknowledges_nothing_or_a_report_is_missing() {
        let recs = [rec("a"), rec("b")];
        let mut s = Stuck::new(Some(AFTER));
        let t0 = Instant::now();
        // Kafka down: every record fails, for far longer than the limit.
        assert_eq!(s.failed(&recs, &silent(2, &[0, 1]), t0), None);
        assert_eq!(s.failed(&recs, &silent(2, &[0, 1]), t0 + AFTER * 10), None);
        // Some refused, others timing out: Kafka has not said why of every record.
        let mut mixed = silent(2, &[0]);
        mixed.failing(
            1,
            &KafkaError::MessageProduction(RDKafkaErrorCode::UnknownTopic),
        );
        mixed.acked = 0;
        assert_eq!(s.failed(&recs, &mixed, t0 + AFTER * 20), None);
        // One acknowledged, but a report never came: the round says too little.
        let mut late = round(2, &[1]);
        late.late = true;
        assert_eq!(s.failed(&recs, &late, t0 + AFTER * 10), None);
        // Off: retried for ever.
        let mut off = Stuck::new(None);
        assert_eq!(off.failed(&recs, &round(2, &[1]), t0), None);
        assert_eq!(off.failed(&recs, &round(2, &[1]), t0 + AFTER * 10), None);
    }

    #[test]
    fn the_clock_restarts_for_a_record_that_stopped_failing() {
        let recs = [rec("a"), rec("b"), rec("c")];
        let mut s = Stuck::new(Some(AFTER));
        let t0 = Instant::now();
        assert_eq!(s.failed(&recs, &round(3, &[1]), t0), None);
        // A round where another record failed: "b" went through, its clock is gone.
        assert_eq!(s.failed(&recs, &round(3, &[2]), t0 + AFTER / 2), None);
        assert_eq!(s.failed(&recs, &round(3, &[1]), t0 + AFTER), None);
        // And a round delivered whole forgets what it delivered.
        s.delivered(&recs);
        assert!(s.since.is_empty());
    }

    /// A round of records all for a deleted topic (a run longer than a round) acknowledges
    /// nothing, yet the broker says why: given up on after the limit, not waited on for ever.
    #[test]
    fn a_round_the_broker_refuses_whole_is_given_up_after_the_limit() {
        let recs = [rec("a"), rec("b")];
        let mut s = Stuck::new(Some(AFTER));
        let t0 = Instant::now();
        assert_eq!(s.failed(&recs, &round(2, &[0, 1]), t0), None);
        let given = s.failed(&recs, &round(2, &[0, 1]), t0 + AFTER).unwrap();
        assert_eq!(given.iter().map(|g| g.0).collect::<Vec<_>>(), [0, 1]);
    }

    /// All or none: the cursor moves past a whole batch, so one record given up on while
    /// another of the round must still be retried would be sent again.
    #[test]
    fn a_round_with_a_newer_failure_gives_up_on_none() {
        let recs = [rec("a"), rec("b"), rec("c")];
        let mut s = Stuck::new(Some(AFTER));
        let t0 = Instant::now();
        assert_eq!(s.failed(&recs, &round(3, &[0]), t0), None);
        assert_eq!(s.failed(&recs, &round(3, &[0, 2]), t0 + AFTER), None);
        let given = s.failed(&recs, &round(3, &[0, 2]), t0 + AFTER * 2).unwrap();
        assert_eq!(given.iter().map(|g| g.0).collect::<Vec<_>>(), [0, 2]);
    }
}
