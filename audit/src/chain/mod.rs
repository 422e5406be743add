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

use std::collections::{BTreeSet, HashMap};

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

/// Every partition of the tenant's facts and links, with its [`Part::kind`].
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

/// Every source partition of `weft_events`, with its highest stored offset over all tenants:
/// read from the `progress` projection, so it costs the number of parts, not of rows.
const TOPS_SQL: &str =
    "SELECT topic, partition, max(offset) AS top FROM weft_events GROUP BY topic, partition";

/// The last checkpoint of one tenant's partition (of two at one offset, the later sealed):
/// where its chain resumes. `ORDER BY offset DESC LIMIT 1` on the table's sort key reads its
/// last granule, not every checkpoint.
const LAST_CHECKPOINT_SQL: &str = concat!(
    checkpoints_select!(),
    " WHERE tenant = {t:String} AND topic = {topic:String} AND partition = {p:UInt32} \
     ORDER BY offset DESC, sealed_at DESC LIMIT 1"
);

/// The kinds (two at most), the highest offset, the number and the parts of one tenant's
/// facts in a partition's offsets `(after, upto]`. Every column is in the `by_partition`
/// projection, ordered by `(topic, partition, offset)`, so ClickHouse reads only that offset
/// range (and `_part` names the part of `weft_events` the projection's row belongs to).
const NEW_FACTS_SQL: &str = "SELECT groupUniqArray(2)(toString(kind)) AS kinds, \
     max(offset) AS upto, count() AS n, groupUniqArray(_part) AS parts FROM weft_events \
     WHERE topic = {topic:String} AND partition = {p:UInt32} \
       AND offset > {after:Int64} AND offset <= {upto:UInt64} AND tenant = {t:String}";

/// The tenants with facts in a partition's offsets `(after, upto]`, from the `by_partition`
/// projection (`GROUP BY`, not `DISTINCT`, which ClickHouse 26.9 answers from the table).
const NEW_TENANTS_SQL: &str = "SELECT toString(tenant) AS t FROM weft_events \
     WHERE topic = {topic:String} AND partition = {p:UInt32} \
       AND offset > {after:Int64} AND offset <= {upto:UInt64} GROUP BY t";

/// A partition's global top ([`TOPS_SQL`]).
#[derive(Debug, Row, Deserialize)]
struct Top {
    topic: String,
    partition: u32,
    top: u64,
}

/// What [`NEW_FACTS_SQL`] finds.
#[derive(Debug, Row, Deserialize)]
struct NewFacts {
    kinds: Vec<String>,
    upto: u64,
    n: u64,
    parts: Vec<String>,
}

/// Where a partition's chain resumes: its last link's offset and value, and how many links
/// it has. From the last checkpoint and the links after it (a seal killed between its links
/// and its checkpoint leaves some; sealing them again writes the same links).
async fn resume(
    store: &Store,
    tenant: &str,
    topic: &str,
    partition: u32,
) -> Result<(i64, [u8; 32], u64), AuditError> {
    let cp: Option<Checkpoint> = store
        .client()
        .query(LAST_CHECKPOINT_SQL)
        .param("t", tenant)
        .param("topic", topic)
        .param("p", partition)
        .fetch_optional()
        .await
        .map_err(ch_err(store))?;
    let (from, head, rows) = match &cp {
        // The link at the checkpoint's own offset too, whose value the seal extends.
        Some(c) => (c.offset as i64 - 1, unhex32(&c.head), c.rows),
        None => (-1, GENESIS, 0),
    };
    let part = Part {
        topic: topic.to_owned(),
        partition,
        kind: String::new(),
    };
    let span = Span {
        tenant,
        part: &part,
        after: from,
        upto: u64::MAX,
        parts: &[],
    };
    let links: Vec<Link> = span.rows(store, LINKS_SQL).await?;
    let beyond = links
        .iter()
        .filter(|l| cp.as_ref().is_none_or(|c| l.offset > c.offset))
        .count() as u64;
    Ok(match links.last() {
        Some(l) => (l.offset as i64, unhex32(&l.chain), rows + beyond),
        // Links deleted behind weft's back: the checkpoint still says where the chain was
        // (`verify` names what is missing).
        None => (cp.as_ref().map_or(-1, |c| c.offset as i64), head, rows),
    })
}

/// Seals tenants' new facts; [`Sealer::seal`] costs what was stored since its last call,
/// not the history: where each chain resumes is read from its last checkpoint, which facts
/// are new from `weft_events`' `by_partition` projection, and a partition where a tenant
/// had nothing new is not read again below what was found empty (kept in memory, per
/// tenant and partition: one `Sealer` for a loop, a fresh one for a single seal).
#[derive(Debug, Default)]
pub struct Sealer {
    /// (tenant, topic, partition) → the offset up to which the tenant has no fact left to
    /// seal (every one below it is sealed, or the tenant has none there).
    scanned: HashMap<(String, String, u32), u64>,
    /// (topic, partition) → the highest offset whose tenants [`Sealer::seal_new`] has read.
    tops: HashMap<(String, u32), u64>,
    /// Tenants whose last seal failed or held rows back: sealed again by the next round.
    retry: BTreeSet<String>,
}

/// Every partition's highest stored offset ([`TOPS_SQL`]).
async fn tops(store: &Store) -> Result<Vec<Top>, AuditError> {
    store
        .client()
        .query(TOPS_SQL)
        .fetch_all()
        .await
        .map_err(ch_err(store))
}

impl Sealer {
    /// Append every fact of `tenant` stored since the last seal to its partition's chain,
    /// and checkpoint each extended chain (signed with `key` when given). Two sealers at
    /// once write the same links (read once by `verify`).
    ///
    /// A seal never takes a forgery for a fact: the new rows are first checked as `verify`
    /// checks unsealed ones ([`unsealed_problems`]: hash, identity, time and every
    /// payload-derived column against the payload, one fact per offset, no repeated fact),
    /// and a partition is sealed only up to its first row that fails; that row and the ones
    /// after it stay unsealed (and named by `verify`) and are listed in [`SealReport::held`].
    pub async fn seal(
        &mut self,
        store: &Store,
        tenant: &str,
        key: Option<&Key>,
        copy_window_secs: u64,
    ) -> Result<SealReport, AuditError> {
        let tops = tops(store).await?;
        self.seal_upto(store, tenant, &tops, key, copy_window_secs)
            .await
    }

    /// [`Sealer::seal`] every tenant with facts stored since this sealer's last call (every
    /// tenant with facts on the first), and every tenant whose last seal failed or held
    /// rows back: what the sealing loop of `weft audit serve` runs. The tenants are found
    /// from the new offsets of each partition (`by_partition` projection), so a round with
    /// nothing new reads nothing but each partition's highest offset.
    pub async fn seal_new(
        &mut self,
        store: &Store,
        key: Option<&Key>,
        copy_window_secs: u64,
    ) -> Result<Vec<(String, Result<SealReport, AuditError>)>, AuditError> {
        let tops = tops(store).await?;
        // Nothing changes until every partition is read: a failed read loses no tenant.
        let mut tenants = self.retry.clone();
        let mut read = Vec::new();
        for t in &tops {
            let seen = (t.topic.clone(), t.partition);
            let after = self.tops.get(&seen).map_or(-1, |&o| o as i64);
            if after >= t.top as i64 {
                continue;
            }
            let found: Vec<String> = store
                .client()
                .query(NEW_TENANTS_SQL)
                .param("topic", &t.topic)
                .param("p", t.partition)
                .param("after", after)
                .param("upto", t.top)
                .fetch_all()
                .await
                .map_err(ch_err(store))?;
            tenants.extend(found);
            read.push((seen, t.top));
        }
        self.tops.extend(read);
        self.retry.clear();
        let mut out = Vec::with_capacity(tenants.len());
        for t in tenants {
            let r = self
                .seal_upto(store, &t, &tops, key, copy_window_secs)
                .await;
            if r.as_ref().map_or(true, |r| !r.held.is_empty()) {
                self.retry.insert(t.clone());
            }
            out.push((t, r));
        }
        Ok(out)
    }

    /// [`Sealer::seal`] of the facts up to `tops`.
    #[instrument(skip(self, store, tops, key), fields(tenant = %tenant))]
    async fn seal_upto(
        &mut self,
        store: &Store,
        tenant: &str,
        tops: &[Top],
        key: Option<&Key>,
        copy_window_secs: u64,
    ) -> Result<SealReport, AuditError> {
        let mut report = SealReport::default();
        let now = chrono::Utc::now().timestamp_micros();
        // Where the time goes (logged with the result): finding what is new and reading it,
        // the unsealed check (its query and its per-row work), hashing, writing.
        let mut took = [std::time::Duration::ZERO; 4];
        for &Top {
            ref topic,
            partition,
            top,
        } in tops
        {
            let t = std::time::Instant::now();
            let done = (tenant.to_owned(), topic.clone(), partition);
            if self.scanned.get(&done).is_some_and(|&s| s >= top) {
                continue;
            }
            let (after, mut prev, count) = resume(store, tenant, topic, partition).await?;
            let from = self
                .scanned
                .get(&done)
                .map_or(after, |&s| (s as i64).max(after));
            // Ingest stores a partition's offsets in order, so every fact up to `top` is
            // stored: their kinds are all counted, and a fact stored since waits for the
            // next seal.
            let new: NewFacts = store
                .client()
                .query(NEW_FACTS_SQL)
                .param("t", tenant)
                .param("topic", topic)
                .param("p", partition)
                .param("after", from)
                .param("upto", top)
                .fetch_one()
                .await
                .map_err(ch_err(store))?;
            if new.n == 0 {
                self.scanned.insert(done, top);
                continue;
            }
            let p = Part {
                topic: topic.clone(),
                partition,
                kind: match new.kinds.as_slice() {
                    [one] => one.clone(),
                    _ => String::new(),
                },
            };
            // The new facts are read from their parts only: in a steady stream, the few
            // small parts written since the last seal, not the kind's whole range.
            let mut span = Span {
                tenant,
                part: &p,
                after: from,
                upto: new.upto,
                parts: &new.parts,
            };
            let mut rows: Vec<ChainRow> = span.rows(store, ROWS_SQL).await?;
            if rows.len() as u64 != new.n {
                // A part merged away (or a fact deleted) since they were counted.
                span.parts = &[];
                rows = span.rows(store, ROWS_SQL).await?;
            }
            took[0] += t.elapsed();
            let t = std::time::Instant::now();
            let bad = unsealed_problems(store, span, Some(rows.len()), copy_window_secs).await?;
            took[1] += t.elapsed();
            // Sealed through `top` (once the writes below succeed) unless a row is held.
            let clean = bad.is_empty();
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
            let Some(last) = rows.last().map(|r| r.offset) else {
                continue;
            };
            let t = std::time::Instant::now();
            let mut links = Vec::with_capacity(rows.len());
            for r in &rows {
                let rh = r.hash()?;
                prev = link(&prev, &rh);
                links.push(Link {
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
            let mut cp = Checkpoint {
                tenant: tenant.to_owned(),
                topic: p.topic.clone(),
                partition: p.partition,
                offset: last,
                head: hex::encode(prev),
                rows: count + links.len() as u64,
                kid: String::new(),
                sig: String::new(),
                sealed_at: now,
            };
            if let Some(k) = key {
                cp.kid = k.kid.clone();
                cp.sig = k.sign(&cp.statement())?;
            }
            weft_store::insert::<Link>(store, "weft_audit_chain", &links).await?;
            let one = std::slice::from_ref(&cp);
            weft_store::insert::<Checkpoint>(store, "weft_audit_checkpoints", one).await?;
            took[3] += t.elapsed();
            report.sealed += links.len() as u64;
            report.checkpoints.push(cp);
            if clean {
                self.scanned.insert(done, top);
            }
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
}

/// One seal of `tenant` by a fresh [`Sealer`] (`weft audit seal`).
pub async fn seal(
    store: &Store,
    tenant: &str,
    key: Option<&Key>,
    copy_window_secs: u64,
) -> Result<SealReport, AuditError> {
    Sealer::default()
        .seal(store, tenant, key, copy_window_secs)
        .await
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
