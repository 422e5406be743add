-- Cluster variant of schemas/clickhouse/0008_links_from.sql: sharded by (tenant, from_id),
-- the key its reader looks up. The view runs on each shard's weft_links_local and writes
-- through the Distributed table, so each row lands on its source's shard.

CREATE TABLE IF NOT EXISTS weft_links_from_local ON CLUSTER '{cluster}'
(
    tenant     LowCardinality(String),
    to_kind    LowCardinality(String),
    to_id      String,
    from_kind  LowCardinality(String),
    from_id    String,
    via        LowCardinality(String)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/weft_links_from_local', '{replica}')
ORDER BY (tenant, from_id, from_kind, to_id, to_kind, via)
SETTINGS index_granularity = 1024;

CREATE TABLE IF NOT EXISTS weft_links_from ON CLUSTER '{cluster}'
AS weft_links_from_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_links_from_local, cityHash64(tenant, from_id));

CREATE MATERIALIZED VIEW IF NOT EXISTS weft_links_from_mv ON CLUSTER '{cluster}' TO weft_links_from AS
SELECT tenant, to_kind, to_id, from_kind, from_id, via FROM weft_links_local;

INSERT INTO weft_links_from SELECT tenant, to_kind, to_id, from_kind, from_id, via FROM weft_links;
