-- Typed columns for `weft audit check` (I-06), computed by ClickHouse from the payload at
-- insert time, so the check reads three small columns instead of decompressing and parsing
-- every capability token's JSON (measured: the JSON read dominated the check over 10M rows).
--
-- MATERIALIZED, not written by the client: ingest's RowBinary insert names its columns and
-- leaves these out, ClickHouse fills them; `SELECT *` does not return them, so the hash chain
-- (which hashes the columns ingest writes) and every existing reader are unchanged. Empty /
-- NULL / 0 on every row that is not a capability_token.
ALTER TABLE weft_events
    ADD COLUMN IF NOT EXISTS token_scope Array(String)
        MATERIALIZED if(kind = 'capability_token', JSONExtract(payload, 'scope', 'Array(String)'), []);
ALTER TABLE weft_events
    ADD COLUMN IF NOT EXISTS token_expires_at Nullable(DateTime64(6, 'UTC'))
        MATERIALIZED if(kind = 'capability_token',
                        parseDateTime64BestEffortOrNull(JSONExtractString(payload, 'expires_at'), 6, 'UTC'),
                        NULL);
ALTER TABLE weft_events
    ADD COLUMN IF NOT EXISTS token_single_use UInt8
        MATERIALIZED if(kind = 'capability_token', JSONExtractBool(payload, 'single_use'), 0);
-- Rows stored before this migration: written by a background mutation (until it finishes,
-- ClickHouse computes the expressions on read, so answers are the same either way).
ALTER TABLE weft_events MATERIALIZE COLUMN token_scope;
ALTER TABLE weft_events MATERIALIZE COLUMN token_expires_at;
ALTER TABLE weft_events MATERIALIZE COLUMN token_single_use;
