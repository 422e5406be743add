//! The SQL of `weft audit check`: one query per invariant (and per I-02 and I-06 half), each
//! read into its row struct in `check.rs`. `{TS}` and `{WIDE}` stand for the range and the
//! range widened by the lookaround (`q` in `check.rs` substitutes them); every value is a
//! query parameter.

pub(super) const TS_RANGE: &str = "ts >= fromUnixTimestamp64Micro({from:Int64}, 'UTC') \
                        AND ts < fromUnixTimestamp64Micro({to:Int64}, 'UTC')";

pub(super) const TS_WIDE: &str = "ts >= fromUnixTimestamp64Micro({wfrom:Int64}, 'UTC') \
                       AND ts < fromUnixTimestamp64Micro({wto:Int64}, 'UTC')";

pub(super) const I02_SQL: &str = "
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

pub(super) const I02_UNTRACED_SQL: &str = "
SELECT DISTINCT id FROM weft_events
WHERE tenant = {t:String} AND kind = 'policy_decision' AND {TS}
  AND ingested_at < now64(6) - toIntervalSecond({grace:UInt64})
  AND cityHash64(id) NOT IN (
      SELECT cityHash64(decision_id) FROM weft_events
      WHERE tenant = {t:String} AND kind = 'trace_event' AND {WIDE} AND decision_id != '')
";

pub(super) const I06_SQL: &str = "
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

pub(super) const I06_UNKNOWN_SQL: &str = "
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

pub(super) const I01_SQL: &str = "
SELECT DISTINCT id FROM weft_events
WHERE tenant = {t:String} AND kind = 'frame' AND {TS}
  AND (multiSearchAny(payload, arrayMap(k -> concat('\"', k, '\"'), {keys:Array(String)}))
       OR position(payload, '\\\\u') > 0)
  AND arrayExists(k -> JSONHas(payload, k), {keys:Array(String)})
";

pub(super) const ORPHAN_SQL: &str = "
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

/// One identity stored with more than one content. Not one: a RoutingDecision stored
/// pending (`selected_item_id` null: weaver-spec's "the LLM response is still pending") and
/// again once selected, with every other top-level key alike; that is the decision completed.
/// The compliance dashboard's violations panel holds the same rule (`dashboards/build.py`).
pub(super) const CONFLICT_SQL: &str = "
SELECT kind, id, uniqExact(content_hash) AS versions FROM weft_events
WHERE tenant = {t:String} AND {WIDE}
  AND (kind, id) IN (SELECT kind, id FROM weft_events WHERE tenant = {t:String} AND {TS} AND conflict = 1)
GROUP BY kind, id
HAVING versions > 1 AND NOT (kind = 'routing_decision' AND versions = 2
  AND uniqExactIf(content_hash, JSONExtractRaw(payload, 'selected_item_id') IN ('', 'null')) = 1
  AND uniqExact(arraySort(arrayFilter(kv -> kv.1 NOT IN ('selected_item_id', 'selected_card_id'),
                                      JSONExtractKeysAndValuesRaw(payload)))) = 1)
";
