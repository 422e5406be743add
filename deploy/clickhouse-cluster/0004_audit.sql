-- Cluster variant of schemas/clickhouse/0004_audit.sql. The chain and its checkpoints are
-- sharded by (tenant, topic, partition), so one chain is verified on one shard in offset
-- order; the audit log and retention by tenant (retention's argMax by version per tenant then
-- sees every version on one shard).

CREATE TABLE IF NOT EXISTS weft_audit_chain_local ON CLUSTER '{cluster}'
(
    tenant     LowCardinality(String),
    topic      LowCardinality(String),
    partition  UInt32,
    offset     UInt64,
    kind       LowCardinality(String),
    id         String,
    ts         DateTime64(6, 'UTC'),
    row_hash   String,
    chain      String,
    sealed_at  DateTime64(6, 'UTC')
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/weft_audit_chain_local', '{replica}')
ORDER BY (tenant, topic, partition, offset);

CREATE TABLE IF NOT EXISTS weft_audit_chain ON CLUSTER '{cluster}'
AS weft_audit_chain_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_audit_chain_local, cityHash64(tenant, topic, partition));

CREATE TABLE IF NOT EXISTS weft_audit_checkpoints_local ON CLUSTER '{cluster}'
(
    tenant     LowCardinality(String),
    topic      LowCardinality(String),
    partition  UInt32,
    offset     UInt64,
    head       String,
    rows       UInt64,
    kid        String,
    sig        String,
    sealed_at  DateTime64(6, 'UTC')
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/weft_audit_checkpoints_local', '{replica}')
ORDER BY (tenant, topic, partition, offset);

CREATE TABLE IF NOT EXISTS weft_audit_checkpoints ON CLUSTER '{cluster}'
AS weft_audit_checkpoints_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_audit_checkpoints_local, cityHash64(tenant, topic, partition));

CREATE TABLE IF NOT EXISTS weft_audit_log_local ON CLUSTER '{cluster}'
(
    at         DateTime64(6, 'UTC'),
    tenant     LowCardinality(String),
    actor      String,
    action     LowCardinality(String),
    query      String,
    results    UInt64
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/weft_audit_log_local', '{replica}')
ORDER BY (tenant, at);

CREATE TABLE IF NOT EXISTS weft_audit_log ON CLUSTER '{cluster}'
AS weft_audit_log_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_audit_log_local, cityHash64(tenant));

CREATE TABLE IF NOT EXISTS weft_audit_retention_local ON CLUSTER '{cluster}'
(
    tenant      LowCardinality(String),
    days        UInt32,
    legal_hold  UInt8,
    pruned_before DateTime64(6, 'UTC'),
    version     UInt64,
    updated_at  DateTime64(6, 'UTC')
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/weft_audit_retention_local', '{replica}', version)
ORDER BY tenant;

CREATE TABLE IF NOT EXISTS weft_audit_retention ON CLUSTER '{cluster}'
AS weft_audit_retention_local
ENGINE = Distributed('{cluster}', currentDatabase(), weft_audit_retention_local, cityHash64(tenant));
