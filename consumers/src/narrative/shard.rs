//! Several narrative processes: tenant sharding (`--narrative-shard i/N`).
//!
//! A narrative component never crosses tenants (the tenant is part of every node), so the
//! tenants can be dealt out to N processes that never need each other's state. Shard `i` of
//! `N` projects the tenants whose [`tenant_hash`] is `i` modulo `N`; ClickHouse computes
//! the same hash (`xxHash64(tenant)`), so the projector's start-up reads (the unfinished-pass
//! restore, the id filter) select the shard's tenants in SQL. Every shard process still
//! reads every record of every partition: another shard's record is skipped from its
//! `weft-tenant` header, before its payload is decoded. The limit: one tenant's narratives
//! are one process's work.
//!
//! The whole stage (`0/1`, the default) is what one process always was: the same consumer
//! group, and progress rows whose `shard` column is empty.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use weft_store::ids::{tenant_hash, tenant_hash_sql};

/// A `--narrative-shard` value that is not `INDEX/COUNT` with `INDEX < COUNT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// Not two numbers around a slash.
    #[error("narrative shard `{0}`: expected INDEX/COUNT, for example 0/2 (the first of two)")]
    Syntax(String),
    /// `N` is 0.
    #[error("narrative shard `{0}`: COUNT must be at least 1")]
    ZeroCount(String),
    /// `i` is not below `N`.
    #[error("narrative shard `{0}`: INDEX must be below COUNT (shards are numbered from 0)")]
    IndexTooLarge(String),
}

/// Which tenants one narrative process projects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NarrativeShard {
    index: u32,
    count: u32,
}

impl Default for NarrativeShard {
    fn default() -> Self {
        Self::WHOLE
    }
}

impl NarrativeShard {
    /// Every tenant: one narrative process, as before sharding existed.
    pub const WHOLE: Self = Self { index: 0, count: 1 };

    /// Shard `index` of `count`.
    pub fn new(index: u32, count: u32) -> Result<Self, ShardError> {
        let text = format!("{index}/{count}");
        if count == 0 {
            return Err(ShardError::ZeroCount(text));
        }
        if index >= count {
            return Err(ShardError::IndexTooLarge(text));
        }
        Ok(Self { index, count })
    }

    /// This shard's number, from 0.
    pub fn index(self) -> u32 {
        self.index
    }

    /// How many shards share the narratives (1: not sharded).
    pub fn count(self) -> u32 {
        self.count
    }

    /// True for the whole stage (`0/1`).
    pub fn is_whole(self) -> bool {
        self.count == 1
    }

    /// Whether this shard projects `tenant`'s events.
    pub fn owns(self, tenant: &str) -> bool {
        self.is_whole() || tenant_hash(tenant) % u64::from(self.count) == u64::from(self.index)
    }

    /// The `shard` column of its `weft_projector_progress` rows: empty for the whole stage
    /// (what every row written before migration 0011 reads as), else `i/N`.
    pub fn label(self) -> String {
        if self.is_whole() {
            String::new()
        } else {
            self.to_string()
        }
    }

    /// The progress labels of all `count` shards, in shard order (`[""]` for one: the
    /// unsharded stage). `weft rebuild` writes progress under these, `weft reshard` moves it.
    pub fn labels(count: u32) -> Vec<String> {
        let count = count.max(1);
        (0..count)
            .filter_map(|i| Self::new(i, count).ok())
            .map(Self::label)
            .collect()
    }

    /// The suffix of its consumer group after `<group_id>.narratives`: none for the whole
    /// stage, else `.<i>of<N>`, so every shard commits under a group of its own.
    pub fn group_suffix(self) -> String {
        if self.is_whole() {
            String::new()
        } else {
            format!(".{}of{}", self.index, self.count)
        }
    }

    /// The shard's condition on a tenant column (`xxHash64(tenant) % N = i`), or `None` for
    /// the whole stage (so an unsharded query is the one it always was).
    pub fn sql_condition(self, tenant_column: &str) -> Option<String> {
        (!self.is_whole()).then(|| {
            format!(
                "{} % {} = {}",
                tenant_hash_sql(tenant_column),
                self.count,
                self.index
            )
        })
    }

    /// `" AND <the condition>"`, or nothing for the whole stage.
    pub fn and_sql(self, tenant_column: &str) -> String {
        self.sql_condition(tenant_column)
            .map(|c| format!(" AND {c}"))
            .unwrap_or_default()
    }

    /// `" WHERE <the condition>"`, or nothing for the whole stage.
    pub fn where_sql(self, tenant_column: &str) -> String {
        self.sql_condition(tenant_column)
            .map(|c| format!(" WHERE {c}"))
            .unwrap_or_default()
    }
}

impl fmt::Display for NarrativeShard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for NarrativeShard {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || ShardError::Syntax(s.to_owned());
        let (i, n) = s.trim().split_once('/').ok_or_else(syntax)?;
        let i: u32 = i.trim().parse().map_err(|_| syntax())?;
        let n: u32 = n.trim().parse().map_err(|_| syntax())?;
        Self::new(i, n)
    }
}

impl Serialize for NarrativeShard {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NarrativeShard {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_i_of_n_and_refuses_the_rest() {
        let s: NarrativeShard = "1/3".parse().unwrap();
        assert_eq!((s.index(), s.count(), s.to_string()), (1, 3, "1/3".into()));
        assert_eq!(
            " 0 / 2 ".parse::<NarrativeShard>().unwrap().to_string(),
            "0/2"
        );
        assert!(matches!(
            "2/2".parse::<NarrativeShard>(),
            Err(ShardError::IndexTooLarge(_))
        ));
        assert!(matches!(
            "0/0".parse::<NarrativeShard>(),
            Err(ShardError::ZeroCount(_))
        ));
        for bad in ["", "1", "a/2", "1/b", "-1/2", "1/2/3"] {
            assert!(
                matches!(bad.parse::<NarrativeShard>(), Err(ShardError::Syntax(_))),
                "{bad}"
            );
        }
        let err = "3/2".parse::<NarrativeShard>().unwrap_err().to_string();
        assert!(err.contains("3/2") && err.contains("below COUNT"), "{err}");
    }

    #[test]
    fn the_whole_stage_is_what_one_process_always_was() {
        let w = NarrativeShard::default();
        assert!(w.is_whole() && w == "0/1".parse().unwrap());
        assert_eq!(
            (
                w.label(),
                w.group_suffix(),
                w.and_sql("t"),
                w.where_sql("t")
            ),
            Default::default()
        );
        assert!(w.owns("anyone"));
        let s = NarrativeShard::new(1, 2).unwrap();
        assert_eq!(s.label(), "1/2");
        assert_eq!(s.group_suffix(), ".1of2");
        assert_eq!(s.and_sql("tenant"), " AND xxHash64(tenant) % 2 = 1");
        assert_eq!(s.where_sql("t"), " WHERE xxHash64(t) % 2 = 1");
    }

    #[test]
    fn one_shard_is_the_unsharded_label() {
        assert_eq!(NarrativeShard::labels(0), [""]);
        assert_eq!(NarrativeShard::labels(1), [""]);
        assert_eq!(NarrativeShard::labels(3), ["0/3", "1/3", "2/3"]);
    }

    #[test]
    fn every_tenant_belongs_to_exactly_one_shard() {
        let shards: Vec<NarrativeShard> =
            (0..3).map(|i| NarrativeShard::new(i, 3).unwrap()).collect();
        let mut per_shard = [0; 3];
        for t in 0..300 {
            let tenant = format!("tenant-{t}");
            let owners: Vec<u32> = shards
                .iter()
                .filter(|s| s.owns(&tenant))
                .map(|s| s.index())
                .collect();
            assert_eq!(owners.len(), 1, "{tenant}: {owners:?}");
            per_shard[owners[0] as usize] += 1;
        }
        assert!(per_shard.iter().all(|n| *n > 50), "{per_shard:?}");
    }

    #[test]
    fn configuration_reads_and_writes_it_as_a_string() {
        #[derive(Deserialize, Serialize)]
        struct C {
            s: NarrativeShard,
        }
        let c: C = serde_json::from_str(r#"{"s":"1/4"}"#).unwrap();
        assert_eq!(c.s, NarrativeShard::new(1, 4).unwrap());
        assert_eq!(serde_json::to_string(&c).unwrap(), r#"{"s":"1/4"}"#);
        let err = serde_json::from_str::<C>(r#"{"s":"4/4"}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("below COUNT"), "{err}");
    }
}
