//! The status server of `weft ingest`: `/healthz`, `/metrics`, and the tenant-scoped
//! narrative API `GET /v1/narratives/{id}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use weft_http::{ApiError, ApiKeys, Caller, HasApiKeys};

use crate::metrics::IngestMetrics;
use weft_store::narrative::bounded::{self, Within};
use weft_store::narrative::query;
use weft_store::Store;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// Where narratives are read from, with a read limit per query
    /// ([`Store::with_read_limit`]; past it a request is answered 422 `too_large`).
    pub store: Store,
    /// The ingest metrics rendered at `/metrics`.
    pub metrics: Arc<IngestMetrics>,
    /// API keys mapping callers to tenants, for the narrative API.
    pub keys: Arc<ApiKeys>,
}

impl HasApiKeys for AppState {
    fn api_keys(&self) -> &ApiKeys {
        &self.keys
    }
}

/// Longest id `GET /v1/narratives/{id}` takes (longer: 422 `string_too_long`).
pub use weft_schemas::identity::MAX_ID_BYTES;

/// The most narrative lookups served at once; one more is answered 503 `busy` at once
/// ([`weft_http::limit_in_hand`]). Each is bounded by the read limit; this bounds how many
/// ClickHouse serves together, beside ingest's own writes.
pub const MAX_CONCURRENT_LOOKUPS: usize = 8;

/// The router of the status server.
pub fn router(state: AppState) -> Router {
    let in_hand = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_LOOKUPS));
    Router::new()
        .route("/v1/narratives/{id}", get(narrative))
        .route_layer(axum::middleware::from_fn_with_state(
            in_hand,
            weft_http::limit_in_hand,
        ))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// `ok`, or 503 with the one error body (`stalled`) while fetched records have waited
/// `stall_after_secs` with nothing stored.
async fn healthz(State(s): State<AppState>) -> Response {
    match s.metrics.health.stalled() {
        None => "ok".into_response(),
        Some(secs) => ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "stalled",
            format!("records fetched {secs} s ago are not stored yet (see the ingest log)"),
        )
        .into_response(),
    }
}

async fn metrics(State(s): State<AppState>) -> Response {
    weft_http::metrics_response(s.metrics.render())
}

async fn narrative(caller: Caller, State(s): State<AppState>, Path(id): Path<String>) -> Response {
    if id.is_empty() {
        return ApiError::bad_request("bad_request", "id must not be empty").into_response();
    }
    if let Err(e) = weft_http::check_len("id", &id, MAX_ID_BYTES) {
        return e.into_response();
    }
    let (members, bytes) = (query::API_MAX_MEMBERS, bounded::API_MAX_PAYLOAD_BYTES);
    match bounded::lookup_within(&s.store, &caller.tenant, &id, members, bytes).await {
        Ok(Some(Within::Read(n))) => Json(n).into_response(),
        Ok(Some(Within::FirstTooLarge(_))) => ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "too_large",
            format!(
                "the narrative's first member alone holds more than {bytes} bytes of payload: \
                 read it with `weft narrative`"
            ),
        )
        .into_response(),
        // The same answer whether the id is unknown or belongs to another tenant.
        Ok(None) => ApiError::not_found("no narrative with that id").into_response(),
        Err(e) if e.is_over_read_limit() => {
            ApiError::over_read_limit("--api-max-read-rows", "`weft narrative`").into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "narrative lookup failed");
            ApiError::unavailable("store unavailable; retry later").into_response()
        }
    }
}
