//! Decode and validate one Kafka record into a [`Fact`], or say exactly why not.
//!
//! Shared by the facts writer and the narrative projector, so both make the same decision
//! about every record: what one stores, the other links; what one dead-letters, the other skips.

use serde_json::Value;
use sha2::{Digest, Sha256};
use weft_schemas::links;
use weft_schemas::wire::{self, SchemaIds};
use weft_schemas::{identity, time, Topics};
use weft_store::{typed_columns, StoredColumns};

/// A record as read from Kafka, borrowed from the consumer's message.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Source topic; tells which event kind the record should hold.
    pub topic: &'a str,
    /// Source partition, kept with the fact for exactly-once progress.
    pub partition: i32,
    /// Offset within the partition, kept with the fact for exactly-once progress.
    pub offset: i64,
    /// Kafka key: the request id or the identity.
    pub key: Option<&'a [u8]>,
    /// The encoded envelope, JSON or Avro.
    pub value: Option<&'a [u8]>,
    /// Kafka headers; the wire decoder reads the content type and kind from them.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// Broker timestamp (ms), used for ingest freshness metrics only.
    pub timestamp_ms: Option<i64>,
}

pub use weft_store::Fact;

/// Why a record cannot be ingested; becomes the dead-letter headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Stable, short: `undecodable`, `undecodable_json`, `undecodable_avro`, `unknown_kind`,
    /// `unknown_schema`, `bad_header`, `schema_invalid`, `bad_tenant`, `no_identity`,
    /// `duplicate_key`, `id_too_long`.
    pub code: &'static str,
    /// Human-readable detail for the dead-letter headers and telemetry.
    pub message: String,
}

/// Decode, validate and enrich one record.
pub fn decode(rec: &Record<'_>, topics: &Topics, ids: &SchemaIds) -> Result<Fact, Rejection> {
    decode_parsed(rec, topics, ids).map(|(fact, _)| fact)
}

/// [`decode`], with the parsed payload for a caller that inspects it once (the fact keeps
/// only its typed columns).
pub fn decode_parsed(
    rec: &Record<'_>,
    topics: &Topics,
    ids: &SchemaIds,
) -> Result<(Fact, Value), Rejection> {
    let value = rec.value.unwrap_or_default();
    let (envelope, content_type) = wire::decode(rec.headers, value, topics.kind_of(rec.topic), ids)
        .map_err(|e| Rejection {
            code: e.code(),
            message: e.to_string(),
        })?;
    let payload = envelope.check().map_err(|e| Rejection {
        code: e.code(),
        message: e.to_string(),
    })?;
    let mut canonical = Vec::with_capacity(envelope.payload.get().len());
    identity::write_canonical(&payload, &mut canonical).map_err(|e| Rejection {
        code: "undecodable_json",
        message: e.to_string(),
    })?;
    let content_hash: [u8; 32] = Sha256::digest(&canonical).into();
    // The record's CreateTime is the producer's to set: one out of range is no time.
    let broker_micros = rec.timestamp_ms.and_then(|ms| ms.checked_mul(1000));
    let emitted_micros = envelope
        .emitted_at
        .as_deref()
        .and_then(time::parse_micros)
        .or(broker_micros)
        .unwrap_or(0);
    let ts_micros = payload
        .get(envelope.kind.time_field())
        .and_then(Value::as_str)
        .and_then(time::parse_micros)
        .unwrap_or(emitted_micros);
    let links = links::extract(envelope.kind, &payload);
    // The identity of an ExecutionFeedback is its content hash: reuse the one just computed.
    let id = match envelope.kind.id_field() {
        None => format!("jcs-sha256:{}", hex::encode(content_hash)),
        Some(_) => identity::identity(envelope.kind, &payload).map_err(|e| Rejection {
            code: "no_identity",
            message: e.to_string(),
        })?,
    };
    envelope.check_ids(&id, &links).map_err(|e| Rejection {
        code: e.code(),
        message: e.to_string(),
    })?;
    let typed = StoredColumns::new(&typed_columns(envelope.kind, &payload, &links));
    let fact = Fact {
        envelope,
        typed,
        id,
        content_hash,
        ts_micros,
        emitted_micros,
        links,
        content_type,
    };
    Ok((fact, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec<'a>(topic: &'a str, value: &'a [u8], headers: &'a [(&'a str, &'a [u8])]) -> Record<'a> {
        Record {
            topic,
            partition: 0,
            offset: 0,
            key: None,
            value: Some(value),
            headers,
            timestamp_ms: Some(1_700_000_000_000),
        }
    }

    #[test]
    fn valid_event_is_enriched() {
        let t = Topics::default();
        let v = br#"{"event_id":"e1","event_type":"capability_executed","timestamp":"2026-03-08T06:00:05Z","decision_id":"pd","frame_id":"f"}"#;
        let f = decode(
            &rec("weaver.trace_events", v, &[]),
            &t,
            &SchemaIds::default(),
        )
        .unwrap();
        assert_eq!(f.id, "e1");
        assert_eq!(
            f.ts_micros,
            time::parse_micros("2026-03-08T06:00:05Z").unwrap()
        );
        assert_eq!(f.emitted_micros, 1_700_000_000_000_000);
        assert_eq!(f.links.len(), 2);
        assert_eq!(f.envelope.tenant, "default");
    }

    #[test]
    fn feedback_identity_matches_the_schemas_crate() {
        let t = Topics::default();
        let v = br#"{"decision_id":"d","candidate_id":"c","success":true,"timestamp":"2026-01-01T00:00:00Z"}"#;
        let f = decode(
            &rec("weaver.execution_feedback", v, &[]),
            &t,
            &SchemaIds::default(),
        )
        .unwrap();
        let p: Value = serde_json::from_slice(v).unwrap();
        assert_eq!(
            f.id,
            identity::identity(weft_schemas::Kind::ExecutionFeedback, &p).unwrap()
        );
    }

    /// An id over `MAX_ID_BYTES`, wherever it is, is refused with its field named; one of
    /// exactly that length is taken.
    #[test]
    fn ids_over_the_limit_are_refused_by_name() {
        let t = Topics::default();
        let ids = SchemaIds::default();
        let max = identity::MAX_ID_BYTES;
        let event = |id: &str, frame: &str| {
            format!(
                r#"{{"event_id":"{id}","event_type":"capability_executed","timestamp":"2026-03-08T06:00:05Z","frame_id":"{frame}"}}"#
            )
        };
        let (ok, long) = ("x".repeat(max), "x".repeat(max + 1));
        let header = |name: &'static str, v: &str| (name, v.to_owned());
        let rid = |v: &str| header(wire::header::REQUEST_ID, v);
        let cases = [
            (event(&long, "f"), rid(&ok), Some("identity")),
            (event("e", &long), rid(&ok), Some("frame_id")),
            (event("e", "f"), rid(&long), Some("request_id")),
            // From headers only: without a bound, a record of 1 MB of header and an empty
            // payload would count as nothing in a batch's byte budget.
            (
                event("e", "f"),
                header(wire::header::PRODUCER_ID, &long),
                Some("producer_id"),
            ),
            (
                event("e", "f"),
                header(wire::header::EMITTED_AT, &long),
                Some("emitted_at"),
            ),
            (event(&ok, &ok), rid(&ok), None),
        ];
        for (value, (name, v), refused) in cases {
            let headers = [(name, v.as_bytes())];
            let got = decode(
                &rec("weaver.trace_events", value.as_bytes(), &headers),
                &t,
                &ids,
            );
            match (got, refused) {
                (Ok(_), None) => {}
                (Err(e), Some(field)) => {
                    assert_eq!(e.code, "id_too_long", "{field}: {}", e.message);
                    assert!(e.message.starts_with(field), "{}", e.message);
                }
                (got, _) => panic!("{refused:?}: {:?}", got.map(|f| f.id.len())),
            }
        }
    }

    #[test]
    fn every_bad_input_has_a_reason_code() {
        let t = Topics::default();
        let ids = SchemaIds::default();
        type Case<'a> = (&'a str, &'a [u8], &'a [(&'a str, &'a [u8])], &'a str);
        let cases: [Case; 5] = [
            ("weaver.frames", b"\xff\xfe garbage", &[], "undecodable"),
            (
                "weaver.frames",
                br#"{"frame_id":"f"}"#,
                &[],
                "schema_invalid",
            ),
            (
                "weaver.frames",
                b"{}",
                &[("weft-kind", b"nope")],
                "unknown_kind",
            ),
            ("not.ours", b"{}", &[], "unknown_kind"),
            (
                "weaver.frames",
                &[0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 9],
                &[],
                "unknown_schema",
            ),
        ];
        for (topic, value, headers, code) in cases {
            let err = decode(&rec(topic, value, headers), &t, &ids).unwrap_err();
            assert_eq!(err.code, code, "{topic} {value:?}: {}", err.message);
        }
    }
}
