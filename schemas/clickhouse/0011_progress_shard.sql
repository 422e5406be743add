-- Several narrative processes (`weft ingest --role narratives --narrative-shard i/N`, tenant
-- sharding): each shard keeps its own progress rows, so the sorting key gains the shard, or
-- ReplacingMergeTree would collapse one shard's row with another's for the same partition.
-- Rows written before (one process for every tenant) read as shard '', which the unsharded
-- projector still writes. ClickHouse accepts a column added in the same ALTER at
-- the end of the sorting key.
ALTER TABLE weft_projector_progress ADD COLUMN IF NOT EXISTS shard LowCardinality(String), MODIFY ORDER BY (topic, partition, shard);
