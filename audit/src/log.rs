//! Audit reads are themselves audited: each one is a `tracing` event (target `weft_audit`)
//! and a row in `weft_audit_log` with who asked, for which tenant, and what.

use clickhouse::Row;
use serde::Serialize;

use crate::{ch_err, AuditError, Store};

#[derive(Debug, Row, Serialize)]
struct LogRow<'a> {
    at: i64,
    tenant: &'a str,
    actor: &'a str,
    action: &'a str,
    query: &'a str,
    results: u64,
}

/// Record one audit read. `actor` is the key id (`key:<digest prefix>`) or `cli:<user>`;
/// `query` the parameters as JSON. The query text is capped at 4 KiB.
pub async fn record(
    store: &Store,
    tenant: &str,
    actor: &str,
    action: &str,
    query: &serde_json::Value,
    results: u64,
) -> Result<(), AuditError> {
    let mut text = query.to_string();
    if text.len() > 4096 {
        let mut cut = 4096;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    tracing::info!(target: "weft_audit", tenant, actor, action, query = %text, results, "audit read");
    let mut ins = store
        .client()
        .insert::<LogRow>("weft_audit_log")
        .await
        .map_err(ch_err(store))?;
    ins.write(&LogRow {
        at: chrono::Utc::now().timestamp_micros(),
        tenant,
        actor,
        action,
        query: &text,
        results,
    })
    .await
    .map_err(ch_err(store))?;
    ins.end().await.map_err(ch_err(store))
}

/// The actor name of the local command line: `cli:$USER`.
pub fn cli_actor() -> String {
    format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    )
}
