#![warn(missing_docs)]

//! Compliance audit over weft's stored facts (`weft_events`).
//!
//! Auditors ask "who did what, when, under which authorization", and want evidence that the
//! log is complete and unaltered. This crate answers with:
//! - [`check`]: the Weaver invariants (I-01, I-02, I-06), orphans and id conflicts over a
//!   time range, as set-based ClickHouse queries; each finding names the events proving it;
//! - [`search`]: filtered, keyset-paginated event search;
//! - [`timeline`]: a request's narrative (the ingest's narratives, tenant-scoped);
//! - [`bundle`]: one request's TraceBundle (weaver-spec extended contract), validated,
//!   conformance-checked and optionally signed (JCS + ed25519);
//! - [`chain`]: a per-(tenant, topic, partition) hash chain with signed checkpoints, and its
//!   verification;
//! - [`retention`]: per-tenant retention and legal hold;
//! - [`serve`]: the read-only HTTP API over the same functions;
//! - [`log`]: every audit read is itself logged.
//!
//! Every query is scoped to one tenant and bounded in time, and every input reaches
//! ClickHouse as a query parameter.

pub mod bundle;
pub mod chain;
pub mod check;
pub mod log;
pub mod metrics;
pub mod retention;
pub mod search;
pub mod serve;
pub mod sign;
pub mod timeline;

use weft_store::StoreError;

/// Everything that can go wrong in an audit operation.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// ClickHouse failed or refused the query.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The caller asked for something malformed (bad cursor, range, filter).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The thing asked for does not exist for this tenant.
    #[error("not found: {0}")]
    NotFound(String),
    /// A stored payload or document could not be read as its contract.
    #[error("invalid document: {0}")]
    Invalid(String),
    /// Key material is missing or malformed.
    #[error("key: {0}")]
    Key(String),
    /// The request would read more than the API allows in one call; a narrower range will do.
    #[error("too large: {0}")]
    TooLarge(String),
    /// Retention refused (legal hold) or misconfigured.
    #[error("refused: {0}")]
    Refused(String),
}

/// One event, named the way weft names it: kind and natural identity.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct EventRef {
    /// The contract, e.g. `trace_event`.
    pub kind: String,
    /// Its identity (`event_id`, `decision_id`, ...).
    pub id: String,
}

impl EventRef {
    /// Shorthand.
    pub fn new(kind: &str, id: impl Into<String>) -> Self {
        Self {
            kind: kind.to_owned(),
            id: id.into(),
        }
    }
}

impl std::fmt::Display for EventRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind, self.id)
    }
}

/// A closed-open time range in microseconds since the epoch, the bound every query takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Range {
    /// Inclusive start.
    pub from: i64,
    /// Exclusive end.
    pub to: i64,
}

/// The widest range an audit query accepts (ten years), so a forgotten bound cannot turn
/// into an unbounded scan of every partition by accident.
pub const MAX_RANGE_MICROS: i64 = 10 * 366 * 24 * 3600 * 1_000_000;

impl Range {
    /// Parse RFC 3339 bounds; `to` must be after `from` and the span at most ten years.
    pub fn parse(from: &str, to: &str) -> Result<Self, AuditError> {
        let f = weft_schemas::time::parse_micros(from).ok_or_else(|| {
            AuditError::BadRequest(format!("`from` is not RFC 3339: {}", short(from)))
        })?;
        let t = weft_schemas::time::parse_micros(to).ok_or_else(|| {
            AuditError::BadRequest(format!("`to` is not RFC 3339: {}", short(to)))
        })?;
        Self::new(f, t)
    }

    /// Check and build a range from microseconds.
    pub fn new(from: i64, to: i64) -> Result<Self, AuditError> {
        if to <= from {
            return Err(AuditError::BadRequest("`to` must be after `from`".into()));
        }
        if to.saturating_sub(from) > MAX_RANGE_MICROS {
            return Err(AuditError::BadRequest(
                "the range may span at most ten years".into(),
            ));
        }
        Ok(Self { from, to })
    }
}

/// Echo at most 64 characters of user input in an error message.
pub(crate) fn short(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

pub use weft_store::Store;

/// Wrap a ClickHouse error with the URL it came from.
pub(crate) fn ch_err(store: &Store) -> impl Fn(clickhouse::error::Error) -> AuditError + '_ {
    move |source| {
        AuditError::Store(StoreError::ClickHouse {
            url: store.config().url.clone(),
            source,
        })
    }
}
