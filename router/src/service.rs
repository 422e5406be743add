//! The HTTP service behind `weft router`: `POST /v1/route`, `POST /v1/feedback`,
//! `GET /v1/model`, `GET /healthz`, `GET /metrics`.
//!
//! A decision reads only in-memory state: the aggregates [`Snapshot`] and the contextual
//! model ([`Live`]), both refreshed from ClickHouse by a background task every
//! `refresh_period`; a decision never waits on ClickHouse. Feedback posted here is learnt by
//! the contextual model at once. While ClickHouse is unreachable the last state (or the
//! priors) keeps serving, and every decision says so with the reason code `snapshot_stale`
//! (or `priors_only`). Decisions are advisory: they grant nothing, and the service never
//! calls a tool.

// Handlers return their error answer (an HTTP response) directly; it is built once per
// failed request, so its size does not matter.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router as AxumRouter};
use parking_lot::{Mutex, RwLock};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use weft_http::{ApiError, ApiKeys, BodyError, Caller, HasApiKeys, Unauthorized};
use weft_producers::{PublishError, Publisher};
use weft_schemas::{Envelope, EnvelopeError, Kind};

use crate::decide::{self, limits, Context, Remembered, RouteRequest};
use crate::error::RouterError;
use crate::learner::{Observation, Outcome};
use crate::live::Live;
use crate::metrics::RouterMetrics;
use crate::model::Snapshot;
use crate::overlay::{Delta, Overlay};
use crate::policy::{PolicyConfig, PolicyName, PosteriorMemo};
use crate::rng::Rng;

pub use crate::decide::context_key;
use recent::Recent;
pub use recent::{RECENT_MAX, RECENT_MAX_BYTES};

mod recent;
mod refresh;
#[cfg(test)]
use refresh::overlay_settle;
pub use refresh::REBUILD_EVERY;

/// Service settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Policy settings used for every decision.
    pub policy: PolicyConfig,
    /// How often the snapshot is re-read from ClickHouse (zero: never).
    pub refresh_period: Duration,
    /// Aggregates (and outcomes, for the contextual model) older than this are ignored.
    pub window_s: u64,
    /// Decay half-life applied when reading the aggregates (0: none).
    pub half_life_s: f64,
    /// (context, candidate) cells of the aggregates read per tenant at most.
    pub max_cells: u64,
    /// Source label of snapshots read from ClickHouse.
    pub source: String,
    /// The most `/v1/*` requests handled at once; one more is answered 503 `busy` at once
    /// ([`weft_http::limit_in_hand`]).
    pub max_concurrent_requests: usize,
    /// The longest a request's whole body may take to arrive; slower: 408 `body_timeout`,
    /// and its slot (of `max_concurrent_requests`) freed ([`weft_http::read_body`]).
    pub body_timeout: Duration,
}

/// The default [`ServiceConfig::max_concurrent_requests`]: 512 route bodies of at most
/// 256 KiB hold 128 MiB, as the gateway's 16 of 8 MiB; far more than a decision's
/// microseconds need to serve thousands a second.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 512;

/// The default [`ServiceConfig::body_timeout`], in seconds: a route body (256 KiB at most)
/// takes milliseconds on any working link; 10 s leaves room for a slow one, while a client
/// trickling bytes holds a slot 10 s, not for ever.
pub const DEFAULT_BODY_TIMEOUT_SECS: u64 = 10;

/// A memoised posterior state is drawn `MEMO_DRAW_FACTOR * mc_samples` times.
const MEMO_DRAW_FACTOR: usize = 4;
/// Posterior states memoised at most (then the memo starts afresh).
const MEMO_CAPACITY: usize = 16_384;

struct Health {
    loaded_at: Instant,
    has_data: bool,
    stale: bool,
    last_error: Option<String>,
    /// Visibility watermark of the contextual model's rows (µs); `None` before the first
    /// successful read (which rebuilds the model from the whole window).
    watermark: Option<i64>,
    /// Incremental refreshes since the last full rebuild, those that failed or ran out of
    /// time included.
    since_rebuild: u32,
    /// The last incremental read learnt a row out of the visibility order.
    late: bool,
    /// When the last full rebuild was installed (or the start).
    rebuilt_at: Instant,
}

impl Health {
    /// Nothing read yet; `has_data` when a snapshot file was loaded.
    fn new(has_data: bool) -> Self {
        Health {
            loaded_at: Instant::now(),
            has_data,
            stale: false,
            last_error: None,
            watermark: None,
            since_rebuild: 0,
            late: false,
            rebuilt_at: Instant::now(),
        }
    }
}

/// The router's shared state.
pub struct Service {
    cfg: ServiceConfig,
    keys: ApiKeys,
    publisher: Publisher,
    snapshot: RwLock<Arc<Snapshot>>,
    health: Mutex<Health>,
    recent: Mutex<Recent>,
    metrics: Arc<RouterMetrics>,
    live: Live,
    overlay: Overlay,
    memo: PosteriorMemo,
    /// The full rebuild under way, resumed by the next refresh ([`crate::live::Rebuild`]).
    rebuilding: tokio::sync::Mutex<Option<crate::live::Rebuild>>,
}

/// A decision's choice counted in flight ([`Live::decided`]) before the decision is
/// published: dropped without [`InFlight::keep`] (the decision failed: not built, not
/// published), the count is taken back, so a refused decision spends no risk budget.
struct InFlight<'a> {
    live: &'a Live,
    tenant: &'a str,
    candidate: String,
    kept: bool,
}

impl<'a> InFlight<'a> {
    fn reserve(live: &'a Live, tenant: &'a str, candidate: &str) -> Self {
        live.decided(tenant, candidate);
        InFlight {
            live,
            tenant,
            candidate: candidate.to_owned(),
            kept: false,
        }
    }

    /// The decision was made: it stays in flight until its outcome.
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.live.settled(self.tenant, &self.candidate);
        }
    }
}

/// 128 random bits from the OS, as the decision id `erd-<32 hex>`.
fn random_decision_id() -> Result<String, RouterError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| RouterError::Internal(format!("no randomness: {e}")))?;
    let mut s = String::with_capacity(36);
    s.push_str("erd-");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    Ok(s)
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
        let live = Live::default();
        if let Some(s) = &initial {
            live.load(s.contextual.clone());
        }
        Arc::new(Service {
            memo: PosteriorMemo::new(MEMO_DRAW_FACTOR * cfg.policy.mc_samples, MEMO_CAPACITY),
            cfg,
            keys,
            publisher,
            snapshot: RwLock::new(Arc::new(
                initial.unwrap_or_else(|| Snapshot::empty("priors")),
            )),
            health: Mutex::new(Health::new(has_data)),
            recent: Mutex::new(Recent::default()),
            metrics: Arc::default(),
            live,
            overlay: Overlay::default(),
            rebuilding: Default::default(),
        })
    }

    /// The current aggregates snapshot, with the contextual models.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.read().clone()
    }

    /// The contextual models served (per tenant).
    pub fn live(&self) -> &Live {
        &self.live
    }

    /// Decide one request for `tenant`; the decision's JSON text, as published.
    #[tracing::instrument(level = "debug", skip_all, fields(tenant))]
    pub fn decide(
        &self,
        tenant: &str,
        req: RouteRequest,
        rng: &mut Rng,
    ) -> Result<Box<RawValue>, Response> {
        self.decide_with(tenant, req, rng, |request_id, raw| {
            self.publish_decision(tenant, request_id, raw)
        })
    }

    /// [`Service::decide`] with the publishing step given (the tests' seam).
    fn decide_with(
        &self,
        tenant: &str,
        req: RouteRequest,
        rng: &mut Rng,
        publish: impl FnOnce(Option<String>, Box<RawValue>) -> Result<(), Response>,
    ) -> Result<Box<RawValue>, Response> {
        let cfg = &self.cfg.policy;
        let policy = decide::check(&req, tenant, cfg.policy).map_err(|e| {
            self.metrics.rejected.inc();
            e.into_response()
        })?;
        // A constrained request's risk budget is checked at admission and counted as soon as
        // the choice is made: the tenant's constrained decisions are admitted and chosen one
        // at a time, so that concurrent requests cannot all pass the check before any is
        // counted. The gate is released before the decision is published: publishing may wait
        // on a slow broker (the publisher's pacing, up to its message timeout), and a
        // blocking lock held across that wait would stall every worker thread that serves a
        // constrained request of the tenant.
        let gate = req
            .constraints
            .as_ref()
            .is_some_and(|c| !c.is_empty())
            .then(|| self.live.constrained_gate(tenant));
        let one_at_a_time = gate.as_ref().map(|g| g.lock());
        let live = self.live.model(tenant);
        let snap = self.snapshot();
        // The contextual policy reads this replica's outcomes from its model; the others
        // from the aggregates with the outcomes not stored yet added.
        let held = (policy != PolicyName::SquareCb)
            .then(|| {
                let key = decide::context_key(&req.context);
                let ids = req.candidates.iter().map(|c| c.candidate_id.as_str());
                self.overlay
                    .arms(tenant, &key, snap.arms(tenant, &key), ids)
            })
            .flatten();
        let adm = decide::admit(cfg, &req, &snap, tenant, &live, held, |c| {
            self.live.inflight(tenant, c)
        });
        let (has_data, stale, age_s) = {
            let h = self.health.lock();
            (h.has_data, h.stale, h.loaded_at.elapsed().as_secs_f64())
        };
        if adm.admissible.is_empty() {
            return Err(self.no_fit(&req, &adm, has_data, stale));
        }
        let ch = decide::choose(policy, cfg, &adm, &req, &live, &self.memo, rng);
        let in_flight = InFlight::reserve(
            &self.live,
            tenant,
            &req.candidates[adm.admissible[ch.chosen]].candidate_id,
        );
        drop(one_at_a_time);
        let live_n = |id: &str| live.arms.get(id).map_or(0.0, |a| a.n);
        let cx = Context {
            policy,
            cfg,
            has_data,
            stale,
            age_s,
            live_n: &live_n,
        };
        let reasons = decide::reasons(&cx, &adm, &ch);
        let (ctx_features, _) = decide::examples(&req, &[]);
        let key = context_key(&req.context);
        let request_id = req
            .context
            .get("request_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let decision_id = random_decision_id().map_err(IntoResponse::into_response)?;
        let decision = decide::build(&cx, decision_id.clone(), req, adm, &ch, reasons)
            .map_err(IntoResponse::into_response)?;
        let remembered = Arc::new(Remembered::of(&decision, ctx_features, key));
        let raw = serde_json::value::to_raw_value(&decision)
            .map_err(|e| RouterError::Internal(e.to_string()).into_response())?;
        publish(request_id, raw.clone())?;
        in_flight.keep();
        self.recent.lock().insert(tenant, decision_id, remembered);
        self.metrics.decisions.inc();
        Ok(raw)
    }

    fn no_fit(
        &self,
        req: &RouteRequest,
        adm: &decide::Admission,
        has_data: bool,
        stale: bool,
    ) -> Response {
        self.metrics.no_fit.inc();
        let cfg = &self.cfg.policy;
        let scores: Vec<f64> = adm.ests.iter().map(|e| e.mean_utility(cfg)).collect();
        let mut order: Vec<usize> = (0..adm.ests.len()).collect();
        order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
        let mut reasons = vec!["no_candidate_fits"];
        if !has_data {
            reasons.push("priors_only");
        }
        if stale {
            reasons.push("snapshot_stale");
        }
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({
                "error": {"code": "no_candidate_fits", "message": "every candidate violates the constraints"},
                "reason_codes": reasons,
                "excluded": adm.excluded,
                "fallback_candidates": order.iter().map(|i| &req.candidates[*i]).collect::<Vec<_>>(),
            })),
        )
            .into_response()
    }

    fn publish_decision(
        &self,
        tenant: &str,
        request_id: Option<String>,
        raw: Box<RawValue>,
    ) -> Result<(), Response> {
        let env = Envelope {
            kind: Kind::ExecutionRoutingDecision,
            request_id,
            tenant: tenant.to_owned(),
            producer_id: None,
            seq: None,
            emitted_at: None,
            payload: raw,
        };
        let receipt = self.publisher.publish(env).map_err(|e| {
            self.metrics.publish_errors.inc();
            let status = decision_publish_status(&e);
            if status.is_server_error() {
                tracing::warn!(code = e.code(), error = %e, "a decision could not be published");
            }
            RouterError::Publish(e.code(), e.to_string(), status).into_response()
        })?;
        // Receipts resolve after the handler returns; their failures are counted here.
        let errors = self.metrics.publish_errors.clone();
        tokio::spawn(async move {
            if receipt.await.is_err() {
                errors.inc();
            }
        });
        Ok(())
    }

    /// Take one feedback for `tenant`: stamp the context key of its decision (when this
    /// router made it, for this tenant), publish it, and once durable learn it at once.
    async fn take_feedback(
        &self,
        tenant: &str,
        mut v: Map<String, Value>,
    ) -> Result<(), RouterError> {
        let decision_id = v
            .get("decision_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let candidate = v
            .get("candidate_id")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if decision_id.len() > limits::ID_BYTES || candidate.len() > limits::ID_BYTES {
            return Err(RouterError::TooLarge {
                field: "decision_id",
                message: format!("ids are at most {} bytes", limits::ID_BYTES),
            });
        }
        // A context key the caller sends becomes an overlay key: held to the limit `/v1/route`
        // holds it to.
        let sent_context = v.get("metadata").and_then(|m| m.get("x_weft_context"));
        if sent_context
            .and_then(Value::as_str)
            .is_some_and(|c| c.len() > limits::ID_BYTES)
        {
            return Err(RouterError::TooLarge {
                field: "metadata.x_weft_context",
                message: format!("the context key is at most {} bytes", limits::ID_BYTES),
            });
        }
        let has_ctx = sent_context.is_some();
        let candidate = candidate.to_owned();
        let decision_id = decision_id.to_owned();
        let remembered = self.recent.lock().get(tenant, &decision_id);
        if let Some(r) = &remembered {
            if !has_ctx {
                let meta = v.entry("metadata").or_insert_with(|| json!({}));
                if let Some(m) = meta.as_object_mut() {
                    m.insert("x_weft_context".into(), json!(r.context_key));
                }
            }
        }
        let payload = Value::Object(v);
        let feedback_id = weft_schemas::identity::identity(Kind::ExecutionFeedback, &payload)
            .map_err(|e| RouterError::BadRequest(e.to_string()))?;
        let env = Envelope::new(Kind::ExecutionFeedback, &payload)
            .map_err(|e| RouterError::BadRequest(e.to_string()))?
            .with_tenant(tenant);
        let receipt = self.publisher.publish(env).map_err(|e| {
            self.metrics.rejected.inc();
            let status = if e.is_retriable() {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::BAD_REQUEST
            };
            RouterError::Publish(e.code(), e.to_string(), status)
        })?;
        receipt.await.map_err(|e| {
            self.metrics.publish_errors.inc();
            RouterError::Publish(e.code(), e.to_string(), StatusCode::SERVICE_UNAVAILABLE)
        })?;
        self.metrics.feedback.inc();
        let pc = &self.cfg.policy;
        let outcome = Outcome::from_feedback(&payload, &pc.weights, pc.prior_quality);
        let context_key = payload
            .get("metadata")
            .and_then(|m| m.get("x_weft_context"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        self.overlay.add(
            tenant,
            &Delta {
                feedback_id: &feedback_id,
                context_key,
                candidate_id: &candidate,
                success: payload.get("success").and_then(Value::as_bool) == Some(true),
                latency_ms: outcome.latency_ms,
                cost: outcome.cost,
                quality: outcome.quality,
            },
        );
        // The decision's choice is no longer in flight, whichever candidate ran; a repeated
        // feedback settles nothing more.
        if let Some(chosen) = remembered.as_ref().and_then(|r| r.settle()) {
            self.live.settled(tenant, chosen);
        }
        let example = remembered.and_then(|r| r.example(&candidate));
        if let Some(example) = example {
            let obs = Observation {
                feedback_id,
                candidate_id: candidate,
                example,
                outcome,
            };
            if self.live.learn_now(&pc.learner, tenant, &decision_id, obs) {
                self.metrics.learned_now.inc();
            }
        }
        Ok(())
    }

    /// Prometheus text.
    pub fn metrics_text(&self) -> String {
        let m = &self.metrics;
        {
            let h = self.health.lock();
            m.snapshot_age.set(h.loaded_at.elapsed().as_secs_f64());
            m.snapshot_stale.set(i64::from(h.stale));
            m.model_age.set(h.rebuilt_at.elapsed().as_secs_f64());
        }
        let snap = self.snapshot();
        m.snapshot_cells.set(snap.cells() as i64);
        m.snapshot_tenants_at_cell_limit
            .set(snap.tenants_at(self.cfg.max_cells) as i64);
        RouterMetrics::mirror(&m.model_arms_evicted, self.live.arms_evicted());
        RouterMetrics::mirror(&m.model_learn_deferred, self.live.learn_deferred());
        let (hits, misses) = self.memo.stats();
        RouterMetrics::mirror(&m.memo_hits, hits);
        RouterMetrics::mirror(&m.memo_misses, misses);
        m.text()
    }

    /// The caller's tenant, or the refusal (counted).
    fn authenticate(&self, caller: Result<Caller, ApiError>) -> Result<String, RouterError> {
        caller.map(|c| c.tenant).map_err(|e| {
            self.metrics.rejected.inc();
            RouterError::Unauthorized(if e.code == "missing_api_key" {
                Unauthorized::Missing
            } else {
                Unauthorized::Invalid
            })
        })
    }

    /// Authenticate, then read a JSON body of at most `limit` bytes, within
    /// [`ServiceConfig::body_timeout`].
    async fn read<T: serde::de::DeserializeOwned>(
        &self,
        caller: Result<Caller, ApiError>,
        body: Body,
        limit: usize,
    ) -> Result<(String, T), RouterError> {
        let tenant = self.authenticate(caller)?;
        let bytes = weft_http::read_body(body, limit, self.cfg.body_timeout)
            .await
            .map_err(|e| {
                self.metrics.rejected.inc();
                match e {
                    BodyError::TooLarge { limit } => RouterError::BodyTooLarge {
                        got: limit + 1,
                        limit,
                    },
                    BodyError::Timeout { timeout } => RouterError::BodyTimeout(timeout),
                    BodyError::Unreadable(e) => {
                        RouterError::BadRequest(format!("the request body could not be read: {e}"))
                    }
                }
            })?;
        // One reading of a payload: a key given twice is refused, as at every entry.
        let v = std::str::from_utf8(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|text| weft_schemas::strict::check(text).map_err(|e| e.to_string()))
            .and_then(|()| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
            .map_err(|e| {
                self.metrics.rejected.inc();
                RouterError::BadRequest(e)
            })?;
        Ok((tenant, v))
    }
}

/// The answer to a decision the publisher refused: 503 (with `Retry-After`) when the
/// caller may retry it as is, a 4xx when the decision made of the request is not a valid
/// event ([`decide::check`] refuses what it can foresee), else 500.
fn decision_publish_status(e: &PublishError) -> StatusCode {
    match e {
        _ if e.is_retriable() => StatusCode::SERVICE_UNAVAILABLE,
        PublishError::Invalid(EnvelopeError::IdTooLong { .. }) | PublishError::TooLarge { .. } => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        PublishError::Invalid(_) | PublishError::Nonconforming { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl HasApiKeys for Service {
    fn api_keys(&self) -> &ApiKeys {
        &self.keys
    }
}

async fn route(
    State(s): State<Arc<Service>>,
    caller: Result<Caller, ApiError>,
    body: Body,
) -> Response {
    let started = Instant::now();
    let (tenant, req) = match s
        .read::<RouteRequest>(caller, body, limits::ROUTE_BODY)
        .await
    {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let mut rng = Rng::from_entropy();
    let out = s.decide(&tenant, req, &mut rng);
    let elapsed = started.elapsed();
    match out {
        Ok(raw) => {
            s.metrics.decision_seconds.observe(elapsed.as_secs_f64());
            let body: Box<str> = raw.into();
            let mut r = (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                String::from(body),
            )
                .into_response();
            if let Ok(h) = HeaderValue::from_str(&elapsed.as_micros().to_string()) {
                r.headers_mut().insert("x-weft-decision-us", h);
            }
            r
        }
        Err(r) => r,
    }
}

async fn feedback(
    State(s): State<Arc<Service>>,
    caller: Result<Caller, ApiError>,
    body: Body,
) -> Response {
    let (tenant, v) = match s
        .read::<Map<String, Value>>(caller, body, limits::FEEDBACK_BODY)
        .await
    {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    match s.take_feedback(&tenant, v).await {
        Ok(()) => (StatusCode::ACCEPTED, Json(json!({"status": "accepted"}))).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/model`: the caller's tenant's contextual model as served (JSON), for operators
/// and the replica test; another tenant's is never reachable.
async fn model(State(s): State<Arc<Service>>, caller: Result<Caller, ApiError>) -> Response {
    match s.authenticate(caller) {
        Ok(tenant) => Json(s.live.served(&tenant)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(s): State<Arc<Service>>) -> Response {
    weft_http::metrics_response(s.metrics_text())
}

/// The axum app: at most [`ServiceConfig::max_concurrent_requests`] `/v1/*` requests in
/// hand (one more: 503 `busy`, before its body is read); `/healthz` and `/metrics` are not
/// counted, so a busy router can still be watched.
pub fn app(s: Arc<Service>) -> AxumRouter {
    let in_hand = Arc::new(tokio::sync::Semaphore::new(
        s.cfg.max_concurrent_requests.max(1),
    ));
    AxumRouter::new()
        .route("/v1/route", post(route))
        .route("/v1/feedback", post(feedback))
        .route("/v1/model", get(model))
        .route_layer(axum::middleware::from_fn_with_state(
            in_hand,
            weft_http::limit_in_hand,
        ))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .with_state(s)
}

#[cfg(test)]
mod tests;
