//! Policies: how a candidate is chosen from the admissible ones, and with what probability.
//!
//! Every policy reports the propensity of its choice: exact for greedy, UCB, static and
//! epsilon-greedy; a Monte-Carlo estimate for Thompson sampling, add-one smoothed so that it
//! is never zero and the candidates' estimates sum to 1.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::model::{ArmStats, Arms};
use crate::rng::Rng;

mod memo;
pub use memo::PosteriorMemo;

/// Which policy decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyName {
    /// The default: SquareCB (inverse-gap weighting) over the contextual model
    /// ([`crate::learner`]); exact propensities.
    #[serde(rename = "squarecb")]
    SquareCb,
    /// Highest expected utility; ties go to the earliest candidate. Deterministic.
    Greedy,
    /// Greedy with probability 1 - epsilon, else uniform over the admissible candidates.
    EpsilonGreedy,
    /// Sample each candidate's success rate from its Beta posterior; highest sampled utility.
    Thompson,
    /// Highest upper confidence bound of the utility. Deterministic.
    Ucb,
    /// The first admissible candidate, in request order. Deterministic.
    Static,
}

impl PolicyName {
    /// Every policy, in the order [`PolicyName::parse`] tries them.
    pub const ALL: [PolicyName; 6] = [
        PolicyName::SquareCb,
        PolicyName::Greedy,
        PolicyName::EpsilonGreedy,
        PolicyName::Thompson,
        PolicyName::Ucb,
        PolicyName::Static,
    ];

    /// The name used in configuration, requests and logged decisions.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::SquareCb => "squarecb",
            PolicyName::Greedy => "greedy",
            PolicyName::EpsilonGreedy => "epsilon_greedy",
            PolicyName::Thompson => "thompson",
            PolicyName::Ucb => "ucb",
            PolicyName::Static => "static",
        }
    }

    /// The policy named `s`; `None` for an unknown name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// Utility weights: `success * p + quality * q - cost * c - latency_per_s * latency_s`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Weights {
    /// Weight of the success rate.
    pub success: f64,
    /// Weight of the quality score.
    pub quality: f64,
    /// Penalty per unit of cost.
    pub cost: f64,
    /// Penalty per second of latency.
    pub latency_per_s: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            success: 1.0,
            quality: 0.0,
            cost: 0.0,
            latency_per_s: 0.0,
        }
    }
}

impl Weights {
    /// Utility of one candidate from its figures (latency in milliseconds).
    pub fn utility(&self, success: f64, quality: f64, cost: f64, latency_ms: f64) -> f64 {
        self.success * success + self.quality * quality
            - self.cost * cost
            - self.latency_per_s * latency_ms / 1000.0
    }
}

/// Policy settings (the `[router]` knobs that change decisions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// The policy used when a request names none.
    pub policy: PolicyName,
    /// Bumped by operators when settings change; logged with every decision.
    pub version: String,
    /// Exploration probability of epsilon-greedy, clamped to [0, 1].
    pub epsilon: f64,
    /// Scale of UCB's exploration bonus.
    pub ucb_c: f64,
    /// Monte-Carlo draws for Thompson propensities and for confidence.
    pub mc_samples: usize,
    /// Beta prior of the success rate.
    pub prior_successes: f64,
    /// Beta prior failures of the success rate.
    pub prior_failures: f64,
    /// Prior quality when neither feedback nor the candidate says.
    pub prior_quality: f64,
    /// Observations needed before observed latency/cost/quality replace declared ones.
    pub min_obs: f64,
    /// Utility weights that rank candidates.
    pub weights: Weights,
    /// Settings of the contextual policy (`squarecb`).
    pub learner: crate::learner::LearnerConfig,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            policy: PolicyName::SquareCb,
            version: "1".into(),
            epsilon: 0.1,
            ucb_c: 1.0,
            mc_samples: 256,
            prior_successes: 1.0,
            prior_failures: 1.0,
            prior_quality: 0.5,
            min_obs: 5.0,
            weights: Weights::default(),
            learner: crate::learner::LearnerConfig::default(),
        }
    }
}

/// What the router knows about one candidate for one decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// The candidate this estimate is for.
    pub candidate_id: String,
    /// Observed outcomes, decayed (0 for an unseen candidate).
    pub n: f64,
    /// Observed successes, decayed.
    pub successes: f64,
    /// Expected latency / cost / quality (observed once `min_obs` is reached, else declared
    /// in the candidate's `metadata.x_weft_latency_ms` / `x_weft_cost` / `x_weft_quality`).
    pub latency_ms: Option<f64>,
    /// Expected cost (see `latency_ms`).
    pub cost: Option<f64>,
    /// Expected quality score (see `latency_ms`).
    pub quality: Option<f64>,
}

fn meta_f64(meta: Option<&Map<String, Value>>, key: &str) -> Option<f64> {
    meta?.get(key)?.as_f64()
}

impl Estimate {
    /// Combine the candidate's declared figures with the observed statistics.
    pub fn new(
        cfg: &PolicyConfig,
        candidate_id: &str,
        meta: Option<&Map<String, Value>>,
        stats: Option<&ArmStats>,
    ) -> Self {
        let empty = ArmStats::default();
        let st = stats.unwrap_or(&empty);
        let seen = st.n >= cfg.min_obs;
        Estimate {
            candidate_id: candidate_id.to_owned(),
            n: st.n,
            successes: st.successes,
            latency_ms: if st.latency_n >= cfg.min_obs {
                st.latency_bound()
            } else {
                meta_f64(meta, "x_weft_latency_ms")
            },
            cost: if seen {
                st.mean_cost()
            } else {
                meta_f64(meta, "x_weft_cost")
            },
            quality: if st.quality_n >= cfg.min_obs {
                st.mean_quality()
            } else {
                meta_f64(meta, "x_weft_quality")
            },
        }
    }

    fn alpha_beta(&self, cfg: &PolicyConfig) -> (f64, f64) {
        (
            cfg.prior_successes + self.successes,
            cfg.prior_failures + (self.n - self.successes).max(0.0),
        )
    }

    /// Utility with a given success rate.
    fn utility_at(&self, cfg: &PolicyConfig, p: f64) -> f64 {
        cfg.weights.utility(
            p,
            self.quality.unwrap_or(cfg.prior_quality),
            self.cost.unwrap_or(0.0),
            self.latency_ms.unwrap_or(0.0),
        )
    }

    /// Expected utility under the posterior mean success rate.
    pub fn mean_utility(&self, cfg: &PolicyConfig) -> f64 {
        let (a, b) = self.alpha_beta(cfg);
        self.utility_at(cfg, a / (a + b))
    }
}

/// The request's constraints, as numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Constraints {
    /// Highest acceptable latency (ms), checked against the estimate's.
    pub max_latency_ms: Option<f64>,
    /// Highest acceptable cost, checked against the estimate's.
    pub max_cost: Option<f64>,
    /// Lowest acceptable quality, checked against the estimate's.
    pub min_quality: Option<f64>,
}

impl Constraints {
    /// The constraint keys weft applies; beside them a request may only carry extension keys
    /// (`x_<org>_<field>`), which are logged with the decision and not applied.
    pub const KEYS: [&'static str; 3] = ["max_latency_ms", "max_cost", "min_quality"];

    /// Check the request's `constraints` object: each key one of [`Constraints::KEYS`]
    /// with a finite, non-negative number, or an extension key. A misspelled key or a
    /// value such as `"1000"` would otherwise leave the request unconstrained; the error
    /// names the field.
    pub fn check(m: Option<&Map<String, Value>>) -> Result<(), String> {
        for (k, v) in m.into_iter().flatten() {
            if Self::KEYS.contains(&k.as_str()) {
                if !v.as_f64().is_some_and(|x| x.is_finite() && x >= 0.0) {
                    return Err(format!(
                        "constraints.{k} must be a finite number at least 0, not {v}"
                    ));
                }
            } else if !weft_schemas::extensions::is_extension_key(k) {
                return Err(format!(
                    "constraints.{k} is not a constraint weft knows ({}; extensions: \
                     x_<org>_<field>)",
                    Self::KEYS.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Read the request's `constraints` object (checked by [`Constraints::check`]); missing
    /// entries mean no limit.
    pub fn from_map(m: Option<&Map<String, Value>>) -> Self {
        let get = |k: &str| m.and_then(|m| m.get(k)).and_then(Value::as_f64);
        Constraints {
            max_latency_ms: get("max_latency_ms"),
            max_cost: get("max_cost"),
            min_quality: get("min_quality"),
        }
    }

    /// Whether a constraint is set whose figure the estimate does not know yet.
    pub fn unknown(&self, e: &Estimate) -> bool {
        (self.max_latency_ms.is_some() && e.latency_ms.is_none())
            || (self.max_cost.is_some() && e.cost.is_none())
            || (self.min_quality.is_some() && e.quality.is_none())
    }

    /// The first constraint an estimate violates, as a reason code. Unknown figures pass.
    pub fn violation(&self, e: &Estimate) -> Option<&'static str> {
        if let (Some(max), Some(l)) = (self.max_latency_ms, e.latency_ms) {
            if l > max {
                return Some("exceeds_max_latency_ms");
            }
        }
        if let (Some(max), Some(c)) = (self.max_cost, e.cost) {
            if c > max {
                return Some("exceeds_max_cost");
            }
        }
        if let (Some(min), Some(q)) = (self.min_quality, e.quality) {
            if q < min {
                return Some("below_min_quality");
            }
        }
        None
    }
}

/// The outcome of one choice among admissible estimates.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// Index into the admissible estimates.
    pub chosen: usize,
    /// Probability that this policy picks `chosen` (exact or Monte-Carlo).
    pub propensity: f64,
    /// Posterior probability that `chosen` has the highest utility (Monte-Carlo).
    pub confidence: f64,
    /// Point score of each admissible estimate (mean utility; UCB's bound for UCB).
    pub scores: Vec<f64>,
}

fn argmax(xs: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in xs.iter().enumerate() {
        if *x > xs[best] {
            best = i;
        }
    }
    best
}

fn thompson_draw(cfg: &PolicyConfig, ests: &[Estimate], rng: &mut Rng) -> usize {
    // No allocation: this runs mc_samples times per decision.
    let mut best = 0;
    let mut best_u = f64::NEG_INFINITY;
    for (i, e) in ests.iter().enumerate() {
        let (a, b) = e.alpha_beta(cfg);
        let u = e.utility_at(cfg, rng.beta(a, b));
        if u > best_u {
            best = i;
            best_u = u;
        }
    }
    best
}

/// Monte-Carlo frequencies with which Thompson sampling picks each estimate.
fn thompson_counts(
    cfg: &PolicyConfig,
    ests: &[Estimate],
    rng: &mut Rng,
    samples: usize,
) -> Vec<f64> {
    let mut counts = vec![0.0; ests.len()];
    for _ in 0..samples.max(1) {
        counts[thompson_draw(cfg, ests, rng)] += 1.0;
    }
    counts
}

fn point_scores(policy: PolicyName, cfg: &PolicyConfig, ests: &[Estimate]) -> Vec<f64> {
    match policy {
        PolicyName::Ucb => {
            let total: f64 = ests.iter().map(|e| e.n).sum::<f64>() + 1.0;
            ests.iter()
                .map(|e| {
                    e.mean_utility(cfg)
                        + cfg.ucb_c * cfg.weights.success.abs() * (total.ln() / (e.n + 1.0)).sqrt()
                })
                .collect()
        }
        _ => ests.iter().map(|e| e.mean_utility(cfg)).collect(),
    }
}

/// The probability of each admissible estimate under `policy` (Thompson: Monte-Carlo).
/// Used by `weft eval` to evaluate a target policy on logged contexts.
pub fn probabilities(
    policy: PolicyName,
    cfg: &PolicyConfig,
    ests: &[Estimate],
    rng: &mut Rng,
) -> Vec<f64> {
    let k = ests.len();
    let mut p = vec![0.0; k];
    if k == 0 {
        return p;
    }
    let scores = point_scores(policy, cfg, ests);
    match policy {
        // SquareCB needs the contextual model: `weft eval` computes it from there; on
        // aggregate estimates alone it is greedy.
        PolicyName::Greedy | PolicyName::Ucb | PolicyName::SquareCb => p[argmax(&scores)] = 1.0,
        PolicyName::Static => p[0] = 1.0,
        PolicyName::EpsilonGreedy => {
            let eps = cfg.epsilon.clamp(0.0, 1.0);
            for x in p.iter_mut() {
                *x = eps / k as f64;
            }
            p[argmax(&scores)] += 1.0 - eps;
        }
        PolicyName::Thompson => {
            let c = thompson_counts(cfg, ests, rng, cfg.mc_samples);
            let total: f64 = c.iter().sum();
            for (x, c) in p.iter_mut().zip(c) {
                *x = c / total;
            }
        }
    }
    p
}

/// How many posterior draws [`choose`] makes for `policy`: `mc_samples` for Thompson (its
/// propensity), a quarter of that (at least 16) for the others (confidence only).
pub fn draws_for(policy: PolicyName, cfg: &PolicyConfig) -> usize {
    if policy == PolicyName::Thompson {
        cfg.mc_samples
    } else {
        (cfg.mc_samples / 4).max(16)
    }
}

/// Monte-Carlo counts of how often Thompson sampling picks each estimate, out of `samples`
/// draws (at least one). [`choose_with_counts`] turns them into confidence and the
/// Thompson propensity; [`PosteriorMemo`] keeps them per posterior state.
pub fn posterior_counts(
    cfg: &PolicyConfig,
    ests: &[Estimate],
    rng: &mut Rng,
    samples: usize,
) -> Vec<f64> {
    thompson_counts(cfg, ests, rng, samples)
}

/// Choose among admissible estimates (non-empty), drawing fresh posterior counts.
pub fn choose(policy: PolicyName, cfg: &PolicyConfig, ests: &[Estimate], rng: &mut Rng) -> Choice {
    let counts = thompson_counts(cfg, ests, rng, draws_for(policy, cfg));
    choose_with_counts(policy, cfg, ests, rng, &counts)
}

/// Choose among admissible estimates (non-empty), given Monte-Carlo posterior counts of the
/// same estimates (from [`posterior_counts`] or a [`PosteriorMemo`]): `counts[i]` draws out
/// of `sum(counts)` picked estimate `i`. They give the confidence of every policy (posterior
/// probability that the choice is best) and Thompson's choice and propensity: it picks
/// estimate `i` with probability `(counts[i] + 1) / (sum + K)` over `K` estimates and logs
/// that probability, so the propensity is exact: never zero, and a distribution (the `K` values sum to 1;
/// `(count + 1) / (sum + 1)` summed to `(sum + K) / (sum + 1)`, over-stating every
/// propensity by up to 6% at 64 candidates).
pub fn choose_with_counts(
    policy: PolicyName,
    cfg: &PolicyConfig,
    ests: &[Estimate],
    rng: &mut Rng,
    counts: &[f64],
) -> Choice {
    assert!(
        !ests.is_empty(),
        "choose needs at least one admissible candidate"
    );
    assert_eq!(counts.len(), ests.len(), "one count per estimate");
    let k = ests.len();
    let scores = point_scores(policy, cfg, ests);
    let best = argmax(&scores);
    let samples = counts.iter().sum::<f64>().max(1.0);
    let (chosen, propensity) = match policy {
        PolicyName::Greedy | PolicyName::Ucb | PolicyName::SquareCb => (best, 1.0),
        PolicyName::Static => (0, 1.0),
        PolicyName::EpsilonGreedy => {
            let eps = cfg.epsilon.clamp(0.0, 1.0);
            let chosen = if rng.uniform() < eps {
                rng.below(k)
            } else {
                best
            };
            let p = eps / k as f64 + if chosen == best { 1.0 - eps } else { 0.0 };
            (chosen, p)
        }
        PolicyName::Thompson => {
            // Drawn from the logged distribution itself, so the propensity is the exact
            // probability of the choice. (A fresh posterior draw is chosen with a
            // probability the counts only estimate, and a memoised state repeats that
            // estimate's error on every decision, where IPS cannot average it out.)
            let total = counts.iter().sum::<f64>() + k as f64;
            let mut u = rng.uniform() * total;
            let mut chosen = k - 1;
            for (i, c) in counts.iter().enumerate() {
                if u < c + 1.0 {
                    chosen = i;
                    break;
                }
                u -= c + 1.0;
            }
            (chosen, (counts[chosen] + 1.0) / total)
        }
    };
    let confidence = if k == 1 {
        1.0
    } else {
        counts[chosen] / samples
    };
    Choice {
        chosen,
        propensity,
        confidence: confidence.clamp(0.0, 1.0),
        scores,
    }
}

/// The estimates of a request's candidates, from a tenant's context arms.
pub fn estimates<'a>(
    cfg: &PolicyConfig,
    candidates: impl IntoIterator<Item = (&'a str, Option<&'a Map<String, Value>>)>,
    arms: Option<&Arms>,
) -> Vec<Estimate> {
    candidates
        .into_iter()
        .map(|(id, meta)| Estimate::new(cfg, id, meta, arms.and_then(|a| a.get(id))))
        .collect()
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod timing;
