//! Validation of payloads against the spec's JSON Schemas (draft 2020-12).
//!
//! One [`Validator`] holds a compiled validator per spec schema, all resolving `$ref`s
//! against a registry of the embedded schemas, so nothing is ever fetched over the network.
//! Formats (`date-time`) are asserted, not just annotated: weft stores timestamps in typed
//! columns and a string that merely looks like a time would poison them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use serde::Serialize;
use serde_json::Value;

use crate::spec;

/// One reason a payload fails its schema: the failing keyword and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The JSON Schema keyword that failed (`required`, `minLength`, `enum`, ...).
    pub keyword: String,
    /// JSON pointer to the offending value inside the payload (`""` for the root).
    pub pointer: String,
    /// For `required`: the missing property. Otherwise the last pointer segment, if any.
    pub target: String,
    /// Human-readable message from the validator.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        write!(f, "{} at {}: {}", self.keyword, at, self.message)
    }
}

/// Errors building the validator set (a packaging bug, never user input).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The embedded schemas could not be put in one reference registry.
    #[error("schema registry: {0}")]
    Registry(String),
    /// One embedded schema failed to compile.
    #[error("schema `{name}` does not compile: {message}")]
    Compile {
        /// The schema's name (file stem).
        name: String,
        /// The compiler's message.
        message: String,
    },
}

/// Why a payload could not be validated at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no weaver-spec schema named `{0}`")]
pub struct UnknownSchema(pub String);

/// Compiled validators for every spec schema.
pub struct Validator {
    by_name: BTreeMap<String, jsonschema::Validator>,
}

impl Validator {
    /// Compile every embedded spec schema.
    pub fn build() -> Result<Self, BuildError> {
        let schemas = spec::schemas();
        let resources = schemas.values().filter_map(|s| {
            let id = s.get("$id")?.as_str()?.to_owned();
            Some((id, s.clone()))
        });
        let registry = jsonschema::Registry::new()
            .extend(resources)
            .and_then(|b| b.prepare())
            .map_err(|e| BuildError::Registry(e.to_string()))?;
        let mut by_name = BTreeMap::new();
        for (name, schema) in schemas {
            let v = jsonschema::options()
                .with_draft(jsonschema::Draft::Draft202012)
                .should_validate_formats(true)
                .with_registry(&registry)
                .build(schema)
                .map_err(|e| BuildError::Compile {
                    name: name.clone(),
                    message: e.to_string(),
                })?;
            by_name.insert(name.clone(), v);
        }
        Ok(Self { by_name })
    }

    /// The process-wide validator set, compiled on first use.
    pub fn global() -> &'static Validator {
        static V: OnceLock<Validator> = OnceLock::new();
        V.get_or_init(|| match Validator::build() {
            Ok(v) => v,
            // The schemas are embedded and covered by unit tests; failing here means the
            // binary itself is broken, and no request could be served correctly.
            Err(e) => panic!("embedded weaver-spec schemas failed to compile: {e}"),
        })
    }

    /// Names of all schemas this validator knows.
    pub fn schema_names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// `true` when `name` is a spec schema.
    pub fn knows(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// `true` when `payload` satisfies schema `name`. The hot path of every publish and
    /// ingest: it stops at the first failure and builds no report, several times cheaper than
    /// [`Validator::check`], which a caller runs only to say why a payload failed.
    pub fn is_valid(&self, name: &str, payload: &Value) -> Result<bool, UnknownSchema> {
        let v = self
            .by_name
            .get(name)
            .ok_or_else(|| UnknownSchema(name.to_owned()))?;
        Ok(v.is_valid(payload))
    }

    /// Validate `payload` against schema `name`. `Ok(vec![])` means valid.
    pub fn check(&self, name: &str, payload: &Value) -> Result<Vec<Violation>, UnknownSchema> {
        let v = self
            .by_name
            .get(name)
            .ok_or_else(|| UnknownSchema(name.to_owned()))?;
        Ok(v.iter_errors(payload)
            .map(|e| {
                let pointer = e.instance_path().as_str().to_owned();
                let target = match e.kind() {
                    jsonschema::error::ValidationErrorKind::Required { property } => {
                        property.as_str().unwrap_or_default().to_owned()
                    }
                    _ => pointer.rsplit('/').next().unwrap_or_default().to_owned(),
                };
                Violation {
                    keyword: e.kind().keyword().to_owned(),
                    pointer,
                    target,
                    message: e.to_string(),
                }
            })
            .collect())
    }

    /// Guess which schema a bare payload follows from the required keys it carries: the
    /// schema with the largest required set that the payload's keys cover. `None` when no
    /// schema fits or two fit equally well (the caller should then ask for `--kind`).
    pub fn infer(&self, payload: &Value) -> Option<&str> {
        let obj = payload.as_object()?;
        let mut best: Option<(&str, usize)> = None;
        let mut tie = false;
        for (name, schema) in spec::schemas() {
            let required: Vec<&str> = schema["required"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if required.is_empty() || !required.iter().all(|k| obj.contains_key(*k)) {
                continue;
            }
            match best {
                Some((_, n)) if n > required.len() => {}
                Some((_, n)) if n == required.len() => tie = true,
                _ => {
                    best = Some((name.as_str(), required.len()));
                    tie = false;
                }
            }
        }
        if tie {
            None
        } else {
            best.map(|(n, _)| n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_keyword_pointer_and_target() {
        let v = Validator::global();
        let errs = v
            .check("frame", &json!({"frame_id": "", "capability_id": "c", "created_at": "2026-01-01T00:00:00Z"}))
            .unwrap();
        let kws: Vec<_> = errs
            .iter()
            .map(|e| (e.keyword.as_str(), e.target.as_str()))
            .collect();
        assert!(kws.contains(&("required", "summary")), "{errs:?}");
        assert!(kws.contains(&("minLength", "frame_id")), "{errs:?}");
    }

    #[test]
    fn date_time_format_is_asserted() {
        let v = Validator::global();
        let bad = json!({"event_id": "e", "event_type": "flow_started", "timestamp": "yesterday"});
        let errs = v.check("trace_event", &bad).unwrap();
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].keyword, "format");
    }

    #[test]
    fn refs_resolve_offline_across_schemas() {
        let v = Validator::global();
        // routing_decision -> choice_card -> selectable_item, all by absolute $id.
        let rd = json!({"id": "r", "timestamp": "2026-01-01T00:00:00Z",
            "choice_cards": [{"id": "c", "items": [{"id": "i", "label": "", "description": "d"}]}]});
        let errs = v.check("routing_decision", &rd).unwrap();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].pointer, "/choice_cards/0/items/0/label");
    }

    #[test]
    fn unknown_schema_is_an_error() {
        assert!(Validator::global().check("nope", &json!({})).is_err());
        assert!(Validator::global().is_valid("nope", &json!({})).is_err());
    }

    #[test]
    fn is_valid_agrees_with_check() {
        let v = Validator::global();
        let cases = [
            json!({"event_id": "e", "event_type": "flow_started", "timestamp": "2026-01-01T00:00:00Z"}),
            json!({"event_id": "e", "event_type": "flow_started", "timestamp": "yesterday"}),
            json!({"event_id": "", "event_type": "flow_started", "timestamp": "2026-01-01T00:00:00Z"}),
            json!({"event_id": "e", "event_type": "nope", "timestamp": "2026-01-01T00:00:00Z"}),
            json!({"event_id": "e", "event_type": "flow_started"}),
            json!({"event_id": "e", "event_type": "flow_started", "timestamp": "2026-01-01T00:00:00Z", "metadata": 3}),
        ];
        for c in &cases {
            let errs = v.check("trace_event", c).unwrap();
            assert_eq!(
                v.is_valid("trace_event", c).unwrap(),
                errs.is_empty(),
                "{c}"
            );
        }
        assert!(v.is_valid("trace_event", &cases[0]).unwrap());
    }
}
