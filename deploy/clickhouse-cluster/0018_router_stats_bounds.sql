-- Cluster variant of schemas/clickhouse/0018_router_stats_bounds.sql: the view on every
-- shard counts feedback no later than its ingest time and leaves out feedback stored more
-- than 400 days after it happened, so one insert writes at most 15 monthly partitions.
ALTER TABLE weft_router_stats_mv ON CLUSTER '{cluster}' MODIFY QUERY
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
FROM weft_events_local
WHERE kind = 'execution_feedback' AND conflict = 0
  AND ts >= ingested_at - toIntervalDay(400)
GROUP BY tenant, context_key, candidate_id, bucket;
