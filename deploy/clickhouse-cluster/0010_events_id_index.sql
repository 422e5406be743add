-- Cluster variant of schemas/clickhouse/0010_events_id_index.sql: the index lives on each
-- shard's local table.
ALTER TABLE weft_events_local ON CLUSTER '{cluster}' ADD INDEX IF NOT EXISTS id_bloom id TYPE bloom_filter(0.01) GRANULARITY 1;
ALTER TABLE weft_events_local ON CLUSTER '{cluster}' MATERIALIZE INDEX id_bloom;
