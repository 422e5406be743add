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
use tracing::instrument;

use weft_store::chain::{ChainRow, ROWS_SQL};

use crate::sign::Key;
use crate::{ch_err, AuditError, Store};

mod unsealed;
mod verify;

pub use unsealed::copy_window_secs;
use unsealed::unsealed_problems;
pub use verify::{verify, VerifyOptions, VerifyReport};

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

/// One partition's offsets `(after, upto]` of one tenant: what every per-partition chain
/// query filters on (`{t}`, `{topic}`, `{p}`, `{after}`, `{upto}`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Span<'a> {
    pub tenant: &'a str,
    pub part: &'a Part,
    pub after: i64,
    pub upto: u64,
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
    /// The one kind the tenant's facts and links in this partition have, or `''` when they
    /// have several (a record whose `weft-kind` header names another kind than its topic's,
    /// or a row inserted behind weft's back): with it, a span's facts are read from that
    /// kind's range of `weft_events`' sort key only ([`events_span_where!`]). Found from
    /// every row of the partition in both tables when [`partitions`] ran, so a row the kind
    /// would pass over makes it `''`; a row stored later is counted by the next run (and
    /// [`seal`] reads no further than [`Part::upto`]).
    pub(super) kind: String,
    /// The highest offset of the partition's facts when [`partitions`] ran (0 without
    /// facts): every fact at or below it was there to have its kind counted, since ingest
    /// stores a partition's offsets in order.
    pub(super) upto: u64,
}

pub(super) async fn partitions(store: &Store, tenant: &str) -> Result<Vec<Part>, AuditError> {
    store
        .client()
        .query(
            "SELECT topic, partition, if(length(kinds) = 1, kinds[1], '') AS kind, upto FROM ( \
               SELECT topic, partition, groupUniqArrayArray(2)(kinds) AS kinds, \
                      max(top) AS upto FROM ( \
                 SELECT topic, partition, groupUniqArray(2)(toString(kind)) AS kinds, \
                        max(offset) AS top \
                 FROM weft_events WHERE tenant = {t:String} GROUP BY topic, partition \
                 UNION ALL \
                 SELECT topic, partition, groupUniqArray(2)(toString(kind)), toUInt64(0) \
                 FROM weft_audit_chain WHERE tenant = {t:String} GROUP BY topic, partition) \
               GROUP BY topic, partition) \
             ORDER BY topic, partition",
        )
        .param("t", tenant)
        .fetch_all()
        .await
        .map_err(ch_err(store))
}

/// What one seal did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SealReport {
    /// New links written.
    pub sealed: u64,
    /// Checkpoints written (one per partition that had new facts).
    pub checkpoints: Vec<Checkpoint>,
    /// Rows left unsealed because they fail the unsealed check (each partition is sealed up
    /// to its first such row); empty when nothing is wrong.
    #[serde(default)]
    pub held: Vec<Problem>,
}

pub(super) fn unhex32(s: &str) -> [u8; 32] {
    hex::decode(s)
        .ok()
        .and_then(|v| v.try_into().ok())
        .unwrap_or([0xff; 32])
}

/// Append every fact of `tenant` stored since the last seal to its partition's chain, and
/// checkpoint each extended chain (signed with `key` when given). Run one sealer at a time.
///
/// A seal never takes a forgery for a fact: the new rows are first checked as `verify`
/// checks unsealed ones ([`unsealed_problems`]: hash, identity, time and every
/// payload-derived column against the payload, one fact per offset, no repeated fact), and a
/// partition is sealed only up to its first row that fails; that row and the ones after it
/// stay unsealed (and named by `verify`) and are listed in [`SealReport::held`].
#[instrument(skip(store, key), fields(tenant = %tenant))]
pub async fn seal(
    store: &Store,
    tenant: &str,
    key: Option<&Key>,
    copy_window_secs: u64,
) -> Result<SealReport, AuditError> {
    let mut report = SealReport::default();
    let now = chrono::Utc::now().timestamp_micros();
    // Where the time goes (logged with the result): reading links and rows, the unsealed
    // check (its query and its per-row work), hashing, writing.
    let mut took = [std::time::Duration::ZERO; 4];
    for p in partitions(store, tenant).await? {
        let t = std::time::Instant::now();
        let span = |after| Span {
            tenant,
            part: &p,
            after,
            upto: u64::MAX,
        };
        let existing: Vec<Link> = span(-1).rows(store, LINKS_SQL).await?;
        let (after, mut prev, count) = match existing.last() {
            Some(l) => (l.offset as i64, unhex32(&l.chain), existing.len() as u64),
            None => (-1, GENESIS, 0),
        };
        // No further than the facts whose kinds `partitions` counted: a fact stored since
        // is sealed next time, so a row of another kind cannot slip past the kind's range.
        let counted = Span {
            upto: p.upto,
            ..span(after)
        };
        let mut rows: Vec<ChainRow> = counted.rows(store, ROWS_SQL).await?;
        took[0] += t.elapsed();
        let Some(upto) = rows.last().map(|r| r.offset) else {
            continue;
        };
        let t = std::time::Instant::now();
        let bad = unsealed_problems(
            store,
            Span {
                upto,
                ..span(after)
            },
            copy_window_secs,
        )
        .await?;
        took[1] += t.elapsed();
        if let Some(first) = bad.iter().map(|(_, r, _)| r.offset).min() {
            rows.retain(|r| r.offset < first);
            tracing::warn!(topic = %p.topic, partition = p.partition, offset = first,
                "not sealing from this offset on: a row disagrees with its payload or repeats another");
            for (what, r, detail) in bad {
                report.held.push(Problem {
                    what: what.into(),
                    topic: p.topic.clone(),
                    partition: p.partition,
                    offset: r.offset,
                    kind: r.kind,
                    id: r.id,
                    detail,
                });
            }
        }
        if rows.is_empty() {
            continue;
        }
        let t = std::time::Instant::now();
        let mut new = Vec::with_capacity(rows.len());
        for r in &rows {
            let rh = r.hash()?;
            prev = link(&prev, &rh);
            new.push(Link {
                tenant: tenant.to_owned(),
                topic: p.topic.clone(),
                partition: p.partition,
                offset: r.offset,
                kind: r.kind.clone(),
                id: r.id.clone(),
                ts: r.ts,
                row_hash: hex::encode(rh),
                chain: hex::encode(prev),
                sealed_at: now,
            });
        }
        took[2] += t.elapsed();
        let t = std::time::Instant::now();
        weft_store::insert::<Link>(store, "weft_audit_chain", &new).await?;
        let last = new.last().map(|l| l.offset).unwrap_or_default();
        let mut cp = Checkpoint {
            tenant: tenant.to_owned(),
            topic: p.topic.clone(),
            partition: p.partition,
            offset: last,
            head: hex::encode(prev),
            rows: count + new.len() as u64,
            kid: String::new(),
            sig: String::new(),
            sealed_at: now,
        };
        if let Some(k) = key {
            cp.kid = k.kid.clone();
            cp.sig = k.sign(&cp.statement())?;
        }
        weft_store::insert::<Checkpoint>(
            store,
            "weft_audit_checkpoints",
            std::slice::from_ref(&cp),
        )
        .await?;
        took[3] += t.elapsed();
        report.sealed += new.len() as u64;
        report.checkpoints.push(cp);
    }
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    tracing::info!(
        sealed = report.sealed,
        checkpoints = report.checkpoints.len(),
        read_ms = ms(took[0]),
        check_ms = ms(took[1]),
        hash_ms = ms(took[2]),
        write_ms = ms(took[3]),
        "sealed"
    );
    Ok(report)
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
    /// `altered`, `deleted`, `inserted`, `chain_broken` or `checkpoint_mismatch`.
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
