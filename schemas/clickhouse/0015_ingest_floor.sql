-- Ingest resumes each source partition after the highest offset weft_events holds for it.
-- Retention deletes by event time, which the producer sets, so it can delete a partition's
-- newest rows, or all of them; ingest would then read those records again from Kafka and
-- store what retention removed. Retention records each partition's highest stored offset
-- here before it deletes, and ingest resumes after the greater of the two.
CREATE TABLE IF NOT EXISTS weft_ingest_floor
(
    topic       LowCardinality(String),
    partition   UInt32,
    offset      UInt64,
    at          DateTime64(6, 'UTC') DEFAULT now64(6)
)
ENGINE = ReplacingMergeTree(offset)
ORDER BY (topic, partition);
