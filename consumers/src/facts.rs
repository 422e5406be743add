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
//! so they meet in one partition. [`DedupCache`] decides, per partition, whether an identity
//! was stored within the dedup window: the most recent ones in memory, the others through a
//! filter of the window and, for its positives, a ClickHouse check ([`check_stored`]); it is
//! reloaded ([`load_dedup`]) when a partition is assigned. A known identity with the same
//! content and request id is dropped ([`copy_hash`]); with different content, or the same
//! content under another request id, it is stored and flagged `conflict = 1`.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use clickhouse::Row;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use fastbloom::BloomFilter;
use weft_store::ids::{chunks_by_bytes, id_hash_sql, MAX_PARAM_BYTES};
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

/// Per-partition memory of identities, bounded by time and by size.
///
/// Exact within the window: an identity is either held exactly (two generations of at most
/// `max_entries` each, so a copy that arrives soon after its original is decided in memory),
/// or ruled out by a Bloom filter of every identity of the window (two time generations of
/// fixed size), or — the filter's positives, about 1% of new identities plus older copies —
/// [`DedupCache::unsure`] and checked in ClickHouse ([`check_stored`]) before the batch is
/// decided. Entries live between one and two `half_window`s: that is the documented window.
#[derive(Debug)]
pub struct DedupCache {
    current: HashMap<u128, Vec<u64>>,
    previous: HashMap<u128, Vec<u64>>,
    rotated_at: Instant,
    half_window: Duration,
    max_entries: usize,
    /// Every identity of the window: `[current, previous]`, rotated with time only.
    filter: [BloomFilter; 2],
    filter_items: usize,
    /// Identities checked in ClickHouse for the coming decision and found absent.
    absent: HashSet<u128>,
}

/// Bounds of a [`DedupCache`].
#[derive(Debug, Clone, Copy)]
pub struct DedupLimits {
    /// How long identities are remembered: entries live between half of it and all of it.
    pub window: Duration,
    /// Identities held exactly per generation (two generations).
    pub max_entries: usize,
    /// Identities each of the two filter generations is sized for (1% false positives).
    pub filter_items: usize,
}

/// What tells two records of one identity apart for deduplication: the payload's content
/// hash and the request id it came with. A copy under another request id is not dropped:
/// the narratives color a node by the request ids it came with (the smallest), and `weft
/// rebuild` reads those from `weft_events`, so each must be stored there (dropped, ingest's
/// narratives differed from the rebuild's). Without a request id it is the content hash's
/// first 8 bytes, as it always was.
pub fn copy_hash(content_hash: &[u8; 32], request_id: &str) -> u64 {
    let short = u64::from_le_bytes(content_hash[..8].try_into().unwrap_or_default());
    if request_id.is_empty() {
        short
    } else {
        xxhash_rust::xxh64::xxh64(request_id.as_bytes(), short)
    }
}

fn bloom(items: usize) -> BloomFilter {
    BloomFilter::with_false_pos(0.01).expected_items(items.max(1))
}

impl DedupCache {
    /// An empty cache within `limits`.
    pub fn new(limits: DedupLimits) -> Self {
        // Both generations are sized for a full one now, and keep their tables across
        // rotations: a partition's memory is the same from its first record on, rather than
        // growing until its first rotation, which a small topic's partitions reach only after
        // millions of events (the jemalloc heap profile of a soak: 60 MB of identities a
        // quarter in, 130 MB at the end).
        let max_entries = limits.max_entries.max(1);
        Self {
            current: HashMap::with_capacity(max_entries),
            previous: HashMap::with_capacity(max_entries),
            rotated_at: Instant::now(),
            half_window: limits.window / 2,
            max_entries,
            filter: [bloom(limits.filter_items), bloom(limits.filter_items)],
            filter_items: limits.filter_items,
            absent: HashSet::new(),
        }
    }

    /// Identities held exactly, summed over both generations.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// `true` when no identity is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn rotate(&mut self) {
        if self.rotated_at.elapsed() >= self.half_window {
            self.next_generation();
            self.filter.swap(0, 1);
            self.filter[0] = bloom(self.filter_items);
            self.rotated_at = Instant::now();
        }
    }

    fn known(&self, key: u128) -> Option<&Vec<u64>> {
        self.current.get(&key).or_else(|| self.previous.get(&key))
    }

    /// `false` when the window's filter rules the identity out (certainly new): the cheap
    /// first test, before the identity's SHA-256 key is computed for [`DedupCache::unsure`].
    pub fn may_have_seen(&self, id_hash: u64) -> bool {
        self.filter.iter().any(|f| f.contains_hash(id_hash))
    }

    /// `true` when neither memory nor the filter can decide `key`: check it in ClickHouse
    /// and report with [`DedupCache::stored`] before [`DedupCache::observe`].
    pub fn unsure(&self, key: u128, id_hash: u64) -> bool {
        self.known(key).is_none() && !self.absent.contains(&key) && self.may_have_seen(id_hash)
    }

    /// What ClickHouse holds for an [`unsure`](DedupCache::unsure) identity: the content
    /// hashes stored within the window (none: it is new).
    pub fn stored(&mut self, key: u128, hashes: &[u64]) {
        if hashes.is_empty() {
            self.absent.insert(key);
            return;
        }
        let entry = self.current.entry(key).or_default();
        for h in hashes {
            if !entry.contains(h) {
                entry.push(*h);
            }
        }
    }

    /// Forget the ClickHouse answers once a batch is decided, and start a new generation
    /// when this one is full. Never inside a batch: a copy later in the same batch is not
    /// stored yet, so only memory can tell it from a new event.
    pub fn decided(&mut self) {
        self.absent.clear();
        if self.current.len() >= self.max_entries {
            self.next_generation();
        }
    }

    /// The current generation becomes the previous one; both keep their tables.
    fn next_generation(&mut self) {
        std::mem::swap(&mut self.previous, &mut self.current);
        self.current.clear();
    }

    /// Classify and remember one identity and its [`copy_hash`] (`id_hash`: the identity's
    /// [`weft_store::ids::id_hash`]). An identity left [`unsure`](DedupCache::unsure) counts
    /// as new.
    pub fn observe(&mut self, key: u128, id_hash: u64, h: u64) -> Seen {
        self.rotate();
        let seen = match self.known(key) {
            None => Seen::New,
            Some(hs) if hs.contains(&h) => Seen::Duplicate,
            Some(_) => Seen::Conflict,
        };
        if seen != Seen::Duplicate {
            // The identity's contents from the previous generation move up with it once, when
            // it first enters this one (copying them at every sighting grew the entry
            // geometrically for an identity reused with new contents).
            let entry = match self.current.entry(key) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(v) => v.insert(self.previous.get(&key).cloned().unwrap_or_default()),
            };
            if !entry.contains(&h) {
                entry.push(h);
            }
            self.filter[0].insert_hash(id_hash);
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
    request_id: String,
}

impl IdentityRow {
    fn copy_hash(&self) -> u64 {
        copy_hash(&self.content_hash, &self.request_id)
    }
}

/// Highest offset stored for a source partition, or -1 when none: what `weft_events` holds,
/// or the floor retention recorded before it deleted facts (`weft_ingest_floor`), whichever
/// is higher.
pub async fn stored_max_offset(
    store: &Store,
    topic: &str,
    partition: i32,
) -> Result<i64, StoreError> {
    let highest = |table: &'static str| {
        store
            .client()
            .query(&format!(
                "SELECT count() AS n, max(offset) AS m FROM {table} \
                 WHERE topic = {{t:String}} AND partition = {{p:UInt32}}"
            ))
            .param("t", topic)
            .param("p", partition as u32)
            .fetch_all::<(u64, u64)>()
    };
    let (events, floor) =
        tokio::try_join!(highest("weft_events"), highest(weft_store::INGEST_FLOOR))
            .map_err(store.err())?;
    Ok([events, floor]
        .iter()
        .filter_map(|rows| rows.first().filter(|(n, _)| *n > 0))
        .map(|(_, m)| *m as i64)
        .max()
        .unwrap_or(-1))
}

/// A fresh cache for a partition: its window's identities in the filter, the most recent
/// `max_entries` of them held exactly.
pub async fn load_dedup(
    store: &Store,
    topic: &str,
    partition: i32,
    limits: DedupLimits,
) -> Result<DedupCache, StoreError> {
    let mut cache = DedupCache::new(limits);
    let window = "topic = {t:String} AND partition = {p:UInt32} \
                  AND ingested_at >= now64(6) - toIntervalSecond({w:UInt64})";
    let mut hashes = store
        .client()
        .query(&format!(
            "SELECT {} FROM weft_events WHERE {window}",
            id_hash_sql("tenant", "kind", "id")
        ))
        .param("t", topic)
        .param("p", partition as u32)
        .param("w", limits.window.as_secs())
        .fetch::<u64>()
        .map_err(store.err())?;
    while let Some(h) = hashes.next().await.map_err(store.err())? {
        cache.filter[0].insert_hash(h);
    }
    let mut recent = store
        .client()
        .query(&format!(
            "SELECT tenant, kind, id, content_hash, request_id FROM weft_events WHERE {window} \
             ORDER BY offset DESC LIMIT {{n:UInt64}}"
        ))
        .param("t", topic)
        .param("p", partition as u32)
        .param("w", limits.window.as_secs())
        .param("n", limits.max_entries as u64)
        .fetch::<IdentityRow>()
        .map_err(store.err())?;
    while let Some(r) = recent.next().await.map_err(store.err())? {
        cache.stored(identity_key(&r.tenant, &r.kind, &r.id), &[r.copy_hash()]);
    }
    Ok(cache)
}

/// One identity to check in ClickHouse.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Tenant.
    pub tenant: String,
    /// Event kind.
    pub kind: String,
    /// The natural id.
    pub id: String,
}

/// The [`copy_hash`]es stored within `window` in one partition for each of `ids` (absent
/// ids map to nothing). One query per tenant and kind, ids cut to fit a parameter.
pub async fn check_stored(
    store: &Store,
    topic: &str,
    partition: i32,
    window: Duration,
    ids: &[Identity],
) -> Result<HashMap<Identity, Vec<u64>>, StoreError> {
    let mut groups: HashMap<(&str, &str), Vec<String>> = HashMap::new();
    for i in ids {
        groups
            .entry((&i.tenant, &i.kind))
            .or_default()
            .push(i.id.clone());
    }
    let mut out: HashMap<Identity, Vec<u64>> = HashMap::new();
    for ((tenant, kind), group) in groups {
        for chunk in chunks_by_bytes(group, MAX_PARAM_BYTES) {
            let rows: Vec<IdentityRow> = store
                .client()
                .query(
                    "SELECT tenant, kind, id, content_hash, request_id FROM weft_events \
                     WHERE topic = {t:String} AND partition = {p:UInt32} \
                       AND ingested_at >= now64(6) - toIntervalSecond({w:UInt64}) \
                       AND tenant = {tenant:String} AND kind = {kind:String} \
                       AND id IN {ids:Array(String)}",
                )
                .param("t", topic)
                .param("p", partition as u32)
                .param("w", window.as_secs())
                .param("tenant", tenant)
                .param("kind", kind)
                .param("ids", chunk)
                .fetch_all()
                .await
                .map_err(store.err())?;
            for r in rows {
                let h = r.copy_hash();
                let key = Identity {
                    tenant: r.tenant,
                    kind: r.kind,
                    id: r.id,
                };
                out.entry(key).or_default().push(h);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn duplicates_conflicts_and_window() {
        let mut c = DedupCache::new(limits(Duration::from_secs(3600), 1000));
        let k = identity_key("t", "frame", "f1");
        assert_ne!(k, identity_key("t", "frame", "f2"));
        assert_ne!(identity_key("ab", "c", "d"), identity_key("a", "bc", "d"));
        assert_eq!(c.observe(k, 1, 1), Seen::New);
        assert_eq!(c.observe(k, 1, 1), Seen::Duplicate);
        assert_eq!(c.observe(k, 1, 2), Seen::Conflict);
        assert_eq!(c.observe(k, 1, 2), Seen::Duplicate);
        assert_eq!(c.observe(k, 1, 1), Seen::Duplicate);

        // The same content under another request id is another record, kept.
        let under = |r: &str| copy_hash(&[1; 32], r);
        assert_eq!(under(""), 0x0101_0101_0101_0101, "no request id: as before");
        assert_ne!(under("req-1"), under("req-2"));
        let mut c = DedupCache::new(limits(Duration::from_secs(3600), 1000));
        assert_eq!(c.observe(k, 1, under("req-1")), Seen::New);
        assert_eq!(c.observe(k, 1, under("req-1")), Seen::Duplicate);
        assert_eq!(c.observe(k, 1, under("req-2")), Seen::Conflict);

        let mut short_lived = DedupCache::new(limits(Duration::ZERO, 1000));
        assert_eq!(short_lived.observe(k, 1, 1), Seen::New);
        // Rotates on every call: still remembered one generation later, then forgotten.
        assert_eq!(short_lived.observe(k, 1, 1), Seen::Duplicate);
    }

    pub(crate) fn limits(window: Duration, max_entries: usize) -> DedupLimits {
        DedupLimits {
            window,
            max_entries,
            filter_items: 10_000,
        }
    }

    /// An identity reused with a new content at every sighting, across generations, holds
    /// each content hash once.
    #[test]
    fn a_reused_identity_holds_each_content_once_across_generations() {
        let mut c = DedupCache::new(limits(Duration::from_secs(3600), 1));
        let k = identity_key("t", "frame", "f1");
        for h in 0..200u64 {
            let want = if h == 0 { Seen::New } else { Seen::Conflict };
            assert_eq!(c.observe(k, 1, h), want);
            assert_eq!(c.observe(k, 1, h), Seen::Duplicate);
            if h % 50 == 49 {
                c.decided(); // a new generation: the identity is now only in the previous one
            }
        }
        assert_eq!(c.known(k).map(Vec::len), Some(200));
        assert_eq!(
            c.observe(k, 1, 0),
            Seen::Duplicate,
            "the first content is still known"
        );
    }

    /// A partition's exact identities take their memory when the partition is loaded, not
    /// bit by bit until its first rotation: a soak's memory grew for millions of events so.
    #[test]
    fn generations_hold_their_tables_from_the_first_record_on() {
        let mut c = DedupCache::new(limits(Duration::from_secs(3600), 100));
        let room = (c.current.capacity(), c.previous.capacity());
        assert!(room.0 >= 100 && room.1 >= 100, "{room:?}");
        for i in 0..1_000u32 {
            c.observe(identity_key("t", "handle", &format!("h-{i}")), i.into(), 1);
            if i % 100 == 99 {
                c.decided();
            }
        }
        let mut short_lived = DedupCache::new(limits(Duration::ZERO, 100));
        short_lived.observe(identity_key("t", "handle", "h"), 0, 1);
        assert_eq!((c.current.capacity(), c.previous.capacity()), room);
        assert_eq!(
            (
                short_lived.current.capacity(),
                short_lived.previous.capacity()
            ),
            room,
            "a rotation by time keeps them too"
        );
    }

    #[test]
    fn beyond_its_exact_entries_the_cache_asks_instead_of_guessing() {
        let mut c = DedupCache::new(limits(Duration::from_secs(3600), 10));
        let key = |i: u32| identity_key("t", "handle", &format!("h-{i}"));
        for i in 0..100u32 {
            assert_eq!(c.observe(key(i), i as u64, 1), Seen::New);
            if i % 10 == 9 {
                c.decided();
            }
        }
        assert!(c.len() <= 20, "two generations of at most 10: {}", c.len());
        // h-0 left memory long ago, but the filter knows it was seen: unsure, not new.
        assert!(c.unsure(key(0), 0));
        // Never seen at all: the filter rules it out (no ClickHouse check).
        assert!(!c.unsure(identity_key("t", "handle", "never"), 1_000_000));
        // ClickHouse says h-0 is stored with this content: a copy.
        c.stored(key(0), &[1]);
        assert!(!c.unsure(key(0), 0));
        assert_eq!(c.observe(key(0), 0, 1), Seen::Duplicate);
        // ClickHouse says h-1 is not stored (a filter false positive): new.
        c.stored(key(1), &[]);
        assert!(!c.unsure(key(1), 1));
        assert_eq!(c.observe(key(1), 1, 2), Seen::New);
        c.decided();
    }
}
