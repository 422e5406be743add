//! The spec's invariant checks that apply to a single document (I-01, I-02, I-06).
//!
//! Schema validation says a payload is well-formed; these checks say it keeps the Weaver
//! invariants. They mirror the named checks of the spec's conformance runner
//! (`conformance/invariants.yaml`): `frames_have_no_raw_output`, `policy_decisions_are_traced`
//! and `capability_token_scoped`. Checks over many stored events live in the audit crate.

use std::collections::HashSet;

use serde::Serialize;
use serde_json::Value;

/// Keys whose presence on a Frame means raw tool output leaked to the LLM side (I-01).
pub const RAW_OUTPUT_KEYS: [&str; 4] = ["raw_output", "raw", "raw_result", "tool_output"];

/// One broken invariant, with a pointer to the part of the document that proves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvariantFinding {
    /// `I-01`, `I-02` or `I-06`.
    pub invariant: &'static str,
    /// JSON Pointer to the offending part of the document.
    pub pointer: String,
    /// What is wrong, for a person to read.
    pub message: String,
}

/// Run every invariant that applies to a document of schema `name`.
pub fn check(name: &str, doc: &Value) -> Vec<InvariantFinding> {
    match name {
        "trace_bundle" => {
            let mut f = Vec::new();
            if let Some(frames) = doc.get("frames").and_then(Value::as_array) {
                for (i, frame) in frames.iter().enumerate() {
                    f.extend(frame_raw_output(frame, &format!("/frames/{i}")));
                }
            }
            f.extend(policy_decisions_are_traced(doc));
            f
        }
        "frame" => frame_raw_output(doc, ""),
        "capability_token" => capability_token_scoped(doc),
        _ => Vec::new(),
    }
}

/// I-01: a Frame carries none of [`RAW_OUTPUT_KEYS`].
pub fn frame_raw_output(frame: &Value, at: &str) -> Vec<InvariantFinding> {
    RAW_OUTPUT_KEYS
        .iter()
        .filter(|k| frame.get(**k).is_some())
        .map(|k| InvariantFinding {
            invariant: "I-01",
            pointer: format!("{at}/{k}"),
            message: format!("Frame carries raw tool output under `{k}`"),
        })
        .collect()
}

/// I-02 (bundle form): every PolicyDecision's `decision_id` appears on some TraceEvent.
pub fn policy_decisions_are_traced(bundle: &Value) -> Vec<InvariantFinding> {
    let traced: HashSet<&str> = bundle
        .get("trace_events")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("decision_id").and_then(Value::as_str))
        .collect();
    bundle
        .get("policy_decisions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, pd)| {
            let id = pd.get("decision_id").and_then(Value::as_str)?;
            (!traced.contains(id)).then(|| InvariantFinding {
                invariant: "I-02",
                pointer: format!("/policy_decisions/{i}"),
                message: format!("PolicyDecision `{id}` has no TraceEvent with that decision_id"),
            })
        })
        .collect()
}

/// I-06: a token has a non-empty scope and is single-use or expiring.
pub fn capability_token_scoped(token: &Value) -> Vec<InvariantFinding> {
    let mut f = Vec::new();
    let scoped = token
        .get("scope")
        .and_then(Value::as_array)
        .is_some_and(|s| !s.is_empty());
    if !scoped {
        f.push(InvariantFinding {
            invariant: "I-06",
            pointer: "/scope".into(),
            message: "token scope is missing or empty".into(),
        });
    }
    let single_use = token.get("single_use").and_then(Value::as_bool) == Some(true);
    let expiring = token.get("expires_at").is_some_and(Value::is_string);
    if !single_use && !expiring {
        f.push(InvariantFinding {
            invariant: "I-06",
            pointer: "".into(),
            message: "token is neither single-use nor expiring".into(),
        });
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn frame_with_raw_output_breaks_i01() {
        let f = json!({"frame_id": "f", "raw": "secret"});
        let got = check("frame", &f);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].pointer, "/raw");
        assert!(check("frame", &json!({"frame_id": "f"})).is_empty());
    }

    #[test]
    fn untraced_policy_decision_breaks_i02() {
        let b = json!({"policy_decisions": [{"decision_id": "a"}, {"decision_id": "b"}],
                        "trace_events": [{"decision_id": "a"}], "frames": []});
        let got = check("trace_bundle", &b);
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].invariant, got[0].pointer.as_str()),
            ("I-02", "/policy_decisions/1")
        );
    }

    #[test]
    fn unbounded_token_breaks_i06() {
        assert_eq!(check("capability_token", &json!({"scope": ["x"]})).len(), 1);
        assert!(check(
            "capability_token",
            &json!({"scope": ["x"], "single_use": true})
        )
        .is_empty());
        assert_eq!(
            check(
                "capability_token",
                &json!({"scope": [], "expires_at": null})
            )
            .len(),
            2
        );
    }
}
