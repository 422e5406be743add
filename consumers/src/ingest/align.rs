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
//! whose head record is oldest among those with records buffered. [`Lanes`] does the same
//! with one librdkafka queue per partition: it reads only partitions whose last record is at
//! most `max_skew` (Kafka timestamps) ahead of the slowest partition that still has records
//! waiting. A partition whose queue was found empty is caught up and holds nobody back, so a
//! quiet partition, or one whose producer's clock runs ahead, never stops the others, and a
//! live stream (every queue mostly empty) is read as it comes. A partition not read keeps its
//! records in its own queue, and librdkafka stops fetching it when that queue is full: no
//! pause, no seek, no refetch (which tansu's memory engine would answer from the next batch),
//! no record dropped.
//!
//! `tests/ingest_alignment.rs` drains one backlog both ways with a small graph: read as
//! fetched, it loaded 12 to 18 times more nodes back (debug builds; 3.7 times in a release
//! build).
//!
//! Only the single-process roles read this way: they assign every partition themselves. The
//! facts role shares partitions with a group, whose assignment changes under it, and stores
//! facts only, which need no alignment.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use prometheus::IntGauge;
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::StreamConsumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};

use super::rebalance::RebalanceWatch;

type Queue = StreamPartitionQueue<RebalanceWatch>;

/// `head_ms` before a lane's first record.
const NO_HEAD: i64 = i64::MIN;

/// Records taken from one lane before the lanes are weighed again (weighing every lane for
/// every record costs about as much as decoding the record).
const RUN: usize = 64;

/// One partition's queue, and how far in time its reading has come.
struct Lane {
    queue: Queue,
    /// Kafka timestamp (ms) of the last record taken, or [`NO_HEAD`].
    head_ms: AtomicI64,
    /// `false` once the queue was found empty (caught up), `true` again at its next record.
    waiting: AtomicBool,
    /// The offset its next record should have (-1: unknown).
    next: AtomicI64,
}

/// Every assigned partition's queue, read in time order within `max_skew`.
pub(super) struct Lanes {
    lanes: Vec<Lane>,
    max_skew_ms: i64,
    /// Where the next sweep starts, so that no lane is always asked first.
    next: AtomicUsize,
    /// The lane a run of records is taken from, how many more it may give, and the newest
    /// head time it may reach (the slowest waiting lane's head plus the skew, when the run
    /// began).
    run: AtomicUsize,
    run_left: AtomicUsize,
    run_limit_ms: AtomicI64,
    /// `weft_ingest_partitions_held`: lanes closed at the last weighing.
    held: IntGauge,
    /// Set when a lane gave a record past the offset it should have given next
    /// ([`Lanes::take_skip`]).
    skipped: AtomicBool,
}

impl Lanes {
    /// Split every `(topic, partition, first offset)` off `consumer`'s main queue, or `None`
    /// when none could be (its records then stay on the main queue). Call it after every
    /// `assign` (librdkafka drops split queues on assign).
    pub(super) fn split(
        consumer: &Arc<StreamConsumer<RebalanceWatch>>,
        partitions: &[(String, i32, i64)],
        max_skew: Duration,
        held: IntGauge,
    ) -> Option<Self> {
        let lanes = partitions
            .iter()
            .filter_map(|(t, p, from)| Some((consumer.split_partition_queue(t, *p)?, *from)))
            .map(|(queue, from)| Lane {
                queue,
                head_ms: AtomicI64::new(NO_HEAD),
                waiting: AtomicBool::new(true),
                next: AtomicI64::new(from),
            })
            .collect::<Vec<_>>();
        if lanes.is_empty() {
            return None;
        }
        Some(Self {
            lanes,
            max_skew_ms: max_skew.as_millis() as i64,
            next: AtomicUsize::new(0),
            run: AtomicUsize::new(0),
            run_left: AtomicUsize::new(0),
            run_limit_ms: AtomicI64::new(i64::MAX),
            held,
            skipped: AtomicBool::new(false),
        })
    }

    /// Whether a lane gave a record past the offset it should have given next since the
    /// last call. The records in between may have been fetched before the split and wait
    /// in the consumer's own queue: the caller takes those first.
    pub(super) fn take_skip(&self) -> bool {
        // A load first: the loop asks after every record, and a skip is rare.
        self.skipped.load(Relaxed) && self.skipped.swap(false, Relaxed)
    }

    /// The next record of a partition not ahead of the others; waits while no queue has one.
    pub(super) async fn recv(&self) -> Result<BorrowedMessage<'_>, KafkaError> {
        // Fastest path: the run's lane has another record and is still within its limit.
        if self.run_left.load(Relaxed) > 0 {
            let i = self.run.load(Relaxed);
            if self.lanes[i].head_ms.load(Relaxed) <= self.run_limit_ms.load(Relaxed) {
                if let Some(m) = self.poll(i) {
                    self.run_left.fetch_sub(1, Relaxed);
                    return self.took(i, m);
                }
            }
            self.run_left.store(0, Relaxed);
        }
        let n = self.lanes.len();
        loop {
            let heads = self.heads();
            let open = open_lanes(&heads, self.max_skew_ms);
            self.held.set(open.iter().filter(|o| !**o).count() as i64);
            // A record already fetched, asked for without waiting, lane by lane.
            let start = self.next.load(Relaxed);
            for i in (0..n).map(|k| (start + k) % n).filter(|i| open[*i]) {
                if let Some(m) = self.poll(i) {
                    self.next.store((i + 1) % n, Relaxed);
                    self.start_run(i, &heads);
                    return self.took(i, m);
                }
            }
            // Every open lane was empty, so each is now caught up: the lanes they held back
            // open, and are asked in the next sweep. With every lane open and empty, wait
            // for the first record anywhere.
            if open.iter().all(|o| *o) {
                let waits = (0..n).map(|i| self.lanes[i].queue.recv().map(move |m| (i, m)).boxed());
                let ((i, m), _, _) = futures::future::select_all(waits).await;
                return self.took(i, m);
            }
        }
    }

    /// Lane `i`'s next record if one is already fetched; marks the lane caught up if not.
    fn poll(&self, i: usize) -> Option<Result<BorrowedMessage<'_>, KafkaError>> {
        let m = self.lanes[i].queue.recv().now_or_never();
        if m.is_none() {
            self.lanes[i].waiting.store(false, Relaxed);
        }
        m
    }

    /// Let lane `i` give up to [`RUN`] more records while it stays within the skew of the
    /// slowest waiting lane as it stands now.
    fn start_run(&self, i: usize, heads: &[(Option<i64>, bool)]) {
        let limit = match slowest(heads) {
            Some(s) if self.max_skew_ms > 0 => s.saturating_add(self.max_skew_ms),
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
        lane.waiting.store(true, Relaxed);
        if let Ok(m) = &m {
            if let Some(ts) = m.timestamp().to_millis() {
                lane.head_ms.store(ts, Relaxed);
            }
            let next = lane.next.swap(m.offset() + 1, Relaxed);
            if next >= 0 && m.offset() > next {
                self.skipped.store(true, Relaxed);
            }
        }
        m
    }

    /// Per lane: its head time ([`head_of`]: the clock is read once a weighing, not once a
    /// record), and whether records may be waiting in its queue.
    fn heads(&self) -> Vec<(Option<i64>, bool)> {
        let now = now_ms();
        self.lanes
            .iter()
            .map(|l| {
                let h = l.head_ms.load(Relaxed);
                (
                    (h != NO_HEAD).then(|| head_of(h, now)),
                    l.waiting.load(Relaxed),
                )
            })
            .collect()
    }
}

/// A lane's head time as the lanes are weighed, its last record stamped `record_ms`: never
/// past the wall clock. A
/// producer sets CreateTime, and a lane whose records claim the year 3000 would otherwise be
/// ahead of every lane still catching up, for good, and read only when all of them are found
/// empty: under steady load, never (its records held in librdkafka's queue, where no stall
/// alarm sees them). Clamped, it counts as live, like any caught-up lane.
fn head_of(record_ms: i64, now_ms: i64) -> i64 {
    record_ms.min(now_ms)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(i64::MAX, |d| d.as_millis() as i64)
}

/// Which lanes may be read, from each lane's (head time, records may be waiting): those at
/// most `max_skew_ms` ahead of the slowest waiting lane, and those without a head yet. With
/// no lane waiting, or alignment off (`max_skew_ms` 0), every lane.
fn open_lanes(heads: &[(Option<i64>, bool)], max_skew_ms: i64) -> Vec<bool> {
    let slowest = slowest(heads);
    heads
        .iter()
        .map(|(h, _)| match (h, slowest) {
            // Saturating: a record's CreateTime is the producer's, any i64.
            (Some(h), Some(s)) if max_skew_ms > 0 => *h <= s.saturating_add(max_skew_ms),
            _ => true,
        })
        .collect()
}

/// The head time of the slowest lane that may have records waiting.
fn slowest(heads: &[(Option<i64>, bool)]) -> Option<i64> {
    heads
        .iter()
        .filter(|(_, waiting)| *waiting)
        .filter_map(|(h, _)| *h)
        .min()
}

#[cfg(test)]
mod tests {
    use super::{head_of, open_lanes};

    #[test]
    fn a_lane_stamped_in_the_future_is_read_beside_live_ones() {
        let now = 1_700_000_000_000;
        let year_3000 = 32_503_680_000_000;
        // A live lane 100 ms behind the clock is waiting: the future lane stays open.
        let heads = [
            (Some(head_of(year_3000, now)), true),
            (Some(now - 100), true),
        ];
        assert_eq!(open_lanes(&heads, 500), [true, true]);
        // Unclamped it would be held while any other lane has records waiting.
        let heads = [(Some(year_3000), true), (Some(now - 100), true)];
        assert_eq!(open_lanes(&heads, 500), [false, true]);
        assert_eq!(head_of(now - 5, now), now - 5, "a past time is kept");
    }

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
    fn a_caught_up_lane_holds_nobody_back() {
        // Lane 0 is slowest but its queue was found empty: lane 1 is now the measure.
        let heads = [
            (Some(1_000), false),
            (Some(1_900), true),
            (Some(2_600), true),
        ];
        assert_eq!(open_lanes(&heads, 500), [true, true, false]);
    }

    #[test]
    fn with_no_lane_waiting_or_alignment_off_every_lane_is_read() {
        let heads = [(Some(1_000), false), (Some(9_000), false)];
        assert_eq!(open_lanes(&heads, 500), [true, true]);
        let heads = [(Some(1_000), true), (Some(9_000), true)];
        assert_eq!(open_lanes(&heads, 0), [true, true]);
    }

    #[test]
    fn extreme_record_times_open_the_slowest_lane_too() {
        // A producer may stamp any CreateTime: the sum must not wrap and close every lane
        // (which left the loop polling nothing, forever).
        let heads = [(Some(i64::MAX - 1), true), (Some(i64::MAX), false)];
        assert_eq!(open_lanes(&heads, 500), [true, true]);
        let heads = [(Some(i64::MIN), true), (Some(0), true)];
        assert_eq!(open_lanes(&heads, 500), [true, false]);
    }

    #[test]
    fn the_slowest_waiting_lane_is_always_open() {
        for skew in [1, 10, 500] {
            let heads = [(Some(5), true), (Some(3), true), (Some(400), true)];
            assert!(open_lanes(&heads, skew)[1]);
        }
    }
}
