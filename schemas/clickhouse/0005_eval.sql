-- Offline evaluations: one row per EvaluationArtifact stored by `weft eval --store`, so the
-- router dashboard can show the latest IPS / SNIPS / DR estimates per target policy.
--
-- * The artifact is kept whole as JSON (a validated weaver-spec EvaluationArtifact); the
--   columns beside it are only what readers filter and sort on.
-- * ReplacingMergeTree on the artifact id: storing the same artifact twice keeps one row.
--   Readers take argMax(..., created_at) per policy; no read path needs FINAL.
-- * Additive: nothing else reads or writes this table. (0004 is reserved for the audit.)
CREATE TABLE IF NOT EXISTS weft_eval_results
(
    tenant            LowCardinality(String),
    candidate_policy  LowCardinality(String),
    created_at        DateTime64(6, 'UTC'),
    artifact_id       String,
    range_from        DateTime64(6, 'UTC'),
    range_to          DateTime64(6, 'UTC'),
    artifact          String CODEC(ZSTD(3))
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(created_at)
ORDER BY (tenant, candidate_policy, created_at, artifact_id);
