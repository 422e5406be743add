//! Avro encoding of the contracts, lossless for open JSON payloads.
//!
//! The spec's contracts are open (`additionalProperties: true`, free-form `metadata`), and
//! Avro records are closed. The `.avsc` files under `schemas/avro/` bridge the two with three
//! conventions, applied here generically by walking each schema:
//! - a `["null", T]` union's null branch means "key absent";
//! - fields marked `"weft_json": true` carry any JSON value as JSON text (nested objects);
//! - `weft_extra_json` carries a JSON object of every other key: extensions, unknown keys,
//!   explicit `null`s, and values that do not fit the typed field (e.g. an integer too large
//!   for `long`).
//!
//! Numbers keep their JSON kind (`["null","long","double"]`), so `1` never comes back as `1.0`.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use apache_avro::headers::{HeaderBuilder, RabinFingerprintHeader};
use apache_avro::schema::{RecordSchema, Schema};
use apache_avro::types::Value as Avro;
use serde_json::{Map, Value};

use crate::Kind;

/// The field that carries keys the typed fields cannot.
pub const EXTRA_FIELD: &str = "weft_extra_json";

/// Avro encode/decode failures.
#[derive(Debug, thiserror::Error)]
pub enum AvroError {
    /// A kind's embedded Avro schema is unusable; holds the kind and the reason.
    #[error("avro schema for {0} failed to parse: {1}")]
    Schema(Kind, String),
    /// The payload to encode is not a JSON object.
    #[error("{kind} payload must be a JSON object")]
    NotObject {
        /// The kind being encoded.
        kind: Kind,
    },
    /// A non-nullable schema field is absent from the payload or has the wrong type.
    #[error("{kind} payload lacks required field `{field}` (or it has the wrong type)")]
    Required {
        /// The kind being encoded.
        kind: Kind,
        /// The Avro field name.
        field: String,
    },
    /// The Avro library failed to write or read a datum.
    #[error("avro: {0}")]
    Avro(#[from] Box<apache_avro::Error>),
    /// A decoded datum does not have the shape the kind's schema gives it.
    #[error("avro datum does not match the {kind} schema at `{field}`")]
    Shape {
        /// The kind being decoded.
        kind: Kind,
        /// The field where the shapes differ (empty for the top-level record).
        field: String,
    },
    /// A field that carries JSON text (such as the extra-keys field) holds invalid JSON, or
    /// JSON with a key twice in one object (read one way only, as on the JSON path).
    #[error("JSON text inside avro field `{field}` is corrupt: {source}")]
    JsonText {
        /// The Avro field name.
        field: String,
        /// The strict parse's error.
        source: crate::strict::StrictError,
    },
    /// A double that JSON cannot carry (NaN, an infinity): it would be stored as `null`.
    #[error("avro field `{field}` holds a non-finite double")]
    NonFinite {
        /// The Avro field name.
        field: String,
    },
    /// The extra-keys field names a key a typed field of the record already carries: which
    /// one is the payload's would be a guess.
    #[error("avro extra-keys field repeats the typed field `{field}`")]
    ExtraRepeats {
        /// The repeated key.
        field: String,
    },
    /// Bytes follow the datum: the record is not one datum of the kind's schema.
    #[error("{trailing} bytes follow the avro datum")]
    Trailing {
        /// How many.
        trailing: usize,
    },
    /// The datum ends before its schema does: a cut record. (apache-avro reads a union's
    /// branch or a string cut off at the end as a null, which would silently drop the
    /// optional fields and extensions of the cut.)
    #[error("the avro datum ends before its {kind} schema does (a truncated record)")]
    Truncated {
        /// The kind being decoded.
        kind: Kind,
    },
}

/// A reader over a datum's bytes that notes whether the decoder asked for bytes past the
/// end: a whole datum never does.
struct Exact<'a> {
    rest: &'a [u8],
    short: bool,
}

impl std::io::Read for Exact<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.len() > self.rest.len() {
            self.short = true;
        }
        self.rest.read(buf)
    }
}

/// One kind's parsed schema and its single-object header.
pub struct KindSchema {
    /// The kind this schema encodes.
    pub kind: Kind,
    /// The parsed Avro record schema.
    pub schema: Schema,
    /// `C3 01` + 8-byte little-endian CRC-64-AVRO fingerprint of the canonical form.
    pub single_object_header: [u8; 10],
    /// The `.avsc` text, as registered with a schema registry.
    pub text: &'static str,
}

/// The `.avsc` text for a kind.
pub fn schema_text(kind: Kind) -> &'static str {
    match kind {
        Kind::TraceEvent => include_str!("../avro/trace_event.avsc"),
        Kind::PolicyDecision => include_str!("../avro/policy_decision.avsc"),
        Kind::ExecutionFeedback => include_str!("../avro/execution_feedback.avsc"),
        Kind::ExecutionRoutingDecision => include_str!("../avro/execution_routing_decision.avsc"),
        Kind::RoutingDecision => include_str!("../avro/routing_decision.avsc"),
        Kind::Frame => include_str!("../avro/frame.avsc"),
        Kind::Handle => include_str!("../avro/handle.avsc"),
        Kind::CapabilityToken => include_str!("../avro/capability_token.avsc"),
    }
}

/// All kinds' Avro schemas, parsed once.
pub struct AvroSchemas {
    by_kind: BTreeMap<Kind, KindSchema>,
}

impl AvroSchemas {
    /// Parse every embedded `.avsc`.
    pub fn build() -> Result<Self, AvroError> {
        let mut by_kind = BTreeMap::new();
        for kind in Kind::ALL {
            let text = schema_text(kind);
            let schema =
                Schema::parse_str(text).map_err(|e| AvroError::Schema(kind, e.to_string()))?;
            let h = RabinFingerprintHeader::from_schema(&schema).build_header();
            let mut header = [0u8; 10];
            header.copy_from_slice(&h[..10]);
            by_kind.insert(
                kind,
                KindSchema {
                    kind,
                    schema,
                    single_object_header: header,
                    text,
                },
            );
        }
        Ok(Self { by_kind })
    }

    /// The process-wide set, parsed on first use.
    pub fn global() -> &'static AvroSchemas {
        static S: OnceLock<AvroSchemas> = OnceLock::new();
        S.get_or_init(|| match AvroSchemas::build() {
            Ok(s) => s,
            // Embedded files covered by unit tests: failing here is a broken build.
            Err(e) => panic!("embedded avro schemas are invalid: {e}"),
        })
    }

    /// The schema of one kind.
    pub fn get(&self, kind: Kind) -> &KindSchema {
        &self.by_kind[&kind]
    }

    /// The kind whose single-object header starts `bytes`.
    pub fn by_single_object_header(&self, bytes: &[u8]) -> Option<&KindSchema> {
        let head = bytes.get(..10)?;
        self.by_kind
            .values()
            .find(|k| k.single_object_header == head)
    }

    /// The kind whose schema `text` is (an `.avsc` a schema registry returned), compared by
    /// the CRC-64-AVRO fingerprint of its canonical form, so that whitespace, field order of
    /// the JSON and attributes outside the canonical form do not matter. `None` for any other
    /// schema, or text that is not one.
    pub fn kind_of_schema(&self, text: &str) -> Option<Kind> {
        let schema = Schema::parse_str(text).ok()?;
        let header = RabinFingerprintHeader::from_schema(&schema).build_header();
        let head = header.get(..10)?;
        self.by_kind
            .values()
            .find(|k| k.single_object_header == head)
            .map(|k| k.kind)
    }

    /// Encode a JSON payload as a bare Avro datum (no framing).
    pub fn encode_datum(&self, kind: Kind, payload: &Value) -> Result<Vec<u8>, AvroError> {
        let ks = self.get(kind);
        let value = json_to_record(kind, record_of(&ks.schema, kind)?, payload)?;
        apache_avro::writer::datum::GenericDatumWriter::builder(&ks.schema)
            .build()
            .and_then(|w| w.write_value_to_vec(value))
            .map_err(|e| AvroError::Avro(Box::new(e)))
    }

    /// Decode a bare Avro datum back to the JSON payload.
    pub fn decode_datum(&self, kind: Kind, bytes: &[u8]) -> Result<Value, AvroError> {
        let ks = self.get(kind);
        let mut r = Exact {
            rest: bytes,
            short: false,
        };
        let value = apache_avro::reader::datum::GenericDatumReader::builder(&ks.schema)
            .build()
            .and_then(|d| d.read_value(&mut r))
            .map_err(|e| AvroError::Avro(Box::new(e)))?;
        if r.short {
            return Err(AvroError::Truncated { kind });
        }
        if !r.rest.is_empty() {
            return Err(AvroError::Trailing {
                trailing: r.rest.len(),
            });
        }
        record_to_json(kind, record_of(&ks.schema, kind)?, value)
    }
}

fn record_of(schema: &Schema, kind: Kind) -> Result<&RecordSchema, AvroError> {
    match schema {
        Schema::Record(r) => Ok(r),
        _ => Err(AvroError::Schema(kind, "top level is not a record".into())),
    }
}

fn is_json_field(f: &apache_avro::schema::RecordField) -> bool {
    f.custom_attributes.get("weft_json") == Some(&Value::Bool(true))
}

/// Index of the null branch of a union, if the schema is a union containing null.
fn null_branch(schema: &Schema) -> Option<usize> {
    match schema {
        Schema::Union(u) => u.variants().iter().position(|s| matches!(s, Schema::Null)),
        _ => None,
    }
}

/// Convert a JSON value to the Avro value of `schema`, or `None` when it does not fit.
fn fit(schema: &Schema, v: &Value) -> Option<Avro> {
    match schema {
        Schema::Boolean => v.as_bool().map(Avro::Boolean),
        Schema::Long => v.as_i64().map(Avro::Long),
        Schema::Double => v.is_f64().then(|| v.as_f64().map(Avro::Double)).flatten(),
        Schema::String => v.as_str().map(|s| Avro::String(s.to_owned())),
        Schema::Array(a) => {
            let items = v.as_array()?;
            items
                .iter()
                .map(|i| fit(&a.items, i))
                .collect::<Option<Vec<_>>>()
                .map(Avro::Array)
        }
        Schema::Union(u) => u.variants().iter().enumerate().find_map(|(i, s)| {
            if matches!(s, Schema::Null) {
                return None;
            }
            fit(s, v).map(|x| Avro::Union(i as u32, Box::new(x)))
        }),
        _ => None,
    }
}

fn json_to_record(kind: Kind, rec: &RecordSchema, payload: &Value) -> Result<Avro, AvroError> {
    let obj = payload.as_object().ok_or(AvroError::NotObject { kind })?;
    let mut residual = Map::new();
    let mut fields = Vec::with_capacity(rec.fields.len());
    for f in rec.fields.iter().filter(|f| f.name != EXTRA_FIELD) {
        let null = null_branch(&f.schema);
        let absent = || match null {
            Some(i) => Ok(Avro::Union(i as u32, Box::new(Avro::Null))),
            None => Err(AvroError::Required {
                kind,
                field: f.name.clone(),
            }),
        };
        let value = match obj.get(&f.name) {
            None => absent()?,
            Some(Value::Null) => {
                residual.insert(f.name.clone(), Value::Null);
                absent()?
            }
            Some(v) if is_json_field(f) => {
                let text = Avro::String(v.to_string());
                match &f.schema {
                    Schema::Union(u) => {
                        let i = u
                            .variants()
                            .iter()
                            .position(|s| matches!(s, Schema::String))
                            .unwrap_or(1);
                        Avro::Union(i as u32, Box::new(text))
                    }
                    _ => text,
                }
            }
            Some(v) => match fit(&f.schema, v) {
                Some(x) => x,
                None => {
                    residual.insert(f.name.clone(), v.clone());
                    absent()?
                }
            },
        };
        fields.push((f.name.clone(), value));
    }
    for (k, v) in obj {
        if k == EXTRA_FIELD || !rec.lookup.contains_key(k) {
            residual.insert(k.clone(), v.clone());
        }
    }
    let extra = if residual.is_empty() {
        Avro::Union(0, Box::new(Avro::Null))
    } else {
        Avro::Union(
            1,
            Box::new(Avro::String(Value::Object(residual).to_string())),
        )
    };
    fields.push((EXTRA_FIELD.to_owned(), extra));
    Ok(Avro::Record(fields))
}

/// A decoded Avro value as JSON (`None` for null); a non-finite double is refused (JSON has
/// none: `serde_json` would make it `null`, and a bad value would pass as an absent one).
fn avro_to_json(field: &str, v: Avro) -> Result<Option<Value>, AvroError> {
    let finite = |d: f64| {
        if d.is_finite() {
            Ok(Value::from(d))
        } else {
            Err(AvroError::NonFinite {
                field: field.to_owned(),
            })
        }
    };
    Ok(Some(match v {
        Avro::Null => return Ok(None),
        Avro::Boolean(b) => Value::Bool(b),
        Avro::Int(i) => Value::from(i),
        Avro::Long(i) => Value::from(i),
        Avro::Double(d) => finite(d)?,
        Avro::Float(d) => finite(f64::from(d))?,
        Avro::String(s) => Value::String(s),
        Avro::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.extend(avro_to_json(field, item)?);
            }
            Value::Array(out)
        }
        Avro::Union(_, inner) => return avro_to_json(field, *inner),
        _ => return Ok(None),
    }))
}

/// A field that carries JSON text, read one way only ([`crate::strict::parse`]).
fn parse_json_text(field: &str, v: Avro) -> Result<Option<Value>, AvroError> {
    match avro_to_json(field, v)? {
        Some(Value::String(text)) => {
            crate::strict::parse(&text)
                .map(Some)
                .map_err(|source| AvroError::JsonText {
                    field: field.to_owned(),
                    source,
                })
        }
        _ => Ok(None),
    }
}

fn record_to_json(kind: Kind, rec: &RecordSchema, value: Avro) -> Result<Value, AvroError> {
    let Avro::Record(fields) = value else {
        return Err(AvroError::Shape {
            kind,
            field: String::new(),
        });
    };
    let mut out = Map::new();
    let mut residual = None;
    for (name, v) in fields {
        if name == EXTRA_FIELD {
            residual = parse_json_text(&name, v)?;
            continue;
        }
        let json_field = rec
            .lookup
            .get(&name)
            .and_then(|i| rec.fields.get(*i))
            .is_some_and(is_json_field);
        let decoded = if json_field {
            parse_json_text(&name, v)?
        } else {
            avro_to_json(&name, v)?
        };
        if let Some(d) = decoded {
            out.insert(name, d);
        }
    }
    match residual {
        Some(Value::Object(extra)) => {
            if let Some(k) = extra.keys().find(|k| out.contains_key(*k)) {
                return Err(AvroError::ExtraRepeats { field: k.clone() });
            }
            out.extend(extra)
        }
        Some(_) => {
            return Err(AvroError::Shape {
                kind,
                field: EXTRA_FIELD.into(),
            })
        }
        None => {}
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A registry hands a schema back in its own formatting: each kind's is recognised
    /// however it is laid out, and a schema that differs in a field is no kind's.
    #[test]
    fn a_schema_is_recognised_by_its_canonical_form_not_its_text() {
        let s = AvroSchemas::global();
        for kind in Kind::ALL {
            let text = schema_text(kind);
            let compact = serde_json::to_string(&serde_json::from_str::<Value>(text).unwrap());
            assert_eq!(s.kind_of_schema(&compact.unwrap()), Some(kind));
        }
        let mut other: Value = serde_json::from_str(schema_text(Kind::Frame)).unwrap();
        other["fields"][0]["name"] = json!("renamed");
        assert_eq!(s.kind_of_schema(&other.to_string()), None);
        assert_eq!(s.kind_of_schema("not a schema"), None);
    }

    /// Datums another Avro producer could write with weft's own schema: each is refused,
    /// where it used to be stored changed (a duplicate key's last value, the extra-keys
    /// field's value over the typed one, NaN as `null`, trailing bytes ignored).
    #[test]
    fn foreign_datums_that_would_change_the_payload_are_refused() {
        use apache_avro::types::Value as A;
        let s = AvroSchemas::global();
        let ks = s.get(Kind::ExecutionFeedback);
        let some = |i: u32, v: A| A::Union(i, Box::new(v));
        let none = || A::Union(0, Box::new(A::Null));
        let rec = |quality: A, metadata: A, extra: A| {
            A::Record(vec![
                ("decision_id".into(), A::String("d".into())),
                ("candidate_id".into(), A::String("c".into())),
                ("success".into(), A::Boolean(true)),
                ("timestamp".into(), A::String("2026-01-01T00:00:00Z".into())),
                ("latency_ms".into(), none()),
                ("cost".into(), none()),
                ("quality_score".into(), quality),
                ("error_type".into(), none()),
                ("error_message".into(), none()),
                ("trace_ref".into(), none()),
                ("execution_summary".into(), none()),
                ("metadata".into(), metadata),
                (EXTRA_FIELD.into(), extra),
            ])
        };
        let datum = |v: A| {
            apache_avro::writer::datum::GenericDatumWriter::builder(&ks.schema)
                .build()
                .and_then(|w| w.write_value_to_vec(v))
                .expect("a datum of the schema")
        };
        let clean = datum(rec(none(), none(), none()));
        assert!(s.decode_datum(Kind::ExecutionFeedback, &clean).is_ok());
        let dup = datum(rec(
            none(),
            some(1, A::String(r#"{"k":"read","k":"admin"}"#.into())),
            none(),
        ));
        assert!(matches!(
            s.decode_datum(Kind::ExecutionFeedback, &dup),
            Err(AvroError::JsonText {
                source: crate::strict::StrictError::DuplicateKey { .. },
                ..
            })
        ));
        let repeat = datum(rec(
            none(),
            none(),
            some(1, A::String(r#"{"decision_id":"other"}"#.into())),
        ));
        assert!(matches!(
            s.decode_datum(Kind::ExecutionFeedback, &repeat),
            Err(AvroError::ExtraRepeats { field }) if field == "decision_id"
        ));
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let nan = datum(rec(some(2, A::Double(bad)), none(), none()));
            assert!(matches!(
                s.decode_datum(Kind::ExecutionFeedback, &nan),
                Err(AvroError::NonFinite { .. })
            ));
        }
        // Every cut of a datum is refused: apache-avro reads a union's branch or a string cut
        // off at the end as a null, so the cut used to decode to a shorter, valid payload.
        for n in 0..clean.len() {
            assert!(
                s.decode_datum(Kind::ExecutionFeedback, &clean[..n])
                    .is_err(),
                "cut at {n} of {}",
                clean.len()
            );
        }
        let mut trailing = clean.clone();
        trailing.extend_from_slice(b"GARBAGE");
        assert!(matches!(
            s.decode_datum(Kind::ExecutionFeedback, &trailing),
            Err(AvroError::Trailing { trailing: 7 })
        ));
    }

    #[test]
    fn every_schema_parses_with_distinct_fingerprints() {
        let s = AvroSchemas::global();
        let mut seen = std::collections::HashSet::new();
        for k in Kind::ALL {
            let h = s.get(k).single_object_header;
            assert_eq!(&h[..2], &[0xC3, 0x01]);
            assert!(seen.insert(h), "fingerprint collision for {k}");
            assert_eq!(s.by_single_object_header(&h).unwrap().kind, k);
        }
    }

    #[test]
    fn absent_null_extension_and_misfit_values_survive() {
        let s = AvroSchemas::global();
        let p = json!({
            "decision_id": "d", "candidate_id": "c", "success": true,
            "timestamp": "2026-05-25T08:00:00Z",
            "latency_ms": 18446744073709551615u64,   // does not fit a long: kept in residual
            "quality_score": 1,                       // integer stays integer
            "error_type": null,                       // explicit null, distinct from absent
            "cost": {"usd": 0.25, "tokens": [1, 2]},
            "x_acme_tag": {"nested": [null, true]},
            "weft_extra_json": "a key that collides with the residual field"
        });
        let bytes = s.encode_datum(Kind::ExecutionFeedback, &p).unwrap();
        assert_eq!(s.decode_datum(Kind::ExecutionFeedback, &bytes).unwrap(), p);
    }

    #[test]
    fn missing_required_field_is_an_error() {
        let s = AvroSchemas::global();
        let err = s
            .encode_datum(Kind::Frame, &json!({"frame_id": "f"}))
            .unwrap_err();
        assert!(matches!(err, AvroError::Required { .. }), "{err}");
    }
}
