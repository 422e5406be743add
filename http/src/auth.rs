//! The one auth extractor: `Caller` is the tenant (and key id) of a request's bearer key.
//!
//! A handler that takes a [`Caller`] argument is authenticated; a missing or unknown key is
//! answered 401 with the one error body (codes `missing_api_key`, `invalid_api_key`). Take
//! `Result<Caller, ApiError>` to count refusals before answering.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use sha2::{Digest, Sha256};

use crate::{ApiError, ApiKeys, Unauthorized};

/// State that holds the service's API keys (implement it on the router's state).
pub trait HasApiKeys {
    /// The configured keys.
    fn api_keys(&self) -> &ApiKeys;
}

impl HasApiKeys for ApiKeys {
    fn api_keys(&self) -> &ApiKeys {
        self
    }
}

impl<T: HasApiKeys> HasApiKeys for Arc<T> {
    fn api_keys(&self) -> &ApiKeys {
        (**self).api_keys()
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The tenant the key is scoped to: the only tenant this request may read or write.
    pub tenant: String,
    /// `key:` and the first 12 hex digits of the key's SHA-256: names the key in logs without
    /// giving it away.
    pub key_id: String,
}

impl From<Unauthorized> for ApiError {
    fn from(u: Unauthorized) -> Self {
        match u {
            Unauthorized::Missing => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing_api_key",
                "send `Authorization: Bearer <api key>`",
            ),
            Unauthorized::Invalid => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "the API key is not valid",
            ),
        }
    }
}

impl Caller {
    /// Authenticate from the request headers.
    pub fn from_headers(keys: &ApiKeys, headers: &HeaderMap) -> Result<Self, ApiError> {
        let tenant = keys.authenticate(headers)?.to_owned();
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.get(7..))
            .unwrap_or_default()
            .trim();
        let key_id = format!(
            "key:{}",
            &hex_prefix(&Sha256::digest(presented.as_bytes()), 6)
        );
        Ok(Self { tenant, key_id })
    }
}

fn hex_prefix(bytes: &[u8], n: usize) -> String {
    bytes.iter().take(n).map(|b| format!("{b:02x}")).collect()
}

impl<S: HasApiKeys + Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Caller::from_headers(state.api_keys(), &parts.headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn caller_from_headers() {
        let mut keys = ApiKeys::default();
        keys.add_list("key-a-0123456789ab=acme").unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(
            Caller::from_headers(&keys, &h).unwrap_err().code,
            "missing_api_key"
        );
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer key-b-0123456789ab"),
        );
        assert_eq!(
            Caller::from_headers(&keys, &h).unwrap_err().code,
            "invalid_api_key"
        );
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer key-a-0123456789ab"),
        );
        let c = Caller::from_headers(&keys, &h).unwrap();
        assert_eq!(c.tenant, "acme");
        assert_eq!(c.key_id.len(), "key:".len() + 12);
        assert!(!c.key_id.contains("0123456789ab"));
    }
}
