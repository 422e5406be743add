-- Narratives: a projection of weft_events, written by the narrative projector and
-- recomputable from the facts with `weft rebuild`.

-- Members of each narrative, with a copy of the payload, ordered so that one narrative is
-- one small range read (the trace-ordered layout that made SigNoz trace fetches 40x faster).
-- An event without a request id can move between narratives when a late anchor arrives:
-- the move is a tombstone (is_deleted = 1) in the old narrative and a row in the new one.
-- Readers take argMax(..., version) per member; no read path needs FINAL.
CREATE TABLE IF NOT EXISTS weft_narratives
(
    tenant        LowCardinality(String),
    narrative_id  String,
    kind          LowCardinality(String),
    id            String,
    content_hash  FixedString(32),
    ts            DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1)),
    request_id    String,
    payload       String CODEC(ZSTD(3)),
    version       UInt64,
    is_deleted    UInt8
)
ENGINE = ReplacingMergeTree(version, is_deleted)
ORDER BY (tenant, narrative_id, kind, id, content_hash);

-- The current narrative of every event, by id: "which narrative is this id in?", and (with
-- weft_links) the state the projector reloads after a restart.
CREATE TABLE IF NOT EXISTS weft_narrative_nodes
(
    tenant        LowCardinality(String),
    kind          LowCardinality(String),
    id            String,
    narrative_id  String,
    request_id    String,
    ts            DateTime64(6, 'UTC'),
    version       UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (tenant, id, kind);

-- Links by their target, to find who points at a narrative's members (related narratives,
-- orphan checks). Derived and idempotent: duplicates collapse, readers use DISTINCT.
CREATE TABLE IF NOT EXISTS weft_links
(
    tenant     LowCardinality(String),
    to_kind    LowCardinality(String),
    to_id      String,
    from_kind  LowCardinality(String),
    from_id    String,
    via        LowCardinality(String)
)
ENGINE = ReplacingMergeTree
ORDER BY (tenant, to_id, to_kind, from_id, from_kind, via);

-- How far the projector has read each source partition (it may lag the facts after a crash;
-- the ingest loop re-feeds it from there).
CREATE TABLE IF NOT EXISTS weft_projector_progress
(
    topic       LowCardinality(String),
    partition   UInt32,
    offset      Int64,
    version     UInt64
)
ENGINE = ReplacingMergeTree(version)
ORDER BY (topic, partition);
