//! The narrative tables (migration 0002): their rows, written by the projector and by
//! `weft rebuild` (both in `weft-consumers`), and the read side ([`query`]).

pub mod query;

use clickhouse::Row;
use serde::{Deserialize, Serialize};

/// Members of each narrative.
pub const NARRATIVES: &str = "weft_narratives";
/// The current narrative of each event.
pub const NODES: &str = "weft_narrative_nodes";
/// Every link by its target.
pub const LINKS: &str = "weft_links";
/// How far the projector (each narrative shard) has read each partition.
pub const PROGRESS: &str = "weft_projector_progress";

/// A row of `weft_narratives`.
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub struct NarrativeRow {
    /// Tenant; every narrative read is scoped by it.
    pub tenant: String,
    /// The narrative this member belongs to: a request id, or `adhoc:<kind>:<id>`.
    pub narrative_id: String,
    /// Event kind of the member.
    pub kind: String,
    /// Identity of the member event.
    pub id: String,
    /// Content hash of the member, as in `weft_events`.
    pub content_hash: [u8; 32],
    /// The event's own time (micros); orders the narrative's entries.
    pub ts: i64,
    /// The event's own request id, empty when it carries none.
    pub request_id: String,
    /// Copy of the producer's payload JSON, so a narrative is one range read.
    pub payload: String,
    /// A monotonic version; readers take the row with the highest version per member.
    pub version: u64,
    /// 1 for a tombstone left when the member moved to another narrative.
    pub is_deleted: u8,
}

/// A row of `weft_narrative_nodes`: where one event is now.
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub struct NodeRow {
    /// Tenant of the event.
    pub tenant: String,
    /// Event kind.
    pub kind: String,
    /// The event's identity.
    pub id: String,
    /// The narrative it belongs to.
    pub narrative_id: String,
    /// Its own request id, empty when none.
    pub request_id: String,
    /// Its own time (micros).
    pub ts: i64,
    /// Readers take the highest version per (tenant, id, kind).
    pub version: u64,
}

/// A row of `weft_links`: one id link, by its target.
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub struct LinkRow {
    /// Tenant of both ends.
    pub tenant: String,
    /// Kind of the target (an event kind or `flow`).
    pub to_kind: String,
    /// Id of the target.
    pub to_id: String,
    /// Kind of the event holding the link.
    pub from_kind: String,
    /// Id of the event holding the link.
    pub from_id: String,
    /// The payload field the link was read from.
    pub via: String,
}

/// A row of `weft_projector_progress`: how far the projector read one source partition.
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub struct ProgressRow {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: u32,
    /// Highest offset projected.
    pub offset: i64,
    /// Readers take the highest version per (topic, partition, shard).
    pub version: u64,
    /// The narrative shard (`i/N`) whose progress this is; empty when one process projects
    /// every tenant (migration 0011).
    pub shard: String,
}
