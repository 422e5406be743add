//! Resuming inside a record batch: seek back rather than lose the batch's tail.
//!
//! A consumer that starts (or restarts, or is handed a partition) at offset X expects X to
//! come first. Apache Kafka and Redpanda answer a fetch at X with the whole batch that holds
//! X, and librdkafka drops the records before X. tansu 0.6's memory engine answers it with
//! the *next* batch instead, so X .. (next batch start - 1) would never come: facts missing,
//! narratives wrong. weft resumes at an arbitrary offset (`max(offset)` stored in ClickHouse,
//! or the group's committed offset), so this happens at almost every restart and rebalance.
//!
//! So when a partition's first record after its position was set (assignment, rebalance, or
//! one of these seeks) comes past the expected offset, and the expected offset is not below
//! the partition's low watermark (then the records are gone: a real gap, counted in
//! `weft_ingest_offset_gaps_total` as before), ingest drops the record and seeks the partition
//! back to `max(low watermark, expected - k)`, `k` = 1, then 64, 4,096, 262,144 … (×64 each
//! time) until the broker serves a batch that starts at or before the expected offset. The
//! records before the expected offset that such a batch brings are dropped uncounted (their
//! fate was decided, and counted, when they were first read), and the partition goes on
//! normally from the expected offset. Once it has sought back to the low watermark and still
//! gets a record past the expected offset, the gap is real (counted, and taken as before).
//!
//! A fetch inside the log's *last* batch gets nothing at all from that engine, so no record
//! past the expected one comes to trigger the seek: a partition that has delivered nothing
//! for [`QUIET`] after its position was set is sought back the same way ([`quiet`]), unless
//! its expected offset is its high watermark (the end of a log read to its end).
//!
//! On Kafka and Redpanda this never triggers: the first record is the expected one. A record
//! fetched before a seek and served after it (librdkafka drops those by version, so this is a
//! guard only) is past the record that caused the seek; it is dropped, not taken for an
//! answer to the seek, and not counted as a gap. Standard APIs only: `ListOffsets` (the low
//! watermark) and the consumer's `seek`.

/// By how much each further seek back reaches (the first reaches back one offset).
pub(super) const STEP_GROWTH: i64 = 64;

/// How long a partition whose position was just set may deliver nothing before [`quiet`]
/// looks at it.
pub(super) const QUIET: std::time::Duration = std::time::Duration::from_secs(2);

/// A seek back in progress on one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SeekBack {
    /// The offset sought.
    pub(super) target: i64,
    /// How far before the expected offset it lies (before the clamp to the low watermark).
    pub(super) step: i64,
    /// The offset of the record past the expected one that caused this seek: an answer to
    /// the seek starts at or before it; a record after it was fetched before the seek.
    pub(super) seen: i64,
}

/// What to do with a record of a partition whose position was just set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The usual path (the expected record, or one below it that is not a seek's).
    Take,
    /// A record before the expected offset that a seek back brought, or one fetched before
    /// the seek: dropped, counted nowhere.
    Discard,
    /// Drop the record and seek the partition to this offset.
    Seek(SeekBack),
    /// Records before this one are gone (below the low watermark), or not served even from
    /// there: count the gap and take the record.
    Gap,
}

/// Judge record `offset` of a partition expecting `expected` next, with the seek back in
/// progress (`pending`), if any: `None` for a record past the expected offset that needs the
/// partition's low watermark ([`past`] decides it).
pub(super) fn judge(expected: i64, offset: i64, pending: Option<SeekBack>) -> Option<Verdict> {
    if offset == expected {
        return Some(Verdict::Take);
    }
    if offset < expected {
        return Some(match pending {
            Some(p) if offset >= p.target => Verdict::Discard,
            // Below what was sought (a reset to the log's start), or no seek: the caller's
            // usual checks decide (a rewound log, or the facts role's legitimate rewind).
            _ => Verdict::Take,
        });
    }
    if pending.is_some_and(|p| offset > p.seen) {
        return Some(Verdict::Discard);
    }
    None
}

/// Record `offset`, past the `expected` one, with the partition's low watermark `low`: seek
/// back further (or for the first time), or a real gap.
pub(super) fn past(expected: i64, offset: i64, pending: Option<SeekBack>, low: i64) -> Verdict {
    if expected < low {
        return Verdict::Gap;
    }
    let step = match pending {
        // Already sought back to the low watermark: nothing earlier to ask for.
        Some(p) if p.target <= low => return Verdict::Gap,
        Some(p) => p.step.saturating_mul(STEP_GROWTH),
        None => 1,
    };
    Verdict::Seek(SeekBack {
        target: expected.saturating_sub(step).max(low),
        step,
        seen: offset,
    })
}

/// A partition whose position was set (or sought back) and that has delivered nothing for
/// [`QUIET`], with its watermarks `low` and `high`: seek back as [`past`] would, or `None`
/// when there is nothing to ask for. A fetch that starts inside the log's *last* batch gets
/// nothing from tansu's memory engine (there is no next batch to answer from), and no later
/// record comes to trigger [`past`]. `high` is the end the partition's fetch answers state
/// when there are any (ListOffsets' end on that engine is the base offset plus one of the
/// batch it wrote last, often below the expected offset). At the log's end
/// (`expected == high`) there is nothing to fetch, and records
/// below the low watermark are gone. The seek has no record past the expected one behind
/// it (`seen` is the largest offset), so one that comes after it escalates as [`past`] does.
pub(super) fn quiet(
    expected: i64,
    pending: Option<SeekBack>,
    low: i64,
    high: i64,
) -> Option<SeekBack> {
    if expected == high || expected <= low {
        return None;
    }
    let step = match pending {
        Some(p) if p.target <= low => return None,
        Some(p) => p.step.saturating_mul(STEP_GROWTH),
        None => 1,
    };
    Some(SeekBack {
        target: expected.saturating_sub(step).max(low),
        step,
        seen: i64::MAX,
    })
}

/// Where a record stands in its partition once the partition's position is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    /// The expected record, or the partition's first.
    Next,
    /// Past the `expected` offset: the records in between were never delivered.
    Gap { expected: i64 },
    /// Below the expected offset but inside the unbroken run of records this process took
    /// since the position was set (or read while seeking back, [`run_after_seek`]): one of
    /// them delivered again (tansu's memory engine does, after seeks back: 12002 after
    /// 12027). A copy, not a rewound log.
    Copy,
    /// Below the whole run: the log went back under weft (a recreated topic), or, in the
    /// facts role, the group refetches from its committed offset.
    Back { expected: i64 },
}

/// Place record `offset` of a partition that expects `expected` next and whose run of taken
/// records began at `run_from`.
pub(super) fn order(expected: Option<i64>, run_from: Option<i64>, offset: i64) -> Order {
    match expected {
        Some(e) if offset > e => Order::Gap { expected: e },
        Some(e) if offset < e && run_from.is_some_and(|from| offset >= from) => Order::Copy,
        Some(e) if offset < e => Order::Back { expected: e },
        _ => Order::Next,
    }
}

/// Where the run of taken records begins once record `offset`, placed `order`, is taken: a
/// gap or a step back starts a new run.
pub(super) fn run_start(run_from: Option<i64>, offset: i64, order: Order) -> Option<i64> {
    match order {
        Order::Gap { .. } | Order::Back { .. } => Some(offset),
        Order::Next | Order::Copy => run_from.or(Some(offset)),
    }
}

/// Where the run of taken records begins once a seek back has brought the expected record
/// (`offset`): the seek read the log from its target, dropping the records below the
/// expected one, so one of those served again later is a copy too. tansu's memory engine
/// does serve them again: answering a fetch that starts inside a batch, it repeats the
/// answer's last batches (it advances its read by the records it found, not by where they
/// lie). Not for a record below the target (a reset to the log's start), nor without a seek.
pub(super) fn run_after_seek(
    run_from: Option<i64>,
    offset: i64,
    sought: Option<SeekBack>,
) -> Option<i64> {
    match sought {
        Some(s) if offset >= s.target => Some(run_from.map_or(s.target, |r| r.min(s.target))),
        _ => run_from,
    }
}

#[cfg(test)]
mod tests {
    use super::{judge, order, past, quiet, run_after_seek, run_start, Order, SeekBack, Verdict};

    /// A record below the expected one is a copy only inside the run taken since the position
    /// was set; below the run (or with no run yet) it is a step back.
    #[test]
    fn a_record_taken_again_is_a_copy_only_inside_the_run() {
        assert_eq!(order(None, None, 7), Order::Next);
        assert_eq!(order(Some(10), Some(4), 10), Order::Next);
        assert_eq!(order(Some(10), Some(4), 12), Order::Gap { expected: 10 });
        assert_eq!(order(Some(10), Some(4), 4), Order::Copy);
        assert_eq!(order(Some(10), Some(4), 9), Order::Copy);
        assert_eq!(order(Some(10), Some(4), 3), Order::Back { expected: 10 });
        assert_eq!(order(Some(10), None, 9), Order::Back { expected: 10 });
    }

    /// The run begins at the first record taken and again after every gap or step back.
    #[test]
    fn a_gap_or_a_step_back_starts_a_new_run() {
        assert_eq!(run_start(None, 5, Order::Next), Some(5));
        assert_eq!(run_start(Some(5), 6, Order::Next), Some(5));
        assert_eq!(run_start(Some(5), 9, Order::Gap { expected: 7 }), Some(9));
        assert_eq!(run_start(Some(5), 2, Order::Back { expected: 7 }), Some(2));
        assert_eq!(run_start(Some(5), 6, Order::Copy), Some(5));
    }

    /// Expecting 105 in a last batch 100..109, a seek back to 41 brings 100..104 (dropped)
    /// and 105: the run now begins at 41, so 100 served again after 109 is a copy (it was a
    /// rewound log, and ingest stopped, when the run began at 105). Below 41 it is not.
    #[test]
    fn a_seek_back_that_brings_the_expected_record_starts_the_run_at_its_target() {
        let sought = Some(SeekBack {
            target: 41,
            step: 64,
            seen: i64::MAX,
        });
        let run = run_after_seek(None, 105, sought);
        assert_eq!(run, Some(41));
        let run = run_start(run, 105, order(Some(105), run, 105));
        assert_eq!(order(Some(110), run, 100), Order::Copy);
        assert_eq!(order(Some(110), run, 40), Order::Back { expected: 110 });
        assert_eq!(
            order(Some(110), Some(105), 100),
            Order::Back { expected: 110 }
        );
        // No seek, or a record below its target: the run is left as it was.
        assert_eq!(run_after_seek(None, 105, None), None);
        assert_eq!(run_after_seek(Some(7), 30, sought), Some(7));
    }

    /// [`judge`], then [`past`] with the low watermark `low` when it needs one.
    fn verdict(expected: i64, offset: i64, pending: Option<SeekBack>, low: i64) -> Verdict {
        judge(expected, offset, pending).unwrap_or_else(|| past(expected, offset, pending, low))
    }

    fn seek(target: i64, step: i64, seen: i64) -> Verdict {
        Verdict::Seek(SeekBack { target, step, seen })
    }

    /// Expecting 8 (a batch 0..9, the next from 10): the broker answers 10; seeking to 7
    /// brings 10 again, so the next seek reaches 64 further back (clamped to 0), which
    /// brings 0..7 (dropped) and then 8.
    #[test]
    fn a_resume_inside_a_batch_seeks_back_until_the_expected_record_comes() {
        let v = verdict(8, 10, None, 0);
        assert_eq!(v, seek(7, 1, 10));
        let Verdict::Seek(first) = v else { panic!() };
        let v = verdict(8, 10, Some(first), 0);
        assert_eq!(v, seek(0, 64, 10));
        let Verdict::Seek(second) = v else { panic!() };
        for o in 0..8 {
            assert_eq!(verdict(8, o, Some(second), 0), Verdict::Discard);
        }
        assert_eq!(verdict(8, 8, Some(second), 0), Verdict::Take);
    }

    #[test]
    fn the_steps_grow_geometrically_down_to_the_low_watermark() {
        let mut pending = None;
        let mut targets = Vec::new();
        loop {
            match verdict(1_000_000, 1_000_050, pending, 100) {
                Verdict::Seek(s) => {
                    targets.push(s.target);
                    pending = Some(s);
                }
                v => {
                    assert_eq!(v, Verdict::Gap, "gives up only at the low watermark");
                    break;
                }
            }
        }
        assert_eq!(
            targets,
            [999_999, 999_936, 995_904, 737_856, 100],
            "1, 64, 4096, 262144, then the low watermark"
        );
    }

    /// tansu's memory engine: expecting 490 with the last batch 480..497, whose first offset
    /// it reports as the high watermark, a fetch at 490 gets nothing. The quiet partition is
    /// sought back, further each quiet period, until a fetch starts at or before 480; what
    /// comes then is dropped up to 489 and taken from 490. At the log's end (Kafka's high
    /// watermark) or at the low watermark there is nothing to ask for.
    #[test]
    fn a_quiet_partition_inside_the_last_batch_is_sought_back() {
        let first = quiet(490, None, 0, 480).expect("a seek");
        assert_eq!((first.target, first.step), (489, 1));
        let second = quiet(490, Some(first), 0, 480).expect("a further seek");
        assert_eq!((second.target, second.step), (426, 64));
        for o in 480..490 {
            assert_eq!(verdict(490, o, Some(second), 0), Verdict::Discard);
        }
        assert_eq!(verdict(490, 490, Some(second), 0), Verdict::Take);
        // Answered from a later batch after a quiet seek: escalates, not dropped.
        assert_eq!(verdict(490, 498, Some(first), 0), seek(426, 64, 498));
        assert_eq!(quiet(490, None, 0, 490), None, "at the log's end");
        assert_eq!(quiet(0, None, 0, 480), None, "at the low watermark");
        let at_low = SeekBack {
            target: 0,
            step: 4096,
            seen: i64::MAX,
        };
        assert_eq!(
            quiet(490, Some(at_low), 0, 480),
            None,
            "sought back to the low watermark"
        );
    }

    /// Records gone to retention are a real gap: no seek, counted as before.
    #[test]
    fn an_expected_offset_below_the_low_watermark_is_a_real_gap() {
        assert_eq!(verdict(5, 300, None, 200), Verdict::Gap);
    }

    /// A record fetched before the seek (past the one that caused it) is dropped without a
    /// look at the watermark, and without counting a gap or seeking again.
    #[test]
    fn a_record_fetched_before_the_seek_is_dropped() {
        let pending = Some(SeekBack {
            target: 7,
            step: 1,
            seen: 10,
        });
        assert_eq!(judge(8, 11, pending), Some(Verdict::Discard));
    }

    /// Below what was sought (the broker reset the position), or below the expected offset
    /// with no seek: left to the usual checks (rewound log, or the facts role's rewind).
    #[test]
    fn records_below_the_seek_or_without_one_take_the_usual_path() {
        let pending = Some(SeekBack {
            target: 7,
            step: 1,
            seen: 10,
        });
        assert_eq!(verdict(8, 3, pending, 0), Verdict::Take);
        assert_eq!(verdict(8, 3, None, 0), Verdict::Take);
        assert_eq!(verdict(8, 8, None, 0), Verdict::Take);
    }

    /// Only a record past the expected one, and not a stale one, needs the low watermark.
    #[test]
    fn only_a_record_past_the_expected_one_needs_the_watermark() {
        assert_eq!(judge(8, 10, None), None);
        assert_eq!(judge(8, 8, None), Some(Verdict::Take));
    }
}
