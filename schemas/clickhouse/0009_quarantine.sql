-- Records ingest could not store and whose dead letter the dead-letter topic refused in every
-- form (whole, bounded, minimal). Ingest writes the row in the flush, before the partition's
-- offsets move on, retrying while ClickHouse is unreachable: this table, not the best-effort
-- weft_dead_letters telemetry, is where such a record is kept. The value is cut to ingest's
-- max_message_bytes (truncated = 1 then); original_bytes and sha256 describe the whole
-- original. Keyed by source position, so a replayed record collapses with its first copy.
-- No TTL: it is the only copy; delete rows once handled.
CREATE TABLE IF NOT EXISTS weft_quarantine
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
ENGINE = ReplacingMergeTree(at)
PARTITION BY toYYYYMM(at)
ORDER BY (topic, partition, offset);
