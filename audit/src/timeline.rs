//! A request's narrative timeline: the ingest's narratives (`weft_store::narrative`),
//! read for one tenant only, so an id guessed across tenants finds nothing.

use weft_store::narrative::query::{self, Narrative};

use crate::{AuditError, Store};

/// The narrative holding `id` (a request id or any member's id) for `tenant`.
pub async fn get(store: &Store, tenant: &str, id: &str) -> Result<Narrative, AuditError> {
    if id.is_empty() || id.len() > 1024 {
        return Err(AuditError::BadRequest("id must be 1..=1024 bytes".into()));
    }
    query::lookup(store, tenant, id).await?.ok_or_else(|| {
        AuditError::NotFound(format!("no narrative contains `{}`", crate::short(id)))
    })
}

/// The timeline as terminal text: one line per event, then the links.
pub fn render_text(n: &Narrative) -> String {
    let mut out = format!(
        "narrative {}{}: {} events, {} links\n",
        n.narrative_id,
        n.request_id
            .as_deref()
            .map(|r| format!(" (request {r})"))
            .unwrap_or_default(),
        n.entries.len(),
        n.links.len()
    );
    for e in &n.entries {
        let detail = [
            "event_type",
            "decision",
            "outcome",
            "capability_id",
            "principal",
            "token_id",
        ]
        .iter()
        .filter_map(|k| {
            e.payload
                .get(*k)
                .and_then(|v| v.as_str())
                .map(|v| format!("{k}={v}"))
        })
        .collect::<Vec<_>>()
        .join(" ");
        out.push_str(&format!(
            "  {}  {:<26} {:<36} {}\n",
            e.timestamp, e.kind, e.id, detail
        ));
    }
    for l in &n.links {
        out.push_str(&format!(
            "  link {}:{} --{}--> {}:{}\n",
            l.from.kind, l.from.id, l.via, l.to.kind, l.to.id
        ));
    }
    if !n.related.is_empty() {
        out.push_str(&format!("  related: {}\n", n.related.join(", ")));
    }
    out
}
