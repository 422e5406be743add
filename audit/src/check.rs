//! Invariant checks over a time range: `weft audit check`.
//!
//! Each check is one set-based ClickHouse query (I-02 and I-06: two), joins and aggregates over the
//! typed columns of `weft_events`, never a row-by-row walk in Rust: only the offending rows
//! leave the server, and Rust only groups them into [`Finding`]s. All checks are scoped to
//! one tenant; the events a check starts from (executions, policy decisions, frames, trace
//! events) must fall in the range, and the events they point at are looked up within the
//! range widened by [`CheckOptions::lookaround_secs`] on both sides.
//!
//! The one exception is I-06's tokens: a token is looked up by the id its decisions name,
//! whenever it was issued (a long-lived token may be used months after its issue).
//!
//! Known limits: a single-use token counts only the uses inside the range; an id conflict is
//! found through the ingest's `conflict` flag, so two versions further apart than the ingest's
//! dedup window (7 days) are not reported.

use std::collections::BTreeMap;

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use tracing::instrument;
use weft_schemas::conformance::RAW_OUTPUT_KEYS;

use crate::{ch_err, AuditError, EventRef, Range, Store};

mod sql;
use sql::*;

/// One broken invariant and the events that prove it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// `I-01`, `I-02`, `I-06`, `orphan` or `id_conflict` (the simulator's truth uses the same).
    pub invariant: String,
    /// Which rule of the invariant, e.g. `execution_after_deny`, `token_reused`.
    pub rule: String,
    /// The event an auditor names first: the token (I-06), the execution (I-02), the
    /// PolicyDecision (I-02 `decision_untraced`), the Frame (I-01), the trace event (orphan)
    /// or the conflicting identity.
    pub subject: EventRef,
    /// Every event that together proves it, `subject` first.
    pub events: Vec<EventRef>,
    /// A sentence for humans.
    pub detail: String,
}

/// Tunables of a check run.
#[derive(Debug, Clone, Copy)]
pub struct CheckOptions {
    /// A trace event whose decision, frame or handle is missing is an orphan only once it
    /// was ingested at least this long ago (the referenced event may still be in flight);
    /// likewise a PolicyDecision no trace event names (I-02 `decision_untraced`), and an
    /// execution whose decision or `capability_authorized` is missing or late (I-02
    /// `decision_missing`, `not_authorized_event`, `authorized_after_execution`).
    pub grace_secs: u64,
    /// How far outside the range referenced events are looked up.
    pub lookaround_secs: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            grace_secs: 300,
            lookaround_secs: 24 * 3600,
        }
    }
}

/// The result of a check run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Tenant the check ran for.
    pub tenant: String,
    /// Time range the check covered.
    pub range: Range,
    /// Findings, ordered by invariant, rule, subject.
    pub findings: Vec<Finding>,
    /// Findings per invariant.
    pub counts: BTreeMap<String, u64>,
    /// Wall time of the whole run, milliseconds.
    pub elapsed_ms: u64,
    /// Wall time of each check's query (run one after the other), milliseconds.
    pub timings_ms: BTreeMap<String, u64>,
}

/// Run one check's query, with how long it took (milliseconds).
async fn timed<T>(
    store: &Store,
    query: clickhouse::query::Query,
) -> Result<(Vec<T>, u64), AuditError>
where
    T: clickhouse::RowOwned + clickhouse::RowRead,
{
    let t = std::time::Instant::now();
    let rows = query.fetch_all::<T>().await.map_err(ch_err(store))?;
    Ok((rows, t.elapsed().as_millis() as u64))
}

fn q(
    store: &Store,
    sql: &str,
    tenant: &str,
    range: Range,
    opt: CheckOptions,
) -> clickhouse::query::Query {
    let wide = i64::try_from(opt.lookaround_secs.saturating_mul(1_000_000)).unwrap_or(i64::MAX / 4);
    let sql = sql.replace("{TS}", TS_RANGE).replace("{WIDE}", TS_WIDE);
    store
        .client()
        .query(&sql)
        .param("t", tenant)
        .param("from", range.from)
        .param("to", range.to)
        .param("wfrom", range.from.saturating_sub(wide))
        .param("wto", range.to.saturating_add(wide))
}

#[derive(Debug, Row, Deserialize)]
struct I02Row {
    exec: String,
    decision_id: String,
    pd: String,
    verdict: String,
    auth: String,
    auth_late: u8,
    denied: Vec<String>,
}

// Two passes over the decisions and their trace events. The first groups them by the 64-bit
// hash of the decision id with counters only (no id or array state: those made the
// single-pass version 3x dearer over 10M events; a UInt64 key is 7% cheaper than the string)
// and keeps the decisions that break a rule; the second gathers the proving ids for those few
// decisions only (`IN` the first pass's set). The first pass is a superset test (any
// non-allow version, an authorization later than the earliest execution), the second
// applies the exact rules. Two decision ids with one hash share a group, which can hide a
// finding only if the other decision's events mask it: about one chance in 2^64 / (decisions
// in the range) per decision for ids made independently. cityHash64 is not keyed, so a producer able to choose its ids
// could craft a collision on purpose (the orphan check's hashed sets share this limit).
//
// Grace, as for orphans: an execution ingested less than `grace` ago is judged only by the
// rules no late event can undo: `no_decision` (it names no decision) and
// `execution_after_deny` with its decision stored (a stored deny, or a stored
// `capability_denied`). `decision_missing`, `not_authorized_event` and
// `authorized_after_execution` wait: the PolicyDecision (another topic) or the
// `capability_authorized` may still be in flight.
//
// A decision stored with several contents (an id conflict) is read conservatively and the
// same way every run: a non-allow verdict in any version is its verdict (the least such, if
// the versions disagree on which), so an allow version cannot hide `execution_after_deny`.

// I-02's other half (weaver-spec `policy_decisions_are_traced`): a PolicyDecision in the
// range that no TraceEvent (of any event type) in the widened range names by `decision_id`.
// Like the orphan check, the decision ids are probed against a set of the cited ids' 64-bit
// cityHash64 (`NOT IN`, read through the (tenant, kind) prefix of the primary key): no
// aggregation over every decision. A decision is hidden only if its hash equals a cited id's,
// about one chance in 2^64 / (cited decisions). A decision ingested less than `grace` ago is
// left out: the trace events that cite it may still be in flight. Two stored versions of one
// decision (an id conflict) are one row.

#[derive(Debug, Row, Deserialize)]
struct I06Row {
    pd: String,
    tok: String,
    reused: u8,
    expired: u8,
    out_of_scope: u8,
    execs: Vec<String>,
    cap: String,
}

// Two stages. `sus` (MATERIALIZED: computed once, `enable_materialized_cte`) finds the
// tokens that may break a rule from numeric states only: per decision (grouped by its id's
// hash), hashes of its token and capabilities and the latest decision and execution times;
// per token, its scope's hashes, expiry and single-use flag. It is a superset test: two
// stored versions of a decision or token, executions with several capabilities, and two
// decisions or tokens whose ids collide only make a token suspect. The one way to lose a
// finding is a capability whose 64-bit hash equals that of a different entry of the token's
// scope (about 2^-64 per pair). The second stage is the exact check, over the suspects'
// decisions, executions and tokens only (81k of 954k tokens in the 10M benchmark).
//
// Tokens (`tokens`) are those issued in the widened range, read by time, and those the
// widened range's decisions name that are not among them (`far`, MATERIALIZED: usually few
// or none), read by id from the whole history through the Bloom-filter index on `id`: a
// token issued on Monday that expired an hour later and is used on Wednesday is checked by a
// check of Wednesday. A use whose token is stored nowhere is dropped here, as an inner join would;
// `I06_UNKNOWN_SQL` reports its allow decisions (`token_unknown`).
//
// A decision stored with several contents (an id conflict) is read the same way every run:
// an allow in any version makes it a use (the conservative reading for I-06), and its token
// and capability are the first stored version's, as is a token's scope, expiry and flag
// (least `(ingested_at, topic, partition, offset)`, unique per fact).

#[derive(Debug, Row, Deserialize)]
struct UnknownTokenRow {
    tok: String,
    pds: Vec<String>,
}

// I-06 `token_unknown`: an allow PolicyDecision in the range names a token that is stored
// nowhere, so nothing shows the authorization was scoped and expiring. Decisions ingested
// less than `grace` ago are left out (the token, on another topic, may still be in flight),
// as for orphans. The tokens issued in the widened range are ruled out by their ids' hashes
// (as the orphan check does: a missing token hides only behind a hash collision); the few
// ids left are looked up by id in the whole history, through the Bloom-filter index on `id`.

// The text search only spares `JSONHas` the frames that cannot hold a key: one written with
// a JSON escape (`"raw\u005foutput"`, stored as the producer sent it, and read as `raw_output`
// by `JSONHas`, serde and the bundle's conformance check alike) has no literal `"raw_output"`,
// so a payload with any `\u` escape is always parsed.

#[derive(Debug, Row, Deserialize)]
struct OrphanRow {
    id: String,
    missing: Vec<(String, String)>,
}

// Each kind of reference is probed against a set of that kind's ids (`NOT IN`, read through
// the primary key's (tenant, kind) prefix) instead of grouping references and targets
// together: no aggregation over every stored decision, frame and handle. The sets hold the
// ids' 64-bit cityHash64 (a set of UInt64 is built and probed about 1.7x faster than one of
// strings): a missing reference is hidden only if its hash equals a stored id's, about one
// chance in 2^64 / (ids of that kind) per reference.

#[derive(Debug, Row, Deserialize)]
struct ConflictRow {
    kind: String,
    id: String,
    versions: u64,
}

/// Run every check for `tenant` over `range`.
#[instrument(skip(store), fields(tenant = %tenant))]
pub async fn run(
    store: &Store,
    tenant: &str,
    range: Range,
    opt: CheckOptions,
) -> Result<Report, AuditError> {
    let started = std::time::Instant::now();
    // The queries run one after the other: on a small server, concurrent heavy queries only
    // fight over cores and memory bandwidth (measured: 13.6 s concurrent vs 6.8 s in
    // sequence, 10M rows; again after 0007 and the rewrites: 22.1 s concurrent vs 13.4 s in
    // sequence, 2 loaded cores). Each check's findings are built and sorted on a blocking
    // thread (0.4 s of CPU for 200k findings: kept off the async workers that also serve
    // `weft audit serve`), overlapping the next query, and the groups are joined in
    // invariant order at the end. Sorting per check replaces one sort of all findings.
    let mut timings_ms: BTreeMap<String, u64> = BTreeMap::new();
    let mut groups = Vec::new();
    let i02 = timed::<I02Row>(
        store,
        q(store, I02_SQL, tenant, range, opt).param("grace", opt.grace_secs),
    )
    .await?;
    timings_ms.insert("I-02".into(), i02.1);
    // I-02's decisions that no trace event names: its own query and timing, one group (and
    // so one sort, one `limit` and one count) with the executions' findings.
    let untraced = timed::<String>(
        store,
        q(store, I02_UNTRACED_SQL, tenant, range, opt).param("grace", opt.grace_secs),
    )
    .await?;
    timings_ms.insert("I-02 untraced".into(), untraced.1);
    let grace = opt.grace_secs;
    groups.push((
        "I-02",
        sorted_off_thread(move || {
            let mut findings = i02_findings(i02.0);
            findings.extend(untraced_findings(untraced.0, grace));
            findings
        }),
    ));
    let i06 = timed::<I06Row>(
        store,
        q(store, I06_SQL, tenant, range, opt).with_setting("enable_materialized_cte", "1"),
    )
    .await?;
    timings_ms.insert("I-06".into(), i06.1);
    let unknown = timed::<UnknownTokenRow>(
        store,
        q(store, I06_UNKNOWN_SQL, tenant, range, opt)
            .param("grace", opt.grace_secs)
            .with_setting("enable_materialized_cte", "1"),
    )
    .await?;
    timings_ms.insert("I-06 unknown".into(), unknown.1);
    groups.push((
        "I-06",
        sorted_off_thread(move || {
            let mut findings = i06_findings(i06.0);
            findings.extend(unknown_token_findings(unknown.0, grace));
            findings
        }),
    ));
    let i01 = timed::<String>(
        store,
        q(store, I01_SQL, tenant, range, opt).param("keys", RAW_OUTPUT_KEYS.to_vec()),
    )
    .await?;
    timings_ms.insert("I-01".into(), i01.1);
    groups.push(("I-01", sorted_off_thread(move || i01_findings(i01.0))));
    let orphans = timed::<OrphanRow>(
        store,
        q(store, ORPHAN_SQL, tenant, range, opt).param("grace", opt.grace_secs),
    )
    .await?;
    timings_ms.insert("orphan".into(), orphans.1);
    groups.push((
        "orphan",
        sorted_off_thread(move || orphan_findings(orphans.0, grace)),
    ));
    let conflicts = timed::<ConflictRow>(store, q(store, CONFLICT_SQL, tenant, range, opt)).await?;
    timings_ms.insert("id_conflict".into(), conflicts.1);
    groups.push((
        "id_conflict",
        sorted_off_thread(move || conflict_findings(conflicts.0)),
    ));
    // Findings are ordered by invariant, then (within a group) by rule and subject.
    groups.sort_by_key(|(invariant, _)| *invariant);
    let mut findings = Vec::new();
    for (_, group) in groups {
        match group.await {
            Ok(group) => findings.extend(group),
            // A builder panicked: re-raise it here rather than report a partial check.
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => return Err(AuditError::Invalid(format!("check cancelled: {e}"))),
            },
        }
    }
    let mut counts = BTreeMap::new();
    for f in &findings {
        *counts.entry(f.invariant.clone()).or_insert(0) += 1;
    }
    Ok(Report {
        tenant: tenant.to_owned(),
        range,
        findings,
        counts,
        elapsed_ms: started.elapsed().as_millis() as u64,
        timings_ms,
    })
}

/// Build one check's findings and sort them by (rule, subject) on a blocking thread.
fn sorted_off_thread(
    build: impl FnOnce() -> Vec<Finding> + Send + 'static,
) -> tokio::task::JoinHandle<Vec<Finding>> {
    tokio::task::spawn_blocking(move || {
        let mut findings = build();
        findings.sort_unstable_by(|a, b| (&a.rule, &a.subject).cmp(&(&b.rule, &b.subject)));
        findings
    })
}

fn i01_findings(ids: Vec<String>) -> Vec<Finding> {
    ids.into_iter()
        .map(|id| {
            let subject = EventRef::new("frame", id.clone());
            Finding {
                invariant: "I-01".into(),
                rule: "frame_carries_raw_output".into(),
                events: vec![subject.clone()],
                detail: format!("Frame {id} carries one of {RAW_OUTPUT_KEYS:?}"),
                subject,
            }
        })
        .collect()
}

fn orphan_findings(rows: Vec<OrphanRow>, grace_secs: u64) -> Vec<Finding> {
    rows.into_iter()
        .map(|o| {
            let subject = EventRef::new("trace_event", o.id.clone());
            let missing: Vec<String> = o.missing.iter().map(|(k, i)| format!("{k}:{i}")).collect();
            Finding {
                invariant: "orphan".into(),
                rule: "reference_never_arrived".into(),
                events: vec![subject.clone()],
                detail: format!(
                    "trace event {} references {} which did not arrive within {grace_secs} s",
                    o.id,
                    missing.join(", "),
                ),
                subject,
            }
        })
        .collect()
}

fn conflict_findings(rows: Vec<ConflictRow>) -> Vec<Finding> {
    rows.into_iter()
        .map(|c| {
            let subject = EventRef::new(&c.kind, c.id);
            Finding {
                invariant: "id_conflict".into(),
                rule: "same_id_different_content".into(),
                events: vec![subject.clone()],
                detail: format!(
                    "{subject} was stored with {} different contents",
                    c.versions
                ),
                subject,
            }
        })
        .collect()
}

fn untraced_findings(ids: Vec<String>, grace_secs: u64) -> Vec<Finding> {
    ids.into_iter()
        .map(|id| {
            let subject = EventRef::new("policy_decision", id.clone());
            Finding {
                invariant: "I-02".into(),
                rule: "decision_untraced".into(),
                events: vec![subject.clone()],
                detail: format!(
                    "PolicyDecision {id} is named by no TraceEvent's decision_id \
                     more than {grace_secs} s after it was ingested"
                ),
                subject,
            }
        })
        .collect()
}

fn i02_findings(rows: Vec<I02Row>) -> Vec<Finding> {
    // Two stored versions of one execution (an id conflict) are one finding.
    let mut seen = std::collections::HashSet::new();
    rows.into_iter()
        .filter(|r| seen.insert(r.exec.clone()))
        .map(|r| {
            let exec = EventRef::new("trace_event", r.exec.clone());
            let mut events = vec![exec.clone()];
            if !r.pd.is_empty() {
                events.push(EventRef::new("policy_decision", r.pd.clone()));
            }
            for d in &r.denied {
                events.push(EventRef::new("trace_event", d.clone()));
            }
            if !r.auth.is_empty() && r.auth_late == 1 {
                events.push(EventRef::new("trace_event", r.auth.clone()));
            }
            let (rule, detail) = if r.decision_id.is_empty() {
                (
                    "no_decision",
                    format!("capability_executed {} carries no decision_id", r.exec),
                )
            } else if r.pd.is_empty() {
                (
                    "decision_missing",
                    format!(
                        "capability_executed {} cites decision {}, which is not stored",
                        r.exec, r.decision_id
                    ),
                )
            } else if r.verdict != "allow" || !r.denied.is_empty() {
                (
                    "execution_after_deny",
                    format!(
                        "capability_executed {} follows {} decision {}",
                        r.exec, r.verdict, r.pd
                    ),
                )
            } else if r.auth.is_empty() {
                (
                    "not_authorized_event",
                    format!(
                        "capability_executed {} has allow decision {} but no capability_authorized",
                        r.exec, r.pd
                    ),
                )
            } else {
                (
                    "authorized_after_execution",
                    format!(
                        "capability_executed {} precedes its capability_authorized {}",
                        r.exec, r.auth
                    ),
                )
            };
            Finding {
                invariant: "I-02".into(),
                rule: rule.into(),
                subject: exec,
                events,
                detail,
            }
        })
        .collect()
}

fn unknown_token_findings(rows: Vec<UnknownTokenRow>, grace_secs: u64) -> Vec<Finding> {
    rows.into_iter()
        .map(|r| {
            let subject = EventRef::new("capability_token", r.tok.clone());
            let mut events = vec![subject.clone()];
            events.extend(
                r.pds
                    .iter()
                    .map(|p| EventRef::new("policy_decision", p.clone())),
            );
            Finding {
                invariant: "I-06".into(),
                rule: "token_unknown".into(),
                detail: format!(
                    "token {} that {} allowed is stored nowhere, more than {grace_secs} s \
                     after the decision was ingested",
                    r.tok,
                    r.pds.join(", ")
                ),
                subject,
                events,
            }
        })
        .collect()
}

fn i06_findings(rows: Vec<I06Row>) -> Vec<Finding> {
    // (token, rule) -> (pds, execs, caps)
    type Acc = (Vec<String>, Vec<String>, Vec<String>);
    let mut by: BTreeMap<(String, &'static str), Acc> = BTreeMap::new();
    for r in rows {
        for (flag, rule) in [
            (r.reused, "token_reused"),
            (r.expired, "token_expired"),
            (r.out_of_scope, "token_out_of_scope"),
        ] {
            if flag == 1 {
                let e = by.entry((r.tok.clone(), rule)).or_default();
                e.0.push(r.pd.clone());
                e.1.extend(r.execs.iter().cloned());
                e.2.push(r.cap.clone());
            }
        }
    }
    by.into_iter()
        .map(|((tok, rule), (mut pds, mut execs, mut caps))| {
            pds.sort();
            execs.sort();
            caps.sort();
            caps.dedup();
            let subject = EventRef::new("capability_token", tok.clone());
            let mut events = vec![subject.clone()];
            events.extend(
                pds.iter()
                    .map(|p| EventRef::new("policy_decision", p.clone())),
            );
            events.extend(
                execs
                    .iter()
                    .map(|e| EventRef::new("trace_event", e.clone())),
            );
            let detail = match rule {
                "token_reused" => format!(
                    "single-use token {tok} authorized {} decisions: {}",
                    pds.len(),
                    pds.join(", ")
                ),
                "token_expired" => format!(
                    "token {tok} was used after its expires_at by {}",
                    pds.join(", ")
                ),
                _ => format!(
                    "token {tok} does not cover {} used by {}",
                    caps.join(", "),
                    pds.join(", ")
                ),
            };
            Finding {
                invariant: "I-06".into(),
                rule: rule.into(),
                subject,
                events,
                detail,
            }
        })
        .collect()
}
