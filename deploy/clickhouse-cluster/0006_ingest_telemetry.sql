-- Cluster variant of schemas/clickhouse/0006_ingest_telemetry.sql, sharded by source
-- partition (cityHash64(topic, partition)) like weft_events: one partition's rows live on
-- one shard, so a replayed dead letter collapses with its first copy.

CREATE TABLE IF NOT EXISTS weft_ingest_batches_local ON CLUSTER '{cluster}'
(
    at          DateTime64(6, 'UTC'),
    topic       LowCardinality(String),
    partition   Int32,
    rows        UInt32,
    dead        UInt32,
    bytes       UInt64,
    insert_ms   Float64,
    role        LowCardinality(String)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/weft_ingest_batches_local', '{replica}')
PARTITION BY toYYYYMMDD(at)
ORDER BY (topic, partition, at)
TTL toDateTime(at) + INTERVAL 30 DAY;

CREATE TABLE IF NOT EXISTS weft_ingest_batches ON CLUSTER '{cluster}'
AS weft_ingest_batches_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_ingest_batches_local, cityHash64(topic, partition));

CREATE TABLE IF NOT EXISTS weft_dead_letters_local ON CLUSTER '{cluster}'
(
    at          DateTime64(6, 'UTC'),
    topic       LowCardinality(String),
    partition   Int32,
    offset      Int64,
    reason      LowCardinality(String),
    message     String,
    tenant      LowCardinality(String)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/weft_dead_letters_local', '{replica}', at)
PARTITION BY toYYYYMM(at)
ORDER BY (topic, partition, offset)
TTL toDateTime(at) + INTERVAL 30 DAY;

CREATE TABLE IF NOT EXISTS weft_dead_letters ON CLUSTER '{cluster}'
AS weft_dead_letters_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_dead_letters_local, cityHash64(topic, partition));

CREATE TABLE IF NOT EXISTS weft_ingest_lag_local ON CLUSTER '{cluster}'
(
    at              DateTime64(6, 'UTC'),
    topic           LowCardinality(String),
    partition       Int32,
    next_offset     Int64,
    high_watermark  Int64,
    lag             Int64
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/weft_ingest_lag_local', '{replica}')
PARTITION BY toYYYYMMDD(at)
ORDER BY (topic, partition, at)
TTL toDateTime(at) + INTERVAL 30 DAY;

CREATE TABLE IF NOT EXISTS weft_ingest_lag ON CLUSTER '{cluster}'
AS weft_ingest_lag_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_ingest_lag_local, cityHash64(topic, partition));
