//! Audit reads are themselves audited: each one is a `tracing` event (target `weft_audit`)
//! and a row in `weft_audit_log` with who asked, for which tenant, and what.
//!
//! The CLI writes its one row directly ([`record`]); the API queues its rows to one
//! background writer that inserts them in batches ([`writer`]).

pub mod writer;

use clickhouse::Row;
use serde::Serialize;

use crate::{ch_err, AuditError, Store};

/// The longest query text a row keeps (longer is cut at a character boundary).
pub const MAX_QUERY_BYTES: usize = 4096;

/// One row of `weft_audit_log`.
#[derive(Debug, Clone, PartialEq, Row, Serialize)]
pub struct LogRow {
    /// When the read was made, microseconds since the epoch.
    pub at: i64,
    /// The tenant read.
    pub tenant: String,
    /// Who read: `key:<digest prefix>` or `cli:<user>`.
    pub actor: String,
    /// What: `check`, `timeline`, `refused_tenant_forbidden`, ...
    pub action: String,
    /// The parameters as JSON, at most [`MAX_QUERY_BYTES`].
    pub query: String,
    /// How many results the read returned.
    pub results: u64,
}

impl LogRow {
    /// The row of one read, stamped now; its `tracing` event is emitted here, at once,
    /// whenever (and whether) the row reaches ClickHouse.
    pub fn new(
        tenant: &str,
        actor: &str,
        action: &str,
        query: &serde_json::Value,
        results: u64,
    ) -> Self {
        let mut text = query.to_string();
        if text.len() > MAX_QUERY_BYTES {
            let mut cut = MAX_QUERY_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        tracing::info!(target: "weft_audit", tenant, actor, action, query = %text, results, "audit read");
        Self {
            at: chrono::Utc::now().timestamp_micros(),
            tenant: tenant.to_owned(),
            actor: actor.to_owned(),
            action: action.to_owned(),
            query: text,
            results,
        }
    }
}

/// Insert `rows` into `weft_audit_log` as one insert (one part).
pub async fn insert(store: &Store, rows: &[LogRow], token: Option<&str>) -> Result<(), AuditError> {
    let mut client = store.client().clone();
    if let Some(t) = token {
        client = client.with_setting("insert_deduplication_token", t);
    }
    let mut ins = client
        .insert::<LogRow>("weft_audit_log")
        .await
        .map_err(ch_err(store))?;
    for row in rows {
        ins.write(row).await.map_err(ch_err(store))?;
    }
    ins.end().await.map_err(ch_err(store))
}

/// Record one audit read, now, with an insert of its own (the CLI's one read per process).
/// `actor` is the key id (`key:<digest prefix>`) or `cli:<user>`; `query` the parameters as
/// JSON. The query text is capped at [`MAX_QUERY_BYTES`].
pub async fn record(
    store: &Store,
    tenant: &str,
    actor: &str,
    action: &str,
    query: &serde_json::Value,
    results: u64,
) -> Result<(), AuditError> {
    let row = LogRow::new(tenant, actor, action, query, results);
    insert(store, std::slice::from_ref(&row), None).await
}

/// The actor name of the local command line: `cli:$USER`.
pub fn cli_actor() -> String {
    format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    )
}
