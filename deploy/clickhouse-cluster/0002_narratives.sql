-- Cluster variant of schemas/clickhouse/0002_narratives.sql. Each table is sharded by the
-- key its readers group on, so argMax(..., version) per key sees every version of that key
-- on one shard:
--   weft_narratives by (tenant, narrative_id): one narrative is still one range read;
--   weft_narrative_nodes by (tenant, id); weft_links by (tenant, to_id);
--   weft_projector_progress by (topic, partition).

CREATE TABLE IF NOT EXISTS weft_narratives_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/weft_narratives_local', '{replica}', version, is_deleted)
ORDER BY (tenant, narrative_id, kind, id, content_hash);

CREATE TABLE IF NOT EXISTS weft_narratives ON CLUSTER '{cluster}'
AS weft_narratives_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_narratives_local, cityHash64(tenant, narrative_id));

CREATE TABLE IF NOT EXISTS weft_narrative_nodes_local ON CLUSTER '{cluster}'
(
    tenant        LowCardinality(String),
    kind          LowCardinality(String),
    id            String,
    narrative_id  String,
    request_id    String,
    ts            DateTime64(6, 'UTC'),
    version       UInt64
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/weft_narrative_nodes_local', '{replica}', version)
ORDER BY (tenant, id, kind);

CREATE TABLE IF NOT EXISTS weft_narrative_nodes ON CLUSTER '{cluster}'
AS weft_narrative_nodes_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_narrative_nodes_local, cityHash64(tenant, id));

CREATE TABLE IF NOT EXISTS weft_links_local ON CLUSTER '{cluster}'
(
    tenant     LowCardinality(String),
    to_kind    LowCardinality(String),
    to_id      String,
    from_kind  LowCardinality(String),
    from_id    String,
    via        LowCardinality(String)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/weft_links_local', '{replica}')
ORDER BY (tenant, to_id, to_kind, from_id, from_kind, via);

CREATE TABLE IF NOT EXISTS weft_links ON CLUSTER '{cluster}'
AS weft_links_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_links_local, cityHash64(tenant, to_id));

CREATE TABLE IF NOT EXISTS weft_projector_progress_local ON CLUSTER '{cluster}'
(
    topic       LowCardinality(String),
    partition   UInt32,
    offset      Int64,
    version     UInt64
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/weft_projector_progress_local', '{replica}', version)
ORDER BY (topic, partition);

CREATE TABLE IF NOT EXISTS weft_projector_progress ON CLUSTER '{cluster}'
AS weft_projector_progress_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_projector_progress_local, cityHash64(topic, partition));
