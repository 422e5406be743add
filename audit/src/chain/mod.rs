//! Tamper evidence: a hash chain over the stored facts, with signed checkpoints.
//!
//! **Order.** One chain per (tenant, topic, partition), in Kafka offset order: the order the
//! ingest wrote the facts in, fixed forever by the broker. (Offsets have gaps: copies dropped
//! by dedup, dead letters, other tenants' records. So a chain cannot prove that no record is
//! missing *between* two offsets from the broker; it proves that nothing stored changed.)
//!
//! **Links.** `row_hash = SHA-256(JCS(row))` where `row` is every column of `weft_events`
//! (the payload by its SHA-256), and `chain_i = SHA-256(chain_{i-1} || row_hash_i)` from
//! 32 zero bytes. [`seal`] appends the facts stored since the last seal to
//! `weft_audit_chain` and writes a checkpoint (the head) to `weft_audit_checkpoints`,
//! signed with ed25519 over `JCS({tenant, topic, partition, offset, head})` when a key is
//! configured. Export the checkpoints ([`checkpoints`]) and keep them outside ClickHouse.
//!
//! **Verify.** [`verify`] recomputes every row hash and link from genesis and compares:
//! a changed row (ALTER UPDATE) gives `altered`, a missing one (DELETE) `deleted`, a row at
//! a sealed position that is not in the chain `inserted`, a chain row that does not follow
//! from its predecessor `chain_broken`, a checkpoint whose head differs from the recomputed
//! chain (or whose signature fails) `checkpoint_mismatch`. Someone able to rewrite both
//! `weft_events` and `weft_audit_chain` consistently is caught by the signed checkpoints
//! (they cannot sign), and only for rows up to the last checkpoint they cannot replace —
//! which is why checkpoints are exported and kept elsewhere.
//!
//! **After the last seal.** Rows not sealed yet are counted as `unsealed`, and each must agree
//! with its own payload, own its offset and not repeat another fact of its partition
//! (`unsealed_problems`): that names an unsealed row altered by ALTER UPDATE, or a copy of a
//! fact under a new id, at a taken offset or at a free one.
//!
//! **Limit.** A *new* event forged behind weft's back *after* the last sealed offset of its
//! partition, consistent in every column at a free offset, looks like a fact not sealed yet;
//! the next seal would take it as genuine. Only the broker's record could refute it.

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::{ch_err, AuditError, Store};

mod seal;
mod unsealed;
mod verify;

pub use seal::{seal, SealReport, Sealer};
pub use unsealed::copy_window_secs;
use unsealed::unsealed_problems;
pub use verify::{verify, PrunedSignature, VerifyOptions, VerifyReport};

/// The link before the first row.
pub const GENESIS: [u8; 32] = [0; 32];

/// `SHA-256(prev || row_hash)`.
pub fn link(prev: &[u8; 32], row_hash: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(prev);
    h.update(row_hash);
    h.finalize().into()
}

pub(super) use weft_store::{events_span_where, kind_where, span_where};

/// The links of one partition's chain. Two sealers that ran at once (the sealing loop and
/// a `weft audit seal` by hand) write the same links twice, identical but for `sealed_at`:
/// such copies say nothing new and are read once (a link that differs in its hash or chain
/// is not a copy and is read, so it still breaks the chain).
pub(super) const LINKS_SQL: &str = concat!(
    "SELECT tenant, topic, partition, offset, kind, id, toUnixTimestamp64Micro(ts) AS ts, \
     row_hash, chain, toUnixTimestamp64Micro(min(sealed_at)) AS sealed_at \
     FROM weft_audit_chain WHERE ",
    span_where!(),
    " GROUP BY tenant, topic, partition, offset, kind, id, ts, row_hash, chain ORDER BY offset"
);

/// The checkpoints' columns as [`Checkpoint`] reads them, as a literal for `concat!`; a
/// query adds its `WHERE`.
macro_rules! checkpoints_select {
    () => {
        "SELECT tenant, topic, partition, offset, head, rows, kid, sig, \
         toUnixTimestamp64Micro(sealed_at) AS sealed_at FROM weft_audit_checkpoints"
    };
}
pub(super) use checkpoints_select;
pub(super) const CHECKPOINTS_SQL: &str = checkpoints_select!();

/// The last checkpoint of a [`Span`] (of two at one offset, the later sealed): a seal's
/// resume point, a range verify's anchor. `ORDER BY offset DESC LIMIT 1` on the table's
/// sort key reads its last granule, not every checkpoint.
pub(super) const ANCHOR_SQL: &str = concat!(
    checkpoints_select!(),
    " WHERE ",
    span_where!(),
    " ORDER BY offset DESC, sealed_at DESC LIMIT 1"
);

/// One partition's offsets `(after, upto]` of one tenant: what every per-partition chain
/// query filters on (`{t}`, `{topic}`, `{p}`, `{after}`, `{upto}`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Span<'a> {
    pub tenant: &'a str,
    pub part: &'a Part,
    pub after: i64,
    pub upto: u64,
    /// The parts of `weft_events` holding the span's facts, or empty: every part
    /// ([`weft_store::parts_where!`]).
    pub parts: &'a [String],
}

impl Span<'_> {
    /// `sql` with the span's parameters bound ([`span_where!`], and the partition's kind
    /// for [`events_span_where!`]).
    pub(super) fn query(&self, store: &Store, sql: &str) -> clickhouse::query::Query {
        store
            .client()
            .query(sql)
            .param("t", self.tenant)
            .param("topic", &self.part.topic)
            .param("p", self.part.partition)
            .param("after", self.after)
            .param("upto", self.upto)
            .param("kind", &self.part.kind)
            .param("parts", self.parts)
    }

    /// The rows `sql` selects from the span: the facts ([`ROWS_SQL`], in chain order), the
    /// links ([`LINKS_SQL`]) or the unsealed facts.
    pub(super) async fn rows<T>(&self, store: &Store, sql: &str) -> Result<Vec<T>, AuditError>
    where
        T: clickhouse::RowOwned + clickhouse::RowRead,
    {
        self.query(store, sql)
            .fetch_all()
            .await
            .map_err(ch_err(store))
    }
}

/// One link of `weft_audit_chain`.
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub struct Link {
    /// Tenant of the chain.
    pub tenant: String,
    /// Source topic of the chain.
    pub topic: String,
    /// Source partition of the chain.
    pub partition: u32,
    /// Offset of the sealed fact: its position in the chain.
    pub offset: u64,
    /// Kind of the sealed fact.
    pub kind: String,
    /// Identity of the sealed fact.
    pub id: String,
    /// Event time (micros); tells rows removed by retention from rows deleted behind weft's back.
    pub ts: i64,
    /// SHA-256 of the fact's [`ChainRow`], hex.
    pub row_hash: String,
    /// SHA-256 of the previous link's `chain` and this `row_hash`, hex: the chain so far.
    pub chain: String,
    /// When [`seal`] wrote the link (micros).
    pub sealed_at: i64,
}

/// One checkpoint: the head of a partition's chain at an offset, maybe signed.
#[derive(Debug, Clone, PartialEq, Row, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Tenant of the chain.
    pub tenant: String,
    /// Source topic of the chain.
    pub topic: String,
    /// Source partition of the chain.
    pub partition: u32,
    /// Last sealed offset the head covers.
    pub offset: u64,
    /// The chain value at `offset`, hex; what [`verify`] recomputes and compares.
    pub head: String,
    /// Links in the chain up to and including `offset`.
    pub rows: u64,
    /// Empty when unsigned.
    pub kid: String,
    /// Ed25519 signature of [`Checkpoint::statement`], base64url; empty when unsigned.
    pub sig: String,
    /// When [`seal`] wrote the checkpoint (micros).
    pub sealed_at: i64,
}

impl Checkpoint {
    /// The signed statement: JCS of `{tenant, topic, partition, offset, head}`.
    pub fn statement(&self) -> serde_json::Value {
        json!({"tenant": self.tenant, "topic": self.topic, "partition": self.partition,
               "offset": self.offset, "head": self.head})
    }
}

/// One source partition of a tenant's facts or links.
#[derive(Debug, Row, Deserialize)]
pub(super) struct Part {
    pub(super) topic: String,
    pub(super) partition: u32,
    /// The one kind the tenant's rows read in this partition have, or `''` when they have
    /// several (a record whose `weft-kind` header names another kind than its topic's, or a
    /// row inserted behind weft's back): with it, a span's facts are read from that kind's
    /// range of `weft_events`' sort key only ([`events_span_where!`]). It must be found from
    /// every row the span covers, or a row of another kind would be passed over: `verify`
    /// counts the kinds of every fact and link of the partition ([`partitions`]), a seal
    /// those of the facts it is about to seal ([`Sealer::seal`]).
    pub(super) kind: String,
}

/// Every partition of the tenant's facts, links and checkpoints, with its [`Part::kind`]: a
/// partition whose facts and links were all deleted is still listed by its checkpoints.
pub(super) async fn partitions(store: &Store, tenant: &str) -> Result<Vec<Part>, AuditError> {
    store
        .client()
        .query(
            "SELECT topic, partition, if(length(kinds) = 1, kinds[1], '') AS kind FROM ( \
               SELECT topic, partition, groupUniqArrayArray(2)(kinds) AS kinds FROM ( \
                 SELECT topic, partition, groupUniqArray(2)(toString(kind)) AS kinds \
                 FROM weft_events WHERE tenant = {t:String} GROUP BY topic, partition \
                 UNION ALL \
                 SELECT topic, partition, groupUniqArray(2)(toString(kind)) \
                 FROM weft_audit_chain WHERE tenant = {t:String} GROUP BY topic, partition \
                 UNION ALL \
                 SELECT topic, partition, CAST([], 'Array(String)') \
                 FROM weft_audit_checkpoints WHERE tenant = {t:String} GROUP BY topic, partition) \
               GROUP BY topic, partition) \
             ORDER BY topic, partition",
        )
        .param("t", tenant)
        .fetch_all()
        .await
        .map_err(ch_err(store))
}

pub(super) fn unhex32(s: &str) -> [u8; 32] {
    hex::decode(s)
        .ok()
        .and_then(|v| v.try_into().ok())
        .unwrap_or([0xff; 32])
}

/// Every checkpoint of `tenant`, oldest first: the file to keep for offline verification.
pub async fn checkpoints(store: &Store, tenant: &str) -> Result<Vec<Checkpoint>, AuditError> {
    store
        .client()
        .query(&format!(
            "{CHECKPOINTS_SQL} WHERE tenant = {{t:String}} ORDER BY sealed_at, topic, partition, offset"
        ))
        .param("t", tenant)
        .fetch_all()
        .await
        .map_err(ch_err(store))
}

/// Where a page of [`checkpoints_page`] ends: the last checkpoint's (topic, partition,
/// offset), written `topic/partition/offset` (a Kafka topic name has no `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointCursor {
    topic: String,
    partition: u32,
    offset: u64,
}

impl CheckpointCursor {
    /// Read a cursor a previous page returned.
    pub fn parse(s: &str) -> Result<Self, AuditError> {
        let bad =
            || AuditError::BadRequest(format!("not a checkpoint cursor: {}", crate::short(s)));
        let mut it = s.rsplitn(3, '/');
        let (Some(offset), Some(partition), Some(topic)) = (it.next(), it.next(), it.next()) else {
            return Err(bad());
        };
        Ok(Self {
            topic: topic.to_owned(),
            partition: partition.parse().map_err(|_| bad())?,
            offset: offset.parse().map_err(|_| bad())?,
        })
    }
}

impl std::fmt::Display for CheckpointCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.topic, self.partition, self.offset)
    }
}

/// About `limit` checkpoints of `tenant` after `cursor`, in (topic, partition, offset) order,
/// and the cursor of the next page when there may be one: what the audit API serves. The
/// table's sorting key, so a page is one range read. Two checkpoints of one offset (two
/// sealers at once) are never split between pages: a page ends with every checkpoint of its
/// last offset (`LIMIT .. WITH TIES`), so it may hold a few more than `limit`.
pub async fn checkpoints_page(
    store: &Store,
    tenant: &str,
    cursor: Option<&CheckpointCursor>,
    limit: u64,
) -> Result<(Vec<Checkpoint>, Option<CheckpointCursor>), AuditError> {
    let limit = limit.max(1);
    let (topic, partition, offset) =
        cursor.map_or(("", 0, 0), |c| (c.topic.as_str(), c.partition, c.offset));
    // The keyset condition spelled out: ClickHouse reads a tuple comparison
    // `(topic, partition, offset) > (..)` without the primary key, this with it.
    let page: Vec<Checkpoint> = store
        .client()
        .query(&format!(
            "{CHECKPOINTS_SQL} WHERE tenant = {{t:String}} AND ({{first:Bool}} \
               OR topic > {{topic:String}} \
               OR (topic = {{topic:String}} AND (partition > {{p:UInt32}} \
                   OR (partition = {{p:UInt32}} AND offset > {{o:UInt64}})))) \
             ORDER BY topic, partition, offset LIMIT {{n:UInt64}} WITH TIES"
        ))
        .param("t", tenant)
        .param("first", cursor.is_none())
        .param("topic", topic)
        .param("p", partition)
        .param("o", offset)
        .param("n", limit)
        .fetch_all()
        .await
        .map_err(ch_err(store))?;
    let next = match page.last() {
        Some(last) if page.len() as u64 >= limit => Some(CheckpointCursor {
            topic: last.topic.clone(),
            partition: last.partition,
            offset: last.offset,
        }),
        _ => None,
    };
    Ok((page, next))
}

/// One broken link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// `altered`, `deleted`, `inserted`, `chain_broken`, `checkpoint_mismatch`, or
    /// `pruned_before_invalid` / `pruned_before_unsigned` (the tenant's, not a partition's:
    /// empty topic, partition 0).
    pub what: String,
    /// Topic of the broken chain.
    pub topic: String,
    /// Partition of the broken chain.
    pub partition: u32,
    /// Offset where the problem is (the checkpoint's, for `checkpoint_mismatch`).
    pub offset: u64,
    /// Kind of the fact concerned; empty for `checkpoint_mismatch`.
    pub kind: String,
    /// Identity of the fact concerned; empty for `checkpoint_mismatch`.
    pub id: String,
    /// What differs, in words.
    pub detail: String,
}
