//! Per-partition buffers, and taking them out as one flush (deduplication decided here).

use std::time::Instant;

use tracing::{error, info_span, Instrument};

use super::dead_letter::DeadLetter;
use super::flush::{FlusherSlot, Stopped};
use super::{Ingestor, Role};
use crate::decode::Fact;
use crate::facts::{identity_key, DedupCache, Seen};

/// Buffered work and resume points of one source partition.
pub(super) struct PartitionState {
    pub(super) topic: String,
    pub(super) partition: i32,
    /// Highest offset whose fact is stored (or that was decided not to need storing).
    pub(super) stored: i64,
    /// Highest offset projected onto narratives.
    pub(super) projected: i64,
    pub(super) dedup: DedupCache,
    pub(super) facts: Vec<(i64, Fact)>,
    pub(super) dead: Vec<DeadLetter>,
    pub(super) bytes: usize,
    pub(super) last_offset: i64,
    /// The offset the next record should carry: the resume point, then last seen + 1.
    /// weft's topics are neither compacted nor transactional, so a jump past it means records
    /// the broker never delivered; it is counted and logged, never silent.
    pub(super) expected: Option<i64>,
    pub(super) oldest: Option<Instant>,
    /// `weft_ingest_consumed_total` for this partition's topic, looked up once.
    pub(super) consumed: prometheus::IntCounter,
}

impl PartitionState {
    pub(super) fn is_empty(&self) -> bool {
        self.facts.is_empty() && self.dead.is_empty()
    }
}

/// One partition's share of a flush, taken out of its [`PartitionState`].
pub(super) struct FlushPart {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) facts: Vec<(i64, Fact)>,
    /// Per fact: `None` for a copy of a stored event (dropped by the dedup cache, or at or
    /// below the stored offset), else `Some(conflict)`.
    pub(super) keep: Vec<Option<bool>>,
    pub(super) dead: Vec<DeadLetter>,
    pub(super) bytes: usize,
    pub(super) last_offset: i64,
    /// Facts at or below this offset are projected already.
    pub(super) projected: i64,
}

impl Ingestor {
    /// Start a flush of every partition that has buffered records (dead letters, then one
    /// facts insert for all partitions alongside one projector pass for all), after the one
    /// in flight has landed. In the facts role the flush is waited for at once: a rebalance
    /// may hand a partition to another member, which must find its rows stored.
    pub(super) async fn flush(&mut self) -> Result<(), Stopped> {
        self.settle_flush().await?;
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
            self.metrics.narrative_graph_nodes.set(p.graph_len() as i64);
        }
        let has_facts = self.cfg.role != Role::Narratives;
        let has_projector = flusher.projector.is_some();
        self.flusher = FlusherSlot::Idle(flusher);
        let done = result?;
        self.totals.inserted += done.inserted;
        self.totals.dead_lettered += done.dead_lettered;
        for (topic, partition, last) in done.parts {
            if let Some(st) = self.parts.get_mut(&(topic, partition)) {
                if has_facts {
                    st.stored = st.stored.max(last);
                }
                if has_projector {
                    st.projected = st.projected.max(last);
                }
            }
        }
        self.publish_positions();
        Ok(())
    }

    /// Take every partition's buffered records out for a flush, deciding here, in order,
    /// which facts are copies of stored events (the dedup cache lives with the partition).
    pub(super) fn take_batch(&mut self) -> Vec<FlushPart> {
        let role = self.cfg.role;
        let mut batch = Vec::new();
        for st in self.parts.values_mut() {
            if st.is_empty() && st.last_offset <= st.stored.min(st.projected) {
                continue;
            }
            let facts = std::mem::take(&mut st.facts);
            let keep = facts
                .iter()
                .map(|(offset, f)| {
                    if role == Role::Narratives || *offset <= st.stored {
                        return None;
                    }
                    let key = identity_key(&f.envelope.tenant, f.envelope.kind.as_str(), &f.id);
                    match st.dedup.observe(key, &f.content_hash) {
                        Seen::Duplicate => {
                            self.totals.deduplicated += 1;
                            self.metrics.deduplicated.inc();
                            None
                        }
                        Seen::Conflict => {
                            self.metrics.conflicts.inc();
                            Some(true)
                        }
                        Seen::New => Some(false),
                    }
                })
                .collect();
            batch.push(FlushPart {
                topic: st.topic.clone(),
                partition: st.partition,
                facts,
                keep,
                dead: std::mem::take(&mut st.dead),
                bytes: std::mem::take(&mut st.bytes),
                last_offset: st.last_offset,
                projected: st.projected,
            });
            st.oldest = None;
        }
        self.buffered = (0, 0);
        batch
    }

    /// Publish where each partition stands, for the lag monitor.
    pub(super) fn publish_positions(&self) {
        if let Ok(mut pos) = self.positions.lock() {
            for st in self.parts.values() {
                pos.insert(
                    (st.topic.clone(), st.partition),
                    st.stored.min(st.projected).max(-1) + 1,
                );
            }
        }
    }
}
