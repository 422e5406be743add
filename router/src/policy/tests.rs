use super::*;

fn est(id: &str, n: f64, s: f64) -> Estimate {
    Estimate {
        candidate_id: id.into(),
        n,
        successes: s,
        latency_ms: None,
        cost: None,
        quality: None,
    }
}

#[test]
fn greedy_is_deterministic_and_exact() {
    let cfg = PolicyConfig::default();
    let e = [
        est("a", 100.0, 50.0),
        est("b", 100.0, 80.0),
        est("c", 0.0, 0.0),
    ];
    let c = choose(PolicyName::Greedy, &cfg, &e, &mut Rng::new(1));
    assert_eq!((c.chosen, c.propensity), (1, 1.0));
    assert!(c.confidence > 0.7, "{}", c.confidence);
    assert_eq!(
        probabilities(PolicyName::Greedy, &cfg, &e, &mut Rng::new(1)),
        vec![0.0, 1.0, 0.0]
    );
}

#[test]
fn epsilon_greedy_propensities_match_frequencies() {
    let cfg = PolicyConfig {
        epsilon: 0.3,
        ..Default::default()
    };
    let e = [
        est("a", 100.0, 50.0),
        est("b", 100.0, 80.0),
        est("c", 10.0, 1.0),
    ];
    let mut rng = Rng::new(3);
    let mut freq = [0.0; 3];
    let n = 20_000;
    for _ in 0..n {
        let c = choose(PolicyName::EpsilonGreedy, &cfg, &e, &mut rng);
        let want = if c.chosen == 1 { 0.8 } else { 0.1 };
        assert!((c.propensity - want).abs() < 1e-12);
        freq[c.chosen] += 1.0 / n as f64;
    }
    assert!((freq[1] - 0.8).abs() < 0.01, "{freq:?}");
}

/// Three candidates and their Thompson choice probabilities from 200k posterior draws.
fn thompson_reference() -> (PolicyConfig, [Estimate; 3], Vec<f64>) {
    let cfg = PolicyConfig::default();
    let e = [est("a", 10.0, 6.0), est("b", 10.0, 7.0), est("c", 3.0, 1.0)];
    let exact = probabilities(
        PolicyName::Thompson,
        &PolicyConfig {
            mc_samples: 200_000,
            ..cfg.clone()
        },
        &e,
        &mut Rng::new(9),
    );
    (cfg, e, exact)
}

#[test]
fn thompson_propensity_estimates_are_close_to_frequencies() {
    let (cfg, e, exact) = thompson_reference();
    let mut rng = Rng::new(5);
    let mut mean_prop = [0.0; 3];
    let mut count = [0.0; 3];
    for _ in 0..3000 {
        let c = choose(PolicyName::Thompson, &cfg, &e, &mut rng);
        mean_prop[c.chosen] += c.propensity;
        count[c.chosen] += 1.0;
    }
    for i in 0..3 {
        assert!(
            (count[i] / 3000.0 - exact[i]).abs() < 0.03,
            "{count:?} {exact:?}"
        );
        assert!((mean_prop[i] / count[i] - exact[i]).abs() < 0.03);
    }
}

/// The logged propensities are a distribution over the candidates: with the posterior
/// draws split evenly over 64 equal candidates, each is exactly 1/64 (the add-one rule
/// over `sum + 1` logged 17/1025, 6% too high for every candidate).
#[test]
fn thompson_propensities_sum_to_one_over_the_candidates() {
    let cfg = PolicyConfig::default();
    let e: Vec<Estimate> = (0..64).map(|i| est(&format!("c{i}"), 5.0, 2.0)).collect();
    let counts = vec![16.0; 64];
    let mut rng = Rng::new(3);
    for _ in 0..200 {
        let c = choose_with_counts(PolicyName::Thompson, &cfg, &e, &mut rng, &counts);
        assert!(
            (c.propensity - 1.0 / 64.0).abs() < 1e-12,
            "{}",
            c.propensity
        );
    }
}

/// Thompson picks with exactly the probability it logs, whatever counts it is given (here
/// counts far from the posterior of three equal candidates, ~1/3 each): the logged
/// propensity is the choice's frequency, not an estimate of it.
#[test]
fn thompson_chooses_with_the_propensity_it_logs() {
    let cfg = PolicyConfig::default();
    let e = [est("a", 5.0, 2.0), est("b", 5.0, 2.0), est("c", 5.0, 2.0)];
    let counts = [900.0, 100.0, 0.0];
    let mut rng = Rng::new(17);
    let n = 40_000;
    let mut chosen = [0.0; 3];
    let mut logged = [0.0; 3];
    for _ in 0..n {
        let c = choose_with_counts(PolicyName::Thompson, &cfg, &e, &mut rng, &counts);
        chosen[c.chosen] += 1.0;
        logged[c.chosen] = c.propensity;
    }
    for i in 0..3 {
        let want = (counts[i] + 1.0) / 1003.0;
        assert!(
            (logged[i] - want).abs() < 1e-12 || chosen[i] == 0.0,
            "{logged:?}"
        );
        assert!(
            (chosen[i] / n as f64 - want).abs() < 0.01,
            "chosen {chosen:?} of {n}, logged {logged:?}"
        );
    }
}

#[test]
fn memoised_counts_give_the_same_choices_and_propensities() {
    let (cfg, e, exact) = thompson_reference();
    let memo = PosteriorMemo::new(4096, 16);
    let mut rng = Rng::new(21);
    let mut count = [0.0; 3];
    for _ in 0..3000 {
        let counts = memo.counts(&cfg, &e, &mut rng);
        let c = choose_with_counts(PolicyName::Thompson, &cfg, &e, &mut rng, &counts);
        count[c.chosen] += 1.0;
        // The logged propensity is the memoised posterior probability of the choice.
        assert!(
            (c.propensity - exact[c.chosen]).abs() < 0.03,
            "{} vs {exact:?}",
            c.propensity
        );
    }
    for i in 0..3 {
        assert!(
            (count[i] / 3000.0 - exact[i]).abs() < 0.03,
            "{count:?} {exact:?}"
        );
    }
    assert_eq!(memo.stats(), (2999, 1));
    // Another posterior (one more success for "c") is another key.
    let e2 = [est("a", 10.0, 6.0), est("b", 10.0, 7.0), est("c", 4.0, 2.0)];
    let c2 = memo.counts(&cfg, &e2, &mut rng);
    assert_eq!(memo.stats(), (2999, 2));
    assert_eq!(c2.iter().sum::<f64>(), 4096.0);
    // Greedy keeps its exact propensity and takes its confidence from the counts.
    let counts = memo.counts(&cfg, &e, &mut rng);
    let g = choose_with_counts(PolicyName::Greedy, &cfg, &e, &mut rng, &counts);
    assert_eq!((g.chosen, g.propensity), (1, 1.0));
    assert!((g.confidence - exact[1]).abs() < 0.03, "{}", g.confidence);
}

#[test]
fn memo_is_bounded() {
    let cfg = PolicyConfig::default();
    let memo = PosteriorMemo::new(8, 4);
    let mut rng = Rng::new(1);
    for n in 0..10 {
        memo.counts(&cfg, &[est("a", n as f64, 0.0)], &mut rng);
    }
    assert!(memo.lock().len() <= 4);
    assert_eq!(memo.stats(), (0, 10));
}

#[test]
fn constraints_use_declared_then_observed_figures() {
    let cfg = PolicyConfig::default();
    let meta: Map<String, Value> =
        serde_json::from_str(r#"{"x_weft_latency_ms": 900, "x_weft_cost": 0.2}"#).unwrap();
    let c = Constraints {
        max_latency_ms: Some(500.0),
        ..Default::default()
    };
    let e = Estimate::new(&cfg, "a", Some(&meta), None);
    assert_eq!(c.violation(&e), Some("exceeds_max_latency_ms"));
    let mut st = ArmStats::default();
    for _ in 0..10 {
        st.observe(true, Some(100.0), 0.1, None);
    }
    let e = Estimate::new(&cfg, "a", Some(&meta), Some(&st));
    assert_eq!(e.latency_ms, Some(100.0));
    assert_eq!(c.violation(&e), None);
    let c = Constraints {
        max_cost: Some(0.05),
        ..Default::default()
    };
    assert_eq!(c.violation(&e), Some("exceeds_max_cost"));
}

#[test]
fn constraints_weft_cannot_apply_are_refused_naming_the_field() {
    let check = |v: Value| Constraints::check(v.as_object());
    assert!(check(serde_json::json!({})).is_ok());
    assert!(check(serde_json::json!({
        "max_latency_ms": 1000, "max_cost": 0, "min_quality": 0.5, "x_acme_region": "eu"
    }))
    .is_ok());
    for (bad, field) in [
        (
            serde_json::json!({"max_latency_ms": "1000"}),
            "max_latency_ms",
        ),
        (serde_json::json!({"max_cost": -0.5}), "max_cost"),
        (serde_json::json!({"min_quality": null}), "min_quality"),
        (serde_json::json!({"max_latncy_ms": 1000}), "max_latncy_ms"),
        (serde_json::json!({"policy": "fast"}), "policy"),
    ] {
        let e = check(bad.clone()).unwrap_err();
        assert!(e.contains(&format!("constraints.{field}")), "{bad}: {e}");
    }
}
