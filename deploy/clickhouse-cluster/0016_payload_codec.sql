-- Cluster variant of schemas/clickhouse/0016_payload_codec.sql: payloads at ZSTD level 1 on
-- every replica's local tables (the Distributed tables store nothing).
ALTER TABLE weft_events_local ON CLUSTER '{cluster}' MODIFY COLUMN payload String CODEC(ZSTD(1));
ALTER TABLE weft_narratives_local ON CLUSTER '{cluster}' MODIFY COLUMN payload String CODEC(ZSTD(1));
