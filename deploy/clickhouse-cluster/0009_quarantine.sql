-- Cluster variant of schemas/clickhouse/0009_quarantine.sql, sharded by source partition
-- (cityHash64(topic, partition)) like weft_dead_letters: one partition's rows live on one
-- shard, so a replayed record collapses with its first copy.

CREATE TABLE IF NOT EXISTS weft_quarantine_local ON CLUSTER '{cluster}'
(
    at              DateTime64(6, 'UTC'),
    tenant          LowCardinality(String),
    topic           LowCardinality(String),
    partition       Int32,
    offset          Int64,
    reason          LowCardinality(String),
    message         String,
    refused         String,
    original_bytes  UInt64,
    sha256          String,
    truncated       Bool,
    key             String,
    headers         Array(Tuple(String, String)),
    value           String CODEC(ZSTD(3))
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/weft_quarantine_local', '{replica}', at)
PARTITION BY toYYYYMM(at)
ORDER BY (topic, partition, offset);

CREATE TABLE IF NOT EXISTS weft_quarantine ON CLUSTER '{cluster}'
AS weft_quarantine_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_quarantine_local, cityHash64(topic, partition));
