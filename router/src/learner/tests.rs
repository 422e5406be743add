//! The learner's unit tests: SquareCB's probabilities, the regression, and its bounds.
use super::*;
use crate::features::{candidate_features, context_features, example};
use crate::rng::Rng;
use serde_json::json;

#[test]
fn squarecb_probabilities_are_exact_and_sum_to_one() {
    let p = squarecb(&[0.5, 0.7, 0.2], 10.0);
    assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    assert!((p[0] - 1.0 / (3.0 + 10.0 * 0.2)).abs() < 1e-12);
    assert!((p[2] - 1.0 / (3.0 + 10.0 * 0.5)).abs() < 1e-12);
    assert_eq!(squarecb(&[1.0, 1.0], 5.0), vec![0.5, 0.5]);
    // Sampling follows them.
    let mut rng = Rng::new(3);
    let mut f = [0.0; 3];
    for _ in 0..30_000 {
        f[sample(&p, rng.uniform())] += 1.0 / 30_000.0;
    }
    for i in 0..3 {
        assert!((f[i] - p[i]).abs() < 0.01, "{f:?} {p:?}");
    }
}

#[test]
fn regression_learns_a_contextual_rule() {
    // Best candidate: "a" for gold, "b" otherwise.
    let cfg = LearnerConfig::default();
    let mut m = TenantModel::default();
    let mut rng = Rng::new(1);
    let ca = candidate_features("a", "tool", None);
    let cb = candidate_features("b", "tool", None);
    for i in 0..2000 {
        let tier = ["gold", "silver", "bronze"][i % 3];
        let ctx = context_features(json!({"tier": tier}).as_object().unwrap());
        let (id, f) = if rng.uniform() < 0.5 {
            ("a", &ca)
        } else {
            ("b", &cb)
        };
        let rate = match (tier, id) {
            ("gold", "a") | ("silver" | "bronze", "b") => 0.8,
            _ => 0.3,
        };
        let reward = f64::from(u8::from(rng.uniform() < rate));
        m.learn(
            &cfg,
            &Observation {
                feedback_id: format!("f{i}"),
                candidate_id: id.into(),
                example: example(&ctx, f),
                outcome: Outcome {
                    reward,
                    latency_ms: Some(100.0),
                    cost: 0.0,
                    quality: None,
                },
            },
        );
    }
    for (tier, best) in [("gold", 0), ("silver", 1), ("bronze", 1)] {
        let ctx = context_features(json!({"tier": tier}).as_object().unwrap());
        let (xa, xb) = (example(&ctx, &ca), example(&ctx, &cb));
        let s = m.scores(&[("a", &xa), ("b", &xb)], 1.0);
        assert!((s[0] - s[1]).abs() > 0.3, "{tier}: {s:?}");
        assert_eq!(usize::from(s[1] > s[0]), best, "{tier}: {s:?}");
        assert!(s.iter().all(|x| (0.1..1.0).contains(x)), "{s:?}");
    }
    assert_eq!(m.arms["a"].latency_bound(5.0), Some(100.0));
}

#[test]
fn an_uncertain_candidate_is_explored_as_if_it_might_be_best() {
    let cfg = LearnerConfig::default();
    let mut m = TenantModel::default();
    let (fa, fb) = (
        candidate_features("a", "tool", None),
        candidate_features("b", "flow", None),
    );
    let (xa, xb) = (example(&[], &fa), example(&[], &fb));
    let learn = |m: &mut TenantModel, id: &str, x: &Example, reward: f64| {
        m.learn(
            &cfg,
            &Observation {
                feedback_id: String::new(),
                candidate_id: id.into(),
                example: x.clone(),
                outcome: Outcome {
                    reward,
                    latency_ms: None,
                    cost: 0.0,
                    quality: None,
                },
            },
        );
    };
    // "a": 200 outcomes at 0.7; "b": a failure and a success, so its score is lower
    // but uncertain.
    for i in 0..200 {
        learn(&mut m, "a", &xa, f64::from(u8::from(i % 10 < 7)));
    }
    learn(&mut m, "b", &xb, 0.0);
    learn(&mut m, "b", &xb, 1.0);
    let cands = [("a", &xa), ("b", &xb)];
    assert!(m.variance(&xb, cfg.ridge) > 10.0 * m.variance(&xa, cfg.ridge));
    let (s, p) = m.probabilities(&cfg, &cands, 1.0);
    assert!(s[0] > s[1] + 0.05, "{s:?}");
    assert!((p[1] - 0.5).abs() < 1e-12, "within its bound: 1/K, {p:?}");
    // Without the bound, the plain inverse-gap weight.
    let plain = LearnerConfig {
        confidence: 0.0,
        ..cfg
    };
    let (_, q) = m.probabilities(&plain, &cands, 1.0);
    assert!((q[1] - squarecb(&s, m.gamma(&plain))[1]).abs() < 1e-12);
    assert!(q[1] < 0.25, "{q:?}");
    // Once "b" is known to be worse, its bound no longer reaches the best.
    for i in 0..300 {
        learn(&mut m, "b", &xb, f64::from(u8::from(i % 10 < 2)));
    }
    let (_, p) = m.probabilities(&cfg, &cands, 1.0);
    assert!(p[1] < 0.01, "{p:?}");
    assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
}

#[test]
fn an_unseen_candidate_is_optimistic() {
    let m = TenantModel::default();
    let x = example(&[], &candidate_features("a", "tool", None));
    assert_eq!(m.scores(&[("a", &x)], 1.0), vec![1.0]);
}

/// A tenant naming a new candidate id with every outcome holds at most `max_arms` of
/// them; the candidates with evidence stay, the flood's evict each other, and a
/// decision over known, evicted and never-seen candidates still logs exact
/// probabilities that sum to 1 (an evicted candidate scores as never seen: the prior).
#[test]
fn a_flood_of_candidate_ids_stays_bounded_and_propensities_stay_exact() {
    let cfg = LearnerConfig {
        max_arms: 8,
        ..LearnerConfig::default()
    };
    let mut m = TenantModel::default();
    let ctx = context_features(json!({"tier": "gold"}).as_object().unwrap());
    let x = |id: &str| example(&ctx, &candidate_features(id, "tool", None));
    let obs = |id: &str, reward: f64| Observation {
        feedback_id: String::new(),
        candidate_id: id.into(),
        example: x(id),
        outcome: Outcome {
            reward,
            latency_ms: Some(100.0),
            cost: 0.0,
            quality: None,
        },
    };
    for i in 0..200 {
        assert!(
            !m.learn(&cfg, &obs(["a", "b"][i % 2], 0.8)),
            "room for a, b"
        );
    }
    let mut evicted = 0;
    for i in 0..300 {
        evicted += usize::from(m.learn(&cfg, &obs(&format!("flood-{i}"), 0.0)));
        assert!(m.arms.len() <= 8, "{}", m.arms.len());
    }
    assert_eq!(evicted, 300 - 6, "each new id past the bound evicts one");
    assert_eq!(m.arms["a"].n, 100.0, "the evidenced arms stay");
    assert_eq!(m.arms["b"].n, 100.0);
    assert!(
        m.arms.contains_key("flood-299"),
        "the newest flood arm is held"
    );
    assert!(!m.arms.contains_key("flood-0"));
    // A decision over a known, an evicted and a never-seen candidate.
    let (xa, x0, xn) = (x("a"), x("flood-0"), x("new"));
    let cands = [("a", &xa), ("flood-0", &x0), ("new", &xn)];
    let (s, p) = m.probabilities(&cfg, &cands, 1.0);
    assert_eq!((s[1], s[2]), (1.0, 1.0), "evicted = never seen: the prior");
    assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{p:?}");
    assert!(p.iter().all(|x| *x > 0.0 && *x <= 1.0), "{p:?}");
    // The same outcomes learnt again (a rebuild) evict the same arms.
    let mut again = TenantModel::default();
    for i in 0..200 {
        again.learn(&cfg, &obs(["a", "b"][i % 2], 0.8));
    }
    for i in 0..300 {
        again.learn(&cfg, &obs(&format!("flood-{i}"), 0.0));
    }
    assert_eq!(again, m);
}

/// A flood of one-off features past [`MAX_SLOTS`] takes the slots of the least used,
/// never those of features learnt from again and again, and a feature that comes later
/// still gets a slot (before, the first 384 features seen held every slot for good).
#[test]
fn a_flood_of_new_features_cannot_lock_out_the_ones_in_use() {
    let cfg = LearnerConfig::default();
    let mut m = TenantModel::default();
    let obs = |example: Example, reward: f64| Observation {
        feedback_id: String::new(),
        candidate_id: "c".into(),
        example,
        outcome: Outcome {
            reward,
            latency_ms: None,
            cost: 0.0,
            quality: None,
        },
    };
    let regular: Example = vec![(1, 1.0), (2, 1.0)];
    for _ in 0..50 {
        m.learn(&cfg, &obs(regular.clone(), 1.0));
    }
    let before = m.predict(&regular);
    for f in 0..2 * MAX_SLOTS as u32 {
        m.learn(&cfg, &obs(vec![(1000 + f, 1.0)], 0.0));
        assert!(m.w.len() <= MAX_SLOTS);
    }
    assert!(
        m.slots.contains_key(&1) && m.slots.contains_key(&2),
        "the regular features keep their slots"
    );
    assert!(
        (m.predict(&regular) - before).abs() < 0.2,
        "{} -> {}",
        before,
        m.predict(&regular)
    );
    // A feature that comes after the flood is learnt.
    for _ in 0..20 {
        m.learn(&cfg, &obs(vec![(7, 1.0)], 1.0));
    }
    assert!(m.slots.contains_key(&7), "a later feature gets a slot");
    assert!(
        m.predict(&vec![(7, 1.0)]) > 0.5,
        "{}",
        m.predict(&vec![(7, 1.0)])
    );
    // P stays symmetric, with a positive diagonal.
    let d = m.w.len();
    for r in 0..d {
        assert!(m.p[r * d + r] > 0.0);
        for c in 0..d {
            assert!((m.p[r * d + c] - m.p[c * d + r]).abs() < 1e-9);
        }
    }
}
