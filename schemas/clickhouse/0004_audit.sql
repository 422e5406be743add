-- Compliance audit (weft-audit): the tamper-evident hash chain, its signed checkpoints, the
-- log of audit reads, and per-tenant retention. See docs/AUDIT.md.

-- weft_audit_chain: one link per sealed fact, per (tenant, topic, partition) in offset order.
-- chain = SHA-256(previous chain || row_hash); row_hash = SHA-256 of the fact's canonical
-- content (every column of weft_events, the payload by its SHA-256). `ts` is kept so that
-- rows removed by `weft audit retention apply` are told apart from rows deleted behind
-- weft's back.
CREATE TABLE IF NOT EXISTS weft_audit_chain
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
ENGINE = MergeTree
ORDER BY (tenant, topic, partition, offset);

-- weft_audit_checkpoints: the chain head of one (tenant, topic, partition) at one offset,
-- signed (ed25519 over the JCS of {tenant, topic, partition, offset, head}) when a seal key
-- is configured. Exported as JSON for offline verification.
CREATE TABLE IF NOT EXISTS weft_audit_checkpoints
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
ENGINE = MergeTree
ORDER BY (tenant, topic, partition, offset);

-- weft_audit_log: every audit read (CLI or API), who made it and what it asked.
CREATE TABLE IF NOT EXISTS weft_audit_log
(
    at         DateTime64(6, 'UTC'),
    tenant     LowCardinality(String),
    actor      String,
    action     LowCardinality(String),
    query      String,
    results    UInt64
)
ENGINE = MergeTree
ORDER BY (tenant, at);

-- weft_audit_retention: per-tenant retention (0 days = keep forever, the default) and legal
-- hold. The latest row per tenant wins.
CREATE TABLE IF NOT EXISTS weft_audit_retention
(
    tenant      LowCardinality(String),
    days        UInt32,
    legal_hold  UInt8,
    pruned_before DateTime64(6, 'UTC'),
    version     UInt64,
    updated_at  DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
ORDER BY tenant;
