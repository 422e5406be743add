-- Payloads compressed with ZSTD level 1 instead of 3, in weft_events and in the narrative
-- copy. On the simulator's payloads level 1 is as small (5.64 MiB against 6.10 for the same
-- 300k payloads, 103 MiB raw) and cheaper for every insert and every merge that rewrites
-- the column (docs/BENCHMARKS.md, "Payload codec"). A codec is column metadata: parts
-- already written keep theirs until a merge rewrites them, and no mutation runs.
ALTER TABLE weft_events MODIFY COLUMN payload String CODEC(ZSTD(1));
ALTER TABLE weft_narratives MODIFY COLUMN payload String CODEC(ZSTD(1));
