//! The HTTP ingest gateway: a way in for producers that are not written in Rust.
//!
//! `POST /v1/events` takes a JSON array, a single JSON object, or NDJSON (by
//! `Content-Type: application/x-ndjson`, or sniffed) of envelopes
//! `{kind, request_id?, tenant?, payload}`. Each item is validated on its own and answered on
//! its own, so one bad event never costs the good ones (partial success, as in Langfuse's
//! ingestion API). The response is sent only once every accepted item is durable (Kafka ack or
//! spool fsync), so a 200/207 is a promise that those events will not be lost.
//!
//! Status: 200 all accepted; 207 some accepted; 400 none accepted (403 when every item named
//! another tenant; 503 when every failure was the spool being full); 400 for a body that is
//! not JSON; 413 for an oversize body; 401 for a missing or unknown key.
//!
//! `GET /healthz` (no auth) and `GET /metrics` (Prometheus text, no auth) complete it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tracing::{info_span, Instrument};
use weft_schemas::Envelope;

use crate::publisher::{Delivery, PublishError, Publisher, Receipt};
use weft_http::ApiKeys;

/// The `[gateway]` TOML section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Address to listen on. Loopback by default: exposing the gateway is a decision.
    pub listen: SocketAddr,
    /// API key -> tenant. Merged with `WEFT_GATEWAY_KEYS` and `keys_file`.
    pub keys: std::collections::BTreeMap<String, String>,
    /// A file of `key=tenant` lines, for keys kept out of the main config.
    pub keys_file: Option<PathBuf>,
    /// Largest request body accepted, in bytes; larger bodies get 413.
    pub max_body_bytes: usize,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: weft_schemas::ports::loopback(weft_schemas::ports::GATEWAY),
            keys: Default::default(),
            keys_file: None,
            max_body_bytes: 8 << 20,
        }
    }
}

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct Gateway {
    publisher: Publisher,
    keys: Arc<ApiKeys>,
    max_body_bytes: usize,
}

/// One submitted item, before validation. Unknown fields are refused: a typo such as
/// `requestId` must not silently drop the request id.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Item {
    kind: String,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
    payload: Box<RawValue>,
}

/// A reason an item (or request) was refused.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ApiError {
    /// Stable reason code, e.g. `schema_invalid` or `malformed_json`.
    pub code: String,
    /// Human-readable detail.
    pub message: String,
}

/// The answer for one item.
#[derive(Debug, Clone, Serialize)]
pub struct ItemResult {
    /// Position of the item in the request (0-based).
    pub index: usize,
    /// `accepted` once the event is durable, else `rejected`.
    pub status: &'static str,
    /// The event's natural id; absent when the item was refused before publishing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Why the item was rejected; absent when it was accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
}

/// The body of a `POST /v1/events` answer.
#[derive(Debug, Clone, Serialize)]
pub struct BatchResponse {
    /// Items that are durable (Kafka ack or spool).
    pub accepted: usize,
    /// Items refused, at validation or on the way to durability.
    pub rejected: usize,
    /// One answer per item, in request order.
    pub results: Vec<ItemResult>,
}

fn error_response(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message.into() } });
    let mut r = (status, Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

impl Gateway {
    /// A gateway publishing through `publisher`, accepting `keys`.
    pub fn new(publisher: Publisher, keys: ApiKeys, max_body_bytes: usize) -> Self {
        Self {
            publisher,
            keys: Arc::new(keys),
            max_body_bytes,
        }
    }

    /// The axum router (`/v1/events`, `/healthz`, `/metrics`).
    pub fn router(self) -> Router {
        Router::new()
            .route("/v1/events", post(ingest))
            .route("/healthz", get(healthz))
            .route("/metrics", get(metrics))
            .with_state(Arc::new(self))
    }

    fn metrics_reject(&self, code: &str) {
        self.publisher.metrics().reject(code);
    }
}

async fn healthz(State(g): State<Arc<Gateway>>) -> Response {
    let body = serde_json::json!({
        "status": "ok",
        "spooling": g.publisher.is_spooling(),
        "spool_pending": g.publisher.spool_pending(),
    });
    Json(body).into_response()
}

async fn metrics(State(g): State<Arc<Gateway>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        g.publisher.metrics().render(),
    )
        .into_response()
}

/// The tenant of the request's bearer key, or the 401 reason (code, message).
fn authenticate<'a>(
    g: &'a Gateway,
    headers: &HeaderMap,
) -> Result<&'a str, (&'static str, &'static str)> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(("missing_api_key", "send `Authorization: Bearer <api key>`"));
    };
    let presented = value
        .to_str()
        .ok()
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    presented
        .and_then(|k| g.keys.tenant_for(k))
        .ok_or(("invalid_api_key", "the API key is not valid"))
}

/// Split the body into items. `Err` is a body that is not JSON at all (400).
fn split_items<'a>(
    body: &'a [u8],
    content_type: Option<&str>,
) -> Result<Vec<Result<&'a RawValue, String>>, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("body is not UTF-8: {e}"))?;
    let trimmed = text.trim_start();
    let ndjson_declared = content_type.is_some_and(|ct| {
        let ct = ct.to_ascii_lowercase();
        ct.starts_with("application/x-ndjson")
            || ct.starts_with("application/ndjson")
            || ct.starts_with("application/jsonl")
    });
    if trimmed.is_empty() {
        return Err("empty body: send a JSON array or NDJSON of envelopes".into());
    }
    let lines = |text: &'a str| -> Vec<Result<&'a RawValue, String>> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str::<&RawValue>(l).map_err(|e| e.to_string()))
            .collect()
    };
    if ndjson_declared {
        return Ok(lines(text));
    }
    if trimmed.starts_with('[') {
        let items: Vec<&RawValue> = serde_json::from_str(text)
            .map_err(|e| format!("body is not a valid JSON array: {e}"))?;
        return Ok(items.into_iter().map(Ok).collect());
    }
    match serde_json::from_str::<&RawValue>(text) {
        Ok(one) => Ok(vec![Ok(one)]),
        // Several lines, each its own document: NDJSON without the header.
        Err(_) if trimmed.trim_end().contains('\n') && trimmed.starts_with('{') => Ok(lines(text)),
        Err(e) => Err(format!("body is not valid JSON: {e}")),
    }
}

/// Validate one item for `tenant` and hand it to the publisher.
fn admit(g: &Gateway, raw: &RawValue, tenant: &str) -> Result<Receipt, ApiError> {
    let err = |code: &str, message: String| ApiError {
        code: code.into(),
        message,
    };
    let item: Item = serde_json::from_str(raw.get()).map_err(|e| {
        let msg = e.to_string();
        if msg.contains("expected struct Item") || msg.contains("invalid type") {
            err(
                "invalid_envelope",
                format!("an item must be an object {{kind, request_id?, tenant?, payload}}: {msg}"),
            )
        } else {
            err("invalid_envelope", msg)
        }
    })?;
    let kind = item
        .kind
        .parse()
        .map_err(|e: weft_schemas::kind::UnknownKind| err("unknown_kind", e.to_string()))?;
    let item_tenant = match item.tenant {
        Some(t) if t != tenant => {
            return Err(err(
                "tenant_forbidden",
                format!("this API key may only write tenant `{tenant}`, not `{t}`"),
            ))
        }
        _ => tenant.to_owned(),
    };
    let env = Envelope {
        kind,
        request_id: item.request_id,
        tenant: item_tenant,
        producer_id: None,
        seq: None,
        emitted_at: None,
        payload: item.payload,
    };
    g.publisher
        .publish(env)
        .map_err(|e| err(e.code(), e.to_string()))
}

async fn ingest(State(g): State<Arc<Gateway>>, headers: HeaderMap, body: Body) -> Response {
    let span = info_span!(
        "ingest",
        tenant = tracing::field::Empty,
        items = tracing::field::Empty
    );
    async move {
        let tenant = match info_span!("auth").in_scope(|| authenticate(&g, &headers)) {
            Ok(t) => t.to_owned(),
            Err((code, message)) => {
                g.metrics_reject(code);
                return error_response(StatusCode::UNAUTHORIZED, code, message);
            }
        };
        tracing::Span::current().record("tenant", tenant.as_str());
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > g.max_body_bytes) {
            g.metrics_reject("body_too_large");
            return too_large(g.max_body_bytes);
        }
        let bytes = match to_bytes(body, g.max_body_bytes)
            .instrument(info_span!("read_body"))
            .await
        {
            Ok(b) => b,
            Err(_) => {
                g.metrics_reject("body_too_large");
                return too_large(g.max_body_bytes);
            }
        };
        let ct = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let items = match info_span!("parse").in_scope(|| split_items(&bytes, ct)) {
            Ok(items) if items.is_empty() => {
                g.metrics_reject("empty_batch");
                return error_response(
                    StatusCode::BAD_REQUEST,
                    "empty_batch",
                    "no events in the request",
                );
            }
            Ok(items) => items,
            Err(reason) => {
                g.metrics_reject("malformed_json");
                return error_response(StatusCode::BAD_REQUEST, "malformed_json", reason);
            }
        };
        tracing::Span::current().record("items", items.len());

        // Validate and publish each item; keep receipts to await durability together.
        let mut results: Vec<ItemResult> = Vec::with_capacity(items.len());
        let mut pending: Vec<(usize, Receipt)> = Vec::new();
        info_span!("validate_publish").in_scope(|| {
            for (index, item) in items.into_iter().enumerate() {
                let outcome = match item {
                    Err(e) => Err(ApiError {
                        code: "malformed_json".into(),
                        message: format!("line is not valid JSON: {e}"),
                    }),
                    Ok(raw) => admit(&g, raw, &tenant),
                };
                match outcome {
                    Ok(receipt) => {
                        results.push(ItemResult {
                            index,
                            status: "accepted",
                            id: Some(receipt.id.clone()),
                            error: None,
                        });
                        pending.push((index, receipt));
                    }
                    Err(error) => results.push(ItemResult {
                        index,
                        status: "rejected",
                        id: None,
                        error: Some(error),
                    }),
                }
            }
        });
        async {
            for (index, receipt) in pending {
                let r: Result<Delivery, PublishError> = receipt.await;
                if let Err(e) = r {
                    results[index].status = "rejected";
                    results[index].error = Some(ApiError {
                        code: e.code().into(),
                        message: e.to_string(),
                    });
                }
            }
        }
        .instrument(info_span!("await_durable"))
        .await;

        let mut accepted = 0;
        for r in &results {
            match &r.error {
                None => accepted += 1,
                Some(e) => g.metrics_reject(&e.code),
            }
        }
        g.publisher.metrics().accepted.inc_by(accepted as u64);
        let rejected = results.len() - accepted;
        let status = if rejected == 0 {
            StatusCode::OK
        } else if accepted > 0 {
            StatusCode::MULTI_STATUS
        } else if results.iter().all(|r| {
            r.error
                .as_ref()
                .is_some_and(|e| e.code == "tenant_forbidden")
        }) {
            StatusCode::FORBIDDEN
        } else if results
            .iter()
            .all(|r| r.error.as_ref().is_some_and(|e| e.code == "spool_full"))
        {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::BAD_REQUEST
        };
        (
            status,
            Json(BatchResponse {
                accepted,
                rejected,
                results,
            }),
        )
            .into_response()
    }
    .instrument(span)
    .await
}

fn too_large(max: usize) -> Response {
    error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("request body is over the {max}-byte limit; split the batch"),
    )
}

/// Serve the gateway on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gateway: Gateway,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, gateway.router())
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_arrays_objects_and_ndjson() {
        let a = split_items(br#"[{"a":1}, {"b":2}]"#, None).unwrap();
        assert_eq!(a.len(), 2);
        let o = split_items(b"{\"a\":1}", Some("application/json")).unwrap();
        assert_eq!(o.len(), 1);
        let n = split_items(b"{\"a\":1}\n\n{\"b\":2}\nnot json\n", None).unwrap();
        assert_eq!(n.len(), 3);
        assert!(n[2].is_err(), "a bad line is that item's problem only");
        let declared = split_items(b"{\"a\":1}", Some("application/x-ndjson")).unwrap();
        assert_eq!(declared.len(), 1);
    }

    #[test]
    fn malformed_bodies_are_request_errors_with_a_reason() {
        let e = split_items(b"[{\"a\":1},", None).unwrap_err();
        assert!(e.contains("not a valid JSON array"), "{e}");
        assert!(split_items(b"   ", None).unwrap_err().contains("empty"));
        assert!(split_items(b"nonsense", None).is_err());
        assert!(split_items(&[0xff, 0xfe], None)
            .unwrap_err()
            .contains("UTF-8"));
    }
}
