//! The state shared by the delivery callback, the spool writer and the replayer, and the
//! moves between direct sending and spool mode.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, ThreadedProducer};
use tracing::{info, warn};

use super::delivery::{Ctx, Pending};
use super::receipt::Reply;
use super::writer::WriterMsg;
use super::{owned_headers, PublishError};
use crate::metrics::Metrics;
use crate::spool::{Spool, SpoolRecord};

/// One event on its way to the spool, with whoever waits for it.
pub(super) struct Job {
    pub(super) record: SpoolRecord,
    pub(super) size: u64,
    pub(super) reply: Option<Reply>,
    pub(super) started: Instant,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) spooling: bool,
    /// The replayer is sending the spool's last batch; new events wait in `held`.
    pub(super) handover: bool,
    /// Live (non-replay) messages inside librdkafka.
    pub(super) in_flight: u64,
    /// Spool-mode events waiting for the in-flight ones to resolve.
    pub(super) held: VecDeque<Job>,
    pub(super) held_bytes: u64,
    /// Bytes sent to the writer and not yet appended.
    pub(super) queued_bytes: u64,
    /// Records sent towards the spool (incl. what a restart found) ...
    pub(super) to_spool: u64,
    /// ... and how many of them are settled: replayed to Kafka, or failed to append.
    pub(super) settled: u64,
    pub(super) closed: bool,
    /// Pacing: live messages the broker acknowledged so far ...
    pub(super) acked: u64,
    /// ... the in-flight bound derived from the acknowledgement rate (0 before the first) ...
    pub(super) window: u64,
    /// ... when and at which `acked` the rate was last measured ...
    pub(super) mark: Option<(Instant, u64)>,
    /// ... and how many `publish` calls wait for room (they want every acknowledgement).
    pub(super) pacers: u32,
}

impl State {
    /// Re-derive the in-flight bound from what the broker acknowledges: about a quarter of
    /// the delivery timeout's worth at the measured rate, between 500 and `max`, so nothing
    /// waits in librdkafka's queue long enough to time out.
    pub(super) fn pace(&mut self, max: u64, timeout_ms: u64) {
        let now = Instant::now();
        match self.mark {
            None => {
                self.mark = Some((now, self.acked));
                self.window = max.min(1_000);
            }
            Some((t, a)) if now.duration_since(t) >= std::time::Duration::from_secs(1) => {
                let rate = (self.acked - a) as f64 / now.duration_since(t).as_secs_f64();
                let target = (rate * timeout_ms as f64 / 4_000.0) as u64;
                // Grow at most 4x per second: a rate measured while bounded understates.
                let grown = (self.window.max(1) * 4).min(target.max(500));
                self.window = grown.clamp(max.min(500), max);
                self.mark = Some((now, self.acked));
            }
            Some(_) => {}
        }
    }
}

impl State {
    /// Spool-mode routing of a new event: held in memory while older messages are in flight
    /// (they may yet fail and must be spooled first) or a handover is under way; otherwise
    /// handed back, to be appended now.
    pub(super) fn hold(&mut self, job: Job) -> Option<Job> {
        if self.in_flight > 0 || self.handover {
            self.held_bytes += job.size;
            self.held.push_back(job);
            None
        } else {
            Some(job)
        }
    }

    /// The oldest held event, once it may follow the failed ones into the spool: nothing in
    /// flight and no handover.
    pub(super) fn next_releasable(&mut self) -> Option<Job> {
        if self.in_flight > 0 || self.handover {
            return None;
        }
        let job = self.held.pop_front()?;
        self.held_bytes -= job.size;
        Some(job)
    }

    /// Whether spool mode may end: everything sent towards the spool is settled, nothing is
    /// in flight, and nothing is held (or it is held for the end of a handover).
    pub(super) fn drained(&self) -> bool {
        self.spooling
            && self.in_flight == 0
            && (self.held.is_empty() || self.handover)
            && self.settled == self.to_spool
    }

    /// Bound check for a new spool-bound event, given what the spool holds on disk.
    pub(super) fn room(&self, size: u64, on_disk: u64, max: u64) -> Result<(), PublishError> {
        let used = on_disk + self.queued_bytes + self.held_bytes;
        if used + size > max {
            return Err(PublishError::SpoolFull { used, max });
        }
        Ok(())
    }
}

/// Everything the delivery callback, the writer and the replayer share.
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// Signalled when the state changes (waiters for in_flight == 0 or drain) ...
    pub(super) changed: Condvar,
    pub(super) spool: Mutex<Spool>,
    /// ... and this one wakes the replayer when records were appended.
    pub(super) wake: Condvar,
    pub(super) writer: Mutex<mpsc::Sender<WriterMsg>>,
    /// The current Kafka producer; replaced when tainted (see the module docs).
    pub(super) producer: RwLock<Option<Kafka>>,
    pub(super) kafka_config: ClientConfig,
    pub(super) metrics: Arc<Metrics>,
    pub(super) spool_bytes: AtomicU64,
    pub(super) max_bytes: u64,
    /// [`crate::PublisherConfig::max_in_flight`] (0: no bound).
    pub(super) max_in_flight: u64,
    pub(super) shutdown: AtomicBool,
}

pub(super) type Kafka = ThreadedProducer<Ctx>;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Pacing: while sending directly with `max_in_flight` events unacknowledged, wait (at
    /// most `timeout_ms`) for the broker to acknowledge some, so a slow broker slows the
    /// caller instead of letting messages time out in librdkafka's queue.
    pub(super) fn paced<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        timeout_ms: u64,
    ) -> MutexGuard<'a, State> {
        let max = self.max_in_flight;
        if max == 0 || st.spooling {
            return st;
        }
        st.pace(max, timeout_ms);
        if st.in_flight < st.window || st.closed {
            return st;
        }
        let deadline = Instant::now() + std::time::Duration::from_millis(timeout_ms);
        may_block(move || {
            while st.in_flight >= st.window && !st.spooling && !st.closed {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                st.pacers += 1;
                st = self
                    .changed
                    .wait_timeout(
                        st,
                        (deadline - now).min(std::time::Duration::from_millis(50)),
                    )
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
                st.pacers -= 1;
                st.pace(max, timeout_ms);
            }
            st
        })
    }

    /// Queue a job for the spool writer (state lock held, so order is the lock's order).
    pub(super) fn to_writer(&self, st: &mut State, job: Job) {
        st.to_spool += 1;
        st.queued_bytes += job.size;
        if let Err(mpsc::SendError(WriterMsg::Append(job))) =
            lock(&self.writer).send(WriterMsg::Append(job))
        {
            st.queued_bytes -= job.size;
            st.settled += 1;
            if let Some(r) = job.reply {
                let _ = r.send(Err(PublishError::Closed));
            }
        }
    }

    /// Once nothing is in flight, held events may follow the failed ones into the spool.
    pub(super) fn release_held(&self, st: &mut State) {
        while let Some(job) = st.next_releasable() {
            self.to_writer(st, job);
        }
    }

    /// Leave spool mode when everything spooled is delivered and nothing is pending.
    pub(super) fn maybe_resume_direct(&self, st: &mut State) {
        if st.drained() && !self.producer_tainted() {
            st.spooling = false;
            st.handover = false;
            info!(
                held = st.held.len(),
                "spool drained; publishing directly to Kafka again"
            );
            self.send_held_direct(st);
        }
    }

    /// End of a handover: the held events go straight to Kafka, oldest first. If librdkafka
    /// refuses one (queue full), the rest stay held and spool mode resumes.
    pub(super) fn send_held_direct(&self, st: &mut State) {
        let guard = read(&self.producer);
        let Some(producer) = guard.as_ref() else {
            return;
        };
        while let Some(job) = st.held.pop_front() {
            st.held_bytes -= job.size;
            let Some(reply) = job.reply else { continue };
            let r = &job.record;
            let headers = owned_headers(&r.headers);
            let mut record = BaseRecord::with_opaque_to(
                &r.topic,
                Box::new(Pending::Live {
                    reply,
                    started: job.started,
                }),
            )
            .payload(&r.value)
            .headers(headers);
            if let Some(k) = &r.key {
                record = record.key(k.as_slice());
            }
            st.in_flight += 1;
            if let Err((e, rec)) = producer.send(record) {
                st.in_flight -= 1;
                warn!(error = %e, "handing held events to Kafka failed; spooling again");
                st.spooling = true;
                if let Pending::Live { reply, .. } = *rec.delivery_opaque {
                    st.held_bytes += job.size;
                    st.held.push_front(Job {
                        reply: Some(reply),
                        ..job
                    });
                }
                // Behind any events just sent: they may still fail and be spooled first.
                self.release_held(st);
                return;
            }
        }
    }

    /// Spool-mode routing: hold while older messages are in flight, else append.
    pub(super) fn held_or_write(&self, st: &mut State, job: Job) {
        if let Some(job) = st.hold(job) {
            self.to_writer(st, job);
        }
    }

    /// Bound check for a new spool-bound event.
    pub(super) fn check_room(&self, st: &State, size: u64) -> Result<(), PublishError> {
        st.room(
            size,
            self.spool_bytes.load(Ordering::Relaxed),
            self.max_bytes,
        )
    }
}

/// Run `f`, which blocks the thread: from a task on a multi-thread tokio runtime (the
/// gateway's and the router's handlers), the worker first hands its other tasks to another
/// thread (`block_in_place`), so a caller paced by a slow broker does not stall every request
/// of the process, `/healthz` included. Elsewhere `f` simply runs.
fn may_block<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_in_flight_bound_follows_the_acknowledgement_rate() {
        let ago = |secs| Some((Instant::now() - std::time::Duration::from_secs(secs), 0));
        let mut st = State::default();
        st.pace(20_000, 10_000);
        assert_eq!(st.window, 1_000, "starts small");
        // 2,000 acks/s: a quarter of the 10 s timeout is 5,000; growth is at most 4x a step.
        st.mark = ago(2);
        st.acked = 4_000;
        st.pace(20_000, 10_000);
        assert_eq!(st.window, 4_000);
        st.mark = ago(2);
        st.acked = 4_000;
        st.pace(20_000, 10_000);
        assert!((4_900..=5_000).contains(&st.window), "{}", st.window);
        // A broker that slows to 100/s gets at most 500 in flight; a fast one the maximum.
        st.mark = ago(1);
        st.acked = 100;
        st.pace(20_000, 10_000);
        assert_eq!(st.window, 500);
        for _ in 0..5 {
            st.mark = ago(1);
            st.acked = 1_000_000;
            st.pace(20_000, 10_000);
        }
        assert_eq!(st.window, 20_000);
    }

    use super::*;

    /// A caller blocked in `may_block` (as one paced by a slow broker) leaves the runtime's
    /// only worker to the other tasks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_blocked_caller_does_not_stall_the_other_tasks() {
        let (entered_tx, entered) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let blocked = tokio::spawn(async move {
            may_block(|| {
                entered_tx.send(()).unwrap();
                released.recv().unwrap();
            })
        });
        entered.recv().unwrap(); // the only worker is now inside `may_block`
        let (ran_tx, ran) = mpsc::channel();
        tokio::spawn(async move { ran_tx.send(42) });
        // Waited for on this (non-worker) thread: no timer needs the blocked worker.
        let got = ran.recv_timeout(std::time::Duration::from_secs(30));
        release.send(()).unwrap();
        assert_eq!(
            got,
            Ok(42),
            "the other task ran while the caller was blocked"
        );
        blocked.await.unwrap();
    }

    fn job(n: u8) -> Job {
        Job {
            record: SpoolRecord {
                topic: "t".into(),
                key: None,
                value: vec![n; 10],
                headers: Vec::new(),
            },
            size: 10,
            reply: None,
            started: Instant::now(),
        }
    }

    fn ids(jobs: impl IntoIterator<Item = Job>) -> Vec<u8> {
        jobs.into_iter().map(|j| j.record.value[0]).collect()
    }

    fn release_all(st: &mut State) -> Vec<Job> {
        std::iter::from_fn(|| st.next_releasable()).collect()
    }

    #[test]
    fn spool_mode_holds_new_events_behind_the_in_flight_ones_and_releases_them_in_order() {
        let mut st = State {
            spooling: true,
            in_flight: 2,
            ..State::default()
        };
        assert!(st.hold(job(1)).is_none() && st.hold(job(2)).is_none());
        assert_eq!(st.held_bytes, 20);
        assert!(st.next_releasable().is_none(), "two still in flight");
        st.in_flight = 1;
        assert!(st.next_releasable().is_none(), "one still in flight");
        st.in_flight = 0;
        assert_eq!(ids(release_all(&mut st)), [1, 2]);
        assert_eq!(st.held_bytes, 0);
        // With nothing in flight, a new event goes straight to the spool.
        assert_eq!(st.hold(job(3)).map(|j| j.record.value[0]), Some(3));
    }

    #[test]
    fn a_handover_holds_events_even_with_nothing_in_flight() {
        let mut st = State {
            spooling: true,
            handover: true,
            ..State::default()
        };
        assert!(st.hold(job(1)).is_none());
        assert!(st.next_releasable().is_none(), "held for the direct path");
        // Held events wait for the handover's end: they do not block the drain.
        assert!(st.drained());
        // A failed last batch ends the handover: they follow into the spool.
        st.handover = false;
        assert!(!st.drained(), "held events still to be spooled");
        assert_eq!(ids(release_all(&mut st)), [1]);
    }

    #[test]
    fn spool_mode_ends_only_when_every_spooled_record_is_settled() {
        let mut st = State {
            spooling: true,
            to_spool: 3,
            settled: 2,
            ..State::default()
        };
        assert!(!st.drained(), "one record not yet replayed");
        st.settled = 3;
        assert!(st.drained());
        st.in_flight = 1;
        assert!(!st.drained(), "a live message may still fail");
        st.in_flight = 0;
        st.spooling = false;
        assert!(!st.drained(), "not in spool mode at all");
    }

    #[test]
    fn the_bound_counts_disk_queue_and_held_bytes() {
        let mut st = State {
            queued_bytes: 30,
            ..State::default()
        };
        assert!(st.hold(job(1)).is_some(), "nothing in flight: not held");
        st.in_flight = 1;
        assert!(st.hold(job(2)).is_none());
        // 50 on disk + 30 queued + 10 held = 90 used.
        assert!(st.room(10, 50, 100).is_ok());
        match st.room(11, 50, 100) {
            Err(PublishError::SpoolFull { used, max }) => assert_eq!((used, max), (90, 100)),
            other => panic!("expected SpoolFull, got {other:?}"),
        }
    }
}
