-- weft_events: the append-only audit store. One row per distinct event (tenant, kind, id,
-- content); the full original payload is kept as the producer's exact JSON text.
--
-- Layout choices (see ARCHITECTURE.md, "Storage"):
-- * MergeTree, never Replacing: facts are immutable, so no read path needs FINAL.
-- * ORDER BY (tenant, kind, toStartOfHour(ts), id): the search layout. Every query is
--   tenant-scoped and time-bounded, and most filter on kind.
-- * PARTITION BY the ingest month: the consumer stamps one ingested_at per batch, so each
--   batch lands in exactly one part and an insert is all-or-nothing.
-- * No TTL: audit facts are kept until a tenant's retention says otherwise.
-- * Exactly-once: the consumer resumes each partition after max(offset) stored here
--   (projection `progress`), so a replayed batch is never inserted twice.
CREATE TABLE IF NOT EXISTS weft_events
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
ENGINE = MergeTree
PARTITION BY toYYYYMM(ingested_at)
ORDER BY (tenant, kind, toStartOfHour(ts), id)
SETTINGS lightweight_mutation_projection_mode = 'rebuild',
         deduplicate_merge_projection_mode = 'rebuild';
