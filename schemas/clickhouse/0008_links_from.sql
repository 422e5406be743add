-- Links by their source. The projector keeps only recently touched narrative components in
-- memory; loading an evicted one follows links from both ends, and weft_links is ordered by
-- its target. A materialized view keeps this copy, so every writer of weft_links feeds it;
-- the INSERT fills it from the links stored before this migration (duplicates collapse).
CREATE TABLE IF NOT EXISTS weft_links_from
(
    tenant     LowCardinality(String),
    to_kind    LowCardinality(String),
    to_id      String,
    from_kind  LowCardinality(String),
    from_id    String,
    via        LowCardinality(String)
)
ENGINE = ReplacingMergeTree
ORDER BY (tenant, from_id, from_kind, to_id, to_kind, via)
SETTINGS index_granularity = 1024;

CREATE MATERIALIZED VIEW IF NOT EXISTS weft_links_from_mv TO weft_links_from AS
SELECT tenant, to_kind, to_id, from_kind, from_id, via FROM weft_links;

INSERT INTO weft_links_from SELECT tenant, to_kind, to_id, from_kind, from_id, via FROM weft_links;
