//! Negative answers without a round trip: Bloom filters of node ids, rebuilt at start from
//! hashes ClickHouse computes.
//!
//! Two sets ([`IdSet`]):
//! - **Seen**: every node the narrative tables know (arrived events and both ends of every
//!   link). Before a pass settles, every id it names that is not in memory must be looked up
//!   in ClickHouse ([`super::loader`]). Most are new — an event's own id, a link to something
//!   that has not arrived — and the filter says so; only its positives (ids seen before, and
//!   about 1% false ones) are looked up.
//! - **Open**: the ids a *colored* event's link can matter to: events stored without a
//!   request id, and every target of their links. An event with a request id is its own
//!   anchor; its link to an id outside this set (a stored colored event, a phantom or flow
//!   whose stored neighbors are all colored, or a new id) changes no assignment, so the
//!   projector neither loads that id nor keeps the link in memory (ClickHouse has it). This
//!   spares the common event — one with a request id, linking to decisions and frames that
//!   also have one — the lookups of what it links to.
//!
//! **Restart in seconds.** A rebuild runs in the background (about 0.6 s per million
//! nodes), from when `weft ingest` has loaded its partitions ([`RebuildGate`]): until it
//! ends the filter answers "maybe" for every id, so a pass looks up all the
//! ids it names — slower, never wrong — and the projector works from its first batch. The
//! projector inserts the nodes it stores while the rebuild runs; both write the same
//! lock-free filter, and the rebuild's read covers every node stored before it began.
//!
//! Its size is fixed (`expected_items`), so memory stays bounded whatever the history: past
//! that many nodes its false-positive rate rises, which costs lookups, never correctness.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fastbloom::AtomicBloomFilter;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, instrument, warn, Instrument};

use super::graph::NodeKey;
use super::shard::NarrativeShard;
use weft_store::ids::{id_hash, id_hash_sql};
use weft_store::{Store, StoreError};

/// Nodes the seen filter is sized for by default (about 57 MiB at a 1% false-positive rate).
pub const DEFAULT_EXPECTED_ITEMS: usize = 50_000_000;

/// Ids the open filter is sized for by default (about 11 MiB): events without a request id
/// and their links' targets are a minority of the stream.
pub const DEFAULT_OPEN_ITEMS: usize = 10_000_000;

/// The pause after a failed rebuild read; it doubles after each failure, up to 30 s.
const FIRST_PAUSE: Duration = Duration::from_millis(500);

/// Which ids a filter holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSet {
    /// Every node the narrative tables know.
    Seen,
    /// Events stored without a request id (as nodes, or as the sources of links), and the
    /// targets of their links.
    Open,
}

impl IdSet {
    fn name(self) -> &'static str {
        match self {
            IdSet::Seen => "seen",
            IdSet::Open => "open",
        }
    }

    /// The [`id_hash`] of every id of the set for the shard's tenants, computed by ClickHouse
    /// (a shard never names another shard's ids, so their hashes would only cost memory).
    /// `weft_links_from` holds the links of events without a request id (migration 0013;
    /// before it, every link: a superset, which costs lookups, never correctness).
    fn hash_sql(self, shard: NarrativeShard) -> String {
        let only = shard.where_sql("tenant");
        let node = id_hash_sql("tenant", "kind", "id");
        let to = id_hash_sql("tenant", "to_kind", "to_id");
        match self {
            IdSet::Seen => format!(
                "SELECT {node} FROM weft_narrative_nodes{only} \
                 UNION ALL SELECT {to} FROM weft_links{only} \
                 UNION ALL SELECT {} FROM weft_links{only}",
                id_hash_sql("tenant", "from_kind", "from_id"),
            ),
            IdSet::Open => {
                let and = shard.and_sql("tenant");
                // The links' sources too: a pass killed after its links but before its
                // node rows leaves an event without a request id known only there.
                format!(
                    "SELECT {node} FROM weft_narrative_nodes WHERE request_id = ''{and} \
                     UNION ALL SELECT {to} FROM weft_links_from{only} \
                     UNION ALL SELECT {} FROM weft_links_from{only}",
                    id_hash_sql("tenant", "from_kind", "from_id"),
                )
            }
        }
    }
}

/// When a loaded projector's filters begin their rebuild. `weft ingest` keeps it shut until
/// it has loaded its partitions' resume points and dedup windows: both read ClickHouse, and
/// a restart is ready only once the partitions are, while the rebuild (every stored node's
/// hash) kept ClickHouse's cores busy for seconds at 10M events.
#[derive(Clone)]
pub struct RebuildGate(watch::Receiver<bool>);

impl RebuildGate {
    /// Open: a rebuild starts at once.
    pub fn open() -> Self {
        Self(watch::channel(true).1)
    }

    /// Shut until its sender sends `true`, or is dropped.
    pub fn shut() -> (watch::Sender<bool>, Self) {
        let (tx, rx) = watch::channel(false);
        (tx, Self(rx))
    }

    async fn passed(mut self) {
        // An error is a dropped sender: open as well.
        let _ = self.0.wait_for(|open| *open).await;
    }
}

/// A fixed-size filter of one [`IdSet`].
pub struct IdFilter {
    bloom: Arc<AtomicBloomFilter>,
    /// Set once the filter holds every stored node; before that every id is a "maybe".
    ready: Arc<AtomicBool>,
    /// The background rebuild, stopped with the filter.
    rebuild: Option<JoinHandle<()>>,
}

impl Drop for IdFilter {
    fn drop(&mut self) {
        if let Some(t) = &self.rebuild {
            t.abort();
        }
    }
}

impl IdFilter {
    /// An empty, ready filter sized for `expected_items` nodes at a 1% false-positive rate:
    /// for tables that hold nothing yet.
    pub fn new(expected_items: usize) -> Self {
        Self {
            bloom: Arc::new(empty(expected_items)),
            ready: Arc::new(AtomicBool::new(true)),
            rebuild: None,
        }
    }

    /// The filter of `set` for the shard's tenants as stored so far, rebuilt in the
    /// background once `gate` opens: it answers "maybe" for every id until
    /// [`IdFilter::ready`]. A failed read is retried (with a growing pause, up to 30 s) until
    /// it succeeds.
    pub fn load(
        store: &Store,
        set: IdSet,
        expected_items: usize,
        shard: NarrativeShard,
        gate: RebuildGate,
    ) -> Self {
        let bloom = Arc::new(empty(expected_items));
        let ready = Arc::new(AtomicBool::new(false));
        let (b, r, store) = (bloom.clone(), ready.clone(), store.clone());
        let span = tracing::info_span!("narrative_id_filter", set = set.name(), %shard);
        let task = tokio::spawn(
            async move {
                gate.passed().await;
                let mut pause = FIRST_PAUSE;
                loop {
                    let started = Instant::now();
                    match fill(&store, &b, &set.hash_sql(shard)).await {
                        Ok(n) => {
                            r.store(true, Ordering::Release);
                            let secs = started.elapsed().as_secs_f64();
                            info!(hashes = n, secs, "narrative id filter loaded");
                            return;
                        }
                        Err(e) => {
                            // A read cut short by the process stopping fails once, then the
                            // task is aborted: only a failure that repeats is a warning.
                            if pause == FIRST_PAUSE {
                                info!(error = %e, ?pause, "narrative id filter: read failed; retrying");
                            } else {
                                warn!(error = %e, ?pause, "narrative id filter: read failed again; retrying");
                            }
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(Duration::from_secs(30));
                        }
                    }
                }
            }
            .instrument(span),
        );
        Self {
            bloom,
            ready,
            rebuild: Some(task),
        }
    }

    /// Whether the filter holds every stored id of its set (its answers can then be "no").
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// `false` when the id is certainly not in the set.
    pub fn may_contain(&self, key: &NodeKey) -> bool {
        !self.ready() || self.bloom.contains_hash(hash(key))
    }

    /// Remember an id the narrative tables are about to store in the set.
    pub fn insert(&self, key: &NodeKey) {
        self.bloom.insert_hash(hash(key));
    }

    /// [`IdFilter::insert`], saying what [`IdFilter::may_contain`] said just before: one
    /// pass over the id's bits instead of two. `ready` is read first, so a "no" is only given
    /// once the rebuild's inserts are all visible.
    pub fn check_and_insert(&self, key: &NodeKey) -> bool {
        let ready = self.ready();
        let held = self.bloom.insert_hash(hash(key));
        !ready || held
    }
}

fn empty(expected_items: usize) -> AtomicBloomFilter {
    AtomicBloomFilter::with_false_pos(0.01).expected_items(expected_items.max(1))
}

/// Insert every hash `sql` yields into `bloom`; the number read.
#[instrument(skip_all)]
async fn fill(store: &Store, bloom: &AtomicBloomFilter, sql: &str) -> Result<u64, StoreError> {
    let mut cursor = store
        .client()
        .query(sql)
        .fetch::<u64>()
        .map_err(store.err())?;
    let mut n = 0u64;
    while let Some(h) = cursor.next().await.map_err(store.err())? {
        bloom.insert_hash(h);
        n += 1;
    }
    Ok(n)
}

fn hash(key: &NodeKey) -> u64 {
    id_hash(&key.tenant, key.kind.as_str(), &key.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_schemas::links::NodeKind;
    use weft_schemas::Kind;

    #[test]
    fn inserted_nodes_are_found_and_most_others_are_not() {
        let key = |i: usize| NodeKey::event("t", Kind::Handle, &format!("h-{i}"));
        let f = IdFilter::new(10_000);
        for i in 0..10_000 {
            f.insert(&key(i));
        }
        assert!(
            (0..10_000).all(|i| f.may_contain(&key(i))),
            "no false negatives"
        );
        let false_pos = (10_000..20_000).filter(|i| f.may_contain(&key(*i))).count();
        assert!(false_pos < 300, "{false_pos} false positives in 10,000");
        // The tenant and the kind are part of the identity.
        assert_ne!(
            hash(&NodeKey::event("u", Kind::Handle, "h-1")),
            hash(&key(1))
        );
        let flow = NodeKey {
            tenant: "t".into(),
            kind: NodeKind::Flow,
            id: "h-1".into(),
        };
        assert_ne!(hash(&flow), hash(&key(1)));
    }

    /// Until its rebuild has read every stored node, the filter says "maybe" to every id
    /// (here the rebuild can never succeed: nothing listens at the store's address).
    #[tokio::test]
    async fn a_filter_still_loading_says_maybe() {
        let store = Store::new(weft_store::ClickHouseConfig {
            url: "http://127.0.0.1:1".into(),
            ..weft_store::ClickHouseConfig::default()
        })
        .unwrap();
        let f = IdFilter::load(
            &store,
            IdSet::Seen,
            1_000,
            NarrativeShard::WHOLE,
            RebuildGate::open(),
        );
        let k = NodeKey::event("t", Kind::Handle, "never-stored");
        assert!(!f.ready());
        assert!(f.may_contain(&k), "a loading filter cannot say no");
        f.insert(&k);
        assert!(f.check_and_insert(&k), "nor can its check-and-insert");
        assert!(IdFilter::new(1_000).ready());
        assert!(!IdFilter::new(1_000).may_contain(&k));
    }

    #[test]
    fn check_and_insert_answers_as_may_contain_did_before_the_insert() {
        let f = IdFilter::new(10_000);
        let key = |i: usize| NodeKey::event("t", Kind::Frame, &format!("f-{i}"));
        for i in 0..5_000 {
            let before = f.may_contain(&key(i));
            assert_eq!(f.check_and_insert(&key(i)), before, "id {i}");
            assert!(f.may_contain(&key(i)), "id {i} held once inserted");
            assert!(f.check_and_insert(&key(i)), "id {i} a second time");
        }
    }

    #[test]
    fn a_shard_rebuilds_from_its_own_tenants_only() {
        let whole = IdSet::Seen.hash_sql(NarrativeShard::WHOLE);
        assert!(!whole.contains("WHERE"), "{whole}");
        let one = IdSet::Seen.hash_sql(NarrativeShard::new(1, 2).unwrap());
        assert_eq!(
            one.matches(" WHERE xxHash64(tenant) % 2 = 1").count(),
            3,
            "{one}"
        );
        let open = IdSet::Open.hash_sql(NarrativeShard::new(1, 2).unwrap());
        assert_eq!(
            open.matches("xxHash64(tenant) % 2 = 1").count(),
            3,
            "{open}"
        );
        assert!(open.contains("request_id = ''"), "{open}");
    }
}
