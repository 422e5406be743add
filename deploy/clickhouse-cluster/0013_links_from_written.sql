-- Cluster variant of schemas/clickhouse/0013_links_from_written.sql: the projector writes
-- weft_links_from through its Distributed table (sharded by (tenant, from_id)); the view on
-- every shard's weft_links_local goes.
DROP VIEW IF EXISTS weft_links_from_mv ON CLUSTER '{cluster}';
