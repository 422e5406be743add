-- ClickHouse cluster variant of weft's schema (a separate migration set; the default set in
-- schemas/clickhouse/ is for one server). Apply in file order with clickhouse-client
-- against any node, BEFORE `weft migrate` (see docs/OPERATIONS.md, "ClickHouse cluster"):
--
--   for f in deploy/clickhouse-cluster/*.sql; do
--     clickhouse-client --host NODE --database weft --multiquery < "$f"; done
--   weft migrate     # every CREATE ... IF NOT EXISTS is then a no-op; it records versions
--                    # (0007's MATERIALIZE COLUMN: see OPERATIONS.md, "ClickHouse cluster")
--
-- Every server needs the macros {cluster}, {shard} and {replica} (config.d/macros.xml) and a
-- Keeper. Each table X of the default set becomes X_local (Replicated*MergeTree, one per
-- shard) plus X (Distributed over X_local), so weft's queries run unchanged.
--
-- The weft user's profile must set distributed_foreground_insert = 1: an insert into a
-- Distributed table then returns only once the shard has it, which the exactly-once resume
-- point (max offset per partition) relies on. With several replicas per shard, also
-- insert_quorum = 'auto' and select_sequential_consistency = 1, so that a restart never reads
-- the resume point from a replica that lacks the last insert (docs/OPERATIONS.md).

-- The migration record, replicated to EVERY node of every shard (one Keeper path for all),
-- so `weft migrate` sees the same applied versions whichever node it talks to.
CREATE TABLE IF NOT EXISTS weft_schema_migrations ON CLUSTER '{cluster}'
(
    version    UInt32,
    name       String,
    checksum   String,
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/all/{database}/weft_schema_migrations', '{shard}-{replica}')
ORDER BY version;
