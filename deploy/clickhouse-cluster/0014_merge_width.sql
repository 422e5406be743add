-- Cluster variant of schemas/clickhouse/0014_merge_width.sql: wider merges on every
-- replica's weft_events_local and weft_narratives_local (Distributed tables have no parts).
ALTER TABLE weft_events_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 10;
ALTER TABLE weft_narratives_local ON CLUSTER '{cluster}' MODIFY SETTING merge_selector_base = 10;
