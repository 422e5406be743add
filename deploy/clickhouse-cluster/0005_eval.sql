-- Cluster variant of schemas/clickhouse/0005_eval.sql, sharded by tenant.

CREATE TABLE IF NOT EXISTS weft_eval_results_local ON CLUSTER '{cluster}'
(
    tenant            LowCardinality(String),
    candidate_policy  LowCardinality(String),
    created_at        DateTime64(6, 'UTC'),
    artifact_id       String,
    range_from        DateTime64(6, 'UTC'),
    range_to          DateTime64(6, 'UTC'),
    artifact          String CODEC(ZSTD(3))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/weft_eval_results_local', '{replica}')
PARTITION BY toYYYYMM(created_at)
ORDER BY (tenant, candidate_policy, created_at, artifact_id);

CREATE TABLE IF NOT EXISTS weft_eval_results ON CLUSTER '{cluster}'
AS weft_eval_results_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_eval_results_local, cityHash64(tenant));
