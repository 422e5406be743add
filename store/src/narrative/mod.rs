//! The narrative tables (migration 0002): their rows, written by the projector and by
//! `weft rebuild` (both in `weft-consumers`), and the read side ([`query`], bounded in
//! payload bytes by [`bounded`]).

pub mod bounded;
pub mod query;

use std::borrow::Cow;

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
///
/// The narrative rows are generic over their strings: `String` (the default) to read them,
/// a borrowed `Cow<str>` for the projector to write a batch's rows from its facts without a
/// copy of every payload and id (the rows of a 50k-record pass are tens of MB).
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub struct NarrativeRow<S = String> {
    /// Tenant; every narrative read is scoped by it.
    pub tenant: S,
    /// The narrative this member belongs to: a request id, or `adhoc:<kind>:<id>`.
    pub narrative_id: S,
    /// Event kind of the member.
    pub kind: S,
    /// Identity of the member event.
    pub id: S,
    /// Content hash of the member, as in `weft_events`.
    pub content_hash: [u8; 32],
    /// The event's own time (micros); orders the narrative's entries.
    pub ts: i64,
    /// The event's own request id, empty when it carries none.
    pub request_id: S,
    /// Copy of the producer's payload JSON, so a narrative is one range read.
    pub payload: S,
    /// A monotonic version; readers take the row with the highest version per member.
    pub version: u64,
    /// 1 for a tombstone left when the member moved to another narrative.
    pub is_deleted: u8,
}

impl NarrativeRow {
    /// The same row as the projector writes them (owned strings in a `Cow`), for a member it
    /// read back and writes again (a move).
    pub fn into_cow(self) -> NarrativeRow<Cow<'static, str>> {
        NarrativeRow {
            tenant: Cow::Owned(self.tenant),
            narrative_id: Cow::Owned(self.narrative_id),
            kind: Cow::Owned(self.kind),
            id: Cow::Owned(self.id),
            content_hash: self.content_hash,
            ts: self.ts,
            request_id: Cow::Owned(self.request_id),
            payload: Cow::Owned(self.payload),
            version: self.version,
            is_deleted: self.is_deleted,
        }
    }
}

/// A row of `weft_narrative_nodes`: where one event is now (strings as [`NarrativeRow`]'s).
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub struct NodeRow<S = String> {
    /// Tenant of the event.
    pub tenant: S,
    /// Event kind.
    pub kind: S,
    /// The event's identity.
    pub id: S,
    /// The narrative it belongs to.
    pub narrative_id: S,
    /// Its own request id, empty when none.
    pub request_id: S,
    /// Its own time (micros).
    pub ts: i64,
    /// Readers take the highest version per (tenant, id, kind).
    pub version: u64,
}

/// A row of `weft_links`: one id link, by its target (strings as [`NarrativeRow`]'s).
#[derive(Debug, Clone, Row, Serialize, Deserialize)]
pub struct LinkRow<S = String> {
    /// Tenant of both ends.
    pub tenant: S,
    /// Kind of the target (an event kind or `flow`).
    pub to_kind: S,
    /// Id of the target.
    pub to_id: S,
    /// Kind of the event holding the link.
    pub from_kind: S,
    /// Id of the event holding the link.
    pub from_id: S,
    /// The payload field the link was read from.
    pub via: S,
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
