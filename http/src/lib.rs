//! `weft-http`: the pieces every weft HTTP service shares, so the gateway, the ingest
//! status server, the router and the audit API authenticate and listen the same way.
//!
//! - [`KeyRing`]: bearer API keys, each scoped to exactly one tenant, compared in constant time;
//! - [`bind`]: listen on an address, refusing non-loopback addresses unless asked, because
//!   nothing of weft's should be reachable from the network by accident.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use axum::http::{header, HeaderMap, StatusCode};
use subtle::ConstantTimeEq;

/// Where a key ring is read from, for `--help` texts.
pub const KEYS_HELP: &str = "API keys map bearer tokens to tenants: `KEY=TENANT[,KEY=TENANT...]`, \
from the flag or its environment variable, or a file with one `KEY=TENANT` per line \
(`#` comments allowed). A key reads and writes only its own tenant.";

/// Errors reading keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key entry `{0}` is not KEY=TENANT")]
    Malformed(String),
    #[error("key for tenant `{0}` is shorter than 16 characters")]
    TooShort(String),
    #[error("reading key file {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Bearer keys, each mapped to one tenant.
#[derive(Clone, Default)]
pub struct KeyRing {
    keys: Vec<(Vec<u8>, String)>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the keys themselves.
        let tenants: BTreeMap<&str, usize> =
            self.keys.iter().fold(BTreeMap::new(), |mut m, (_, t)| {
                *m.entry(t.as_str()).or_default() += 1;
                m
            });
        f.debug_struct("KeyRing")
            .field("tenants", &tenants)
            .finish()
    }
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    Missing,
    Invalid,
}

impl AuthError {
    /// The HTTP status and a short reason for the response body.
    pub fn response(self) -> (StatusCode, &'static str) {
        match self {
            AuthError::Missing => (StatusCode::UNAUTHORIZED, "missing bearer API key"),
            AuthError::Invalid => (StatusCode::UNAUTHORIZED, "invalid API key"),
        }
    }
}

impl KeyRing {
    /// Parse `KEY=TENANT` entries separated by commas or newlines.
    pub fn parse(spec: &str) -> Result<Self, KeyError> {
        let mut ring = KeyRing::default();
        for entry in spec.split([',', '\n']).map(str::trim) {
            if entry.is_empty() || entry.starts_with('#') {
                continue;
            }
            let (key, tenant) = entry.split_once('=').ok_or_else(|| {
                KeyError::Malformed(entry.chars().take(8).collect::<String>() + "…")
            })?;
            let (key, tenant) = (key.trim(), tenant.trim());
            if tenant.is_empty() {
                return Err(KeyError::Malformed("(empty tenant)".into()));
            }
            if key.len() < 16 {
                return Err(KeyError::TooShort(tenant.to_owned()));
            }
            ring.keys.push((key.as_bytes().to_vec(), tenant.to_owned()));
        }
        Ok(ring)
    }

    /// Read a key file (same syntax as [`KeyRing::parse`]).
    pub fn from_file(path: &str) -> Result<Self, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::File {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Add every key of `other`.
    pub fn extend(&mut self, other: KeyRing) {
        self.keys.extend(other.keys);
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The tenant of a presented key. Every stored key is compared, in constant time, so
    /// the time taken reveals nothing about which key (or how much of one) matched.
    pub fn tenant_of(&self, presented: &[u8]) -> Option<&str> {
        let mut found = None;
        for (key, tenant) in &self.keys {
            if bool::from(key.as_slice().ct_eq(presented)) {
                found = Some(tenant.as_str());
            }
        }
        found
    }

    /// Authenticate a request from its `Authorization: Bearer KEY` header.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<&str, AuthError> {
        let value = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or(AuthError::Missing)?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or(AuthError::Missing)?
            .trim();
        self.tenant_of(token.as_bytes()).ok_or(AuthError::Invalid)
    }
}

/// Errors binding a listener.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(
        "refusing to listen on {0}: not a loopback address (pass --allow-remote to expose it)"
    )]
    NotLoopback(SocketAddr),
    #[error("cannot listen on {addr}: {source}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Bind a TCP listener; non-loopback addresses need `allow_remote`.
pub async fn bind(
    addr: SocketAddr,
    allow_remote: bool,
) -> Result<tokio::net::TcpListener, BindError> {
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(BindError::NotLoopback(addr));
    }
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| BindError::Io { addr, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_one_tenant_each() {
        let ring = KeyRing::parse("k-aaaaaaaaaaaaaaaa=acme, k-bbbbbbbbbbbbbbbb=globex\n# comment")
            .unwrap();
        assert_eq!(ring.tenant_of(b"k-aaaaaaaaaaaaaaaa"), Some("acme"));
        assert_eq!(ring.tenant_of(b"k-bbbbbbbbbbbbbbbb"), Some("globex"));
        assert_eq!(ring.tenant_of(b"k-aaaaaaaaaaaaaaa"), None);
        assert!(KeyRing::parse("short=acme").is_err());
        assert!(KeyRing::parse("no-equals-sign-here").is_err());
        assert!(!format!("{ring:?}").contains("k-aaaa"));
    }

    #[test]
    fn bearer_header_is_required() {
        let ring = KeyRing::parse("k-aaaaaaaaaaaaaaaa=acme").unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(ring.authenticate(&h), Err(AuthError::Missing));
        h.insert(header::AUTHORIZATION, "Basic xyz".parse().unwrap());
        assert_eq!(ring.authenticate(&h), Err(AuthError::Missing));
        h.insert(header::AUTHORIZATION, "Bearer nope".parse().unwrap());
        assert_eq!(ring.authenticate(&h), Err(AuthError::Invalid));
        h.insert(
            header::AUTHORIZATION,
            "Bearer k-aaaaaaaaaaaaaaaa".parse().unwrap(),
        );
        assert_eq!(ring.authenticate(&h), Ok("acme"));
    }

    #[tokio::test]
    async fn non_loopback_needs_consent() {
        let err = bind("0.0.0.0:0".parse().unwrap(), false).await.unwrap_err();
        assert!(matches!(err, BindError::NotLoopback(_)));
        assert!(bind("127.0.0.1:0".parse().unwrap(), false).await.is_ok());
    }
}
