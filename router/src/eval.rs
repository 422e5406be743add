//! Off-policy evaluation on logged decisions: IPS, self-normalised IPS and doubly robust
//! estimates of a target policy's value, with studentized-bootstrap intervals, the effective
//! sample size, support diagnostics and regret against the best candidate in hindsight.
//!
//! Conventions (as in Open Bandit Pipeline and skdr-eval): for logged record i with action
//! a_i, logging propensity p_i, reward r_i and target probabilities pi_i(.),
//! w_i = pi_i(a_i) / p_i;
//! IPS = mean(w r); SNIPS = sum(w r) / sum(w); DR = mean(sum_a pi_i(a) q(x_i, a) + w (r - q(x_i, a_i)))
//! where q is the mean logged reward of (context, action) (the direct-method model).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::rng::Rng;

/// One logged decision with its observed reward.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
    pub context: String,
    /// The admissible action set, in the order the target policy sees it.
    pub actions: Vec<String>,
    /// Index of the logged action in `actions`.
    pub chosen: usize,
    /// Logging propensity of the chosen action.
    pub propensity: f64,
    pub reward: f64,
    /// Target policy's probability of each action (filled by the caller).
    pub target: Vec<f64>,
}

/// A point estimate with its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    pub value: f64,
    pub ci_low: f64,
    pub ci_high: f64,
}

/// The evaluation report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub n: usize,
    pub ips: Interval,
    pub snips: Interval,
    pub dr: Interval,
    /// Mean logged reward (the logging policy's on-policy value).
    pub logged_value: f64,
    pub effective_sample_size: f64,
    pub max_importance_weight: f64,
    pub min_propensity: f64,
    /// Share of records where the target puts mass on an action never logged in that context.
    pub unsupported_share: f64,
    /// Best candidate in hindsight: the highest mean logged reward per context, weighted.
    pub best_in_hindsight_value: f64,
    /// best_in_hindsight_value - DR estimate of the target, and the same for the logging policy.
    pub target_regret: f64,
    pub logged_regret: f64,
    pub warnings: Vec<String>,
}

/// The direct-method model: mean reward per (context, action) among logged records.
fn reward_model(data: &[Logged]) -> BTreeMap<(&str, &str), (f64, f64)> {
    let mut m: BTreeMap<(&str, &str), (f64, f64)> = BTreeMap::new();
    for d in data {
        let e = m
            .entry((d.context.as_str(), d.actions[d.chosen].as_str()))
            .or_default();
        e.0 += d.reward;
        e.1 += 1.0;
    }
    m
}

/// The records in the form the estimators and the bootstrap need: the reward model is keyed
/// by dense ids, so a resample can refit it with one pass over a `Vec`.
struct Indexed {
    /// Model key of each record's logged (context, action).
    chosen_key: Vec<usize>,
    /// Per record, (model key or None when never logged, target probability) of each action.
    actions: Vec<Vec<(Option<usize>, f64)>>,
    weight: Vec<f64>,
    reward: Vec<f64>,
    keys: usize,
}

impl Indexed {
    fn new(data: &[Logged]) -> Self {
        let mut ids: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        let chosen_key = data
            .iter()
            .map(|d| {
                let next = ids.len();
                *ids.entry((d.context.as_str(), d.actions[d.chosen].as_str()))
                    .or_insert(next)
            })
            .collect();
        let actions = data
            .iter()
            .map(|d| {
                d.actions
                    .iter()
                    .zip(&d.target)
                    .map(|(a, p)| (ids.get(&(d.context.as_str(), a.as_str())).copied(), *p))
                    .collect()
            })
            .collect();
        Indexed {
            chosen_key,
            actions,
            weight: data
                .iter()
                .map(|d| d.target[d.chosen] / d.propensity)
                .collect(),
            reward: data.iter().map(|d| d.reward).collect(),
            keys: ids.len(),
        }
    }

    /// Per-record terms (w, w*r, DR term) of the records `idx` (a resample, with repeats),
    /// with the direct-method model fitted on those same records: the mean reward per
    /// (context, action), and the overall mean where a pair is absent from `idx`.
    fn terms(&self, idx: &[usize]) -> Vec<Term> {
        let mut sum = vec![0.0; self.keys];
        let mut count = vec![0.0; self.keys];
        for &i in idx {
            sum[self.chosen_key[i]] += self.reward[i];
            count[self.chosen_key[i]] += 1.0;
        }
        let global = idx.iter().map(|&i| self.reward[i]).sum::<f64>() / idx.len().max(1) as f64;
        let q = |key: Option<usize>| match key {
            Some(k) if count[k] > 0.0 => sum[k] / count[k],
            _ => global,
        };
        idx.iter()
            .map(|&i| {
                let (w, r) = (self.weight[i], self.reward[i]);
                let dm: f64 = self.actions[i].iter().map(|&(k, p)| p * q(k)).sum();
                Term {
                    w,
                    wr: w * r,
                    dr: dm + w * (r - q(Some(self.chosen_key[i]))),
                }
            })
            .collect()
    }
}

/// One record's contribution to the three estimators.
#[derive(Debug, Clone, Copy)]
struct Term {
    w: f64,
    wr: f64,
    dr: f64,
}

/// IPS, SNIPS and DR with their standard errors, from the per-record terms. Each standard
/// error is that of a mean of per-record influence values: the terms themselves for IPS and
/// DR, the linearised ratio (wr - SNIPS w) / mean(w) for SNIPS (the delta method).
fn estimates(t: &[Term]) -> [(f64, f64); 3] {
    let n = t.len().max(1) as f64;
    let sw: f64 = t.iter().map(|x| x.w).sum();
    let swr: f64 = t.iter().map(|x| x.wr).sum();
    let sdr: f64 = t.iter().map(|x| x.dr).sum();
    let snips = if sw > 0.0 { swr / sw } else { 0.0 };
    let mean_w = sw / n;
    let se = |f: &dyn Fn(&Term) -> f64| {
        if t.len() < 2 {
            return 0.0;
        }
        let m = t.iter().map(f).sum::<f64>() / n;
        let var = t.iter().map(|x| (f(x) - m).powi(2)).sum::<f64>() / (n - 1.0);
        (var / n).sqrt()
    };
    [
        (swr / n, se(&|x| x.wr)),
        (
            snips,
            if mean_w > 0.0 {
                se(&|x| (x.wr - snips * x.w) / mean_w)
            } else {
                0.0
            },
        ),
        (sdr / n, se(&|x| x.dr)),
    ]
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

/// The 97.5% quantile of the standard normal: the fallback when there are no resamples.
const Z_975: f64 = 1.959_963_984_540_054;

/// Evaluate, with studentized-bootstrap (bootstrap-t) 95% intervals from `bootstrap`
/// resamples (e.g. 500) drawn with `seed`; with 0 resamples, normal intervals.
///
/// Why bootstrap-t, and why the reward model is refitted in every resample: importance
/// weighted values are skewed sums of a few heavily weighted records, where the percentile
/// bootstrap and the normal interval both cover less than they claim (about 94% for a 95%
/// interval over 1000 records at 10% exploration, measured). Studentizing corrects for the
/// skew and for the uncertainty of the standard error itself; refitting the direct-method
/// model carries its own estimation noise into DR's interval (Open Bandit Pipeline keeps
/// the model fixed, which makes DR's interval too narrow).
pub fn evaluate(data: &[Logged], bootstrap: usize, seed: u64) -> Report {
    let n = data.len();
    let indexed = Indexed::new(data);
    let all: Vec<usize> = (0..n).collect();
    let t = indexed.terms(&all);
    let logged_value = indexed.reward.iter().sum::<f64>() / n.max(1) as f64;
    let point = estimates(&t);
    let mut rng = Rng::new(seed);
    // Per estimator, the studentized statistic of every resample.
    let mut studentized: [Vec<f64>; 3] = Default::default();
    if n > 1 {
        let mut idx = vec![0; n];
        for _ in 0..bootstrap {
            for i in idx.iter_mut() {
                *i = rng.below(n);
            }
            let resampled = estimates(&indexed.terms(&idx));
            for ((stats, (v, se)), (v0, _)) in studentized.iter_mut().zip(resampled).zip(point) {
                if se > 0.0 {
                    stats.push((v - v0) / se);
                }
            }
        }
    }
    let interval = |(value, se): (f64, f64), stats: &mut Vec<f64>| {
        stats.sort_by(f64::total_cmp);
        let (lo, hi) = if stats.is_empty() {
            (-Z_975, Z_975)
        } else {
            (percentile(stats, 0.025), percentile(stats, 0.975))
        };
        Interval {
            value,
            ci_low: value - hi * se,
            ci_high: value - lo * se,
        }
    };
    let [ips, snips, dr] = point;
    let [s_ips, s_snips, s_dr] = &mut studentized;
    let (ips, snips, dr) = (
        interval(ips, s_ips),
        interval(snips, s_snips),
        interval(dr, s_dr),
    );
    let sw: f64 = t.iter().map(|x| x.w).sum();
    let sw2: f64 = t.iter().map(|x| x.w * x.w).sum();
    let ess = if sw2 > 0.0 { sw * sw / sw2 } else { 0.0 };
    let max_w = t.iter().map(|x| x.w).fold(0.0, f64::max);
    let min_p = data.iter().map(|d| d.propensity).fold(1.0, f64::min);
    // Support: actions logged per context.
    let model = reward_model(data);
    let unsupported =
        data.iter()
            .filter(|d| {
                d.actions.iter().zip(&d.target).any(|(a, p)| {
                    *p > 0.0 && !model.contains_key(&(d.context.as_str(), a.as_str()))
                })
            })
            .count();
    let unsupported_share = unsupported as f64 / n.max(1) as f64;
    // Best in hindsight, per context, weighted by the context's share of records.
    let mut per_ctx: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for ((ctx, _), (s, c)) in &model {
        let e = per_ctx.entry(ctx).or_insert((f64::NEG_INFINITY, 0.0));
        e.0 = e.0.max(s / c);
        e.1 += c;
    }
    let best = per_ctx.values().map(|(b, c)| b * c).sum::<f64>() / n.max(1) as f64;
    let mut warnings = Vec::new();
    if n == 0 {
        warnings.push("no logged decisions with feedback in the range".into());
    }
    if ess < 0.1 * n as f64 {
        warnings.push(format!(
            "low effective sample size: {ess:.1} of {n} records; the target policy differs much from the logging policy"
        ));
    }
    if max_w > 50.0 {
        warnings.push(format!(
            "maximum importance weight {max_w:.1}: estimates may be unstable"
        ));
    }
    if unsupported_share > 0.0 {
        warnings.push(format!(
            "{:.1}% of records: the target policy chooses actions never logged in that context (no support; DR relies on the model there)",
            100.0 * unsupported_share
        ));
    }
    Report {
        n,
        ips,
        snips,
        dr,
        logged_value,
        effective_sample_size: ess,
        max_importance_weight: max_w,
        min_propensity: min_p,
        unsupported_share,
        best_in_hindsight_value: best,
        target_regret: best - dr.value,
        logged_regret: best - logged_value,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logging: epsilon-greedy (eps 0.3) over 3 arms, Bernoulli rewards; target: greedy on arm 2.
    fn simulate(seed: u64, n: usize) -> (Vec<Logged>, f64) {
        let means = [0.3, 0.5, 0.7];
        let mut rng = Rng::new(seed);
        let data = (0..n)
            .map(|_| {
                let chosen = if rng.uniform() < 0.3 { rng.below(3) } else { 0 };
                let propensity = if chosen == 0 { 0.8 } else { 0.1 };
                let reward = f64::from(u8::from(rng.uniform() < means[chosen]));
                Logged {
                    context: "c".into(),
                    actions: vec!["a".into(), "b".into(), "c".into()],
                    chosen,
                    propensity,
                    reward,
                    target: vec![0.0, 0.0, 1.0],
                }
            })
            .collect();
        (data, means[2])
    }

    #[test]
    fn estimators_match_a_direct_computation() {
        let (data, _) = simulate(1, 2000);
        let r = evaluate(&data, 0, 1);
        // Reference: straight from the definitions.
        let w: Vec<f64> = data
            .iter()
            .map(|d| {
                if d.chosen == 2 {
                    1.0 / d.propensity
                } else {
                    0.0
                }
            })
            .collect();
        let ips: f64 = data.iter().zip(&w).map(|(d, w)| w * d.reward).sum::<f64>() / 2000.0;
        let snips =
            data.iter().zip(&w).map(|(d, w)| w * d.reward).sum::<f64>() / w.iter().sum::<f64>();
        let arm = |a: usize| {
            let v: Vec<f64> = data
                .iter()
                .filter(|d| d.chosen == a)
                .map(|d| d.reward)
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        let q = [arm(0), arm(1), arm(2)];
        let dr = data
            .iter()
            .zip(&w)
            .map(|(d, w)| q[2] + w * (d.reward - q[d.chosen]))
            .sum::<f64>()
            / 2000.0;
        assert!((r.ips.value - ips).abs() < 1e-12);
        assert!((r.snips.value - snips).abs() < 1e-12);
        assert!((r.dr.value - dr).abs() < 1e-12);
        let ess = w.iter().sum::<f64>().powi(2) / w.iter().map(|w| w * w).sum::<f64>();
        assert!((r.effective_sample_size - ess).abs() < 1e-9);
        assert!((r.best_in_hindsight_value - q[2]).abs() < 1e-12);
    }

    #[test]
    fn intervals_cover_the_true_value_on_most_seeds() {
        let seeds: u64 = std::env::var("COV_SEEDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(200);
        // Fewer resamples than `weft eval`'s 500 keep the debug-build test quick;
        // COV_RESAMPLES=500 measures the shipped setting.
        let resamples: usize = std::env::var("COV_RESAMPLES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(200);
        let mut covered = [0; 3];
        for seed in 0..seeds {
            let (data, truth) = simulate(100 + seed, 1000);
            let r = evaluate(&data, resamples, seed);
            for (i, iv) in [r.ips, r.snips, r.dr].iter().enumerate() {
                if iv.ci_low <= truth && truth <= iv.ci_high {
                    covered[i] += 1;
                }
            }
        }
        // 95% intervals: expect ~190 of 200. The slack is binomial (one standard deviation
        // is 3 seeds at 200) plus IPS's lattice effect: its value is a count of weighted
        // successes, on which any 95% interval covers between about 94% and 96% depending
        // on the true rate. 1000 seeds in release: `COV_SEEDS=1000 cargo test --release`.
        eprintln!("covered {covered:?} of {seeds}");
        for c in covered {
            assert!(c as f64 >= 0.9 * seeds as f64, "{covered:?} of {seeds}");
        }
    }
}
