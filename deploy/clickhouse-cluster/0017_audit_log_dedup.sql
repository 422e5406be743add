-- Cluster variant of schemas/clickhouse/0017_audit_log_dedup.sql: the replicas'
-- weft_audit_log_local is a ReplicatedMergeTree, which deduplicates inserted blocks by
-- default; the window is set here so that it does not depend on the server's default, and
-- the writer's insert_deduplication_token reaches it through the Distributed table.
ALTER TABLE weft_audit_log_local ON CLUSTER '{cluster}' MODIFY SETTING replicated_deduplication_window = 1000;
