-- Cluster variant of schemas/clickhouse/0001_events.sql: the same columns, indexes,
-- projections, sort key and partitioning, replicated per shard.
--
-- Sharding: by source partition (cityHash64(topic, partition)). One Kafka partition's rows
-- always land on one shard. A facts insert carries a batch of every partition; the
-- Distributed table splits it by shard, and each partition's rows land as one part on one
-- shard: all of them or none, per partition, which is what the resume point needs
-- (max(offset) per partition lives on a single shard; a retry sends only the partitions
-- that did not land). Copies of one event share a Kafka key, hence a partition, hence
-- a shard: the dedup window stays correct.
CREATE TABLE IF NOT EXISTS weft_events_local ON CLUSTER '{cluster}'
(
    tenant        LowCardinality(String),
    kind          LowCardinality(String),
    id            String,
    content_hash  FixedString(32),
    ts            DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    request_id    String,
    producer_id   LowCardinality(String),
    seq           UInt64,
    emitted_at    DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    ingested_at   DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    event_type    LowCardinality(String),
    principal     String,
    capability_id LowCardinality(String),
    decision      LowCardinality(String),
    outcome       LowCardinality(String),
    token_id      String,
    decision_id   String,
    frame_id      String,
    handle_id     String,
    handle_refs   Array(String),
    candidate_id  LowCardinality(String),
    flow_id       String,
    -- Every id link of the payload (see weft_schemas::links): (via, target kind, target id).
    links         Array(Tuple(String, String, String)),
    -- 1 when an event with this (tenant, kind, id) but different content was seen before.
    conflict      UInt8,
    topic         LowCardinality(String),
    partition     UInt32,
    offset        UInt64,
    content_type  LowCardinality(String),
    payload       String CODEC(ZSTD(3)),
    INDEX idx_id id TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_request request_id TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_decision decision_id TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_principal principal TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_token token_id TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_ts ts TYPE minmax GRANULARITY 1,
    -- Exactly-once progress: the highest offset stored per source partition. Part of each
    -- inserted part, so it is exactly as atomic as the insert itself.
    PROJECTION progress (SELECT topic, partition, max(offset) GROUP BY topic, partition),
    -- Identities per source partition, to reload the dedup window when a partition is assigned.
    PROJECTION by_partition (
        SELECT topic, partition, offset, tenant, kind, id, content_hash, ingested_at
        ORDER BY topic, partition, offset
    )
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/weft_events_local', '{replica}')
PARTITION BY toYYYYMM(ingested_at)
ORDER BY (tenant, kind, toStartOfHour(ts), id)
SETTINGS lightweight_mutation_projection_mode = 'rebuild',
         deduplicate_merge_projection_mode = 'rebuild';

CREATE TABLE IF NOT EXISTS weft_events ON CLUSTER '{cluster}'
AS weft_events_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_events_local, cityHash64(topic, partition));
