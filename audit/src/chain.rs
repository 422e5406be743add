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

use std::collections::BTreeMap;

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use tracing::instrument;

use weft_store::chain::{ChainRow, Unsealed, ROWS_SQL, UNSEALED_SQL};

use crate::sign::{Key, Keyring};
use crate::{ch_err, AuditError, Range, Store};

/// The link before the first row.
pub const GENESIS: [u8; 32] = [0; 32];

/// `SHA-256(prev || row_hash)`.
pub fn link(prev: &[u8; 32], row_hash: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(prev);
    h.update(row_hash);
    h.finalize().into()
}

/// The links of one partition's chain. Two sealers that ran at once (the sealing loop and
/// a `weft audit seal` by hand) write the same links twice, identical but for `sealed_at`:
/// such copies say nothing new and are read once (a link that differs in its hash or chain
/// is not a copy and is read, so it still breaks the chain).
const LINKS_SQL: &str = "
SELECT tenant, topic, partition, offset, kind, id, toUnixTimestamp64Micro(ts) AS ts, row_hash,
       chain, toUnixTimestamp64Micro(min(sealed_at)) AS sealed_at
FROM weft_audit_chain
WHERE tenant = {t:String} AND topic = {topic:String} AND partition = {p:UInt32}
  AND offset > {after:Int64} AND offset <= {upto:UInt64}
GROUP BY tenant, topic, partition, offset, kind, id, ts, row_hash, chain
ORDER BY offset
";

/// Every fact of the partition that shares its identity and content with an unsealed one,
/// grouped: each row lists one fact's copies as (offset, ingested_at µs), by offset. Copies
/// ingested more than `{w}` µs before the earliest unsealed row cannot matter and are not
/// read (the table is partitioned by month of `ingested_at`).
const COPIES_SQL: &str = "
WITH unsealed AS (
    SELECT kind, id, content_hash, ingested_at FROM weft_events
    WHERE tenant = {t:String} AND topic = {topic:String} AND partition = {p:UInt32}
      AND offset > {after:Int64} AND offset <= {upto:UInt64}
)
SELECT arraySort(groupArray((offset, toUnixTimestamp64Micro(ingested_at)))) AS copies
FROM weft_events
WHERE tenant = {t:String} AND topic = {topic:String} AND partition = {p:UInt32}
  AND ingested_at >= (SELECT min(ingested_at) FROM unsealed) - toIntervalMicrosecond({w:UInt64})
  AND (kind, id, content_hash) IN (SELECT kind, id, content_hash FROM unsealed)
GROUP BY kind, id, content_hash
HAVING count() > 1
";

/// A query over one partition's offsets `(after, upto]`: binds `{t}`, `{topic}`, `{p}`,
/// `{after}` and `{upto}`, the five parameters every per-partition chain query filters on.
fn partition_query(
    store: &Store,
    sql: &str,
    tenant: &str,
    p: &Part,
    after: i64,
    upto: u64,
) -> clickhouse::query::Query {
    store
        .client()
        .query(sql)
        .param("t", tenant)
        .param("topic", &p.topic)
        .param("p", p.partition)
        .param("after", after)
        .param("upto", upto)
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

#[derive(Debug, Row, Deserialize)]
struct Part {
    topic: String,
    partition: u32,
}

async fn partitions(store: &Store, tenant: &str) -> Result<Vec<Part>, AuditError> {
    store
        .client()
        .query(
            "SELECT topic, partition FROM ( \
               SELECT DISTINCT topic, partition FROM weft_events WHERE tenant = {t:String} \
               UNION DISTINCT \
               SELECT DISTINCT topic, partition FROM weft_audit_chain WHERE tenant = {t:String}) \
             ORDER BY topic, partition",
        )
        .param("t", tenant)
        .fetch_all()
        .await
        .map_err(ch_err(store))
}

/// The rows `sql` selects from one partition's offsets `(after, upto]`: the facts
/// ([`ROWS_SQL`], in chain order), the links ([`LINKS_SQL`]) or the unsealed facts.
async fn partition_rows<T>(
    store: &Store,
    sql: &str,
    tenant: &str,
    p: &Part,
    after: i64,
    upto: u64,
) -> Result<Vec<T>, AuditError>
where
    T: clickhouse::RowOwned + clickhouse::RowRead,
{
    partition_query(store, sql, tenant, p, after, upto)
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

fn unhex32(s: &str) -> [u8; 32] {
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
    for p in partitions(store, tenant).await? {
        let existing: Vec<Link> =
            partition_rows(store, LINKS_SQL, tenant, &p, -1, u64::MAX).await?;
        let (after, mut prev, count) = match existing.last() {
            Some(l) => (l.offset as i64, unhex32(&l.chain), existing.len() as u64),
            None => (-1, GENESIS, 0),
        };
        let mut rows: Vec<ChainRow> =
            partition_rows(store, ROWS_SQL, tenant, &p, after, u64::MAX).await?;
        let Some(upto) = rows.last().map(|r| r.offset) else {
            continue;
        };
        let bad = unsealed_problems(store, tenant, &p, after, upto, copy_window_secs).await?;
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
        let mut ins = store
            .client()
            .insert::<Link>("weft_audit_chain")
            .await
            .map_err(ch_err(store))?;
        for l in &new {
            ins.write(l).await.map_err(ch_err(store))?;
        }
        ins.end().await.map_err(ch_err(store))?;
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
        let mut ins = store
            .client()
            .insert::<Checkpoint>("weft_audit_checkpoints")
            .await
            .map_err(ch_err(store))?;
        ins.write(&cp).await.map_err(ch_err(store))?;
        ins.end().await.map_err(ch_err(store))?;
        report.sealed += new.len() as u64;
        report.checkpoints.push(cp);
    }
    tracing::info!(
        sealed = report.sealed,
        checkpoints = report.checkpoints.len(),
        "sealed"
    );
    Ok(report)
}

/// Every checkpoint of `tenant`, oldest first: the file to keep for offline verification.
pub async fn checkpoints(store: &Store, tenant: &str) -> Result<Vec<Checkpoint>, AuditError> {
    store
        .client()
        .query(
            "SELECT tenant, topic, partition, offset, head, rows, kid, sig, toUnixTimestamp64Micro(sealed_at) AS sealed_at \
             FROM weft_audit_checkpoints WHERE tenant = {t:String} ORDER BY sealed_at, topic, partition, offset",
        )
        .param("t", tenant)
        .fetch_all()
        .await
        .map_err(ch_err(store))
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

/// The result of [`verify`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Links recomputed and found intact.
    pub verified: u64,
    /// Stored facts after the last seal of their partition (not yet covered).
    pub unsealed: u64,
    /// Rows removed by retention (before the tenant's `pruned_before`), not tampering.
    pub pruned: u64,
    /// Checkpoints whose head and signature matched.
    pub checkpoints_ok: u64,
    /// Every broken link, in (topic, partition, offset) order; the first is the first break.
    pub problems: Vec<Problem>,
    /// The event-time range verified (`--from/--to`); `None`: every chain from genesis.
    pub range: Option<Range>,
    /// Partitions whose recomputation started from a checkpoint before the range rather
    /// than from genesis.
    pub anchored: u64,
}

impl VerifyReport {
    /// No problem found.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// How far apart two stored copies of one fact (same partition, identity and content) must
/// have been ingested for the second to be legitimate, given ingest's `dedup_window_secs`:
/// half of it, the least its two-generation dedup cache is sure to remember.
pub fn copy_window_secs(dedup_window_secs: u64) -> u64 {
    dedup_window_secs / 2
}

/// One fact stored more than once in a partition: its copies as (offset, ingested_at µs).
#[derive(Debug, Row, Deserialize)]
struct CopiesRow {
    copies: Vec<(u64, i64)>,
}

/// Facts after the last seal are not in the chain yet, but each must still agree with
/// itself and with how ingest writes: its `content_hash` is the SHA-256 of its payload's
/// canonical JSON, its `id` the payload's identity, its `ts` the payload's time (else its
/// `emitted_at`), every column derived from the payload equals what
/// [`weft_store::typed_columns`] derives (the function ingest writes them with) and every
/// MATERIALIZED column its expression over the payload ([`disagreements`]), no two facts
/// share an offset (a Kafka record holds
/// one), and no fact repeats another of its partition (same identity and content) ingested
/// less than `copy_window_secs` apart (ingest's dedup cache drops such copies: the window is
/// half of ingest's `dedup_window_secs`, the least its two-generation cache is sure to
/// remember). This names a row altered after the last seal (an ALTER UPDATE of a column, or
/// of the payload without its hash) and a forged row that copies another under a new id, at
/// a taken offset, or at a free one with an `ingested_at` near the original's. A forgery of
/// a *new* event, consistent in every column at a free offset, still passes as `unsealed`
/// (so does a copy whose `ingested_at` was moved a window away): only the broker's record
/// at that offset can refute it.
async fn unsealed_problems(
    store: &Store,
    tenant: &str,
    p: &Part,
    after: i64,
    upto: u64,
    copy_window_secs: u64,
) -> Result<Vec<(&'static str, Unsealed, String)>, AuditError> {
    let rows: Vec<Unsealed> = partition_rows(store, &UNSEALED_SQL, tenant, p, after, upto).await?;
    let window_micros = copy_window_secs.saturating_mul(1_000_000);
    let copies = partition_query(store, COPIES_SQL, tenant, p, after, upto)
        .param("w", window_micros)
        .fetch_all::<CopiesRow>()
        .await
        .map_err(ch_err(store))?;
    // Unsealed offset -> an earlier offset holding the same fact, ingested within the window.
    let mut repeats: BTreeMap<u64, u64> = BTreeMap::new();
    for CopiesRow { copies } in copies {
        for (j, &(offset, at)) in copies.iter().enumerate() {
            let unsealed = i128::from(offset) > i128::from(after) && offset <= upto;
            let near = copies[..j]
                .iter()
                .find(|(_, earlier)| at.abs_diff(*earlier) < window_micros);
            if let (true, Some(&(original, _))) = (unsealed, near) {
                repeats.insert(offset, original);
            }
        }
    }
    let mut per_offset: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &rows {
        *per_offset.entry(r.offset).or_default() += 1;
    }
    let mut out = Vec::new();
    for r in rows {
        let wrong = disagreements(&r);
        let shared = per_offset.get(&r.offset).copied().unwrap_or(0);
        let repeated = repeats.get(&r.offset);
        if !wrong.is_empty() {
            let d = format!(
                "unsealed {}:{} at offset {} does not match itself: {}",
                r.kind,
                r.id,
                r.offset,
                wrong.join("; ")
            );
            out.push(("altered", r, d));
        } else if shared > 1 {
            let d = format!(
                "unsealed {}:{} shares offset {} with {} other fact(s); a Kafka record holds one",
                r.kind,
                r.id,
                r.offset,
                shared - 1
            );
            out.push(("inserted", r, d));
        } else if let Some(original) = repeated {
            let d = format!(
                "unsealed {}:{} at offset {} is the same fact (identity and content) as offset \
                 {original}, ingested less than {} h apart: ingest stores it once, so one of the \
                 two was written behind its back",
                r.kind,
                r.id,
                r.offset,
                copy_window_secs / 3600
            );
            out.push(("inserted", r, d));
        }
    }
    Ok(out)
}

/// What in an unsealed row disagrees with its own payload, one phrase per column: the content
/// hash, the identity, the event time, every column [`weft_store::typed_columns`] derives,
/// and the MATERIALIZED columns (evaluated again by ClickHouse, [`UNSEALED_SQL`]). Columns
/// from the envelope's headers (tenant, request id, producer id, sequence, emitted time) and
/// ingest's own (topic, partition, offset, ingested_at, conflict, content type) have nothing
/// in the payload to agree with.
fn disagreements(r: &Unsealed) -> Vec<String> {
    let mut wrong = Vec::new();
    let v = match serde_json::from_str::<serde_json::Value>(&r.payload) {
        Ok(v) => v,
        Err(e) => return vec![format!("payload is not JSON ({e})")],
    };
    let mut canon = Vec::new();
    let hash = weft_schemas::identity::write_canonical(&v, &mut canon)
        .map(|()| hex::encode(Sha256::digest(&canon)));
    if hash.as_deref().ok() != Some(r.content_hash.as_str()) {
        wrong.push("content_hash is not its payload's".into());
    }
    let Ok(kind) = r.kind.parse::<weft_schemas::Kind>() else {
        wrong.push(format!(
            "kind `{}` is not a weft kind",
            crate::short(&r.kind)
        ));
        return wrong;
    };
    let ident = weft_schemas::identity::identity(kind, &v).ok();
    if ident.as_deref() != Some(r.id.as_str()) {
        wrong.push(format!(
            "id is not its payload's identity ({})",
            ident.as_deref().unwrap_or("none")
        ));
    }
    let ts = v
        .get(kind.time_field())
        .and_then(serde_json::Value::as_str)
        .and_then(weft_schemas::time::parse_micros)
        .unwrap_or(r.emitted_at);
    if ts != r.ts {
        wrong.push("ts is not its payload's time".into());
    }
    let links = weft_schemas::links::extract(kind, &v);
    match serde_json::from_str::<serde_json::Value>(&r.typed) {
        Ok(stored) => {
            for col in weft_store::typed_columns(kind, &v, &links).differences(&stored) {
                wrong.push(format!("{col} is not its payload's"));
            }
        }
        Err(e) => wrong.push(format!("typed columns unreadable ({e})")),
    }
    for col in &r.materialized_wrong {
        wrong.push(format!("{col} is not its payload's (MATERIALIZED)"));
    }
    wrong
}

/// The offset of the last link of one partition's chain, if any.
async fn last_link(store: &Store, tenant: &str, p: &Part) -> Result<Option<u64>, AuditError> {
    let (last, n): (u64, u64) = store
        .client()
        .query(
            "SELECT max(offset), count() FROM weft_audit_chain \
             WHERE tenant = {t:String} AND topic = {topic:String} AND partition = {p:UInt32}",
        )
        .param("t", tenant)
        .param("topic", &p.topic)
        .param("p", p.partition)
        .fetch_one()
        .await
        .map_err(ch_err(store))?;
    Ok((n > 0).then_some(last))
}

/// The offsets `[lo, hi]` of one partition whose facts or links have an event time in
/// `range`, or `None` when it has none.
async fn window(
    store: &Store,
    tenant: &str,
    p: &Part,
    range: Range,
) -> Result<Option<(u64, u64)>, AuditError> {
    let (lo, hi, n): (u64, u64, u64) = store
        .client()
        .query(
            "SELECT min(offset), max(offset), count() FROM ( \
               SELECT offset FROM weft_events \
               WHERE tenant = {t:String} AND topic = {topic:String} AND partition = {p:UInt32} \
                 AND ts >= fromUnixTimestamp64Micro({from:Int64}, 'UTC') AND ts < fromUnixTimestamp64Micro({to:Int64}, 'UTC') \
               UNION ALL \
               SELECT offset FROM weft_audit_chain \
               WHERE tenant = {t:String} AND topic = {topic:String} AND partition = {p:UInt32} \
                 AND ts >= fromUnixTimestamp64Micro({from:Int64}, 'UTC') AND ts < fromUnixTimestamp64Micro({to:Int64}, 'UTC'))",
        )
        .param("t", tenant)
        .param("topic", &p.topic)
        .param("p", p.partition)
        .param("from", range.from)
        .param("to", range.to)
        .fetch_one()
        .await
        .map_err(ch_err(store))?;
    Ok((n > 0).then_some((lo, hi)))
}

/// Recompute the chains of `tenant` and compare with the stored facts, the stored links and
/// the checkpoints (those in ClickHouse plus `extra`, e.g. an exported file). Signed
/// checkpoints are verified against `keyring`; without one, signatures are not checked.
///
/// Without `range`, every chain is recomputed from genesis. With one, each partition is
/// checked over the offsets from its first to its last fact (or link) with an event time in
/// the range, anchored at the partition's latest checkpoint *before* that window: the chain
/// is recomputed from that checkpoint's head (whose signature is checked when a keyring is
/// given) to the end of the window, so a range costs the rows since the last seal before it,
/// not the whole history. Partitions with nothing in the range are skipped.
///
/// `copy_window_secs`: two stored copies of one fact ingested less than this apart mean one
/// was written behind ingest's back; pass half of ingest's `dedup_window_secs`
/// ([`copy_window_secs`]).
#[instrument(skip(store, extra, keyring), fields(tenant = %tenant))]
pub async fn verify(
    store: &Store,
    tenant: &str,
    extra: &[Checkpoint],
    keyring: Option<&Keyring>,
    range: Option<Range>,
    copy_window_secs: u64,
) -> Result<VerifyReport, AuditError> {
    let mut rep = VerifyReport {
        range,
        ..VerifyReport::default()
    };
    let pruned_before = crate::retention::get(store, tenant).await?.pruned_before;
    let mut cps: BTreeMap<(String, u32), Vec<Checkpoint>> = BTreeMap::new();
    for c in checkpoints(store, tenant)
        .await?
        .into_iter()
        .chain(extra.iter().cloned())
    {
        if c.tenant == tenant {
            cps.entry((c.topic.clone(), c.partition))
                .or_default()
                .push(c);
        }
    }
    for p in partitions(store, tenant).await? {
        let problem = |what: &str, offset: u64, kind: &str, id: &str, detail: String| Problem {
            what: what.into(),
            topic: p.topic.clone(),
            partition: p.partition,
            offset,
            kind: kind.into(),
            id: id.into(),
            detail,
        };
        let mut part_cps = cps
            .remove(&(p.topic.clone(), p.partition))
            .unwrap_or_default();
        // Where to start (after which offset, from which link) and where to stop.
        let (after, mut prev, upto) = match range {
            None => (-1, GENESIS, u64::MAX),
            Some(r) => {
                let Some((lo, hi)) = window(store, tenant, &p, r).await? else {
                    continue;
                };
                let anchor = part_cps
                    .iter()
                    .filter(|c| c.offset < lo)
                    .max_by_key(|c| c.offset)
                    .cloned();
                match anchor {
                    None => (-1, GENESIS, hi),
                    Some(a) => {
                        rep.anchored += 1;
                        if let Some(ring) = keyring {
                            let sig = if a.sig.is_empty() {
                                Err("unsigned checkpoint".to_owned())
                            } else {
                                ring.verify(&a.kid, &a.statement(), &a.sig)
                                    .map_err(|e| e.to_string())
                            };
                            if let Err(e) = sig {
                                rep.problems.push(problem(
                                    "checkpoint_mismatch",
                                    a.offset,
                                    "",
                                    "",
                                    format!(
                                        "anchor checkpoint at offset {}: signature: {e}",
                                        a.offset
                                    ),
                                ));
                            }
                        }
                        // Checkpoints at or before the anchor are outside this run.
                        part_cps.retain(|c| c.offset > a.offset && c.offset <= hi);
                        (a.offset as i64, unhex32(&a.head), hi)
                    }
                }
            }
        };
        if range.is_some() && after < 0 {
            part_cps.retain(|c| c.offset <= upto);
        }
        let chain: Vec<Link> = partition_rows(store, LINKS_SQL, tenant, &p, after, upto).await?;
        let rows: Vec<ChainRow> = partition_rows(store, ROWS_SQL, tenant, &p, after, upto).await?;
        let mut by_offset: BTreeMap<u64, Vec<&ChainRow>> = BTreeMap::new();
        for r in &rows {
            by_offset.entry(r.offset).or_default().push(r);
        }
        let mut heads: BTreeMap<u64, [u8; 32]> = BTreeMap::new();
        let mut sealed = std::collections::HashSet::new();
        for l in &chain {
            let stored_rh = unhex32(&l.row_hash);
            match by_offset
                .get(&l.offset)
                .and_then(|v| v.iter().find(|r| r.kind == l.kind && r.id == l.id))
            {
                None if l.ts < pruned_before => rep.pruned += 1,
                None => rep.problems.push(problem(
                    "deleted",
                    l.offset,
                    &l.kind,
                    &l.id,
                    format!(
                        "{}:{} sealed at offset {} is no longer stored",
                        l.kind, l.id, l.offset
                    ),
                )),
                Some(r) => {
                    let rh = r.hash()?;
                    if rh != stored_rh {
                        rep.problems.push(problem(
                            "altered",
                            l.offset,
                            &l.kind,
                            &l.id,
                            format!(
                                "{}:{} at offset {} differs from what was sealed",
                                l.kind, l.id, l.offset
                            ),
                        ));
                    } else {
                        rep.verified += 1;
                    }
                }
            }
            sealed.insert((l.offset, l.kind.clone(), l.id.clone()));
            let next = link(&prev, &stored_rh);
            if hex::encode(next) != l.chain {
                rep.problems.push(problem(
                    "chain_broken",
                    l.offset,
                    &l.kind,
                    &l.id,
                    format!(
                        "the stored link at offset {} does not follow from its predecessor",
                        l.offset
                    ),
                ));
            }
            prev = next;
            heads.insert(l.offset, prev);
        }
        // The partition's last sealed offset, also when the window ends before it.
        let last_sealed = match range {
            None => chain.last().map(|l| l.offset),
            Some(_) => last_link(store, tenant, &p).await?,
        };
        for r in &rows {
            if sealed.contains(&(r.offset, r.kind.clone(), r.id.clone())) {
                continue;
            }
            match last_sealed {
                Some(last) if r.offset <= last => rep.problems.push(problem(
                    "inserted",
                    r.offset,
                    &r.kind,
                    &r.id,
                    format!(
                        "{}:{} at offset {} is inside the sealed range but not in the chain",
                        r.kind, r.id, r.offset
                    ),
                )),
                _ => rep.unsealed += 1,
            }
        }
        if rows
            .iter()
            .any(|r| last_sealed.is_none_or(|l| r.offset > l))
        {
            let after = last_sealed.map_or(after, |l| (l as i64).max(after));
            for (what, r, detail) in
                unsealed_problems(store, tenant, &p, after, upto, copy_window_secs).await?
            {
                rep.problems
                    .push(problem(what, r.offset, &r.kind, &r.id, detail));
            }
        }
        for c in part_cps {
            let head_ok = heads.get(&c.offset).map(hex::encode).as_deref() == Some(c.head.as_str());
            let sig_ok = match (keyring, c.sig.is_empty()) {
                (Some(ring), false) => ring
                    .verify(&c.kid, &c.statement(), &c.sig)
                    .map_err(|e| e.to_string()),
                (Some(_), true) => Err("unsigned checkpoint".to_owned()),
                (None, _) => Ok(()),
            };
            match (head_ok, sig_ok) {
                (true, Ok(())) => rep.checkpoints_ok += 1,
                (h, s) => rep.problems.push(problem(
                    "checkpoint_mismatch",
                    c.offset,
                    "",
                    "",
                    format!(
                        "checkpoint at offset {}: {}{}",
                        c.offset,
                        if h {
                            ""
                        } else {
                            "the recomputed chain differs from the checkpoint's head"
                        },
                        s.err()
                            .map(|e| format!(" signature: {e}"))
                            .unwrap_or_default()
                    ),
                )),
            }
        }
    }
    rep.problems
        .sort_by(|a, b| (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset)));
    Ok(rep)
}
