//! [`Sealer`]: append the facts stored since the last seal to their partitions' chains, and
//! checkpoint each chain it extends. Its cost follows what was stored since, not the
//! history (docs/AUDIT.md, "Cost of sealing").

use std::collections::{BTreeSet, HashMap};

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use tracing::instrument;
use weft_store::chain::{ChainRow, ROWS_SQL};

use super::{
    link, unhex32, unsealed_problems, Checkpoint, Link, Part, Problem, Span, ANCHOR_SQL, GENESIS,
    LINKS_SQL,
};
use crate::sign::Key;
use crate::{ch_err, AuditError, Store};

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

/// Every source partition of `weft_events`, with its highest stored offset over all tenants:
/// read from the `progress` projection, so it costs the number of parts, not of rows.
const TOPS_SQL: &str =
    "SELECT topic, partition, max(offset) AS top FROM weft_events GROUP BY topic, partition";

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
async fn resume(store: &Store, span: Span<'_>) -> Result<(i64, [u8; 32], u64), AuditError> {
    let cp: Option<Checkpoint> = span
        .query(store, ANCHOR_SQL)
        .fetch_optional()
        .await
        .map_err(ch_err(store))?;
    let (from, head, rows) = match &cp {
        // The link at the checkpoint's own offset too, whose value the seal extends.
        Some(c) => (c.offset as i64 - 1, unhex32(&c.head), c.rows),
        None => (-1, GENESIS, 0),
    };
    let span = Span {
        after: from,
        ..span
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
            // The partition's whole chain, then its facts after `from` (up to `top`).
            let part = Part {
                topic: topic.clone(),
                partition,
                kind: String::new(),
            };
            let whole = Span {
                tenant,
                part: &part,
                after: -1,
                upto: u64::MAX,
                parts: &[],
            };
            let (after, mut prev, count) = resume(store, whole).await?;
            let from = self
                .scanned
                .get(&done)
                .map_or(after, |&s| (s as i64).max(after));
            // Ingest stores a partition's offsets in order, so every fact up to `top` is
            // stored: their kinds are all counted, and a fact stored since waits for the
            // next seal.
            let new: NewFacts = Span {
                after: from,
                upto: top,
                ..whole
            }
            .query(store, NEW_FACTS_SQL)
            .fetch_one()
            .await
            .map_err(ch_err(store))?;
            if new.n == 0 {
                self.scanned.insert(done, top);
                continue;
            }
            let p = Part {
                kind: match new.kinds.as_slice() {
                    [one] => one.clone(),
                    _ => String::new(),
                },
                ..part
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
