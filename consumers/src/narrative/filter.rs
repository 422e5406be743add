//! The negative answer for ids that were never seen: a Bloom filter of every node the
//! narrative tables know (arrived events and both ends of every link).
//!
//! Before a pass settles, every id it names that is not in memory must be looked up in
//! ClickHouse ([`super::loader`]). Most are new — an event's own id, a link to something that
//! has not arrived — and the filter says so without a round trip; only its positives (ids
//! seen before, and about 1% false ones) are looked up. It is rebuilt at start from hashes
//! ClickHouse computes ([`weft_store::ids::id_hash`], 8 bytes per node), so a restart reads
//! no ids and no payloads.
//!
//! Its size is fixed (`expected_items`), so memory stays bounded whatever the history: past
//! that many nodes its false-positive rate rises, which costs lookups, never correctness.

use fastbloom::BloomFilter;
use tracing::{info, instrument};

use super::graph::NodeKey;
use super::shard::NarrativeShard;
use weft_store::ids::{id_hash, id_hash_sql};
use weft_store::{Store, StoreError};

/// Nodes the filter is sized for by default (about 57 MiB at a 1% false-positive rate).
pub const DEFAULT_EXPECTED_ITEMS: usize = 50_000_000;

/// Every stored node's [`id_hash`] of the shard's tenants, computed by ClickHouse (a shard
/// never names another shard's ids, so their hashes would only cost memory).
fn hash_sql(shard: NarrativeShard) -> String {
    let only = shard.where_sql("tenant");
    format!(
        "SELECT {} FROM weft_narrative_nodes{only} \
         UNION ALL SELECT {} FROM weft_links{only} \
         UNION ALL SELECT {} FROM weft_links{only}",
        id_hash_sql("tenant", "kind", "id"),
        id_hash_sql("tenant", "to_kind", "to_id"),
        id_hash_sql("tenant", "from_kind", "from_id"),
    )
}

/// Which nodes the narrative tables may know.
pub struct SeenFilter {
    bloom: BloomFilter,
}

impl SeenFilter {
    /// An empty filter sized for `expected_items` nodes at a 1% false-positive rate.
    pub fn new(expected_items: usize) -> Self {
        Self {
            bloom: BloomFilter::with_false_pos(0.01).expected_items(expected_items.max(1)),
        }
    }

    /// The filter of every node of the shard's tenants stored so far.
    #[instrument(skip(store, shard), fields(shard = %shard))]
    pub async fn load(
        store: &Store,
        expected_items: usize,
        shard: NarrativeShard,
    ) -> Result<Self, StoreError> {
        let mut me = Self::new(expected_items);
        let mut cursor = store
            .client()
            .query(&hash_sql(shard))
            .fetch::<u64>()
            .map_err(store.err())?;
        let mut n = 0u64;
        while let Some(h) = cursor.next().await.map_err(store.err())? {
            me.bloom.insert_hash(h);
            n += 1;
        }
        info!(hashes = n, "narrative id filter loaded");
        Ok(me)
    }

    /// `false` when the node is certainly unknown to the narrative tables.
    pub fn may_contain(&self, key: &NodeKey) -> bool {
        self.bloom.contains_hash(hash(key))
    }

    /// Remember a node the narrative tables are about to know.
    pub fn insert(&mut self, key: &NodeKey) {
        self.bloom.insert_hash(hash(key));
    }
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
        let mut f = SeenFilter::new(10_000);
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

    #[test]
    fn a_shard_rebuilds_from_its_own_tenants_only() {
        let whole = hash_sql(NarrativeShard::WHOLE);
        assert!(!whole.contains("WHERE"), "{whole}");
        let one = hash_sql(NarrativeShard::new(1, 2).unwrap());
        assert_eq!(
            one.matches(" WHERE xxHash64(tenant) % 2 = 1").count(),
            3,
            "{one}"
        );
    }
}
