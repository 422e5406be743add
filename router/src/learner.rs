//! The contextual model behind the default policy, `squarecb`: per tenant, an online linear
//! regression of the utility on hashed (context x candidate) features, explored by SquareCB
//! (inverse-gap weighting, Foster & Rakhlin 2020, as Vowpal Wabbit's `--squarecb`), with
//! exact propensities.
//!
//! - Regression: `y = w . x` fitted by exact online ridge regression (recursive least
//!   squares: `w` minimises `sum (y_t - w . x_t)^2 + ridge |w|^2` after every outcome), over
//!   the hashed features a tenant has seen, each given a dense slot when first learnt, at
//!   most [`MAX_SLOTS`] per tenant. When all are held, a new feature takes the slot of the
//!   one learnt from least (fewest outcomes, then least recently), which is forgotten: a
//!   flood of one-off ids cannot lock the features that matter out for good.
//! - Exploration: with `K` admissible candidates, scores `s` and the best `b`,
//!   `p(a) = 1 / (K + gamma (s_b - s_a))` for `a != b` and `p(b) = 1 - sum of the others`,
//!   `gamma = gamma_scale * updates^gamma_exponent`. A candidate this tenant never saw an
//!   outcome for scores the utility's upper bound (cold start: every admissible candidate
//!   is tried).
//! - Live outcome figures per candidate (latency, cost, quality), learnt from the same
//!   outcomes, serve the constraints at once.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::features::Example;
use crate::policy::Weights;

/// Settings of the contextual policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnerConfig {
    /// Ridge penalty (prior precision of every weight).
    pub ridge: f64,
    /// SquareCB's gamma scale.
    pub gamma_scale: f64,
    /// SquareCB's gamma exponent (gamma grows as updates^exponent).
    pub gamma_exponent: f64,
    /// Decisions at most in flight (without an outcome yet) for a candidate whose figure
    /// under a constraint is still unknown.
    pub risk_budget: u32,
    /// Width of the confidence bound, in standard errors of the regression's prediction:
    /// the gap a candidate is explored by is the best's score minus its upper bound.
    pub confidence: f64,
    /// Candidates whose live figures a tenant's model holds at most ([`TenantModel::arms`]).
    /// A new candidate past it evicts the least evidenced (fewest outcomes, then the least
    /// recently learnt), which then scores and is constrained as never seen (the prior).
    pub max_arms: usize,
}

impl Default for LearnerConfig {
    fn default() -> Self {
        LearnerConfig {
            ridge: 1.0,
            gamma_scale: 40.0,
            gamma_exponent: 0.5,
            risk_budget: 1,
            confidence: 1.0,
            max_arms: DEFAULT_MAX_ARMS,
        }
    }
}

/// The observed result of running a candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The utility (the regression target).
    pub reward: f64,
    /// Reported latency (ms).
    pub latency_ms: Option<f64>,
    /// Reported cost (`cost.usd`, else `cost.amount`, else 0).
    pub cost: f64,
    /// Reported quality score.
    pub quality: Option<f64>,
}

fn num(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// Cost convention of the aggregates and of `weft eval`: cost.usd, else cost.amount, else 0.
pub fn cost_of(fb: &Value) -> f64 {
    num(fb, &["cost", "usd"])
        .or_else(|| num(fb, &["cost", "amount"]))
        .unwrap_or(0.0)
}

impl Outcome {
    /// Read an ExecutionFeedback payload; the reward is the router's utility.
    pub fn from_feedback(fb: &Value, w: &Weights, prior_quality: f64) -> Self {
        let success = fb.get("success").and_then(Value::as_bool).unwrap_or(false);
        let latency_ms = num(fb, &["latency_ms"]);
        let quality = num(fb, &["quality_score"]);
        let cost = cost_of(fb);
        Outcome {
            reward: w.utility(
                f64::from(u8::from(success)),
                quality.unwrap_or(prior_quality),
                cost,
                latency_ms.unwrap_or(0.0),
            ),
            latency_ms,
            cost,
            quality,
        }
    }
}

/// One outcome to learn from: its feedback identity, the candidate and its example.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The feedback's identity (`jcs-sha256:...`, as ingest stores it).
    pub feedback_id: String,
    /// The candidate that ran.
    pub candidate_id: String,
    /// The (context, candidate) example of the decision.
    pub example: Example,
    /// What happened.
    pub outcome: Outcome,
}

/// [`LearnerConfig::max_arms`] by default: far more candidates than an ordinary tenant
/// routes among (a request offers at most 64), few enough that a tenant naming new
/// candidate ids without end holds at most some 1.5 MB of them.
pub const DEFAULT_MAX_ARMS: usize = 4096;

/// Live outcome figures of one candidate (one tenant, every context).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ArmLive {
    /// Outcomes seen.
    pub n: f64,
    /// Outcomes with a latency.
    pub latency_n: f64,
    /// Sum of latencies (ms).
    pub latency_sum: f64,
    /// Sum of squared latencies.
    pub latency_sq: f64,
    /// Sum of costs.
    pub cost_sum: f64,
    /// Outcomes with a quality score.
    pub quality_n: f64,
    /// Sum of quality scores.
    pub quality_sum: f64,
    /// The model's [`TenantModel::updates`] when it last learnt an outcome of this
    /// candidate (a logical clock: a rebuild from the same rows evicts the same arms).
    pub last: u64,
}

impl ArmLive {
    /// The latency held against `max_latency_ms`: the mean while fewer than `min_obs`
    /// outcomes, then mean + 1.28 standard deviations (a normal p90).
    pub fn latency_bound(&self, min_obs: f64) -> Option<f64> {
        if self.latency_n < 1.0 {
            return None;
        }
        let mean = self.latency_sum / self.latency_n;
        if self.latency_n < min_obs {
            return Some(mean);
        }
        let var = (self.latency_sq / self.latency_n - mean * mean).max(0.0);
        Some(mean + 1.28 * var.sqrt())
    }

    /// Mean cost, once there is an outcome.
    pub fn mean_cost(&self) -> Option<f64> {
        (self.n >= 1.0).then(|| self.cost_sum / self.n)
    }

    /// Mean quality, once reported.
    pub fn mean_quality(&self) -> Option<f64> {
        (self.quality_n >= 1.0).then(|| self.quality_sum / self.quality_n)
    }
}

/// Dense slots a tenant's regression holds at most.
pub const MAX_SLOTS: usize = 384;

/// One tenant's model: the ridge regression and every candidate's live figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TenantModel {
    /// Outcomes learnt.
    pub updates: u64,
    /// Hashed feature index -> dense slot.
    pub slots: HashMap<u32, u32>,
    /// Weights, per slot.
    pub w: Vec<f64>,
    /// The inverse of the regularised Gram matrix (`slots x slots`, row-major).
    pub p: Vec<f64>,
    /// Per slot: outcomes learnt with it, and the update it was last learnt at; which
    /// slot gives way when all [`MAX_SLOTS`] are held. (Shorter in a model saved before it
    /// existed: the missing slots count as never used.)
    pub slot_use: Vec<(u64, u64)>,
    /// Candidate id -> live figures.
    pub arms: BTreeMap<String, ArmLive>,
}

impl TenantModel {
    /// Check that the sizes agree, as [`TenantModel::learn`] and the predictions index them:
    /// at most [`MAX_SLOTS`] weights, `P` of `weights²` entries, every slot index below the
    /// weights, `slot_use` no longer than the weights. A model read from a file that breaks
    /// this would panic in the first request that uses it.
    pub fn check(&self) -> Result<(), String> {
        let d = self.w.len();
        if d > MAX_SLOTS {
            return Err(format!(
                "{d} weights, more than the {MAX_SLOTS} slots a model holds"
            ));
        }
        if self.p.len() != d * d {
            return Err(format!(
                "p has {} entries; {d} weights need {d}x{d} = {}",
                self.p.len(),
                d * d
            ));
        }
        if let Some((f, s)) = self.slots.iter().find(|(_, s)| **s as usize >= d) {
            return Err(format!(
                "feature {f} has slot {s}, but there are {d} weights"
            ));
        }
        if self.slot_use.len() > d {
            return Err(format!(
                "slot_use has {} entries, more than the {d} weights",
                self.slot_use.len()
            ));
        }
        Ok(())
    }

    /// The predicted utility of an example.
    pub fn predict(&self, x: &Example) -> f64 {
        let y: f64 = x
            .iter()
            .filter_map(|(i, v)| self.slots.get(i).map(|s| self.w[*s as usize] * v))
            .sum();
        if y.is_finite() {
            y
        } else {
            0.0
        }
    }

    /// The slot of feature `i`, given one if it has none: a new one while fewer than
    /// [`MAX_SLOTS`] are held, else the slot of the feature learnt from least that the
    /// current outcome does not use, which is forgotten (its weight back to 0, its row and
    /// column of `P` back to the prior: the principal submatrix of the rest is kept, so `P`
    /// stays positive definite). Marked used by the outcome being learnt (update `now`).
    fn slot(&mut self, i: u32, ridge: f64, now: u64) -> Option<usize> {
        let d = self.w.len();
        self.slot_use.resize(d, (0, 0));
        let s = match self.slots.get(&i) {
            Some(s) => *s as usize,
            None if d < MAX_SLOTS => {
                // Grow P by one row and column: the new weight is independent, with
                // variance 1/ridge.
                let mut p = vec![0.0; (d + 1) * (d + 1)];
                for r in 0..d {
                    p[r * (d + 1)..r * (d + 1) + d].copy_from_slice(&self.p[r * d..r * d + d]);
                }
                p[d * (d + 1) + d] = 1.0 / ridge.max(1e-9);
                self.p = p;
                self.w.push(0.0);
                self.slot_use.push((0, 0));
                self.slots.insert(i, d as u32);
                d
            }
            None => {
                let s = (0..d)
                    .filter(|s| self.slot_use[*s].1 != now)
                    .min_by_key(|s| (self.slot_use[*s], *s))?;
                self.slots.retain(|_, v| *v as usize != s);
                self.slots.insert(i, s as u32);
                self.w[s] = 0.0;
                for r in 0..d {
                    self.p[r * d + s] = 0.0;
                    self.p[s * d + r] = 0.0;
                }
                self.p[s * d + s] = 1.0 / ridge.max(1e-9);
                self.slot_use[s] = (0, 0);
                s
            }
        };
        let u = &mut self.slot_use[s];
        if u.1 != now {
            *u = (u.0 + 1, now);
        }
        Some(s)
    }

    /// Make room for one more arm when [`LearnerConfig::max_arms`] are held: drop the least
    /// evidenced (fewest outcomes; of those, the least recently learnt). Deterministic in
    /// the sequence of outcomes learnt, so replicas and rebuilds agree. `true` when an arm
    /// was dropped.
    fn make_room(&mut self, max_arms: usize) -> bool {
        if self.arms.len() < max_arms.max(1) {
            return false;
        }
        let victim = self
            .arms
            .iter()
            .min_by(|a, b| a.1.n.total_cmp(&b.1.n).then(a.1.last.cmp(&b.1.last)))
            .map(|(id, _)| id.clone());
        victim.is_some_and(|id| self.arms.remove(&id).is_some())
    }

    /// Learn one outcome (a recursive least-squares step); `true` when its candidate was new
    /// and took the place of another (see [`LearnerConfig::max_arms`]).
    pub fn learn(&mut self, cfg: &LearnerConfig, obs: &Observation) -> bool {
        let mut xs: Vec<(usize, f64)> = Vec::with_capacity(obs.example.len());
        let now = self.updates + 1;
        for (i, v) in &obs.example {
            if let Some(s) = self.slot(*i, cfg.ridge, now) {
                match xs.iter_mut().find(|x| x.0 == s) {
                    Some(x) => x.1 += v,
                    None => xs.push((s, *v)),
                }
            }
        }
        let d = self.w.len();
        // px = P x (P is symmetric).
        let mut px = vec![0.0; d];
        for (r, out) in px.iter_mut().enumerate() {
            let row = &self.p[r * d..r * d + d];
            *out = xs.iter().map(|(s, v)| row[*s] * v).sum();
        }
        let denom = 1.0 + xs.iter().map(|(s, v)| px[*s] * v).sum::<f64>();
        let residual = obs.outcome.reward - xs.iter().map(|(s, v)| self.w[*s] * v).sum::<f64>();
        if denom.is_finite() && denom > 0.0 && residual.is_finite() {
            for r in 0..d {
                let g = px[r] / denom;
                self.w[r] += g * residual;
                let row = &mut self.p[r * d..r * d + d];
                for (c, x) in row.iter_mut().enumerate() {
                    *x -= g * px[c];
                }
            }
        }
        self.updates += 1;
        let evicted = !self.arms.contains_key(&obs.candidate_id) && self.make_room(cfg.max_arms);
        let arm = self.arms.entry(obs.candidate_id.clone()).or_default();
        let o = &obs.outcome;
        arm.last = self.updates;
        arm.n += 1.0;
        if let Some(l) = o.latency_ms {
            arm.latency_n += 1.0;
            arm.latency_sum += l;
            arm.latency_sq += l * l;
        }
        arm.cost_sum += o.cost;
        if let Some(q) = o.quality {
            arm.quality_n += 1.0;
            arm.quality_sum += q;
        }
        evicted
    }

    /// SquareCB's gamma at this model's number of updates.
    pub fn gamma(&self, cfg: &LearnerConfig) -> f64 {
        cfg.gamma_scale * ((self.updates + 1) as f64).powf(cfg.gamma_exponent)
    }

    /// `x' P x`: the variance of the prediction of `x` in units of the noise variance
    /// (ridge posterior); a feature without a slot yet counts with its prior, `1/ridge`.
    pub fn variance(&self, x: &Example, ridge: f64) -> f64 {
        let d = self.w.len();
        let mut xs: Vec<(usize, f64)> = Vec::with_capacity(x.len());
        let mut unseen = 0.0;
        for (i, v) in x {
            match self.slots.get(i) {
                Some(s) => match xs.iter_mut().find(|e| e.0 == *s as usize) {
                    Some(e) => e.1 += v,
                    None => xs.push((*s as usize, *v)),
                },
                None => unseen += v * v / ridge.max(1e-9),
            }
        }
        let seen: f64 = xs
            .iter()
            .map(|(r, vr)| vr * xs.iter().map(|(c, vc)| self.p[r * d + c] * vc).sum::<f64>())
            .sum();
        (seen.max(0.0) + unseen).max(0.0)
    }

    /// The exploration probabilities over the candidates (by id, with their examples) and
    /// their scores: SquareCB's inverse-gap weighting where a candidate's gap is the best
    /// score minus the candidate's upper confidence bound, `score + confidence * sigma *
    /// sqrt(x' P x)`, with `sigma = range / 2` (the largest standard deviation of an
    /// outcome bounded in a range of `range`, the utility's optimistic bound). A candidate
    /// the model is still unsure about is explored as if it might be the best; one whose
    /// bound is under the best score by a gap `g` gets `1 / (K + gamma g)`.
    pub fn probabilities(
        &self,
        cfg: &LearnerConfig,
        cands: &[(&str, &Example)],
        range: f64,
    ) -> (Vec<f64>, Vec<f64>) {
        let scores = self.scores(cands, range);
        let sigma = range.abs().max(1e-9) / 2.0;
        let ucb: Vec<f64> = cands
            .iter()
            .zip(&scores)
            .map(|((_, x), s)| {
                s + cfg.confidence.max(0.0) * sigma * self.variance(x, cfg.ridge).sqrt()
            })
            .collect();
        let p = squarecb_bounds(&scores, &ucb, self.gamma(cfg));
        (scores, p)
    }

    /// Scores of the candidates (by id, with their examples): the prediction, or `optimistic`
    /// for a candidate without any outcome yet.
    pub fn scores(&self, cands: &[(&str, &Example)], optimistic: f64) -> Vec<f64> {
        cands
            .iter()
            .map(|(id, x)| match self.arms.get(*id) {
                Some(a) if a.n >= 1.0 => self.predict(x),
                _ => optimistic,
            })
            .collect()
    }
}

/// SquareCB's action probabilities for scores (higher is better); the best is the first of
/// the highest.
pub fn squarecb(scores: &[f64], gamma: f64) -> Vec<f64> {
    squarecb_bounds(scores, scores, gamma)
}

/// SquareCB's action probabilities with each candidate's gap taken to its upper bound
/// (`ucb`, at least its score): `p(a) = 1 / (K + gamma (s_b - ucb_a)+)` for `a != b`.
pub fn squarecb_bounds(scores: &[f64], ucb: &[f64], gamma: f64) -> Vec<f64> {
    let k = scores.len();
    if k == 0 {
        return Vec::new();
    }
    let mut best = 0;
    for (i, s) in scores.iter().enumerate() {
        if *s > scores[best] {
            best = i;
        }
    }
    let mut p: Vec<f64> = scores
        .iter()
        .zip(ucb)
        .map(|(s, u)| 1.0 / (k as f64 + gamma.max(0.0) * (scores[best] - u.max(*s)).max(0.0)))
        .collect();
    p[best] = 0.0;
    let others: f64 = p.iter().sum();
    p[best] = (1.0 - others).max(0.0);
    p
}

/// Sample an index from probabilities with a uniform draw `u` in [0, 1).
pub fn sample(p: &[f64], u: f64) -> usize {
    let mut acc = 0.0;
    for (i, x) in p.iter().enumerate() {
        acc += x;
        if u < acc {
            return i;
        }
    }
    // Rounding: the last index with mass.
    p.iter().rposition(|x| *x > 0.0).unwrap_or(0)
}

#[cfg(test)]
mod tests;
