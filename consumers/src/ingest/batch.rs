//! Per-partition buffers, and taking them out as one flush (deduplication decided here).

use std::time::{Duration, Instant};

use tracing::{error, info_span, Instrument};

use super::dead_letter::DeadLetter;
use super::flush::{FlusherSlot, Stopped};
use super::resume::SeekBack;
use super::{retry_store, IngestError, Ingestor, Role};
use crate::decode::Fact;
use crate::facts::{self, copy_hash, identity_key, DedupCache, Identity, Seen};
use weft_store::ids::id_hash;

/// Buffered work and resume points of one source partition.
pub(super) struct PartitionState {
    pub(super) topic: String,
    pub(super) partition: i32,
    /// Highest offset whose fact is stored (or that was decided not to need storing).
    pub(super) stored: i64,
    /// Highest offset projected onto narratives.
    pub(super) projected: i64,
    pub(super) dedup: DedupCache,
    pub(super) facts: Vec<(i64, Box<Fact>)>,
    pub(super) dead: Vec<DeadLetter>,
    pub(super) bytes: usize,
    pub(super) last_offset: i64,
    /// The offset the next record should carry: the resume point, then last seen + 1.
    /// weft's topics are neither compacted nor transactional, so a jump past it means records
    /// the broker never delivered; it is counted and logged, never silent.
    pub(super) expected: Option<i64>,
    /// `true` from the moment the partition's fetch position is set (assignment, a
    /// rebalance, a seek back) until a record is taken: only then may a record past
    /// `expected` be a broker's answer from the next batch ([`super::resume`]).
    pub(super) fresh: bool,
    /// The seek back in progress, if any ([`super::resume`]).
    pub(super) seek_back: Option<SeekBack>,
    /// Since when the partition's position was set, or last sought back, while no record has
    /// been taken since: a partition quiet for too long is looked at ([`super::resume::quiet`]).
    pub(super) quiet_since: Option<Instant>,
    /// Where the unbroken run of records taken since the position was set begins: every
    /// offset from it up to `expected - 1` was taken by this process, or read and dropped
    /// by the seek back that brought the expected one, so one of them delivered again is a
    /// copy, not a rewound log.
    pub(super) run_from: Option<i64>,
    pub(super) oldest: Option<Instant>,
    /// `weft_ingest_consumed_total` for this partition's topic, looked up once.
    pub(super) consumed: prometheus::IntCounter,
}

impl PartitionState {
    pub(super) fn is_empty(&self) -> bool {
        self.facts.is_empty() && self.dead.is_empty()
    }

    /// Take the buffered records out for a flush, or `None` when there is nothing to flush.
    /// Decides here, in offset order, which facts are copies of stored events (at or below
    /// the stored offset, or seen by the dedup cache with the same content: dropped) and
    /// which reuse an identity with other content (kept, flagged as conflicts).
    pub(super) fn take(&mut self, role: Role) -> Option<(FlushPart, Decided)> {
        if self.is_empty() && self.last_offset <= self.stored.min(self.projected) {
            return None;
        }
        let mut decided = Decided::default();
        let facts = std::mem::take(&mut self.facts);
        let keep = facts
            .iter()
            .map(|(offset, f)| {
                if role == Role::Narratives || *offset <= self.stored {
                    return None;
                }
                let (tenant, kind) = (&f.envelope.tenant, f.envelope.kind.as_str());
                let key = identity_key(tenant, kind, &f.id);
                match self
                    .dedup
                    .observe(key, id_hash(tenant, kind, &f.id), copy_hash_of(f))
                {
                    Seen::Duplicate => {
                        decided.duplicates += 1;
                        None
                    }
                    Seen::Conflict => {
                        decided.conflicts += 1;
                        Some(true)
                    }
                    Seen::New => Some(false),
                }
            })
            .collect();
        self.dedup.decided();
        let part = FlushPart {
            topic: self.topic.clone(),
            partition: self.partition,
            facts,
            keep,
            dead: std::mem::take(&mut self.dead),
            bytes: std::mem::take(&mut self.bytes),
            last_offset: self.last_offset,
            projected: self.projected,
        };
        self.oldest = None;
        Some((part, decided))
    }

    /// The buffered identities that neither memory nor the filter can decide.
    pub(super) fn unsure(&self) -> Vec<Identity> {
        let mut out: Vec<Identity> = self
            .facts
            .iter()
            .filter(|(offset, _)| *offset > self.stored)
            .filter_map(|(_, f)| {
                let (tenant, kind) = (&f.envelope.tenant, f.envelope.kind.as_str());
                // The filter first: most identities are new, and need no SHA-256 here.
                let h = id_hash(tenant, kind, &f.id);
                if !self.dedup.may_have_seen(h) {
                    return None;
                }
                let key = identity_key(tenant, kind, &f.id);
                self.dedup.unsure(key, h).then(|| Identity {
                    tenant: tenant.clone(),
                    kind: kind.to_owned(),
                    id: f.id.clone(),
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.tenant, &a.kind, &a.id).cmp(&(&b.tenant, &b.kind, &b.id)));
        out.dedup();
        out
    }

    /// Move the resume points past a landed flush that ended at `last`: the stored offset
    /// when this process stores facts, the projected one when it projects. Never backwards.
    pub(super) fn advance(&mut self, last: i64, has_facts: bool, has_projector: bool) {
        if has_facts {
            self.stored = self.stored.max(last);
        }
        if has_projector {
            self.projected = self.projected.max(last);
        }
    }

    /// The next offset this partition needs (what the lag monitor measures from).
    pub(super) fn next_offset(&self) -> i64 {
        self.stored.min(self.projected).max(-1) + 1
    }
}

/// Whether no fetched record waits to be stored: none buffered (`buffered`: records and
/// bytes) and no flush in flight.
pub(super) fn nothing_waits(buffered: (usize, usize), flusher: &FlusherSlot) -> bool {
    buffered.0 == 0 && !matches!(flusher, FlusherSlot::Busy(_))
}

/// What [`PartitionState::take`] decided, for the totals and metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Decided {
    /// Copies of stored events, dropped by the dedup cache.
    pub(super) duplicates: u64,
    /// Identities reused with other content, kept and flagged.
    pub(super) conflicts: u64,
}

/// One partition's share of a flush, taken out of its [`PartitionState`].
pub(super) struct FlushPart {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) facts: Vec<(i64, Box<Fact>)>,
    /// Per fact: `None` for a copy of a stored event (dropped by the dedup cache, or at or
    /// below the stored offset), else `Some(conflict)`.
    pub(super) keep: Vec<Option<bool>>,
    pub(super) dead: Vec<DeadLetter>,
    pub(super) bytes: usize,
    pub(super) last_offset: i64,
    /// Facts at or below this offset are projected already.
    pub(super) projected: i64,
}

impl FlushPart {
    /// The floor to record when this batch ends in dead letters: its last offset (at least
    /// the last dead letter's), past every fact it stores.
    pub(super) fn dead_tail(&self) -> Option<weft_store::FloorRow> {
        let last_dead = self.dead.iter().map(|d| d.offset).max()?;
        let last_fact = self
            .facts
            .iter()
            .zip(&self.keep)
            .filter(|(_, k)| k.is_some())
            .map(|((o, _), _)| *o)
            .max()
            .unwrap_or(-1);
        (last_dead > last_fact).then(|| weft_store::FloorRow {
            topic: self.topic.clone(),
            partition: self.partition as u32,
            offset: self.last_offset as u64,
        })
    }
}

impl Ingestor {
    /// Start a flush of every partition that has buffered records (dead letters, then one
    /// facts insert for all partitions alongside one projector pass for all), after the one
    /// in flight has landed. In the facts role the flush is waited for at once: a rebalance
    /// may hand a partition to another member, which must find its rows stored.
    pub(super) async fn flush(&mut self) -> Result<(), Stopped> {
        self.settle_flush().await?;
        self.check_unsure().await?;
        let batch = self.take_batch();
        if batch.is_empty() {
            return Ok(());
        }
        let FlusherSlot::Idle(flusher) = std::mem::replace(&mut self.flusher, FlusherSlot::Gone)
        else {
            return Err(Stopped);
        };
        let rows: usize = batch.iter().map(|p| p.facts.len() + p.dead.len()).sum();
        let span = info_span!("flush", partitions = batch.len(), rows);
        self.flusher = FlusherSlot::Busy(tokio::spawn(flusher.run(batch).instrument(span)));
        if self.cfg.role == Role::Facts {
            self.settle_flush().await?;
        }
        Ok(())
    }

    /// Wait for the flush in flight, if any, and move the partitions' resume points past it.
    pub(super) async fn settle_flush(&mut self) -> Result<(), Stopped> {
        let FlusherSlot::Busy(task) = &mut self.flusher else {
            return match self.flusher {
                FlusherSlot::Gone => Err(Stopped),
                _ => Ok(()),
            };
        };
        let (flusher, result) = match task.await {
            Ok(r) => r,
            Err(e) => {
                // Nothing of the batch is committed: a restart replays it.
                error!(error = %e, "the flush task failed; stopping");
                self.flusher = FlusherSlot::Gone;
                return Err(Stopped);
            }
        };
        if let Some(p) = &flusher.projector {
            self.metrics.narrative.graph_nodes.set(p.graph_len() as i64);
        }
        let has_facts = self.cfg.role != Role::Narratives;
        let has_projector = flusher.projector.is_some();
        self.flusher = FlusherSlot::Idle(flusher);
        let done = result?;
        // Progress: what was fetched before this flush is stored; what waits now is newer.
        self.metrics.health.progressed(self.buffered.0 > 0);
        self.totals.inserted += done.inserted;
        self.totals.dead_lettered += done.dead_lettered;
        for (topic, partition, last) in done.parts {
            if let Some(st) = self.parts.get_mut(&(topic, partition)) {
                st.advance(last, has_facts, has_projector);
            }
        }
        self.publish_positions();
        Ok(())
    }

    /// Ask ClickHouse about the identities no partition's dedup state can decide (older
    /// than what it holds exactly, and not ruled out by its filter), before they are.
    async fn check_unsure(&mut self) -> Result<(), Stopped> {
        if self.cfg.role == Role::Narratives {
            return Ok(());
        }
        let window = Duration::from_secs(self.cfg.dedup_window_secs);
        for st in self.parts.values_mut() {
            let unsure = st.unsure();
            if unsure.is_empty() {
                continue;
            }
            let (store, topic, partition) = (&self.store, st.topic.as_str(), st.partition);
            let found = retry_store(&self.backoff, &self.metrics, "check identities", || {
                facts::check_stored(store, topic, partition, window, &unsure)
            })
            .await
            .map_err(|e| {
                if !matches!(e, IngestError::Stopped) {
                    error!(error = %e, "checking identities failed; stopping");
                }
                Stopped
            })?;
            self.metrics.dedup_checked.inc_by(unsure.len() as u64);
            for i in &unsure {
                let hashes = found.get(i).map_or(&[][..], |v| v.as_slice());
                st.dedup
                    .stored(identity_key(&i.tenant, &i.kind, &i.id), hashes);
            }
        }
        Ok(())
    }

    /// Take every partition's buffered records out for a flush (see
    /// [`PartitionState::take`]; the dedup cache lives with the partition).
    pub(super) fn take_batch(&mut self) -> Vec<FlushPart> {
        let role = self.cfg.role;
        let mut batch = Vec::new();
        for st in self.parts.values_mut() {
            if let Some((part, decided)) = st.take(role) {
                self.totals.deduplicated += decided.duplicates;
                self.metrics.deduplicated.inc_by(decided.duplicates);
                self.metrics.conflicts.inc_by(decided.conflicts);
                batch.push(part);
            }
        }
        self.buffered = (0, 0);
        batch
    }

    /// Publish where each partition stands, for the lag monitor.
    pub(super) fn publish_positions(&self) {
        if let Ok(mut pos) = self.positions.lock() {
            for st in self.parts.values() {
                pos.insert((st.topic.clone(), st.partition), st.next_offset());
            }
        }
    }
}

/// A fact's [`copy_hash`]: its content and the request id it came with.
fn copy_hash_of(f: &Fact) -> u64 {
    copy_hash(
        &f.content_hash,
        f.envelope.request_id.as_deref().unwrap_or(""),
    )
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::Duration;

    use weft_schemas::wire::SchemaIds;
    use weft_schemas::Topics;

    use super::*;
    use crate::decode::{decode, Record};

    /// A valid trace event with identity `id`; `step` changes its content, not its identity.
    pub(in crate::ingest) fn fact(id: &str, step: &str) -> Fact {
        let value = format!(
            r#"{{"event_id":"{id}","event_type":"{step}","timestamp":"2026-03-08T06:00:05Z"}}"#
        );
        let rec = Record {
            topic: "weaver.trace_events",
            partition: 0,
            offset: 0,
            key: None,
            value: Some(value.as_bytes()),
            headers: &[],
            timestamp_ms: Some(1_700_000_000_000),
        };
        decode(&rec, &Topics::default(), &SchemaIds::default()).expect("a valid test event")
    }

    fn partition(stored: i64, projected: i64, facts: Vec<(i64, Fact)>) -> PartitionState {
        let last_offset = facts.iter().map(|(o, _)| *o).max().unwrap_or(-1);
        PartitionState {
            topic: "weaver.trace_events".into(),
            partition: 3,
            stored,
            projected,
            dedup: DedupCache::new(crate::facts::tests::limits(Duration::from_secs(3600), 1000)),
            facts: facts.into_iter().map(|(o, f)| (o, Box::new(f))).collect(),
            dead: Vec::new(),
            bytes: 100,
            last_offset,
            expected: None,
            fresh: false,
            seek_back: None,
            quiet_since: None,
            run_from: None,
            oldest: Some(Instant::now()),
            consumed: prometheus::IntCounter::new("t", "t").expect("a valid counter"),
        }
    }

    #[test]
    fn take_decides_in_offset_order_drops_copies_and_flags_conflicts() {
        let mut st = partition(
            10,
            10,
            vec![
                (10, fact("a", "flow_started")),
                (11, fact("b", "flow_started")),
                (12, fact("c", "flow_started")),
                (13, fact("c", "flow_started")),
                (14, fact("c", "flow_completed")),
                (15, fact("d", "flow_started")),
            ],
        );
        // `b` is in the dedup window already, as `load_dedup` would have put it there.
        let b = fact("b", "flow_started");
        let key = identity_key(&b.envelope.tenant, b.envelope.kind.as_str(), &b.id);
        let h = id_hash(&b.envelope.tenant, b.envelope.kind.as_str(), &b.id);
        assert_eq!(st.dedup.observe(key, h, copy_hash_of(&b)), Seen::New);

        let (part, decided) = st.take(Role::All).expect("records to flush");
        let offsets: Vec<i64> = part.facts.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, [10, 11, 12, 13, 14, 15], "facts keep their order");
        assert_eq!(
            part.keep,
            [
                None,        // 10: at or below the stored offset
                None,        // 11: a copy of an event in the dedup window
                Some(false), // 12: new
                None,        // 13: a copy of 12, in the same batch
                Some(true),  // 14: c again, other content: kept and flagged
                Some(false), // 15: new
            ]
        );
        assert_eq!(
            decided,
            Decided {
                duplicates: 2,
                conflicts: 1
            }
        );
        assert_eq!(
            (part.last_offset, part.projected, part.bytes),
            (15, 10, 100)
        );
        assert!(st.is_empty() && st.bytes == 0 && st.oldest.is_none());
    }

    #[test]
    fn the_first_of_two_contents_wins_whichever_it_is() {
        let mut st = partition(
            -1,
            -1,
            vec![
                (0, fact("c", "flow_completed")),
                (1, fact("c", "flow_started")),
            ],
        );
        let (part, decided) = st.take(Role::Facts).expect("records to flush");
        assert_eq!(part.keep, [Some(false), Some(true)]);
        assert_eq!(decided.conflicts, 1);
    }

    #[test]
    fn the_narratives_role_stores_nothing_and_leaves_the_cache_alone() {
        let mut st = partition(-1, -1, vec![(0, fact("a", "flow_started"))]);
        let (part, decided) = st.take(Role::Narratives).expect("records to project");
        assert_eq!(part.keep, [None]);
        assert_eq!(decided, Decided::default());
        assert!(st.dedup.is_empty(), "nothing observed");
    }

    #[test]
    fn an_empty_partition_is_taken_only_while_its_resume_point_lags() {
        let mut st = partition(4, 4, Vec::new());
        st.last_offset = 4;
        assert!(st.take(Role::All).is_none(), "caught up: nothing to flush");
        // Records skipped as replayed (nothing buffered) still move the resume points.
        st.last_offset = 6;
        let (part, _) = st.take(Role::All).expect("a resume point to move");
        assert!(part.facts.is_empty() && part.last_offset == 6);
    }

    #[test]
    fn advance_moves_only_what_the_role_owns_and_never_back() {
        let mut st = partition(5, 3, Vec::new());
        st.advance(8, true, false);
        assert_eq!((st.stored, st.projected), (8, 3));
        assert_eq!(st.next_offset(), 4, "the lagging resume point decides");
        st.advance(6, true, true);
        assert_eq!((st.stored, st.projected), (8, 6), "stored stays at 8");
        st.advance(9, false, true);
        assert_eq!((st.stored, st.projected), (8, 9));
        assert_eq!(st.next_offset(), 9);
        let fresh = partition(-1, i64::MAX, Vec::new());
        assert_eq!(fresh.next_offset(), 0);
    }

    #[tokio::test]
    async fn nothing_waits_only_with_nothing_buffered_and_no_flush_in_flight() {
        let gone = FlusherSlot::Gone;
        assert!(nothing_waits((0, 0), &gone));
        assert!(!nothing_waits((1, 10), &gone));
        // A flush in flight holds fetched records that are not stored yet.
        let busy = FlusherSlot::Busy(tokio::spawn(std::future::pending()));
        assert!(!nothing_waits((0, 0), &busy));
        if let FlusherSlot::Busy(t) = busy {
            t.abort();
        }
    }
}
