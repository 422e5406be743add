//! The envelope: the unit that travels through weft.
//!
//! On Kafka the envelope is split the way Kafka tools expect: the record *value* is the bare
//! contract payload (JSON, or Avro in one of two framings), the *key* is the request id, and
//! the envelope's metadata rides in *headers* (see [`crate::wire`]). Keeping the value a pure
//! contract means ClickHouse's `AvroConfluent`, Kafka Connect and Java consumers can read the
//! topics without knowing about weft.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::identity::{self, IdentityError, MAX_ID_BYTES};
use crate::links::Link;
use crate::validate::{Validator, Violation};
use crate::Kind;

/// The tenant used when an envelope names none.
pub const DEFAULT_TENANT: &str = "default";

fn default_tenant() -> String {
    DEFAULT_TENANT.to_owned()
}

/// One event with its routing metadata. The payload is kept as the producer's exact JSON
/// text (`RawValue`), so what is published is byte-for-byte what was submitted.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// Which contract the payload is; picks the schema, the topic and the id field.
    pub kind: Kind,
    /// Groups the events of one agent request into one narrative; also the Kafka key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Whose event this is; [`DEFAULT_TENANT`] when absent.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// Set by the publisher when absent: which process emitted the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_id: Option<String>,
    /// Set by the publisher when absent: per-producer sequence number, strictly increasing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Set by the publisher when absent: RFC 3339 time the event entered weft.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emitted_at: Option<String>,
    /// The contract document itself, as the producer's exact JSON text.
    pub payload: Box<RawValue>,
}

/// Why an envelope is not acceptable. Each variant is a distinct, reportable reason.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// The payload text does not parse as JSON.
    #[error("payload is not valid JSON: {0}")]
    PayloadJson(serde_json::Error),
    /// A key appears twice in one object of the payload (at any depth): weft and ClickHouse
    /// would read different values, so such a payload is refused everywhere.
    #[error("payload has a {0}")]
    DuplicateKey(String),
    /// The payload parses but is not a JSON object.
    #[error("payload must be a JSON object")]
    PayloadNotObject,
    /// The payload fails its kind's weaver-spec JSON Schema.
    #[error("payload is not a valid {kind}: {}", first(.violations))]
    Schema {
        /// The kind whose schema was applied.
        kind: Kind,
        /// Every schema violation found.
        violations: Vec<Violation>,
    },
    /// The payload's natural id could not be derived.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The tenant is not 1..=128 characters of `[A-Za-z0-9_.-]`.
    #[error("tenant must be 1..=128 characters of [A-Za-z0-9_.-]")]
    BadTenant,
    /// The identity, the request id or an id the payload links to is over
    /// [`MAX_ID_BYTES`].
    #[error("{field} is {len} bytes long; weft takes ids of at most {MAX_ID_BYTES} bytes")]
    IdTooLong {
        /// Which id: `identity`, `request_id`, `producer_id`, `emitted_at`, or the payload
        /// field of a link.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
    },
}

impl EnvelopeError {
    /// The stable reason code: a gateway answer's `code`, a dead letter's reason.
    pub fn code(&self) -> &'static str {
        match self {
            EnvelopeError::PayloadJson(_) | EnvelopeError::PayloadNotObject => "undecodable_json",
            EnvelopeError::DuplicateKey(_) => "duplicate_key",
            EnvelopeError::Schema { .. } => "schema_invalid",
            EnvelopeError::Identity(_) => "no_identity",
            EnvelopeError::BadTenant => "bad_tenant",
            EnvelopeError::IdTooLong { .. } => "id_too_long",
        }
    }
}

fn first(v: &[Violation]) -> String {
    match v {
        [] => String::new(),
        [one] => one.to_string(),
        [one, rest @ ..] => format!("{one} (and {} more)", rest.len()),
    }
}

/// `true` for a tenant name weft accepts: short, and safe in paths, headers and metrics.
pub fn is_valid_tenant(t: &str) -> bool {
    (1..=128).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl Envelope {
    /// Wrap a serializable payload.
    pub fn new(kind: Kind, payload: &impl Serialize) -> Result<Self, serde_json::Error> {
        Ok(Self {
            kind,
            request_id: None,
            tenant: default_tenant(),
            producer_id: None,
            seq: None,
            emitted_at: None,
            payload: serde_json::value::to_raw_value(payload)?,
        })
    }

    /// Builder-style request id.
    pub fn with_request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// Builder-style tenant.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = tenant.into();
        self
    }

    /// The payload parsed as a JSON value; a key twice in one object is an error
    /// ([`crate::strict`]).
    pub fn payload_value(&self) -> Result<Value, EnvelopeError> {
        crate::strict::parse(self.payload.get()).map_err(|e| match e {
            crate::strict::StrictError::DuplicateKey { pointer } => {
                EnvelopeError::DuplicateKey(format!("duplicate key at {pointer}"))
            }
            crate::strict::StrictError::Json(e) => EnvelopeError::PayloadJson(e),
        })
    }

    /// Check the tenant and the payload against its schema; on success return the parsed
    /// payload and its natural identity, which every later stage needs.
    pub fn validate(&self) -> Result<(Value, String), EnvelopeError> {
        let payload = self.check()?;
        let id = identity::identity(self.kind, &payload)?;
        self.check_ids(&id, &crate::links::extract(self.kind, &payload))?;
        Ok((payload, id))
    }

    /// Refuse an envelope whose identity `id`, request id, producer id, `emitted_at` (these
    /// two come from record headers, which have no other bound) or link targets `links` (as
    /// [`crate::links::extract`] gives them) are over [`MAX_ID_BYTES`]. Every edge refuses
    /// them alike (the publishers answer `id_too_long`, ingest dead-letters the record):
    /// ingest looks ids up in ClickHouse by the thousand in one query parameter, and the
    /// HTTP APIs take none longer, so such an event could be neither chained nor read back.
    pub fn check_ids(&self, id: &str, links: &[Link]) -> Result<(), EnvelopeError> {
        let ids = [
            ("identity", id),
            ("request_id", self.request_id.as_deref().unwrap_or("")),
            ("producer_id", self.producer_id.as_deref().unwrap_or("")),
            ("emitted_at", self.emitted_at.as_deref().unwrap_or("")),
        ]
        .into_iter()
        .chain(links.iter().map(|l| (l.via.as_str(), l.to_id.as_str())));
        for (field, value) in ids {
            if value.len() > MAX_ID_BYTES {
                return Err(EnvelopeError::IdTooLong {
                    field,
                    len: value.len(),
                });
            }
        }
        Ok(())
    }

    /// [`Envelope::validate`] without the identity, for a caller that derives it from a
    /// canonical form it computes anyway (ingest hashes every payload), so an
    /// ExecutionFeedback's payload is not canonicalized twice.
    pub fn check(&self) -> Result<Value, EnvelopeError> {
        if !is_valid_tenant(&self.tenant) {
            return Err(EnvelopeError::BadTenant);
        }
        let payload = self.payload_value()?;
        if !payload.is_object() {
            return Err(EnvelopeError::PayloadNotObject);
        }
        // The cheap yes/no first; the full report only for a payload that fails.
        let validator = Validator::global();
        let schema = self.kind.schema_name();
        if !validator.is_valid(schema, &payload).unwrap_or(true) {
            return Err(EnvelopeError::Schema {
                kind: self.kind,
                violations: validator.check(schema, &payload).unwrap_or_default(),
            });
        }
        Ok(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_minimal_envelope_with_defaults_and_keeps_payload_bytes() {
        let text = r#"{"kind":"trace_event","payload":{"event_type":"flow_started","event_id":"e1",  "timestamp":"2026-01-01T00:00:00Z","x_acme_k":[1,2]}}"#;
        let env: Envelope = serde_json::from_str(text).unwrap();
        assert_eq!(env.tenant, DEFAULT_TENANT);
        assert_eq!(
            env.payload.get(),
            r#"{"event_type":"flow_started","event_id":"e1",  "timestamp":"2026-01-01T00:00:00Z","x_acme_k":[1,2]}"#
        );
        let (_, id) = env.validate().unwrap();
        assert_eq!(id, "e1");
    }

    #[test]
    fn rejects_unknown_kind_unknown_keys_and_bad_payloads() {
        let e =
            serde_json::from_str::<Envelope>(r#"{"kind":"tracevent","payload":{}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant `tracevent`"), "{e}");
        assert!(serde_json::from_str::<Envelope>(
            r#"{"kind":"frame","requestId":"r","payload":{}}"#
        )
        .is_err());
        let env: Envelope =
            serde_json::from_str(r#"{"kind":"frame","payload":{"frame_id":"f"}}"#).unwrap();
        match env.validate() {
            Err(EnvelopeError::Schema { violations, .. }) => {
                assert!(violations.iter().any(|v| v.keyword == "required"))
            }
            other => panic!("expected schema error, got {other:?}"),
        }
        let env: Envelope =
            serde_json::from_str(r#"{"kind":"frame","tenant":"a b","payload":{}}"#).unwrap();
        assert!(matches!(env.validate(), Err(EnvelopeError::BadTenant)));
    }
}
