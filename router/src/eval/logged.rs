//! From logged (decision, feedback) pairs to evaluation records for a target policy, and
//! the weaver-spec EvaluationArtifact that `weft eval` writes.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::decide::Remembered;
use crate::eval::{self, Logged};
use crate::features::Example;
use crate::learner::{cost_of, Observation, Outcome, TenantModel};
use crate::model::Snapshot;
use crate::policy::{self, PolicyConfig, PolicyName};
use crate::rng::Rng;
use crate::store::LoggedPair;

fn f(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// Logged decisions left out of an evaluation, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// No usable `x_weft_propensity` (or, for a contextual target, no logged features).
    pub without_propensity: usize,
    /// The feedback is about another candidate than the logged choice (a fallback ran): its
    /// reward is not the chosen action's, so the pair is no bandit sample.
    pub other_candidate: usize,
}

impl Skipped {
    /// Every decision left out.
    pub fn total(&self) -> usize {
        self.without_propensity + self.other_candidate
    }
}

/// Turn logged pairs into evaluation records for the target policy. Returns the records,
/// the decisions left out ([`Skipped`]), and the logged success rate, mean cost and mean
/// latency.
///
/// The target scores candidates from `target` (a snapshot file) or, by default, from
/// statistics fitted on the same pairs (in-sample). For `squarecb` the target is contextual:
/// its model (the snapshot's, or one learnt from the pairs in order) scores each decision's
/// candidates from the decision's logged `x_weft_features`, and the records' context (the
/// direct-method model's cell) is a coarse key of those features ([`cell_of`]); for the
/// other policies it is the decision's `x_weft_context`. The records' group (support, best
/// in hindsight) is the decision's `x_weft_context` for every policy.
pub fn records(
    pairs: &[LoggedPair],
    tenant: &str,
    cfg: &PolicyConfig,
    target: Option<&Snapshot>,
    seed: u64,
) -> (Vec<Logged>, Skipped, [f64; 3]) {
    let reward = |fb: &Value| Outcome::from_feedback(fb, &cfg.weights, cfg.prior_quality).reward;
    let contextual = cfg.policy == PolicyName::SquareCb;
    let fitted = fit_aggregates(pairs, tenant);
    let snap = target.unwrap_or(&fitted);
    let model = if contextual {
        match target.and_then(|t| t.contextual.get(tenant)) {
            Some(m) => m.clone(),
            None => fit_contextual(pairs, cfg),
        }
    } else {
        TenantModel::default()
    };
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut out = Vec::new();
    let mut skipped = Skipped::default();
    let (mut succ, mut cost, mut lat, mut lat_n) = (0.0, 0.0, 0.0, 0.0);
    for p in pairs {
        let d = &p.decision;
        let Some(prop) = f(d, &["metadata", "x_weft_propensity"]).filter(|x| *x > 0.0) else {
            skipped.without_propensity += 1;
            continue;
        };
        let chosen_id = d["candidate"]["candidate_id"].as_str().unwrap_or_default();
        if p.feedback["candidate_id"].as_str() != Some(chosen_id) {
            skipped.other_candidate += 1;
            continue;
        }
        let cands = admissible_set(d);
        let actions: Vec<String> = cands.iter().map(|(id, _)| id.clone()).collect();
        let (context, target_p) = if contextual {
            let Some(rem) = Remembered::from_payload(d) else {
                skipped.without_propensity += 1;
                continue;
            };
            let xs: Vec<Example> = actions.iter().filter_map(|a| rem.example(a)).collect();
            let refs: Vec<(&str, &Example)> =
                actions.iter().map(String::as_str).zip(xs.iter()).collect();
            let w = &cfg.weights;
            let (_, p) =
                model.probabilities(&cfg.learner, &refs, w.success.max(0.0) + w.quality.max(0.0));
            (cell_of(&d["metadata"]["x_weft_features"]), p)
        } else {
            let ctx = d["metadata"]["x_weft_context"].as_str().unwrap_or_default();
            let ests = policy::estimates(
                cfg,
                cands.iter().map(|(id, m)| (id.as_str(), m.as_ref())),
                snap.arms(tenant, ctx),
            );
            (
                ctx.to_owned(),
                policy::probabilities(cfg.policy, cfg, &ests, &mut rng),
            )
        };
        let chosen = actions.iter().position(|a| a == chosen_id).unwrap_or(0);
        let fb = &p.feedback;
        if fb.get("success").and_then(Value::as_bool) == Some(true) {
            succ += 1.0;
        }
        cost += cost_of(fb);
        if let Some(l) = f(fb, &["latency_ms"]) {
            lat += l;
            lat_n += 1.0;
        }
        let group = d["metadata"]["x_weft_context"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        out.push(Logged {
            context,
            group,
            actions,
            chosen,
            propensity: prop,
            reward: reward(fb),
            target: target_p,
        });
    }
    let n = out.len().max(1) as f64;
    let rates = [
        succ / n,
        cost / n,
        if lat_n > 0.0 { lat / lat_n } else { 0.0 },
    ];
    (out, skipped, rates)
}

/// The direct-method model's cell of a contextual decision: its logged features without
/// what identifies one request (keys ending in `_id`, as the model's features leave out),
/// numbers by their order of magnitude (`round(ln(1 + |x|))` with the sign, the scale the
/// model's numeric features use), the rest as logged, keys sorted. Per-request values
/// (`doc_tokens: 12000` and `12001`) then share a cell; a cell still thin backs off to the
/// action's mean (`eval::SHRINK`).
pub fn cell_of(features: &Value) -> String {
    fn coarse(v: &Value) -> Value {
        match v {
            Value::Number(n) => match n.as_f64() {
                Some(x) => json!(format!(
                    "~{}",
                    (x.signum() * (1.0 + x.abs()).ln().round()) as i64
                )),
                None => Value::Null,
            },
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| !k.ends_with("_id"))
                    .map(|(k, v)| (k.clone(), coarse(v)))
                    .collect::<BTreeMap<_, _>>()
                    .into_iter()
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(coarse).collect()),
            other => other.clone(),
        }
    }
    match features {
        Value::Object(_) => coarse(features).to_string(),
        _ => String::new(),
    }
}

/// The admissible set of a logged decision, with each candidate's metadata: in request
/// order, the order its policy saw them (`x_weft_admissible`); a decision logged without it
/// (before it was logged), the choice and its fallbacks ordered by id.
fn admissible_set(d: &Value) -> Vec<(String, Option<Map<String, Value>>)> {
    let mut cands: BTreeMap<String, Option<Map<String, Value>>> = BTreeMap::new();
    for c in std::iter::once(&d["candidate"]).chain(
        d.get("fallback_candidates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten(),
    ) {
        if let Some(id) = c["candidate_id"].as_str() {
            cands.insert(
                id.to_owned(),
                c.get("metadata").and_then(Value::as_object).cloned(),
            );
        }
    }
    let order = d["metadata"]["x_weft_admissible"].as_array();
    match order {
        Some(ids) if ids.len() == cands.len() => {
            let ordered: Vec<_> = ids
                .iter()
                .filter_map(Value::as_str)
                .filter_map(|id| cands.get_key_value(id))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if ordered.len() == cands.len() {
                return ordered;
            }
            cands.into_iter().collect()
        }
        _ => cands.into_iter().collect(),
    }
}

/// Aggregate statistics per (context key, candidate) fitted on the pairs.
fn fit_aggregates(pairs: &[LoggedPair], tenant: &str) -> Snapshot {
    let mut fitted = Snapshot::empty("logged-data");
    for p in pairs {
        let ctx = p.decision["metadata"]["x_weft_context"]
            .as_str()
            .unwrap_or_default();
        // The outcome is about the candidate the feedback names (a fallback, when the
        // choice did not run).
        let fb = &p.feedback;
        let id = fb["candidate_id"].as_str().unwrap_or_default();
        fitted
            .arms_mut(tenant, ctx)
            .entry(id.to_owned())
            .or_default()
            .observe(
                fb.get("success").and_then(Value::as_bool).unwrap_or(false),
                f(fb, &["latency_ms"]),
                cost_of(fb),
                f(fb, &["quality_score"]),
            );
    }
    fitted
}

/// The contextual model learnt from the pairs, in order.
fn fit_contextual(pairs: &[LoggedPair], cfg: &PolicyConfig) -> TenantModel {
    let mut m = TenantModel::default();
    for (i, p) in pairs.iter().enumerate() {
        let cand = p.feedback["candidate_id"].as_str().unwrap_or_default();
        let Some(example) = Remembered::from_payload(&p.decision).and_then(|r| r.example(cand))
        else {
            continue;
        };
        m.learn(
            &cfg.learner,
            &Observation {
                feedback_id: i.to_string(),
                candidate_id: cand.to_owned(),
                example,
                outcome: Outcome::from_feedback(&p.feedback, &cfg.weights, cfg.prior_quality),
            },
        );
    }
    m
}

/// Build the EvaluationArtifact.
#[allow(clippy::too_many_arguments)]
pub fn artifact(
    report: &eval::Report,
    cfg: &PolicyConfig,
    tenant: &str,
    range: (&str, &str),
    skipped: Skipped,
    missing_feedback: usize,
    rates: [f64; 3],
    bootstrap: usize,
) -> Value {
    let n = report.n as f64;
    let support = if report.n < 30
        || report.unsupported_share > 0.2
        || report.effective_sample_size < 0.05 * n
    {
        "high_risk"
    } else if report.warnings.is_empty() && skipped.total() == 0 {
        "ok"
    } else {
        "caution"
    };
    let mut warnings = report.warnings.clone();
    if skipped.without_propensity > 0 {
        warnings.push(format!(
            "{} decisions carry no propensity and were left out",
            skipped.without_propensity
        ));
    }
    if skipped.other_candidate > 0 {
        warnings.push(format!(
            "{} decisions have feedback about another candidate than the one chosen (a \
             fallback ran) and were left out",
            skipped.other_candidate
        ));
    }
    let uplift = report.dr.value - report.logged_value;
    let kind = match support {
        "high_risk" => "needs_more_data",
        _ if report.dr.ci_low > report.logged_value => "deploy",
        _ if report.dr.ci_high < report.logged_value => "do_not_deploy",
        _ => "experiment_ready",
    };
    let iv = |i: &eval::Interval| json!([i.ci_low, i.ci_high]);
    let now = weft_schemas::time::now_rfc3339();
    json!({
        "artifact_id": format!("weft-eval-{tenant}-{}", now.replace([':', '.'], "")),
        "producer": "weft",
        "producer_version": env!("CARGO_PKG_VERSION"),
        "created_at": now,
        "artifact_type": "offline_policy_evaluation",
        "target_estimand": "expected_utility_per_decision",
        "candidate_policy": format!("{}@{}", cfg.policy.as_str(), cfg.version),
        "baseline_policy": "logged",
        "metrics": {
            "estimated_value": report.dr.value,
            "ips": report.ips.value,
            "snips": report.snips.value,
            "dr": report.dr.value,
            "logged_value": report.logged_value,
            "value_uplift_vs_baseline": uplift,
            "best_in_hindsight_value": report.best_in_hindsight_value,
            "regret_vs_best_in_hindsight": report.target_regret,
            "logged_regret_vs_best_in_hindsight": report.logged_regret,
            "logged_success_rate": rates[0],
            "logged_mean_cost": rates[1],
            "logged_mean_latency_ms": rates[2],
            "n": report.n,
        },
        "uncertainty": {
            "ci_method": report.ci_method,
            "ci_level": 0.95,
            "bootstrap_samples": bootstrap,
            "value_ci": iv(&report.dr),
            "ips_ci": iv(&report.ips),
            "snips_ci": iv(&report.snips),
            "dr_ci": iv(&report.dr),
        },
        "support_state": support,
        "support_diagnostics": {
            "effective_sample_size": report.effective_sample_size,
            "unsupported_share": report.unsupported_share,
            "decisions_evaluated": report.n,
            "decisions_without_feedback": missing_feedback,
            "decisions_without_propensity": skipped.without_propensity,
            "decisions_with_feedback_for_another_candidate": skipped.other_candidate,
        },
        "propensity_diagnostics": {
            "max_importance_weight": report.max_importance_weight,
            "min_propensity": report.min_propensity,
            "clipping_applied": false,
        },
        "warnings": warnings,
        "recommendation_kind": kind,
        "limitations": [
            "Offline estimate only; no online validation performed.",
            "Without --snapshot the target policy is fitted on the evaluated data (in-sample)."
        ],
        "provenance": {"tenant": tenant, "from": range.0, "to": range.1, "source": "weft_events"},
        "metadata": {"x_weft_weights": cfg.weights},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(chosen: &str, fallback: &str, feedback_for: &str) -> LoggedPair {
        LoggedPair {
            decision: json!({
                "decision_id": "d",
                "candidate": {"candidate_id": chosen, "candidate_type": "tool"},
                "fallback_candidates": [{"candidate_id": fallback, "candidate_type": "tool"}],
                "metadata": {"x_weft_propensity": 0.9, "x_weft_context": "c"}
            }),
            feedback: json!({"decision_id": "d", "candidate_id": feedback_for, "success": true}),
        }
    }

    /// Per-request fields do not isolate a contextual record in the reward model's cells:
    /// ids are left out and numbers count by their order of magnitude.
    #[test]
    fn the_cell_of_a_contextual_record_is_coarse() {
        let a = json!({"tier": "pro", "doc_tokens": 12000, "user_id": "u1", "urgent": false,
                       "meta": {"pages": 3, "trace_id": "t1"}});
        let b = json!({"urgent": false, "user_id": "u2", "doc_tokens": 12345, "tier": "pro",
                       "meta": {"trace_id": "t2", "pages": 3}});
        assert_eq!(cell_of(&a), cell_of(&b));
        let c = json!({"tier": "free", "doc_tokens": 12000, "urgent": false});
        assert_ne!(cell_of(&a), cell_of(&c));
        let small = json!({"tier": "pro", "doc_tokens": 12, "urgent": false,
                           "meta": {"pages": 3}});
        assert_ne!(cell_of(&a), cell_of(&small));
    }

    /// The target policy sees the candidates in the order the logging policy saw them: the
    /// static policy that logged `z` (first in the request) gives `z` probability 1 (in id
    /// order it gave `a` 1 and its own choice 0).
    #[test]
    fn the_target_sees_the_admissible_set_in_request_order() {
        let cfg = PolicyConfig {
            policy: PolicyName::Static,
            ..PolicyConfig::default()
        };
        let mut p = pair("z", "a", "z");
        p.decision["metadata"]["x_weft_admissible"] = json!(["z", "a"]);
        let (records, _, _) = records(&[p], "t", &cfg, None, 1);
        let r = &records[0];
        assert_eq!(r.actions, ["z", "a"]);
        assert_eq!(r.target[r.chosen], 1.0);
    }

    /// A fallback's outcome is not the chosen action's reward: such a pair is left out and
    /// counted, never credited to the choice.
    #[test]
    fn feedback_about_a_fallback_is_left_out_not_credited_to_the_choice() {
        let cfg = PolicyConfig {
            policy: PolicyName::Greedy,
            ..PolicyConfig::default()
        };
        let pairs = [pair("a", "b", "a"), pair("a", "b", "b")];
        let (records, skipped, _) = records(&pairs, "t", &cfg, None, 1);
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].actions[records[0].chosen], "a");
        assert_eq!(
            skipped,
            Skipped {
                without_propensity: 0,
                other_candidate: 1
            }
        );
    }
}
