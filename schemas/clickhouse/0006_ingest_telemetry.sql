-- Ingest telemetry: `weft ingest` writes its own operational figures here, so the
-- pipeline-operations dashboard reads everything from ClickHouse (no Prometheus needed).
--
-- * Operational data, not audit facts: a 30-day TTL keeps these tables small.
-- * Best effort: ingest writes them after the step they describe succeeded, never retries,
--   and keeps ingesting when they are missing (an older schema only logs a warning).
-- * Additive: nothing in the audit path reads them.

-- One row per source partition per flush, written after the facts insert succeeded.
CREATE TABLE IF NOT EXISTS weft_ingest_batches
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
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(at)
ORDER BY (topic, partition, at)
TTL toDateTime(at) + INTERVAL 30 DAY;

-- One row per dead-lettered record, written once the dead-letter topic acknowledged it.
-- A replay after a crash writes the same (topic, partition, offset) again; it collapses.
CREATE TABLE IF NOT EXISTS weft_dead_letters
(
    at          DateTime64(6, 'UTC'),
    topic       LowCardinality(String),
    partition   Int32,
    offset      Int64,
    reason      LowCardinality(String),
    message     String,
    tenant      LowCardinality(String)
)
ENGINE = ReplacingMergeTree(at)
PARTITION BY toYYYYMM(at)
ORDER BY (topic, partition, offset)
TTL toDateTime(at) + INTERVAL 30 DAY;

-- Consumer lag per source partition, sampled by the ingest's lag monitor (every 5 s).
CREATE TABLE IF NOT EXISTS weft_ingest_lag
(
    at              DateTime64(6, 'UTC'),
    topic           LowCardinality(String),
    partition       Int32,
    next_offset     Int64,
    high_watermark  Int64,
    lag             Int64
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(at)
ORDER BY (topic, partition, at)
TTL toDateTime(at) + INTERVAL 30 DAY;
