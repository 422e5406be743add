//! [`verify`]: recompute the chains and compare them with the facts, the links and the
//! checkpoints.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use tracing::instrument;
use weft_store::chain::{ChainRow, ROWS_SQL};

use super::{
    checkpoints_select, events_span_where, link, partitions, span_where, unhex32,
    unsealed_problems, Checkpoint, Link, Part, Problem, Span, ANCHOR_SQL, GENESIS, LINKS_SQL,
};
use crate::sign::Keyring;
use crate::{ch_err, AuditError, Range, Store};

/// How many facts, links and checkpoints a [`Span`] holds: what [`VerifyOptions::max_rows`]
/// counts before the span is read.
const SPAN_ROWS_SQL: &str = concat!(
    "SELECT sum(n) FROM (SELECT count() AS n FROM weft_events WHERE ",
    events_span_where!(),
    " UNION ALL SELECT count() FROM weft_audit_chain WHERE ",
    span_where!(),
    " UNION ALL SELECT count() FROM weft_audit_checkpoints WHERE ",
    span_where!(),
    ")"
);

/// How many facts a [`Span`] holds, and the parts of `weft_events` they are in. Every
/// column is in the `by_partition` projection (ordered by topic, partition and offset), so
/// this reads the span's offsets only; the facts are then read from those parts, not from
/// the tenant's whole range of the kind, which every partition's span shares.
const SPAN_PARTS_SQL: &str = concat!(
    "SELECT count() AS n, groupUniqArray(_part) AS parts FROM weft_events WHERE ",
    events_span_where!()
);

/// What [`SPAN_PARTS_SQL`] finds.
#[derive(Debug, clickhouse::Row, Deserialize)]
struct SpanParts {
    n: u64,
    parts: Vec<String>,
}

/// The checkpoints of a [`Span`], in offset order.
const SPAN_CHECKPOINTS_SQL: &str = concat!(
    checkpoints_select!(),
    " WHERE ",
    span_where!(),
    " ORDER BY offset"
);

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

/// What [`verify`] covers, and how much it may read.
#[derive(Debug, Clone, Copy, Default)]
pub struct VerifyOptions {
    /// Only the facts with an event time in this range (see [`verify`]); `None`: every chain
    /// from genesis.
    pub range: Option<Range>,
    /// Two stored copies of one fact ingested less than this apart mean one was written
    /// behind ingest's back: half of ingest's `dedup_window_secs` ([`super::copy_window_secs`]).
    pub copy_window_secs: u64,
    /// Refuse with [`AuditError::TooLarge`] rather than read more than this many stored facts,
    /// links and checkpoints in all (counted before each partition is read, so the work done
    /// is bounded by it); `None`: no limit (the CLI).
    pub max_rows: Option<u64>,
}

/// Recompute the chains of `tenant` and compare with the stored facts, the stored links and
/// the checkpoints (those in ClickHouse plus `extra`, e.g. an exported file). Signed
/// checkpoints are verified against `keyring`; without one, signatures are not checked.
///
/// Without a range, every chain is recomputed from genesis. With one, each partition is
/// checked over the offsets from its first to its last fact (or link) with an event time in
/// the range, anchored at the partition's latest checkpoint *before* that window: the chain
/// is recomputed from that checkpoint's head (whose signature is checked when a keyring is
/// given) to the end of the window, so a range costs the rows since the last seal before it,
/// not the whole history. Partitions with nothing in the range are skipped.
#[instrument(skip(store, extra, keyring), fields(tenant = %tenant))]
pub async fn verify(
    store: &Store,
    tenant: &str,
    extra: &[Checkpoint],
    keyring: Option<&Keyring>,
    opt: VerifyOptions,
) -> Result<VerifyReport, AuditError> {
    let mut rep = VerifyReport {
        range: opt.range,
        ..VerifyReport::default()
    };
    // The span reads are bounded by `max_rows`, counted before each partition is read; the
    // per-query read limit of `store` (the API's) is not sized for them. Every other query
    // (the partitions, a range's offsets, the last link) scans a tenant's history whatever
    // the range, so it keeps that limit.
    let spans = match opt.max_rows {
        Some(_) => store.with_read_limit(0),
        None => store.clone(),
    };
    let run = Run {
        store,
        spans: &spans,
        tenant,
        keyring,
        opt,
    };
    let mut read = 0;
    for p in partitions(store, tenant).await? {
        let extra = extra
            .iter()
            .filter(|c| c.tenant == tenant && c.topic == p.topic && c.partition == p.partition);
        run.partition(&p, extra.cloned().collect(), &mut read, &mut rep)
            .await?;
    }
    rep.problems
        .sort_by(|a, b| (&a.topic, a.partition, a.offset).cmp(&(&b.topic, b.partition, b.offset)));
    Ok(rep)
}

/// The head after each offset, and the (offset, kind, id) of every fact the chain covers.
type Walked = (BTreeMap<u64, [u8; 32]>, HashSet<(u64, String, String)>);

/// What one [`verify`] run checks against.
struct Run<'a> {
    /// The caller's store: finding the partitions and a range's offsets.
    store: &'a Store,
    /// The store the span reads go through ([`verify`]).
    spans: &'a Store,
    tenant: &'a str,
    keyring: Option<&'a Keyring>,
    opt: VerifyOptions,
}

fn problem(p: &Part, what: &str, offset: u64, kind: &str, id: &str, detail: String) -> Problem {
    Problem {
        what: what.into(),
        topic: p.topic.clone(),
        partition: p.partition,
        offset,
        kind: kind.into(),
        id: id.into(),
        detail,
    }
}

/// A checkpoint's signature against `keyring` (`Ok` when there is no keyring).
fn signature(keyring: Option<&Keyring>, c: &Checkpoint) -> Result<(), String> {
    match (keyring, c.sig.is_empty()) {
        (Some(ring), false) => ring
            .verify(&c.kid, &c.statement(), &c.sig)
            .map_err(|e| e.to_string()),
        (Some(_), true) => Err("unsigned checkpoint".to_owned()),
        (None, _) => Ok(()),
    }
}

impl Run<'_> {
    /// Where to start (after which offset, from which link) and where to stop in one
    /// partition; `None` when a range is asked for and the partition has nothing in it.
    async fn start(
        &self,
        p: &Part,
        extra: &[Checkpoint],
        rep: &mut VerifyReport,
    ) -> Result<Option<(i64, [u8; 32], u64)>, AuditError> {
        let Some(r) = self.opt.range else {
            return Ok(Some((-1, GENESIS, u64::MAX)));
        };
        let Some((lo, hi)) = window(self.store, self.tenant, p, r).await? else {
            return Ok(None);
        };
        // The partition's latest stored checkpoint before the window: offsets [0, lo).
        let stored: Option<Checkpoint> = match lo.checked_sub(1) {
            None => None,
            Some(upto) => Span {
                tenant: self.tenant,
                part: p,
                after: -1,
                upto,
                parts: &[],
            }
            .query(self.store, ANCHOR_SQL)
            .fetch_optional()
            .await
            .map_err(ch_err(self.store))?,
        };
        let anchor = stored
            .into_iter()
            .chain(extra.iter().filter(|c| c.offset < lo).cloned())
            .max_by_key(|c| c.offset);
        let Some(a) = anchor else {
            return Ok(Some((-1, GENESIS, hi)));
        };
        rep.anchored += 1;
        if self.keyring.is_some() {
            if let Err(e) = signature(self.keyring, &a) {
                let d = format!("anchor checkpoint at offset {}: signature: {e}", a.offset);
                rep.problems
                    .push(problem(p, "checkpoint_mismatch", a.offset, "", "", d));
            }
        }
        Ok(Some((a.offset as i64, unhex32(&a.head), hi)))
    }

    /// Verify one partition's chain, its unsealed rows and its checkpoints into `rep`;
    /// `read` counts the rows read so far against [`VerifyOptions::max_rows`].
    async fn partition(
        &self,
        p: &Part,
        extra: Vec<Checkpoint>,
        read: &mut u64,
        rep: &mut VerifyReport,
    ) -> Result<(), AuditError> {
        let Some((after, prev, upto)) = self.start(p, &extra, rep).await? else {
            return Ok(());
        };
        let (store, tenant) = (self.spans, self.tenant);
        let span = Span {
            tenant,
            part: p,
            after,
            upto,
            parts: &[],
        };
        if let Some(max) = self.opt.max_rows {
            let n: u64 = span
                .query(store, SPAN_ROWS_SQL)
                .fetch_one()
                .await
                .map_err(ch_err(store))?;
            *read += n;
            if *read > max {
                return Err(AuditError::TooLarge(format!(
                    "verifying this range reads at least {} stored facts, links and checkpoints, \
                     over the limit of {max} per request: ask for a narrower range (from, to), \
                     or run `weft audit verify` where no limit applies",
                    *read
                )));
            }
        }
        // The checkpoints this run can check: those after its start, up to its end.
        let cps: Vec<Checkpoint> = span
            .rows::<Checkpoint>(store, SPAN_CHECKPOINTS_SQL)
            .await?
            .into_iter()
            .chain(
                extra
                    .into_iter()
                    .filter(|c| c.offset as i64 > after && c.offset <= upto),
            )
            .collect();
        // A range's last sealed offset is read before its links: a seal running beside may
        // write links past it meanwhile, and a fact they cover must then count as unsealed
        // (read after, they made it "inside the sealed range but not in the chain").
        let last_link_first = match self.opt.range {
            None => None,
            Some(_) => last_link(self.store, tenant, p).await?,
        };
        let chain: Vec<Link> = span.rows(store, LINKS_SQL).await?;
        let found: SpanParts = span
            .query(store, SPAN_PARTS_SQL)
            .fetch_one()
            .await
            .map_err(ch_err(store))?;
        let span = Span {
            parts: &found.parts,
            ..span
        };
        let mut rows: Vec<ChainRow> = span.rows(store, ROWS_SQL).await?;
        if rows.len() as u64 != found.n {
            // A part merged away (or a fact deleted) since they were counted.
            rows = Span { parts: &[], ..span }.rows(store, ROWS_SQL).await?;
        }
        // Read after the facts: retention records how far it prunes before it deletes, so a
        // fact missing from the rows above is covered by the value read now (read before, a
        // retention run meanwhile made its deletions look like tampering).
        let pruned_before = crate::retention::get(self.store, tenant)
            .await?
            .pruned_before;
        let (heads, sealed) = self.walk(p, &chain, &rows, prev, pruned_before, rep)?;
        // The partition's last sealed offset, also when the window ends before it.
        let last_sealed = match self.opt.range {
            None => chain.last().map(|l| l.offset),
            Some(_) => last_link_first,
        };
        for r in &rows {
            if sealed.contains(&(r.offset, r.kind.clone(), r.id.clone())) {
                continue;
            }
            match last_sealed {
                Some(last) if r.offset <= last => {
                    let d = format!(
                        "{}:{} at offset {} is inside the sealed range but not in the chain",
                        r.kind, r.id, r.offset
                    );
                    rep.problems
                        .push(problem(p, "inserted", r.offset, &r.kind, &r.id, d));
                }
                _ => rep.unsealed += 1,
            }
        }
        if rows
            .iter()
            .any(|r| last_sealed.is_none_or(|l| r.offset > l))
        {
            let after = last_sealed.map_or(after, |l| (l as i64).max(after));
            let window = self.opt.copy_window_secs;
            let expect = rows.iter().filter(|r| r.offset as i64 > after).count();
            for (what, r, detail) in
                unsealed_problems(store, Span { after, ..span }, Some(expect), window).await?
            {
                rep.problems
                    .push(problem(p, what, r.offset, &r.kind, &r.id, detail));
            }
        }
        for c in cps {
            let head_ok = heads.get(&c.offset).map(hex::encode).as_deref() == Some(c.head.as_str());
            match (head_ok, signature(self.keyring, &c)) {
                (true, Ok(())) => rep.checkpoints_ok += 1,
                (h, s) => {
                    let d = format!(
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
                    );
                    rep.problems
                        .push(problem(p, "checkpoint_mismatch", c.offset, "", "", d));
                }
            }
        }
        Ok(())
    }

    /// Recompute the links from `prev` and compare each with its stored fact: returns the
    /// head after each offset and the facts the chain covers. A sealed fact no longer stored
    /// is `pruned` only when retention has pruned the tenant (`pruned_before` above 0) past
    /// its link's time; a link's time is not part of its hash, so a tenant without retention
    /// counts any such fact as `deleted`, whatever time its link claims.
    fn walk(
        &self,
        p: &Part,
        chain: &[Link],
        rows: &[ChainRow],
        mut prev: [u8; 32],
        pruned_before: i64,
        rep: &mut VerifyReport,
    ) -> Result<Walked, AuditError> {
        let mut by_offset: BTreeMap<u64, Vec<&ChainRow>> = BTreeMap::new();
        for r in rows {
            by_offset.entry(r.offset).or_default().push(r);
        }
        let mut heads = BTreeMap::new();
        let mut sealed = HashSet::new();
        for l in chain {
            let stored_rh = unhex32(&l.row_hash);
            let (o, k, i) = (l.offset, l.kind.as_str(), l.id.as_str());
            match by_offset
                .get(&o)
                .and_then(|v| v.iter().find(|r| r.kind == k && r.id == i))
            {
                None if pruned_before > 0 && l.ts < pruned_before => rep.pruned += 1,
                None => {
                    let d = format!("{k}:{i} sealed at offset {o} is no longer stored");
                    rep.problems.push(problem(p, "deleted", o, k, i, d));
                }
                Some(r) if r.hash()? != stored_rh => {
                    let d = format!("{k}:{i} at offset {o} differs from what was sealed");
                    rep.problems.push(problem(p, "altered", o, k, i, d));
                }
                Some(_) => rep.verified += 1,
            }
            sealed.insert((o, l.kind.clone(), l.id.clone()));
            let next = link(&prev, &stored_rh);
            if hex::encode(next) != l.chain {
                let d =
                    format!("the stored link at offset {o} does not follow from its predecessor");
                rep.problems.push(problem(p, "chain_broken", o, k, i, d));
            }
            prev = next;
            heads.insert(o, prev);
        }
        Ok((heads, sealed))
    }
}
