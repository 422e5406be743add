//! How an [`Envelope`] maps onto a Kafka record, and back.
//!
//! - key: the request id (or, without one, the event's identity), so one request's events
//!   stay ordered within a partition;
//! - value: the bare payload, as JSON text or Avro (single-object or Confluent framing);
//! - headers: the envelope metadata plus `content-type`.
//!
//! Decoding is strict and every failure is a distinct [`WireError`], because the consumer
//! turns each one into a dead-letter reason.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::avro::{AvroError, AvroSchemas};
use crate::{Envelope, Kind};

/// Kafka header names. Lower-case, `weft-` prefixed, stable: dashboards and DLQ tools read them.
pub mod header {
    /// The envelope's kind (always sent).
    pub const KIND: &str = "weft-kind";
    /// The envelope's tenant (always sent).
    pub const TENANT: &str = "weft-tenant";
    /// The envelope's request id; absent when it has none.
    pub const REQUEST_ID: &str = "weft-request-id";
    /// The emitting process; absent when unset.
    pub const PRODUCER_ID: &str = "weft-producer-id";
    /// The per-producer sequence number, in decimal; absent when unset.
    pub const SEQ: &str = "weft-seq";
    /// RFC 3339 time the event entered weft; absent when unset.
    pub const EMITTED_AT: &str = "weft-emitted-at";
    /// How the value is encoded ([`ContentType::as_str`](super::ContentType::as_str)).
    pub const CONTENT_TYPE: &str = "content-type";
}

/// How the record value is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ContentType {
    /// The payload's JSON text, byte-for-byte as submitted. What the Python siblings send.
    #[default]
    Json,
    /// Avro single-object encoding: `C3 01` + CRC-64-AVRO fingerprint + datum. No registry.
    AvroSingleObject,
    /// Confluent wire format: `00` + 4-byte big-endian schema id + datum. Needs a registry.
    AvroConfluent,
}

impl ContentType {
    /// The `content-type` header value for this encoding.
    pub fn as_str(self) -> &'static str {
        match self {
            ContentType::Json => "application/json",
            ContentType::AvroSingleObject => "application/avro; framing=single-object",
            ContentType::AvroConfluent => "application/avro; framing=confluent",
        }
    }

    /// Read a `content-type` header value back; `None` for one weft does not write.
    pub fn parse(s: &str) -> Option<Self> {
        [
            ContentType::Json,
            ContentType::AvroSingleObject,
            ContentType::AvroConfluent,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }

    /// Guess from the first bytes when a record has no content-type header.
    pub fn sniff(value: &[u8]) -> Option<Self> {
        match value {
            [0xC3, 0x01, ..] => Some(ContentType::AvroSingleObject),
            [0x00, ..] => Some(ContentType::AvroConfluent),
            [b'{', ..] | [b' ' | b'\n' | b'\r' | b'\t', ..] => Some(ContentType::Json),
            _ => None,
        }
    }
}

/// Confluent schema ids known to this process (filled from a schema registry).
#[derive(Debug, Clone, Default)]
pub struct SchemaIds {
    by_kind: BTreeMap<Kind, u32>,
    by_id: BTreeMap<u32, Kind>,
}

impl SchemaIds {
    /// Record the id the registry gave `kind`'s schema.
    pub fn insert(&mut self, kind: Kind, id: u32) {
        self.by_kind.insert(kind, id);
        self.by_id.insert(id, kind);
    }
    /// The schema id to frame `kind`'s records with, if registered.
    pub fn id_of(&self, kind: Kind) -> Option<u32> {
        self.by_kind.get(&kind).copied()
    }
    /// The kind a framed record's schema id stands for, if known.
    pub fn kind_of(&self, id: u32) -> Option<Kind> {
        self.by_id.get(&id).copied()
    }
}

/// Why a record cannot be turned into an envelope (each is a dead-letter reason).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// No `weft-kind` header, and neither the topic nor the value reveals the kind.
    #[error("record has no weft-kind header and its kind cannot be inferred")]
    MissingKind,
    /// The `weft-kind` header names no kind weft knows.
    #[error(transparent)]
    UnknownKind(#[from] crate::kind::UnknownKind),
    /// A header is not UTF-8 or its value does not parse; holds the header name.
    #[error("header `{0}` is not valid UTF-8 or has a bad value")]
    BadHeader(&'static str),
    /// The `content-type` header is not one weft writes.
    #[error("unknown content-type `{0}`")]
    UnknownContentType(String),
    /// The record has no value bytes.
    #[error("empty record value")]
    Empty,
    /// Without a `content-type` header, the value's first bytes match no encoding.
    #[error("value is neither JSON nor a known Avro framing")]
    Unrecognized,
    /// A JSON value does not parse.
    #[error("value is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// An Avro single-object record names a schema fingerprint weft does not have.
    #[error("single-object fingerprint matches no known schema")]
    UnknownFingerprint,
    /// A Confluent-framed record names a schema id this process does not know.
    #[error("confluent schema id {0} is not registered")]
    UnknownSchemaId(u32),
    /// Schema and `weft-kind` header disagree; holds (schema id or 0, schema kind, header kind).
    #[error("confluent schema id {0} is for {1}, but the record says {2}")]
    KindMismatch(u32, Kind, Kind),
    /// The Avro framing is shorter than its header.
    #[error("avro framing is truncated")]
    Truncated,
    /// Encoding with Confluent framing, but no schema id is known for the kind.
    #[error("no confluent schema id is known for {0}; configure a schema registry")]
    NoSchemaId(Kind),
    /// The Avro datum could not be encoded or decoded.
    #[error(transparent)]
    Avro(#[from] AvroError),
}

/// The short, stable code of a wire error, used as the DLQ `weft-dlq-reason` and a metric label.
impl WireError {
    /// This error's reason code, e.g. `unknown_kind`.
    pub fn code(&self) -> &'static str {
        match self {
            WireError::MissingKind | WireError::UnknownKind(_) => "unknown_kind",
            WireError::BadHeader(_) | WireError::UnknownContentType(_) => "bad_header",
            WireError::Empty | WireError::Unrecognized => "undecodable",
            WireError::Json(_) => "undecodable_json",
            WireError::UnknownFingerprint
            | WireError::UnknownSchemaId(_)
            | WireError::KindMismatch(..)
            | WireError::NoSchemaId(_) => "unknown_schema",
            WireError::Avro(AvroError::JsonText {
                source: crate::strict::StrictError::DuplicateKey { .. },
                ..
            }) => "duplicate_key",
            WireError::Truncated | WireError::Avro(_) => "undecodable_avro",
        }
    }
}

/// The record value for an envelope in the given content type.
pub fn encode_value(
    env: &Envelope,
    content_type: ContentType,
    ids: &SchemaIds,
) -> Result<Vec<u8>, WireError> {
    match content_type {
        ContentType::Json => Ok(env.payload.get().as_bytes().to_vec()),
        _ => {
            let payload: Value = serde_json::from_str(env.payload.get())?;
            encode_value_parsed(env, &payload, content_type, ids)
        }
    }
}

/// [`encode_value`] for a payload the caller has already parsed (the Publisher has, to
/// validate it), so Avro does not parse it a second time. `payload` must be `env.payload`
/// parsed; for JSON it is not used (the value is the submitted text).
pub fn encode_value_parsed(
    env: &Envelope,
    payload: &Value,
    content_type: ContentType,
    ids: &SchemaIds,
) -> Result<Vec<u8>, WireError> {
    let avro = AvroSchemas::global();
    match content_type {
        ContentType::Json => Ok(env.payload.get().as_bytes().to_vec()),
        ContentType::AvroSingleObject => {
            let mut out = avro.get(env.kind).single_object_header.to_vec();
            out.extend(avro.encode_datum(env.kind, payload)?);
            Ok(out)
        }
        ContentType::AvroConfluent => {
            let id = ids.id_of(env.kind).ok_or(WireError::NoSchemaId(env.kind))?;
            let mut out = vec![0u8];
            out.extend(id.to_be_bytes());
            out.extend(avro.encode_datum(env.kind, payload)?);
            Ok(out)
        }
    }
}

/// The headers for an envelope. Absent optional fields produce no header.
pub fn encode_headers(env: &Envelope, content_type: ContentType) -> Vec<(&'static str, String)> {
    let mut h = Vec::with_capacity(7);
    for_each_header(env, content_type, |k, v| {
        h.push((k, String::from_utf8_lossy(v).into_owned()))
    });
    h
}

/// The headers of [`encode_headers`], in the same order, lent one by one instead of
/// allocated: the Publisher's hot path hands them straight to the Kafka client.
pub fn for_each_header(
    env: &Envelope,
    content_type: ContentType,
    mut f: impl FnMut(&'static str, &[u8]),
) {
    f(header::KIND, env.kind.as_str().as_bytes());
    f(header::TENANT, env.tenant.as_bytes());
    f(header::CONTENT_TYPE, content_type.as_str().as_bytes());
    if let Some(r) = &env.request_id {
        f(header::REQUEST_ID, r.as_bytes());
    }
    if let Some(p) = &env.producer_id {
        f(header::PRODUCER_ID, p.as_bytes());
    }
    if let Some(s) = env.seq {
        let mut buf = [0u8; 20];
        f(header::SEQ, decimal(s, &mut buf));
    }
    if let Some(t) = &env.emitted_at {
        f(header::EMITTED_AT, t.as_bytes());
    }
}

/// `n` in decimal ASCII, written at the end of `buf` (20 digits hold any u64).
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// The tenant of a record as [`decode`] reads it (the last `weft-tenant` header, else the
/// default tenant), from the headers alone, so a consumer can pass over another tenant's
/// record before decoding its value. `None` when that header is not UTF-8 ([`decode`]
/// refuses such a record).
pub fn tenant_of<'a>(headers: &[(&str, &'a [u8])]) -> Option<&'a str> {
    match headers.iter().rev().find(|(k, _)| *k == header::TENANT) {
        Some((_, v)) => std::str::from_utf8(v).ok(),
        None => Some(crate::DEFAULT_TENANT),
    }
}

/// Rebuild the envelope from a record's headers and value. `topic_kind` is the kind implied
/// by the topic, used only when neither header nor framing names one.
pub fn decode(
    headers: &[(&str, &[u8])],
    value: &[u8],
    topic_kind: Option<Kind>,
    ids: &SchemaIds,
) -> Result<(Envelope, ContentType), WireError> {
    let get = |name: &'static str| -> Result<Option<String>, WireError> {
        headers
            .iter()
            .rev()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| {
                std::str::from_utf8(v)
                    .map(str::to_owned)
                    .map_err(|_| WireError::BadHeader(name))
            })
            .transpose()
    };
    if value.is_empty() {
        return Err(WireError::Empty);
    }
    let content_type = match get(header::CONTENT_TYPE)? {
        Some(ct) => ContentType::parse(&ct).ok_or(WireError::UnknownContentType(ct))?,
        None => ContentType::sniff(value).ok_or(WireError::Unrecognized)?,
    };
    let header_kind = get(header::KIND)?.map(|k| k.parse::<Kind>()).transpose()?;
    let avro = AvroSchemas::global();
    let (kind, payload) = match content_type {
        ContentType::Json => {
            let kind = header_kind.or(topic_kind).ok_or(WireError::MissingKind)?;
            let text = std::str::from_utf8(value).map_err(|_| WireError::Unrecognized)?;
            // One parse both checks the JSON and keeps the producer's exact text (without
            // surrounding whitespace).
            let raw: Box<RawValue> = serde_json::from_str(text)?;
            (kind, raw)
        }
        ContentType::AvroSingleObject => {
            let ks = avro
                .by_single_object_header(value)
                .ok_or(WireError::UnknownFingerprint)?;
            if let Some(h) = header_kind.filter(|h| *h != ks.kind) {
                return Err(WireError::KindMismatch(0, ks.kind, h));
            }
            let payload = avro.decode_datum(ks.kind, &value[10..])?;
            (ks.kind, serde_json::value::to_raw_value(&payload)?)
        }
        ContentType::AvroConfluent => {
            let id_bytes: [u8; 4] = value
                .get(1..5)
                .and_then(|b| b.try_into().ok())
                .ok_or(WireError::Truncated)?;
            let id = u32::from_be_bytes(id_bytes);
            let kind = ids.kind_of(id).ok_or(WireError::UnknownSchemaId(id))?;
            if let Some(h) = header_kind.filter(|h| *h != kind) {
                return Err(WireError::KindMismatch(id, kind, h));
            }
            let payload = avro.decode_datum(kind, &value[5..])?;
            (kind, serde_json::value::to_raw_value(&payload)?)
        }
    };
    let seq = get(header::SEQ)?
        .map(|s| {
            s.parse::<u64>()
                .map_err(|_| WireError::BadHeader(header::SEQ))
        })
        .transpose()?;
    let env = Envelope {
        kind,
        request_id: get(header::REQUEST_ID)?,
        tenant: get(header::TENANT)?.unwrap_or_else(|| crate::DEFAULT_TENANT.to_owned()),
        producer_id: get(header::PRODUCER_ID)?,
        seq,
        emitted_at: get(header::EMITTED_AT)?,
        payload,
    };
    Ok((env, content_type))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope {
        let mut e: Envelope = serde_json::from_str(
            r#"{"kind":"trace_event","request_id":"req-1","tenant":"acme","producer_id":"p1","seq":7,
                "emitted_at":"2026-01-01T00:00:00.000001Z",
                "payload":{"event_id":"e","event_type":"flow_started","timestamp":"2026-01-01T00:00:00Z",
                           "frame_id":null,"metadata":{"flow_id":"f1"},"x_acme_k":1.5}}"#,
        )
        .unwrap();
        e.seq = Some(7);
        e
    }

    fn round_trip(ct: ContentType, ids: &SchemaIds) -> Envelope {
        let env = sample();
        let value = encode_value(&env, ct, ids).unwrap();
        let hdrs = encode_headers(&env, ct);
        let borrowed: Vec<(&str, &[u8])> = hdrs.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        let (back, got_ct) = decode(&borrowed, &value, None, ids).unwrap();
        assert_eq!(got_ct, ct);
        assert_eq!(back.kind, env.kind);
        assert_eq!(back.request_id, env.request_id);
        assert_eq!(back.tenant, env.tenant);
        assert_eq!(back.producer_id, env.producer_id);
        assert_eq!(back.seq, env.seq);
        assert_eq!(back.emitted_at, env.emitted_at);
        let a: Value = serde_json::from_str(env.payload.get()).unwrap();
        let b: Value = serde_json::from_str(back.payload.get()).unwrap();
        assert_eq!(a, b);
        back
    }

    #[test]
    fn the_tenant_is_read_from_the_headers_as_decode_reads_it() {
        let env = sample();
        let value = encode_value(&env, ContentType::Json, &SchemaIds::default()).unwrap();
        let hdrs = encode_headers(&env, ContentType::Json);
        let mut borrowed: Vec<(&str, &[u8])> =
            hdrs.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        let decoded = |h: &[(&str, &[u8])]| {
            decode(h, &value, None, &SchemaIds::default()).map(|(e, _)| e.tenant)
        };
        assert_eq!(tenant_of(&borrowed), Some("acme"));
        // A repeated header: the last one wins, on both paths.
        borrowed.push((header::TENANT, b"other"));
        assert_eq!(tenant_of(&borrowed), Some("other"));
        assert_eq!(decoded(&borrowed).unwrap(), "other");
        // None at all: the default tenant.
        borrowed.retain(|(k, _)| *k != header::TENANT);
        assert_eq!(tenant_of(&borrowed), Some(crate::DEFAULT_TENANT));
        assert_eq!(decoded(&borrowed).unwrap(), crate::DEFAULT_TENANT);
        // Not UTF-8: no tenant, and decode refuses the record.
        borrowed.push((header::TENANT, b"\xff"));
        assert_eq!(tenant_of(&borrowed), None);
        assert!(decoded(&borrowed).is_err());
    }

    #[test]
    fn lent_headers_match_the_allocated_ones() {
        let mut env = sample();
        for seq in [0, 7, 10, 99, 18_446_744_073_709_551_615] {
            env.seq = Some(seq);
            let mut lent = Vec::new();
            for_each_header(&env, ContentType::Json, |k, v| {
                lent.push((k, String::from_utf8(v.to_vec()).unwrap()))
            });
            assert_eq!(lent, encode_headers(&env, ContentType::Json));
            assert!(lent.contains(&(header::SEQ, seq.to_string())), "{lent:?}");
        }
        assert_eq!(encode_headers(&env, ContentType::Json).len(), 7);
        env.request_id = None;
        env.seq = None;
        let names: Vec<_> = encode_headers(&env, ContentType::AvroSingleObject)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            names,
            [
                header::KIND,
                header::TENANT,
                header::CONTENT_TYPE,
                header::PRODUCER_ID,
                header::EMITTED_AT
            ]
        );
    }

    #[test]
    fn json_is_byte_identical() {
        let back = round_trip(ContentType::Json, &SchemaIds::default());
        assert_eq!(back.payload.get(), sample().payload.get());
    }

    #[test]
    fn avro_framings_round_trip() {
        round_trip(ContentType::AvroSingleObject, &SchemaIds::default());
        let mut ids = SchemaIds::default();
        ids.insert(Kind::TraceEvent, 42);
        round_trip(ContentType::AvroConfluent, &ids);
    }

    #[test]
    fn sniffing_and_errors() {
        assert_eq!(ContentType::sniff(b"{}"), Some(ContentType::Json));
        assert_eq!(
            ContentType::sniff(&[0xC3, 0x01, 0]),
            Some(ContentType::AvroSingleObject)
        );
        let ids = SchemaIds::default();
        let err = decode(&[], b"\x00\x00\x00\x00\x09xx", None, &ids).unwrap_err();
        assert!(matches!(err, WireError::UnknownSchemaId(9)));
        let err = decode(&[], b"{not json", Some(Kind::Frame), &ids).unwrap_err();
        assert_eq!(err.code(), "undecodable_json");
        let err = decode(&[], b"{}", None, &ids).unwrap_err();
        assert!(matches!(err, WireError::MissingKind));
        let err = decode(&[("weft-kind", b"bogus")], b"{}", None, &ids).unwrap_err();
        assert_eq!(err.code(), "unknown_kind");
    }
}
