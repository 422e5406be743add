//! One routing decision, in stages: check the request against the limits, estimate every
//! candidate and apply the constraints (with bounded risk for unknown figures), choose
//! (SquareCB over the contextual model, or a policy over the aggregates), and build the
//! ExecutionRoutingDecision that is both published and answered.

use std::sync::atomic::{AtomicBool, Ordering};

use serde::Deserialize;
use serde_json::{Map, Value};
use weft_schemas::contracts::{CandidateType, ExecutionCandidate, ExecutionRoutingDecision};
use weft_schemas::identity::MAX_ID_BYTES;

use crate::error::RouterError;
use crate::features::{self, Example, Feature};
use crate::learner::{self, TenantModel};
use crate::model::{Arms, Snapshot};
use crate::policy::{self, Constraints, Estimate, PolicyConfig, PolicyName, PosteriorMemo};
use crate::rng::Rng;

/// Documented request limits (docs/ROUTER.md, "Limits"); over them the answer is 413
/// (body) or 422 (`over_limit`), never a 500.
pub mod limits {
    /// Bytes of a `POST /v1/route` body.
    pub const ROUTE_BODY: usize = 256 * 1024;
    /// Bytes of a `POST /v1/feedback` body.
    pub const FEEDBACK_BODY: usize = 64 * 1024;
    /// Candidates per request.
    pub const CANDIDATES: usize = 64;
    /// Bytes of a candidate id, of the context key and of `decision_id`.
    pub const ID_BYTES: usize = 256;
    /// Entries of `context`.
    pub const CONTEXT_ENTRIES: usize = 64;
    /// Bytes of the request's `context`, serialized.
    pub const CONTEXT_BYTES: usize = 16 * 1024;
}

/// A route request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRequest {
    /// Request context; its fields are the contextual policy's features, `x_weft_context`
    /// (else `intent`) keys the aggregates, `tenant` must match the key's.
    #[serde(default)]
    pub context: Map<String, Value>,
    /// Candidates to choose from, in preference order for the static policy.
    pub candidates: Vec<ExecutionCandidate>,
    /// Limits on expected latency, cost and quality; see [`Constraints`].
    #[serde(default)]
    pub constraints: Option<Map<String, Value>>,
    /// Policy for this request instead of the configured one.
    #[serde(default)]
    pub policy: Option<String>,
}

/// The context key of a request: `x_weft_context`, else `intent`, else "".
pub fn context_key(ctx: &Map<String, Value>) -> String {
    ctx.get("x_weft_context")
        .or_else(|| ctx.get("intent"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn too_large(field: &'static str, message: String) -> RouterError {
    RouterError::TooLarge { field, message }
}

/// `Err(TooLarge)` naming `field` when `n` (counted in `unit`) is over `max`.
fn at_most(field: &'static str, n: usize, max: usize, unit: &str) -> Result<(), RouterError> {
    if n > max {
        return Err(too_large(field, format!("{n} {unit}, at most {max}")));
    }
    Ok(())
}

/// Check a parsed request against [`limits`] and the key's tenant; the policy it names.
pub fn check(
    req: &RouteRequest,
    tenant: &str,
    default: PolicyName,
) -> Result<PolicyName, RouterError> {
    if req.candidates.is_empty() {
        return Err(RouterError::NoCandidates);
    }
    at_most(
        "candidates",
        req.candidates.len(),
        limits::CANDIDATES,
        "candidates",
    )?;
    let mut ids = std::collections::HashSet::with_capacity(req.candidates.len());
    for (i, c) in req.candidates.iter().enumerate() {
        at_most(
            "candidate_id",
            c.candidate_id.len(),
            limits::ID_BYTES,
            "bytes",
        )?;
        // What the decision's schema (ExecutionCandidate) refuses is refused here, as the
        // caller's mistake, before a decision is made of it.
        if c.candidate_id.is_empty() {
            return Err(RouterError::BadRequest(format!(
                "candidates[{i}].candidate_id is empty"
            )));
        }
        if matches!(c.compiled_flow, Some(Some(_))) && c.candidate_type != CandidateType::Flow {
            return Err(RouterError::BadRequest(format!(
                "candidates[{i}].compiled_flow is only valid when candidate_type is `flow`"
            )));
        }
        if !ids.insert(c.candidate_id.as_str()) {
            return Err(RouterError::DuplicateCandidate(c.candidate_id.clone()));
        }
    }
    at_most(
        "context",
        req.context.len(),
        limits::CONTEXT_ENTRIES,
        "entries",
    )?;
    let ctx_bytes = serde_json::to_string(&req.context).map_or(0, |s| s.len());
    at_most("context", ctx_bytes, limits::CONTEXT_BYTES, "bytes")?;
    if context_key(&req.context).len() > limits::ID_BYTES {
        return Err(too_large(
            "context.intent",
            format!("the context key is over {} bytes", limits::ID_BYTES),
        ));
    }
    // The decision is published keyed by it: held to the id limit of every event.
    if let Some(r) = req.context.get("request_id").and_then(Value::as_str) {
        at_most("context.request_id", r.len(), MAX_ID_BYTES, "bytes")?;
    }
    if let Some(t) = req.context.get("tenant").and_then(Value::as_str) {
        if t != tenant {
            return Err(RouterError::TenantForbidden);
        }
    }
    Constraints::check(req.constraints.as_ref()).map_err(RouterError::BadRequest)?;
    match req.policy.as_deref() {
        None => Ok(default),
        Some(p) => PolicyName::parse(p).ok_or_else(|| RouterError::UnknownPolicy(p.into())),
    }
}

/// The candidates' estimates after the constraints.
pub struct Admission {
    /// Every candidate's estimate, in request order.
    pub ests: Vec<Estimate>,
    /// Indices (into the request's candidates) of the admissible ones.
    pub admissible: Vec<usize>,
    /// Candidate id -> reason code, for the excluded ones.
    pub excluded: Map<String, Value>,
}

/// Estimate the candidates (aggregates per context, with `held`: those aggregates plus
/// this replica's outcomes not stored yet, when there are any; declared priors; and the
/// contextual model's live figures, which win once there is an outcome) and apply the
/// constraints.
/// A figure a constraint needs that is still unknown admits the candidate only while fewer
/// than `risk_budget` of its decisions are in flight (`inflight(candidate)`).
pub fn admit(
    cfg: &PolicyConfig,
    req: &RouteRequest,
    snap: &Snapshot,
    tenant: &str,
    live: &TenantModel,
    held: Option<Arms>,
    inflight: impl Fn(&str) -> u32,
) -> Admission {
    let arms = held
        .as_ref()
        .or_else(|| snap.arms(tenant, &context_key(&req.context)));
    let mut ests = policy::estimates(
        cfg,
        req.candidates
            .iter()
            .map(|c| (c.candidate_id.as_str(), c.metadata.as_ref())),
        arms,
    );
    for e in &mut ests {
        if let Some(a) = live.arms.get(&e.candidate_id) {
            e.latency_ms = a.latency_bound(cfg.min_obs).or(e.latency_ms);
            e.cost = a.mean_cost().or(e.cost);
            e.quality = a.mean_quality().or(e.quality);
        }
    }
    let constraints = Constraints::from_map(req.constraints.as_ref());
    let mut admissible = Vec::with_capacity(ests.len());
    let mut over_budget = Vec::new();
    let mut excluded = Map::new();
    for (i, e) in ests.iter().enumerate() {
        if let Some(code) = constraints.violation(e) {
            excluded.insert(e.candidate_id.clone(), Value::from(code));
        } else if constraints.unknown(e) && inflight(&e.candidate_id) >= cfg.learner.risk_budget {
            over_budget.push(i);
        } else {
            admissible.push(i);
        }
    }
    // Unverified candidates over their risk budget wait while another candidate fits; when
    // none does, they are all admitted (there is nothing safer to prefer).
    if admissible.is_empty() {
        admissible = over_budget;
    } else {
        for i in over_budget {
            excluded.insert(
                ests[i].candidate_id.clone(),
                Value::from("unverified_in_flight"),
            );
        }
    }
    Admission {
        ests,
        admissible,
        excluded,
    }
}

/// A choice among the admissible candidates.
pub struct Chosen {
    /// Index into the admissible list.
    pub chosen: usize,
    /// Exact probability of the choice under the policy (Thompson: Monte-Carlo).
    pub propensity: f64,
    /// The policy's confidence in the choice.
    pub confidence: f64,
    /// Score of each admissible candidate.
    pub scores: Vec<f64>,
}

/// The context features and every admissible candidate's example.
pub fn examples(req: &RouteRequest, admissible: &[usize]) -> (Vec<Feature>, Vec<Example>) {
    let ctx = features::context_features(&req.context);
    let xs = admissible
        .iter()
        .map(|i| {
            let c = &req.candidates[*i];
            let cf = features::candidate_features(
                &c.candidate_id,
                &candidate_type(c),
                c.metadata.as_ref(),
            );
            features::example(&ctx, &cf)
        })
        .collect();
    (ctx, xs)
}

/// The candidate type's wire name (as stored, so a rebuilt model hashes it the same way).
pub fn candidate_type(c: &ExecutionCandidate) -> String {
    match serde_json::to_value(c.candidate_type) {
        Ok(Value::String(s)) => s,
        _ => "other".into(),
    }
}

/// Choose with `policy`: SquareCB over the contextual model, or a policy over the
/// aggregate estimates (memoised posterior counts for confidence and Thompson).
#[allow(clippy::too_many_arguments)]
pub fn choose(
    policy: PolicyName,
    cfg: &PolicyConfig,
    adm: &Admission,
    req: &RouteRequest,
    live: &TenantModel,
    memo: &PosteriorMemo,
    rng: &mut Rng,
) -> Chosen {
    if policy == PolicyName::SquareCb {
        let (_, xs) = examples(req, &adm.admissible);
        let cands: Vec<(&str, &Example)> = adm
            .admissible
            .iter()
            .zip(&xs)
            .map(|(i, x)| (req.candidates[*i].candidate_id.as_str(), x))
            .collect();
        let w = &cfg.weights;
        let optimistic = w.success.max(0.0) + w.quality.max(0.0);
        let (scores, p) = live.probabilities(&cfg.learner, &cands, optimistic);
        let chosen = learner::sample(&p, rng.uniform());
        return Chosen {
            chosen,
            propensity: p[chosen],
            confidence: p[chosen],
            scores,
        };
    }
    let adm_ests: Vec<Estimate> = adm
        .admissible
        .iter()
        .map(|i| adm.ests[*i].clone())
        .collect();
    let counts = memo.counts(cfg, &adm_ests, rng);
    let c = policy::choose_with_counts(policy, cfg, &adm_ests, rng, &counts);
    Chosen {
        chosen: c.chosen,
        propensity: c.propensity,
        confidence: c.confidence,
        scores: c.scores,
    }
}

/// What the decision says about the state it was made in.
pub struct Context<'a> {
    /// The policy.
    pub policy: PolicyName,
    /// The policy settings.
    pub cfg: &'a PolicyConfig,
    /// A snapshot was ever loaded.
    pub has_data: bool,
    /// The last refresh failed.
    pub stale: bool,
    /// Age of the snapshot (s).
    pub age_s: f64,
    /// Outcomes the tenant's live model holds for each candidate id.
    pub live_n: &'a dyn Fn(&str) -> f64,
}

/// The reason codes of a decision.
pub fn reasons(cx: &Context, adm: &Admission, ch: &Chosen) -> Vec<String> {
    let mut reasons: Vec<String> = Vec::with_capacity(6);
    reasons.push(format!("policy_{}", cx.policy.as_str()));
    if !cx.has_data {
        reasons.push("priors_only".into());
    }
    if cx.stale {
        reasons.push("snapshot_stale".into());
    }
    let best = ch
        .scores
        .iter()
        .enumerate()
        .fold(0, |b, (i, s)| if *s > ch.scores[b] { i } else { b });
    reasons.push(
        if ch.chosen == best {
            "exploit"
        } else {
            "explore"
        }
        .into(),
    );
    let e = &adm.ests[adm.admissible[ch.chosen]];
    if e.n.max((cx.live_n)(&e.candidate_id)) < cx.cfg.min_obs {
        reasons.push("cold_start".into());
    }
    if !adm.excluded.is_empty() {
        reasons.push("constraints_excluded_candidates".into());
    }
    reasons
}

/// Build the decision: the choice, then the other admissible candidates best first (moved
/// out of the request, not copied), and the router's metadata, with the request's context
/// features logged as `x_weft_features` so the model can be rebuilt from the stored row.
pub fn build(
    cx: &Context,
    decision_id: String,
    req: RouteRequest,
    adm: Admission,
    ch: &Chosen,
    reasons: Vec<String>,
) -> Result<ExecutionRoutingDecision, RouterError> {
    let mut fb: Vec<usize> = (0..adm.admissible.len())
        .filter(|i| *i != ch.chosen)
        .collect();
    fb.sort_by(|a, b| ch.scores[*b].total_cmp(&ch.scores[*a]));
    let scores: Map<String, Value> = adm
        .admissible
        .iter()
        .zip(&ch.scores)
        .map(|(i, s)| (adm.ests[*i].candidate_id.clone(), Value::from(*s)))
        .collect();
    let logged: Map<String, Value> = req
        .context
        .iter()
        .filter(|(k, _)| k.as_str() != "request_id" && k.as_str() != "tenant")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut metadata = Map::new();
    metadata.insert("x_weft_policy".into(), cx.policy.as_str().into());
    metadata.insert(
        "x_weft_policy_version".into(),
        cx.cfg.version.clone().into(),
    );
    metadata.insert("x_weft_propensity".into(), ch.propensity.into());
    metadata.insert("x_weft_scores".into(), Value::Object(scores));
    // The admissible candidates in request order: the order the policy saw (ties, static's
    // first), which the fallbacks (best first) and the scores (by id) do not keep, and
    // `weft eval` needs to judge a target policy on the same set.
    let admissible: Vec<Value> = adm
        .admissible
        .iter()
        .map(|i| Value::from(adm.ests[*i].candidate_id.clone()))
        .collect();
    metadata.insert("x_weft_admissible".into(), Value::Array(admissible));
    metadata.insert("x_weft_context".into(), context_key(&req.context).into());
    metadata.insert("x_weft_features".into(), Value::Object(logged));
    metadata.insert("x_weft_excluded".into(), Value::Object(adm.excluded));
    metadata.insert("x_weft_snapshot_age_s".into(), cx.age_s.into());
    metadata.insert("x_weft_advisory".into(), true.into());
    let mut cands: Vec<Option<ExecutionCandidate>> = req.candidates.into_iter().map(Some).collect();
    let mut take = |i: usize| cands.get_mut(i).and_then(Option::take);
    let candidate = take(adm.admissible[ch.chosen])
        .ok_or_else(|| RouterError::Internal("candidate taken twice".into()))?;
    let fallback_candidates: Vec<ExecutionCandidate> =
        fb.iter().filter_map(|i| take(adm.admissible[*i])).collect();
    Ok(ExecutionRoutingDecision {
        decision_id,
        candidate,
        confidence: Some(Some(ch.confidence)),
        reason_codes: Some(reasons),
        reason: None,
        fallback_candidates: Some(fallback_candidates),
        constraints: Some(req.constraints.unwrap_or_default()),
        policy_context_ref: None,
        trace_ref: None,
        created_at: Some(Some(weft_schemas::time::now_rfc3339())),
        metadata: Some(metadata),
        extra: Map::new(),
    })
}

/// What a decision is remembered by (for its feedback): the context key, the context
/// features, and every admissible candidate's features.
#[derive(Debug, Default)]
pub struct Remembered {
    /// The context key.
    pub context_key: String,
    /// The context features.
    pub ctx: Vec<Feature>,
    /// (candidate id, its features) of the choice and the fallbacks.
    pub cands: Vec<(String, Vec<Feature>)>,
    /// Its choice is no longer counted in flight ([`Remembered::settle`]).
    pub settled: AtomicBool,
}

impl Remembered {
    /// From a built decision.
    pub fn of(d: &ExecutionRoutingDecision, ctx: Vec<Feature>, key: String) -> Self {
        let cands = std::iter::once(&d.candidate)
            .chain(d.fallback_candidates.iter().flatten())
            .map(|c| {
                (
                    c.candidate_id.clone(),
                    features::candidate_features(
                        &c.candidate_id,
                        &candidate_type(c),
                        c.metadata.as_ref(),
                    ),
                )
            })
            .collect();
        Remembered {
            context_key: key,
            ctx,
            cands,
            settled: AtomicBool::new(false),
        }
    }

    /// The decision's choice, the first time its feedback comes (`None` after): a decision
    /// is in flight once, so however often its feedback is posted, it frees one slot of the
    /// risk budget, never one held by another decision.
    pub fn settle(&self) -> Option<&str> {
        if self.settled.swap(true, Ordering::AcqRel) {
            return None;
        }
        self.cands.first().map(|(id, _)| id.as_str())
    }

    /// About the bytes it holds on the heap and inline (for [`crate::service`]'s bound on
    /// remembered decisions).
    pub fn bytes(&self) -> usize {
        let feature = std::mem::size_of::<Feature>();
        let entry = std::mem::size_of::<(String, Vec<Feature>)>();
        std::mem::size_of::<Self>()
            + self.context_key.len()
            + self.ctx.len() * feature
            + self
                .cands
                .iter()
                .map(|(id, f)| entry + id.len() + f.len() * feature)
                .sum::<usize>()
    }

    /// The example of `candidate` (one of the decision's), if it was one.
    pub fn example(&self, candidate: &str) -> Option<Example> {
        self.cands
            .iter()
            .find(|c| c.0 == candidate)
            .map(|c| features::example(&self.ctx, &c.1))
    }

    /// From a stored decision's payload (the refresh): the logged `x_weft_features`, the
    /// candidate and the fallbacks.
    pub fn from_payload(d: &Value) -> Option<Self> {
        let ctx_map = d.get("metadata")?.get("x_weft_features")?.as_object()?;
        let ctx = features::context_features(ctx_map);
        let cands = std::iter::once(d.get("candidate")?)
            .chain(
                d.get("fallback_candidates")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten(),
            )
            .filter_map(|c| {
                let id = c.get("candidate_id")?.as_str()?;
                let t = c
                    .get("candidate_type")
                    .and_then(Value::as_str)
                    .unwrap_or("other");
                let meta = c.get("metadata").and_then(Value::as_object);
                Some((id.to_owned(), features::candidate_features(id, t, meta)))
            })
            .collect();
        Some(Remembered {
            context_key: String::new(),
            ctx,
            cands,
            settled: AtomicBool::new(false),
        })
    }
}

#[cfg(test)]
mod sim {
    //! Replays the default policy in process on an environment's draws written by
    //! `bench/router-learning/dump_draws.py`: the decision path of the service (admission,
    //! SquareCB, learning) without HTTP, for tuning. The benchmark itself goes over HTTP.
    use super::*;
    use crate::learner::{Observation, Outcome};

    /// `SIM_DRAWS=/tmp/draws.json cargo test --release -p weft-router sim_env -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn sim_env() {
        let Ok(path) = std::env::var("SIM_DRAWS") else {
            return;
        };
        let runs: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut cfg = PolicyConfig::default();
        if let Some(v) = std::env::var("SIM_GAMMA").ok().and_then(|v| v.parse().ok()) {
            cfg.learner.gamma_scale = v;
        }
        if let Some(v) = std::env::var("SIM_RIDGE").ok().and_then(|v| v.parse().ok()) {
            cfg.learner.ridge = v;
        }
        if let Some(v) = std::env::var("SIM_CONF").ok().and_then(|v| v.parse().ok()) {
            cfg.learner.confidence = v;
        }
        let seed0: u64 = std::env::var("SIM_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let (mut regret, mut share, mut viol, mut last, mut oracle) = (0.0, 0.0, 0.0, 0.0, 0.0);
        let memo = PosteriorMemo::new(16, 16);
        for (seed, run) in runs.iter().enumerate() {
            let mut model = TenantModel::default();
            let mut rng = Rng::new(seed as u64 + seed0);
            let feasible: Vec<bool> = serde_json::from_value(run["feasible"].clone()).unwrap();
            let lat: Vec<f64> = serde_json::from_value(run["latency"].clone()).unwrap();
            let cycles = run["cycles"].as_array().unwrap();
            let n = cycles.len();
            let mut pulls = vec![0u32; feasible.len()];
            let r0 = regret;
            for (t, c) in cycles.iter().enumerate() {
                let mut body =
                    serde_json::json!({"context": c["context"], "candidates": run["candidates"]});
                if let Some(m) = run["max_latency_ms"].as_f64() {
                    body["constraints"] = serde_json::json!({"max_latency_ms": m});
                }
                let req: RouteRequest = serde_json::from_value(body).unwrap();
                let adm = admit(
                    &cfg,
                    &req,
                    &Snapshot::empty("sim"),
                    "t",
                    &model,
                    None,
                    |_| 0,
                );
                let ch = choose(
                    PolicyName::SquareCb,
                    &cfg,
                    &adm,
                    &req,
                    &model,
                    &memo,
                    &mut rng,
                );
                let a = adm.admissible[ch.chosen];
                let rate: Vec<f64> = serde_json::from_value(c["rate"].clone()).unwrap();
                let u: Vec<f64> = serde_json::from_value(c["u"].clone()).unwrap();
                let best = (0..rate.len())
                    .filter(|i| feasible[*i])
                    .max_by(|x, y| rate[*x].total_cmp(&rate[*y]))
                    .unwrap();
                let got = if feasible[a] { rate[a] } else { 0.0 };
                regret += (rate[best] - got) / runs.len() as f64;
                if !feasible[a] {
                    viol += 1.0 / runs.len() as f64;
                }
                if t >= n - 500 {
                    share += f64::from(u8::from(a == best)) / (500 * runs.len()) as f64;
                    last += got / (500 * runs.len()) as f64;
                    oracle += rate[best] / (500 * runs.len()) as f64;
                }
                let success = u[a] < rate[a];
                pulls[a] += 1;
                let (_, xs) = examples(&req, &[a]);
                model.learn(
                    &cfg.learner,
                    &Observation {
                        feedback_id: t.to_string(),
                        candidate_id: req.candidates[a].candidate_id.clone(),
                        example: xs[0].clone(),
                        outcome: Outcome {
                            reward: f64::from(u8::from(success)),
                            latency_ms: Some(lat[a] * (0.8 + 0.4 * u[(a + 1) % u.len()])),
                            cost: 0.0,
                            quality: None,
                        },
                    },
                );
            }
            if std::env::var("SIM_VERBOSE").is_ok() {
                eprintln!(
                    "seed {seed}: regret {:.1} pulls {pulls:?}",
                    (regret - r0) * runs.len() as f64
                );
            }
        }
        eprintln!(
            "regret {regret:.1}, best share (last 500) {share:.3}, violations {viol:.1}, \
             last-500 mean {last:.4} vs oracle {oracle:.4} ({:.1}%)",
            100.0 * last / oracle
        );
    }
}
