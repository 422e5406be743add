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
//! not JSON or that could not be read; 413 for an oversize body; 401 for a missing or
//! unknown key.
//!
//! `GET /healthz` (liveness), `GET /readyz` (readiness: 503 while the spool is full) and
//! `GET /metrics` (Prometheus text), none needing a key, complete it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tracing::{info_span, Instrument};
use weft_schemas::Envelope;

use crate::publisher::{Delivery, PublishError, Publisher, Receipt};
use weft_http::{ApiKeys, Caller};

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
    /// Most items (array elements or NDJSON lines) in one request; more get 422
    /// `too_many_items`, so the answer (one entry per item) stays bounded.
    pub max_items: usize,
    /// Refuse an item whose payload has a top-level key that is neither defined by its kind
    /// nor of the `x_<org>_<field>` shape (`nonconforming_key`); by default such keys are
    /// only counted (`weft_gateway_nonconforming_keys_total`) and logged.
    pub refuse_nonconforming_keys: bool,
    /// Most `POST /v1/events` requests handled at once; one more is answered 503 `busy`
    /// at once, before its body is read. With `max_body_bytes`, it bounds the memory that
    /// requests can take, whatever their number.
    pub max_concurrent_requests: usize,
    /// Seconds a request's whole body may take to arrive; slower: 408 `body_timeout`, and its
    /// slot in `max_concurrent_requests` is free again. Without it, a few clients that stop
    /// halfway through a body hold every slot.
    pub body_timeout_secs: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: weft_schemas::ports::loopback(weft_schemas::ports::GATEWAY),
            keys: Default::default(),
            keys_file: None,
            max_body_bytes: 8 << 20,
            max_items: DEFAULT_MAX_ITEMS,
            refuse_nonconforming_keys: false,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            body_timeout_secs: DEFAULT_BODY_TIMEOUT_SECS,
        }
    }
}

/// Default [`GatewayConfig::body_timeout_secs`]: the default 8 MiB body at 280 kB/s.
pub const DEFAULT_BODY_TIMEOUT_SECS: u64 = 30;

/// Default [`GatewayConfig::max_items`].
pub const DEFAULT_MAX_ITEMS: usize = 10_000;

/// Default [`GatewayConfig::max_concurrent_requests`]: 16 bodies of the default 8 MiB are
/// 128 MiB.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 16;

/// Longest `request_id` (and `kind`, `tenant`) an item may carry; longer: `string_too_long`.
pub const MAX_FIELD_BYTES: usize = weft_schemas::identity::MAX_ID_BYTES;

/// Longest `message` in a per-item answer (longer messages are cut), so the answer is
/// bounded by `max_items` entries of bounded size.
pub const MAX_MESSAGE_BYTES: usize = 512;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct Gateway {
    publisher: Publisher,
    keys: Arc<ApiKeys>,
    max_body_bytes: usize,
    max_items: usize,
    refuse_nonconforming_keys: bool,
    nonconforming: weft_http::prometheus::IntCounter,
    /// One permit per request in hand ([`GatewayConfig::max_concurrent_requests`]).
    in_hand: Arc<tokio::sync::Semaphore>,
    body_timeout: Duration,
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

/// A reason an item was refused: the `{code, message}` of the one error body.
pub type ApiError = weft_http::ErrorDetail;

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

impl Gateway {
    /// A gateway publishing through `publisher`, accepting `keys`.
    pub fn new(publisher: Publisher, keys: ApiKeys, max_body_bytes: usize) -> Self {
        let nonconforming = publisher.metrics().nonconforming_keys.clone();
        Self {
            publisher,
            keys: Arc::new(keys),
            max_body_bytes,
            max_items: DEFAULT_MAX_ITEMS,
            refuse_nonconforming_keys: false,
            nonconforming,
            in_hand: Arc::new(tokio::sync::Semaphore::new(DEFAULT_MAX_CONCURRENT_REQUESTS)),
            body_timeout: Duration::from_secs(DEFAULT_BODY_TIMEOUT_SECS),
        }
    }

    /// Longest wait for a request's whole body (slower: 408 `body_timeout`).
    pub fn with_body_timeout(mut self, timeout: Duration) -> Self {
        self.body_timeout = timeout;
        self
    }

    /// Most requests handled at once (one more: 503 `busy`, before its body is read).
    pub fn with_max_concurrent_requests(mut self, n: usize) -> Self {
        self.in_hand = Arc::new(tokio::sync::Semaphore::new(n.max(1)));
        self
    }

    /// Most items per request (more: 422 `too_many_items`).
    pub fn with_max_items(mut self, max_items: usize) -> Self {
        self.max_items = max_items.max(1);
        self
    }

    /// Refuse items with nonconforming top-level keys instead of only counting them.
    pub fn refusing_nonconforming_keys(mut self, refuse: bool) -> Self {
        self.refuse_nonconforming_keys = refuse;
        self
    }

    /// The axum router (`/v1/events`, `/healthz`, `/readyz`, `/metrics`).
    pub fn router(self) -> Router {
        Router::new()
            .route("/v1/events", post(ingest))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(Arc::new(self))
    }

    /// Most bytes one request can take in the spool: its body, which holds each item's
    /// payload text and request id, plus what each of at most `max_items` records adds
    /// besides ([`Publisher::spool_bytes_per_event`]: the record's framing, topic, key and
    /// headers). A request of many small items takes several times its body in records.
    /// A bound for the `json` content type, whose record value is the payload's text; an
    /// Avro datum may be larger than that text (a double written `0` takes 8 bytes), which
    /// this bound does not cover.
    pub fn largest_request_spool_bytes(&self) -> u64 {
        let per_item = self.publisher.spool_bytes_per_event();
        (self.max_body_bytes as u64)
            .saturating_add((self.max_items as u64).saturating_mul(per_item))
    }

    fn metrics_reject(&self, code: &str) {
        self.publisher.metrics().reject(code);
    }
}

/// Liveness: 200 while the process serves, with the spool's state.
async fn healthz(State(g): State<Arc<Gateway>>) -> Response {
    Json(spool_state(&g).1).into_response()
}

/// Readiness: 200, or 503 `spool_full` while the spool has less room left than one largest
/// request takes in it ([`Gateway::largest_request_spool_bytes`]), so that a load balancer
/// sends events to another gateway rather than have them refused here. Not a liveness probe:
/// a restart would not empty the spool.
async fn readyz(State(g): State<Arc<Gateway>>) -> Response {
    match spool_state(&g) {
        (true, body) => (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response(),
        (false, body) => Json(body).into_response(),
    }
}

/// Whether the spool is full (less room than one largest request takes in it), and the
/// state as JSON.
fn spool_state(g: &Gateway) -> (bool, serde_json::Value) {
    let (used, max) = g.publisher.spool_bytes();
    let need = g.largest_request_spool_bytes();
    let full = max.saturating_sub(used) < need;
    let body = serde_json::json!({
        "status": if full { "spool_full" } else { "ok" },
        "spooling": g.publisher.is_spooling(),
        "spool_pending": g.publisher.spool_pending(),
        "spool_bytes": used,
        "spool_max_bytes": max,
        "largest_request_spool_bytes": need,
    });
    (full, body)
}

async fn metrics(State(g): State<Arc<Gateway>>) -> Response {
    weft_http::metrics_response(g.publisher.metrics().render())
}

/// Why a body could not be split into items.
#[derive(Debug, PartialEq, Eq)]
enum SplitError {
    /// Not JSON at all (400 `malformed_json`).
    Malformed(String),
    /// More than the allowed items (422 `too_many_items`).
    TooMany(usize),
}

impl From<SplitError> for weft_http::ApiError {
    fn from(e: SplitError) -> Self {
        match e {
            SplitError::Malformed(m) => weft_http::ApiError::bad_request("malformed_json", m),
            SplitError::TooMany(max) => weft_http::ApiError::unprocessable(
                "too_many_items",
                format!("more than {max} items in one request; split the batch"),
            ),
        }
    }
}

/// A JSON array of at most `max` raw items, stopping at the first one past the limit.
struct BoundedItems<'f> {
    max: usize,
    over: &'f std::cell::Cell<bool>,
}

impl<'de> serde::de::Visitor<'de> for BoundedItems<'_> {
    type Value = Vec<&'de RawValue>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element::<&RawValue>()? {
            if out.len() == self.max {
                self.over.set(true);
                return Err(serde::de::Error::custom("too many items"));
            }
            out.push(item);
        }
        Ok(out)
    }
}

fn bounded_array(text: &str, max: usize) -> Result<Vec<&RawValue>, SplitError> {
    use serde::Deserializer as _;
    let over = std::cell::Cell::new(false);
    let mut de = serde_json::Deserializer::from_str(text);
    let items = de
        .deserialize_seq(BoundedItems { max, over: &over })
        .and_then(|v| de.end().map(|()| v));
    items.map_err(|e| match over.get() {
        true => SplitError::TooMany(max),
        false => SplitError::Malformed(format!("body is not a valid JSON array: {e}")),
    })
}

/// Split the body into at most `max` items. `Err` is a body that is not JSON at all (400),
/// or one with too many items (422).
fn split_items<'a>(
    body: &'a [u8],
    content_type: Option<&str>,
    max: usize,
) -> Result<Vec<Result<&'a RawValue, String>>, SplitError> {
    let malformed = SplitError::Malformed;
    let text =
        std::str::from_utf8(body).map_err(|e| malformed(format!("body is not UTF-8: {e}")))?;
    let trimmed = text.trim_start();
    let ndjson_declared = content_type.is_some_and(|ct| {
        let ct = ct.to_ascii_lowercase();
        ct.starts_with("application/x-ndjson")
            || ct.starts_with("application/ndjson")
            || ct.starts_with("application/jsonl")
    });
    if trimmed.is_empty() {
        return Err(malformed(
            "empty body: send a JSON array or NDJSON of envelopes".into(),
        ));
    }
    let lines = |text: &'a str| -> Result<Vec<Result<&'a RawValue, String>>, SplitError> {
        let lines = text.lines().filter(|l| !l.trim().is_empty());
        if lines.clone().nth(max).is_some() {
            return Err(SplitError::TooMany(max));
        }
        Ok(lines
            .map(|l| serde_json::from_str::<&RawValue>(l).map_err(|e| e.to_string()))
            .collect())
    };
    if ndjson_declared {
        return lines(text);
    }
    if trimmed.starts_with('[') {
        return Ok(bounded_array(text, max)?.into_iter().map(Ok).collect());
    }
    match serde_json::from_str::<&RawValue>(text) {
        Ok(one) => Ok(vec![Ok(one)]),
        // Several lines, each its own document: NDJSON without the header.
        Err(_) if trimmed.trim_end().contains('\n') && trimmed.starts_with('{') => lines(text),
        Err(e) => Err(malformed(format!("body is not valid JSON: {e}"))),
    }
}

/// Cut a message to [`MAX_MESSAGE_BYTES`] on a character boundary.
fn bounded_message(mut m: String) -> String {
    if m.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
        m.push_str("...");
    }
    m
}

/// Parse one item for `tenant` into an envelope (no publishing): its shape, `request_id`
/// length, kind and tenant.
fn parse_item(raw: &RawValue, tenant: &str) -> Result<Envelope, ApiError> {
    let err = |code: &str, message: String| ApiError {
        code: code.into(),
        message: bounded_message(message),
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
    if let Some(id) = &item.request_id {
        weft_http::check_len("request_id", id, MAX_FIELD_BYTES)
            .map_err(|e| err(&e.code, e.message))?;
    }
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
    Ok(Envelope {
        kind,
        request_id: item.request_id,
        tenant: item_tenant,
        producer_id: None,
        seq: None,
        emitted_at: None,
        payload: item.payload,
    })
}

/// The gateway's whole request parsing without publishing: split the body into at most
/// `max_items` items, parse each for `tenant` and validate its envelope. `Err` is the answer
/// to the whole request. For the fuzz target (`fuzz/`) and tests.
pub fn parse_request(
    body: &[u8],
    content_type: Option<&str>,
    max_items: usize,
    tenant: &str,
) -> Result<Vec<Result<Envelope, ApiError>>, weft_http::ApiError> {
    let items = split_items(body, content_type, max_items)?;
    Ok(items
        .into_iter()
        .map(|item| {
            let raw = item.map_err(|e| ApiError {
                code: "malformed_json".into(),
                message: bounded_message(e),
            })?;
            let env = parse_item(raw, tenant)?;
            env.validate().map_err(|e| ApiError {
                code: e.code().into(),
                message: bounded_message(e.to_string()),
            })?;
            Ok(env)
        })
        .collect())
}

/// Validate one item for `tenant` and hand it to the publisher.
fn admit(g: &Gateway, raw: &RawValue, tenant: &str) -> Result<Receipt, ApiError> {
    let env = parse_item(raw, tenant)?;
    check_extension_keys(g, env.kind, &env.payload).map_err(|m| ApiError {
        code: "nonconforming_key".into(),
        message: bounded_message(m),
    })?;
    g.publisher.publish_with(env, false).map_err(|e| ApiError {
        code: e.code().into(),
        message: bounded_message(e.to_string()),
    })
}

/// Count (and log) top-level payload keys of neither the kind nor the `x_<org>_<field>`
/// shape; `Err` when the gateway is configured to refuse them.
fn check_extension_keys(
    g: &Gateway,
    kind: weft_schemas::Kind,
    payload: &RawValue,
) -> Result<(), String> {
    type Keys<'a> = std::collections::BTreeMap<std::borrow::Cow<'a, str>, serde::de::IgnoredAny>;
    // Not an object, or not JSON: the publisher's validation says why.
    let Ok(keys) = serde_json::from_str::<Keys<'_>>(payload.get()) else {
        return Ok(());
    };
    let odd = weft_schemas::extensions::nonconforming(kind, keys.keys().map(|k| k.as_ref()));
    if odd.is_empty() {
        return Ok(());
    }
    g.nonconforming.inc_by(odd.len() as u64);
    let listed = odd.join(", ");
    tracing::info!(%kind, keys = %listed, "payload keys neither in the spec nor x_<org>_<field>");
    match g.refuse_nonconforming_keys {
        true => Err(format!(
            "payload keys {listed} are neither defined by {kind} nor of the x_<org>_<field> shape"
        )),
        false => Ok(()),
    }
}

async fn ingest(State(g): State<Arc<Gateway>>, headers: HeaderMap, body: Body) -> Response {
    let span = info_span!(
        "ingest",
        tenant = tracing::field::Empty,
        items = tracing::field::Empty
    );
    async move {
        let tenant = match info_span!("auth").in_scope(|| Caller::from_headers(&g.keys, &headers)) {
            Ok(c) => c.tenant,
            Err(e) => {
                g.metrics_reject(&e.code);
                return e.into_response();
            }
        };
        tracing::Span::current().record("tenant", tenant.as_str());
        // Held until the answer: the body, its items and their wait for durability.
        let Ok(_permit) = g.in_hand.clone().try_acquire_owned() else {
            g.metrics_reject("busy");
            return weft_http::busy();
        };
        let bytes = match read_body(&g, &headers, body).await {
            Ok(b) => b,
            Err(e) => {
                g.metrics_reject(&e.code);
                return e.into_response();
            }
        };
        let ct = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let items = match info_span!("parse").in_scope(|| split_items(&bytes, ct, g.max_items)) {
            Ok(items) if items.is_empty() => {
                weft_http::ApiError::bad_request("empty_batch", "no events in the request")
            }
            Ok(items) => {
                tracing::Span::current().record("items", items.len());
                return publish_items(&g, items, &tenant).await;
            }
            Err(e) => e.into(),
        };
        g.metrics_reject(&items.code);
        items.into_response()
    }
    .instrument(span)
    .await
}

/// The body, at most `max_body_bytes` (413 beyond, whether declared or streamed), within
/// `body_timeout` (408 `body_timeout` after it); a body that fails otherwise is 400
/// `body_unreadable` (the shared reader, [`weft_http::read_body`]).
async fn read_body(
    g: &Gateway,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, weft_http::ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > g.max_body_bytes) {
        return Err(weft_http::ApiError::too_large(g.max_body_bytes));
    }
    weft_http::read_body(body, g.max_body_bytes, g.body_timeout)
        .await
        .map_err(weft_http::ApiError::from)
}

/// Validate and publish each item, await durability, and answer per item.
async fn publish_items(
    g: &Gateway,
    items: Vec<Result<&RawValue, String>>,
    tenant: &str,
) -> Response {
    // Validate and publish each item; keep receipts to await durability together.
    let mut results: Vec<ItemResult> = Vec::with_capacity(items.len());
    let mut pending: Vec<(usize, Receipt)> = Vec::new();
    info_span!("validate_publish").in_scope(|| {
        for (index, item) in items.into_iter().enumerate() {
            let outcome = match item {
                Err(e) => Err(ApiError {
                    code: "malformed_json".into(),
                    message: bounded_message(format!("line is not valid JSON: {e}")),
                }),
                Ok(raw) => admit(g, raw, tenant),
            };
            let (status, id, error) = match outcome {
                Ok(receipt) => {
                    let id = Some(receipt.id.clone());
                    pending.push((index, receipt));
                    ("accepted", id, None)
                }
                Err(error) => ("rejected", None, Some(error)),
            };
            results.push(ItemResult {
                index,
                status,
                id,
                error,
            });
        }
    });
    async {
        for (index, receipt) in pending {
            let r: Result<Delivery, PublishError> = receipt.await;
            if let Err(e) = r {
                results[index].status = "rejected";
                results[index].error = Some(ApiError {
                    code: e.code().into(),
                    message: bounded_message(e.to_string()),
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
    let status = batch_status(accepted, &results);
    let mut answer = (
        status,
        Json(BatchResponse {
            accepted,
            rejected,
            results,
        }),
    )
        .into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        // The spool is full or failing, or the gateway is closing: worth a retry, not at once.
        answer
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
    }
    answer
}

/// 200 all accepted, 207 some; none: 503 when every item failed for a reason worth a retry
/// ([`PublishError::is_retriable`]: `spool_full`, `spool_failed`, `closed`), so a plain HTTP
/// client retries; 403 / 413 / 422 when every item failed for that one reason
/// (`tenant_forbidden`, `too_large`, `string_too_long`), else 400.
fn batch_status(accepted: usize, results: &[ItemResult]) -> StatusCode {
    if accepted == results.len() {
        return StatusCode::OK;
    }
    if accepted > 0 {
        return StatusCode::MULTI_STATUS;
    }
    let all = |ok: &dyn Fn(&str) -> bool| {
        results
            .iter()
            .all(|r| r.error.as_ref().is_some_and(|e| ok(&e.code)))
    };
    if all(&|code| PublishError::RETRIABLE_CODES.contains(&code)) {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    [
        ("tenant_forbidden", StatusCode::FORBIDDEN),
        ("too_large", StatusCode::PAYLOAD_TOO_LARGE),
        ("string_too_long", StatusCode::UNPROCESSABLE_ENTITY),
    ]
    .into_iter()
    .find(|(code, _)| all(&|c| c == *code))
    .map_or(StatusCode::BAD_REQUEST, |(_, status)| status)
}

/// Serve the gateway on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: weft_http::Listener,
    gateway: Gateway,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, gateway.router())
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests;
