//! Off-policy evaluation on logged decisions: IPS, self-normalised IPS and doubly robust
//! estimates of a target policy's value, with studentized-bootstrap intervals, the effective
//! sample size, support diagnostics and regret against the best candidate in hindsight.
//!
//! Conventions (as in Open Bandit Pipeline and skdr-eval): for logged record i with action
//! a_i, logging propensity p_i, reward r_i and target probabilities pi_i(.),
//! w_i = pi_i(a_i) / p_i;
//! IPS = mean(w r); SNIPS = sum(w r) / sum(w); DR = mean(sum_a pi_i(a) q_i(x_i, a) + w (r - q_i(x_i, a_i)))
//! where q_i is the direct-method model **cross-fitted**: fitted on the records of the other
//! folds than record i's ([`FOLDS`] folds, record i in fold i mod [`FOLDS`]), never on record
//! i itself. The model is the mean logged reward of (context, action), shrunk toward the
//! action's mean over all contexts, itself shrunk toward the overall mean ([`SHRINK`]
//! records of prior weight each), so a context seen rarely (or once: every record of a
//! contextual log can have its own feature set) backs off to the action's mean.
//!
//! Why: a model fitted on the record it corrects gives q = r for a record alone in its
//! context, so the correction w (r - q) is 0 and DR loses its importance weights (with
//! distinct contexts, uniform logging over {A, B}, A always succeeding and B never, and a
//! target always choosing A, DR gave 0.75 where the value is 1). Cross-fitting keeps q
//! independent of the record it corrects, so DR is unbiased whatever q is, as long as the
//! propensities are right (Chernozhukov et al. 2018; Open Bandit Pipeline's `n_folds`).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::rng::Rng;

pub mod logged;

/// One logged decision with its observed reward.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
    /// Context cell of the direct-method model: its mean reward per (cell, action), backed
    /// off to the action's mean where the cell is thin. For a contextual target, a coarse key
    /// of the logged features (`logged::cell_of`), not their exact text.
    pub context: String,
    /// Context key of the support check and of the best candidate in hindsight (the
    /// decision's `x_weft_context`): an action the target chooses and never logged in the
    /// group is unsupported.
    pub group: String,
    /// The admissible action set, in the order the target policy sees it.
    pub actions: Vec<String>,
    /// Index of the logged action in `actions`.
    pub chosen: usize,
    /// Logging propensity of the chosen action.
    pub propensity: f64,
    /// Observed reward of the logged action, from its feedback.
    pub reward: f64,
    /// Target policy's probability of each action (filled by the caller).
    pub target: Vec<f64>,
}

/// A point estimate with its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    /// The point estimate.
    pub value: f64,
    /// Lower bound of the 95% interval (NaN when there is none).
    pub ci_low: f64,
    /// Upper bound of the 95% interval (NaN when there is none).
    pub ci_high: f64,
}

/// The evaluation report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Logged records evaluated.
    pub n: usize,
    /// How the intervals were made: `bootstrap_t`, `normal` (no resamples) or `none` (fewer
    /// than two records: NaN bounds).
    pub ci_method: &'static str,
    /// IPS estimate of the target policy's value: mean(w r).
    pub ips: Interval,
    /// Self-normalised IPS estimate: sum(w r) / sum(w).
    pub snips: Interval,
    /// Doubly robust estimate, with the cross-fitted model of the module's documentation.
    pub dr: Interval,
    /// Mean logged reward (the logging policy's on-policy value).
    pub logged_value: f64,
    /// (sum w)^2 / sum w^2: how many records the estimate is worth; warned below 10% of `n`.
    pub effective_sample_size: f64,
    /// Largest importance weight; above 50 the estimates are flagged as unstable.
    pub max_importance_weight: f64,
    /// Smallest logging propensity among the records (1 when there are none).
    pub min_propensity: f64,
    /// Share of records where the target puts mass on an action never logged in that
    /// record's group (`Logged::group`).
    pub unsupported_share: f64,
    /// Best candidate in hindsight: the highest mean logged reward per group, weighted.
    pub best_in_hindsight_value: f64,
    /// best_in_hindsight_value - DR estimate of the target, and the same for the logging policy.
    pub target_regret: f64,
    /// `best_in_hindsight_value` minus the mean logged reward.
    pub logged_regret: f64,
    /// Caveats about the estimates (few records, low effective sample size, large weights, no support).
    pub warnings: Vec<String>,
}

/// Folds of the cross-fitted direct-method model: record i's model is fitted on the records
/// of the other folds.
pub const FOLDS: usize = 5;

/// Prior weight, in records, of the shrinkage: a (context, action) cell's mean toward its
/// action's mean, and an action's mean toward the overall mean.
pub const SHRINK: f64 = 2.0;

/// One action of a record: its cell id and action id (None when never logged) and the
/// target's probability of it.
type ActionRef = (Option<usize>, Option<usize>, f64);

/// The records in the form the estimators and the bootstrap need: the direct-method model's
/// cells and actions are keyed by dense ids, so a resample can refit it with one pass over
/// a `Vec`.
struct Indexed {
    /// Fold of each record (its index mod [`FOLDS`]; a resampled copy keeps it).
    fold: Vec<usize>,
    /// Cell and action ids of each record's logged action.
    chosen: Vec<(usize, usize)>,
    /// Per record, each action's [`ActionRef`].
    actions: Vec<Vec<ActionRef>>,
    weight: Vec<f64>,
    reward: Vec<f64>,
    cells: usize,
    action_ids: usize,
}

/// Reward sums and counts per fold of some records (a resample), per cell, per action and
/// in all: the model of a fold is the totals minus that fold's own.
struct Fit {
    /// `[fold][cell]` (sum, count); fold [`FOLDS`] holds the totals.
    cell: Vec<Vec<(f64, f64)>>,
    action: Vec<Vec<(f64, f64)>>,
    global: Vec<(f64, f64)>,
}

impl Fit {
    fn new(ix: &Indexed, idx: &[usize]) -> Self {
        let mut fit = Fit {
            cell: vec![vec![(0.0, 0.0); ix.cells]; FOLDS + 1],
            action: vec![vec![(0.0, 0.0); ix.action_ids]; FOLDS + 1],
            global: vec![(0.0, 0.0); FOLDS + 1],
        };
        for &i in idx {
            let (c, a) = ix.chosen[i];
            let r = ix.reward[i];
            for f in [ix.fold[i], FOLDS] {
                let add = |e: &mut (f64, f64)| {
                    e.0 += r;
                    e.1 += 1.0;
                };
                add(&mut fit.cell[f][c]);
                add(&mut fit.action[f][a]);
                add(&mut fit.global[f]);
            }
        }
        fit
    }

    /// The model of `fold` (fitted on the other folds' records) for an action of a record.
    /// With no record outside the fold there is no model: 0 (DR is IPS there).
    fn q(&self, fold: usize, cell: Option<usize>, action: Option<usize>) -> f64 {
        let out = |v: &[Vec<(f64, f64)>], k: usize| {
            let (t, f) = (v[FOLDS][k], v[fold][k]);
            (t.0 - f.0, t.1 - f.1)
        };
        let (gs, gn) = (
            self.global[FOLDS].0 - self.global[fold].0,
            self.global[FOLDS].1 - self.global[fold].1,
        );
        if gn < 0.5 {
            return 0.0;
        }
        let g = gs / gn;
        let qa = match action {
            Some(a) => {
                let (s, n) = out(&self.action, a);
                (s + SHRINK * g) / (n + SHRINK)
            }
            None => g,
        };
        match cell {
            Some(c) => {
                let (s, n) = out(&self.cell, c);
                (s + SHRINK * qa) / (n + SHRINK)
            }
            None => qa,
        }
    }
}

impl Indexed {
    fn new(data: &[Logged]) -> Self {
        let mut cell_ids: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        let mut action_ids: BTreeMap<&str, usize> = BTreeMap::new();
        let chosen = data
            .iter()
            .map(|d| {
                let a = d.actions[d.chosen].as_str();
                let next = cell_ids.len();
                let c = *cell_ids.entry((d.context.as_str(), a)).or_insert(next);
                let next = action_ids.len();
                (c, *action_ids.entry(a).or_insert(next))
            })
            .collect();
        let actions = data
            .iter()
            .map(|d| {
                d.actions
                    .iter()
                    .zip(&d.target)
                    .map(|(a, p)| {
                        (
                            cell_ids.get(&(d.context.as_str(), a.as_str())).copied(),
                            action_ids.get(a.as_str()).copied(),
                            *p,
                        )
                    })
                    .collect()
            })
            .collect();
        Indexed {
            fold: (0..data.len()).map(|i| i % FOLDS).collect(),
            chosen,
            actions,
            weight: data
                .iter()
                .map(|d| d.target[d.chosen] / d.propensity)
                .collect(),
            reward: data.iter().map(|d| d.reward).collect(),
            cells: cell_ids.len(),
            action_ids: action_ids.len(),
        }
    }

    /// Per-record terms (w, w*r, DR term) of the records `idx` (a resample, with repeats),
    /// with the cross-fitted model refitted on those same records: each record's model from
    /// the records of `idx` in the other folds (a repeat of a record is in its fold, so it
    /// never fits its own model either).
    fn terms(&self, idx: &[usize]) -> Vec<Term> {
        let model = Fit::new(self, idx);
        idx.iter()
            .map(|&i| {
                let (w, r, f) = (self.weight[i], self.reward[i], self.fold[i]);
                let dm: f64 = self.actions[i]
                    .iter()
                    .map(|&(c, a, p)| p * model.q(f, c, a))
                    .sum();
                let (c, a) = self.chosen[i];
                Term {
                    w,
                    wr: w * r,
                    dr: dm + w * (r - model.q(f, Some(c), Some(a))),
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

/// The 97.5% quantile of the standard normal: the interval when there are no resamples.
const Z_975: f64 = 1.959_963_984_540_054;

/// Names of the estimators, in the order [`estimates`] returns them.
const ESTIMATORS: [&str; 3] = ["IPS", "SNIPS", "DR"];

/// Evaluate, with studentized-bootstrap (bootstrap-t) 95% intervals from `bootstrap`
/// resamples (e.g. 500) drawn with `seed`; with 0 resamples, normal intervals; with fewer
/// than two records, no interval (NaN bounds).
///
/// Why bootstrap-t, and why the reward model is refitted in every resample: importance
/// weighted values are skewed sums of a few heavily weighted records, where the percentile
/// bootstrap and the normal interval both cover less than they claim (about 94% for a 95%
/// interval over 1000 records at 10% exploration, measured). Studentizing corrects for the
/// skew and for the uncertainty of the standard error itself; refitting the direct-method
/// model carries its own estimation noise into DR's interval (Open Bandit Pipeline keeps
/// the model fixed, which makes DR's interval too narrow).
///
/// Degenerate cases, kept visible rather than hidden: a resample whose standard error is 0
/// (e.g. it drew none of the records the target policy would choose) counts as an infinite
/// studentized value, which widens the interval instead of silently narrowing it. When the
/// estimate's own standard error is 0 (e.g. the few supported records all succeeded), the
/// data show no spread and the bootstrap cannot invent one: the bounds are NaN (`null` in
/// the artifact), with a warning, so no gate passes on a zero-width interval.
pub fn evaluate(data: &[Logged], bootstrap: usize, seed: u64) -> Report {
    let n = data.len();
    let indexed = Indexed::new(data);
    let all: Vec<usize> = (0..n).collect();
    let t = indexed.terms(&all);
    let logged_value = indexed.reward.iter().sum::<f64>() / n.max(1) as f64;
    let point = estimates(&t);
    let mut rng = Rng::new(seed);
    // Per estimator, each resample's studentized statistic.
    let mut studentized: [Vec<f64>; 3] = Default::default();
    let resamples = if n > 1 { bootstrap } else { 0 };
    let mut idx = vec![0; n];
    for _ in 0..resamples {
        for i in idx.iter_mut() {
            *i = rng.below(n);
        }
        for (k, (v, se)) in estimates(&indexed.terms(&idx)).into_iter().enumerate() {
            let v0 = point[k].0;
            studentized[k].push(if se > 0.0 {
                (v - v0) / se
            } else if v == v0 {
                0.0
            } else {
                f64::INFINITY.copysign(v - v0)
            });
        }
    }
    let mut warnings = Vec::new();
    let mut interval = |k: usize| {
        let (value, se) = point[k];
        let (ci_low, ci_high) = if n < 2 {
            (f64::NAN, f64::NAN)
        } else if resamples == 0 {
            (value - Z_975 * se, value + Z_975 * se)
        } else if se > 0.0 {
            studentized[k].sort_by(f64::total_cmp);
            let stats = &studentized[k];
            (
                value - percentile(stats, 0.975) * se,
                value - percentile(stats, 0.025) * se,
            )
        } else {
            warnings.push(format!(
                "{}: the logged data show no spread (standard error 0), so there is no interval; collect more data",
                ESTIMATORS[k]
            ));
            (f64::NAN, f64::NAN)
        };
        Interval {
            value,
            ci_low,
            ci_high,
        }
    };
    let (ips, snips, dr) = (interval(0), interval(1), interval(2));
    let ci_method = match (n, resamples) {
        (0 | 1, _) => "none",
        (_, 0) => "normal",
        _ => "bootstrap_t",
    };
    let sw: f64 = t.iter().map(|x| x.w).sum();
    let sw2: f64 = t.iter().map(|x| x.w * x.w).sum();
    let ess = if sw2 > 0.0 { sw * sw / sw2 } else { 0.0 };
    let max_w = t.iter().map(|x| x.w).fold(0.0, f64::max);
    let min_p = data.iter().map(|d| d.propensity).fold(1.0, f64::min);
    // Support: the target puts mass on an action never logged in the record's group.
    let mut logged_pairs: BTreeMap<(&str, &str), (f64, f64)> = BTreeMap::new();
    for d in data {
        let e = logged_pairs
            .entry((d.group.as_str(), d.actions[d.chosen].as_str()))
            .or_default();
        e.0 += d.reward;
        e.1 += 1.0;
    }
    let unsupported = data
        .iter()
        .filter(|d| {
            d.actions.iter().zip(&d.target).any(|(a, &p)| {
                p > 0.0 && !logged_pairs.contains_key(&(d.group.as_str(), a.as_str()))
            })
        })
        .count();
    let unsupported_share = unsupported as f64 / n.max(1) as f64;
    // Best in hindsight: per group, the best mean logged reward, weighted by the group's
    // share of records.
    let mut per_group: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for (&(g, _), &(s, c)) in &logged_pairs {
        let e = per_group.entry(g).or_insert((f64::NEG_INFINITY, 0.0));
        e.0 = e.0.max(s / c);
        e.1 += c;
    }
    let best = per_group.values().map(|(b, c)| b * c).sum::<f64>() / n.max(1) as f64;
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
        ci_method,
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
                    group: "c".into(),
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

    /// Contextual logs: 3 tiers x 4 languages x 2 sizes (24 contexts, uniform), logged by
    /// SquareCB over a fixed, imperfect score model of the context; target: a fixed
    /// deterministic policy of the context. True value: the mean over the 24 contexts of the
    /// target action's success rate.
    fn simulate_contextual(seed: u64, n: usize) -> (Vec<Logged>, f64) {
        let rate = |t: usize, l: usize, s: usize, a: usize| {
            0.15 + 0.7 * (((t * 7 + l * 3 + s * 5 + a * 11) % 10) as f64 / 9.0)
        };
        let target = |t: usize, l: usize, s: usize| (t + 2 * l + s) % 3;
        let mut truth = 0.0;
        for t in 0..3 {
            for l in 0..4 {
                for s in 0..2 {
                    truth += rate(t, l, s, target(t, l, s)) / 24.0;
                }
            }
        }
        let mut rng = Rng::new(seed);
        let data = (0..n)
            .map(|_| {
                let (t, l, s) = (rng.below(3), rng.below(4), rng.below(2));
                // The logger's scores: the true rates, blurred by a context-dependent error.
                let scores: Vec<f64> = (0..3)
                    .map(|a| rate(t, l, s, a) + 0.2 * (((t + l + a) % 3) as f64 - 1.0))
                    .collect();
                let p = crate::learner::squarecb(&scores, 10.0);
                let chosen = crate::learner::sample(&p, rng.uniform());
                let reward = f64::from(u8::from(rng.uniform() < rate(t, l, s, chosen)));
                let mut tp = vec![0.0; 3];
                tp[target(t, l, s)] = 1.0;
                let context = format!("tier={t},lang={l},size={s}");
                Logged {
                    group: context.clone(),
                    context,
                    actions: vec!["a".into(), "b".into(), "c".into()],
                    chosen,
                    propensity: p[chosen],
                    reward,
                    target: tp,
                }
            })
            .collect();
        (data, truth)
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
        // DR: record i's model from the records of the other folds (i mod 5): per arm (one
        // context), the arm's mean shrunk toward the overall mean with 2 records of weight,
        // and the cell (the same records) shrunk toward that with 2 more.
        let q = |fold: usize, a: usize| {
            let other = || {
                data.iter()
                    .enumerate()
                    .filter(move |(j, _)| j % FOLDS != fold)
                    .map(|(_, d)| d)
            };
            let g = other().map(|d| d.reward).sum::<f64>() / other().count() as f64;
            let (s, k) = other()
                .filter(|d| d.chosen == a)
                .fold((0.0, 0.0), |(s, k), d| (s + d.reward, k + 1.0));
            let qa = (s + SHRINK * g) / (k + SHRINK);
            (s + SHRINK * qa) / (k + SHRINK)
        };
        let dr = data
            .iter()
            .zip(&w)
            .enumerate()
            .map(|(i, (d, w))| q(i % FOLDS, 2) + w * (d.reward - q(i % FOLDS, d.chosen)))
            .sum::<f64>()
            / 2000.0;
        let arm = |a: usize| {
            let v: Vec<f64> = data
                .iter()
                .filter(|d| d.chosen == a)
                .map(|d| d.reward)
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        let best = arm(0).max(arm(1)).max(arm(2));
        assert!((r.ips.value - ips).abs() < 1e-12);
        assert!((r.snips.value - snips).abs() < 1e-12);
        assert!((r.dr.value - dr).abs() < 1e-9, "{} vs {dr}", r.dr.value);
        let ess = w.iter().sum::<f64>().powi(2) / w.iter().map(|w| w * w).sum::<f64>();
        assert!((r.effective_sample_size - ess).abs() < 1e-9);
        assert!((r.best_in_hindsight_value - best).abs() < 1e-12);
    }

    #[test]
    fn a_zero_standard_error_gives_no_interval() {
        // The target's arm was logged 5 times, and every record succeeded: the model is 1
        // everywhere, so every DR term is exactly 1 and DR's standard error on the data is 0
        // (and 99% of resamples agree), though 5 of 5 says little about the arm's rate.
        let mut data: Vec<Logged> = simulate(7, 200).0;
        let mut kept = 0;
        for d in data.iter_mut() {
            d.reward = 1.0;
            if d.chosen == 2 {
                if kept < 5 {
                    kept += 1;
                } else {
                    d.chosen = 0;
                    d.propensity = 0.8;
                }
            }
        }
        assert_eq!(kept, 5);
        let r = evaluate(&data, 500, 3);
        assert_eq!(r.ci_method, "bootstrap_t");
        assert_eq!(r.dr.value, 1.0);
        assert!(r.dr.ci_low.is_nan() && r.dr.ci_high.is_nan(), "{:?}", r.dr);
        assert!(
            r.warnings
                .iter()
                .any(|w| w.starts_with("DR: the logged data show no spread")),
            "{:?}",
            r.warnings
        );
        // IPS has a positive standard error here: bootstrap-t, no such warning.
        assert!(r.ips.ci_low < r.ips.value && r.ips.value < r.ips.ci_high);
        assert!(!r.warnings.iter().any(|w| w.starts_with("IPS:")));
    }

    #[test]
    fn too_few_records_or_resamples_say_so() {
        let (data, _) = simulate(3, 100);
        let one = evaluate(&data[..1], 200, 1);
        assert_eq!(one.ci_method, "none");
        assert!(one.dr.ci_low.is_nan() && one.dr.ci_high.is_nan());
        let normal = evaluate(&data, 0, 1);
        assert_eq!(normal.ci_method, "normal");
        let half = (normal.dr.ci_high - normal.dr.ci_low) / 2.0;
        assert!(half > 0.0);
        assert!((normal.dr.value - normal.dr.ci_low - half).abs() < 1e-12);
    }

    /// The reviewer's case: every record in a context of its own (as a contextual log's
    /// feature sets are), logging uniform over {A, B}, A always succeeding and B never, the
    /// target always A. The value is 1. A model fitted on the record it corrects (each
    /// record's own reward) cancelled the importance weights: DR gave 0.75.
    #[test]
    fn dr_keeps_its_weights_when_every_context_is_distinct() {
        let mut rng = Rng::new(11);
        let data: Vec<Logged> = (0..1000)
            .map(|i| {
                let chosen = rng.below(2);
                Logged {
                    context: format!("{{\"doc_tokens\":{i},\"user_id\":\"u{i}\"}}"),
                    group: String::new(),
                    actions: vec!["A".into(), "B".into()],
                    chosen,
                    propensity: 0.5,
                    reward: if chosen == 0 { 1.0 } else { 0.0 },
                    target: vec![1.0, 0.0],
                }
            })
            .collect();
        let r = evaluate(&data, 200, 5);
        assert!((r.ips.value - 1.0).abs() < 0.1, "{:?}", r.ips);
        assert!((r.dr.value - 1.0).abs() < 0.01, "{:?}", r.dr);
        assert!(r.dr.ci_low <= 1.0 && 1.0 <= r.dr.ci_high, "{:?}", r.dr);
        // Both actions were logged in the (one) group: the target is supported.
        assert_eq!(r.unsupported_share, 0.0);
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
        let mut covered_ctx = [0; 3];
        for seed in 0..seeds {
            for (sim, cov) in [
                (
                    simulate as fn(u64, usize) -> (Vec<Logged>, f64),
                    &mut covered,
                ),
                (simulate_contextual, &mut covered_ctx),
            ] {
                let (data, truth) = sim(100 + seed, 1000);
                let r = evaluate(&data, resamples, seed);
                for (i, iv) in [r.ips, r.snips, r.dr].iter().enumerate() {
                    if iv.ci_low <= truth && truth <= iv.ci_high {
                        cov[i] += 1;
                    }
                }
            }
        }
        eprintln!("contextual logs: covered {covered_ctx:?} of {seeds}");
        for c in covered_ctx {
            assert!(c as f64 >= 0.9 * seeds as f64, "{covered_ctx:?} of {seeds}");
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
