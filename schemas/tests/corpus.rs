//! The spec's own conformance corpus, run against weft's validator and invariant checks.
//! Every sample and positive payload must pass; every negative must fail for the reason the
//! corpus states (`keyword:target` for schema negatives, the invariant id otherwise).

use serde_json::Value;
use weft_schemas::{conformance, spec, Validator};

fn load(path: &str) -> Value {
    let rel = path.trim_start_matches("./");
    let bytes = spec::file(rel).unwrap_or_else(|| panic!("{rel} is not embedded"));
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn corpus() -> serde_yaml::Value {
    serde_yaml::from_slice(spec::file("conformance/corpus.yaml").unwrap()).unwrap()
}

/// The schema a sample payload file follows (its stem, or the corpus' mapping for the few
/// files named after a variant).
fn sample_schema(stem: &str) -> &str {
    match stem {
        "frame_with_handles" => "frame",
        "trace_bundle_signed" => "trace_bundle",
        "capability_token_signed" => "capability_token",
        s if s.starts_with("failure_case_") => "failure_case_artifact",
        s => s,
    }
}

#[test]
fn every_sample_payload_is_valid_and_conformant() {
    let v = Validator::global();
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("spec/examples/sample_payloads");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let schema = sample_schema(&stem);
        let doc = load(&format!("examples/sample_payloads/{stem}.json"));
        let errs = v
            .check(schema, &doc)
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        assert!(errs.is_empty(), "{stem} ({schema}): {errs:?}");
        let inv = conformance::check(schema, &doc);
        assert!(inv.is_empty(), "{stem}: {inv:?}");
        n += 1;
    }
    assert!(n >= 35, "only {n} samples found");
}

#[test]
fn positive_corpus_passes() {
    let v = Validator::global();
    let positives = corpus()["positive"].as_sequence().unwrap().clone();
    assert!(positives.len() >= 16);
    for p in positives {
        let path = p["payload"].as_str().unwrap();
        let schema = p["schema"].as_str().unwrap();
        let doc = load(path);
        let errs = v.check(schema, &doc).unwrap();
        assert!(errs.is_empty(), "{path}: {errs:?}");
        assert!(conformance::check(schema, &doc).is_empty(), "{path}");
    }
}

#[test]
fn negative_corpus_fails_for_the_stated_reason() {
    let v = Validator::global();
    let negatives = corpus()["negative"].as_sequence().unwrap().clone();
    assert!(negatives.len() >= 20);
    for n in negatives {
        let path = n["payload"].as_str().unwrap();
        let schema = n["schema"].as_str().unwrap();
        let violates = n["violates"].as_str().unwrap();
        let doc = load(path);
        let errs = v.check(schema, &doc).unwrap();
        match n["by"].as_str().unwrap() {
            "schema" => {
                let (keyword, target) = violates.split_once(':').unwrap();
                let hit = errs
                    .iter()
                    .any(|e| e.keyword == keyword && (keyword == "anyOf" || e.target == target));
                assert!(hit, "{path}: expected {violates}, got {errs:?}");
            }
            "invariant" => {
                assert!(errs.is_empty(), "{path} should be schema-valid: {errs:?}");
                let found = conformance::check(schema, &doc);
                assert!(
                    found.iter().any(|f| f.invariant == violates),
                    "{path}: expected {violates}, got {found:?}"
                );
            }
            other => panic!("unknown `by: {other}`"),
        }
    }
}

#[test]
fn inference_finds_the_schema_of_core_samples() {
    let v = Validator::global();
    for (file, want) in [
        ("trace_event", "trace_event"),
        ("policy_decision", "policy_decision"),
        ("frame_with_handles", "frame"),
        ("handle", "handle"),
        ("capability_token", "capability_token"),
        ("routing_decision", "routing_decision"),
        ("execution_feedback", "execution_feedback"),
        ("trace_bundle", "trace_bundle"),
    ] {
        let doc = load(&format!("examples/sample_payloads/{file}.json"));
        assert_eq!(v.infer(&doc), Some(want), "{file}");
    }
}

/// Every sample of a contract weft types goes through its struct and back unchanged: no field
/// dropped, renamed or defaulted, extension keys kept.
#[test]
fn typed_contracts_round_trip_every_sample() {
    use weft_schemas::contracts::*;
    fn back<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> Value {
        let typed: T = serde_json::from_value(doc.clone()).expect("sample deserializes");
        serde_json::to_value(typed).expect("serializes")
    }
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("spec/examples/sample_payloads");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let doc = load(&format!("examples/sample_payloads/{stem}.json"));
        let got = match sample_schema(&stem) {
            "trace_event" => back::<TraceEvent>(&doc),
            "policy_decision" => back::<PolicyDecision>(&doc),
            "frame" => back::<Frame>(&doc),
            "handle" => back::<Handle>(&doc),
            "capability_token" => back::<CapabilityToken>(&doc),
            "routing_decision" => back::<RoutingDecision>(&doc),
            "execution_routing_decision" => back::<ExecutionRoutingDecision>(&doc),
            "execution_feedback" => back::<ExecutionFeedback>(&doc),
            "trace_bundle" => back::<TraceBundle>(&doc),
            "evaluation_artifact" => back::<EvaluationArtifact>(&doc),
            "compiled_flow" => back::<CompiledFlow>(&doc),
            "execution_candidate" => back::<ExecutionCandidate>(&doc),
            "selectable_item" => back::<SelectableItem>(&doc),
            "choice_card" => back::<ChoiceCard>(&doc),
            _ => continue,
        };
        assert_eq!(got, doc, "{stem}");
        n += 1;
    }
    assert!(n >= 14, "only {n} typed samples found");
}
