//! A request's narrative timeline: the ingest's narratives (`weft_store::narrative`),
//! read for one tenant only, so an id guessed across tenants finds nothing.

use weft_store::narrative::query::{self, Narrative};

use crate::{AuditError, Store};

/// The narrative holding `id` (a request id or any member's id) for `tenant`, with at most
/// `max_members` of its members (the first in time; [`Narrative::members_total`] counts all).
pub async fn get(
    store: &Store,
    tenant: &str,
    id: &str,
    max_members: u64,
) -> Result<Narrative, AuditError> {
    if id.is_empty() || id.len() > 1024 {
        return Err(AuditError::BadRequest("id must be 1..=1024 bytes".into()));
    }
    query::lookup_at_most(store, tenant, id, max_members)
        .await?
        .ok_or_else(|| {
            AuditError::NotFound(format!("no narrative contains `{}`", crate::short(id)))
        })
}

/// The timeline as terminal text: one line per event, then the links (the one rendering,
/// shared with `weft narrative`).
pub fn render_text(n: &Narrative) -> String {
    n.to_text()
}
