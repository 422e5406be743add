//! The router's error type: every refused request and every failed stage, each with the
//! HTTP status and the stable `error.code` it is answered with.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use weft_http::{ApiError, Unauthorized};

/// Why a router request or stage failed.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// No or an unknown bearer key: the 401 every weft API answers (`missing_api_key`,
    /// `invalid_api_key`).
    #[error("{}", ApiError::from(*.0).message)]
    Unauthorized(Unauthorized),
    /// The body is not the expected JSON.
    #[error("{0}")]
    BadRequest(String),
    /// The body is over the byte limit.
    #[error("body of {got} bytes is over the limit of {limit} bytes")]
    BodyTooLarge {
        /// Bytes received (at least).
        got: usize,
        /// The limit.
        limit: usize,
    },
    /// The whole body did not arrive within the body timeout
    /// ([`crate::service::ServiceConfig::body_timeout`]).
    #[error("the request body did not arrive within {} s", .0.as_secs_f64())]
    BodyTimeout(std::time::Duration),
    /// A field is over its documented limit.
    #[error("{field}: {message}")]
    TooLarge {
        /// Which field.
        field: &'static str,
        /// What the limit is.
        message: String,
    },
    /// `candidates` is empty.
    #[error("candidates is empty")]
    NoCandidates,
    /// Two candidates share an id: feedback, aggregates and evaluation know a candidate by
    /// its id, so the logged propensity of one copy would not be the probability of the id.
    #[error("candidate_id `{0}` is given more than once")]
    DuplicateCandidate(String),
    /// `context.tenant` names another tenant than the key's.
    #[error("context.tenant is not the key's tenant")]
    TenantForbidden,
    /// The request names a policy weft does not know.
    #[error("policy `{0}` is not one of squarecb, greedy, epsilon_greedy, thompson, ucb, static")]
    UnknownPolicy(String),
    /// The decision could not be published (the publisher's code and message).
    #[error("{1}")]
    Publish(&'static str, String, StatusCode),
    /// A decision could not be serialized.
    #[error("internal error: {0}")]
    Internal(String),
    /// Reading ClickHouse failed.
    #[error("{0}")]
    Store(#[from] weft_store::StoreError),
    /// Reading ClickHouse took too long.
    #[error("timed out")]
    Timeout,
}

impl RouterError {
    /// The HTTP status and `error.code` of this error.
    pub fn status_code(&self) -> (StatusCode, &'static str) {
        match self {
            RouterError::Unauthorized(Unauthorized::Missing) => {
                (StatusCode::UNAUTHORIZED, "missing_api_key")
            }
            RouterError::Unauthorized(Unauthorized::Invalid) => {
                (StatusCode::UNAUTHORIZED, "invalid_api_key")
            }
            RouterError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            RouterError::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
            RouterError::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
            RouterError::TooLarge { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "over_limit"),
            RouterError::NoCandidates => (StatusCode::BAD_REQUEST, "no_candidates"),
            RouterError::DuplicateCandidate(_) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "duplicate_candidate")
            }
            RouterError::TenantForbidden => (StatusCode::FORBIDDEN, "tenant_forbidden"),
            RouterError::UnknownPolicy(_) => (StatusCode::BAD_REQUEST, "unknown_policy"),
            RouterError::Publish(code, _, s) => (*s, code),
            RouterError::Internal(_) | RouterError::Store(_) | RouterError::Timeout => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        }
    }
}

impl IntoResponse for RouterError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_code();
        let mut r = ApiError::new(status, code, self.to_string()).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // The publisher's spool is full or failing, or it is closing: worth a retry, not
            // at once (the gateway's answer to the same).
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        }
        r
    }
}
