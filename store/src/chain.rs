//! The hash chain's view of `weft_events` (the audit's `weft audit seal` and `verify`):
//! [`ChainRow`], every column of a fact with the payload by its SHA-256, and what `verify`
//! reads of the rows after the last seal ([`Unsealed`]).
//!
//! **Hashes are forever.** `row_hash = SHA-256(JCS(ChainRow))` is sealed into
//! `weft_audit_chain` and signed checkpoints: a field renamed, retyped or added changes the
//! hash of every row sealed before, and breaks every existing seal. A column added later must
//! be added here with `#[serde(skip_serializing_if = ...)]` on its default value (the value
//! ALTER ADD COLUMN gives old rows), so old rows hash as before; a test pins the hash of a
//! known row.

use std::sync::LazyLock;

use clickhouse::Row;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::events::TypedColumns;
use crate::StoreError;

/// One fact as the chain sees it: every column of `weft_events` that ingest writes, the
/// payload by its hash (the MATERIALIZED columns are computed from the payload).
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub struct ChainRow {
    /// Source topic; with `partition`, names the chain the row belongs to.
    pub topic: String,
    /// Source partition; with `topic`, names the chain the row belongs to.
    pub partition: u32,
    /// Kafka offset: the row's position in its chain.
    pub offset: u64,
    /// Tenant; every chain is per tenant.
    pub tenant: String,
    /// Event kind.
    pub kind: String,
    /// The event's natural identity.
    pub id: String,
    /// SHA-256 of the canonical payload, lowercase hex.
    pub content_hash: String,
    /// Event time, microseconds since the epoch.
    pub ts: i64,
    /// Request id, empty when the event has none.
    pub request_id: String,
    /// Process that emitted the event.
    pub producer_id: String,
    /// Per-producer sequence number.
    pub seq: u64,
    /// When the event entered weft, microseconds since the epoch.
    pub emitted_at: i64,
    /// When ingest stored it, microseconds since the epoch.
    pub ingested_at: i64,
    /// Payload `event_type`.
    pub event_type: String,
    /// Payload `principal`: who acted.
    pub principal: String,
    /// Payload `capability_id`.
    pub capability_id: String,
    /// Payload `decision`.
    pub decision: String,
    /// Payload `outcome`.
    pub outcome: String,
    /// Payload `token_id`.
    pub token_id: String,
    /// Authorization decision id (trace events and policy decisions only).
    pub decision_id: String,
    /// Payload `frame_id`.
    pub frame_id: String,
    /// Payload `handle_id`.
    pub handle_id: String,
    /// Payload `handle_refs`.
    pub handle_refs: Vec<String>,
    /// Routed candidate (execution feedback and routing decisions only).
    pub candidate_id: String,
    /// Payload `metadata.flow_id`.
    pub flow_id: String,
    /// Id links of the payload as (via, target kind, target id).
    pub links: Vec<(String, String, String)>,
    /// 1 when the identity was stored before with different content.
    pub conflict: u8,
    /// Wire encoding the record arrived in.
    pub content_type: String,
    /// SHA-256 of the stored payload text, lowercase hex; stands in for the payload.
    pub payload_sha256: String,
}

impl ChainRow {
    /// SHA-256 of the row's JCS form (RFC 8785), written by
    /// [`weft_schemas::identity::write_canonical`]: the bytes serde_jcs writes, several times
    /// cheaper (sealing and verifying hash every row).
    pub fn hash(&self) -> Result<[u8; 32], StoreError> {
        let v = serde_json::to_value(self).map_err(|e| StoreError::Canonical(e.to_string()))?;
        let mut bytes = Vec::with_capacity(1024);
        weft_schemas::identity::write_canonical(&v, &mut bytes)
            .map_err(|e| StoreError::Canonical(e.to_string()))?;
        Ok(Sha256::digest(bytes).into())
    }
}

/// The condition of a query over one partition's offsets `(after, upto]` of one tenant
/// (`{t}`, `{topic}`, `{p}`, `{after}`, `{upto}`), as a literal for `concat!`.
#[macro_export]
macro_rules! span_where {
    () => {
        "tenant = {t:String} AND topic = {topic:String} AND partition = {p:UInt32} \
         AND offset > {after:Int64} AND offset <= {upto:UInt64}"
    };
}

/// `{kind}`, the one kind a partition's facts have, or `''` when they have several (or the
/// caller does not know): with the kind, ClickHouse reads that kind's range of
/// `weft_events`' sort key `(tenant, kind, ...)`; without it, every part's rows of the
/// tenant. The caller must know the kind from the rows themselves (every kind the partition
/// holds), or a row of another kind would be passed over.
#[macro_export]
macro_rules! kind_where {
    () => {
        "({kind:String} = '' OR kind = {kind:String})"
    };
}

/// `{parts}`, the parts of `weft_events` that hold a span's facts, or `[]` when the caller
/// does not know them: with them, ClickHouse reads only those parts. A part merged away
/// since they were found is read as none, so a caller that passes them must check that it
/// got every row it expected, and read again without them if not.
#[macro_export]
macro_rules! parts_where {
    () => {
        "(empty({parts:Array(String)}) OR _part IN {parts:Array(String)})"
    };
}

/// [`span_where!`], [`kind_where!`] and [`parts_where!`]: one partition's facts in
/// `weft_events`.
#[macro_export]
macro_rules! events_span_where {
    () => {
        concat!(
            $crate::span_where!(),
            " AND ",
            $crate::kind_where!(),
            " AND ",
            $crate::parts_where!()
        )
    };
}

/// Every [`ChainRow`] of one tenant's partition with an offset in `(after, upto]`, in chain
/// order. Parameters: those of [`events_span_where!`].
pub const ROWS_SQL: &str = concat!(
    "SELECT topic, partition, offset, tenant, kind, id, lower(hex(content_hash)) AS content_hash,
       toUnixTimestamp64Micro(ts) AS ts, request_id, producer_id, seq,
       toUnixTimestamp64Micro(emitted_at) AS emitted_at, toUnixTimestamp64Micro(ingested_at) AS ingested_at,
       event_type, principal, capability_id, decision, outcome, token_id, decision_id, frame_id,
       handle_id, handle_refs, candidate_id, flow_id, links, conflict, content_type,
       lower(hex(SHA256(payload))) AS payload_sha256
FROM weft_events
WHERE ",
    events_span_where!(),
    "
ORDER BY offset, kind, id, content_hash
"
);

/// A fact after the last seal, with what `verify` checks against its own payload.
#[derive(Debug, Row, Deserialize)]
pub struct Unsealed {
    /// Kafka offset.
    pub offset: u64,
    /// Event kind.
    pub kind: String,
    /// The stored identity.
    pub id: String,
    /// The stored content hash, lowercase hex.
    pub content_hash: String,
    /// The stored event time (micros).
    pub ts: i64,
    /// The stored emitted time (micros), what `ts` falls back to.
    pub emitted_at: i64,
    /// The stored [`TypedColumns`], as one JSON object keyed by column name.
    pub typed: String,
    /// MATERIALIZED columns whose stored value is not their expression over the payload.
    pub materialized_wrong: Vec<String>,
    /// The stored payload text.
    pub payload: String,
}

/// The [`Unsealed`] rows of one tenant's partition with an offset in `(after, upto]`.
/// Parameters as [`ROWS_SQL`]. Built once from [`TypedColumns`] and the MATERIALIZED
/// expressions of the migrations ([`crate::ddl::materialized`]), so a column added to
/// either is checked without another edit.
pub static UNSEALED_SQL: LazyLock<String> = LazyLock::new(|| {
    let typed = TypedColumns::COLUMN_NAMES.join(", ");
    // A MATERIALIZED column is right when it equals its expression (both NULL included).
    let checks: Vec<String> = crate::ddl::materialized(crate::events::TABLE)
        .into_iter()
        .map(|(c, e)| format!("if(ifNull({c} = ({e}), isNull({c}) AND isNull({e})), '', '{c}')"))
        .collect();
    format!(
        "SELECT offset, kind, id, lower(hex(content_hash)) AS content_hash,
       toUnixTimestamp64Micro(ts) AS ts, toUnixTimestamp64Micro(emitted_at) AS emitted_at,
       formatRowNoNewline('JSONEachRow', {typed}) AS typed,
       arrayFilter(x -> x != '', [{checks}]::Array(String)) AS materialized_wrong, payload
FROM weft_events
WHERE {span}
ORDER BY offset, kind, id",
        checks = checks.join(", "),
        span = events_span_where!(),
    )
});
