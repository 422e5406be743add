//! Group rebalances (the facts role shares partitions through a consumer group): the
//! callback that notes one, and what the loop does after it ([`Ingestor::after_rebalance`]).

use std::sync::Arc;
use std::time::Instant;

use rdkafka::consumer::Consumer;
use tracing::{debug, info};

use super::batch::nothing_waits;
use super::{retry_store, wait_for_earlier_inserts, IngestError, Ingestor, Role};
use crate::facts;

/// Notes group rebalances. A partition this process loses may be advanced by another
/// process before it comes back, so every cached resume point must be dropped and reread
/// from ClickHouse; the loop does that when the flag is set (buffered records of revoked
/// partitions are uncommitted, so dropping them loses nothing).
#[derive(Default)]
pub(super) struct RebalanceWatch(pub(super) Arc<std::sync::atomic::AtomicBool>);

impl rdkafka::ClientContext for RebalanceWatch {}

impl rdkafka::consumer::ConsumerContext for RebalanceWatch {
    fn pre_rebalance(
        &self,
        _: &rdkafka::consumer::BaseConsumer<Self>,
        r: &rdkafka::consumer::Rebalance<'_>,
    ) {
        if let rdkafka::consumer::Rebalance::Revoke(tpl) = r {
            info!(partitions = tpl.count(), "partitions revoked");
        }
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Ingestor {
    /// After a group rebalance: forget the partitions this process lost (their new owner
    /// rereads them from the committed offset, which never passes what is stored), and
    /// reread the resume point of those it kept, dropping buffered records that another
    /// owner stored meanwhile. Buffers of kept partitions stay: their records may not be
    /// fetched again.
    pub(super) async fn after_rebalance(&mut self) -> Result<(), IngestError> {
        if !self
            .rebalanced
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        let assigned: std::collections::HashSet<(String, i32)> = self
            .consumer
            .assignment()?
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        self.parts.retain(|k, _| assigned.contains(k));
        // The lag monitor reports only the partitions this process reads.
        if let Ok(mut pos) = self.positions.lock() {
            pos.retain(|k, _| assigned.contains(k));
        }
        if self.cfg.role == Role::Facts && !assigned.is_empty() {
            self.wait_for_previous_owners(&assigned).await?;
            self.unloaded_since = Some(Instant::now());
        }
        for st in self.parts.values_mut() {
            let stored = retry_store(&self.backoff, &self.metrics, "read progress", || {
                facts::stored_max_offset(&self.store, &st.topic, st.partition)
            })
            .await?;
            if stored > st.stored {
                st.stored = stored;
                st.facts.retain(|(o, _)| *o > stored);
                st.dead.retain(|d| d.offset > stored);
            }
            debug!(topic = %st.topic, partition = st.partition, stored = st.stored,
                last_offset = st.last_offset, buffered = st.facts.len(), expected = ?st.expected,
                "kept partition");
            // The group refetches a kept partition from its committed offset: its first
            // record may again be the broker's answer from the next batch.
            st.fresh = true;
            st.seek_back = None;
            st.quiet_since = Some(Instant::now());
            st.run_from = None;
            st.expected = st.expected.map(|e| e.max(st.stored + 1));
        }
        self.buffered = self.parts.values().fold((0, 0), |(r, b), p| {
            (r + p.facts.len() + p.dead.len(), b + p.bytes)
        });
        // The records that waited may all have gone with the revoked partitions (or been
        // stored by another owner): nothing waits now, so nothing can be stalled.
        if nothing_waits(self.buffered, &self.flusher) {
            self.metrics.health.progressed(false);
        }
        info!(partitions = assigned.len(), "rebalanced");
        Ok(())
    }

    /// In the facts role, before the resume points of an assignment are read: wait until the
    /// facts inserts running now have finished. A partition's previous owner may have been
    /// killed (or may have left) with its insert still running; read before it lands, the
    /// stored offset would send its rows again. Inserts starting later are not waited for
    /// (no previous owner starts one). None of them is this process's own: in this role a
    /// flush (a failed attempt's insert included) is settled before the loop reads another
    /// record, so the loop never waits on work it drives. Not given up on (a warning every
    /// 60 s); a stop ends it.
    async fn wait_for_previous_owners(
        &self,
        assigned: &std::collections::HashSet<(String, i32)>,
    ) -> Result<(), IngestError> {
        let new = assigned
            .iter()
            .filter(|k| !self.parts.contains_key(*k))
            .count();
        let started = Instant::now();
        wait_for_earlier_inserts(&self.backoff, &self.metrics, &self.store).await?;
        info!(
            partitions = assigned.len(),
            new,
            waited_ms = started.elapsed().as_millis() as u64,
            "waited for the facts inserts running at the rebalance"
        );
        Ok(())
    }
}
