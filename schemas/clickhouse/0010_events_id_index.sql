-- A Bloom-filter skip index on weft_events.id. Ingest's dedup state keeps a bounded set of
-- recent identities and a filter of the whole window; an identity the filter cannot rule out
-- is checked here (`id IN [...]` within one partition's window), and this index lets that
-- check read only the granules that may hold the ids instead of every id of the window.
ALTER TABLE weft_events ADD INDEX IF NOT EXISTS id_bloom id TYPE bloom_filter(0.01) GRANULARITY 1;
-- Parts stored before this migration: indexed by a background mutation (until it finishes,
-- their granules are read, so answers are the same either way).
ALTER TABLE weft_events MATERIALIZE INDEX id_bloom;
