//! Natural identities and content hashes.
//!
//! Identity answers "is this the same event?" (deduplication, narrative links); the content
//! hash answers "is it the same bytes of meaning?" (conflict detection, the audit hash chain).
//! Both hash the RFC 8785 (JCS) canonical form, so key order and whitespace never matter.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::Kind;

/// Why an identity could not be derived.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The payload lacks its kind's id field, or it is not a string.
    #[error("payload has no string `{field}` (the identity of a {kind})")]
    MissingId {
        /// The payload's kind.
        kind: Kind,
        /// The id field that kind needs (see [`Kind::id_field`]).
        field: &'static str,
    },
    /// The payload could not be turned into RFC 8785 canonical JSON for hashing.
    #[error("payload cannot be canonicalized: {0}")]
    Canonical(#[from] serde_json::Error),
}

/// The RFC 8785 canonical JSON text of a value.
pub fn canonical_json(value: &Value) -> Result<Vec<u8>, serde_json::Error> {
    serde_jcs::to_vec(value)
}

/// Lower-case hex SHA-256 of the canonical JSON.
pub fn content_hash(value: &Value) -> Result<String, serde_json::Error> {
    Ok(hex::encode(Sha256::digest(canonical_json(value)?)))
}

/// The natural identity of a payload of `kind`: its id field, or for ExecutionFeedback
/// `jcs-sha256:<hex>` of its canonical JSON.
pub fn identity(kind: Kind, payload: &Value) -> Result<String, IdentityError> {
    match kind.id_field() {
        Some(field) => payload
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or(IdentityError::MissingId { kind, field }),
        None => Ok(format!("jcs-sha256:{}", content_hash(payload)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn feedback_identity_ignores_key_order_and_whitespace() {
        let a: Value = serde_json::from_str(
            r#"{"decision_id":"d","candidate_id":"c","success":true,"timestamp":"2026-01-01T00:00:00Z"}"#,
        )
        .unwrap();
        let b: Value = serde_json::from_str(
            r#"{ "timestamp":"2026-01-01T00:00:00Z", "success":true,"candidate_id":"c","decision_id":"d" }"#,
        )
        .unwrap();
        let ia = identity(Kind::ExecutionFeedback, &a).unwrap();
        assert!(ia.starts_with("jcs-sha256:"));
        assert_eq!(ia, identity(Kind::ExecutionFeedback, &b).unwrap());
        let c = json!({"decision_id":"d","candidate_id":"c","success":false,"timestamp":"2026-01-01T00:00:00Z"});
        assert_ne!(ia, identity(Kind::ExecutionFeedback, &c).unwrap());
    }

    #[test]
    fn id_kinds_use_their_field() {
        let te = json!({"event_id": "te-1", "event_type": "flow_started", "timestamp": "2026-01-01T00:00:00Z"});
        assert_eq!(identity(Kind::TraceEvent, &te).unwrap(), "te-1");
        assert!(matches!(
            identity(Kind::Frame, &te),
            Err(IdentityError::MissingId {
                field: "frame_id",
                ..
            })
        ));
    }

    #[test]
    fn canonical_form_sorts_keys() {
        let v = json!({"b": 1, "a": [true, null, "x"]});
        assert_eq!(
            canonical_json(&v).unwrap(),
            br#"{"a":[true,null,"x"],"b":1}"#
        );
    }
}
