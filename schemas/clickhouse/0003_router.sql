-- Router aggregates: ExecutionFeedback folded per tenant x context x candidate x minute.
--
-- * The context key is the one the router decided in: `metadata.x_weft_context` of the
--   feedback (the router stamps it, from the decision it answers, when feedback comes
--   through POST /v1/feedback), else the empty string (no context).
-- * Cost is `cost.usd` when present, else `cost.amount`, else 0; quality is `quality_score`
--   (counted only when present); latency is `latency_ms` (quantiles only when present).
-- * One row per minute bucket; readers apply the window and an exponential decay with
--   sum(...) GROUP BY and `quantilesMerge` (see router/src/store.rs). No read needs FINAL.
CREATE TABLE IF NOT EXISTS weft_router_stats
(
    tenant        LowCardinality(String),
    context_key   String,
    candidate_id  LowCardinality(String),
    bucket        DateTime('UTC'),
    n             SimpleAggregateFunction(sum, UInt64),
    successes     SimpleAggregateFunction(sum, UInt64),
    latency_n     SimpleAggregateFunction(sum, UInt64),
    latency_sum   SimpleAggregateFunction(sum, Float64),
    latency_q     AggregateFunction(quantiles(0.5, 0.9, 0.99), UInt64),
    cost_sum      SimpleAggregateFunction(sum, Float64),
    quality_n     SimpleAggregateFunction(sum, UInt64),
    quality_sum   SimpleAggregateFunction(sum, Float64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(bucket)
ORDER BY (tenant, context_key, candidate_id, bucket);

CREATE MATERIALIZED VIEW IF NOT EXISTS weft_router_stats_mv TO weft_router_stats AS
SELECT
    tenant,
    JSONExtractString(payload, 'metadata', 'x_weft_context') AS context_key,
    candidate_id,
    toStartOfMinute(ts) AS bucket,
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
GROUP BY tenant, context_key, candidate_id, bucket;
