//! Ids in bulk: the one 64-bit hash of a (tenant, kind, id) that Rust and ClickHouse compute
//! alike, so a filter of stored ids can be rebuilt from hashes ClickHouse computes (8 bytes
//! a row, no ids on the wire); and id lists cut to fit one query parameter.

use xxhash_rust::xxh64::Xxh64;

/// XXH64 (seed 0) of tenant, kind and id joined by the unit separator (0x1f): what
/// [`id_hash_sql`] computes in ClickHouse.
pub fn id_hash(tenant: &str, kind: &str, id: &str) -> u64 {
    let mut h = Xxh64::new(0);
    h.update(tenant.as_bytes());
    h.update(&[0x1f]);
    h.update(kind.as_bytes());
    h.update(&[0x1f]);
    h.update(id.as_bytes());
    h.digest()
}

/// The ClickHouse expression of [`id_hash`] over three column expressions.
pub fn id_hash_sql(tenant: &str, kind: &str, id: &str) -> String {
    format!("xxHash64(concat({tenant}, char(31), {kind}, char(31), {id}))")
}

/// XXH64 (seed 0) of the tenant alone: what ClickHouse's `xxHash64(tenant)` computes, so a
/// narrative shard's tenants (`tenant_hash % count == index`) can be chosen on either side.
pub fn tenant_hash(tenant: &str) -> u64 {
    xxhash_rust::xxh64::xxh64(tenant.as_bytes(), 0)
}

/// The ClickHouse expression of [`tenant_hash`] over a column expression.
pub fn tenant_hash_sql(tenant: &str) -> String {
    format!("xxHash64({tenant})")
}

/// Bytes of ids per query parameter: well under ClickHouse's default 128 KiB field limit
/// (`http_max_field_value_size`), leaving room for the array's quoting and escaping.
pub const MAX_PARAM_BYTES: usize = 64 << 10;

/// What one value takes in a query parameter (its text, quotes and separator).
pub trait ParamBytes {
    /// Bytes of the value in an `Array(...)` parameter.
    fn param_bytes(&self) -> usize;
}

impl ParamBytes for String {
    fn param_bytes(&self) -> usize {
        self.len() + 4
    }
}

impl ParamBytes for (String, String) {
    fn param_bytes(&self) -> usize {
        self.0.len() + self.1.len() + 8
    }
}

/// Split `ids` into runs whose total length stays under `max_bytes` (one id per run at least).
pub fn chunks_by_bytes<T: ParamBytes>(
    ids: impl IntoIterator<Item = T>,
    max_bytes: usize,
) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut size = 0;
    for id in ids {
        let n = id.param_bytes();
        match out.last_mut() {
            Some(last) if size + n <= max_bytes => {
                size += n;
                last.push(id);
            }
            _ => {
                size = n;
                out.push(vec![id]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_stay_under_the_byte_budget_and_keep_every_id_once() {
        let ids: Vec<String> = (0..5000)
            .map(|i| format!("adhoc:trace_event:te-{i}"))
            .collect();
        let chunks = chunks_by_bytes(ids.clone(), 4096);
        assert!(chunks.len() > 1);
        for c in &chunks {
            assert!(c.iter().map(|s| s.len() + 4).sum::<usize>() <= 4096);
        }
        assert_eq!(chunks.concat(), ids);
        // An id longer than the budget still goes, alone.
        let long = vec!["x".repeat(10_000), "y".into()];
        assert_eq!(
            chunks_by_bytes(long.clone(), 100),
            vec![vec![long[0].clone()], vec!["y".to_owned()]]
        );
        assert!(chunks_by_bytes(Vec::<String>::new(), 100).is_empty());
    }

    #[test]
    fn the_separator_keeps_parts_apart() {
        assert_ne!(id_hash("ab", "c", "d"), id_hash("a", "bc", "d"));
        assert_eq!(
            id_hash_sql("tenant", "kind", "id"),
            "xxHash64(concat(tenant, char(31), kind, char(31), id))"
        );
    }
}
