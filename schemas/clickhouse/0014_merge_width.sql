-- Wider merges for the two tables whose merges cost ingest the most: each row is rewritten
-- fewer times over its life (lower write amplification), for a few more active parts.
--
-- ClickHouse's merge selector merges at least `merge_selector_base` parts of similar size at
-- once (default 5), so a row is rewritten about log_base(table size / insert size) times.
-- Ingest inserts one part per flush (20k rows by default) into each table, and merges were
-- half of ClickHouse's CPU per event. The same 3M rows inserted in 20k-row parts: merge CPU
-- -38% for weft_events and -36% for weft_narratives at base 10 (docs/BENCHMARKS.md, "Merge
-- width"). weft_narrative_nodes and weft_links keep the default: a narrative lookup reads a
-- granule per part of them, and widening them too took its p99 past 50 ms at 10M events.
ALTER TABLE weft_events MODIFY SETTING merge_selector_base = 10;
ALTER TABLE weft_narratives MODIFY SETTING merge_selector_base = 10;
