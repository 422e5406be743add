//! The HTTP service behind `weft router`: `POST /v1/route`, `POST /v1/feedback`,
//! `GET /healthz`, `GET /metrics`.
//!
//! A decision reads only the in-memory [`Snapshot`], which a background task refreshes from
//! ClickHouse every `refresh_period`; a decision never waits on ClickHouse. While ClickHouse
//! is unreachable the last snapshot (or the priors) keeps serving, and every decision says so
//! with the reason code `snapshot_stale` (or `priors_only`). Decisions are advisory: they
//! grant nothing, and the service never calls a tool.

// Handlers return their error answer (an HTTP response) directly; it is built once per
// failed request, so its size does not matter.
#![allow(clippy::result_large_err)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router as AxumRouter};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use weft_http::ApiKeys;
use weft_producers::Publisher;
use weft_schemas::contracts::{ExecutionCandidate, ExecutionRoutingDecision};
use weft_schemas::{Envelope, Kind};

use crate::model::Snapshot;
use crate::policy::{self, Constraints, PolicyConfig, PolicyName, PosteriorMemo};
use crate::rng::Rng;

/// Service settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Policy settings used for every decision.
    pub policy: PolicyConfig,
    /// How often the snapshot is re-read from ClickHouse (zero: never).
    pub refresh_period: Duration,
    /// Aggregates older than this are ignored.
    pub window_s: u64,
    /// Decay half-life applied when reading (0: none).
    pub half_life_s: f64,
    /// Source label of snapshots read from ClickHouse.
    pub source: String,
}

#[derive(Default)]
struct Counters {
    decisions: AtomicU64,
    no_fit: AtomicU64,
    rejected: AtomicU64,
    feedback: AtomicU64,
    publish_errors: AtomicU64,
    refresh_ok: AtomicU64,
    refresh_errors: AtomicU64,
    decision_us_sum: AtomicU64,
    /// Decision time histogram, buckets in microseconds (see `BUCKETS_US`).
    decision_us_buckets: [AtomicU64; 8],
}

const BUCKETS_US: [u64; 8] = [50, 100, 250, 500, 1000, 2500, 10_000, u64::MAX];

/// Bounded memory of recent decisions: decision id -> context key, so feedback sent
/// through this service can be stamped with the context its decision was made in.
#[derive(Default)]
struct Recent {
    map: HashMap<String, String>,
    order: VecDeque<String>,
}

const RECENT_MAX: usize = 200_000;

/// A memoised posterior state is drawn `MEMO_DRAW_FACTOR * mc_samples` times: its counts
/// serve every decision until the posterior changes, so they are worth more draws than one
/// decision's (1024 by default, about 0.2 ms once per posterior state).
const MEMO_DRAW_FACTOR: usize = 4;

/// Posterior states memoised at most (then the memo starts afresh); a few hundred bytes each.
const MEMO_CAPACITY: usize = 16_384;

impl Recent {
    fn insert(&mut self, id: String, ctx: String) {
        if self.order.len() >= RECENT_MAX {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
        self.order.push_back(id.clone());
        self.map.insert(id, ctx);
    }
}

struct Health {
    /// When the current snapshot was read (or loaded).
    loaded_at: Instant,
    /// `false` until a snapshot came from ClickHouse or a file.
    has_data: bool,
    /// The last refresh failed.
    stale: bool,
    last_error: Option<String>,
}

/// The router's shared state.
pub struct Service {
    cfg: ServiceConfig,
    keys: ApiKeys,
    publisher: Publisher,
    snapshot: RwLock<Arc<Snapshot>>,
    health: Mutex<Health>,
    recent: Mutex<Recent>,
    counters: Counters,
    seq: AtomicU64,
    started: u64,
    receipt_errors: Arc<AtomicU64>,
    /// Posterior counts per posterior state (see [`PosteriorMemo`]).
    memo: PosteriorMemo,
}

/// A route request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRequest {
    /// Request context; `x_weft_context` (else `intent`) picks the statistics, `tenant` must match the key's.
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

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"error": {"code": code, "message": message.into()}})),
    )
        .into_response()
}

/// The context key of a request: `x_weft_context`, else `intent`, else "".
pub fn context_key(ctx: &Map<String, Value>) -> String {
    ctx.get("x_weft_context")
        .or_else(|| ctx.get("intent"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

impl Service {
    /// `initial`: a snapshot file's content, if the router starts from one.
    pub fn new(
        cfg: ServiceConfig,
        keys: ApiKeys,
        publisher: Publisher,
        initial: Option<Snapshot>,
    ) -> Arc<Self> {
        let has_data = initial.is_some();
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Arc::new(Service {
            memo: PosteriorMemo::new(MEMO_DRAW_FACTOR * cfg.policy.mc_samples, MEMO_CAPACITY),
            cfg,
            keys,
            publisher,
            snapshot: RwLock::new(Arc::new(
                initial.unwrap_or_else(|| Snapshot::empty("priors")),
            )),
            health: Mutex::new(Health {
                loaded_at: Instant::now(),
                has_data,
                stale: false,
                last_error: None,
            }),
            recent: Mutex::new(Recent::default()),
            counters: Counters::default(),
            seq: AtomicU64::new(0),
            started,
            receipt_errors: Arc::default(),
        })
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.read().unwrap().clone()
    }

    /// Re-read the aggregates once; on failure keep the last snapshot and mark it stale.
    pub async fn refresh(&self, client: &clickhouse::Client) -> bool {
        let read = tokio::time::timeout(
            Duration::from_secs(10),
            crate::store::read_stats(
                client,
                &self.cfg.source,
                self.cfg.window_s,
                self.cfg.half_life_s,
            ),
        )
        .await;
        let mut h = self.health.lock().unwrap();
        match read {
            Ok(Ok(s)) => {
                *self.snapshot.write().unwrap() = Arc::new(s);
                h.loaded_at = Instant::now();
                h.has_data = true;
                h.stale = false;
                h.last_error = None;
                self.counters.refresh_ok.fetch_add(1, Ordering::Relaxed);
                true
            }
            Ok(Err(e)) => {
                h.stale = true;
                h.last_error = Some(e.to_string());
                self.counters.refresh_errors.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(_) => {
                h.stale = true;
                h.last_error = Some("timed out".into());
                self.counters.refresh_errors.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Refresh forever, every `refresh_period` (returns at once when the period is zero).
    pub async fn refresh_loop(self: Arc<Self>, client: clickhouse::Client) {
        if self.cfg.refresh_period.is_zero() {
            return;
        }
        let mut tick = tokio::time::interval(self.cfg.refresh_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_ok = true;
        loop {
            tick.tick().await;
            let ok = self.refresh(&client).await;
            if was_ok && !ok {
                let h = self.health.lock().unwrap();
                tracing::warn!(error = ?h.last_error, "router snapshot refresh failed; serving the last snapshot");
            } else if ok && !was_ok {
                tracing::info!("router snapshot refresh recovered");
            }
            was_ok = ok;
        }
    }

    fn next_decision_id(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("erd-{:x}-{:x}-{n}", self.started, std::process::id())
    }

    /// Decide one request for `tenant`; the decision's JSON text, as published. `Err`
    /// carries the HTTP answer.
    ///
    /// The decision is built once as the contract type (the request's candidates are moved
    /// into it, not copied), serialized once, and the same text is both published and
    /// answered.
    pub fn decide(
        &self,
        tenant: &str,
        req: RouteRequest,
        rng: &mut Rng,
    ) -> Result<Box<RawValue>, Response> {
        if req.candidates.is_empty() {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "no_candidates",
                "candidates is empty",
            ));
        }
        if let Some(t) = req.context.get("tenant").and_then(Value::as_str) {
            if t != tenant {
                return Err(error(
                    StatusCode::FORBIDDEN,
                    "tenant_forbidden",
                    "context.tenant is not the key's tenant",
                ));
            }
        }
        let policy = match req.policy.as_deref() {
            None => self.cfg.policy.policy,
            Some(p) => PolicyName::parse(p).ok_or_else(|| {
                error(
                    StatusCode::BAD_REQUEST,
                    "unknown_policy",
                    format!(
                        "policy `{p}` is not one of greedy, epsilon_greedy, thompson, ucb, static"
                    ),
                )
            })?,
        };
        let cfg = &self.cfg.policy;
        let ctx = context_key(&req.context);
        let snap = self.snapshot();
        let arms = snap.arms(tenant, &ctx);
        let ests = policy::estimates(
            cfg,
            req.candidates
                .iter()
                .map(|c| (c.candidate_id.as_str(), c.metadata.as_ref())),
            arms,
        );
        drop(snap);
        let constraints = Constraints::from_map(req.constraints.as_ref());
        let mut admissible = Vec::with_capacity(ests.len());
        let mut adm_ests = Vec::with_capacity(ests.len());
        let mut excluded = Map::new();
        for (i, e) in ests.iter().enumerate() {
            match constraints.violation(e) {
                None => {
                    admissible.push(i);
                    adm_ests.push(e.clone());
                }
                Some(code) => {
                    excluded.insert(e.candidate_id.clone(), Value::from(code));
                }
            }
        }
        let (has_data, stale, age) = {
            let h = self.health.lock().unwrap();
            (h.has_data, h.stale, h.loaded_at.elapsed().as_secs_f64())
        };
        let mut reasons: Vec<String> = Vec::with_capacity(6);
        if admissible.is_empty() {
            self.counters.no_fit.fetch_add(1, Ordering::Relaxed);
            let scores_all: Vec<f64> = ests.iter().map(|e| e.mean_utility(cfg)).collect();
            let mut order: Vec<usize> = (0..ests.len()).collect();
            order.sort_by(|a, b| scores_all[*b].total_cmp(&scores_all[*a]));
            reasons.push("no_candidate_fits".into());
            if !has_data {
                reasons.push("priors_only".into());
            }
            if stale {
                reasons.push("snapshot_stale".into());
            }
            return Err((
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({
                    "error": {"code": "no_candidate_fits", "message": "every candidate violates the constraints"},
                    "reason_codes": reasons,
                    "excluded": excluded,
                    "fallback_candidates": order.iter().map(|i| &req.candidates[*i]).collect::<Vec<_>>(),
                })),
            )
                .into_response());
        }
        // Posterior counts (confidence; Thompson's propensity) come from the memo: the
        // Monte-Carlo work is done once per posterior state, not once per request.
        let counts = self.memo.counts(cfg, &adm_ests, rng);
        let choice = policy::choose_with_counts(policy, cfg, &adm_ests, rng, &counts);
        let chosen = admissible[choice.chosen];
        reasons.push(format!("policy_{}", policy.as_str()));
        if !has_data {
            reasons.push("priors_only".into());
        }
        if stale {
            reasons.push("snapshot_stale".into());
        }
        let best =
            choice
                .scores
                .iter()
                .enumerate()
                .fold(0, |b, (i, s)| if *s > choice.scores[b] { i } else { b });
        reasons.push(
            if choice.chosen == best {
                "exploit"
            } else {
                "explore"
            }
            .into(),
        );
        if ests[chosen].n < cfg.min_obs {
            reasons.push("cold_start".into());
        }
        if !excluded.is_empty() {
            reasons.push("constraints_excluded_candidates".into());
        }
        // Fallbacks: the other admissible candidates, best score first.
        let mut fb: Vec<usize> = (0..admissible.len())
            .filter(|i| *i != choice.chosen)
            .collect();
        fb.sort_by(|a, b| choice.scores[*b].total_cmp(&choice.scores[*a]));
        let scores: Map<String, Value> = adm_ests
            .into_iter()
            .zip(&choice.scores)
            .map(|(e, s)| (e.candidate_id, Value::from(*s)))
            .collect();
        let decision_id = self.next_decision_id();
        let mut metadata = Map::new();
        metadata.insert("x_weft_policy".into(), policy.as_str().into());
        metadata.insert("x_weft_policy_version".into(), cfg.version.clone().into());
        metadata.insert("x_weft_propensity".into(), choice.propensity.into());
        metadata.insert("x_weft_scores".into(), Value::Object(scores));
        metadata.insert("x_weft_context".into(), ctx.clone().into());
        metadata.insert("x_weft_excluded".into(), Value::Object(excluded));
        metadata.insert("x_weft_snapshot_age_s".into(), age.into());
        metadata.insert("x_weft_advisory".into(), true.into());
        let request_id = req
            .context
            .get("request_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        // Move the candidates into the decision: the choice, then the fallbacks in order.
        let mut cands: Vec<Option<ExecutionCandidate>> =
            req.candidates.into_iter().map(Some).collect();
        let mut take = |i: usize| cands[i].take();
        let Some(candidate) = take(chosen) else {
            return Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "candidate taken twice",
            ));
        };
        let fallback_candidates: Vec<ExecutionCandidate> =
            fb.iter().filter_map(|i| take(admissible[*i])).collect();
        let decision = ExecutionRoutingDecision {
            decision_id: decision_id.clone(),
            candidate,
            confidence: Some(Some(choice.confidence)),
            reason_codes: Some(reasons),
            reason: None,
            fallback_candidates: Some(fallback_candidates),
            constraints: Some(req.constraints.unwrap_or_default()),
            policy_context_ref: None,
            trace_ref: None,
            created_at: Some(Some(weft_schemas::time::now_rfc3339())),
            metadata: Some(metadata),
            extra: Map::new(),
        };
        let raw = serde_json::value::to_raw_value(&decision)
            .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
        let env = Envelope {
            kind: Kind::ExecutionRoutingDecision,
            request_id,
            tenant: tenant.to_owned(),
            producer_id: None,
            seq: None,
            emitted_at: None,
            payload: raw.clone(),
        };
        let receipt = self.publisher.publish(env).map_err(|e| {
            self.counters.publish_errors.fetch_add(1, Ordering::Relaxed);
            error(StatusCode::INTERNAL_SERVER_ERROR, e.code(), e.to_string())
        })?;
        let me = self.counters_handle();
        tokio::spawn(async move {
            if receipt.await.is_err() {
                me.fetch_add(1, Ordering::Relaxed);
            }
        });
        self.recent.lock().unwrap().insert(decision_id, ctx);
        self.counters.decisions.fetch_add(1, Ordering::Relaxed);
        Ok(raw)
    }

    fn counters_handle(&self) -> Arc<AtomicU64> {
        // Receipts resolve after the handler returns; their failures are counted here.
        self.receipt_errors.clone()
    }

    fn observe_latency(&self, us: u64) {
        self.counters
            .decision_us_sum
            .fetch_add(us, Ordering::Relaxed);
        let i = BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(BUCKETS_US.len() - 1);
        self.counters.decision_us_buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text.
    pub fn metrics_text(&self) -> String {
        let c = &self.counters;
        let h = self.health.lock().unwrap();
        let snap = self.snapshot();
        let mut out = String::new();
        let mut line = |name: &str, help: &str, kind: &str, v: String| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            ));
        };
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        line(
            "weft_router_decisions_total",
            "Decisions returned.",
            "counter",
            g(&c.decisions),
        );
        line(
            "weft_router_no_fit_total",
            "Requests where no candidate met the constraints.",
            "counter",
            g(&c.no_fit),
        );
        line(
            "weft_router_rejected_total",
            "Requests refused (auth, bad input).",
            "counter",
            g(&c.rejected),
        );
        line(
            "weft_router_feedback_total",
            "Feedback events accepted.",
            "counter",
            g(&c.feedback),
        );
        line(
            "weft_router_publish_errors_total",
            "Decisions or feedback that could not be published.",
            "counter",
            (c.publish_errors.load(Ordering::Relaxed)
                + self.counters_handle().load(Ordering::Relaxed))
            .to_string(),
        );
        line(
            "weft_router_snapshot_refresh_total",
            "Successful snapshot refreshes.",
            "counter",
            g(&c.refresh_ok),
        );
        line(
            "weft_router_snapshot_refresh_errors_total",
            "Failed snapshot refreshes.",
            "counter",
            g(&c.refresh_errors),
        );
        line(
            "weft_router_snapshot_age_seconds",
            "Age of the snapshot decisions are served from.",
            "gauge",
            format!("{:.3}", h.loaded_at.elapsed().as_secs_f64()),
        );
        line(
            "weft_router_snapshot_stale",
            "1 when the last refresh failed.",
            "gauge",
            u8::from(h.stale).to_string(),
        );
        line(
            "weft_router_snapshot_cells",
            "Tenant x context x candidate cells in the snapshot.",
            "gauge",
            snap.cells().to_string(),
        );
        let (hits, misses) = self.memo.stats();
        line(
            "weft_router_posterior_memo_hits_total",
            "Decisions whose posterior counts were memoised.",
            "counter",
            hits.to_string(),
        );
        line(
            "weft_router_posterior_memo_misses_total",
            "Posterior states drawn afresh.",
            "counter",
            misses.to_string(),
        );
        if let Some(cpu) = process_cpu_seconds() {
            line(
                "process_cpu_seconds_total",
                "User and system CPU time of this process.",
                "counter",
                format!("{cpu:.3}"),
            );
        }
        out.push_str("# HELP weft_router_decision_seconds Server-side decision time.\n# TYPE weft_router_decision_seconds histogram\n");
        let mut cum = 0;
        for (i, b) in BUCKETS_US.iter().enumerate() {
            cum += c.decision_us_buckets[i].load(Ordering::Relaxed);
            let le = if *b == u64::MAX {
                "+Inf".to_owned()
            } else {
                format!("{}", *b as f64 / 1e6)
            };
            out.push_str(&format!(
                "weft_router_decision_seconds_bucket{{le=\"{le}\"}} {cum}\n"
            ));
        }
        out.push_str(&format!(
            "weft_router_decision_seconds_sum {}\nweft_router_decision_seconds_count {cum}\n",
            c.decision_us_sum.load(Ordering::Relaxed) as f64 / 1e6
        ));
        out
    }

    fn authenticate(&self, headers: &HeaderMap) -> Result<String, Response> {
        self.keys
            .authenticate(headers)
            .map(str::to_owned)
            .map_err(|e| {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                let (status, msg) = e.response();
                error(status, "unauthorized", msg)
            })
    }
}

async fn route(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let started = Instant::now();
    let tenant = match s.authenticate(&headers) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let req: RouteRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            s.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return error(StatusCode::BAD_REQUEST, "bad_request", e.to_string());
        }
    };
    let mut rng = Rng::from_entropy();
    let out = s.decide(&tenant, req, &mut rng);
    let us = started.elapsed().as_micros() as u64;
    match out {
        Ok(raw) => {
            s.observe_latency(us);
            let body: Box<str> = raw.into();
            let mut r = (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                String::from(body),
            )
                .into_response();
            if let Ok(h) = HeaderValue::from_str(&us.to_string()) {
                r.headers_mut().insert("x-weft-decision-us", h);
            }
            r
        }
        Err(r) => r,
    }
}

async fn feedback(
    State(s): State<Arc<Service>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let tenant = match s.authenticate(&headers) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let mut v: Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            s.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return error(StatusCode::BAD_REQUEST, "bad_request", e.to_string());
        }
    };
    // Stamp the decision's context key, so the aggregates file the outcome where it was decided.
    let decision_id = v
        .get("decision_id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let has_ctx = v
        .get("metadata")
        .and_then(|m| m.get("x_weft_context"))
        .is_some();
    if !has_ctx {
        if let Some(ctx) = s.recent.lock().unwrap().map.get(&decision_id).cloned() {
            let meta = v.entry("metadata").or_insert_with(|| json!({}));
            if let Some(m) = meta.as_object_mut() {
                m.insert("x_weft_context".into(), json!(ctx));
            }
        }
    }
    let env = match Envelope::new(Kind::ExecutionFeedback, &v) {
        Ok(e) => e.with_tenant(&tenant),
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", e.to_string()),
    };
    let receipt = match s.publisher.publish(env) {
        Ok(r) => r,
        Err(e) => {
            s.counters.rejected.fetch_add(1, Ordering::Relaxed);
            let status = if e.is_retriable() {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::BAD_REQUEST
            };
            return error(status, e.code(), e.to_string());
        }
    };
    match receipt.await {
        Ok(_) => {
            s.counters.feedback.fetch_add(1, Ordering::Relaxed);
            (StatusCode::ACCEPTED, Json(json!({"status": "accepted"}))).into_response()
        }
        Err(e) => {
            s.counters.publish_errors.fetch_add(1, Ordering::Relaxed);
            error(StatusCode::SERVICE_UNAVAILABLE, e.code(), e.to_string())
        }
    }
}

async fn metrics(State(s): State<Arc<Service>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics_text(),
    )
        .into_response()
}

/// The axum app.
pub fn app(s: Arc<Service>) -> AxumRouter {
    AxumRouter::new()
        .route("/v1/route", post(route))
        .route("/v1/feedback", post(feedback))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .with_state(s)
}

/// CPU seconds (user + system) this process has used, from `/proc/self/stat`; `None` where
/// there is no procfs. `weft bench route` divides decisions by it: decisions per core.
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name (which may hold spaces): utime and stime
    // are the 12th and 13th of those, in clock ticks.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) / ticks as f64)
}

#[cfg(test)]
mod tests {
    use super::process_cpu_seconds;

    #[test]
    fn cpu_seconds_grow_with_work() {
        let before = process_cpu_seconds().expect("procfs on Linux");
        // Burn a little CPU so the tick counter must move.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = process_cpu_seconds().expect("procfs on Linux");
        assert!(after > before, "{before} -> {after}");
    }
}
