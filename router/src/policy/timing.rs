use super::*;

/// `cargo test --release -p weft-router timing -- --ignored --nocapture`
#[test]
#[ignore]
fn decision_core_cost() {
    let cfg = PolicyConfig::default();
    let e: Vec<Estimate> = ["a", "b", "c"]
        .iter()
        .map(|id| Estimate {
            candidate_id: (*id).into(),
            n: 100.0,
            successes: 70.0,
            latency_ms: None,
            cost: None,
            quality: None,
        })
        .collect();
    let mut rng = Rng::new(1);
    for p in [PolicyName::Greedy, PolicyName::Thompson] {
        let t = std::time::Instant::now();
        for _ in 0..10_000 {
            std::hint::black_box(choose(p, &cfg, &e, &mut rng));
        }
        eprintln!("{p:?}: {:?} per choice", t.elapsed() / 10_000);
    }
    let erd = serde_json::json!({"decision_id": "d", "candidate": {"candidate_id": "a", "candidate_type": "tool"},
        "fallback_candidates": [{"candidate_id": "b", "candidate_type": "tool"}, {"candidate_id": "c", "candidate_type": "tool"}],
        "confidence": 0.5, "reason_codes": ["x"], "created_at": "2026-01-01T00:00:00Z", "metadata": {"x_weft_propensity": 0.5}});
    let t = std::time::Instant::now();
    for _ in 0..10_000 {
        let _ = std::hint::black_box(
            weft_schemas::Validator::global().check("execution_routing_decision", &erd),
        );
    }
    eprintln!("validate: {:?}", t.elapsed() / 10_000);
}
