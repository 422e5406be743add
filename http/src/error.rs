//! The one error body of every weft HTTP API: `{"error": {"code": "...", "message": "..."}}`.
//!
//! `code` is a stable, machine-readable reason (`invalid_api_key`, `body_too_large`,
//! `not_found`, ...); `message` is for humans and may change. A 401 also carries
//! `WWW-Authenticate: Bearer`.

use std::borrow::Cow;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// A refused request: its status, stable code and human-readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status of the answer.
    pub status: StatusCode,
    /// Stable reason code.
    pub code: Cow<'static, str>,
    /// Human-readable detail.
    pub message: String,
}

/// The `{code, message}` object inside the body, also used for per-item answers.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ErrorDetail {
    /// Stable reason code.
    pub code: String,
    /// Human-readable detail.
    pub message: String,
}

impl ApiError {
    /// An error with any status.
    pub fn new(
        status: StatusCode,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    /// 400: the request is malformed.
    pub fn bad_request(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 404 with code `not_found`: unknown, or another tenant's (the same answer for both).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 413 with code `body_too_large`.
    pub fn too_large(max_bytes: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body is over the {max_bytes}-byte limit; split the request"),
        )
    }

    /// 422: well-formed but over a documented limit or otherwise unprocessable.
    pub fn unprocessable(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    /// 422 `too_large`: ClickHouse stopped a query of the request at the API's per-query
    /// read limit (`flag`); `instead` names the way without a limit. Logged, so operators see
    /// how often the limit is met.
    pub fn over_read_limit(flag: &str, instead: &str) -> Self {
        tracing::info!(limit = flag, "request refused at the read limit");
        Self::unprocessable(
            "too_large",
            format!(
                "a query of this request would read more rows than the API allows one query \
                 ({flag}): ask for less, or use {instead}, which has no limit"
            ),
        )
    }

    /// 503 with code `store_unavailable`: a backend is down; the client may retry.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            message,
        )
    }

    /// The `{code, message}` detail.
    pub fn detail(&self) -> ErrorDetail {
        ErrorDetail {
            code: self.code.clone().into_owned(),
            message: self.message.clone(),
        }
    }

    /// The JSON body `{"error": {"code", "message"}}`.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({ "error": { "code": self.code, "message": self.message } })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// Shorthand for `ApiError::new(status, code, message).into_response()`.
pub fn error_response(
    status: StatusCode,
    code: impl Into<Cow<'static, str>>,
    message: impl Into<String>,
) -> Response {
    ApiError::new(status, code, message).into_response()
}

/// Refuse a string over `max` bytes (422 `string_too_long`), naming the field.
pub fn check_len(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    if value.len() > max {
        return Err(ApiError::unprocessable(
            "string_too_long",
            format!("`{field}` is {} bytes; the limit is {max}", value.len()),
        ));
    }
    Ok(())
}

/// Whether reading a request body (`axum::body::to_bytes`) failed because the body passed
/// its length limit: that is 413, while a reset connection or a malformed chunk is the
/// client's 400, and counting those as too large would mislead whoever tunes the limit.
pub fn over_length_limit(e: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_body_past_its_limit_is_over_the_length_limit() {
        use http_body_util::channel::Channel;
        let (mut tx, rx) = Channel::<axum::body::Bytes, std::io::Error>::new(1);
        tx.send_data(axum::body::Bytes::from_static(b"["))
            .await
            .unwrap();
        tx.abort(std::io::Error::other("connection reset"));
        let e = axum::body::to_bytes(axum::body::Body::new(rx), 16)
            .await
            .unwrap_err();
        assert!(!over_length_limit(&e), "a reset is not too large: {e}");
        let (mut tx, rx) = Channel::<axum::body::Bytes, std::io::Error>::new(1);
        tokio::spawn(async move { tx.send_data(axum::body::Bytes::from(vec![b' '; 17])).await });
        let e = axum::body::to_bytes(axum::body::Body::new(rx), 16)
            .await
            .unwrap_err();
        assert!(over_length_limit(&e), "17 bytes past a limit of 16: {e}");
    }

    #[tokio::test]
    async fn one_body_shape_and_bearer_challenge() {
        let r = ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", "no").into_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"code": "invalid_api_key", "message": "no"}})
        );
        let r = ApiError::not_found("x").into_response();
        assert!(r.headers().get(header::WWW_AUTHENTICATE).is_none());
    }

    #[test]
    fn check_len_names_the_field_and_the_limit() {
        assert!(check_len("id", "abc", 3).is_ok());
        let e = check_len("id", "abcd", 3).unwrap_err();
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(e.message.contains("`id`") && e.message.contains('3'), "{e}");
    }
}
