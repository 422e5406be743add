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
    /// A field that carries JSON text (such as the extra-keys field) holds invalid JSON.
    #[error("JSON text inside avro field `{field}` is corrupt: {source}")]
    JsonText {
        /// The Avro field name.
        field: String,
        /// The JSON parse error.
        source: serde_json::Error,
    },
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
    pub fn decode_datum(&self, kind: Kind, mut bytes: &[u8]) -> Result<Value, AvroError> {
        let ks = self.get(kind);
        let value = apache_avro::reader::datum::GenericDatumReader::builder(&ks.schema)
            .build()
            .and_then(|r| r.read_value(&mut bytes))
            .map_err(|e| AvroError::Avro(Box::new(e)))?;
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

fn avro_to_json(v: Avro) -> Option<Value> {
    Some(match v {
        Avro::Null => return None,
        Avro::Boolean(b) => Value::Bool(b),
        Avro::Int(i) => Value::from(i),
        Avro::Long(i) => Value::from(i),
        Avro::Double(d) => Value::from(d),
        Avro::Float(d) => Value::from(d as f64),
        Avro::String(s) => Value::String(s),
        Avro::Array(items) => Value::Array(items.into_iter().filter_map(avro_to_json).collect()),
        Avro::Union(_, inner) => return avro_to_json(*inner),
        _ => return None,
    })
}

fn parse_json_text(field: &str, v: Avro) -> Result<Option<Value>, AvroError> {
    match avro_to_json(v) {
        Some(Value::String(text)) => {
            serde_json::from_str(&text)
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
            avro_to_json(v)
        };
        if let Some(d) = decoded {
            out.insert(name, d);
        }
    }
    match residual {
        Some(Value::Object(extra)) => out.extend(extra),
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
