//! `weft audit serve`: the read-only audit API over the same functions as the CLI.
//!
//! Every route but `/healthz` needs `Authorization: Bearer KEY`; the key names the tenant
//! (`weft_http::ApiKeys`), and no route takes a tenant from the request (an explicit
//! `?tenant=` other than the key's is refused with 403), so nothing can read another
//! tenant's rows: an id of another tenant is simply not found (404). Every
//! read is logged ([`crate::log`]) with the key's id (the first 12 hex digits of its
//! SHA-256, never the key). Inputs reach ClickHouse only as query parameters; malformed
//! input is a 400, never a 5xx (503 means the store is unreachable).
//!
//! Routes (times are RFC 3339; `from`/`to` default to the last 90 days):
//! - `GET /v1/audit/check?from&to&grace_secs&limit` — invariant findings, at most `limit`
//!   (1,000; up to 10,000) of each invariant, all counted;
//! - `GET /v1/audit/timeline/{id}` — a request's narrative: its first members in time, at
//!   most 10,000 and 16 MiB of payload (`truncated_by` says which cut it);
//! - `GET /v1/audit/search?from&to&kind&principal&capability&event_type&decision&outcome&token&request&limit&cursor&format=json|jsonl|csv`;
//! - `GET /v1/audit/bundle/{id}` — the request's TraceBundle (signed when a key is set);
//!   422 `too_large` past 10,000 members or 16 MiB of payload;
//! - `GET /v1/audit/verify?from&to` — recompute the tenant's hash chains over the range
//!   (from the checkpoint before its anchor, on to each partition's last checkpoint),
//!   refused with 422 `too_large` past `max_verify_rows` rows read (the copy lookup of
//!   unsealed facts included);
//! - `GET /v1/audit/checkpoints?limit&cursor` — the signed checkpoints, for offline
//!   verification, a page of at most `limit` (1,000; up to 10,000) at a time.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use weft_http::{ApiError, ApiKeys, Caller, HasApiKeys};
use weft_store::narrative::query::API_MAX_MEMBERS;

use crate::check::CheckOptions;
use crate::log::writer::AuditLog;
use crate::metrics::AuditMetrics;
use crate::search::Filter;
use crate::sign::{Key, Keyring};
use crate::{bundle, chain, check, search, timeline, AuditError, Range, Store};

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// ClickHouse: handlers read facts and chains there and log every read. Give it a
    /// read limit ([`Store::with_read_limit`]): a query that would read more is stopped by
    /// ClickHouse, and its request answered 422 `too_large`.
    pub store: Store,
    /// API keys mapping callers to tenants.
    pub keys: Arc<ApiKeys>,
    /// Signs exported bundles when set.
    pub sign_key: Option<Arc<Key>>,
    /// Verifies checkpoint signatures in `/v1/audit/verify` when set.
    pub keyring: Option<Arc<Keyring>>,
    /// `/v1/audit/verify`'s copy window ([`chain::copy_window_secs`] of ingest's dedup window).
    pub copy_window_secs: u64,
    /// The most stored facts, links, checkpoints and copy-lookup rows one
    /// `/v1/audit/verify` may read ([`chain::VerifyOptions::max_rows`]).
    pub max_verify_rows: u64,
    /// The most `/v1/audit` requests handled at once; one more is answered 503 `busy`
    /// ([`weft_http::limit_in_hand`]). Each is bounded by the read limits above; this bounds
    /// how many of them ClickHouse serves together.
    pub max_concurrent_requests: usize,
    /// `GET /metrics`, shared with [`seal_loop`] and [`AuditLog`].
    pub metrics: Arc<AuditMetrics>,
    /// Where every read's `weft_audit_log` row goes ([`AuditLog::spawn`]; flush it with its
    /// [`crate::log::writer::LogFlusher`] when the server stops).
    pub audit_log: AuditLog,
}

/// The default [`AppState::max_concurrent_requests`].
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 8;

/// The most findings of one invariant `/v1/audit/check` returns (`limit`, default
/// [`DEFAULT_LIMIT`]); `counts` still counts them all.
pub const MAX_FINDINGS: u64 = 10_000;
/// The most checkpoints one `/v1/audit/checkpoints` page holds (`limit`, default
/// [`DEFAULT_LIMIT`]).
pub const MAX_CHECKPOINTS: u64 = 10_000;
/// The most problems one `/v1/audit/verify` answer lists (`problems_total` counts them all;
/// the first is the first break).
pub const MAX_PROBLEMS: usize = 1_000;
/// The default `limit` of `check` and `checkpoints` (search's is 100 hits).
pub const DEFAULT_LIMIT: u64 = 1_000;

/// The router of the audit API.
pub fn router(state: AppState) -> Router {
    let in_hand = Arc::new(tokio::sync::Semaphore::new(
        state.max_concurrent_requests.max(1),
    ));
    Router::new()
        .route("/v1/audit/check", get(check_route))
        .route("/v1/audit/timeline/{id}", get(timeline_route))
        .route("/v1/audit/search", get(search_route))
        .route("/v1/audit/bundle/{id}", get(bundle_route))
        .route("/v1/audit/verify", get(verify_route))
        .route("/v1/audit/checkpoints", get(checkpoints_route))
        .route_layer(axum::middleware::from_fn_with_state(
            in_hand,
            weft_http::limit_in_hand,
        ))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|State(s): State<AppState>| async move {
                weft_http::metrics_response(s.metrics.render())
            }),
        )
        .with_state(state)
}

impl HasApiKeys for AppState {
    fn api_keys(&self) -> &ApiKeys {
        &self.keys
    }
}

/// Longest id a path takes (`/timeline/{id}`, `/bundle/{id}`); longer: 422.
pub use weft_schemas::identity::MAX_ID_BYTES;

fn bad_request(message: &str) -> Response {
    ApiError::bad_request("bad_request", message).into_response()
}

fn fail(e: AuditError) -> Response {
    match e {
        AuditError::BadRequest(m) => bad_request(&m),
        AuditError::NotFound(_) => ApiError::not_found("not found").into_response(),
        AuditError::Invalid(m) => ApiError::unprocessable("invalid", m).into_response(),
        AuditError::Refused(m) => ApiError::new(StatusCode::CONFLICT, "refused", m).into_response(),
        AuditError::TooLarge(m) => ApiError::unprocessable("too_large", m).into_response(),
        AuditError::Store(e) if e.is_over_read_limit() => {
            ApiError::over_read_limit("--max-read-rows", "the `weft audit` CLI").into_response()
        }
        AuditError::Key(m) => {
            tracing::warn!(error = %m, "audit key problem");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_misconfigured",
                "server key misconfigured",
            )
            .into_response()
        }
        AuditError::Store(e) if e.is_transient() => {
            tracing::warn!(error = %e, "audit query failed; the store is unreachable or busy");
            ApiError::unavailable("store unavailable or busy; retry later").into_response()
        }
        AuditError::Store(e) => {
            // Refused, and it would be again: retrying cannot help the client.
            tracing::error!(error = %e, "the store refused an audit query (schema not migrated? run `weft migrate`)");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "store_error",
                "the store refused the query; the server log says why",
            )
            .into_response()
        }
    }
}

/// The caller of an audit route: its tenant and key id. A request may name a tenant
/// (`?tenant=`), but only its own: any other is refused with 403.
struct AuditCaller(Caller);

impl FromRequestParts<AppState> for AuditCaller {
    type Rejection = ApiError;

    /// Refusals are on the record too: a 401 (no tenant to file it under) in the log, a
    /// 403 also in the key's tenant's `weft_audit_log` (`refused_tenant_forbidden`, with the
    /// tenant asked for and the path).
    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Self, ApiError> {
        let path = parts.uri.path().to_owned();
        let caller = Caller::from_request_parts(parts, s).await.inspect_err(|e| {
            s.metrics.refused.with_label_values(&[&e.code]).inc();
            tracing::warn!(target: "weft_audit", code = %e.code, %path, "audit request refused");
        })?;
        let asked = Query::<std::collections::HashMap<String, String>>::try_from_uri(&parts.uri)
            .ok()
            .and_then(|Query(m)| m.get("tenant").cloned());
        if let Some(asked) = asked.filter(|asked| *asked != caller.tenant) {
            let q = json!({"tenant": asked, "path": path});
            s.metrics
                .refused
                .with_label_values(&["tenant_forbidden"])
                .inc();
            record(
                s,
                &caller.tenant,
                &caller.key_id,
                "refused_tenant_forbidden",
                q,
                0,
            );
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "tenant_forbidden",
                "this key may not read that tenant",
            ));
        }
        Ok(Self(caller))
    }
}

fn check_id(id: &str) -> Result<(), ApiError> {
    weft_http::check_len("id", id, MAX_ID_BYTES)
}

/// Log one read: its `tracing` event now, its `weft_audit_log` row queued for the one
/// background writer ([`AuditLog`]), which inserts rows in batches; a row that finds the
/// queue full is dropped and counted. Never waits, and never spawns.
fn record(s: &AppState, tenant: &str, actor: &str, action: &str, q: serde_json::Value, n: u64) {
    s.audit_log.record(tenant, actor, action, &q, n);
}

/// Time bounds from the query string.
#[derive(Debug, Default, Deserialize)]
struct Bounds {
    from: Option<String>,
    to: Option<String>,
}

impl Bounds {
    fn range(&self) -> Result<Range, AuditError> {
        let now = chrono::Utc::now().timestamp_micros();
        let parse = |v: &Option<String>, default: i64, name: &str| match v {
            None => Ok(default),
            Some(s) => weft_schemas::time::parse_micros(s)
                .ok_or_else(|| AuditError::BadRequest(format!("`{name}` is not RFC 3339"))),
        };
        Range::new(
            parse(&self.from, now - 90 * 86_400_000_000, "from")?,
            parse(&self.to, now + 60_000_000, "to")?,
        )
    }
}

/// A route's query string: the time range (`from`, `to`, RFC 3339) and the route's own
/// fields `Q`. A malformed string or range is answered with the API's 400 before the route
/// runs (after the caller's key is checked: extractors run in order).
struct Ranged<Q> {
    range: Range,
    q: Q,
}

#[derive(Deserialize)]
struct WithBounds<Q> {
    #[serde(flatten)]
    bounds: Bounds,
    #[serde(flatten)]
    q: Q,
}

impl<S: Send + Sync, Q: serde::de::DeserializeOwned> FromRequestParts<S> for Ranged<Q> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &S) -> Result<Self, Response> {
        let Query(w) = Query::<WithBounds<Q>>::from_request_parts(parts, s)
            .await
            .map_err(|_| bad_request("malformed query string"))?;
        let range = w.bounds.range().map_err(fail)?;
        Ok(Self { range, q: w.q })
    }
}

/// The number a query field holds (`default` when absent), or the 400 message naming it.
fn number(v: Option<&str>, default: u64, name: &str) -> Result<u64, String> {
    v.map_or(Ok(default), |v| {
        v.parse().map_err(|_| format!("{name} must be a number"))
    })
}

#[derive(Debug, Deserialize)]
struct CheckQuery {
    grace_secs: Option<String>,
    limit: Option<String>,
}

/// `/v1/audit/check`'s answer: the report, and whether `limit` cut its findings.
#[derive(serde::Serialize)]
struct CheckAnswer<'a> {
    #[serde(flatten)]
    report: &'a check::Report,
    limit: u64,
    truncated: bool,
}

/// A route's `limit`: [`DEFAULT_LIMIT`] when absent, at most `max`; the 400 message when
/// it is not a number.
fn limit(v: Option<&str>, max: u64) -> Result<u64, String> {
    number(v, DEFAULT_LIMIT, "limit").map(|n| n.min(max))
}

async fn check_route(
    AuditCaller(c): AuditCaller,
    State(s): State<AppState>,
    Ranged { range, q }: Ranged<CheckQuery>,
) -> Response {
    let (tenant, actor) = (c.tenant, c.key_id);
    let grace = match number(q.grace_secs.as_deref(), 300, "grace_secs") {
        Ok(g) => g,
        Err(e) => return bad_request(&e),
    };
    let per_invariant = match limit(q.limit.as_deref(), MAX_FINDINGS) {
        Ok(n) => n,
        Err(e) => return bad_request(&e),
    };
    let opt = CheckOptions {
        grace_secs: grace.min(365 * 86_400),
        ..CheckOptions::default()
    };
    match check::run(&s.store, &tenant, range, opt).await {
        Ok(mut r) => {
            record(
                &s,
                &tenant,
                &actor,
                "check",
                json!({"range": range, "grace_secs": opt.grace_secs}),
                r.findings.len() as u64,
            );
            // The first `limit` findings of each invariant (they are sorted by invariant).
            let total = r.findings.len();
            let mut kept: std::collections::BTreeMap<String, u64> = Default::default();
            r.findings.retain(|f| {
                let n = kept.entry(f.invariant.clone()).or_default();
                *n += 1;
                *n <= per_invariant
            });
            let truncated = r.findings.len() < total;
            Json(CheckAnswer {
                report: &r,
                limit: per_invariant,
                truncated,
            })
            .into_response()
        }
        Err(e) => fail(e),
    }
}

async fn timeline_route(
    AuditCaller(c): AuditCaller,
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Response {
    let (tenant, actor) = (c.tenant, c.key_id);
    if let Err(e) = check_id(&id) {
        return e.into_response();
    }
    let res = timeline::get_within(
        &s.store,
        &tenant,
        &id,
        API_MAX_MEMBERS,
        timeline::API_MAX_PAYLOAD_BYTES,
    )
    .await;
    let n = res
        .as_ref()
        .map(|b| b.narrative.entries.len() as u64)
        .unwrap_or(0);
    record(
        &s,
        &tenant,
        &actor,
        "timeline",
        json!({"id": crate::short(&id)}),
        n,
    );
    match res {
        Ok(n) => Json(n).into_response(),
        Err(e) => fail(e),
    }
}

#[derive(Debug, Deserialize)]
struct SearchQuery {
    #[serde(flatten)]
    filter: Filter,
    limit: Option<String>,
    cursor: Option<String>,
    format: Option<String>,
}

async fn search_route(
    AuditCaller(c): AuditCaller,
    State(s): State<AppState>,
    Ranged { range, q }: Ranged<SearchQuery>,
) -> Response {
    let (tenant, actor) = (c.tenant, c.key_id);
    let limit = match number(q.limit.as_deref(), 100, "limit") {
        Ok(l) => l,
        Err(e) => return bad_request(&e),
    };
    let filter = q.filter;
    let no_cursor = String::new();
    let cursor = ("cursor", q.cursor.as_ref().unwrap_or(&no_cursor));
    for (name, v) in filter.fields() {
        if let Err(e) = weft_http::check_len(name, v, MAX_ID_BYTES) {
            return e.into_response();
        }
    }
    if let Err(e) = weft_http::check_len(cursor.0, cursor.1, search::MAX_CURSOR_BYTES) {
        return e.into_response();
    }
    let format = q.format.as_deref().unwrap_or("json");
    if !["json", "jsonl", "csv"].contains(&format) {
        return bad_request("format must be json, jsonl or csv");
    }
    let page = match search::page(
        &s.store,
        &tenant,
        range,
        &filter,
        q.cursor.as_deref(),
        limit,
    )
    .await
    {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    record(
        &s,
        &tenant,
        &actor,
        "search",
        json!({"range": range, "filter": filter, "cursor": q.cursor}),
        page.hits.len() as u64,
    );
    let next = page.next_cursor.clone().unwrap_or_default();
    match format {
        "csv" => {
            let mut body = String::from(search::CSV_HEADER);
            body.push('\n');
            for h in &page.hits {
                body.push_str(&search::csv_line(h));
                body.push('\n');
            }
            (
                [
                    (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
                    (header::HeaderName::from_static("x-next-cursor"), next),
                ],
                body,
            )
                .into_response()
        }
        "jsonl" => {
            let mut body = String::new();
            for h in &page.hits {
                body.push_str(&search::json_line(h).to_string());
                body.push('\n');
            }
            (
                [
                    (header::CONTENT_TYPE, "application/x-ndjson".to_owned()),
                    (header::HeaderName::from_static("x-next-cursor"), next),
                ],
                body,
            )
                .into_response()
        }
        _ => Json(json!({
            "hits": page.hits.iter().map(search::json_line).collect::<Vec<_>>(),
            "next_cursor": page.next_cursor,
        }))
        .into_response(),
    }
}

async fn bundle_route(
    AuditCaller(c): AuditCaller,
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Response {
    let (tenant, actor) = (c.tenant, c.key_id);
    if let Err(e) = check_id(&id) {
        return e.into_response();
    }
    let res = bundle::export(
        &s.store,
        &tenant,
        &id,
        s.sign_key.as_deref(),
        API_MAX_MEMBERS,
        timeline::API_MAX_PAYLOAD_BYTES,
    )
    .await;
    record(
        &s,
        &tenant,
        &actor,
        "bundle",
        json!({"id": crate::short(&id)}),
        u64::from(res.is_ok()),
    );
    match res {
        Ok(doc) => {
            let ring = s.sign_key.as_ref().map(|k| Keyring {
                keys: vec![k.public()],
            });
            let c = bundle::check_document(&doc, ring.as_ref());
            Json(json!({"bundle": doc, "check": c, "passed": c.passed()})).into_response()
        }
        Err(e) => fail(e),
    }
}

/// A route without fields of its own.
#[derive(Debug, Deserialize)]
struct NoFields {}

async fn verify_route(
    AuditCaller(c): AuditCaller,
    State(s): State<AppState>,
    Ranged { range, .. }: Ranged<NoFields>,
) -> Response {
    let (tenant, actor) = (c.tenant, c.key_id);
    let opt = chain::VerifyOptions {
        range: Some(range),
        copy_window_secs: s.copy_window_secs,
        max_rows: Some(s.max_verify_rows),
    };
    // Verify's span reads are bounded by its own budget (`max_verify_rows`), the queries
    // that find them by the per-query read limit (`chain::verify`).
    match chain::verify(&s.store, &tenant, &[], s.keyring.as_deref(), opt).await {
        Ok(mut r) => {
            let total = r.problems.len();
            record(
                &s,
                &tenant,
                &actor,
                "verify",
                json!({"range": range}),
                total as u64,
            );
            let ok = r.ok();
            r.problems.truncate(MAX_PROBLEMS);
            Json(json!({"ok": ok, "report": r, "problems_total": total})).into_response()
        }
        Err(e) => fail(e),
    }
}

#[derive(Debug, Deserialize)]
struct PageQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

async fn checkpoints_route(
    AuditCaller(c): AuditCaller,
    State(s): State<AppState>,
    Query(q): Query<PageQuery>,
) -> Response {
    let (tenant, actor) = (c.tenant, c.key_id);
    let n = match limit(q.limit.as_deref(), MAX_CHECKPOINTS) {
        Ok(n) => n,
        Err(e) => return bad_request(&e),
    };
    if let Some(c) = &q.cursor {
        if let Err(e) = weft_http::check_len("cursor", c, MAX_ID_BYTES) {
            return e.into_response();
        }
    }
    let cursor = match q
        .cursor
        .as_deref()
        .map(chain::CheckpointCursor::parse)
        .transpose()
    {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    match chain::checkpoints_page(&s.store, &tenant, cursor.as_ref(), n).await {
        Ok((page, next)) => {
            record(
                &s,
                &tenant,
                &actor,
                "checkpoints",
                json!({"cursor": q.cursor.as_deref().map(crate::short)}),
                page.len() as u64,
            );
            Json(json!({"checkpoints": page, "next_cursor": next.map(|c| c.to_string())}))
                .into_response()
        }
        Err(e) => fail(e),
    }
}

/// Seal every tenant's new facts every `every`, until the process stops. One
/// [`chain::Sealer`] throughout, so a round reads what was stored since the last one.
pub async fn seal_loop(
    store: Store,
    key: Option<Arc<Key>>,
    every: std::time::Duration,
    copy_window_secs: u64,
    metrics: Arc<AuditMetrics>,
) {
    let mut sealer = chain::Sealer::default();
    loop {
        tokio::time::sleep(every).await;
        metrics.seal_rounds.inc();
        let mut failed = false;
        match sealer
            .seal_new(&store, key.as_deref(), copy_window_secs)
            .await
        {
            Ok(done) => {
                let mut held = 0;
                for (t, r) in done {
                    match r {
                        Ok(r) if !r.held.is_empty() => {
                            held += r.held.len();
                            tracing::error!(
                                tenant = %t, held = r.held.len(), first = %r.held[0].detail,
                                "rows left unsealed: they disagree with their payload (run weft audit verify)"
                            );
                        }
                        Ok(_) => {}
                        Err(e) => {
                            failed = true;
                            tracing::warn!(tenant = %t, error = %e, "seal failed");
                        }
                    }
                }
                metrics.seal_rows_held.set(held as i64);
            }
            Err(e) => {
                failed = true;
                tracing::warn!(error = %e, "seal: finding the tenants with new facts failed");
            }
        }
        if failed {
            metrics.seal_failures.inc();
        } else {
            metrics
                .seal_last_success
                .set(chrono::Utc::now().timestamp());
        }
    }
}
