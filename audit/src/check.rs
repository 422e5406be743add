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

const TS_RANGE: &str = "ts >= fromUnixTimestamp64Micro({from:Int64}, 'UTC') \
                        AND ts < fromUnixTimestamp64Micro({to:Int64}, 'UTC')";
const TS_WIDE: &str = "ts >= fromUnixTimestamp64Micro({wfrom:Int64}, 'UTC') \
                       AND ts < fromUnixTimestamp64Micro({wto:Int64}, 'UTC')";

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
const I02_SQL: &str = "
WITH bad AS (
    SELECT cityHash64(if(kind = 'policy_decision', id, decision_id)) AS h
    FROM weft_events
    WHERE tenant = {t:String} AND {WIDE}
      AND (kind = 'policy_decision'
           OR (kind = 'trace_event'
               AND event_type IN ('capability_executed', 'capability_authorized', 'capability_denied')))
    GROUP BY h
    HAVING countIf(kind = 'trace_event' AND event_type = 'capability_executed' AND {TS}) > 0
       AND (h = cityHash64('') OR countIf(kind = 'policy_decision') = 0
            OR countIf(kind = 'policy_decision' AND decision != 'allow') > 0
            OR countIf(event_type = 'capability_authorized') = 0
            OR countIf(event_type = 'capability_denied') > 0
            OR minIf(ts, event_type = 'capability_authorized') > minIf(ts, kind = 'trace_event' AND event_type = 'capability_executed' AND {TS}))
)
SELECT e.1 AS exec, d AS decision_id, pd, verdict, auth,
       toUInt8(auth != '' AND ats > e.2) AS auth_late, denied
FROM (
    SELECT if(kind = 'policy_decision', id, decision_id) AS d,
           arrayDistinct(groupArrayIf((id, ts, toUInt8(ingested_at < now64(6) - toIntervalSecond({grace:UInt64}))),
                                      kind = 'trace_event' AND event_type = 'capability_executed' AND {TS})) AS ex,
           anyIf(id, kind = 'policy_decision') AS pd,
           if(countIf(kind = 'policy_decision' AND decision != 'allow') > 0,
              minIf(decision, kind = 'policy_decision' AND decision != 'allow'),
              anyIf(decision, kind = 'policy_decision')) AS verdict,
           argMinIf(id, ts, event_type = 'capability_authorized') AS auth,
           minIf(ts, event_type = 'capability_authorized') AS ats,
           arrayDistinct(groupArrayIf(id, event_type = 'capability_denied')) AS denied
    FROM weft_events
    WHERE tenant = {t:String} AND {WIDE}
      AND (kind = 'policy_decision'
           OR (kind = 'trace_event'
               AND event_type IN ('capability_executed', 'capability_authorized', 'capability_denied')))
      AND cityHash64(if(kind = 'policy_decision', id, decision_id)) IN (SELECT h FROM bad)
    GROUP BY d
    HAVING notEmpty(ex)
)
ARRAY JOIN ex AS e
WHERE d = '' OR (pd != '' AND (verdict != 'allow' OR notEmpty(denied)))
   OR (e.3 = 1 AND (pd = '' OR auth = '' OR ats > e.2 OR notEmpty(denied)))
";

// I-02's other half (weaver-spec `policy_decisions_are_traced`): a PolicyDecision in the
// range that no TraceEvent (of any event type) in the widened range names by `decision_id`.
// Like the orphan check, the decision ids are probed against a set of the cited ids' 64-bit
// cityHash64 (`NOT IN`, read through the (tenant, kind) prefix of the primary key): no
// aggregation over every decision. A decision is hidden only if its hash equals a cited id's,
// about one chance in 2^64 / (cited decisions). A decision ingested less than `grace` ago is
// left out: the trace events that cite it may still be in flight. Two stored versions of one
// decision (an id conflict) are one row.
const I02_UNTRACED_SQL: &str = "
SELECT DISTINCT id FROM weft_events
WHERE tenant = {t:String} AND kind = 'policy_decision' AND {TS}
  AND ingested_at < now64(6) - toIntervalSecond({grace:UInt64})
  AND cityHash64(id) NOT IN (
      SELECT cityHash64(decision_id) FROM weft_events
      WHERE tenant = {t:String} AND kind = 'trace_event' AND {WIDE} AND decision_id != '')
";

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
const I06_SQL: &str = "
WITH uses1 AS (
    SELECT cityHash64(if(kind = 'policy_decision', id, decision_id)) AS pd,
           minIf(cityHash64(token_id), kind = 'policy_decision') AS tmin,
           maxIf(cityHash64(token_id), kind = 'policy_decision') AS tmax,
           countIf(kind = 'policy_decision') AS npd,
           countIf(kind = 'policy_decision' AND decision = 'allow') AS nallow,
           minIf(cityHash64(capability_id), kind = 'policy_decision') AS cmin,
           maxIf(cityHash64(capability_id), kind = 'policy_decision') AS cmax,
           maxIf(ts, kind = 'policy_decision') AS pts,
           countIf(kind = 'policy_decision' AND {TS}) AS in_range,
           countIf(kind = 'trace_event') AS nexec,
           maxIf(ts, kind = 'trace_event') AS ets,
           minIf(cityHash64(capability_id), kind = 'trace_event') AS emin,
           maxIf(cityHash64(capability_id), kind = 'trace_event') AS emax
    FROM weft_events
    WHERE tenant = {t:String} AND {WIDE}
      AND ((kind = 'policy_decision' AND token_id != '')
           OR (kind = 'trace_event' AND event_type = 'capability_executed' AND decision_id != ''))
    GROUP BY pd
    HAVING in_range > 0 AND npd > 0
),
far AS MATERIALIZED (
    SELECT DISTINCT token_id FROM weft_events
    WHERE tenant = {t:String} AND kind = 'policy_decision' AND {WIDE} AND token_id != ''
      AND cityHash64(token_id) NOT IN (
          SELECT cityHash64(id) FROM weft_events
          WHERE tenant = {t:String} AND kind = 'capability_token' AND {WIDE})
),
tokens AS (
    SELECT id, token_scope, token_expires_at, token_single_use, ingested_at, topic, partition, offset
    FROM weft_events
    WHERE tenant = {t:String} AND kind = 'capability_token' AND {WIDE}
    UNION ALL
    SELECT id, token_scope, token_expires_at, token_single_use, ingested_at, topic, partition, offset
    FROM weft_events
    WHERE tenant = {t:String} AND kind = 'capability_token' AND NOT ({WIDE}) AND id IN far
),
sus AS MATERIALIZED (
    SELECT tok FROM (
        SELECT arrayJoin(if(tmin = tmax, [tmax], [tmin, tmax])) AS tok, 1 AS is_use, nallow, pts, nexec, ets,
               if(nexec > 0, [cmin, cmax, emin, emax], [cmin, cmax]) AS caps,
               toUInt8(npd > 1 OR emin != emax) AS multi,
               CAST([], 'Array(UInt64)') AS scope, CAST(NULL AS Nullable(DateTime64(6, 'UTC'))) AS exp, toUInt8(0) AS su
        FROM uses1
        UNION ALL
        SELECT cityHash64(id) AS tok, 0, 0, toDateTime64(0, 6, 'UTC'), 0, toDateTime64(0, 6, 'UTC'), CAST([], 'Array(UInt64)'), 0,
               arrayMap(x -> cityHash64(x), token_scope), token_expires_at, token_single_use
        FROM tokens
    )
    GROUP BY tok
    HAVING countIf(is_use = 0) > 0 AND countIf(is_use = 1) > 0
       AND (countIf(is_use = 0) > 1 OR sum(multi) > 0
            OR (anyIf(su, is_use = 0) = 1 AND countIf(nallow > 0) > 1)
            OR coalesce(anyIf(exp, is_use = 0) < greatest(maxIf(pts, nallow > 0), maxIf(ets, nexec > 0)), 0)
            OR NOT hasAll(anyIf(scope, is_use = 0), groupArrayArrayIf(caps, nallow > 0)))
)
,
uses AS (
    SELECT if(kind = 'policy_decision', id, decision_id) AS pd,
           argMinIf(token_id, (ingested_at, topic, partition, offset), kind = 'policy_decision') AS tok,
           argMinIf(capability_id, (ingested_at, topic, partition, offset), kind = 'policy_decision') AS cap,
           if(countIf(kind = 'policy_decision' AND decision = 'allow') > 0, 'allow',
              argMinIf(decision, (ingested_at, topic, partition, offset), kind = 'policy_decision')) AS verdict,
           minIf(ts, kind = 'policy_decision') AS pts,
           countIf(kind = 'policy_decision' AND {TS}) AS in_range,
           groupUniqArrayIf(id, kind = 'trace_event') AS execs,
           maxIf(ts, kind = 'trace_event') AS ets,
           groupUniqArrayIf(capability_id, kind = 'trace_event') AS ecaps
    FROM weft_events
    WHERE tenant = {t:String} AND {WIDE}
      AND ((kind = 'policy_decision' AND cityHash64(token_id) IN sus)
           OR (kind = 'trace_event' AND event_type = 'capability_executed' AND decision_id IN (
               SELECT id FROM weft_events
               WHERE tenant = {t:String} AND kind = 'policy_decision' AND {WIDE} AND cityHash64(token_id) IN sus)))
    GROUP BY pd
    HAVING in_range > 0 AND tok != ''
),
toks AS (
    -- Each token's uses and its own typed columns (0007), gathered by one aggregation on the
    -- token id: no join and no window over the decisions (the join + window took most of
    -- this check's time over 10M events). A use whose token is not stored is dropped, as an
    -- inner join would.
    SELECT tok, groupArrayIf((pd, cap, verdict, pts, execs, ets, ecaps), is_tok = 0) AS us,
           argMinIf((scope, exp, su), stored_at, is_tok = 1) AS tinfo, countIf(is_tok = 1) AS stored,
           arrayCount(x -> tupleElement(x, 3) = 'allow', us) AS allows
    FROM (
        SELECT tok, pd, cap, verdict, pts, execs, ets, ecaps,
               CAST([], 'Array(String)') AS scope,
               CAST(NULL AS Nullable(DateTime64(6, 'UTC'))) AS exp,
               toUInt8(0) AS su, 0 AS is_tok,
               (toDateTime64(0, 6, 'UTC'), '', toUInt32(0), toUInt64(0)) AS stored_at
        FROM uses
        UNION ALL
        SELECT id AS tok, '' AS pd, '' AS cap, '' AS verdict,
               toDateTime64(0, 6, 'UTC') AS pts, CAST([], 'Array(String)') AS execs,
               toDateTime64(0, 6, 'UTC') AS ets, CAST([], 'Array(String)') AS ecaps,
               token_scope AS scope, token_expires_at AS exp, token_single_use AS su, 1 AS is_tok,
               (ingested_at, toString(topic), partition, offset) AS stored_at
        FROM tokens
        WHERE cityHash64(id) IN sus
    )
    GROUP BY tok
    HAVING stored > 0 AND notEmpty(us)
)
SELECT tupleElement(u, 1) AS pd, tok,
       toUInt8(tupleElement(tinfo, 3) AND tupleElement(u, 3) = 'allow' AND allows > 1) AS reused,
       toUInt8(coalesce(tupleElement(tinfo, 2) IS NOT NULL AND ((tupleElement(u, 3) = 'allow' AND tupleElement(u, 4) > tupleElement(tinfo, 2)) OR (notEmpty(tupleElement(u, 5)) AND tupleElement(u, 6) > tupleElement(tinfo, 2))), 0)) AS expired,
       toUInt8(tupleElement(u, 3) = 'allow' AND (NOT has(tupleElement(tinfo, 1), tupleElement(u, 2)) OR arrayExists(c -> NOT has(tupleElement(tinfo, 1), c), tupleElement(u, 7)))) AS out_of_scope,
       tupleElement(u, 5) AS execs, tupleElement(u, 2) AS cap
FROM toks
ARRAY JOIN us AS u
WHERE reused OR expired OR out_of_scope
";

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
const I06_UNKNOWN_SQL: &str = "
WITH far AS MATERIALIZED (
    SELECT DISTINCT token_id FROM weft_events
    WHERE tenant = {t:String} AND kind = 'policy_decision' AND {TS} AND decision = 'allow'
      AND token_id != '' AND ingested_at < now64(6) - toIntervalSecond({grace:UInt64})
      AND cityHash64(token_id) NOT IN (
          SELECT cityHash64(id) FROM weft_events
          WHERE tenant = {t:String} AND kind = 'capability_token' AND {WIDE})
)
SELECT token_id AS tok, arraySort(groupUniqArray(id)) AS pds FROM weft_events
WHERE tenant = {t:String} AND kind = 'policy_decision' AND {TS} AND decision = 'allow'
  AND ingested_at < now64(6) - toIntervalSecond({grace:UInt64})
  AND token_id IN far
  AND token_id NOT IN (
      SELECT id FROM weft_events
      WHERE tenant = {t:String} AND kind = 'capability_token' AND id IN far)
GROUP BY token_id
";

// The text search only spares `JSONHas` the frames that cannot hold a key: one written with
// a JSON escape (`"raw\u005foutput"`, stored as the producer sent it, and read as `raw_output`
// by `JSONHas`, serde and the bundle's conformance check alike) has no literal `"raw_output"`,
// so a payload with any `\u` escape is always parsed.
const I01_SQL: &str = "
SELECT DISTINCT id FROM weft_events
WHERE tenant = {t:String} AND kind = 'frame' AND {TS}
  AND (multiSearchAny(payload, arrayMap(k -> concat('\"', k, '\"'), {keys:Array(String)}))
       OR position(payload, '\\\\u') > 0)
  AND arrayExists(k -> JSONHas(payload, k), {keys:Array(String)})
";

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
const ORPHAN_SQL: &str = "
SELECT id, arraySort(groupUniqArrayArray(miss)) AS missing FROM (
    SELECT id, arrayFilter(r -> r.2 != '', [
        ('policy_decision', if(decision_id != '' AND cityHash64(decision_id) NOT IN (
            SELECT cityHash64(id) FROM weft_events
            WHERE tenant = {t:String} AND kind = 'policy_decision' AND {WIDE}), decision_id, '')),
        ('frame', if(frame_id != '' AND cityHash64(frame_id) NOT IN (
            SELECT cityHash64(id) FROM weft_events
            WHERE tenant = {t:String} AND kind = 'frame' AND {WIDE}), frame_id, '')),
        ('handle', if(handle_id != '' AND cityHash64(handle_id) NOT IN (
            SELECT cityHash64(id) FROM weft_events
            WHERE tenant = {t:String} AND kind = 'handle' AND {WIDE}), handle_id, ''))
    ]) AS miss
    FROM weft_events
    WHERE tenant = {t:String} AND kind = 'trace_event' AND {TS}
      AND ingested_at < now64(6) - toIntervalSecond({grace:UInt64})
)
WHERE notEmpty(miss)
GROUP BY id
";

#[derive(Debug, Row, Deserialize)]
struct ConflictRow {
    kind: String,
    id: String,
    versions: u64,
}

/// One identity stored with more than one content. Not one: a RoutingDecision stored
/// pending (`selected_item_id` null: weaver-spec's "the LLM response is still pending") and
/// again once selected, with every other top-level key alike; that is the decision completed.
/// The compliance dashboard's violations panel holds the same rule (`dashboards/build.py`).
const CONFLICT_SQL: &str = "
SELECT kind, id, uniqExact(content_hash) AS versions FROM weft_events
WHERE tenant = {t:String} AND {WIDE}
  AND (kind, id) IN (SELECT kind, id FROM weft_events WHERE tenant = {t:String} AND {TS} AND conflict = 1)
GROUP BY kind, id
HAVING versions > 1 AND NOT (kind = 'routing_decision' AND versions = 2
  AND uniqExactIf(content_hash, JSONExtractRaw(payload, 'selected_item_id') IN ('', 'null')) = 1
  AND uniqExact(arraySort(arrayFilter(kv -> kv.1 NOT IN ('selected_item_id', 'selected_card_id'),
                                      JSONExtractKeysAndValuesRaw(payload)))) = 1)
";

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
