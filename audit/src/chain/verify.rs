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

/// How many facts a [`Span`] holds: counted against [`VerifyOptions::max_rows`] before the
/// span is read.
const SPAN_FACTS_SQL: &str = concat!(
    "SELECT count() FROM weft_events WHERE ",
    events_span_where!()
);

/// How many links and checkpoints a [`Span`] holds: counted likewise. A range reads the links
/// and checkpoints further than the facts (up to the partition's last checkpoint).
const SPAN_LINKS_SQL: &str = concat!(
    "SELECT sum(n) FROM (SELECT count() AS n FROM weft_audit_chain WHERE ",
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
    /// The `pruned_before` (µs) retention recorded and this run used to tell pruned facts
    /// from deleted ones (0: none; or an impossible one, reported as `pruned_before_invalid`;
    /// or, with a keyring, one whose signature does not verify, reported as
    /// `pruned_before_unsigned`).
    #[serde(default)]
    pub pruned_before: i64,
    /// Whether the signature of the `pruned_before` used was checked: `verified` against the
    /// keyring, or `not_checked` (no keyring given, so the recorded value was taken as it
    /// is); `none` when no `pruned_before` was used.
    #[serde(default)]
    pub pruned_before_signature: PrunedSignature,
}

/// What a verify knows of the signature of the `pruned_before` it used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrunedSignature {
    /// No `pruned_before` was used.
    #[default]
    None,
    /// It verified under a key of the keyring.
    Verified,
    /// No keyring was given: the value was used unchecked.
    NotChecked,
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
    /// links and checkpoints in all, plus the rows the copy lookup of unsealed facts scans
    /// (each counted before it is read, so the work done is bounded by it); `None`: no limit
    /// (the CLI).
    pub max_rows: Option<u64>,
}

/// Recompute the chains of `tenant` and compare with the stored facts, the stored links and
/// the checkpoints (those in ClickHouse plus `extra`, e.g. an exported file). Signed
/// checkpoints are verified against `keyring`; without one, signatures are not checked.
///
/// The partitions are those of the tenant's facts, links and checkpoints (ClickHouse's and
/// `extra`'s): a partition whose facts and links were all deleted still has checkpoints,
/// and each of them is a `checkpoint_mismatch`.
///
/// Without a range, every chain is recomputed from genesis. With one, each partition's facts
/// are checked over the offsets from its first to its last fact (or link) with an event time
/// in the range, after the partition's latest checkpoint *before* them (the *anchor*). The
/// chain is recomputed from the checkpoint before the anchor (whose signature is checked
/// when a keyring is given; genesis when there is none) through the anchor's own batch,
/// whose links must all still have their facts, and on to the partition's last checkpoint:
/// every checkpoint after that start is checked against the recomputed links. So deleting
/// the facts and links of the range's first batch (which moves the anchor to that batch's
/// checkpoint) or of its last (which ends the window early) leaves a checkpoint the links no
/// longer reach. A range costs one batch before it, its own rows, and the links after it.
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
    // (the partitions, a range's offsets, the last link, the copy lookup's count) scans a
    // tenant's history whatever the range, so it keeps that limit.
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
    let mut parts = partitions(store, tenant).await?;
    // A partition known only from the exported checkpoints: everything of it in ClickHouse,
    // its checkpoints too, was deleted.
    for c in extra.iter().filter(|c| c.tenant == tenant) {
        if !parts
            .iter()
            .any(|p| p.topic == c.topic && p.partition == c.partition)
        {
            parts.push(Part {
                topic: c.topic.clone(),
                partition: c.partition,
                kind: String::new(),
            });
        }
    }
    let mut read = 0;
    for p in parts {
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
    Keyring::check(keyring, &c.kid, &c.statement(), &c.sig).map_err(|e| {
        if c.sig.is_empty() {
            "unsigned checkpoint".to_owned()
        } else {
            e
        }
    })
}

/// Add `n` rows to `read` and refuse past `max`.
fn charge(read: &mut u64, n: u64, max: Option<u64>) -> Result<(), AuditError> {
    *read = read.saturating_add(n);
    match max {
        Some(max) if *read > max => Err(AuditError::TooLarge(format!(
            "verifying this range reads at least {} stored facts, links, checkpoints and \
             copy-lookup rows, over the limit of {max} per request: ask for a narrower range \
             (from, to), or run `weft audit verify` where no limit applies",
            *read
        ))),
        _ => Ok(()),
    }
}

/// What one partition's verification reads, and from where ([`Run::start`]).
#[derive(Debug, Clone, Copy)]
struct Bounds {
    /// The recomputation starts after this offset, from `root_head`: genesis (-1) or a
    /// checkpoint, whose signature is then checked.
    root: i64,
    root_head: [u8; 32],
    /// Facts at or below this offset (the anchor's own batch, before a range) are checked
    /// for presence only: a link there whose fact is gone is `deleted`. Facts after it are
    /// compared with their links, and checked as unsealed past the last link.
    anchor: i64,
    /// The anchor checkpoint's offset, when a range starts from one.
    anchor_cp: Option<u64>,
    /// The facts are read up to this offset; `None`: none are.
    facts_upto: Option<u64>,
    /// The links and checkpoints are read up to this offset (at least `facts_upto`).
    links_upto: u64,
    /// A range's last sealed offset, read before the links ([`Run::partition`]).
    last_link: Option<u64>,
}

impl Run<'_> {
    /// The latest checkpoint of `p` at an offset below `below` (ClickHouse's or `extra`'s).
    async fn latest_before(
        &self,
        p: &Part,
        extra: &[Checkpoint],
        below: u64,
    ) -> Result<Option<Checkpoint>, AuditError> {
        let stored: Option<Checkpoint> = match below.checked_sub(1) {
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
        Ok(stored
            .into_iter()
            .chain(extra.iter().filter(|c| c.offset < below).cloned())
            .max_by_key(|c| c.offset))
    }

    /// Where to start and where to stop in one partition; `None` when a range is asked for
    /// and the partition has nothing to check.
    async fn start(
        &self,
        p: &Part,
        extra: &[Checkpoint],
        rep: &mut VerifyReport,
    ) -> Result<Option<Bounds>, AuditError> {
        let Some(r) = self.opt.range else {
            return Ok(Some(Bounds {
                root: -1,
                root_head: GENESIS,
                anchor: -1,
                anchor_cp: None,
                facts_upto: Some(u64::MAX),
                links_upto: u64::MAX,
                last_link: None,
            }));
        };
        // Read before the links (a seal running beside may add some meanwhile).
        let last_link = last_link(self.store, self.tenant, p).await?;
        let window = window(self.store, self.tenant, p, r).await?;
        // The window's first offset; without one, just after the last link: the anchor is
        // then the partition's last checkpoint the links reach, and every checkpoint after
        // it is still checked.
        let lo = match (window, last_link) {
            (Some((lo, _)), _) => lo,
            (None, Some(l)) => l.saturating_add(1),
            (None, None) => 0,
        };
        let anchor = self.latest_before(p, extra, lo).await?;
        let root = match &anchor {
            Some(a) => self.latest_before(p, extra, a.offset).await?,
            None => None,
        };
        // The partition's last checkpoint: every one after the start is checked.
        let last_cp = self
            .latest_before(p, extra, u64::MAX)
            .await?
            .map(|c| c.offset);
        let facts_upto = match (window, &anchor) {
            (Some((_, hi)), a) => Some(a.as_ref().map_or(hi, |a| a.offset.max(hi))),
            (None, Some(a)) => Some(a.offset),
            (None, None) => None,
        };
        let Some(links_upto) = facts_upto.max(last_cp) else {
            return Ok(None);
        };
        if anchor.is_some() {
            rep.anchored += 1;
        }
        if let Some(c) = &root {
            if let Err(e) = signature(self.keyring, c) {
                let d = format!(
                    "checkpoint at offset {} (where a range's check starts): signature: {e}",
                    c.offset
                );
                rep.problems
                    .push(problem(p, "checkpoint_mismatch", c.offset, "", "", d));
            }
        }
        Ok(Some(Bounds {
            root: root.as_ref().map_or(-1, |c| c.offset as i64),
            root_head: root.as_ref().map_or(GENESIS, |c| unhex32(&c.head)),
            anchor: anchor.as_ref().map_or(-1, |c| c.offset as i64),
            anchor_cp: anchor.map(|c| c.offset),
            facts_upto,
            links_upto,
            last_link,
        }))
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
        let Some(b) = self.start(p, &extra, rep).await? else {
            return Ok(());
        };
        let (store, tenant) = (self.spans, self.tenant);
        let links = Span {
            tenant,
            part: p,
            after: b.root,
            upto: b.links_upto,
            parts: &[],
        };
        // No facts to read: an empty span.
        let facts = Span {
            upto: b.facts_upto.unwrap_or(0),
            after: if b.facts_upto.is_some() { b.root } else { 0 },
            ..links
        };
        if self.opt.max_rows.is_some() {
            let n: u64 = facts
                .query(store, SPAN_FACTS_SQL)
                .fetch_one()
                .await
                .map_err(ch_err(store))?;
            let m: u64 = links
                .query(store, SPAN_LINKS_SQL)
                .fetch_one()
                .await
                .map_err(ch_err(store))?;
            charge(read, n.saturating_add(m), self.opt.max_rows)?;
        }
        // The checkpoints this run can check: those after its start, up to its end.
        let cps: Vec<Checkpoint> = links
            .rows::<Checkpoint>(store, SPAN_CHECKPOINTS_SQL)
            .await?
            .into_iter()
            .chain(
                extra
                    .into_iter()
                    .filter(|c| c.offset as i64 > b.root && c.offset <= b.links_upto),
            )
            .collect();
        let chain: Vec<Link> = links.rows(store, LINKS_SQL).await?;
        let found: SpanParts = facts
            .query(store, SPAN_PARTS_SQL)
            .fetch_one()
            .await
            .map_err(ch_err(store))?;
        let span = Span {
            parts: &found.parts,
            ..facts
        };
        let mut rows: Vec<ChainRow> = span.rows(store, ROWS_SQL).await?;
        if rows.len() as u64 != found.n {
            // A part merged away (or a fact deleted) since they were counted.
            rows = Span { parts: &[], ..span }.rows(store, ROWS_SQL).await?;
        }
        // Read after the facts: retention records how far it prunes before it deletes, so a
        // fact missing from the rows above is covered by the value read now (read before, a
        // retention run meanwhile made its deletions look like tampering).
        let pruned_before = self.pruned_before(rep).await?;
        let (heads, sealed) = self.walk(p, &chain, &rows, &b, pruned_before, rep)?;
        // The partition's last sealed offset, also when the window ends before it.
        let last_sealed = match self.opt.range {
            None => chain.last().map(|l| l.offset),
            Some(_) => b.last_link,
        };
        // Facts up to the anchor are before the range: only their presence was checked.
        let rows: Vec<ChainRow> = rows
            .into_iter()
            .filter(|r| r.offset as i64 > b.anchor)
            .collect();
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
            let after = last_sealed.map_or(b.anchor, |l| (l as i64).max(b.anchor));
            let window = self.opt.copy_window_secs;
            let expect = rows.iter().filter(|r| r.offset as i64 > after).count();
            let unsealed = Span { after, ..span };
            if self.opt.max_rows.is_some() {
                // The copy lookup scans the partition's facts ingested within the window,
                // wherever they are: counted like the span's rows (through the caller's
                // store, whose per-query limit bounds the count itself).
                let n = super::unsealed::copies_rows(self.store, unsealed, window).await?;
                charge(read, n, self.opt.max_rows)?;
            }
            for (what, r, detail) in
                unsealed_problems(store, unsealed, Some(expect), window).await?
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
                        "{}checkpoint at offset {}: {}{}",
                        if b.anchor_cp == Some(c.offset) {
                            "anchor "
                        } else {
                            ""
                        },
                        c.offset,
                        if h {
                            ""
                        } else {
                            "the recomputed chain differs from the checkpoint's head (or has no \
                             link at its offset)"
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

    /// The tenant's `pruned_before` if retention can have pruned that far
    /// ([`crate::retention::check_pruned`]) and, when a keyring is given, its signature
    /// verifies under one of its keys ([`crate::retention::check_signature`]). A value that
    /// fails either is reported once, as `pruned_before_invalid` or `pruned_before_unsigned`,
    /// and not used (every missing fact is then `deleted`).
    async fn pruned_before(&self, rep: &mut VerifyReport) -> Result<i64, AuditError> {
        let recorded = crate::retention::get(self.store, self.tenant).await?;
        let now = chrono::Utc::now().timestamp_micros();
        let used = match crate::retention::check_pruned(recorded.pruned_before, now) {
            Ok(0) => return Ok(0),
            Ok(v) => v,
            Err(d) => {
                tenant_problem(rep, PRUNED_INVALID, d);
                0
            }
        };
        if let Err(e) = crate::retention::check_signature(self.keyring, self.tenant, &recorded) {
            let d = format!(
                "the retention table records facts pruned before {}, {e}: not used, so every \
                 missing sealed fact counts as deleted (a signed `weft audit retention apply \
                 --sign-key` records a trusted one)",
                weft_schemas::time::micros_to_rfc3339(recorded.pruned_before),
            );
            tenant_problem(rep, PRUNED_UNSIGNED, d);
            return Ok(0);
        }
        rep.pruned_before = rep.pruned_before.max(used);
        rep.pruned_before_signature = if self.keyring.is_some() {
            PrunedSignature::Verified
        } else {
            PrunedSignature::NotChecked
        };
        Ok(used)
    }

    /// Recompute the links from the start's head and compare each with its stored fact:
    /// returns the head after each offset and the facts the chain covers. A link after
    /// `b.facts_upto` (a range's links up to the last checkpoint) is not compared with a fact;
    /// one at or below `b.anchor` (the anchor's batch) only for the fact's presence. A sealed
    /// fact no longer stored is `pruned` only when retention has pruned the tenant
    /// (`pruned_before` above 0) past its link's time; a link's time is not part of its hash,
    /// so a tenant without retention counts any such fact as `deleted`, whatever time its link
    /// claims.
    fn walk(
        &self,
        p: &Part,
        chain: &[Link],
        rows: &[ChainRow],
        b: &Bounds,
        pruned_before: i64,
        rep: &mut VerifyReport,
    ) -> Result<Walked, AuditError> {
        let mut by_offset: BTreeMap<u64, Vec<&ChainRow>> = BTreeMap::new();
        for r in rows {
            by_offset.entry(r.offset).or_default().push(r);
        }
        let mut heads = BTreeMap::new();
        let mut sealed = HashSet::new();
        let mut prev = b.root_head;
        for l in chain {
            let stored_rh = unhex32(&l.row_hash);
            let (o, k, i) = (l.offset, l.kind.as_str(), l.id.as_str());
            if b.facts_upto.is_some_and(|u| o <= u) {
                match by_offset
                    .get(&o)
                    .and_then(|v| v.iter().find(|r| r.kind == k && r.id == i))
                {
                    None if pruned_before > 0 && l.ts < pruned_before => rep.pruned += 1,
                    None => {
                        let d = format!("{k}:{i} sealed at offset {o} is no longer stored");
                        rep.problems.push(problem(p, "deleted", o, k, i, d));
                    }
                    Some(_) if o as i64 <= b.anchor => {}
                    Some(r) if r.hash()? != stored_rh => {
                        let d = format!("{k}:{i} at offset {o} differs from what was sealed");
                        rep.problems.push(problem(p, "altered", o, k, i, d));
                    }
                    Some(_) => rep.verified += 1,
                }
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

/// Report the tenant's problem `what` (empty topic, partition 0: listed first) once.
fn tenant_problem(rep: &mut VerifyReport, what: &str, detail: String) {
    if rep.problems.iter().any(|x| x.what == what) {
        return;
    }
    rep.problems.push(Problem {
        what: what.into(),
        topic: String::new(),
        partition: 0,
        offset: 0,
        kind: String::new(),
        id: String::new(),
        detail,
    });
}

/// The problem of a `pruned_before` retention cannot have recorded.
pub const PRUNED_INVALID: &str = "pruned_before_invalid";

/// The problem of a `pruned_before` whose signature does not verify under the keyring
/// (unsigned: an apply without a key, a row older than migration 0019, or a forgery).
pub const PRUNED_UNSIGNED: &str = "pruned_before_unsigned";
