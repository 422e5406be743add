-- Cluster variant of schemas/clickhouse/0003_router.sql. The view runs on every shard over
-- the facts that shard stores and writes that shard's aggregates; readers sum over the
-- Distributed table (every read of weft_router_stats is sum(...) GROUP BY or
-- quantilesMerge, so partial aggregates per shard add up exactly).

CREATE TABLE IF NOT EXISTS weft_router_stats_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/weft_router_stats_local', '{replica}')
PARTITION BY toYYYYMM(bucket)
ORDER BY (tenant, context_key, candidate_id, bucket);

CREATE TABLE IF NOT EXISTS weft_router_stats ON CLUSTER '{cluster}'
AS weft_router_stats_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_router_stats_local, rand());

CREATE MATERIALIZED VIEW IF NOT EXISTS weft_router_stats_mv ON CLUSTER '{cluster}' TO weft_router_stats_local AS
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
FROM weft_events_local
WHERE kind = 'execution_feedback' AND conflict = 0
GROUP BY tenant, context_key, candidate_id, bucket;
