//! Natural identities and content hashes.
//!
//! Identity answers "is this the same event?" (deduplication, narrative links); the content
//! hash answers "is it the same bytes of meaning?" (conflict detection, the audit hash chain).
//! Both hash the RFC 8785 (JCS) canonical form, so key order and whitespace never matter.

use std::io::Write as _;

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
    let mut out = Vec::new();
    write_canonical(value, &mut out)?;
    Ok(out)
}

/// The RFC 8785 canonical form of `v`, appended to `out`: byte for byte what serde_jcs
/// produces, about 5x cheaper, which matters because ingest hashes every payload. serde_jcs
/// boxes a writer for every fragment and re-parses every object key to sort it; here object
/// members are sorted by their keys' UTF-16 code units (RFC 8785 section 3.2.3) up front,
/// strings and keys are escaped by serde_json (whose escaping serde_jcs uses too), and numbers,
/// the one part with its own formatting rules (ECMAScript's), are written by serde_jcs itself
/// unless they are integers a double holds exactly, whose form is their digits.
pub fn write_canonical(v: &Value, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match v {
        Value::Null | Value::Bool(_) | Value::String(_) => serde_json::to_writer(&mut *out, v),
        Value::Number(n) => {
            // An integer within ±2^53 is exactly a double, which ECMAScript prints as its
            // digits: the common number, written without serde_jcs's buffer. (serde_json
            // answers `as_i64` for every integer in that range, positive ones included.)
            const EXACT: u64 = 1 << 53;
            match n.as_i64() {
                Some(i) if i.unsigned_abs() <= EXACT => {
                    write!(out, "{i}").map_err(serde_json::Error::io)
                }
                _ => {
                    out.extend_from_slice(&serde_jcs::to_vec(v)?);
                    Ok(())
                }
            }
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out)?;
            }
            out.push(b']');
            Ok(())
        }
        // Keys in byte order are in UTF-16 order too unless one holds a character from
        // U+E000 up (a UTF-8 lead byte from 0xEE): serde_json's map usually iterates them
        // so, and then needs no sort.
        Value::Object(map)
            if map.keys().is_sorted() && map.keys().all(|k| k.bytes().all(|b| b < 0xEE)) =>
        {
            write_members(map.iter(), out)
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            write_members(members.into_iter(), out)
        }
    }
}

/// An object's members, already in RFC 8785 order, appended to `out`.
fn write_members<'a>(
    members: impl Iterator<Item = (&'a String, &'a Value)>,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    out.push(b'{');
    for (i, (key, value)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, key)?;
        out.push(b':');
        write_canonical(value, out)?;
    }
    out.push(b'}');
    Ok(())
}

/// Lower-case hex SHA-256 of the canonical JSON.
pub fn content_hash(value: &Value) -> Result<String, serde_json::Error> {
    Ok(hex::encode(Sha256::digest(canonical_json(value)?)))
}

/// The longest id weft takes, in bytes: an event's identity, a request id, a link's target,
/// an id in an API path. [`crate::Envelope::check_ids`] holds every event to it.
pub const MAX_ID_BYTES: usize = 1024;

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

    fn fast_jcs(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        write_canonical(v, &mut out).unwrap();
        out
    }

    #[test]
    fn write_canonical_is_byte_identical_to_serde_jcs() {
        let cases = [
            // Simulator payloads of several kinds.
            r#"{"event_id":"te-7-0-3","event_type":"capability_executed","timestamp":"2026-11-01T00:00:00.590013Z","capability_id":"org.weaver.search_docs","principal":"agent-session-b44b70b9","decision_id":"pd-7-0-0","frame_id":"frame-7-0-0","handle_id":"handle-7-0-0","outcome":"success","metadata":{"duration_ms":546}}"#,
            r#"{"frame_id":"frame-7-0-1","capability_id":"org.weaver.generate_code","summary":"Generated 226 lines of Python; source stored as a Handle.","structured_data":{"language":"python","lines":226},"handle_refs":["handle-7-0-1"],"created_at":"2026-11-01T00:00:01.733912Z","metadata":{"flow_id":"flow-7-0","prior_frame_id":"frame-7-0-0","step":1}}"#,
            r#"{"decision_id":"erd-7-0","candidate_id":"research_then_codegen","success":true,"timestamp":"2026-11-01T00:00:01.741122Z","latency_ms":1714,"cost":{"llm_tokens":5839,"usd":0.011678},"quality_score":0.83,"trace_ref":"chainweaver:trace_id:req-7-0","execution_summary":{"flow_name":"research_then_codegen","step_count":2}}"#,
            r#"{"token_id":"tok-7-0-0","scope":["org.weaver.search_docs"],"single_use":true,"expires_at":"2026-11-01T00:15:00.040556Z","metadata":{"session_id":"agent-session-b44b70b9"}}"#,
            // Numbers: ECMAScript forms, integers beyond 2^53, negative zero, extremes.
            r#"{"a":0,"b":-0.0,"c":1e21,"d":1e-7,"e":123456789012345678901234567890,"f":18446744073709551615,"g":-9223372036854775808,"h":0.1,"i":1.5e300,"j":5e-324,"k":9007199254740993,"l":-1.25,"m":100,"n":1e20,"o":0.000001}"#,
            // Integers at and beside ±2^53, where the digits stop being the double's form.
            r#"{"x":9007199254740992,"y":-9007199254740992,"z":9007199254740993,"w":-9007199254740993,"v":18014398509481985}"#,
            // Strings: every control character, quotes, backslash, solidus, DEL, separators.
            "{\"s\":\"\\u0000\\u0001\\u0008\\t\\n\\u000b\\f\\r\\u001f \\\"\\\\ / \u{7f} \u{2028}\u{2029} \u{e9}\u{1f600}\"}",
            // Keys whose UTF-16 order differs from their UTF-8 order, empty keys, nesting.
            "{\"\u{1f600}\":1,\"\u{e000}\":2,\"\u{ff61}\":3,\"a\":[{},[],[[null]],{\"z\":true,\"\":false}],\"\":\"\",\"\u{e9}\":4,\"A\":5,\"aa\":6,\"a\\u0000\":7}",
            "[]",
            "\"just a string\"",
            "-12.5e-3",
        ];
        for text in cases {
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                String::from_utf8(fast_jcs(&v)).unwrap(),
                String::from_utf8(serde_jcs::to_vec(&v).unwrap()).unwrap(),
                "{text}"
            );
        }
    }

    #[test]
    fn write_canonical_matches_serde_jcs_on_random_values() {
        // A small deterministic generator (no rand dependency here).
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        const CHARS: [char; 12] = [
            'a',
            'b',
            'Z',
            '0',
            '"',
            '\\',
            '\u{1}',
            '\u{e9}',
            '\u{e000}',
            '\u{fffd}',
            '\u{1f600}',
            '\u{10437}',
        ];
        fn text(next: &mut dyn FnMut() -> u64) -> String {
            (0..next() % 5)
                .map(|_| CHARS[(next() % 12) as usize])
                .collect()
        }
        fn value(next: &mut dyn FnMut() -> u64, depth: u32) -> Value {
            match next() % if depth > 3 { 5 } else { 7 } {
                0 => Value::Null,
                1 => Value::Bool(next() & 1 == 0),
                2 if next() & 1 == 0 => Value::from(next() as i64 >> (next() % 64)),
                2 => Value::from(next() >> (next() % 64)),
                3 => Value::from(
                    f64::from_bits(next() % 0x7ff0_0000_0000_0000)
                        * if next() & 1 == 0 { 1.0 } else { -1.0 },
                ),
                4 => Value::String(text(next)),
                5 => Value::Array((0..next() % 4).map(|_| value(next, depth + 1)).collect()),
                _ => Value::Object(
                    (0..next() % 6)
                        .map(|_| (text(next), value(next, depth + 1)))
                        .collect(),
                ),
            }
        }
        for _ in 0..3_000 {
            let v = value(&mut next, 0);
            if let Ok(expected) = serde_jcs::to_vec(&v) {
                assert_eq!(fast_jcs(&v), expected, "{v}");
            }
        }
    }
}
