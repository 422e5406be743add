-- Cluster variant of schemas/clickhouse/0015_ingest_floor.sql: retention's record of each
-- source partition's highest stored offset, sharded like weft_projector_progress.
CREATE TABLE IF NOT EXISTS weft_ingest_floor_local ON CLUSTER '{cluster}'
(
    topic       LowCardinality(String),
    partition   UInt32,
    offset      UInt64,
    at          DateTime64(6, 'UTC') DEFAULT now64(6)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/weft_ingest_floor_local', '{replica}', offset)
ORDER BY (topic, partition);

CREATE TABLE IF NOT EXISTS weft_ingest_floor ON CLUSTER '{cluster}'
AS weft_ingest_floor_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_ingest_floor_local, cityHash64(topic, partition));
