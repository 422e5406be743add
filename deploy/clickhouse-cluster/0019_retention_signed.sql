-- Cluster variant of schemas/clickhouse/0019_retention_signed.sql: the signature columns of
-- `pruned_before` on every replica's weft_audit_retention_local and on the Distributed
-- weft_audit_retention, so `retention apply` writes them and verify reads them unchanged.
ALTER TABLE weft_audit_retention_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS kid String DEFAULT '',
    ADD COLUMN IF NOT EXISTS sig String DEFAULT '';

ALTER TABLE weft_audit_retention ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS kid String DEFAULT '',
    ADD COLUMN IF NOT EXISTS sig String DEFAULT '';
