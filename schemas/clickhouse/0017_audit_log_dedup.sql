-- weft_audit_log keeps the hashes of its last 1,000 inserted blocks, so that an insert the
-- audit writer sends again (its answer lost: the rows may have landed) is dropped by
-- ClickHouse instead of written twice. The writer names each batch with an
-- insert_deduplication_token that its retries reuse (audit/src/log/writer.rs); a plain
-- MergeTree deduplicates only with this window set.
ALTER TABLE weft_audit_log MODIFY SETTING non_replicated_deduplication_window = 1000;
