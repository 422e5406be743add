//! The facts table (`weft_events`, migrations 0001 and 0007): its row, and the one place the
//! payload's typed columns are derived ([`typed_columns`]).
//!
//! Every column of `weft_events` comes from exactly one of four places (checked by a test
//! against the migrations, [`crate::ddl`], and against the row structs):
//! - **the payload**, by [`typed_columns`]: the fields searched and checked by the audit
//!   (`event_type` ... `flow_id`, `links`); ingest writes them (`EventRow::new`) and
//!   `weft audit verify` recomputes them on unsealed rows;
//! - **the envelope or its Kafka headers** ([`ENVELOPE_COLUMNS`]): tenant, kind, request id,
//!   producer id, sequence number, emitted time; the payload cannot vouch for them;
//! - **ingest** ([`INGEST_COLUMNS`]): identity, content hash and event time (computed from
//!   the payload by the decoder, and recomputed by `verify`), where the record came from
//!   (topic, partition, offset, content type), when it was stored, the conflict flag, and the
//!   payload itself;
//! - **ClickHouse** (`MATERIALIZED` in the migrations): the capability-token columns the I-06
//!   check reads; `verify` evaluates their expressions again on unsealed rows.

use std::borrow::Cow;

use clickhouse::Row;
use serde::Serialize;
use serde_json::Value;
use weft_schemas::links::Link;
use weft_schemas::wire::ContentType;
use weft_schemas::{Envelope, Kind};

/// The facts table.
pub const TABLE: &str = "weft_events";

/// Columns of `weft_events` taken from the envelope (or the Kafka headers it was read from).
pub const ENVELOPE_COLUMNS: &[&str] = &[
    "tenant",
    "kind",
    "request_id",
    "producer_id",
    "seq",
    "emitted_at",
];

/// Columns of `weft_events` set by ingest: the decoder's identity, content hash and event
/// time of the payload, the record's origin, the batch's time, the conflict flag, and the
/// payload's exact text.
pub const INGEST_COLUMNS: &[&str] = &[
    "id",
    "content_hash",
    "ts",
    "ingested_at",
    "conflict",
    "topic",
    "partition",
    "offset",
    "content_type",
    "payload",
];

/// A valid event, with everything the stores need computed once (by
/// `weft_consumers::decode`).
#[derive(Debug, Clone)]
pub struct Fact {
    /// The decoded envelope: kind, tenant, request id, producer fields and raw payload.
    pub envelope: Envelope,
    /// The payload's typed columns ([`typed_columns`]), packed ([`StoredColumns`]): the
    /// parsed payload itself is dropped once decoded (keeping it cost 130 MB of peak memory
    /// with 50k-record batches). Their `links` are [`Fact::links`].
    pub typed: StoredColumns,
    /// The natural identity (see `weft_schemas::identity`).
    pub id: String,
    /// SHA-256 of the payload's RFC 8785 canonical form.
    pub content_hash: [u8; 32],
    /// The event's own time (micros), falling back to emitted_at, then the broker time.
    pub ts_micros: i64,
    /// When the event entered weft (micros): `emitted_at`, else the broker time, else 0.
    pub emitted_micros: i64,
    /// The id links of the payload (`weft_schemas::links::extract`), used for narratives and
    /// the `links` column.
    pub links: Vec<Link>,
    /// Wire encoding the record arrived in, stored as `content_type`.
    pub content_type: ContentType,
}

/// The columns of `weft_events` derived from the payload, as [`typed_columns`] derives them.
/// Field names are column names; the default is every column empty.
///
/// Borrowed from the parsed payload as [`typed_columns`] gives them; a [`Fact`] holds them
/// packed ([`StoredColumns`]), so the parsed payload is dropped once decoded.
#[derive(Debug, Clone, Default, PartialEq, Row, Serialize)]
pub struct TypedColumns<'a> {
    /// Payload `event_type`, empty when absent.
    pub event_type: Cow<'a, str>,
    /// Payload `principal`: who acted; searched by audits.
    pub principal: Cow<'a, str>,
    /// Payload `capability_id`, empty when absent.
    pub capability_id: Cow<'a, str>,
    /// Payload `decision`, empty when absent.
    pub decision: Cow<'a, str>,
    /// Payload `outcome`, empty when absent.
    pub outcome: Cow<'a, str>,
    /// Payload `token_id`: the capability token used or issued.
    pub token_id: Cow<'a, str>,
    /// Authorization decision id, on trace events and policy decisions only (feedback keeps
    /// its routing decision in `links`).
    pub decision_id: Cow<'a, str>,
    /// Payload `frame_id`, on trace events and frames only.
    pub frame_id: Cow<'a, str>,
    /// Payload `handle_id`, on trace events, frames and handles only.
    pub handle_id: Cow<'a, str>,
    /// Payload `handle_refs`: handles the event refers to.
    pub handle_refs: Vec<Cow<'a, str>>,
    /// Routed candidate, on execution feedback and execution routing decisions only.
    pub candidate_id: Cow<'a, str>,
    /// Payload `metadata.flow_id`, empty when absent.
    pub flow_id: Cow<'a, str>,
    /// Every id link of the payload as (via, target kind, target id).
    pub links: Vec<(&'static str, &'static str, Cow<'a, str>)>,
}

/// The string at `key` of a JSON object, or "".
fn s<'a>(v: &'a Value, key: &str) -> Cow<'a, str> {
    Cow::Borrowed(v.get(key).and_then(Value::as_str).unwrap_or_default())
}

/// Every payload-derived column of an event of `kind`. `links` are the payload's links as
/// `weft_schemas::links::extract(kind, payload)` gives them (the decoder computes them once
/// per fact, for this row and for the narratives).
pub fn typed_columns<'a>(kind: Kind, p: &'a Value, links: &'a [Link]) -> TypedColumns<'a> {
    // On feedback, decision_id is the routing decision: kept in the links, not here, so
    // `decision_id` always means an authorization decision.
    let decision_id = match kind {
        Kind::TraceEvent | Kind::PolicyDecision => s(p, "decision_id"),
        _ => Cow::Borrowed(""),
    };
    let candidate_id = match kind {
        Kind::ExecutionFeedback => s(p, "candidate_id"),
        Kind::ExecutionRoutingDecision => p
            .get("candidate")
            .map_or(Cow::Borrowed(""), |c| s(c, "candidate_id")),
        _ => Cow::Borrowed(""),
    };
    let (frame_id, handle_id) = match kind {
        Kind::TraceEvent | Kind::Frame => (s(p, "frame_id"), s(p, "handle_id")),
        Kind::Handle => (Cow::Borrowed(""), s(p, "handle_id")),
        _ => (Cow::Borrowed(""), Cow::Borrowed("")),
    };
    let handle_refs = p
        .get("handle_refs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(Cow::Borrowed)
                .collect()
        })
        .unwrap_or_default();
    TypedColumns {
        event_type: s(p, "event_type"),
        principal: s(p, "principal"),
        capability_id: s(p, "capability_id"),
        decision: s(p, "decision"),
        outcome: s(p, "outcome"),
        token_id: s(p, "token_id"),
        decision_id,
        frame_id,
        handle_id,
        handle_refs,
        candidate_id,
        flow_id: p
            .get("metadata")
            .map_or(Cow::Borrowed(""), |m| s(m, "flow_id")),
        links: links
            .iter()
            .map(|l| {
                (
                    l.via.as_str(),
                    l.to_kind.as_str(),
                    Cow::Borrowed(l.to_id.as_str()),
                )
            })
            .collect(),
    }
}

impl TypedColumns<'_> {
    /// The string columns [`StoredColumns`] packs, in its order.
    fn packed(&self) -> [&str; PACKED] {
        [
            &self.event_type,
            &self.principal,
            &self.capability_id,
            &self.decision,
            &self.outcome,
            &self.token_id,
            &self.decision_id,
            &self.frame_id,
            &self.handle_id,
            &self.candidate_id,
            &self.flow_id,
        ]
        .map(|c| c.as_ref())
    }

    /// The columns whose value in `stored` (the columns as read back, one JSON object keyed
    /// by column name) differs from these, in column order. A column missing from `stored`
    /// counts as different.
    pub fn differences(&self, stored: &Value) -> Vec<&'static str> {
        let want = serde_json::to_value(self).unwrap_or(Value::Null);
        TypedColumns::COLUMN_NAMES
            .iter()
            .copied()
            .filter(|c| want.get(c) != stored.get(c))
            .collect()
    }
}

/// The string columns of [`TypedColumns`] but `handle_refs` and `links`, in field order.
const PACKED: usize = 11;

/// [`TypedColumns`] as a [`Fact`] holds them while it waits for its flush: the eleven string
/// columns end to end in one allocation, the handle refs apart (most events have none), and
/// the links not at all ([`Fact::links`] has them). A fact held them as `TypedColumns`
/// before: each non-empty string its own allocation, eleven `Cow`s inline and every link
/// twice, a third of a decoded fact's ~1,600 bytes (docs/BENCHMARKS.md, session 17).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredColumns {
    text: Box<str>,
    /// Where each packed column ends in `text`. A record's value is at most 2 GiB (Kafka
    /// sizes are `i32`), so a `u32` holds any offset into what it was decoded from.
    ends: [u32; PACKED],
    handle_refs: Box<[Box<str>]>,
}

impl StoredColumns {
    /// Pack `t` (its `links` excepted).
    pub fn new(t: &TypedColumns<'_>) -> Self {
        let columns = t.packed();
        let mut text = String::with_capacity(columns.iter().map(|c| c.len()).sum());
        let mut ends = [0u32; PACKED];
        for (end, c) in ends.iter_mut().zip(columns) {
            text.push_str(c);
            *end = text.len() as u32;
        }
        Self {
            text: text.into_boxed_str(),
            ends,
            handle_refs: t.handle_refs.iter().map(|r| r.as_ref().into()).collect(),
        }
    }

    /// The `i`-th packed column.
    fn at(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.text
            .get(start..self.ends[i] as usize)
            .unwrap_or_default()
    }

    /// Payload `handle_refs`.
    pub fn handle_refs(&self) -> &[Box<str>] {
        &self.handle_refs
    }
}

/// The table of [`FloorRow`]s (migration 0015).
pub const INGEST_FLOOR: &str = "weft_ingest_floor";

/// A row of `weft_ingest_floor`: every record of a source partition up to `offset` is done
/// (stored, dead-lettered, or deleted by retention after it was stored), so ingest resumes
/// after it even where `weft_events` holds no row that far. Readers take the highest.
#[derive(Debug, Clone, Row, Serialize, serde::Deserialize)]
pub struct FloorRow {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: u32,
    /// The partition's last offset done.
    pub offset: u64,
}

/// One row of `weft_events`, as ingest writes it (every column but the MATERIALIZED ones).
/// It borrows every string from the [`Fact`] it describes (and the partition's topic), so
/// building a batch copies no payloads.
#[derive(Debug, Clone, Row, Serialize)]
pub struct EventRow<'a> {
    /// Tenant from the envelope; every audit query is scoped by it.
    pub tenant: &'a str,
    /// Event kind (`trace_event`, `policy_decision`...); part of the identity and the sort key.
    pub kind: &'static str,
    /// Natural identity of the event (see `weft_schemas::identity`).
    pub id: &'a str,
    /// SHA-256 of the canonical payload; tells copies from conflicting content.
    pub content_hash: [u8; 32],
    /// The event's own time (micros); the time range audit queries filter on.
    pub ts: i64,
    /// Request the event belongs to, empty when it carries none; groups narratives.
    pub request_id: &'a str,
    /// Process that emitted the event (the publisher sets it), empty when unknown.
    pub producer_id: &'a str,
    /// Per-producer sequence number (the publisher sets it), 0 when unknown.
    pub seq: u64,
    /// When the event entered weft (micros).
    pub emitted_at: i64,
    /// When ingest stored the batch (micros); one value per batch, so one table partition.
    pub ingested_at: i64,
    /// See [`TypedColumns::event_type`].
    pub event_type: &'a str,
    /// See [`TypedColumns::principal`].
    pub principal: &'a str,
    /// See [`TypedColumns::capability_id`].
    pub capability_id: &'a str,
    /// See [`TypedColumns::decision`].
    pub decision: &'a str,
    /// See [`TypedColumns::outcome`].
    pub outcome: &'a str,
    /// See [`TypedColumns::token_id`].
    pub token_id: &'a str,
    /// See [`TypedColumns::decision_id`].
    pub decision_id: &'a str,
    /// See [`TypedColumns::frame_id`].
    pub frame_id: &'a str,
    /// See [`TypedColumns::handle_id`].
    pub handle_id: &'a str,
    /// See [`TypedColumns::handle_refs`].
    pub handle_refs: &'a [Box<str>],
    /// See [`TypedColumns::candidate_id`].
    pub candidate_id: &'a str,
    /// See [`TypedColumns::flow_id`].
    pub flow_id: &'a str,
    /// See [`TypedColumns::links`]; serialized as its (via, target kind, target id) tuples.
    #[serde(serialize_with = "link_tuples")]
    pub links: &'a [Link],
    /// 1 when this identity was seen before with different content.
    pub conflict: u8,
    /// Source topic, for exactly-once progress.
    pub topic: &'a str,
    /// Source partition; the `progress` projection keeps its highest offset.
    pub partition: u32,
    /// Source offset; ingest resumes after the highest one stored.
    pub offset: u64,
    /// Wire encoding the record arrived in.
    pub content_type: &'static str,
    /// The producer's exact payload JSON text.
    pub payload: &'a str,
}

/// Links as the `links` column holds them: (via, target kind, target id).
fn link_tuples<S: serde::Serializer>(links: &&[Link], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(
        links
            .iter()
            .map(|l| (l.via.as_str(), l.to_kind.as_str(), l.to_id.as_str())),
    )
}

impl<'a> EventRow<'a> {
    /// Build the row for a fact read at `topic/partition/offset`.
    pub fn new(
        f: &'a Fact,
        topic: &'a str,
        partition: i32,
        offset: i64,
        ingested_at: i64,
        conflict: bool,
    ) -> Self {
        let kind = f.envelope.kind;
        let [event_type, principal, capability_id, decision, outcome, token_id, decision_id, frame_id, handle_id, candidate_id, flow_id] =
            std::array::from_fn(|i| f.typed.at(i));
        EventRow {
            tenant: &f.envelope.tenant,
            kind: kind.as_str(),
            id: &f.id,
            content_hash: f.content_hash,
            ts: f.ts_micros,
            request_id: f.envelope.request_id.as_deref().unwrap_or_default(),
            producer_id: f.envelope.producer_id.as_deref().unwrap_or_default(),
            seq: f.envelope.seq.unwrap_or(0),
            emitted_at: f.emitted_micros,
            ingested_at,
            event_type,
            principal,
            capability_id,
            decision,
            outcome,
            token_id,
            decision_id,
            frame_id,
            handle_id,
            handle_refs: f.typed.handle_refs(),
            candidate_id,
            flow_id,
            links: &f.links,
            conflict: u8::from(conflict),
            topic,
            partition: partition as u32,
            offset: offset as u64,
            content_type: f.content_type.as_str(),
            payload: f.envelope.payload.get(),
        }
    }
}
