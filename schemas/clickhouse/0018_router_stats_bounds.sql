-- weft_router_stats is partitioned by the month of its minute bucket, and the bucket came
-- from the feedback's own timestamp, which its producer sets. One insert into weft_events
-- whose feedback was dated in more than 100 months made the view write more than 100
-- partitions, ClickHouse refused the view's block (TOO_MANY_PARTS, 252) after the facts had
-- landed, and every tenant's feedback of that batch was missing from the aggregates. A
-- feedback dated in the future also weighed more than 1 in the decayed read.
-- Now the view counts feedback at its own time, but never later than its ingest time, and
-- leaves out feedback stored more than 400 days after it happened: one insert writes at
-- most 15 monthly partitions. The fact itself is stored as before.
ALTER TABLE weft_router_stats_mv MODIFY QUERY
SELECT
    tenant,
    JSONExtractString(payload, 'metadata', 'x_weft_context') AS context_key,
    candidate_id,
    toStartOfMinute(least(ts, ingested_at)) AS bucket,
    toUInt64(count()) AS n,
    toUInt64(countIf(JSONExtractBool(payload, 'success'))) AS successes,
    toUInt64(countIf(JSONHas(payload, 'latency_ms') AND JSONType(payload, 'latency_ms') != 'Null')) AS latency_n,
    sum(JSONExtractFloat(payload, 'latency_ms')) AS latency_sum,
    quantilesStateIf(0.5, 0.9, 0.99)(JSONExtractUInt(payload, 'latency_ms'), JSONHas(payload, 'latency_ms') AND JSONType(payload, 'latency_ms') != 'Null') AS latency_q,
    sum(if(JSONHas(payload, 'cost', 'usd'), JSONExtractFloat(payload, 'cost', 'usd'), JSONExtractFloat(payload, 'cost', 'amount'))) AS cost_sum,
    toUInt64(countIf(JSONHas(payload, 'quality_score') AND JSONType(payload, 'quality_score') != 'Null')) AS quality_n,
    sum(JSONExtractFloat(payload, 'quality_score')) AS quality_sum
FROM weft_events
WHERE kind = 'execution_feedback' AND conflict = 0
  AND ts >= ingested_at - toIntervalDay(400)
GROUP BY tenant, context_key, candidate_id, bucket;
