//! The facts table (`weft_events`, rows in `weft_store::events`): identity deduplication and
//! exactly-once progress.
//!
//! **Exactly-once effect.** One insert at a time carries a batch's rows of every source
//! partition, and every insert is one part (one `ingested_at` per batch, hence one table
//! partition), so it lands whole or not at all. The `progress` projection stores `max(offset)` per source
//! partition inside each part. A consumer that (re)starts a partition reads that maximum and
//! skips every record at or below it: a batch replayed after any crash is never stored twice,
//! and Kafka's committed offset is only a hint for where to start reading.
//!
//! **Identity deduplication.** Copies of one event share a Kafka key (request id or identity),
//! so they meet in one partition. [`DedupCache`] remembers, per partition, the content hash of
//! every identity seen within the dedup window; it is reloaded from the `by_partition`
//! projection when a partition is assigned. A known identity with the same content is dropped;
//! with different content it is stored and flagged `conflict = 1`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clickhouse::Row;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use weft_store::{Store, StoreError};

/// 128-bit digest of (tenant, kind, id): the dedup key. Collisions are negligible at any
/// realistic volume (birthday bound ~2^64 events).
pub fn identity_key(tenant: &str, kind: &str, id: &str) -> u128 {
    let mut h = Sha256::new();
    for part in [tenant, kind, id] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let d = h.finalize();
    u128::from_le_bytes(d[..16].try_into().unwrap_or_default())
}

/// What the cache says about an incoming fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Never seen: store it.
    New,
    /// Same identity, same content: drop it.
    Duplicate,
    /// Same identity, different content: store it and flag the conflict.
    Conflict,
}

/// Per-partition memory of identities, bounded by time with two generations: entries live
/// between one and two `half_window`s, which is the documented dedup window.
#[derive(Debug)]
pub struct DedupCache {
    current: HashMap<u128, Vec<u64>>,
    previous: HashMap<u128, Vec<u64>>,
    rotated_at: Instant,
    half_window: Duration,
}

fn short(hash: &[u8; 32]) -> u64 {
    u64::from_le_bytes(hash[..8].try_into().unwrap_or_default())
}

impl DedupCache {
    /// An empty cache whose entries live between `window / 2` and `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            current: HashMap::new(),
            previous: HashMap::new(),
            rotated_at: Instant::now(),
            half_window: window / 2,
        }
    }

    /// Identities remembered, summed over both generations.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// `true` when no identity is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Classify and remember one identity/content pair.
    pub fn observe(&mut self, key: u128, hash: &[u8; 32]) -> Seen {
        if self.rotated_at.elapsed() >= self.half_window {
            self.previous = std::mem::take(&mut self.current);
            self.rotated_at = Instant::now();
        }
        let h = short(hash);
        let known: Option<&Vec<u64>> = self.current.get(&key).or_else(|| self.previous.get(&key));
        let seen = match known {
            None => Seen::New,
            Some(hs) if hs.contains(&h) => Seen::Duplicate,
            Some(_) => Seen::Conflict,
        };
        if seen != Seen::Duplicate {
            let mut hashes = self.previous.get(&key).cloned().unwrap_or_default();
            let entry = self.current.entry(key).or_default();
            entry.append(&mut hashes);
            if !entry.contains(&h) {
                entry.push(h);
            }
        }
        seen
    }

    /// Forget an observation that was not stored after all (its insert is being retried
    /// from scratch by a new owner); used only when a batch is abandoned.
    pub fn clear(&mut self) {
        self.current.clear();
        self.previous.clear();
    }
}

#[derive(Debug, Row, Deserialize)]
struct IdentityRow {
    tenant: String,
    kind: String,
    id: String,
    content_hash: [u8; 32],
}

/// Highest offset stored for a source partition, or -1 when none.
pub async fn stored_max_offset(
    store: &Store,
    topic: &str,
    partition: i32,
) -> Result<i64, StoreError> {
    let rows: Vec<(u64, u64)> = store
        .client()
        .query(
            "SELECT count() AS n, max(offset) AS m FROM weft_events \
             WHERE topic = {t:String} AND partition = {p:UInt32}",
        )
        .param("t", topic)
        .param("p", partition as u32)
        .fetch_all()
        .await
        .map_err(store.err())?;
    Ok(match rows.first() {
        Some((n, m)) if *n > 0 => *m as i64,
        _ => -1,
    })
}

/// Reload the identities a partition stored within `window` into a fresh cache.
pub async fn load_dedup(
    store: &Store,
    topic: &str,
    partition: i32,
    window: Duration,
) -> Result<DedupCache, StoreError> {
    let mut cache = DedupCache::new(window);
    let mut cursor = store
        .client()
        .query(
            "SELECT tenant, kind, id, content_hash FROM weft_events \
             WHERE topic = {t:String} AND partition = {p:UInt32} \
               AND ingested_at >= now64(6) - toIntervalSecond({w:UInt64})",
        )
        .param("t", topic)
        .param("p", partition as u32)
        .param("w", window.as_secs())
        .fetch::<IdentityRow>()
        .map_err(store.err())?;
    while let Some(r) = cursor.next().await.map_err(store.err())? {
        cache.observe(identity_key(&r.tenant, &r.kind, &r.id), &r.content_hash);
    }
    Ok(cache)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_conflicts_and_window() {
        let mut c = DedupCache::new(Duration::from_secs(3600));
        let k = identity_key("t", "frame", "f1");
        assert_ne!(k, identity_key("t", "frame", "f2"));
        assert_ne!(identity_key("ab", "c", "d"), identity_key("a", "bc", "d"));
        assert_eq!(c.observe(k, &[1; 32]), Seen::New);
        assert_eq!(c.observe(k, &[1; 32]), Seen::Duplicate);
        assert_eq!(c.observe(k, &[2; 32]), Seen::Conflict);
        assert_eq!(c.observe(k, &[2; 32]), Seen::Duplicate);
        assert_eq!(c.observe(k, &[1; 32]), Seen::Duplicate);

        let mut short_lived = DedupCache::new(Duration::ZERO);
        assert_eq!(short_lived.observe(k, &[1; 32]), Seen::New);
        // Rotates on every call: still remembered one generation later, then forgotten.
        assert_eq!(short_lived.observe(k, &[1; 32]), Seen::Duplicate);
    }
}
