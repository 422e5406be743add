//! The status server of `weft ingest`: `/healthz`, `/metrics`, and the tenant-scoped
//! narrative API `GET /v1/narratives/{id}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use weft_http::ApiKeys;

use crate::metrics::IngestMetrics;
use weft_store::narrative::query;
use weft_store::Store;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// Where narratives are read from.
    pub store: Store,
    /// The ingest metrics rendered at `/metrics`.
    pub metrics: Arc<IngestMetrics>,
    /// API keys mapping callers to tenants, for the narrative API.
    pub keys: Arc<ApiKeys>,
}

/// The router of the status server.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/v1/narratives/{id}", get(narrative))
        .with_state(state)
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        s.metrics.render(),
    )
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({"error": message}))).into_response()
}

async fn narrative(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let tenant = match s.keys.authenticate(&headers) {
        Ok(t) => t.to_owned(),
        Err(e) => {
            let (status, msg) = e.response();
            return error(status, msg);
        }
    };
    if id.is_empty() || id.len() > 1024 {
        return error(StatusCode::BAD_REQUEST, "id must be 1..=1024 bytes");
    }
    match query::lookup(&s.store, &tenant, &id).await {
        Ok(Some(n)) => Json(n).into_response(),
        // The same answer whether the id is unknown or belongs to another tenant.
        Ok(None) => error(StatusCode::NOT_FOUND, "no narrative with that id"),
        Err(e) => {
            tracing::warn!(error = %e, "narrative lookup failed");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store unavailable; retry later",
            )
        }
    }
}
