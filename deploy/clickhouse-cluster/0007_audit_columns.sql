-- Cluster variant of schemas/clickhouse/0007_audit_columns.sql: the same MATERIALIZED
-- columns on every replica's weft_events_local (computed where each row is stored), and on
-- the Distributed weft_events so the audit check's queries name them unchanged. The
-- Distributed table carries the same expression, so an insert through it does not write
-- the column either (never tried on a real cluster here: no Keeper on this machine).
ALTER TABLE weft_events_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS token_scope Array(String)
        MATERIALIZED if(kind = 'capability_token', JSONExtract(payload, 'scope', 'Array(String)'), []),
    ADD COLUMN IF NOT EXISTS token_expires_at Nullable(DateTime64(6, 'UTC'))
        MATERIALIZED if(kind = 'capability_token',
                        parseDateTime64BestEffortOrNull(JSONExtractString(payload, 'expires_at'), 6, 'UTC'),
                        NULL),
    ADD COLUMN IF NOT EXISTS token_single_use UInt8
        MATERIALIZED if(kind = 'capability_token', JSONExtractBool(payload, 'single_use'), 0);

ALTER TABLE weft_events_local ON CLUSTER '{cluster}'
    MATERIALIZE COLUMN token_scope,
    MATERIALIZE COLUMN token_expires_at,
    MATERIALIZE COLUMN token_single_use;

ALTER TABLE weft_events ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS token_scope Array(String)
        MATERIALIZED if(kind = 'capability_token', JSONExtract(payload, 'scope', 'Array(String)'), []),
    ADD COLUMN IF NOT EXISTS token_expires_at Nullable(DateTime64(6, 'UTC'))
        MATERIALIZED if(kind = 'capability_token',
                        parseDateTime64BestEffortOrNull(JSONExtractString(payload, 'expires_at'), 6, 'UTC'),
                        NULL),
    ADD COLUMN IF NOT EXISTS token_single_use UInt8
        MATERIALIZED if(kind = 'capability_token', JSONExtractBool(payload, 'single_use'), 0);
