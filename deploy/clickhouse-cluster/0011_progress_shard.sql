-- Cluster variant of schemas/clickhouse/0011_progress_shard.sql: the shard column and the
-- longer sorting key on every replica's weft_projector_progress_local, and the column on the
-- Distributed weft_projector_progress (its sharding key, cityHash64(topic, partition), is
-- unchanged). Never run on a real cluster here: no Keeper on this machine.
ALTER TABLE weft_projector_progress_local ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS shard LowCardinality(String), MODIFY ORDER BY (topic, partition, shard);
ALTER TABLE weft_projector_progress ON CLUSTER '{cluster}' ADD COLUMN IF NOT EXISTS shard LowCardinality(String);
