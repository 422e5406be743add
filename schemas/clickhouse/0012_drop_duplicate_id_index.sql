-- weft_events had two Bloom-filter indexes on id: idx_id (0001, 0.1% false positives) and
-- id_bloom (0010, 1%), added for the dedup check that idx_id already served. Every insert and
-- every merge built both; the check and every search by id use idx_id, which stays.
ALTER TABLE weft_events DROP INDEX IF EXISTS id_bloom;
