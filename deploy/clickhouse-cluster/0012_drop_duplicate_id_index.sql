-- Cluster variant of schemas/clickhouse/0012_drop_duplicate_id_index.sql: idx_id stays on
-- every replica's weft_events_local; the duplicate id_bloom goes.
ALTER TABLE weft_events_local ON CLUSTER '{cluster}' DROP INDEX IF EXISTS id_bloom;
