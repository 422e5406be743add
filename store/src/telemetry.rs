//! Ingest's telemetry tables (migration 0006) and its quarantine (0009): their names and rows.
//! The telemetry writer (best effort, off the ingest path) is `weft_consumers::telemetry`; the
//! quarantine is written in the flush (`weft_consumers::ingest`).

use clickhouse::Row;
use serde::Serialize;

/// Table of per-partition flush figures.
pub const BATCHES: &str = "weft_ingest_batches";
/// Table of dead-lettered records (ReplacingMergeTree on topic, partition, offset).
pub const DEAD_LETTERS: &str = "weft_dead_letters";
/// Table of consumer lag samples.
pub const LAG: &str = "weft_ingest_lag";

/// One source partition's share of one flush, written after its facts insert succeeded.
#[derive(Debug, Clone, Row, Serialize)]
pub struct BatchRow {
    /// Microseconds since the epoch.
    pub at: i64,
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// Facts inserted (after deduplication).
    pub rows: u32,
    /// Records dead-lettered in this flush.
    pub dead: u32,
    /// Payload bytes buffered for the flush.
    pub bytes: u64,
    /// Latency of the facts insert (0 when nothing was inserted).
    pub insert_ms: f64,
    /// The process's role (`all`, `facts`, `narratives`).
    pub role: &'static str,
}

/// One record the dead-letter topic acknowledged.
#[derive(Debug, Clone, Row, Serialize)]
pub struct DeadLetterRow {
    /// When the broker acknowledged the dead letter (micros since the epoch).
    pub at: i64,
    /// Source topic of the rejected record.
    pub topic: String,
    /// Source partition of the rejected record.
    pub partition: i32,
    /// Source offset; with topic and partition, the row's key.
    pub offset: i64,
    /// The `weft-dlq-reason` code.
    pub reason: &'static str,
    /// Human-readable rejection detail.
    pub message: String,
    /// The record's `weft-tenant` header, empty when it had none.
    pub tenant: String,
}

/// One lag sample of one source partition.
#[derive(Debug, Clone, Row, Serialize)]
pub struct LagRow {
    /// When the sample was taken (micros since the epoch).
    pub at: i64,
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// The next offset ingest will read: one past what is both stored and projected.
    pub next_offset: i64,
    /// The broker's high watermark for the partition.
    pub high_watermark: i64,
    /// High watermark minus next offset, never negative.
    pub lag: i64,
}

/// Table of quarantined records (migration 0009): rejected records whose dead letter the
/// dead-letter topic refused in every form. Unlike the tables above it is not best effort:
/// ingest writes it in the flush, before the partition's offsets move on.
pub const QUARANTINE: &str = "weft_quarantine";

/// One quarantined record.
#[derive(Debug, Clone, Row, Serialize)]
pub struct QuarantineRow {
    /// When it was quarantined (micros since the epoch).
    pub at: i64,
    /// The record's `weft-tenant` header, empty when it had none.
    pub tenant: String,
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// Source offset; with topic and partition, the row's key.
    pub offset: i64,
    /// Why ingest rejected it (the `weft-dlq-reason` code).
    pub reason: &'static str,
    /// Human-readable rejection detail.
    pub message: String,
    /// Why the dead-letter topic refused its smallest form.
    pub refused: String,
    /// Size of the whole original value.
    pub original_bytes: u64,
    /// Hex SHA-256 of the whole original value.
    pub sha256: String,
    /// Whether `value` was cut.
    pub truncated: bool,
    /// The record's key, as read.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The record's headers (values as lossy UTF-8).
    pub headers: Vec<(String, String)>,
    /// The original value, cut to ingest's `max_message_bytes`.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}
