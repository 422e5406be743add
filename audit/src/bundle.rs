//! TraceBundle export: one request's Core artifacts in the weaver-spec extended contract
//! (`weft_schemas::contracts::TraceBundle`), validated against the spec schema and checked
//! with the spec's conformance invariants (I-01, I-02), optionally signed (JCS + ed25519).
//!
//! The same [`check_document`] verifies any bundle file (ours or the spec corpus's): schema,
//! invariants and, when present, the signature against a keyring.

use serde::Serialize;
use serde_json::Value;
use weft_schemas::conformance::{self, InvariantFinding};
use weft_schemas::contracts::{
    Frame, Handle, PolicyDecision, RoutingDecision, Signature, TraceBundle, TraceEvent,
};
use weft_schemas::Validator;

use crate::sign::{Key, Keyring};
use crate::{timeline, AuditError, Store};

/// Build the TraceBundle of the request (or narrative) holding `id`, for `tenant`.
///
/// A narrative without a RoutingDecision cannot form a bundle (the contract requires one).
/// When an id has several stored versions (an id conflict) the first in time is exported.
/// A narrative of more than `max_members` members, or whose members hold more than
/// `max_bytes` of payload, is refused ([`AuditError::TooLarge`], naming the limit) before any
/// payload is read: a bundle is the whole narrative or nothing. `u64::MAX` for both (the
/// CLI) reads it whole, without asking its size first.
pub async fn export(
    store: &Store,
    tenant: &str,
    id: &str,
    key: Option<&Key>,
    max_members: u64,
    max_bytes: u64,
) -> Result<Value, AuditError> {
    let n = if max_members == u64::MAX && max_bytes == u64::MAX {
        timeline::get(store, tenant, id, u64::MAX).await?
    } else {
        let p = timeline::plan(store, tenant, id, max_members, max_bytes).await?;
        let nid = crate::short(&p.narrative_id);
        match p.cut() {
            Some(timeline::Cut::Members) => {
                return Err(AuditError::TooLarge(format!(
                    "narrative {nid} has {} members, over the limit of {max_members} \
                     (`weft audit bundle` takes more: --max-members)",
                    p.members_total
                )))
            }
            Some(timeline::Cut::PayloadBytes) => {
                return Err(AuditError::TooLarge(format!(
                    "narrative {nid}'s members hold {}{} bytes of payload, over the limit of \
                     {max_bytes} bytes (`weft audit bundle` takes more: --max-payload-bytes)",
                    if p.capped < p.members_total {
                        "at least "
                    } else {
                        ""
                    },
                    p.bytes
                )))
            }
            None => timeline::get(store, tenant, &p.narrative_id, max_members).await?,
        }
    };
    // Stored between the plan and the read: still whole or nothing.
    if n.members_total > n.entries.len() as u64 {
        return Err(AuditError::TooLarge(format!(
            "narrative {} has {} members, over the limit of {max_members} \
             (`weft audit bundle` takes more: --max-members)",
            crate::short(&n.narrative_id),
            n.members_total
        )));
    }
    let mut routing: Option<RoutingDecision> = None;
    let mut pds = Vec::new();
    let mut frames = Vec::new();
    let mut handles = Vec::new();
    let mut tes = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for e in &n.entries {
        let bad =
            |err: serde_json::Error| AuditError::Invalid(format!("{} {}: {err}", e.kind, e.id));
        // A RoutingDecision stored pending and again once selected (weaver-spec allows it):
        // the bundle carries the selected one, whichever was stored first.
        if e.kind == "routing_decision" {
            let pending = |r: &RoutingDecision| !matches!(r.selected_item_id, Some(Some(_)));
            match &routing {
                Some(r) if !(r.id == e.id && pending(r)) => {}
                _ => {
                    let r: RoutingDecision =
                        serde_json::from_value(e.payload.clone()).map_err(bad)?;
                    if routing.is_none() || !pending(&r) {
                        routing = Some(r);
                    }
                }
            }
            continue;
        }
        if !seen.insert((e.kind.clone(), e.id.clone())) {
            continue;
        }
        let p = e.payload.clone();
        match e.kind.as_str() {
            "policy_decision" => {
                pds.push(serde_json::from_value::<PolicyDecision>(p).map_err(bad)?)
            }
            "frame" => frames.push(serde_json::from_value::<Frame>(p).map_err(bad)?),
            "handle" => handles.push(serde_json::from_value::<Handle>(p).map_err(bad)?),
            "trace_event" => tes.push(serde_json::from_value::<TraceEvent>(p).map_err(bad)?),
            _ => {}
        }
    }
    let routing_decision = routing.ok_or_else(|| {
        AuditError::Invalid(format!(
            "narrative {} has no RoutingDecision: no TraceBundle",
            n.narrative_id
        ))
    })?;
    let bundle = TraceBundle {
        bundle_id: format!("bundle-{}", n.narrative_id),
        routing_decision,
        policy_decisions: pds,
        frames,
        handles,
        trace_events: tes,
        canonicalization: key.map(|_| "JCS".to_owned()),
        signature: None,
        created_at: Some(Some(weft_schemas::time::now_rfc3339())),
        metadata: None,
        extra: Default::default(),
    };
    let mut doc = serde_json::to_value(&bundle).map_err(|e| AuditError::Invalid(e.to_string()))?;
    if let Some(k) = key {
        let sig = k.sign(&doc)?;
        let s = Signature {
            alg: "ed25519".into(),
            kid: k.kid.clone(),
            sig,
            canonicalization: Some("JCS".into()),
            signed_at: Some(Some(weft_schemas::time::now_rfc3339())),
            extra: Default::default(),
        };
        if let Value::Object(m) = &mut doc {
            m.insert(
                "signature".into(),
                serde_json::to_value(&s).map_err(|e| AuditError::Invalid(e.to_string()))?,
            );
        }
    }
    Ok(doc)
}

/// What checking one bundle document found.
#[derive(Debug, Clone, Serialize)]
pub struct BundleCheck {
    /// JSON Schema violations (`trace_bundle`).
    pub schema: Vec<String>,
    /// Conformance invariant findings (I-01, I-02).
    pub invariants: Vec<InvariantFinding>,
    /// `None` unsigned; `Some(Ok)` verified; `Some(Err(reason))` failed or unverifiable.
    pub signature: Option<Result<String, String>>,
}

impl BundleCheck {
    /// Schema-valid, invariant-clean, and a signature (if any) that verifies.
    pub fn passed(&self) -> bool {
        self.schema.is_empty()
            && self.invariants.is_empty()
            && !matches!(self.signature, Some(Err(_)))
    }
}

/// Check a TraceBundle document: schema, I-01/I-02, and its signature when it has one
/// (against `keyring`; a signed bundle without a keyring is reported unverified).
pub fn check_document(doc: &Value, keyring: Option<&Keyring>) -> BundleCheck {
    let schema = match Validator::global().check("trace_bundle", doc) {
        Ok(v) => v.iter().map(|v| v.to_string()).collect(),
        Err(e) => vec![e.to_string()],
    };
    let invariants = conformance::check("trace_bundle", doc);
    let signature = doc.get("signature").map(|s| {
        let kid = s.get("kid").and_then(Value::as_str).unwrap_or_default();
        let sig = s.get("sig").and_then(Value::as_str).unwrap_or_default();
        let Some(ring) = keyring else {
            return Err("signed, but no keyring given to verify it".to_owned());
        };
        let mut unsigned = doc.clone();
        if let Value::Object(m) = &mut unsigned {
            m.remove("signature");
        }
        ring.verify(kid, &unsigned, sig)
            .map(|()| format!("verified with key {kid}"))
            .map_err(|e| e.to_string())
    });
    BundleCheck {
        schema,
        invariants,
        signature,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(path: &str) -> Value {
        let p = format!("{}/../schemas/spec/{path}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
    }

    fn keyring() -> Keyring {
        let p = format!(
            "{}/../schemas/spec/conformance/keyring/test_keyring.json",
            env!("CARGO_MANIFEST_DIR")
        );
        Keyring::from_json(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    #[test]
    fn the_signed_fixture_verifies_and_a_tampered_copy_does_not() {
        let doc = spec("conformance/fixtures/trace_bundle_signed_valid.json");
        let ring = keyring();
        let c = check_document(&doc, Some(&ring));
        assert!(c.passed(), "{c:?}");
        assert!(matches!(c.signature, Some(Ok(_))));
        let mut bad = doc.clone();
        bad["bundle_id"] = Value::String("tampered".into());
        let c = check_document(&bad, Some(&ring));
        assert!(matches!(c.signature, Some(Err(_))), "{c:?}");
        assert!(!c.passed());
    }

    #[test]
    fn every_negative_corpus_bundle_fails() {
        let dir = format!(
            "{}/../schemas/spec/conformance/negative/trace_bundle",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let doc: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let c = check_document(&doc, Some(&keyring()));
            assert!(!c.passed(), "{} passed: {c:?}", p.display());
            n += 1;
        }
        assert_eq!(n, 5);
    }

    #[test]
    fn our_own_signature_round_trips() {
        let key = Key::generate("test-kid").unwrap();
        let ring = Keyring {
            keys: vec![key.public()],
        };
        let mut doc = spec("examples/sample_payloads/trace_bundle.json");
        if let Value::Object(m) = &mut doc {
            m.remove("signature");
        }
        let sig = key.sign(&doc).unwrap();
        ring.verify("test-kid", &doc, &sig).unwrap();
        let again = Key::from_json(&key.to_json()).unwrap();
        assert_eq!(
            again.public().public_key_b64url,
            key.public().public_key_b64url
        );
    }
}
