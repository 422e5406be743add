//! Time-aligned reading: no partition runs far ahead of the others in record time.
//!
//! librdkafka fetches a backlog at about the same number of records per second from every
//! partition, whatever its topic. weft's topics differ tenfold in size (trace events against
//! routing decisions), so an unaligned drain reads a small topic's whole backlog while the
//! largest is a tenth of the way in: the narrative pass then meets a decision long before the
//! trace events that cite it, and by the time they come its component has been evicted and
//! must be loaded back from ClickHouse (measured: 16k of every 20k facts, 60% of a pass).
//!
//! Kafka Streams meets the same problem when it joins streams: it processes the partition
//! whose head record is oldest, and waits a bounded time (`max.task.idle.ms`) for a partition
//! that has none. [`Lanes`] does the same with one librdkafka queue per partition: it reads
//! only partitions whose last record is at most `max_skew` (Kafka timestamps) ahead of the
//! slowest partition still delivering; a partition that delivered nothing for `idle` is taken
//! as caught up and holds nobody back. A partition not read keeps its records in its own
//! queue, and librdkafka stops fetching it when that queue is full: no pause, no seek, no
//! refetch (which tansu's memory engine would answer from the next batch), no record dropped.
//!
//! Only the single-process roles read this way: they assign every partition themselves. The
//! facts role shares partitions with a group, whose assignment changes under it, and stores
//! facts only, which need no alignment.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::StreamConsumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};

use super::consume::RebalanceWatch;

/// A partition's records this long without one is taken as caught up.
pub(super) const IDLE: Duration = Duration::from_millis(100);

type Queue = StreamPartitionQueue<RebalanceWatch>;

/// `head_ms` before a lane's first record.
const NO_HEAD: i64 = i64::MIN;

/// One partition's queue, and how far in time its reading has come.
struct Lane {
    queue: Queue,
    /// Kafka timestamp (ms) of the last record taken, or [`NO_HEAD`].
    head_ms: AtomicI64,
    /// When the last record was taken (or the lane opened), in µs since [`Lanes::epoch`].
    taken_us: AtomicU64,
}

/// Every assigned partition's queue, read in time order within `max_skew`.
pub(super) struct Lanes {
    lanes: Vec<Lane>,
    max_skew_ms: i64,
    epoch: Instant,
    /// Where the next sweep starts, so that no lane is always asked first.
    next: AtomicUsize,
    /// The lane a run of records is taken from, and how many more it may give before the
    /// lanes are weighed again (weighing every lane for every record costs more than the
    /// record's decoding).
    run: AtomicUsize,
    run_left: AtomicUsize,
    /// The newest head time the run's lane may reach: the slowest delivering lane's head
    /// plus the skew, when the run began.
    run_limit_ms: AtomicI64,
}

/// Records taken from one lane before the lanes are weighed again.
const RUN: usize = 64;

impl Lanes {
    /// Split every `(topic, partition)` off `consumer`'s main queue. Call it after every
    /// `assign` (librdkafka drops split queues on assign).
    pub(super) fn split(
        consumer: &Arc<StreamConsumer<RebalanceWatch>>,
        partitions: &[(String, i32)],
        max_skew: Duration,
    ) -> Self {
        let lanes = partitions
            .iter()
            .filter_map(|(t, p)| consumer.split_partition_queue(t, *p))
            .map(|queue| Lane {
                queue,
                head_ms: AtomicI64::new(NO_HEAD),
                taken_us: AtomicU64::new(0),
            })
            .collect();
        Self {
            lanes,
            max_skew_ms: max_skew.as_millis() as i64,
            epoch: Instant::now(),
            next: AtomicUsize::new(0),
            run: AtomicUsize::new(0),
            run_left: AtomicUsize::new(0),
            run_limit_ms: AtomicI64::new(i64::MAX),
        }
    }

    /// The next record of a partition not ahead of the others; waits while none has one.
    pub(super) async fn recv(&self) -> Result<BorrowedMessage<'_>, KafkaError> {
        // Fastest path: the run's lane has another record and is still within its limit.
        if self.run_left.load(Relaxed) > 0 {
            let i = self.run.load(Relaxed);
            let lane = &self.lanes[i];
            if lane.head_ms.load(Relaxed) <= self.run_limit_ms.load(Relaxed) {
                if let Some(m) = lane.queue.recv().now_or_never() {
                    self.run_left.fetch_sub(1, Relaxed);
                    return self.took(i, m);
                }
            }
            self.run_left.store(0, Relaxed);
        }
        loop {
            let heads = self.heads();
            let open = open_lanes(&heads, self.max_skew_ms);
            // Fast path: a record already fetched, asked without waiting, lane by lane.
            let n = self.lanes.len();
            let start = self.next.load(Relaxed);
            for i in (0..n).map(|k| (start + k) % n).filter(|i| open[*i]) {
                if let Some(m) = self.lanes[i].queue.recv().now_or_never() {
                    self.next.store((i + 1) % n, Relaxed);
                    self.start_run(i, &heads);
                    return self.took(i, m);
                }
            }
            // None has one: wait for the first of the open lanes, or until the next lane
            // goes idle (which may open others).
            let waits = (0..n)
                .filter(|i| open[*i])
                .map(|i| self.lanes[i].queue.recv().map(move |m| (i, m)).boxed());
            let next_idle = self.next_idle();
            match tokio::time::timeout(next_idle, futures::future::select_all(waits)).await {
                Ok(((i, m), _, _)) => return self.took(i, m),
                Err(_) => continue,
            }
        }
    }

    /// Let lane `i` give up to [`RUN`] more records while it stays within the skew of the
    /// slowest delivering lane as it stands now.
    fn start_run(&self, i: usize, heads: &[(Option<i64>, bool)]) {
        let limit = match slowest(heads) {
            Some(s) if self.max_skew_ms > 0 => s + self.max_skew_ms,
            _ => i64::MAX,
        };
        self.run.store(i, Relaxed);
        self.run_limit_ms.store(limit, Relaxed);
        self.run_left.store(RUN, Relaxed);
    }

    fn took<'a>(
        &'a self,
        i: usize,
        m: Result<BorrowedMessage<'a>, KafkaError>,
    ) -> Result<BorrowedMessage<'a>, KafkaError> {
        let lane = &self.lanes[i];
        lane.taken_us.store(self.now_us(), Relaxed);
        if let Ok(m) = &m {
            if let Some(ts) = m.timestamp().to_millis() {
                lane.head_ms.store(ts, Relaxed);
            }
        }
        m
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// How long ago each lane took its last record.
    fn ages(&self) -> impl Iterator<Item = Duration> + '_ {
        let now = self.now_us();
        self.lanes
            .iter()
            .map(move |l| Duration::from_micros(now.saturating_sub(l.taken_us.load(Relaxed))))
    }

    /// Per lane: its head time, and whether it still delivers (took a record within IDLE).
    fn heads(&self) -> Vec<(Option<i64>, bool)> {
        self.lanes
            .iter()
            .zip(self.ages())
            .map(|(l, age)| {
                let h = l.head_ms.load(Relaxed);
                ((h != NO_HEAD).then_some(h), age < IDLE)
            })
            .collect()
    }

    /// How long until the next delivering lane goes idle (at least a millisecond).
    fn next_idle(&self) -> Duration {
        self.ages()
            .map(|age| IDLE.saturating_sub(age))
            .filter(|d| !d.is_zero())
            .min()
            .unwrap_or(IDLE)
            .max(Duration::from_millis(1))
    }
}

/// Which lanes may be read, from each lane's (head time, still delivering): those at most
/// `max_skew_ms` ahead of the slowest delivering lane, and those without a head yet. With no
/// lane delivering, or alignment off (`max_skew_ms` 0), every lane.
fn open_lanes(heads: &[(Option<i64>, bool)], max_skew_ms: i64) -> Vec<bool> {
    let slowest = slowest(heads);
    heads
        .iter()
        .map(|(h, _)| match (h, slowest) {
            (Some(h), Some(s)) if max_skew_ms > 0 => *h <= s + max_skew_ms,
            _ => true,
        })
        .collect()
}

/// The head time of the slowest lane still delivering.
fn slowest(heads: &[(Option<i64>, bool)]) -> Option<i64> {
    heads
        .iter()
        .filter(|(_, delivering)| *delivering)
        .filter_map(|(h, _)| *h)
        .min()
}

#[cfg(test)]
mod tests {
    use super::open_lanes;

    #[test]
    fn a_lane_far_ahead_of_the_slowest_delivering_one_waits() {
        // Lane 1 is 900 ms ahead of lane 0, lane 2 within the skew, lane 3 has no head yet.
        let heads = [
            (Some(1_000), true),
            (Some(1_900), true),
            (Some(1_400), true),
            (None, true),
        ];
        assert_eq!(open_lanes(&heads, 500), [true, false, true, true]);
    }

    #[test]
    fn an_idle_lane_holds_nobody_back() {
        // Lane 0 is slowest but delivered nothing lately: lane 1 is now the measure.
        let heads = [
            (Some(1_000), false),
            (Some(1_900), true),
            (Some(2_600), true),
        ];
        assert_eq!(open_lanes(&heads, 500), [true, true, false]);
    }

    #[test]
    fn with_no_lane_delivering_or_alignment_off_every_lane_is_read() {
        let heads = [(Some(1_000), false), (Some(9_000), false)];
        assert_eq!(open_lanes(&heads, 500), [true, true]);
        let heads = [(Some(1_000), true), (Some(9_000), true)];
        assert_eq!(open_lanes(&heads, 0), [true, true]);
    }

    #[test]
    fn the_slowest_delivering_lane_is_always_open() {
        for skew in [1, 10, 500] {
            let heads = [(Some(5), true), (Some(3), true), (Some(400), true)];
            assert!(open_lanes(&heads, skew)[1]);
        }
    }
}
