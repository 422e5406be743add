//! One reading of a payload: JSON parsed with duplicate keys refused, at any depth.
//!
//! `serde_json` keeps the last of two equal keys silently, while ClickHouse's JSON functions
//! read the first, so a payload with `"token_scope"` twice would tell weft one thing and the
//! I-06 check another. Every entry (the gateway, `weft publish`, the `Publisher` API, the
//! router's feedback, and ingest, which dead-letters with `duplicate_key`) parses payloads
//! through [`parse`], which builds the same `serde_json::Value` as `serde_json::from_str` in
//! the same single pass and fails on the second occurrence of a key. The check is one map
//! insert per key, which the plain parse does anyway (its cost: docs/BENCHMARKS.md).

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{Map, Number, Value};

/// Why a text is not one unambiguous JSON document.
#[derive(Debug, thiserror::Error)]
pub enum StrictError {
    /// A key appears twice in one object; holds the JSON pointer of the duplicated member.
    #[error("duplicate key at {pointer}: a key may appear only once in an object")]
    DuplicateKey {
        /// JSON pointer (RFC 6901) of the key that repeats, e.g. `/metadata/token_scope`.
        pointer: String,
    },
    /// Not JSON at all.
    #[error(transparent)]
    Json(serde_json::Error),
}

impl StrictError {
    /// The stable reason code: `duplicate_key` or `undecodable_json`.
    pub fn code(&self) -> &'static str {
        match self {
            StrictError::DuplicateKey { .. } => "duplicate_key",
            StrictError::Json(_) => "undecodable_json",
        }
    }
}

/// Where the duplicate is: filled innermost first as the error unwinds.
#[derive(Default)]
struct Trail {
    /// Set once a duplicate is found; path segments innermost first.
    segments: Option<Vec<String>>,
}

const MARK: &str = "weft-strict: duplicate key";

/// Parse `text` as JSON, refusing a key that appears twice in one object (at any depth).
pub fn parse(text: &str) -> Result<Value, StrictError> {
    let trail = RefCell::new(Trail::default());
    let mut de = serde_json::Deserializer::from_str(text);
    let out = Seed { trail: &trail }
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v));
    match out {
        Ok(v) => Ok(v),
        Err(e) => match trail.into_inner().segments {
            Some(mut segs) => {
                segs.reverse();
                let pointer = segs
                    .iter()
                    .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
                    .collect();
                Err(StrictError::DuplicateKey { pointer })
            }
            None => Err(StrictError::Json(e)),
        },
    }
}

/// `Ok` when `text` is JSON without a duplicated key; the parsed value is dropped.
pub fn check(text: &str) -> Result<(), StrictError> {
    parse(text).map(drop)
}

#[derive(Clone, Copy)]
struct Seed<'a> {
    trail: &'a RefCell<Trail>,
}

impl Seed<'_> {
    /// Record `segment` as the error unwinds through it (only for a duplicate).
    fn unwind(&self, segment: impl FnOnce() -> String) {
        if let Some(s) = self.trail.borrow_mut().segments.as_mut() {
            s.push(segment());
        }
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        loop {
            match seq.next_element_seed(self) {
                Ok(Some(v)) => out.push(v),
                Ok(None) => return Ok(Value::Array(out)),
                Err(e) => {
                    let i = out.len();
                    self.unwind(|| i.to_string());
                    return Err(e);
                }
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = match map.next_value_seed(self) {
                Ok(v) => v,
                Err(e) => {
                    self.unwind(|| key);
                    return Err(e);
                }
            };
            // One walk of the map both finds a duplicate and places the member.
            match out.entry(key) {
                Entry::Vacant(e) => {
                    e.insert(value);
                }
                Entry::Occupied(e) => {
                    self.trail.borrow_mut().segments = Some(vec![e.key().clone()]);
                    return Err(A::Error::custom(MARK));
                }
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_value_as_serde_json_without_duplicates() {
        for text in [
            r#"{"a":1,"b":[1,2.5,-3,{"c":null,"d":true}],"e":"\u00e9","f":18446744073709551615}"#,
            "[]",
            "\"x\"",
            "  {\"a\" : {}}  ",
            "1e300",
        ] {
            let plain: Value = serde_json::from_str(text).unwrap();
            assert_eq!(parse(text).unwrap(), plain, "{text}");
        }
    }

    #[test]
    fn refuses_duplicates_at_any_depth_naming_where() {
        // The attack shape: token_scope twice in one CapabilityToken-bearing object.
        let e =
            parse(r#"{"token_id":"t1","metadata":{"token_scope":"read","token_scope":"admin"}}"#)
                .unwrap_err();
        assert_eq!(e.code(), "duplicate_key");
        assert!(e.to_string().contains("/metadata/token_scope"), "{e}");
        let e = parse(r#"{"a":[{"x":1},{"y":1,"y":2}]}"#).unwrap_err();
        assert!(e.to_string().contains("/a/1/y"), "{e}");
        let e = parse(r#"{"k":1,"k":1}"#).unwrap_err();
        assert!(e.to_string().contains("at /k"), "{e}");
        // Escapes that decode to the same key are the same key.
        assert!(parse(r#"{"k":1,"\u006b":2}"#).is_err());
        // Equal keys in different objects are fine.
        assert!(parse(r#"{"k":{"k":1},"j":{"k":2}}"#).is_ok());
    }

    /// The cost of the check: `cargo test --release -p weft-schemas strict_parse_cost --
    /// --ignored --nocapture` (figures in docs/BENCHMARKS.md).
    #[test]
    #[ignore]
    fn strict_parse_cost() {
        let samples: Vec<String> = [
            "capability_token",
            "trace_event",
            "policy_decision",
            "frame_with_handles",
        ]
        .iter()
        .map(|n| {
            let f = crate::spec::file(&format!("examples/sample_payloads/{n}.json")).unwrap();
            String::from_utf8(f.to_vec()).unwrap()
        })
        .collect();
        let n = 200_000;
        let time = |f: &dyn Fn(&str) -> Value| {
            let t = std::time::Instant::now();
            for i in 0..n {
                std::hint::black_box(f(&samples[i % samples.len()]));
            }
            t.elapsed().as_nanos() as f64 / n as f64
        };
        let plain = time(&|t| serde_json::from_str(t).unwrap());
        let strict = time(&|t| parse(t).unwrap());
        let bytes = samples.iter().map(String::len).sum::<usize>() / samples.len();
        println!("{bytes}-byte payloads: serde_json {plain:.0} ns, strict {strict:.0} ns, +{:.0} ns ({:+.1}%)", strict - plain, (strict / plain - 1.0) * 100.0);
    }

    #[test]
    fn other_errors_stay_json_errors() {
        let e = parse(r#"{"a":1"#).unwrap_err();
        assert_eq!(e.code(), "undecodable_json");
        assert!(parse("{} x").is_err(), "trailing characters");
        assert!(parse("").is_err());
    }
}
