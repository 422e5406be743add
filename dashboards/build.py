#!/usr/bin/env python3
"""Writes the Grafana dashboards (dashboards/*.json) and the expected-columns sidecar
(dashboards/expected.yaml) from the panel definitions below.

Why a generator: the panel SQL is long and multi-line; keeping it here as plain text (and
the JSON as output) keeps the SQL readable and every panel's shape uniform. Edit this file,
run `python3 dashboards/build.py`, commit both (`--check` writes nothing and fails when the
files differ from what it would write). `cargo test --test dashboards` runs every panel's
SQL against ClickHouse, and fails when the JSON and this file disagree.
"""

import json
import os
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
CH = {"type": "grafana-clickhouse-datasource", "uid": "${datasource}"}
TENANT = "tenant = ${tenant:sqlstring}"


def indent(sql, n):
    """`sql` indented by `n` spaces, to nest a shared subquery."""
    return textwrap.indent(sql, " " * n)

# The plugin's query types and formats (src/types/sql.ts, Format in queryBuilder.ts).
QT = {"timeseries": ("timeseries", 0), "table": ("table", 1), "traces": ("traces", 3)}


def ch_panel(title, desc, kind, sql, columns, non_empty, viz=None, unit=None, w=12, h=8):
    qtype, fmt = QT[kind]
    return {
        "_expect": {"columns": columns, "non_empty": non_empty},
        "type": viz or {"timeseries": "timeseries", "table": "table", "traces": "traces"}[kind],
        "title": title,
        "description": desc,
        "datasource": CH,
        "targets": [
            {
                "refId": "A",
                "datasource": CH,
                "editorType": "sql",
                "queryType": qtype,
                "format": fmt,
                "rawSql": sql.strip(),
            }
        ],
        "fieldConfig": {"defaults": {"unit": unit} if unit else {}, "overrides": []},
        "options": {},
        "_size": (w, h),
    }


def ds_var(name, label, plugin):
    return {
        "name": name,
        "label": label,
        "type": "datasource",
        "query": plugin,
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }


def query_var(name, label, sql):
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": CH,
        "query": sql.strip(),
        "definition": sql.strip(),
        "refresh": 2,
        "current": {},
        "hide": 0,
        "multi": False,
        "includeAll": False,
        "sort": 0,
        "options": [],
        "regex": "",
    }


TENANT_VAR = query_var(
    "tenant", "Tenant", "SELECT DISTINCT tenant FROM weft_events ORDER BY tenant"
)


def textbox_var(name, label, default):
    return {
        "name": name,
        "label": label,
        "type": "textbox",
        "query": default,
        "current": {"text": default, "value": default},
        "options": [{"selected": True, "text": default, "value": default}],
        "hide": 0,
    }


# `weft audit check --grace-secs`: how long after ingest a missing reference (an orphan's
# decision, frame or handle; an execution's PolicyDecision or capability_authorized; the
# trace events naming a PolicyDecision; an allowed token) may still be in flight. Same
# default as the check.
GRACE_VAR = textbox_var("grace", "Grace (s)", "300")
# An event ingested at least the grace period ago: judged on what has not arrived.
PAST_GRACE = "ingested_at < now64(6) - toIntervalSecond(toUInt64OrZero(${grace:sqlstring}))"


def dashboard(uid, title, desc, variables, panels, tags):
    out, expect = [], {}
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p.pop("_size")
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["id"] = i
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        x += w
        row_h = max(row_h, h)
        e = p.pop("_expect", None)
        if e is not None:
            expect[str(i)] = e
        out.append(p)
    return (
        {
            "uid": uid,
            "title": title,
            "description": desc,
            "tags": ["weft"] + tags,
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": 39,
            "version": 1,
            "time": {"from": "now-6h", "to": "now"},
            "refresh": "30s",
            "timezone": "utc",
            "templating": {"list": variables},
            "annotations": {"list": []},
            "links": [],
            "panels": out,
        },
        expect,
    )


# ---------------------------------------------------------------- pipeline operations
OPS = [
    ch_panel(
        "Ingest rate per topic",
        "Facts stored per second, by source topic, bucketed by the batch's ingested_at.",
        "timeseries",
        """
SELECT $__timeInterval(ingested_at) AS time, topic, count() / $__interval_s AS events_per_second
FROM weft_events
WHERE $__timeFilter(ingested_at)
GROUP BY time, topic
ORDER BY time, topic
""",
        ["time", "topic", "events_per_second"],
        True,
        unit="ops",
    ),
    ch_panel(
        "End-to-end freshness (emitted -> queryable)",
        "ingested_at minus the producer's emitted_at, in seconds (producer clocks must be in sync). "
        "The ingest also exports weft_ingest_freshness_seconds.",
        "timeseries",
        """
SELECT $__timeInterval(ingested_at) AS time,
       quantile(0.5)(freshness_s) AS p50,
       quantile(0.9)(freshness_s) AS p90,
       quantile(0.99)(freshness_s) AS p99,
       max(freshness_s) AS max
FROM
(
    SELECT ingested_at,
           (toUnixTimestamp64Micro(ingested_at) - toUnixTimestamp64Micro(emitted_at)) / 1e6 AS freshness_s
    FROM weft_events
    WHERE $__timeFilter(ingested_at)
)
GROUP BY time
ORDER BY time
""",
        ["time", "p50", "p90", "p99", "max"],
        True,
        unit="s",
    ),
    ch_panel(
        "Rows per insert (batch size)",
        "Each facts insert stamps one ingested_at and covers one source partition, so rows per "
        "(ingested_at, topic, partition) is the batch size of one insert.",
        "timeseries",
        """
SELECT $__timeInterval(ingested_at) AS time,
       count() AS inserts,
       quantile(0.5)(rows) AS p50_rows,
       max(rows) AS max_rows
FROM
(
    SELECT ingested_at, topic, partition, count() AS rows
    FROM weft_events
    WHERE $__timeFilter(ingested_at)
    GROUP BY ingested_at, topic, partition
)
GROUP BY time
ORDER BY time
""",
        ["time", "inserts", "p50_rows", "max_rows"],
        True,
    ),
    ch_panel(
        "Stored facts by kind",
        "Facts stored in the range, with id conflicts (same identity, other content).",
        "table",
        """
SELECT kind, count() AS facts, countIf(conflict = 1) AS conflicts, uniqExact(request_id) AS requests
FROM weft_events
WHERE $__timeFilter(ingested_at)
GROUP BY kind
ORDER BY facts DESC
""",
        ["kind", "facts", "conflicts", "requests"],
        True,
        viz="table",
    ),
    ch_panel(
        "Narrative projector lag per partition",
        "Highest offset stored in weft_events per source partition against the projector's "
        "progress (weft_projector_progress; with several narrative shards, the slowest "
        "shard's). A growing gap means narratives trail the facts.",
        "table",
        """
SELECT f.topic AS topic, f.partition AS partition, f.stored_offset AS stored_offset,
       p.projected_offset AS projected_offset,
       toInt64(f.stored_offset) - p.projected_offset AS projector_lag
FROM
(
    SELECT topic, partition, max(offset) AS stored_offset
    FROM weft_events
    GROUP BY topic, partition
) AS f
LEFT JOIN
(
    SELECT topic, partition, min(shard_offset) AS projected_offset
    FROM (
        SELECT topic, partition, shard, argMax(offset, version) AS shard_offset
        FROM weft_projector_progress
        GROUP BY topic, partition, shard
    )
    GROUP BY topic, partition
) AS p ON f.topic = p.topic AND f.partition = p.partition
ORDER BY projector_lag DESC, topic, partition
""",
        ["topic", "partition", "stored_offset", "projected_offset", "projector_lag"],
        True,
        viz="table",
    ),
    ch_panel(
        "Conflicts and stored facts over time",
        "Facts stored and id conflicts flagged per interval.",
        "timeseries",
        """
SELECT $__timeInterval(ingested_at) AS time, count() AS facts, countIf(conflict = 1) AS conflicts
FROM weft_events
WHERE $__timeFilter(ingested_at)
GROUP BY time
ORDER BY time
""",
        ["time", "facts", "conflicts"],
        True,
    ),
    ch_panel(
        "Consumer lag",
        "High watermark minus the next offset to store, summed per topic, as the ingest's lag "
        "monitor samples it every 5 s (table weft_ingest_lag, migration 0006).",
        "timeseries",
        """
SELECT time, topic, sum(lag) AS lag
FROM
(
    SELECT $__timeInterval(at) AS time, topic, partition, argMax(lag, at) AS lag
    FROM weft_ingest_lag
    WHERE $__timeFilter(at)
    GROUP BY time, topic, partition
)
GROUP BY time, topic
ORDER BY time, topic
""",
        ["time", "topic", "lag"],
        True,
    ),
    ch_panel(
        "Dead letters by reason",
        "Records the dead-letter topic acknowledged per interval, by weft-dlq-reason (table "
        "weft_dead_letters, quarantined records left out: see weft_quarantine; a record "
        "dead-lettered again after a crash counts once: grouped by topic, partition, offset).",
        "timeseries",
        """
SELECT $__timeInterval(first_at) AS time, reason, count() AS dead_letters
FROM
(
    SELECT topic, partition, offset, min(at) AS first_at, any(reason) AS reason
    FROM weft_dead_letters
    WHERE $__timeFilter(at) AND NOT startsWith(message, 'QUARANTINED')
    GROUP BY topic, partition, offset
)
GROUP BY time, reason
ORDER BY time, reason
""",
        ["time", "reason", "dead_letters"],
        True,
    ),
    ch_panel(
        "Latest dead letters",
        "The newest dead-lettered records with their reason and source position: look them up "
        "in the dead-letter topic by the weft-dlq-topic/partition/offset headers.",
        "table",
        """
SELECT min(at) AS dead_lettered_at, topic, partition, offset, any(reason) AS reason,
       any(tenant) AS tenant,
       any(message) AS message
FROM weft_dead_letters
WHERE $__timeFilter(at)
GROUP BY topic, partition, offset
ORDER BY dead_lettered_at DESC
LIMIT 100
""",
        ["dead_lettered_at", "topic", "partition", "offset", "reason", "tenant", "message"],
        True,
        viz="table",
    ),
    ch_panel(
        "Insert latency",
        "Latency of one facts insert (p50, p99, max) as the ingest measured it (table "
        "weft_ingest_batches; one row per partition per flush).",
        "timeseries",
        """
SELECT $__timeInterval(at) AS time,
       quantile(0.5)(insert_ms) AS p50_ms,
       quantile(0.99)(insert_ms) AS p99_ms,
       max(insert_ms) AS max_ms
FROM weft_ingest_batches
WHERE $__timeFilter(at) AND rows > 0
GROUP BY time
ORDER BY time
""",
        ["time", "p50_ms", "p99_ms", "max_ms"],
        True,
        unit="ms",
    ),
    ch_panel(
        "Ingest batches (rows, dead letters, bytes per flush)",
        "Per flush and source partition, as the ingest recorded it: facts inserted (after "
        "deduplication), records dead-lettered, payload bytes (table weft_ingest_batches).",
        "timeseries",
        """
SELECT $__timeInterval(at) AS time,
       count() AS flushes,
       quantile(0.99)(rows) AS p99_rows,
       sum(rows) AS stored_rows,
       sum(dead) AS dead_letters,
       sum(bytes) AS payload_bytes
FROM weft_ingest_batches
WHERE $__timeFilter(at)
GROUP BY time
ORDER BY time
""",
        ["time", "flushes", "p99_rows", "stored_rows", "dead_letters", "payload_bytes"],
        True,
    ),
    ch_panel(
        "Flushes per source partition",
        "Per source partition in the range: flushes, facts stored, records dead-lettered, and "
        "the last flush (table weft_ingest_batches). A partition missing here had no traffic.",
        "table",
        """
SELECT topic, partition, count() AS flushes, sum(rows) AS stored, sum(dead) AS dead_lettered,
       max(at) AS last_flush
FROM weft_ingest_batches
WHERE $__timeFilter(at)
GROUP BY topic, partition
ORDER BY topic, partition
""",
        ["topic", "partition", "flushes", "stored", "dead_lettered", "last_flush"],
        True,
        viz="table",
    ),
]

# ---------------------------------------------------------------- compliance
# The live members of the range, one row each: the range filters the rows before they are
# grouped (a member's time is the same in every version of its row: a move or a tombstone
# copies it), so the narrative panels read the range's keys, not the history's.
LIVE_MEMBERS = f"""
SELECT narrative_id, kind, any(ts) AS at
FROM weft_narratives
WHERE {TENANT} AND $__timeFilter(ts)
GROUP BY narrative_id, kind, id, content_hash
HAVING argMax(is_deleted, version) = 0
"""

# Every violation rule, over the facts of one tenant: subject events in the time range,
# lookups (does the referenced event exist? what did the token say?) over all time, where
# `weft audit check` looks only within --lookaround-secs (a day) of its range (but for
# tokens): an event referenced from further away is found here and missed there.
VIOLATIONS = """
SELECT 'I-01' AS rule, kind AS subject_kind, id AS subject_id, request_id, ts,
       'Frame carries raw tool output' AS detail
FROM weft_events
WHERE {T} AND kind = 'frame' AND $__timeFilter(ts)
  AND (JSONHas(payload, 'raw_output') OR JSONHas(payload, 'raw') OR JSONHas(payload, 'raw_result') OR JSONHas(payload, 'tool_output'))
UNION ALL
SELECT 'I-02', e.kind, e.id, e.request_id, e.ts,
       multiIf(e.decision_id = '', 'executed without a PolicyDecision',
               pd.decision = '', 'executed with an unknown PolicyDecision',
               pd.decision != 'allow' OR e.denied, 'executed after a deny',
               a.ats > e.ts, 'executed before its capability_authorized',
               'executed without capability_authorized')
FROM
(
    -- judged: ingested at least the grace period ago (its PolicyDecision, on another
    -- topic, or its capability_authorized may still be in flight until then).
    -- denied: a capability_denied TraceEvent names its decision, which makes it executed
    -- after a deny whatever the decision says (as the check's execution_after_deny).
    SELECT kind, id, request_id, ts, decision_id, {PAST_GRACE} AS judged,
           decision_id != '' AND decision_id IN (
               SELECT decision_id FROM weft_events
               WHERE {T} AND kind = 'trace_event' AND event_type = 'capability_denied') AS denied
    FROM weft_events
    WHERE {T} AND kind = 'trace_event' AND event_type = 'capability_executed' AND $__timeFilter(ts)
) AS e
LEFT JOIN
(
    -- A decision stored with several contents is a deny if any version is not an allow.
    SELECT id, if(countIf(decision != 'allow') > 0, minIf(decision, decision != 'allow'), 'allow') AS decision
    FROM weft_events
    WHERE {T} AND kind = 'policy_decision'
    GROUP BY id
) AS pd ON e.decision_id = pd.id
LEFT JOIN
(
    -- The earliest capability_authorized per decision: later than the execution's event
    -- time, the execution came first (as the check's authorized_after_execution). A missing
    -- one joins as the default time (or NULL), never later than the execution.
    SELECT decision_id, min(ts) AS ats
    FROM weft_events
    WHERE {T} AND kind = 'trace_event' AND event_type = 'capability_authorized'
    GROUP BY decision_id
) AS a ON e.decision_id = a.decision_id
WHERE e.decision_id = '' OR (pd.decision != '' AND (pd.decision != 'allow' OR e.denied))
   OR (e.judged AND (pd.decision = '' OR a.ats > e.ts
       OR e.decision_id NOT IN (
            SELECT decision_id FROM weft_events
            WHERE {T} AND kind = 'trace_event' AND event_type = 'capability_authorized')))
UNION ALL
SELECT 'I-02', kind, id, any(request_id), min(ts), 'PolicyDecision named by no TraceEvent'
FROM weft_events
-- judged: ingested at least the grace period ago (its trace events may still be in flight),
-- as the check's decision_untraced.
WHERE {T} AND kind = 'policy_decision' AND $__timeFilter(ts) AND {PAST_GRACE}
  AND id NOT IN (
        SELECT decision_id FROM weft_events
        WHERE {T} AND kind = 'trace_event' AND decision_id != '')
GROUP BY kind, id
UNION ALL
SELECT 'I-06', 'capability_token', u.token_id, any(u.request_id), min(u.ts),
       arrayStringConcat(arraySort(groupUniqArray(u.problem)), ', ')
FROM
(
    SELECT d.token_id AS token_id, d.request_id AS request_id, d.ts AS ts,
           arrayJoin(arrayFilter(x -> x != '', [
               if(t.expires_at IS NOT NULL AND d.ts > t.expires_at, 'used after expiry', ''),
               if(NOT has(t.scope, d.capability_id), 'capability outside the token scope', ''),
               if(t.single_use AND t.uses > 1, 'single-use token used more than once', '')])) AS problem
    FROM
    (
        SELECT token_id, request_id, ts, capability_id
        FROM weft_events
        WHERE {T} AND kind = 'policy_decision' AND decision = 'allow' AND token_id != '' AND $__timeFilter(ts)
    ) AS d
    INNER JOIN
    (
        SELECT tk.id AS token_id,
               parseDateTime64BestEffortOrNull(JSONExtractString(tk.payload, 'expires_at'), 6, 'UTC') AS expires_at,
               JSONExtract(tk.payload, 'scope', 'Array(String)') AS scope,
               JSONExtractBool(tk.payload, 'single_use') AS single_use,
               ifNull(n.uses, 0) AS uses
        FROM (SELECT id, any(payload) AS payload FROM weft_events WHERE {T} AND kind = 'capability_token' GROUP BY id) AS tk
        LEFT JOIN
        (
            SELECT token_id, uniqExact(id) AS uses
            FROM weft_events
            WHERE {T} AND kind = 'policy_decision' AND decision = 'allow' AND token_id != ''
            GROUP BY token_id
        ) AS n ON tk.id = n.token_id
    ) AS t ON d.token_id = t.token_id
)
AS u
GROUP BY u.token_id
UNION ALL
SELECT 'I-06', 'capability_token', token_id, any(request_id), min(ts), 'allowed with a token stored nowhere'
FROM weft_events
WHERE {T} AND kind = 'policy_decision' AND decision = 'allow' AND token_id != '' AND $__timeFilter(ts)
  AND {PAST_GRACE}
  AND token_id NOT IN (SELECT id FROM weft_events WHERE {T} AND kind = 'capability_token')
GROUP BY token_id
UNION ALL
SELECT 'orphan', kind, id, request_id, ts,
       concat('references ', arrayStringConcat(arrayFilter(x -> x != '', [
           if(decision_id != '' AND decision_id NOT IN (SELECT id FROM weft_events WHERE {T} AND kind IN ('policy_decision', 'execution_routing_decision')), concat('decision ', decision_id), ''),
           if(frame_id != '' AND frame_id NOT IN (SELECT id FROM weft_events WHERE {T} AND kind = 'frame'), concat('frame ', frame_id), ''),
           if(handle_id != '' AND handle_id NOT IN (SELECT id FROM weft_events WHERE {T} AND kind = 'handle'), concat('handle ', handle_id), '')]), ', '),
           ', never stored')
FROM weft_events
WHERE {T} AND kind = 'trace_event' AND $__timeFilter(ts) AND {PAST_GRACE}
  AND ((decision_id != '' AND decision_id NOT IN (SELECT id FROM weft_events WHERE {T} AND kind IN ('policy_decision', 'execution_routing_decision')))
    OR (frame_id != '' AND frame_id NOT IN (SELECT id FROM weft_events WHERE {T} AND kind = 'frame'))
    OR (handle_id != '' AND handle_id NOT IN (SELECT id FROM weft_events WHERE {T} AND kind = 'handle')))
UNION ALL
SELECT 'id_conflict', kind, id, any(request_id), min(ts), 'one identity stored with different contents'
FROM weft_events
WHERE {T} AND conflict = 1 AND $__timeFilter(ts)
  AND (kind, id) NOT IN (
    -- A RoutingDecision stored pending and again once selected is the decision completed
    -- (the same rule as audit/src/check.rs CONFLICT_SQL).
    SELECT kind, id FROM weft_events
    WHERE {T} AND kind = 'routing_decision'
      AND id IN (SELECT id FROM weft_events WHERE {T} AND kind = 'routing_decision' AND conflict = 1)
    GROUP BY kind, id
    HAVING uniqExact(content_hash) = 2
       AND uniqExactIf(content_hash, JSONExtractRaw(payload, 'selected_item_id') IN ('', 'null')) = 1
       AND uniqExact(arraySort(arrayFilter(kv -> kv.1 NOT IN ('selected_item_id', 'selected_card_id'),
                                           JSONExtractKeysAndValuesRaw(payload)))) = 1)
GROUP BY kind, id
""".replace("{T}", TENANT).replace("{PAST_GRACE}", PAST_GRACE)

COMPLIANCE = [
    ch_panel(
        "Authorizations and denials",
        "PolicyDecisions per interval: allow vs deny (each decision once, as first stored).",
        "timeseries",
        f"""
SELECT $__timeInterval(ts) AS time, countIf(decision = 'allow') AS allowed, countIf(decision = 'deny') AS denied
FROM weft_events
WHERE {TENANT} AND kind = 'policy_decision' AND conflict = 0 AND $__timeFilter(ts)
GROUP BY time
ORDER BY time
""",
        ["time", "allowed", "denied"],
        True,
    ),
    ch_panel(
        "Denials over time by principal",
        "Denied PolicyDecisions per interval and principal.",
        "timeseries",
        f"""
SELECT $__timeInterval(ts) AS time, principal, count() AS denied
FROM weft_events
WHERE {TENANT} AND kind = 'policy_decision' AND conflict = 0 AND decision = 'deny' AND $__timeFilter(ts)
GROUP BY time, principal
ORDER BY time, principal
""",
        ["time", "principal", "denied"],
        True,
    ),
    ch_panel(
        "Decisions by principal",
        "Allowed and denied PolicyDecisions per principal in the range.",
        "table",
        f"""
SELECT principal, countIf(decision = 'allow') AS allowed, countIf(decision = 'deny') AS denied,
       round(denied / count(), 4) AS deny_share
FROM weft_events
WHERE {TENANT} AND kind = 'policy_decision' AND conflict = 0 AND $__timeFilter(ts)
GROUP BY principal
ORDER BY denied DESC, allowed DESC
LIMIT 100
""",
        ["principal", "allowed", "denied", "deny_share"],
        True,
        viz="table",
    ),
    ch_panel(
        "Decisions by capability",
        "Allowed and denied PolicyDecisions per capability in the range.",
        "table",
        f"""
SELECT capability_id, countIf(decision = 'allow') AS allowed, countIf(decision = 'deny') AS denied,
       round(denied / count(), 4) AS deny_share
FROM weft_events
WHERE {TENANT} AND kind = 'policy_decision' AND conflict = 0 AND $__timeFilter(ts)
GROUP BY capability_id
ORDER BY denied DESC, allowed DESC
LIMIT 100
""",
        ["capability_id", "allowed", "denied", "deny_share"],
        True,
        viz="table",
    ),
    ch_panel(
        "Invariant violations by rule",
        "I-01 raw output on a Frame; I-02 execution without allow + capability_authorized or before it, "
        "or a PolicyDecision no TraceEvent names; "
        "I-06 token expired, out of scope, single-use reused or stored nowhere; orphan references; id conflicts.",
        "table",
        f"SELECT rule, count() AS violations FROM\n(\n{VIOLATIONS.strip()}\n)\nGROUP BY rule\nORDER BY rule",
        ["rule", "violations"],
        True,
        viz="barchart",
    ),
    ch_panel(
        "Invariant violations over time",
        "Violations per interval and rule (by the subject event's time).",
        "timeseries",
        f"SELECT $__timeInterval(ts) AS time, rule, count() AS violations FROM\n(\n{VIOLATIONS.strip()}\n)\nGROUP BY time, rule\nORDER BY time, rule",
        ["time", "rule", "violations"],
        True,
    ),
    ch_panel(
        "Invariant violations",
        "One row per finding: the subject is the Frame (I-01), the execution (I-02, orphan), "
        "the PolicyDecision no TraceEvent names (I-02), the token (I-06) or the conflicting "
        "identity.",
        "table",
        f"SELECT rule, subject_kind, subject_id, request_id, ts, detail FROM\n(\n{VIOLATIONS.strip()}\n)\nORDER BY ts DESC, rule, subject_id\nLIMIT 1000",
        ["rule", "subject_kind", "subject_id", "request_id", "ts", "detail"],
        True,
        viz="table",
        w=24,
    ),
    ch_panel(
        "Capability token usage",
        "Tokens issued, and PolicyDecisions that used a token (allowed or denied), per interval.",
        "timeseries",
        f"""
SELECT $__timeInterval(ts) AS time,
       countIf(kind = 'capability_token') AS tokens_issued,
       countIf(kind = 'policy_decision' AND token_id != '' AND decision = 'allow') AS allowed_uses,
       countIf(kind = 'policy_decision' AND token_id != '' AND decision = 'deny') AS denied_uses
FROM weft_events
WHERE {TENANT} AND kind IN ('capability_token', 'policy_decision') AND conflict = 0 AND $__timeFilter(ts)
GROUP BY time
ORDER BY time
""",
        ["time", "tokens_issued", "allowed_uses", "denied_uses"],
        True,
    ),
    ch_panel(
        "Tokens",
        "Tokens issued in the range with their uses (PolicyDecisions naming them).",
        "table",
        f"""
SELECT t.token_id AS token_id, t.principal AS principal, t.issued_at AS issued_at, t.expires_at AS expires_at,
       t.single_use AS single_use, t.scope AS scope, ifNull(u.uses, 0) AS uses, u.last_use AS last_use
FROM
(
    SELECT id AS token_id, any(principal) AS principal, min(ts) AS issued_at,
           any(JSONExtractString(payload, 'expires_at')) AS expires_at,
           any(JSONExtractBool(payload, 'single_use')) AS single_use,
           any(arrayStringConcat(JSONExtract(payload, 'scope', 'Array(String)'), ' ')) AS scope
    FROM weft_events
    WHERE {TENANT} AND kind = 'capability_token' AND $__timeFilter(ts)
    GROUP BY id
) AS t
LEFT JOIN
(
    SELECT token_id, uniqExact(id) AS uses, max(ts) AS last_use
    FROM weft_events
    WHERE {TENANT} AND kind = 'policy_decision' AND token_id != ''
    GROUP BY token_id
) AS u ON t.token_id = u.token_id
ORDER BY issued_at DESC
LIMIT 500
""",
        ["token_id", "principal", "issued_at", "expires_at", "single_use", "scope", "uses", "last_use"],
        True,
        viz="table",
    ),
    ch_panel(
        "Failed narratives",
        "Narratives with a flow_failed TraceEvent, with the failing event's error message.",
        "table",
        f"""
SELECT n.narrative_id AS narrative_id, f.ts AS failed_at, f.principal AS principal, f.id AS event_id, f.error AS error
FROM
(
    SELECT id, ts, principal, JSONExtractString(payload, 'error_message') AS error
    FROM weft_events
    WHERE {TENANT} AND kind = 'trace_event' AND event_type = 'flow_failed' AND $__timeFilter(ts)
) AS f
INNER JOIN
(
    -- The failing events' node rows only (the table is ordered by id), not every trace event's.
    SELECT id, argMax(narrative_id, version) AS narrative_id
    FROM weft_narrative_nodes
    WHERE {TENANT} AND kind = 'trace_event' AND id IN
    (
        SELECT id FROM weft_events
        WHERE {TENANT} AND kind = 'trace_event' AND event_type = 'flow_failed' AND $__timeFilter(ts)
    )
    GROUP BY id
) AS n ON f.id = n.id
ORDER BY failed_at DESC
LIMIT 500
""",
        ["narrative_id", "failed_at", "principal", "event_id", "error"],
        True,
        viz="table",
    ),
    ch_panel(
        "Narratives",
        "Narratives with members in the range: span, size, principals, and whether they failed.",
        "table",
        f"""
WITH
(
    -- The 500 narratives of the range, newest first, from their members' keys (no payload).
    SELECT groupArray((narrative_id, started, ended, events, kinds)) FROM
    (
        SELECT narrative_id, min(at) AS started, max(at) AS ended, count() AS events,
               uniqExact(kind) AS kinds
        FROM
        (
{indent(LIVE_MEMBERS.strip(), 12)}
        )
        GROUP BY narrative_id
        ORDER BY started DESC
        LIMIT 500
    )
) AS top
SELECT t.1 AS narrative_id, t.2 AS started, t.3 AS ended, t.4 AS events, t.5 AS kinds,
       p.principals AS principals, p.failed AS failed
FROM (SELECT arrayJoin(top) AS t) AS s
LEFT JOIN
(
    -- The payloads of those 500 only, by narrative id (the table's order).
    SELECT narrative_id,
           arrayStringConcat(arraySort(groupUniqArrayIf(JSONExtractString(payload, 'principal'), JSONHas(payload, 'principal'))), ' ') AS principals,
           countIf(kind = 'trace_event' AND JSONExtractString(payload, 'event_type') = 'flow_failed') > 0 AS failed
    FROM
    (
        SELECT narrative_id, kind, argMax(payload, version) AS payload
        FROM weft_narratives
        WHERE {TENANT} AND narrative_id IN (SELECT arrayJoin(top).1) AND $__timeFilter(ts)
        GROUP BY narrative_id, kind, id, content_hash
        HAVING argMax(is_deleted, version) = 0
    )
    GROUP BY narrative_id
) AS p ON p.narrative_id = t.1
ORDER BY started DESC
""",
        ["narrative_id", "started", "ended", "events", "kinds", "principals", "failed"],
        True,
        viz="table",
        w=24,
    ),
    ch_panel(
        "Narrative trace: decision -> frame -> handle",
        "The narrative picked above as a trace: each PolicyDecision under the narrative, each "
        "TraceEvent under its decision, each Frame under the execution that produced it, each "
        "Handle under the Frame that refers to it. Durations: capability_executed's duration_ms.",
        "traces",
        f"""
WITH members AS
(
    SELECT kind, id, request_id, producer_id, ts, event_type, principal, capability_id,
           decision, outcome, decision_id, frame_id, handle_id, handle_refs, token_id, payload
    FROM weft_events
    WHERE {TENANT} AND (kind, toStartOfHour(ts), id) IN
    (
        SELECT kind, toStartOfHour(any(ts)), id FROM weft_narratives
        WHERE {TENANT} AND narrative_id = ${{narrative:sqlstring}}
        GROUP BY kind, id, content_hash
        HAVING argMax(is_deleted, version) = 0
    )
    ORDER BY conflict
    LIMIT 1 BY kind, id
)
SELECT ${{narrative:sqlstring}} AS traceID,
       ${{narrative:sqlstring}} AS spanID,
       '' AS parentSpanID,
       'narrative' AS operationName,
       'weft' AS serviceName,
       toFloat64(min(toUnixTimestamp64Milli(ts))) AS startTime,
       toFloat64(max(toUnixTimestamp64Milli(ts)) - min(toUnixTimestamp64Milli(ts))) AS duration,
       [map('key', 'events', 'value', toString(count()))] AS tags
FROM members
UNION ALL
SELECT ${{narrative:sqlstring}} AS traceID,
       concat(m.kind, ':', m.id) AS spanID,
       multiIf(
           m.kind = 'frame' AND fp.exec_id != '', concat('trace_event:', fp.exec_id),
           m.kind = 'handle' AND hp.frame_id != '', concat('frame:', hp.frame_id),
           m.kind = 'trace_event' AND m.decision_id != '' AND m.decision_id IN (SELECT id FROM members WHERE kind = 'policy_decision'),
               concat('policy_decision:', m.decision_id),
           ${{narrative:sqlstring}}) AS parentSpanID,
       if(m.kind = 'trace_event', concat(m.event_type, if(m.capability_id != '', concat(' ', m.capability_id), '')),
          concat(m.kind, if(m.capability_id != '', concat(' ', m.capability_id), ''))) AS operationName,
       if(m.producer_id != '', m.producer_id, 'unknown') AS serviceName,
       toFloat64(toUnixTimestamp64Milli(m.ts)) - JSONExtractFloat(m.payload, 'metadata', 'duration_ms') AS startTime,
       JSONExtractFloat(m.payload, 'metadata', 'duration_ms') AS duration,
       arrayMap(kv -> map('key', kv.1, 'value', kv.2), arrayFilter(kv -> kv.2 != '', [
           ('kind', m.kind), ('id', m.id), ('request_id', m.request_id), ('principal', m.principal),
           ('capability_id', m.capability_id), ('decision', m.decision), ('outcome', m.outcome),
           ('token_id', m.token_id), ('decision_id', m.decision_id), ('frame_id', m.frame_id),
           ('handle_id', m.handle_id)])) AS tags
FROM members AS m
LEFT JOIN
(
    SELECT frame_id, any(id) AS exec_id FROM members
    WHERE kind = 'trace_event' AND event_type = 'capability_executed' AND frame_id != ''
    GROUP BY frame_id
) AS fp ON m.id = fp.frame_id
LEFT JOIN
(
    SELECT arrayJoin(handle_refs) AS handle_id, any(id) AS frame_id FROM members
    WHERE kind = 'frame'
    GROUP BY handle_id
) AS hp ON m.id = hp.handle_id
ORDER BY startTime
""",
        ["traceID", "spanID", "parentSpanID", "operationName", "serviceName", "startTime", "duration", "tags"],
        True,
        w=24,
        h=12,
    ),
]

NARRATIVE_VAR = query_var(
    "narrative",
    "Narrative",
    f"""
SELECT narrative_id
FROM
(
{indent(LIVE_MEMBERS.strip(), 4)}
)
GROUP BY narrative_id
ORDER BY max(at) DESC
LIMIT 200
""",
)

# ---------------------------------------------------------------- router
ROUTER = [
    ch_panel(
        "Decisions per candidate",
        "ExecutionRoutingDecisions per interval, by chosen candidate.",
        "timeseries",
        f"""
SELECT $__timeInterval(ts) AS time, candidate_id, count() AS decisions
FROM weft_events
WHERE {TENANT} AND kind = 'execution_routing_decision' AND $__timeFilter(ts)
GROUP BY time, candidate_id
ORDER BY time, candidate_id
""",
        ["time", "candidate_id", "decisions"],
        True,
    ),
    ch_panel(
        "Success rate per candidate",
        "successes / outcomes from the feedback aggregates (weft_router_stats, migration 0003).",
        "timeseries",
        f"""
SELECT $__timeInterval(bucket) AS time, candidate_id, sum(successes) / sum(n) AS success_rate
FROM weft_router_stats
WHERE {TENANT} AND $__timeFilter(bucket)
GROUP BY time, candidate_id
ORDER BY time, candidate_id
""",
        ["time", "candidate_id", "success_rate"],
        True,
        unit="percentunit",
    ),
    ch_panel(
        "Latency per candidate (p90)",
        "p90 of the feedback's latency_ms, merged from the aggregates' quantile states.",
        "timeseries",
        f"""
SELECT $__timeInterval(bucket) AS time, candidate_id,
       quantilesMerge(0.5, 0.9, 0.99)(latency_q)[2] AS latency_p90_ms
FROM weft_router_stats
WHERE {TENANT} AND $__timeFilter(bucket) AND latency_n > 0
GROUP BY time, candidate_id
ORDER BY time, candidate_id
""",
        ["time", "candidate_id", "latency_p90_ms"],
        True,
        unit="ms",
    ),
    ch_panel(
        "Cost per candidate (mean per outcome)",
        "cost.usd (else cost.amount) per outcome, from the aggregates.",
        "timeseries",
        f"""
SELECT $__timeInterval(bucket) AS time, candidate_id, sum(cost_sum) / sum(n) AS mean_cost
FROM weft_router_stats
WHERE {TENANT} AND $__timeFilter(bucket)
GROUP BY time, candidate_id
ORDER BY time, candidate_id
""",
        ["time", "candidate_id", "mean_cost"],
        True,
    ),
    ch_panel(
        "Exploration rate",
        "Share of the router's decisions with reason code `explore`, per policy "
        "(decisions not made by `weft router` carry no x_weft_policy and are left out).",
        "timeseries",
        f"""
SELECT $__timeInterval(ts) AS time,
       JSONExtractString(payload, 'metadata', 'x_weft_policy') AS policy,
       countIf(has(JSONExtract(payload, 'reason_codes', 'Array(String)'), 'explore')) / count() AS exploration_rate
FROM weft_events
WHERE {TENANT} AND kind = 'execution_routing_decision' AND $__timeFilter(ts)
  AND JSONHas(payload, 'metadata', 'x_weft_policy')
GROUP BY time, policy
ORDER BY time, policy
""",
        ["time", "policy", "exploration_rate"],
        True,
        unit="percentunit",
    ),
    ch_panel(
        "Candidates in the range",
        "Per candidate: outcomes, success rate, latency, cost and quality from the aggregates.",
        "table",
        f"""
SELECT candidate_id,
       sum(n) AS outcomes,
       round(sum(successes) / sum(n), 4) AS success_rate,
       round(if(sum(latency_n) > 0, sum(latency_sum) / sum(latency_n), nan), 1) AS mean_latency_ms,
       round(sum(cost_sum) / sum(n), 6) AS mean_cost,
       round(if(sum(quality_n) > 0, sum(quality_sum) / sum(quality_n), nan), 4) AS mean_quality
FROM weft_router_stats
WHERE {TENANT} AND $__timeFilter(bucket)
GROUP BY candidate_id
ORDER BY outcomes DESC
""",
        ["candidate_id", "outcomes", "success_rate", "mean_latency_ms", "mean_cost", "mean_quality"],
        True,
        viz="table",
    ),
    ch_panel(
        "Latest `weft eval` estimates",
        "The newest stored EvaluationArtifact per target policy (`weft eval --store`, table "
        "weft_eval_results, migration 0005): IPS, SNIPS, DR with the DR 95% interval.",
        "table",
        f"""
SELECT candidate_policy, evaluated_at, range_from, range_to,
       JSONExtractUInt(a, 'metrics', 'n') AS n,
       JSONExtractFloat(a, 'metrics', 'ips') AS ips,
       JSONExtractFloat(a, 'metrics', 'snips') AS snips,
       JSONExtractFloat(a, 'metrics', 'dr') AS dr,
       JSONExtract(a, 'uncertainty', 'dr_ci', 'Array(Float64)')[1] AS dr_ci_low,
       JSONExtract(a, 'uncertainty', 'dr_ci', 'Array(Float64)')[2] AS dr_ci_high,
       JSONExtractFloat(a, 'metrics', 'logged_value') AS logged_value,
       JSONExtractString(a, 'support_state') AS support_state,
       JSONExtractString(a, 'recommendation_kind') AS recommendation
FROM
(
    SELECT candidate_policy, max(created_at) AS evaluated_at,
           argMax(range_from, created_at) AS range_from, argMax(range_to, created_at) AS range_to,
           argMax(artifact, created_at) AS a
    FROM weft_eval_results
    WHERE {TENANT}
    GROUP BY candidate_policy
)
ORDER BY evaluated_at DESC
""",
        ["candidate_policy", "evaluated_at", "range_from", "range_to", "n", "ips", "snips", "dr",
         "dr_ci_low", "dr_ci_high", "logged_value", "support_state", "recommendation"],
        True,
        viz="table",
        w=24,
    ),
]


def main():
    ch_var = ds_var("datasource", "ClickHouse", "grafana-clickhouse-datasource")
    boards = {
        "pipeline-operations": dashboard(
            "weft-pipeline-ops", "weft / Pipeline operations",
            "Ingest rate, freshness, batch sizes, projector lag, consumer lag, dead letters and "
            "insert latency, all from ClickHouse (the ingest writes its own telemetry tables).",
            [ch_var], OPS, ["operations"]),
        "compliance": dashboard(
            "weft-compliance", "weft / Compliance",
            "Authorizations and denials, invariant violations, token usage, failed narratives, "
            "narratives and a narrative trace.",
            [ch_var, TENANT_VAR, GRACE_VAR, NARRATIVE_VAR], COMPLIANCE, ["compliance", "audit"]),
        "router": dashboard(
            "weft-router", "weft / Router",
            "Decisions, success, latency, cost per candidate, exploration, latest offline estimates.",
            [ch_var, TENANT_VAR], ROUTER, ["router"]),
    }
    expected = {}
    files = {}
    for name, (board, expect) in boards.items():
        files[f"{name}.json"] = json.dumps(board, indent=2) + "\n"
        expected[board["uid"]] = {"file": f"{name}.json", "panels": expect}
    # JSON is valid YAML; a .yaml name keeps Grafana's file provider from loading it.
    files["expected.yaml"] = (
        "# Generated by dashboards/build.py: per dashboard uid and panel id, the columns\n"
        "# each panel's query must return, and whether simulated data must give rows.\n"
        + json.dumps(expected, indent=2) + "\n"
    )
    stale = []
    for name, text in files.items():
        path = os.path.join(HERE, name)
        if "--check" in sys.argv[1:]:
            with open(path) as f:
                if f.read() != text:
                    stale.append(name)
        else:
            with open(path, "w") as f:
                f.write(text)
    if stale:
        sys.exit(f"dashboards/build.py: {', '.join(stale)} differ from the generator: "
                 "edit build.py and run it, never the JSON")


if __name__ == "__main__":
    main()
